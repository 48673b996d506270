"""The C entry points of a dynamic (size-generic) CPU program (dynsizes.py).

    int32_t rlx_NAME(void **inputs, void **outputs, void **params, void *workspace,
                     const int64_t *dims);             dims: one size per symbol (p.dims order)
    int64_t rlx_NAME_workspace_size(const int64_t *dims);      bytes at those sizes
    const char *rlx_NAME_signature(void);              symbolic shapes, workspace -1

A batch-separable program (batchsplit.py) is emitted as the internal `rlx_NAME.body`
with this ABI, and batchsplit_entry.py defines `rlx_NAME` around it (plus
`rlx_NAME_set_batch_split(int64_t)` and `rlx_NAME_last_split()`).

The entry loads the sizes once and passes them to every kernel as trailing i64
arguments; trip counts, strides, sgemm M/N/K and workspace offsets are computed
from them (symint.value).  The sizes are validated by the caller (runtime/dims.py
in Python, the C glue in an artifact): >= 1 and agreeing across inputs.
"""
from __future__ import annotations

import json

import llvmlite.ir as ir

from rlxc.lowering.cpu import symint
from rlxc.lowering.shared.scalar import I8, I32, I64

I8P = I8.as_pointer()
I8PP = I8P.as_pointer()
I64P = I64.as_pointer()


def shape_json(shape) -> list:
    return [d.to_json() if isinstance(d, symint.SymInt) else d for d in shape]


def signature_text(p) -> str:
    return json.dumps({"abi": 1, "dims": list(p.dims),
                       "args": [[a.name, a.kind, a.dtype, list(a.shape)] for a in p.args],
                       "outputs": [[d, shape_json(s)] for s, d in p.outputs],
                       "workspace": [symint_json(e) for e in p.workspace_ends]},
                      separators=(",", ":"))


def symint_json(x):
    return x.to_json() if isinstance(x, symint.SymInt) else int(x)


def _load_dims(b, arg, dims):
    return [b.load(b.gep(arg, [ir.Constant(I64, j)], inbounds=True), name=f"dim.{s}")
            for j, s in enumerate(dims)]


def entry_head(gen):
    """Emit the workspace-size and signature functions; create the entry with its size
    loads.  Returns (entry function, builder in its entry block, size values)."""
    p, m, sym = gen.p, gen.m, gen.sym
    wsfn = ir.Function(m, ir.FunctionType(I64, [I64P]), f"{sym}_workspace_size")
    b = ir.IRBuilder(wsfn.append_basic_block("entry"))
    loads = _load_dims(b, wsfn.args[0], p.dims)
    symint.enter(wsfn, dict(zip(p.dims, loads)), 2 * len(loads))
    best = None
    for e in p.workspace_ends:
        v = symint.value(e) if isinstance(e, symint.SymInt) else ir.Constant(I64, int(e))
        best = v if best is None else b.select(b.icmp_signed(">", v, best), v, best)
    b.ret(best)
    symint.flush()

    data = bytearray(signature_text(p).encode() + b"\0")
    g = ir.GlobalVariable(m, ir.ArrayType(I8, len(data)), f"{sym}.signature")
    g.initializer = ir.Constant(ir.ArrayType(I8, len(data)), data)
    g.global_constant = True
    g.linkage = "private"
    sfn = ir.Function(m, ir.FunctionType(I8P, []), f"{sym}_signature")
    sb = ir.IRBuilder(sfn.append_basic_block("entry"))
    sb.ret(sb.bitcast(g, I8P))

    split = getattr(p, "batch_split", None)
    if split is not None and split.symbol is not None:
        # the program is the body; batchsplit_entry.py defines the exported entry
        entry = ir.Function(m, ir.FunctionType(I32, [I8PP, I8PP, I8PP, I8P, I64P]),
                            f"{sym}.body")
        entry.linkage = "internal"
    else:
        entry = ir.Function(m, ir.FunctionType(I32, [I8PP, I8PP, I8PP, I8P, I64P]), sym)
    b = ir.IRBuilder(entry.append_basic_block("entry"))
    dims = _load_dims(b, entry.args[4], p.dims)
    symint.enter(entry, dict(zip(p.dims, dims)), 2 * len(dims))
    return entry, b, dims

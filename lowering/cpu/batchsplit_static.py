"""Batch split of a STATIC program: its leading input axis as an internal symbol.

    static rlx module, inputs (B, ...)            (batch fixed, e.g. input_shapes=)
          │ batchsplit.decide_static: the same rule table walked with the batch size B;
          │ the batch axis of every value (any position)
          │ generalize: the module rebuilt with that axis of every value as the symbol
          │ `rows` (reshape/broadcast_to shapes and slice limits too), verified
          │ dynsizes.lower_dynamic + codegen + batchsplit_entry: the size-generic body
          │ and its split entry, internal, under the name NAME.rows
          ▼
    rlx_NAME(ins, outs, params, ws)          static ABI (driver.py): rows := B, then
                                             rlx_NAME.rows(ins, outs, params, ws, &rows),
                                             which runs the plain static program
                                             rlx_NAME.plain when it does not split
    rlx_NAME_workspace_size()                the split bound (TCAP slices) at B
    rlx_NAME_signature()                     the static signature
    rlx_NAME_set_batch_split / _last_split   as for a dynamic library

At team >= 2 a call is ONE OpenMP region, each thread running the body on its rows;
below that (one thread, work under the run-time threshold) the plain static program
runs, as it would without the split.  (Static programs at the chunk's row count
instead of the body gained nothing: ONNX CNN, 32 rows on one thread, 56 us CPU for the
body vs 63 for a static program.)  Built only when it can pay: compiled for >= 2 threads,
B >= 2 MIN_ROWS and the static program's work at B reaches the split threshold
(PAR_MIN_WORK), else (or when the program is not separable, or not size-generic) the
plain static program is kept: a batch-1 program never changes.  So is a program whose
work is mostly matmul chains of at most CHAIN_ROWS rows (an MLP forward at a small
batch): its chain's one team, with the bound weights prepacked, ran 3-20% faster than
the split at batch 32-128 (measurements at CHAIN_ROWS).
"""
from __future__ import annotations

import llvmlite.ir as ir

from rlxc.lowering.shared.scalar import I8, I32, I64

SYM = "rows"
I8P = I8.as_pointer()
I8PP = I8P.as_pointer()
I64P = I64.as_pointer()


class NotSplit(Exception):
    """Why a static program keeps its plain lowering."""


# a program whose work is mostly matmul chains of at most CHAIN_ROWS rows keeps its
# chains (matmul_chain.py: one team over every GEMM, bound weights prepacked) instead of
# the split.  MLP 784-512-512-10 forward, bound params, 2 threads, Zen 4, chain / split:
# batch 32 224 / 272-280 us, 64 403-428 / 462-491, 128 795-826 / 840-849, 256 1559-1654 /
# 1621-1640, 512 3103-3405 / 3080-3251 (unbound params, no prepacking: 32 252-254 / 272-280,
# 128 824-874 / 840-854)
CHAIN_ROWS = 128
CHAIN_SHARE = 0.9


def _chain_reason(static_prog, work: int) -> str | None:
    """Why the chains of `static_prog` run better than a split, or None."""
    from rlxc.lowering.cpu.matmul_chain import MatmulChain

    chains = [k for k in static_prog.kernels if isinstance(k, MatmulChain)]
    cw = sum(int(k.work) for k in chains)
    if not chains or cw < CHAIN_SHARE * work:
        return None
    rows = max(s.m for ch in chains for s in ch.steps)
    if rows > CHAIN_ROWS:
        return None
    return (f"matmul chains hold {cw / work:.0%} of the work at {rows} rows (<= "
            f"{CHAIN_ROWS}): one team over each chain, bound weights prepacked")


def generalize(module, d):
    """`module` (static, separable: Decision `d` of decide_static) with the batch axis of
    every value as the symbol SYM; ValueError when the rebuilt module does not verify."""
    from xdsl.dialects import func

    from rlxc.dialect.module import finish_function, get_func, new_function, signature
    from rlxc.dialect.ops import OPS, CastOp, ConstantOp, create_op
    from rlxc.dialect.trace import Arg
    from rlxc.dialect.types import dtype_of, shape_of, tensor_type

    def sym_at(shape, ax):
        return tuple(SYM if i == ax else s for i, s in enumerate(shape))

    f = get_func(module)
    args = [Arg(a.name, a.kind, sym_at(a.shape, d.axes.get(v)), a.dtype)
            for a, v in zip(signature(f), f.args)]
    mod, nf, block = new_function(f.sym_name.data, args)
    vals = dict(zip(f.args, block.args))
    for op in f.body.block.ops:
        if isinstance(op, func.ReturnOp):
            finish_function(nf, block, [vals[o] for o in op.operands])
            break
        operands = [vals[o] for o in op.operands]
        ax = d.axes.get(op.results[0])
        if ax is None:
            new = op.clone(value_mapper=dict(zip(op.operands, operands)))
        else:
            t = op.results[0].type
            rt = tensor_type(sym_at(shape_of(t), ax), dtype_of(t))
            if isinstance(op, ConstantOp):
                raise ValueError("a constant has the batch axis")
            if isinstance(op, CastOp):
                new = CastOp.create(operands=operands, result_types=[rt])
            else:
                p = op.params()
                if op.name in ("rlx.reshape", "rlx.broadcast_to"):
                    p["shape"] = sym_at(p["shape"], ax)
                elif op.name == "rlx.slice":
                    p["limits"] = sym_at(p["limits"], d.axes.get(op.operands[0]))
                new = create_op(OPS[op.name], operands, rt, **p)
        block.add_op(new)
        vals.update(zip(op.results, new.results))
    mod.verify()
    return mod


def _fn(m, name, ret, args, linkage=None):
    fn = ir.Function(m, ir.FunctionType(ret, args), name)
    if linkage:
        fn.linkage = linkage
    return fn, ir.IRBuilder(fn.append_basic_block("entry"))


def split_static(module, static_prog, name: str, cpu: str, tcap: int):
    """(llvm module, program) of the split static library of `module`, whose plain
    lowering is `static_prog`; raises NotSplit (why) when the plain one is kept."""
    from xdsl.utils.exceptions import VerifyException

    from rlxc.dialect.module import get_func, signature
    from rlxc.lowering.cpu.batchsplit import decide_static
    from rlxc.lowering.cpu.batchsplit_entry import MIN_ROWS, emit_split_entry
    from rlxc.lowering.cpu.codegen import ModuleGen, generate
    from rlxc.lowering.cpu.dynsizes import lower_dynamic
    from rlxc.lowering.cpu.symint import DynamicSizeError, SymInt
    from rlxc.lowering.cpu.tuning import PAR_MIN_WORK
    from rlxc.runtime.cpu import signature_text

    if tcap < 2:
        raise NotSplit("compiled for one thread")
    work = sum(int(getattr(k, "work", 0)) for k in static_prog.kernels)
    if work < PAR_MIN_WORK:
        raise NotSplit(f"work {work} is under the split threshold {PAR_MIN_WORK}")
    why = _chain_reason(static_prog, work)
    if why:
        raise NotSplit(why)
    d = decide_static(module)
    if d.rows is None or d.reason:
        raise NotSplit(d.reason)
    if d.rows < 2 * MIN_ROWS:
        raise NotSplit(f"{d.rows} rows: under {MIN_ROWS} rows per thread for two threads")
    try:
        gen = generalize(module, d)
        inner = f"{name}.{SYM}"
        p = lower_dynamic(gen, [SYM], inner, cpu, tcap)
        if p.batch_split.symbol != SYM:
            raise NotSplit(p.batch_split.reason)
        m = generate(p, cpu)
    except (DynamicSizeError, ValueError, TypeError, KeyError, VerifyException) as e:
        raise NotSplit(f"no size-generic body: {type(e).__name__}: {e}") from None
    # an unsplit call runs the plain static program, generated into the same module: a
    # one-thread call is the program it was without the split
    plain = f"{name}.plain"
    static_prog.name = plain
    ModuleGen(static_prog, cpu, module=m).generate()
    emit_split_entry(m, p, tcap, PAR_MIN_WORK, fallback=m.get_global(f"rlx_{plain}"))

    env = {SYM: d.rows}
    ws = max([e.eval(env) if isinstance(e, SymInt) else int(e) for e in p.workspace_ends]
             + [static_prog.workspace_size])
    sym, isym = f"rlx_{name}", f"rlx_{inner}"
    for suffix in ("", "_workspace_size", "_signature", "_set_batch_split", "_last_split"):
        m.get_global(isym + suffix).linkage = "internal"
    for suffix in ("", "_workspace_size", "_signature"):
        m.get_global(f"rlx_{plain}{suffix}").linkage = "internal"

    entry, b = _fn(m, sym, I32, [I8PP, I8PP, I8PP, I8P])
    entry.attributes.add("nounwind")
    dims = b.alloca(I64, name="rows")
    b.store(ir.Constant(I64, d.rows), dims)
    b.ret(b.call(m.get_global(isym), list(entry.args) + [dims]))
    _, b = _fn(m, f"{sym}_workspace_size", I64, [])
    b.ret(ir.Constant(I64, ws))
    setter, b = _fn(m, f"{sym}_set_batch_split", ir.VoidType(), [I64])
    b.call(m.get_global(f"{isym}_set_batch_split"), [setter.args[0]])
    b.ret_void()
    _, b = _fn(m, f"{sym}_last_split", I32, [])
    b.ret(b.call(m.get_global(f"{isym}_last_split"), []))

    args = signature(get_func(module))
    outs = list(static_prog.outputs)
    text = signature_text([{"name": a.name, "kind": a.kind, "shape": list(a.shape),
                            "dtype": a.dtype} for a in args],
                          [{"shape": list(s), "dtype": dt} for s, dt in outs], ws)
    data = bytearray(text.encode() + b"\0")
    g = ir.GlobalVariable(m, ir.ArrayType(I8, len(data)), f"{sym}.signature")
    g.initializer = ir.Constant(ir.ArrayType(I8, len(data)), data)
    g.global_constant = True
    g.linkage = "private"
    _, b = _fn(m, f"{sym}_signature", I8P, [])
    b.ret(b.bitcast(g, I8P))

    # what driver.compile_cpu reads of a program: the static face of the split one
    p.args, p.outputs, p.workspace_size = args, outs, ws
    p.kernels = list(p.kernels) + list(static_prog.kernels)   # sgemm variants
    p.batch_split = d
    p.batch_split_json = {"symbol": SYM, "reason": "", "rows": d.rows}
    return m, p


__all__ = ["SYM", "NotSplit", "generalize", "split_static"]

"""GPU fusion and buffer planning: which rlx values get a buffer, one kernel each.

    rlx func (one block of ops)
          │ 1. forced buffers: arguments, non-splat constants, outputs, reductions,
          │    matmuls, scatter_add, and the bases of matmul operands (a chain of
          │    transposes is read in place through strides)
          │ 2. epilogue fusion: a single-use matmul or reduction whose value flows
          │    through single-use elementwise ops into a value R is computed inside
          │    R's kernel (R = epilogue(acc, other leaves)); R gets the buffer
          │ 3. consumers first, every other value: its *sites* are (root, index path)
          │    pairs by which kernels evaluate it (elementwise users keep the path,
          │    views and reductions extend it).  One site → inlined (the per-index
          │    memo evaluates it once: x*x, x*sigmoid(x); a broadcast recomputes it
          │    per element, cheaper on a GPU than a launch); several sites → a
          │    buffer, unless it is <= 3 elementwise ops over leaves (recomputed at
          │    each site: softmax's exp(x - max) feeds the sum and the division).  Views
          │    with several sites stay inlined and push the buffer to their operand.
          │ 4. groups: one Kernel per materialized computed value, in program order;
          │    reshape / stop_gradient of a buffer alias it (no kernel)
          │ 5. buffers: regions input | param | const | work; work buffers share
          │    memory when their live ranges [def kernel, last reader] are disjoint
          │ 6. index checks: each gather / scatter_add gets an error code (the CPU's
          │    message); a kernel that evaluates one also gets the 4-byte error flag
          │    (region "error", zeroed first), where an index outside [0, d) writes
          │    its code; the runtime raises the IndexError after the launches
          ▼
    GpuPlan(kernels, buffers, regions, args, outputs)

This is the standalone GPU path: it reads the rlx module directly (the CPU
backend's fusion.py/buffers.py were not available when it was written, and
the GPU kernels need the reduction structure that its loop IR flattens).
Kernel kinds: "elementwise" (grid-stride loop over the root's elements),
"reduce" (root is a reduction or has one fused), "matmul" (likewise),
"scatter" (zero-filled output, atomic adds), "attention" (gpu/attention.py: the
fused flash-style kernel; its operands' bases, seen through views, get buffers).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from xdsl.dialects import func
from xdsl.ir import OpResult

from rlxc.dialect import module as M
from rlxc.dialect.shapes import ELEMENTWISE_FAMILIES, ops_where
from rlxc.dialect.types import dense_value, dtype_of, is_splat, numel, shape_of

# name sets derived from the op properties (dialect/shapes.py)
ALIAS_OPS = ("rlx.reshape", "rlx.stop_gradient")
FREE_VIEWS = ops_where(lambda s: s.view) | {"rlx.stop_gradient"}
MULTI = ("multi",)      # site of a value inlined at several places
# accumulations: a kernel of their own whose consumers can fuse as its epilogue
HEAVY_OPS = ops_where(lambda s: s.root and s.family in ("reduce", "matmul"))
REDUCE_OPS = ops_where(lambda s: s.family == "reduce")
ROOT_OPS = ops_where(lambda s: s.root)
from rlxc.dialect.shapes import DTYPE_BYTES  # noqa: E402,F401  (re-exported)
ALIGN = 256


def is_elementwise(op) -> bool:
    return getattr(op, "FAMILY", "") in ELEMENTWISE_FAMILIES


def nbytes(v) -> int:
    return numel(shape_of(v.type)) * DTYPE_BYTES[dtype_of(v.type)]


@dataclass
class Buffer:
    id: int
    region: str          # "input" | "param" | "const" | "work"
    nbytes: int
    offset: int = 0
    data: bytes | None = None   # constants
    first: int = -1             # live range in kernel steps (work buffers)
    last: int = -1


@dataclass
class Kernel:
    kind: str                   # "elementwise" | "reduce" | "matmul" | "scatter" | "attention"
    root: object                # the SSA value it writes
    heavy: object | None        # the matmul / reduction / scatter op computed inside
    reads: list = field(default_factory=list)   # materialized SSA values it reads
    name: str = ""
    checks: bool = False        # evaluates a gather/scatter_add: gets the error flag


@dataclass
class GpuPlan:
    func: object
    args: list                  # dialect Arg records, declaration order
    arg_values: list
    outputs: list               # SSA values returned
    materialized: set
    fused: dict                 # root value -> heavy op inlined in its kernel
    kernels: list
    buffers: list
    buffer_of: dict             # SSA value -> Buffer
    regions: dict               # region -> total bytes
    uses: dict
    error_codes: dict = field(default_factory=dict)  # gather/scatter_add op -> code
    errors: dict = field(default_factory=dict)       # code -> (exception name, message)
    error_buffer: Buffer | None = None               # the i32 flag, when any code exists

    def buf(self, v) -> Buffer:
        return self.buffer_of[v]


def _users(f) -> dict:
    """value -> the distinct ops that use it (an op using it twice counts once)."""
    uses: dict = {}
    for op in f.body.block.ops:
        for o in op.operands:
            lst = uses.setdefault(o, [])
            if not lst or lst[-1] is not op:
                lst.append(op)
    return uses


def _is_splat_const(op) -> bool:
    return op is not None and op.name == "rlx.constant" and is_splat(op.value)


def op_of(v):
    """The op defining SSA value `v`, or None for a function argument."""
    return v.owner if isinstance(v, OpResult) else None


def matmul_operand_base(v):
    """Follow transposes down from a matmul operand: the value whose buffer is read."""
    while op_of(v) is not None and op_of(v).name in ("rlx.transpose", "rlx.stop_gradient"):
        v = op_of(v).operands[0]
    return v


def view_base(v):
    """Follow single-operand views (transpose, reshape, broadcast_to, slice) down from an
    operand: the value whose buffer a kernel reads through index maps."""
    while op_of(v) is not None and op_of(v).name in FREE_VIEWS and len(op_of(v).operands) == 1:
        v = op_of(v).operands[0]
    return v


def plan_module(module) -> GpuPlan:
    """Fusion groups and buffer plan of an rlx module (or a Func's module)."""
    module = getattr(module, "module", module)
    f = M.get_func(module)
    args = M.signature(f)
    outs = M.outputs(f)
    ops = [op for op in f.body.block.ops if not isinstance(op, func.ReturnOp)]
    users = _users(f)           # value -> distinct user ops, program order
    outset = set(outs)
    nuses = {v: len(us) + (v in outset) for v, us in users.items()}
    for v in outs:
        nuses.setdefault(v, 1)

    # 1. forced buffers: arguments, non-splat constants, outputs, heavies, scatter_add,
    #    and the bases of matmul operands (read in place through transposes).
    forced: set = set(f.args) | outset
    for op in ops:
        v = op.results[0]
        if op.name == "rlx.matmul":
            forced.update(matmul_operand_base(o) for o in op.operands)
        if op.name == "rlx.attention":   # gpu/attention.py reads its operands through views
            forced.update(view_base(o) for o in op.operands)
        if op.name in ROOT_OPS:
            forced.add(v)
        if op.name == "rlx.constant" and not _is_splat_const(op):
            forced.add(v)

    # 2. epilogue fusion: a heavy with one user, flowing through single-user
    #    elementwise ops into a root, is computed in that root's kernel.
    fused: dict = {}
    for op in ops:
        v = op.results[0]
        if op.name not in HEAVY_OPS or v in outset or nuses.get(v, 0) != 1:
            continue
        c, root = v, None
        while True:
            us = users.get(c, [])
            if len(us) != 1 or not is_elementwise(us[0]):
                root = c if c is not v and nuses.get(c, 0) == 1 else None
                break
            u = us[0].results[0]
            if u in forced or nuses.get(u, 0) != 1 or len(users.get(u, [])) != 1:
                root = u
                break
            c = u
        if root is not None and root not in fused and op_of(root).name not in HEAVY_OPS \
                and nuses.get(root, 0) >= 1:
            fused[root] = op
            forced.discard(v)
            forced.add(root)

    # 3. the rest, consumers first: a value is inlined when every use evaluates it at the
    #    same place (same root, same index path) — then the per-index memo computes it
    #    once — or when it is a cheap expression of leaves (recomputed at each place);
    #    otherwise it gets a buffer.  Views used from several places are inlined
    #    everywhere and push the buffer down to their operand.
    mat: set = set(forced)
    site: dict = {v: (v, ()) for v in forced}
    for op in reversed(ops):
        v = op.results[0]
        if v in forced or _is_splat_const(op) or not users.get(v):
            continue
        sites = set()
        for u in users[v]:
            su = site.get(u.results[0], MULTI)
            for pos, o in enumerate(u.operands):
                if o is not v:
                    continue
                if su is MULTI:
                    sites.add(MULTI)
                elif is_elementwise(u):
                    sites.add(su)
                else:
                    sites.add((su[0], su[1] + ((id(u), pos),)))
        if len(sites) == 1 and MULTI not in sites:
            site[v] = sites.pop()
        elif op.name in FREE_VIEWS or _cheap_tree(v, forced):
            site[v] = MULTI
        else:
            mat.add(v)
            site[v] = (v, ())

    # 4. kernels in program order; aliases share their base's buffer.
    alias_of: dict = {}
    error_codes: dict = {}
    kernels = []
    for op in ops:
        v = op.results[0]
        if v not in mat or op.name == "rlx.constant" and not (
                _is_splat_const(op) and v in outset):
            continue
        if op.name in ALIAS_OPS and op.operands[0] in mat:
            alias_of[v] = alias_of.get(op.operands[0], op.operands[0])
            continue
        heavy = fused.get(v)
        hop = heavy if heavy is not None else op
        if hop.name == "rlx.matmul":
            kind = "matmul"
        elif hop.name in REDUCE_OPS:
            kind = "reduce"
        elif hop.name == "rlx.scatter_add":
            kind = "scatter"
        elif hop.name == "rlx.attention":
            kind = "attention"
        else:
            kind = "elementwise"
        k = Kernel(kind, v, heavy if heavy is not None else (op if kind != "elementwise" else None))
        k.reads, checked = _leaf_reads(k, mat)
        k.checks = bool(checked)
        for c in checked:
            error_codes.setdefault(c, len(error_codes) + 1)
        k.name = f"{M.get_func(module).sym_name.data}_k{len(kernels)}_{kind}"
        kernels.append(k)

    # 5. buffers.
    buffers: list[Buffer] = []
    buffer_of: dict = {}

    def new(region, size, data=None) -> Buffer:
        b = Buffer(len(buffers), region, int(size), data=data)
        buffers.append(b)
        return b

    for a, v in zip(args, f.args):
        buffer_of[v] = new(a.kind, nbytes(v))
    for op in ops:
        v = op.results[0]
        if op.name == "rlx.constant" and v in mat and not (_is_splat_const(op) and v in outset):
            arr = dense_value(op.value)
            if _is_splat_const(op):   # a splat read in place (a matmul operand): every element
                arr = np.ascontiguousarray(np.broadcast_to(arr.reshape(-1)[:1].reshape(()),
                                                           shape_of(v.type)))
            if arr.dtype == bool:
                arr = arr.astype("int8")
            buffer_of[v] = new("const", arr.nbytes, arr.tobytes())
    for step, k in enumerate(kernels):
        b = new("work", nbytes(k.root))
        b.first = step
        buffer_of[k.root] = b
    for v, base in alias_of.items():
        buffer_of[v] = buffer_of[base]
    for step, k in enumerate(kernels):
        for r in k.reads:
            b = buffer_of[r]
            b.last = max(b.last, step)
    end = len(kernels)
    for v in outs:
        buffer_of[v].last = end
    # 6. the error flag of the index checks
    errors = {code: ("IndexError", index_error(op)) for op, code in error_codes.items()}
    flag = new("error", 4) if errors else None
    regions = _place(buffers)
    return GpuPlan(f, args, list(f.args), outs, mat, fused, kernels, buffers, buffer_of,
                   regions, nuses, error_codes, errors, flag)


def index_error(op) -> str:
    """The message of an out-of-range index of gather/scatter_add op (the CPU's words)."""
    p = op.params()
    if op.name == "rlx.gather":
        d = shape_of(op.operands[0].type)[p["axis"]]
        return f"{op.name}: index out of range [0, {d}) along axis {p['axis']}"
    return f"{op.name}: index out of range [0, {p['dim']})"


def _cheap_tree(v, leaves: set, depth: int = 3) -> bool:
    """At most `depth` elementwise ops over leaves (views are free): on a GPU, recomputing
    them where they are used beats a kernel launch and a round trip through memory."""
    op = op_of(v)
    if v in leaves or op is None or _is_splat_const(op):
        return True
    if op.name in FREE_VIEWS:
        return _cheap_tree(op.operands[0], leaves, depth)
    if not is_elementwise(op) or depth == 0:
        return False
    return all(_cheap_tree(o, leaves, depth - 1) for o in op.operands)


def _leaf_reads(k: Kernel, mat: set) -> tuple[list, list]:
    """Materialized values read by the expression trees of kernel `k` (in first-use
    order), and the gather/scatter_add ops it evaluates (their indices are checked)."""
    seen, out, checked = set(), [], []

    def visit(v, top=False):
        if v in seen:
            return
        seen.add(v)
        if v in mat and not top:
            out.append(v)
            return
        op = op_of(v)
        if op is None or op.name == "rlx.constant":
            return
        if op.name in ("rlx.gather", "rlx.scatter_add"):
            checked.append(op)
        for o in op.operands:
            visit(o)

    visit(k.root, top=True)
    return out, checked


def _place(buffers: list[Buffer]) -> dict:
    """Offsets per region; work buffers with disjoint live ranges share memory (first fit)."""
    regions = {"input": 0, "param": 0, "const": 0, "work": 0}
    if any(b.region == "error" for b in buffers):
        regions["error"] = 0
    for b in buffers:
        if b.region != "work":
            b.offset = regions[b.region]
            regions[b.region] += _round(b.nbytes)
    placed: list[Buffer] = []
    for b in sorted((b for b in buffers if b.region == "work"), key=lambda b: (b.first, -b.nbytes)):
        if b.last < b.first:
            b.last = b.first  # written, never read (still written by its kernel)
        live = sorted((p for p in placed if not (p.last < b.first or b.last < p.first)),
                      key=lambda p: p.offset)
        off = 0
        for p in live:
            if off + _round(b.nbytes) <= p.offset:
                break
            off = max(off, p.offset + _round(p.nbytes))
        b.offset = off
        placed.append(b)
        regions["work"] = max(regions["work"], off + _round(b.nbytes))
    return regions


def _round(n: int) -> int:
    return max(ALIGN, (n + ALIGN - 1) // ALIGN * ALIGN)

"""GPU code generation: one kernel per fusion group, and the launch plan (driver.py compiles).

    rlx module ──gpu_plan.plan_module──► GpuPlan (kernels, buffers)
          │ per Kernel, by kind (all kernels of a module in one llvmlite module):
          │   elementwise  grid-stride loop; 4 elements (16-byte loads/stores) per
          │                thread when the tree allows it (gpu_expr.vectorizable)
          │   reduce       row = one output element, K = reduced extent:
          │                  "thread": a thread per row, sequential over K
          │                           (K <= 16, or innermost axis kept and K < 64)
          │                  "warp":   a warp per row, lanes stride K, shfl.bfly tree
          │                  "block":  a block per row (K > 2048): shuffles, then one
          │                           partial per warp in shared memory, shuffles
          │                  "cols":   innermost axis kept, K >= 64: 32 adjacent rows
          │                           per block (coalesced), 8 threads per row
          │                           striding K, partials summed in shared memory
          │                then the fused epilogue (root tree with the row's result)
          │   matmul       gpu_matmul: tiled shared-memory SGEMM + fused epilogue
          │   scatter      memset 0, then a thread per update: atomic add
          │   attention    gpu_attention: flash-style, online softmax, K/V tiles in
          │                shared memory, no (Sq, Sk) buffer
          ▼
    llvmlite module ──nvptx.emit_ptx──► PTX ──nvptx.assemble (ptxas)──► cubin + resources
          ▼
    CudaArtifact: PTX, cubin or None, launch plan (steps: memset / launch with grid,
    block, buffer ids), buffers (region, offset, size), constants, signature;
    to_bytes()/from_bytes() = the runtime's container (runtime/cuda.py).

Every kernel takes the pointers of the buffers it touches (output first) and
nothing else: shapes are static, so sizes, strides and grid-stride trip counts
are constants.  A size-generic build (`dims`, gpu/dynplan.py) adds one i64 size
argument per symbol and takes grid-stride steps and round counts from the
launch's grid (nctaid), so the launch grid may be chosen per call.  With
target="host" the same generators build an emulation (simt.py) that tests run
on the CPU against the interpreter.
"""
from __future__ import annotations

import llvmlite.ir as ir

from rlxc.dialect.types import dtype_of, numel, shape_of

from rlxc.lowering.gpu import expr as E
from rlxc.lowering.gpu import scalar as S
from rlxc.lowering.gpu import attention as gpu_attention
from rlxc.lowering.gpu import matmul as gpu_matmul
from rlxc.lowering.gpu import nvptx
from rlxc.lowering.gpu.plan import GpuPlan, Kernel, plan_module
from rlxc.lowering.gpu.simt import Simt, c32

__all__ = ["build_kernels", "GENERATORS", "MAX_BLOCKS"]

MAX_BLOCKS = 4096      # grid-stride loops: at most this many blocks
THREADS = 256


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Launch(dict):
    """{"kernel", "grid", "block", "smem", "args": [buffer ids], "memset": [buffer ids]}."""


class GridDim(int):
    """A grid extent min(ceil(n / per), cap): an int, whose rule a size-generic plan
    (dynplan.py) re-evaluates per call from the sizes (n is linear in them)."""

    def __new__(cls, n: int, per: int, cap: int = MAX_BLOCKS, hard: bool = False):
        g = int.__new__(cls, min(_cdiv(n, per), cap))
        g.rule = [int(n), int(per), int(cap), int(hard)]   # hard: more is an error
        return g


def at_entry(sm, f):
    """f(builder) emitted in the kernel's entry block: a uniform value of the sizes and
    the grid that dominates every phase (host threads loop per phase)."""
    b, sm.b = sm.b, sm._allocas
    try:
        return f(sm.b)
    finally:
        sm.b = b


def _stride(sm, ctx, block: int, grid: int):
    """A grid-stride loop's step: block * grid (the launch's grid when size-generic)."""
    if sm.dyn is None:
        return ctx.const(block * grid)
    return at_entry(sm, lambda b: b.zext(b.mul(sm.nctaid(0), c32(block)), ctx.itype)
                    if ctx.itype.width > 32 else b.mul(sm.nctaid(0), c32(block)))


def _rounds(sm, n: int, per_round: int, grid: int):
    """ceil(n / (grid * per_round)): a Python int, or i32 from the launch's grid."""
    if sm.dyn is None:
        return _cdiv(n, grid * per_round)

    def calc(b):
        step = b.mul(sm.nctaid(0), c32(per_round))
        return b.udiv(b.add(c32(n), b.sub(step, c32(1))), step)
    return at_entry(sm, calc)


def _decide(plan, k, what: str, choose):
    """A choice made from the sizes; a size-generic build makes it once, at its first
    sample, and every other sample reuses it (each choice is right at any size)."""
    dec = getattr(plan, "decisions", None)
    if dec is None:
        return choose()
    key = (k.name, what)
    if key not in dec:
        dec[key] = choose()
    return dec[key]


def _grid_row(sm, grid: int):
    """The grid size as i32 (uniform)."""
    return sm.nctaid(0) if sm.dyn is not None else c32(grid)


def _kernel_args(plan: GpuPlan, k: Kernel) -> list[int]:
    ids = [plan.buffer_of[k.root].id]
    for v in k.reads:
        i = plan.buffer_of[v].id
        if i not in ids:
            ids.append(i)
    if k.checks:                  # the index checks' error flag (plan step 6)
        ids.append(plan.error_buffer.id)
    return ids


def _setup(mod, plan, k, target, block, grid, values, min_blocks_per_sm=0):
    ids = _kernel_args(plan, k)
    sm = Simt(mod, k.name, len(ids), block, grid, target, min_blocks_per_sm,
              getattr(plan, "dims", None))
    sm.grid_src = tuple(grid)
    ctx = E.ExprCtx(sm, plan, dict(zip(ids, sm.buffers)), E.index_type(plan, values))
    return sm, ctx, ids


def _launch(k, sm, ids, memset=()) -> Launch:
    out = Launch(kernel=k.name, grid=list(sm.grid), block=[sm.block, 1, 1], smem=0,
                 args=ids, memset=list(memset))
    if sm.dyn is not None:   # per-call grid: [n, per, cap] per axis (dynplan.py)
        src = (tuple(sm.grid_src) + (1, 1, 1))[:3]
        out["grid_rule"] = [g.rule if isinstance(g, GridDim) else [int(g), 1, int(g), 1]
                            for g in src]
    return out


def _gtid(sm, ctx):
    b = sm.b
    g = b.add(b.mul(sm.ctaid(0), c32(sm.block)), sm.tid())
    return b.zext(g, ctx.itype) if ctx.itype.width > 32 else g


# ------------------------------------------------------------------ elementwise

def gen_elementwise(mod, plan, k, target):
    root = k.root
    shp = shape_of(root.type)
    lanes = 4 if E.vectorizable(plan, root) else 1
    nv = numel(shp) // lanes
    block = min(THREADS, max(32, _cdiv(nv, 32) * 32))
    grid = GridDim(nv, block)
    sm, ctx, ids = _setup(mod, plan, k, target, block, (grid,), [root] + k.reads)
    c = ctx.const
    with sm.loop(_gtid(sm, ctx), c(nv), _stride(sm, ctx, block, grid), ctx.itype) as i:
        lin = sm.b.mul(i, c(lanes)) if lanes > 1 else i
        idx = E.Index(ctx, shp, linear=lin, lanes=lanes)
        ctx.memo = {}
        E.store(ctx, root, idx, E.value(ctx, root, idx, root=True))
    sm.finish()
    return [_launch(k, sm, ids)]


# ------------------------------------------------------------------ reductions

def _reduce_geometry(op):
    x = op.operands[0]
    s = shape_of(x.type)
    axes = tuple(op.params()["axes"])
    kept = [i for i in range(len(s)) if i not in axes]
    return x, s, axes, kept, numel([s[i] for i in kept]), numel([s[a] for a in axes])


def reduce_strategy(op) -> str:
    x, s, axes, kept, m, kk = _reduce_geometry(op)
    dt = dtype_of(x.type)
    if dt not in ("f32", "i32") or kk <= 16:
        return "thread"
    if (len(s) - 1) not in axes:
        return "cols" if kk >= 64 else "thread"
    return "warp" if kk <= 2048 else "block"


def _input_index(ctx, op, m, kidx):
    """Index into the reduction's input for output row m and reduced position kidx."""
    x, s, axes, kept, M, K = _reduce_geometry(op)
    b, c = ctx.b, ctx.const
    r = len(s)
    if axes == tuple(range(r - len(axes), r)):          # reduced axes are a suffix
        return E.Index(ctx, s, linear=b.add(b.mul(m, c(K)), kidx) if M > 1 else kidx)
    if axes == tuple(range(len(axes))):                 # a prefix
        return E.Index(ctx, s, linear=b.add(b.mul(kidx, c(M)), m) if K > 1 else m)
    km = E.Index(ctx, [s[i] for i in kept], linear=m)
    kr = E.Index(ctx, [s[a] for a in axes], linear=kidx)
    dims = [km.dim(kept.index(i)) if i in kept else kr.dim(axes.index(i)) for i in range(r)]
    return E.Index(ctx, s, dims=dims)


def _finish_row(ctx, k, op, m, acc):
    """Apply mean's division and the fused epilogue; store the root at output row m."""
    x, s, axes, kept, M, K = _reduce_geometry(op)
    dt = dtype_of(op.results[0].type)
    b = ctx.b
    if op.name == "rlx.mean":
        acc = S.shared.combine(b, "div", acc, S.shared.const(S.REG_TYPE[dt], K), dt)
    ctx.memo = {}
    ctx.hooks = {op.results[0]: lambda idx: [acc]}
    root = k.root
    idx = E.Index(ctx, shape_of(root.type), linear=m)
    E.store(ctx, root, idx, E.value(ctx, root, idx, root=True))


def _accumulate(sm, ctx, op, acc_reg, m, start, step):
    """acc_reg <op>= x[m, k] for k in range(start, K, step) (a per-thread loop)."""
    x, s, axes, kept, M, K = _reduce_geometry(op)
    dt = dtype_of(x.type)
    with sm.loop(start, ctx.const(K), ctx.const(step), ctx.itype, "k") as kk:
        ctx.memo = {}
        (v,) = E.value(ctx, x, _input_index(ctx, op, m, kk))
        sm.set(acc_reg, S.combine(sm.b, op.name, dt, sm.get(acc_reg), v))


def _warp_reduce(sm, op, dt, acc, tmp, width=32):
    for off in (16, 8, 4, 2, 1):
        if off >= width:
            continue
        sm.shfl_xor(acc, off, tmp)
        sm.set(acc, S.combine(sm.b, op.name, dt, sm.get(acc), sm.get(tmp)))


def gen_reduce(mod, plan, k, target):
    op = k.heavy
    x, s, axes, kept, M, K = _reduce_geometry(op)
    dt = dtype_of(x.type)
    strategy = _decide(plan, k, "strategy", lambda: reduce_strategy(op))
    values = [k.root, x] + k.reads
    ident = S.nan_identity(op.name, dt)
    rty = S.REG_TYPE[dt]
    if strategy == "thread":
        block = min(THREADS, max(32, _cdiv(M, 32) * 32))
        grid = GridDim(M, block)
        sm, ctx, ids = _setup(mod, plan, k, target, block, (grid,), values)
        acc = sm.reg(rty, "acc")
        with sm.loop(_gtid(sm, ctx), ctx.const(M), _stride(sm, ctx, block, grid), ctx.itype,
                     "m") as m:
            sm.set(acc, ident)
            _accumulate(sm, ctx, op, acc, m, ctx.const(0), 1)
            _finish_row(ctx, k, op, m, sm.get(acc))
        sm.finish()
        return [_launch(k, sm, ids)]

    if strategy == "cols":
        return _gen_reduce_cols(mod, plan, k, target, values, ident, rty)
    if strategy == "warp":
        block, rows_per_block = THREADS, THREADS // 32
        grid = GridDim(M, rows_per_block)
    else:
        block, rows_per_block = _decide(plan, k, "block", lambda: 1024 if K >= 65536
                                        else THREADS), 1
        grid = GridDim(M, 1)
    sm, ctx, ids = _setup(mod, plan, k, target, block, (grid,), values)
    rounds = _rounds(sm, M, rows_per_block, grid)
    b, it = sm.b, ctx.itype
    acc, tmp = sm.reg(rty, "acc"), sm.reg(rty, "tmp")
    nwarps = block // 32
    part = sm.shared(rty, 32, "part") if strategy == "block" else None

    def row_of(rnd):
        # warp: (round*grid + block)*8 + warp;  block: round*grid + block
        r = sm.b.add(sm.b.mul(rnd, _grid_row(sm, grid)), sm.ctaid(0))
        if strategy == "warp":
            r = sm.b.add(sm.b.mul(r, c32(rows_per_block)), sm.b.lshr(sm.tid(), c32(5)))
        return sm.b.zext(r, it) if it.width > 32 else r

    with sm.uniform_loop(rounds, "round") as rnd:
        b = sm.b
        m = row_of(rnd)
        sm.set(acc, ident)
        lane = b.and_(sm.tid(), c32(31 if strategy == "warp" else block - 1))
        lane = b.zext(lane, it) if it.width > 32 else lane
        with sm.if_then(b.icmp_unsigned("<", m, ctx.const(M))):
            _accumulate(sm, ctx, op, acc, m, lane, 32 if strategy == "warp" else block)
        _warp_reduce(sm, op, dt, acc, tmp)
        if strategy == "block":
            b = sm.b
            tid = sm.tid()
            with sm.if_then(b.icmp_unsigned("==", b.and_(tid, c32(31)), c32(0))):
                p = b.gep(part, [b.lshr(tid, c32(5))], source_etype=rty)
                b.store(sm.get(acc), p)
            sm.barrier()
            b = sm.b
            tid = sm.tid()
            lanei = b.and_(tid, c32(31))
            has = b.icmp_unsigned("<", lanei, c32(nwarps))
            safe = b.select(has, lanei, c32(0))
            pv = b.load(b.gep(part, [safe], source_etype=rty), typ=rty)
            sm.set(acc, b.select(has, pv, ident))
            _warp_reduce(sm, op, dt, acc, tmp, width=max(nwarps, 2))
        b = sm.b
        m = row_of(rnd)
        first = b.icmp_unsigned("==", b.and_(sm.tid(), c32(31 if strategy == "warp" else
                                                             block - 1)), c32(0))
        with sm.if_then(b.and_(first, b.icmp_unsigned("<", m, ctx.const(M)))):
            _finish_row(ctx, k, op, m, sm.get(acc))
        if strategy == "block":
            sm.barrier()     # the next round rewrites `part`
    sm.finish()
    return [_launch(k, sm, ids)]


def _gen_reduce_cols(mod, plan, k, target, values, ident, rty):
    """Kept innermost axis: 32 adjacent outputs per block (coalesced), each reduced by
    8 threads striding K; the 8 partials meet in shared memory."""
    op = k.heavy
    x, s, axes, kept, M, K = _reduce_geometry(op)
    dt = dtype_of(x.type)
    cols, ks = 32, THREADS // 32
    grid = GridDim(M, cols)
    sm, ctx, ids = _setup(mod, plan, k, target, THREADS, (grid,), values)
    rounds = _rounds(sm, M, cols, grid)
    it = ctx.itype
    acc = sm.reg(rty, "acc")
    part = sm.shared(rty, THREADS, "part")

    def col_of(rnd):
        b = sm.b
        m = b.add(b.mul(b.add(b.mul(rnd, _grid_row(sm, grid)), sm.ctaid(0)), c32(cols)),
                  b.and_(sm.tid(), c32(cols - 1)))
        return b.zext(m, it) if it.width > 32 else m

    with sm.uniform_loop(rounds, "round") as rnd:
        b = sm.b
        m = col_of(rnd)
        sm.set(acc, ident)
        r = b.lshr(sm.tid(), c32(5))
        with sm.if_then(b.icmp_unsigned("<", m, ctx.const(M))):
            _accumulate(sm, ctx, op, acc, m, b.zext(r, it) if it.width > 32 else r, ks)
        b.store(sm.get(acc), b.gep(part, [sm.tid()], source_etype=rty))
        sm.barrier()
        b = sm.b
        m = col_of(rnd)
        first = b.icmp_unsigned("<", sm.tid(), c32(cols))
        with sm.if_then(b.and_(first, b.icmp_unsigned("<", m, ctx.const(M)))):
            v = b.load(b.gep(part, [sm.tid()], source_etype=rty), typ=rty)
            for j in range(1, ks):
                p = b.gep(part, [b.add(sm.tid(), c32(j * cols))], source_etype=rty)
                v = S.combine(b, op.name, dt, v, b.load(p, typ=rty))
            _finish_row(ctx, k, op, m, v)
        sm.barrier()
    sm.finish()
    return [_launch(k, sm, ids)]


# ------------------------------------------------------------------ scatter_add

def gen_scatter(mod, plan, k, target):
    op = k.heavy
    ids_v, upd = op.operands
    p = op.params()
    axis, dim = p["axis"], p["dim"]
    us, is_ = shape_of(upd.type), shape_of(ids_v.type)
    n = len(is_)
    out = k.root
    os_ = shape_of(out.type)
    dt = dtype_of(upd.type)
    U = numel(us)
    block = min(THREADS, max(32, _cdiv(U, 32) * 32))
    grid = GridDim(U, block) if U else 1
    sm, ctx, bids = _setup(mod, plan, k, target, block, (grid,), [out, upd, ids_v] + k.reads)
    c = ctx.const
    with sm.loop(_gtid(sm, ctx), c(U), _stride(sm, ctx, block, grid), ctx.itype) as i:
        b = sm.b
        ctx.memo = {}
        ui = E.Index(ctx, us, linear=i)
        (val,) = E.value(ctx, upd, ui)
        (iv,) = E.value(ctx, ids_v, E.Index(ctx, is_, dims=[ui.dim(axis + j) for j in range(n)]))
        E.check_index(ctx, op, iv, dim)               # out of range: IndexError after the run
        iv = S.convert(b, iv, dtype_of(ids_v.type), "i64" if ctx.itype.width > 32 else "i32")
        inb = b.icmp_unsigned("<", iv, c(dim))       # ... and the update is dropped
        dims = [ui.dim(j) for j in range(axis)] + [iv] + \
               [ui.dim(axis + n + j) for j in range(len(us) - axis - n)]
        oi = E.Index(ctx, os_, dims=dims)
        with sm.if_then(inb):
            ptr = E.element_ptr(ctx, out, oi.linear())
            kind = "fadd" if dt in ("f32", "f64") else "add"
            sm.b.atomic_rmw(kind, ptr, val, "monotonic")
    sm.finish()
    return [_launch(k, sm, bids, memset=[plan.buffer_of[out].id])]


GENERATORS = {
    "elementwise": gen_elementwise,
    "reduce": gen_reduce,
    "matmul": lambda mod, plan, k, target: gpu_matmul.gen_matmul(mod, plan, k, target,
                                                                 _setup, _launch),
    "scatter": gen_scatter,
    "attention": lambda mod, plan, k, target: gpu_attention.gen_attention(mod, plan, k, target,
                                                                       _setup, _launch),
}


def build_kernels(module, target: str = "gpu", dims: list | None = None,
                  decisions: dict | None = None):
    """(llvmlite module, GpuPlan, launches) for an rlx module (or Func).  `dims`: the
    size symbols of a size-generic build (dynplan.py): every kernel takes one i64 per
    symbol, grid-stride steps and round counts come from the launch's grid, and each
    launch records its grid rule; `decisions` (a dict shared by the builds at every
    sample) fixes the size-dependent choices at the first build's."""
    from rlxc.dialect.attention import expand_module
    from rlxc.lowering.shared.empty import rewrite_empty

    from rlxc.dialect.conv_decompose import decompose_conv

    module = decompose_conv(getattr(module, "module", module))   # convolutions -> GEMMs
    # rlx.attention: the fused flash-style kernel (gpu/attention.py) where it covers the
    # op, else the query-blocked matmul-softmax-matmul expansion
    module = expand_module(module, keep=gpu_attention.covers)
    plan = plan_module(rewrite_empty(module, checked_indices=False))
    plan.dims = dims
    plan.decisions = decisions if dims is not None else None
    if target == "gpu":
        mod = nvptx.new_module(plan.func.sym_name.data)
    else:
        mod = ir.Module(plan.func.sym_name.data)
    steps = []
    if plan.error_buffer is not None:     # the index checks' flag starts at 0 on every run
        steps.append({"op": "memset", "buffer": plan.error_buffer.id})
    for k in plan.kernels:
        if numel(shape_of(k.root.type)) == 0:
            continue
        for launch in GENERATORS[k.kind](mod, plan, k, target):
            for bid in launch.pop("memset"):
                steps.append({"op": "memset", "buffer": bid})
            steps.append({"op": "launch", **launch})
    return mod, plan, steps

"""Reduction schedules: sum/mean/prod/max/min of a fused expression.

    rlx.<reduce>(expr(x), axes)          (expr = the fused producers, inlined)
          │ build_reduction: collapse dims, order loops kept-outer / reduced / kept-inner
          ▼
    scalar   [parallel] for o: acc = id
                                for r...: acc op= expr          (innermost r contiguous)
                                out[o] = finalize(acc)
    blocked  acc64 = 0; for blk: acc = 0; for r in blk (<= BLOCK): acc += expr; acc64 += acc
    split    parallel for c < C: partial[c] = <scalar over r0 in chunk c>   (no kept dims,
             then     out = finalize(combine(partial[0..C)))                 >= SPLIT_MIN elems)
    rows     parallel for c < C: part[c, :] = <buffer mode over r0 in chunk c>  (buffer mode,
             then     out[:] = finalize(combine(part[0..C), :))   parallel, no kept dim outside)
    buffer   [parallel] for o: out[o, :] = id                    (kept dims after the last
                                for r: for q: out[o, q] op= expr   reduced dim: the inner
                                (mean) out[o, :] /= n               loop stays contiguous)
             the last kept-inner dim q is cut into blocks of QBLOCK_VECTORS registers, the block loop
             outermost (parallel when nothing else is):  for o, qb: out[o, qb] = id;
                                for r: for q in qb: out[o, q] op= expr   (a register block)

`op` is add (sum, mean), mul (prod), max, min (NaN-propagating, llvm.maximum),
or/and for i1.  Float adds and multiplies in the innermost loop carry
reassoc/contract flags so LLVM vectorizes and interleaves them (vector partial
sums); the chunk count of a split reduction is fixed at compile time, so the
result does not depend on the thread count.  Mean divides the (f64 where
blocked) sum by the element count once; integer means truncate toward zero
like the interpreter's cast.
"""
from __future__ import annotations

import functools

from rlxc.dialect.shapes import SHAPES
from rlxc.dialect.types import dtype_of, shape_of

from rlxc.lowering.cpu import indexing as ix
from rlxc.lowering.cpu.fusion import Gen
from rlxc.lowering.cpu.loops import Acc, AccDecl, AccRef, Buffer, Const, For, Load, LoopKernel, Op, Store, Update
from rlxc.lowering.cpu.schedule import collapse, cost, identity, map_expr, nest
from rlxc.lowering.cpu.tuning import BLOCK, CHUNK, MAX_CHUNKS, PAR_MIN_WORK, QBLOCK_VECTORS, SPLIT_MIN

COMBINE = {n[4:]: s.combine for n, s in SHAPES.items() if s.combine}   # dialect/shapes.py
BOOL_COMBINE = {"add": "or", "mul": "and", "max": "or", "min": "and"}


def _prod(xs):
    n = 1
    for x in xs:
        n *= x
    return n


def _finalize(kind, acc_expr, dt, n):
    """Value stored for an accumulator (f64 accumulators are rounded to f32)."""
    e = acc_expr
    if kind == "mean" and dt != "i1":
        if dt == "f32":
            e = Op("div", (e, Const(float(n), e.dtype)), e.dtype)
        else:
            e = Op("cast", (Op("div", (Op("cast", (e,), "f64"), Const(float(n), "f64")),
                                "f64"),), dt)
    if e.dtype != dt:
        e = Op("cast", (e,), dt)
    return e


class _Ctx:
    def __init__(self, b, kind, dt, combine, expr, red, nred, generic=False):
        self.b, self.kind, self.dt, self.combine = b, kind, dt, combine
        self.expr, self.red, self.nred = expr, red, nred
        # a reduced dim that is a symbol (generic): no f64 blocks, whose count
        # ceil(n / BLOCK) is not linear in the sizes (vectorized f32 partial sums instead)
        self.wide = dt == "f32" and combine == "add" and nred > BLOCK and not generic
        self.f64 = dt == "f32" and combine == "mul"  # products: every step in f64
        if self.f64:
            self.expr = Op("cast", (expr,), "f64")
        self._n = 0

    def acc(self, dt):
        self._n += 1
        return Acc(f"acc{self._n}", dt)

    def loops(self, top, first_range=None):
        """Statements reducing expr over the reduced vars into accumulator `top`.

        `first_range` = (start, stop, span) overrides the range of the first reduced var
        (span: the most iterations it can have)."""
        red = self.red
        ranges = [(ix.ZERO, ix.const(v.extent)) for v in red]
        span = None
        if first_range is not None and red:
            ranges[0] = first_range[:2]
            span = first_range[2]
        if not self.wide:
            body = [Update(top, self.combine, self.expr)]
            for v, (s, e) in reversed(list(zip(red, ranges))):
                body = [For(v, s, e, body)]
            return body
        # f32 partials of <= BLOCK elements of the innermost reduced var, summed in f64
        inner = red[-1]
        s, e = ranges[-1]
        a32 = self.acc("f32")
        n_in = inner.extent if first_range is None or len(red) > 1 else None
        if n_in is not None and n_in <= BLOCK:
            body = [AccDecl(a32, identity(self.combine, "f32")),
                    For(inner, s, e, [Update(a32, self.combine, self.expr)]),
                    Update(top, self.combine, Op("cast", (AccRef(a32),), "f64"))]
        else:
            span = span if n_in is None else n_in
            nb = -(-max(span, 1) // BLOCK)
            blk = ix.Var(f"{inner.name}_blk", nb)
            bs = ix.add(s, ix.scale(ix.var(blk), BLOCK))
            be = ix.minimum(ix.add(bs, BLOCK), e)
            body = [For(blk, ix.ZERO, ix.const(nb), [
                AccDecl(a32, identity(self.combine, "f32")),
                For(inner, bs, be, [Update(a32, self.combine, self.expr)]),
                Update(top, self.combine, Op("cast", (AccRef(a32),), "f64"))])]
        for v, (s, e) in reversed(list(zip(red[:-1], ranges[:-1]))):
            body = [For(v, s, e, body)]
        return body


def build_reduction(b, v, op, what):
    x = op.operands[0]
    shp = shape_of(x.type)
    out = b.bufs[v]
    if out.numel == 0:
        return
    kind = op.name[4:]
    axes = op.params()["axes"]
    dt = dtype_of(x.type)
    combine = COMBINE[kind]
    if dt == "i1":
        combine = BOOL_COMBINE[combine]
    vars_ = [ix.Var(f"i{d}", n) for d, n in enumerate(shp)]
    idx = tuple(ix.var(u) if u.extent != 1 else ix.ZERO for u in vars_)
    gen = Gen(b.plan, b.bufs)
    expr = gen.value(x, idx)
    kept = [d for d in range(len(shp)) if d not in axes]
    off = ix.linearize([idx[d] for d in kept], [shp[d] for d in kept])
    nred = _prod(shp[a] for a in axes)
    live = [(u, d in axes) for d, u in enumerate(vars_) if u.extent != 1]
    lv, (expr,), (off,) = collapse([u for u, _ in live], [expr], [off],
                                   [r for _, r in live])
    labels = {}
    for u, r in live:
        labels[u.name] = r
    isred = [labels[u.name] for u in lv]
    red = [u for u, r in zip(lv, isred) if r]
    last = max((i for i, r in enumerate(isred) if r), default=len(lv))  # none: all outer
    outer = [u for i, (u, r) in enumerate(zip(lv, isred)) if not r and i < last]
    inner = [u for i, (u, r) in enumerate(zip(lv, isred)) if not r and i > last]
    work = _prod(shp) * (1 + cost(expr))
    par = work >= PAR_MIN_WORK
    # size-generic programs (dynsizes.py): a reduced dim of a sample size may be a symbol,
    # and the blocks and chunks below are counted by ceil(n / size), which is not linear
    # in it: such a reduction runs as one vectorized loop (a dynamic batch's MSE)
    generic = any(shp[a] in getattr(b, "symbol_sizes", ()) for a in axes)
    cx = _Ctx(b, kind, dt, combine, expr, red, nred, generic)
    adt = "f64" if cx.wide or cx.f64 else dt

    if inner:  # buffer mode: accumulate in the output
        if not outer and par and _row_split(red, inner):
            _buffer_split(b, cx, out, off, inner, what, work, gen)
            return
        inest, blk = _column_blocks(inner, _lanes(getattr(b, "cpu", "native")))
        fin = []
        if kind == "mean" and dt != "i1":
            fin = inest([Store(out, off, _finalize(kind, Load(out, off), dt, nred))])
        body = (inest([Store(out, off, identity(combine, dt))]) +
                nest(red, inest([Store(out, off, expr, combine)])) + fin)
        b._add(LoopKernel(b._kname("reduce"), what, nest(outer + blk, body, par), work, [out]),
               gen)
        return

    if not outer and red and nred >= SPLIT_MIN and red[0].extent >= 2 and not generic:
        _split(b, cx, out, off, what, work, gen, adt)
        return
    jam = _jam(outer, cx, _lanes(getattr(b, "cpu", "native")), par)
    if jam is not None:
        _jammed(b, cx, out, off, outer, jam, what, work, par, gen, adt)
        return
    top = cx.acc(adt)
    body = [AccDecl(top, identity(combine, adt))] + cx.loops(top) + \
        [Store(out, off, _finalize(kind, AccRef(top), dt, nred))]
    b._add(LoopKernel(b._kname("reduce"), what, nest(outer, body, par), work, [out]), gen)


JAM_MAX_COST = 6   # expressions up to this cost are repeated per jammed output
JAM_MIN_PAR = 16   # parallel iterations a jam may leave in a parallel nest's outer loop


def _jam(outer, cx, lanes: int, par: bool = False):
    """(position in `outer`, factor U) of the kept dim whose outputs a scalar reduction
    computes U at a time, or None.  One reduced dim of at least two vectors, reduced
    in the target dtype: each output is a vectorized partial-sum chain and a horizontal
    sum, and one output at a time runs at the FMA latency (a 256-long dot product: 16
    dependent FMAs); U independent chains overlap it and share the loads of the
    operand that does not depend on the jammed dim (x of W @ x).  A parallel nest keeps
    at least JAM_MIN_PAR iterations in its outermost loop."""
    if cx.wide or cx.f64 or len(cx.red) != 1 or not outer:
        return None
    if cx.red[0].extent < 2 * lanes or cost(cx.expr) > JAM_MAX_COST:
        return None
    for u in (4, 2):
        for k in range(len(outer) - 1, -1, -1):
            if outer[k].extent % u == 0 and not (
                    par and k == 0 and outer[0].extent // u < JAM_MIN_PAR):
                return k, u
    return None


def _jammed(b, cx, out, off, outer, jam, what, work, par, gen, adt):
    """`for o_jam: for <kept after o>: acc_j = id (j < U); for r: acc_j op= expr[o = U*o_jam
    + j]; out[..] = finalize(acc_j)` (unroll and jam of the kept dim `o` = outer[k])."""
    k, u = jam
    o = outer[k]
    oj = ix.Var(f"{o.name}_jam", o.extent // u)
    r = cx.red[0]
    decls, ups, stores = [], [], []
    for j in range(u):
        m = {o: ix.add(ix.scale(ix.var(oj), u), j)}
        a = cx.acc(adt)
        decls.append(AccDecl(a, identity(cx.combine, adt)))
        ups.append(Update(a, cx.combine, map_expr(cx.expr, m)))
        stores.append(Store(out, ix.subst(off, m), _finalize(cx.kind, AccRef(a), cx.dt,
                                                              cx.nred)))
    body = decls + [For(r, ix.ZERO, ix.const(r.extent), ups)] + stores
    loops = nest(outer[:k] + [oj], nest(outer[k + 1:], body), par)
    b._add(LoopKernel(b._kname("reduce"), what, loops, work, [out]), gen)


@functools.lru_cache(maxsize=None)
def _lanes(cpu: str) -> int:
    """f32 lanes of the target's vector registers (16 AVX-512, 8 AVX2, 4 SSE/NEON): the
    ISA the target's sgemm configuration was derived for."""
    from rlxc.lowering.cpu.sgemm_kernels import sgemm_config

    try:
        return sgemm_config(cpu).vl
    except NotImplementedError:
        return 4


def _column_blocks(inner, lanes: int):
    """(nest function for the kept-inner loops, extra outer loop vars) of buffer mode.

    The last kept-inner dim q (a matrix-vector product x @ W, a bias gradient; with
    the vectors of merged matrix-vector products W.T @ [g, h] as kept dims before it)
    is cut into blocks with the block loop outside the reduction:
    `for qb: for r...: for n...: for q in block: out[n, q] op= e`.  A block is
    QBLOCK_VECTORS vector registers of `out` in all (over the n... dims), so it stays
    in registers across the whole reduction instead of being loaded and stored once
    per reduced element (512 accumulators spilled to the stack, each update a load and
    a store), and the block loop can run in parallel when no other kept dim is outside."""
    q = inner[-1]
    rest = _prod(u.extent for u in inner[:-1])
    width = QBLOCK_VECTORS * lanes // rest // lanes * lanes   # columns per block
    if width < lanes or q.extent < 2 * width:
        return (lambda stmts: nest(inner, stmts)), []
    size = next((c for c in (width, width // 2) if c >= lanes and q.extent % c == 0), width)
    qb = ix.Var(f"{q.name}_blk", -(-q.extent // size))
    lo = ix.scale(ix.var(qb), size)
    hi = ix.add(lo, size) if q.extent % size == 0 else ix.minimum(ix.add(lo, size),
                                                                    ix.const(q.extent))
    return (lambda stmts: nest(inner[:-1], [For(q, lo, hi, stmts)])), [qb]


ROW_SPLIT_CHUNKS = 4       # row chunks of a parallel buffer-mode reduction (0: off)
ROW_SPLIT_MIN_ROWS = 32    # ... each at least this many rows of the reduced dim
ROW_SPLIT_MAX_INNER = 4096  # ... and a kept row this short (a partial row stays in L1)


def _row_split(red, inner) -> bool:
    """Whether a parallel buffer-mode reduction with no kept dim outside it (x @ W at
    batch 1: out[q] = sum_k x[k] W[k, q]) is split over its rows (see _buffer_split).
    Only into equal chunks: their bounds c * n/C are then linear in the row count n,
    which a size-generic program (dynsizes.py fits every bound as c0 + k * size) needs;
    a ragged split (ceil(n/C)) would make a dynamic batch's bias gradient (sum over B)
    fall back to one program per size."""
    n_inner = _prod(u.extent for u in inner)
    n0 = red[0].extent if red else 0
    return (ROW_SPLIT_CHUNKS >= 2 and n_inner <= ROW_SPLIT_MAX_INNER and
            n0 >= ROW_SPLIT_CHUNKS * ROW_SPLIT_MIN_ROWS and n0 % ROW_SPLIT_CHUNKS == 0)


def _buffer_split(b, cx, out, off, inner, what, work, gen):
    """A parallel buffer-mode reduction split over the rows of its first reduced dim:

        parallel for c < C:  part[c, :] = id
                             for r in rows of chunk c: for q: part[c, q] op= expr
        then                 out[q] = part[0, q] op ... op part[C-1, q]   (mean: / n)

    Each thread streams whole rows of the matrix (one sequential stream: measured
    ~10% less CPU time than QBLOCK_VECTORS column blocks on one thread for W8's
    784x512 and 512x512 layers) and only its own rows: with two threads each core
    reads half of W, which then stays in its own L2 across calls.  The chunk count is
    fixed at compile time (ROW_SPLIT_CHUNKS), so the result does not depend on the
    thread count; a partial row is at most ROW_SPLIT_MAX_INNER elements (in L1), and the
    row count is a multiple of the chunk count."""
    dt, combine = cx.dt, cx.combine
    r0 = cx.red[0]
    chunks = ROW_SPLIT_CHUNKS
    cs = r0.extent // chunks      # _row_split: equal chunks
    n_inner = _prod(u.extent for u in inner)
    part = b._buf(f"part{len(b.buffers)}", "temp", dt, chunks * n_inner)
    c = ix.Var("c", chunks)
    start = ix.scale(ix.var(c), cs)
    stop = ix.add(start, cs)
    poff = ix.add(ix.scale(ix.var(c), n_inner), off)
    expr = cx.expr.args[0] if cx.f64 else cx.expr   # the partials are of dt (not f64 steps)
    body = (nest(inner, [Store(part, poff, identity(combine, dt))]) +
            [For(r0, start, stop, nest(cx.red[1:], nest(inner, [
                Store(part, poff, expr, combine)])))])
    loop = For(c, ix.ZERO, ix.const(chunks), body, parallel=True)
    b._add(LoopKernel(b._kname("reduce_rows"), what + f" ({chunks} row chunks)", [loop], work,
                      [part]), gen)
    stores = [Store(out, off, Load(part, off))]
    stores += [Store(out, off, Load(part, ix.add(off, j * n_inner)), combine)
               for j in range(1, chunks)]
    if cx.kind == "mean" and dt != "i1":
        stores.append(Store(out, off, _finalize(cx.kind, Load(out, off), dt, cx.nred)))
    b._add(LoopKernel(b._kname("reduce_combine"), what + " (combine row chunks)",
                      nest(inner, stores), chunks * n_inner, [out]))


def _split(b, cx, out, off, what, work, gen, adt):
    r0 = cx.red[0]
    n0 = r0.extent
    chunks = max(2, min(n0, MAX_CHUNKS, -(-cx.nred // CHUNK)))
    cs = -(-n0 // chunks)
    if cx.wide and len(cx.red) == 1 and cs > BLOCK:
        cs = -(-cs // BLOCK) * BLOCK
    chunks = -(-n0 // cs)
    part = b._buf(f"part{len(b.buffers)}", "temp", adt, chunks)
    c = ix.Var("c", chunks)
    start = ix.scale(ix.var(c), cs)
    stop = ix.minimum(ix.add(start, cs), ix.const(n0))
    top = cx.acc(adt)
    body = [AccDecl(top, identity(cx.combine, adt))] + cx.loops(top, (start, stop, cs)) + \
        [Store(part, ix.var(c), AccRef(top))]
    loop = For(c, ix.ZERO, ix.const(chunks), body, parallel=True)
    b._add(LoopKernel(b._kname("reduce_chunks"), what + f" ({chunks} chunks)", [loop], work,
                      [part], dynamic=True), gen)
    fin = cx.acc(adt)
    c2 = ix.Var("c", chunks)
    body = [AccDecl(fin, identity(cx.combine, adt)),
            For(c2, ix.ZERO, ix.const(chunks), [Update(fin, cx.combine, Load(part, ix.var(c2)))]),
            Store(out, off, _finalize(cx.kind, AccRef(fin), cx.dt, cx.nred))]
    b._add(LoopKernel(b._kname("reduce_combine"), what + " (combine chunks)", body, chunks,
                      [out]))


__all__ = ["build_reduction", "Buffer"]

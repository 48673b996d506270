"""A two-loop map that reads across rows (a transpose) as square tiles.

    for i in [a, b):                           for ib in [a, b) step T:
      for j in [c, d):                  ->       for jb in [c, d) step T:
        out[.. + j] = e(src[i + j*S], ...)         for i in [ib, min(ib + T, b)):
                                                     for j in [jb, min(jb + T, d)):
                                                       out[.. + j] = e(...)

Why: the schedule walks such a map in the output's order (the store runs along the inner
loop, so it is contiguous), and then every inner iteration reads `src` a whole row of S
elements further on: each element costs a cache line (and a TLB entry) of its own, and a
power-of-two S puts all of them in one L1 set.  A 1024 x 1024 float32 transpose took 6.5 ms
on one Zen 3 core that way (NumPy's 5.7); in T x T tiles the T lines a tile reads stay in
L1 for its T rows (a C loop: 5.2 -> 2.3 ms with T = 8, and 3.5 ms with T = 16, whose 16
lines of a 4 KiB stride overflow the 8 ways of an L1 set).

Applies to a loop whose body is one loop whose body is one plain Store (no combine) that is
contiguous along the inner variable, whose inner bounds do not depend on the outer
variable, and whose value reads some buffer with a stride of at least MIN_STRIDE elements
along the inner variable and contiguously along the outer one (every index linear in
both; a stride that is a symbolic size of a dynamic program does not count).  The tiles keep
each element's expression as it was: only the order changes.
"""
from __future__ import annotations

import llvmlite.ir as ir

from rlxc.lowering.cpu import indexing as ix
from rlxc.lowering.cpu.loops import For, Load, Store, walk_expr
from rlxc.lowering.cpu.schedule import coeff_along, linear_in

TILE = 8            # rows and columns of a tile (8 lines of one L1 set: its 8 ways)
MIN_STRIDE = 64     # elements: a read this far apart along the inner loop misses each time

I64 = ir.IntType(64)


def applies(s: For) -> bool:
    """Whether tile_loop emits `s` (the header's conditions)."""
    if len(s.body) != 1 or not isinstance(s.body[0], For):
        return False
    inner = s.body[0]
    if len(inner.body) != 1 or not isinstance(inner.body[0], Store) or inner.body[0].combine:
        return False
    st, i, j = inner.body[0], s.var, inner.var
    if any(i in ix.variables(ix.of(a)) for a in (inner.start, inner.stop)):
        return False
    if coeff_along(st.off, j) != 1 or not (linear_in(st.off, i) and linear_in(st.off, j)):
        return False
    across = False
    for x in walk_expr(st.value):
        if isinstance(x, Load):
            if not (linear_in(x.off, i) and linear_in(x.off, j)):
                return False
            cj = coeff_along(x.off, j)     # a symbolic stride (dynamic sizes): not tiled
            across = across or (isinstance(cj, int) and abs(cj) >= MIN_STRIDE and
                                coeff_along(x.off, i) == 1)
    return across


def tile_loop(body, b: ir.IRBuilder, s: For, vars_, lohi=None) -> None:
    """Emit `s` (applies(s)) for `body` (a codegen.Body) in TILE x TILE tiles."""
    inner = s.body[0]
    start0, stop0 = body.bounds(b, s, vars_, lohi)
    start1, stop1 = body.bounds(b, inner, vars_)

    def upto(b, lo, stop):
        end = b.add(lo, ir.Constant(I64, TILE))
        return b.select(b.icmp_signed("<", end, stop), end, stop)

    def row_block(b, v0):
        i0 = v0[s.var]

        def col_block(b, v1):
            j0 = v1[inner.var]
            rows = (i0, upto(b, i0, stop0))
            cols = (j0, upto(b, j0, stop1))
            body.loop(b, s, v1, lohi=rows,
                      body_fn=lambda b, v2: body.loop(b, inner, v2, lohi=cols, tag="tc"),
                      tag="tr")
        body.loop(b, inner, v0, lohi=(start1, stop1), body_fn=col_block, step=TILE, tag="tj")
    body.loop(b, s, vars_, lohi=(start0, stop0), body_fn=row_block, step=TILE, tag="ti")

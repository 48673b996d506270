"""The `row-fusion` pass: consecutive loop kernels over the same rows become one loop over the rows.

    k1  parallel for o in [0, R):  m[o] = max_c x[o, c]                     (a pass over x)
    k2  parallel for o in [0, R):  for c: e[o, c] = exp(x[o, c] - m[o])     (a pass over x)
    k3  parallel for o in [0, R):  s[o] = sum_c e[o, c]                     (a pass over e)
    k4  parallel for o in [0, R):  for c: y[o, c] = e[o, c] / s[o]          (a pass over e)
          │ fuse_rows (driver.lower after operand_prologue, whose producers must stay
          ▼ single loop nests; dynsizes and regions right after build_program)
    k1_k2_k3_k4  parallel for o in [0, R):  m[o] = ...; for c: e[o, c] = ...; s[o] = ...;
                                            for c: y[o, c] = ...

Why: each kernel of a softmax, a layer norm or an argmax walks the whole tensor, so a
1024 x 1024 float32 softmax read or wrote 4 MiB six times, from L3 or memory.  Fused,
every later pass over a row finds it in L1 (a row of 1024 floats is 4 KiB): one read of
x and one write of e and y.  Also one fork instead of four.

A kernel's outer loop may run over groups of rows (a reduction that computes 4 rows at a
time, reduce._jammed: `for o_jam in [0, R/4)`).  When one kernel's row count is u times
the other's (u <= MAX_WRAP), the finer one is wrapped: `o = u * o_jam + j` with an inner
`for j in [0, u)`, so both run over the same groups.

When it is sound.  Both kernels are LoopKernels whose body is one loop over [0, extent)
(not a stream loop, not claimed dynamically).  With O the shared outer variable, every
access (store or load, in either kernel) to a buffer that either kernel writes must be
row-owned: its offset is `c * O + rest` with 0 <= rest < c, the same c for every access
to that buffer, and no indirection through a written buffer.  Then iteration O of the
fused loop touches only row block O of every written buffer, and in that block the
fused order (k1's statements, then k2's) is the unfused order: k2 reads what k1 wrote
for that block, and no other iteration writes it.  This also makes the fused loop safe to
split over threads (it is parallel when either kernel's loop was: a kernel is serial
only because its work is small).  k2 may not write anything k1 reads or writes, and k2
must read something k1 writes (independent kernels gain nothing from sharing a loop, and
a transpose keeps its tiled loop, tiles.py).  Loops that store, with non-temporal
stores, a buffer the other kernel reads lose the streaming (the read would miss).

Memory.  Every temp a fused kernel writes lives over the whole kernel, where unfused it
could die after its last reader and lend its space to a later one (buffers.plan).  A
fused kernel therefore writes whole rows of at most MAX_ROW_TEMPS temps (a softmax's
exponentials and its result, a layer norm's centered rows and its result); per-row values
(a row's max or sum) do not count.  The test is by structure, not by size, so that a
dynamic program's sampled sizes all fuse alike (dynsizes.py merges them kernel by kernel).
"""
from __future__ import annotations

from rlxc.lowering.cpu import indexing as ix
from rlxc.lowering.cpu.loops import (AccDecl, For, InRange, IndexValue, Load, LoopKernel, Store,
                                     Update,
                                     affine_buffers, stmt_exprs, walk, walk_expr)
from rlxc.lowering.cpu.schedule import map_expr

NAME = "row-fusion"
MAX_WRAP = 8    # the most rows of a finer kernel one iteration of a coarser one may cover
MAX_ROW_TEMPS = 2   # temps a fused kernel may write whole rows of (their lifetimes grow)


def outer_loop(k):
    """The one loop of a fusable kernel, or None."""
    if not isinstance(k, LoopKernel) or k.dynamic or len(k.body) != 1:
        return None
    f = k.body[0]
    if not isinstance(f, For) or f.stream or not isinstance(f.var.extent, int):
        return None
    if ix.of(f.start) != ix.ZERO or ix.of(f.stop) != ix.const(f.var.extent):
        return None
    return f


def subst_stmts(stmts, mapping: dict, rebase=None) -> list:
    """Copies of `stmts` with loop variables replaced (mapping: Var -> Affine), and each
    load's and store's offset passed through rebase(buf, off) when given (rowlocal.py)."""
    memo: dict = {}
    out = []
    for s in stmts:
        if isinstance(s, For):
            out.append(For(s.var, ix.subst(s.start, mapping), ix.subst(s.stop, mapping),
                           subst_stmts(s.body, mapping, rebase), s.parallel, s.stream))
        elif isinstance(s, Store):
            off = ix.subst(s.off, mapping)
            out.append(Store(s.buf, rebase(s.buf, off) if rebase else off,
                             map_expr(s.value, mapping, memo, rebase), s.combine))
        elif isinstance(s, Update):
            out.append(Update(s.acc, s.op, map_expr(s.value, mapping, memo, rebase)))
        elif isinstance(s, AccDecl):
            out.append(AccDecl(s.acc, map_expr(s.init, mapping, memo, rebase)))
        else:
            raise TypeError(f"rowfuse: unknown statement {type(s).__name__}")
    return out


def _loop_vars(stmts) -> set:
    return {s.var for s in walk(stmts) if isinstance(s, For)}


def _on(f: For, outer: ix.Var, u: int):
    """f's body over `outer`: renamed (u == 1) or wrapped in `for j in [0, u)` with
    f.var = u * outer + j; None when a name would clash."""
    if outer in _loop_vars(f.body):
        return None
    if u == 1:
        return subst_stmts(f.body, {f.var: ix.var(outer)})
    j = ix.Var(f"{f.var.name}_in_{outer.name}", u)
    if j in _loop_vars(f.body) or j == outer:
        return None
    body = subst_stmts(f.body, {f.var: ix.add(ix.scale(ix.var(outer), u), ix.var(j))})
    return [For(j, ix.ZERO, ix.const(u), body)]


def accesses(stmts):
    """(buffer, offset, is_store) of every store and load in `stmts`, and the buffers read
    through an index (an indirection)."""
    acc, indirect = [], set()
    for s in walk(stmts):
        if isinstance(s, For):
            indirect.update(affine_buffers(s.start) + affine_buffers(s.stop))
        elif isinstance(s, Store):
            acc.append((s.buf, s.off, True))
            indirect.update(affine_buffers(s.off))
        for e in stmt_exprs(s):
            for x in walk_expr(e):
                if isinstance(x, Load):
                    acc.append((x.buf, x.off, False))
                    indirect.update(affine_buffers(x.off))
                elif isinstance(x, (InRange, IndexValue)):
                    indirect.update(affine_buffers(x.idx))
    return acc, indirect


def row_stride(off, outer: ix.Var):
    """c when `off` is c * outer + rest with 0 <= rest < c (row-owned), else None."""
    a = ix.of(off)
    c = a.coeffs().get(outer, 0)
    if not isinstance(c, int) or c <= 0:
        return None
    rest = ix.add(a, ix.scale(ix.var(outer), -c))
    if outer in ix.variables(rest):
        return None
    lo, hi = ix.bounds(rest)
    if not (isinstance(lo, int) and isinstance(hi, int)) or lo < 0 or hi >= c:
        return None
    return c


def _row_temps(stmts, outer: ix.Var) -> set:
    """The temps `stmts` store a row of values into (the store's offset runs along a loop
    inside the row loop; not a per-row value such as a row's max)."""
    wrap = "_in_" + outer.name
    out = set()
    for s in walk(stmts):
        if isinstance(s, Store) and s.buf.kind == "temp" and any(
                v != outer and not v.name.endswith(wrap) for v in ix.variables(s.off)):
            out.add(s.buf)
    return out


def no_stream(stmts, bufs: set) -> None:
    """Turn off non-temporal stores of loops that store one of `bufs` (read back soon)."""
    for s in walk(stmts):
        if isinstance(s, For) and s.stream and any(
                isinstance(x, Store) and x.buf in bufs for x in walk(s.body)):
            s.stream = False


def fuse_pair(k1, k2):
    """One LoopKernel doing k1 then k2 row block by row block, or None (see the header)."""
    f1, f2 = outer_loop(k1), outer_loop(k2)
    if f1 is None or f2 is None:
        return None
    e1, e2 = f1.var.extent, f2.var.extent
    if e1 == e2 or (e2 % e1 == 0 and e2 // e1 <= MAX_WRAP):
        outer = f1.var
        b1, b2 = _on(f1, outer, 1), _on(f2, outer, e2 // e1)
    elif e1 % e2 == 0 and e1 // e2 <= MAX_WRAP:
        outer = f2.var
        b1, b2 = _on(f1, outer, e1 // e2), _on(f2, outer, 1)
    else:
        return None
    if b1 is None or b2 is None:
        return None
    a1, ind1 = accesses(b1)
    a2, ind2 = accesses(b2)
    w1 = {b for b, _, st in a1 if st}
    w2 = {b for b, _, st in a2 if st}
    r1 = {b for b, _, st in a1 if not st}
    r2 = {b for b, _, st in a2 if not st}
    if w2 & (w1 | r1) or not (w1 & r2):
        return None
    written = w1 | w2
    if written & (ind1 | ind2):
        return None
    strides: dict = {}
    for b, off, _ in a1 + a2:
        if b in written:
            c = row_stride(off, outer)
            if c is None or strides.setdefault(b, c) != c:
                return None
    if len(_row_temps(b1 + b2, outer)) > MAX_ROW_TEMPS:
        return None
    no_stream(b1, w1 & r2)
    loop = For(outer, ix.ZERO, ix.const(outer.extent), b1 + b2, f1.parallel or f2.parallel)
    outs = list(k1.outputs) + [b for b in k2.outputs if b not in k1.outputs]
    return LoopKernel(f"{k1.name}_{k2.name.split('_')[0]}", f"{k1.what}; {k2.what}", [loop],
                      k1.work + k2.work, outs)


def fuse_rows(prog):
    """Fuse every run of consecutive row-compatible loop kernels of `prog` (in place)."""
    out: list = []
    for k in prog.kernels:
        fused = fuse_pair(out[-1], k) if out else None
        if fused is not None:
            out[-1] = fused
        else:
            out.append(k)
    prog.kernels = out
    return prog


__all__ = ["NAME", "fuse_rows", "fuse_pair", "MAX_WRAP", "MAX_ROW_TEMPS"]

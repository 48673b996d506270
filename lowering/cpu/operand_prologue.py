"""The `operand-prologue` pass: a big per-image GEMM operand is built per image, not whole.

    k1: parallel for i0 in [0, N*q):            (a map, e.g. a conv's im2col gather:
          for ...: T[i0*c0 + r] = f(i0, ...)     T is N slices of S = q*c0 floats)
    k2: for b in [0, N): sgemm(A, B=T+[b*S], C+[b*...])      (one GEMM per image)
    k9: for b in [0, N): sgemm(A=T+[b*S], B, ...)            (the filter gradient)
          │ operand_prologue (a static program, after form_chains, before buffers.plan)
          ▼
    k2: for b in [0, N):                         (each consumer, its own slice buffer)
          prologue: for i0' in [0, q): for ...: Tb[i0'*c0 + r] = f(b*q + i0', ...)
          sgemm(A, B=Tb+[0], C+[b*...])
    k9: the same, into its own slice, before each image's GEMM

Why: on a core with a 1 MiB L2, conv1's im2col of a 64-image batch (15 MB) went out
to L3/DRAM while the gather wrote it, came back for the forward GEMM, and again for
the filter-gradient GEMM much later; a slice S (235 KB for a 3x32x32 image and 5x5
taps) is written into L2 right before the GEMM that reads it.  Recomputing the
gather twice costs less than streaming the big buffer three times.

Applies to a temp T that (all checked, else nothing changes):
  * is larger than the L2 (target.cache_info) while one slice fits it;
  * is written by exactly one LoopKernel, a perfect nest of plain fors over one plain
    store to T (no accumulators, no combine), whose first loop i0 runs over [0, N*q)
    and whose store offset is i0*c0 + r with r in [0, c0) for every inner index, c0*q = S;
  * is read only by MatmulKernels (not in a chain), each as exactly one of its two
    operands at offset S * (its flattened batch index), N batch elements, no epilogue
    read of T;
  * whose producer's inputs are written by no kernel between the producer and the last
    consumer (the prologue reads them later than the producer did).
A consumer whose batch loop splits over a team (par_batch) gets one slice per thread
(matmul_codegen.py offsets it by the thread id).  A size-generic (dynamic) program is
left alone.
"""
from __future__ import annotations

from rlxc.lowering.cpu import indexing as ix
from rlxc.lowering.cpu.loops import (Buffer, For, LoopKernel, MatmulKernel, MatOperand,
                                     Store, expr_buffers, walk_expr)

NAME = "operand-prologue"


def _nest(k: LoopKernel):
    """(loops outermost first, the store) of a perfect nest of plain fors, or None."""
    loops, body = [], k.body
    while len(body) == 1 and isinstance(body[0], For):
        f = body[0]
        if not (ix.of(f.start).is_const() and ix.of(f.start).const == 0 and
                ix.of(f.stop).is_const() and ix.of(f.stop).const == f.var.extent):
            return None
        loops.append(f)
        body = f.body
    if not loops or len(body) != 1 or not isinstance(body[0], Store) or body[0].combine:
        return None
    return loops, body[0]


def _flat(batch) -> ix.Affine:
    return ix.linearize([ix.var(v) if v.extent != 1 else ix.ZERO for v in batch],
                        [v.extent for v in batch])


def _nbatch(batch) -> int:
    n = 1
    for v in batch:
        n *= v.extent
    return n


def _uses(k, t) -> bool:
    return any(b is t for b in k.buffers())


def _consumer_side(k, t, S: int, nb: int):
    """'a' or 'b': which operand of MatmulKernel k reads slice b of t; None otherwise."""
    if not isinstance(k, MatmulKernel) or _nbatch(k.batch) != nb:
        return None
    if not all(isinstance(v.extent, int) for v in k.batch):
        return None
    sides = [s for s in ("a", "b") if getattr(k, s).buf is t]
    if len(sides) != 1 or k.out is t:
        return None
    if k.epilogue is not None and any(
            b is t for e in walk_expr(k.epilogue) for b in expr_buffers(e)):
        return None
    op = getattr(k, sides[0])
    return sides[0] if op.off == ix.scale(_flat(k.batch), S) else None


def _rebuild(loops, store, mapping, new_first, slice_buf, base):
    """The nest with i0 -> new_first's var: fresh fors (not parallel, not streamed) and
    the store redirected to slice_buf at its offset minus `base`."""
    from rlxc.lowering.cpu.schedule import map_expr

    off = ix.subst(store.off, mapping) + ix.scale(base, -1)
    st = Store(slice_buf, off, map_expr(store.value, mapping))
    body = [st]
    for f in reversed(loops[1:]):
        body = [For(f.var, f.start, f.stop, body)]
    return [For(new_first, ix.ZERO, ix.const(new_first.extent), body)], off


def _l2(cpu: str) -> int:
    """This core's L2 in bytes (tests patch it to reach the pass at small sizes)."""
    from rlxc.lowering.cpu.target import cache_info

    return cache_info(cpu).l2


def operand_prologue(prog, cpu: str = "native"):
    """Rewrite `prog` (static, planned kernels, no offsets yet) in place; see the header.
    Returns the names of the temps turned into per-image prologues."""
    if getattr(prog, "dims", None):
        return []
    l2 = _l2(cpu)
    done = []
    for L in list(prog.kernels):
        if not isinstance(L, LoopKernel) or len(L.outputs) != 1:
            continue
        li = prog.kernels.index(L)
        T = L.outputs[0]
        if T.kind != "temp" or T.nbytes <= l2:
            continue
        nest = _nest(L)
        if nest is None:
            continue
        loops, store = nest
        if store.buf is not T:
            continue
        i0 = loops[0].var
        co = store.off.coeffs()
        c0 = co.get(i0, 0)
        rest = ix.add(store.off, ix.scale(ix.var(i0), -c0))
        lo, hi = ix.bounds(rest)
        if c0 <= 0 or lo < 0 or hi >= c0 or i0 in ix.variables(rest):
            continue
        kis = [j for j, k in enumerate(prog.kernels) if j != li and _uses(k, T)]
        if not kis or min(kis) < li:
            continue
        # consumers: the batch count N is the one every consumer has
        nbs = {_nbatch(prog.kernels[j].batch) for j in kis
               if isinstance(prog.kernels[j], MatmulKernel)}
        if len(nbs) != 1:
            continue
        nb = nbs.pop()
        if nb < 2 or T.numel % nb or i0.extent % nb:
            continue
        S, q = T.numel // nb, i0.extent // nb
        if c0 * q != S or S * 4 > l2:
            continue
        sides = [_consumer_side(prog.kernels[j], T, S, nb) for j in kis]
        if any(s is None for s in sides):
            continue
        reads = {id(b) for e in walk_expr(store.value) for b in expr_buffers(e)}
        between = prog.kernels[li + 1:max(kis)]
        if any(id(b) in reads for k in between for b in k.outputs):
            continue
        for j, side in zip(kis, sides):
            k = prog.kernels[j]
            team = max(1, int(k.par_batch))
            sb = Buffer(f"{T.name}_{k.name}", "temp", T.dtype, S * team)
            prog.buffers.append(sb)
            iq = ix.Var(f"{i0.name}p", q)
            flat = _flat(k.batch)
            body, off = _rebuild(loops, store, {i0: ix.add(ix.scale(flat, q), ix.var(iq))},
                                 iq, sb, ix.scale(flat, S))
            if any(v in ix.variables(off) for v in k.batch):
                raise AssertionError(f"internal: {NAME}: slice offset {off} of {T.name} "
                                     "depends on the batch")
            op = getattr(k, side)
            setattr(k, side, MatOperand(sb, ix.ZERO, op.rs, op.cs))
            k.prologue = body
            k.slice_floats = S
            k.work += L.work
        prog.kernels.remove(L)
        done.append(T.name)
    return done


__all__ = ["NAME", "operand_prologue"]

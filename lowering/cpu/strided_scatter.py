"""Scatter-add at constant, affine indices (col2im) as a strided loop nest, not an index load.

    rlx.scatter_add(IDX, upd (.., L, ..), axis, dim)   IDX: L constant int32 entries
          │ affine_factors(IDX): a shape (e_0, ..., e_k) with prod = L and coefficients c_d
          │ such that IDX[flat(i_0..i_k)] = c0 + sum_d c_d * i_d, all in [0, dim)
          ▼
    for lead..: for i_0..i_k: for trail..:           (the leading dims: parallel when big)
        out[lead, c0 + sum c_d i_d, trail] += upd[lead, flat(i_0..i_k), trail]

Why: conv_transpose2d (and so conv2d's input gradient, dialect/conv_decompose.py)
ends in col2im: entry (co, i, j, p, q) of the GEMM's columns adds into canvas pixel
(p*sh + i*dh, q*sw + j*dw).  Through an index buffer that is a serial loop of scalar
loads, index loads and read-modify-writes (LeNet's conv2 backward: 960 K of them, 8%
of W9's train step at one thread); as strides the innermost loop (q) is a contiguous
run LLVM vectorizes, and the rows of different leading indices (images, channels)
write disjoint canvases, so the leading loop may split over threads.  The indices
are in range by construction, checked here once: no per-call check kernel.
"""
from __future__ import annotations

import numpy as np

from rlxc.dialect.types import dense_value, is_splat, shape_of
from rlxc.lowering.cpu import indexing as ix


def affine_factors(arr, bound: int):
    """(c0, dims, coefs) with arr (1-D ints) == c0 + sum_d coefs[d] * i_d over the
    row-major multi-index of shape dims (coefs >= 0, every entry in [0, bound)), or None.
    Dims are found innermost first: the longest run of one step that divides what is
    left, then verified as a whole."""
    arr = np.asarray(arr, np.int64).reshape(-1)
    n = arr.size
    if n == 0 or arr.min() < 0 or arr.max() >= bound:
        return None
    c0 = int(arr[0])
    dims, coefs, stride = [], [], 1
    while stride < n:
        c = int(arr[stride] - arr[0])
        e = 2
        while stride * e < n and arr[stride * e] == arr[0] + e * c:
            e += 1
        while (n // stride) % e:
            e -= 1
        if e < 2 or c < 0:
            return None
        dims.append(e)
        coefs.append(c)
        stride *= e
    if stride != n:
        return None
    dims.reverse()
    coefs.reverse()
    want = np.full(dims, c0, np.int64) if dims else np.array(c0)
    for d, k in enumerate(coefs):
        want = want + k * np.arange(dims[d]).reshape((-1,) + (1,) * (len(dims) - d - 1))
    if not np.array_equal(want.reshape(-1), arr):
        return None
    return c0, dims, coefs


def strided_scatter(sched, v, op, what) -> bool:
    """Append the accumulate kernel of scatter_add `op` (result `v`, already zeroed) as a
    strided nest when its indices are an affine constant (see the header); False (nothing
    appended) otherwise."""
    from rlxc.lowering.cpu.tuning import PAR_MIN_WORK

    ind, upd = op.operands
    p = op.params()
    axis, dim = p["axis"], p["dim"]
    si = shape_of(ind.type)
    d = getattr(ind.owner, "name", None)
    if len(si) != 1 or d != "rlx.constant" or is_splat(ind.owner.value):
        return False
    f = affine_factors(dense_value(ind.owner.value), dim)
    if f is None:
        return False
    c0, dims, coefs = f
    us, out_shape = list(shape_of(upd.type)), shape_of(v.type)
    k = len(dims)
    shape = us[:axis] + list(dims) + us[axis + 1:]

    def value(g, idx):
        flat = ix.linearize(idx[axis:axis + k], dims)
        return g.value(upd, tuple(idx[:axis]) + (flat,) + tuple(idx[axis + k:]))

    def off_fn(idx):
        pos = ix.add(ix.const(c0), *(ix.scale(i, c) for i, c in zip(idx[axis:axis + k], coefs)))
        return ix.linearize(tuple(idx[:axis]) + (pos,) + tuple(idx[axis + k:]), out_shape)
    lead = int(np.prod(us[:axis])) if axis else 1
    sched.map_kernel(f"{what} accumulate (strided)", tuple(shape), sched.bufs[v], value, off_fn,
                     combine="add", parallel_ok=lead > 1, tag="scatter")
    _keep_parallel_if_disjoint(sched.kernels[-1])
    return True


def _keep_parallel_if_disjoint(k) -> None:
    """A parallel outermost loop (over the leading dims, maybe collapsed with more) stays
    parallel only when its iterations write disjoint ranges of out: store offset
    a*v + r with r in [0, a) for every other index."""
    from rlxc.lowering.cpu.loops import For, Store, walk

    top = k.body[0] if k.body and isinstance(k.body[0], For) else None
    if top is None or not top.parallel:
        return
    st = [s for s in walk(k.body) if isinstance(s, Store)]
    a = st[0].off.coeffs().get(top.var, 0) if len(st) == 1 else 0
    ok = a > 0
    if ok:
        lo, hi = ix.bounds(ix.add(st[0].off, ix.scale(ix.var(top.var), -a)))
        ok = lo >= 0 and hi < a and top.var not in ix.variables(
            ix.add(st[0].off, ix.scale(ix.var(top.var), -a)))
    if not ok:
        top.parallel = False


__all__ = ["affine_factors", "strided_scatter"]

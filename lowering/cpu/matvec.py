"""Degenerate matmuls as fused loops: outer products and matrix-vector products.

    rlx.matmul(A: (..., M, K), B: (..., K, N))
          │ rewrite_small_matmuls (CPU lowering, before fusion.Plan)
          ▼
    K == 1             broadcast_to(A) * broadcast_to(B)             (an elementwise map)
    N == 1 or M == 1   sum(broadcast_to(A') * broadcast_to(B'), k)   (a reduction)
    f64, i32, i64      sum(broadcast_to(A') * broadcast_to(B'), k)   (any shape: the packed
                       sgemm is float32 only; one fused reduction loop nest, see below)

Why: sgemm packs both operands and computes MR x NR register tiles (6 x 64
on AVX-512).  With K == 1 (the per-example weight gradient x^T @ delta that
vmap(grad) produces, one per example) there is nothing to accumulate: the
product is pure output traffic, and B separate sgemm calls each pack and
pad.  With N == 1 or M == 1 (matrix-vector) a tile computes 64 (or 6)
columns to keep one, and packing reads the matrix once more than the product
does.  As loops, fusion inlines the operands' producers and the consumers'
elementwise ops, the map or reduction is vectorized along the contiguous
axis, and a large outer product is split over threads like any map.

Matrix-vector layout.  The reduction is built so that its innermost loop
runs along the matrix's contiguous axis: when the matrix is stored
row-major along K (A @ x with A not transposed, x @ B with B transposed),
the product is laid out (..., M, K) and reduced over the last axis (a dot
product per row, vector partial sums); otherwise (A.T @ x, x @ B) it is laid
out (..., K, M) and reduced over axis -2, which reduce.py runs as
`for k: out[:] += a[k, :] * x[k]` with the output row kept in cache.  Each
form ends in a reshape to the matmul's shape.  The module is cloned only
when something is rewritten; the caller's module is never mutated.
"""
from __future__ import annotations

from xdsl.dialects import func

from rlxc.dialect.ops import OPS, make_op
from rlxc.dialect.types import dtype_of, shape_of


def _transposed(v) -> bool:
    """True when `v` is a transpose that swaps its last two dims (K runs along rows)."""
    op = v.owner
    if getattr(op, "name", None) != "rlx.transpose":
        return False
    perm = tuple(op.params()["perm"])
    r = len(perm)
    return r >= 2 and perm[-2:] == (r - 1, r - 2)


LOOP_DTYPES = ("f64", "i32", "i64")   # no packed gemm: every matmul of these becomes loops


def _qualifies(op) -> bool:
    sa, sb = shape_of(op.operands[0].type), shape_of(op.operands[1].type)
    M, K, N = sa[-2], sa[-1], sb[-1]
    if 0 in (M, K, N):
        return False
    return K == 1 or M == 1 or N == 1 or dtype_of(op.results[0].type) in LOOP_DTYPES


class _Emit:
    def __init__(self, block, anchor):
        self.block, self.anchor = block, anchor

    def __call__(self, name, operands, **params):
        op = make_op(OPS[f"rlx.{name}"], list(operands), **params)
        self.block.insert_op_before(op, self.anchor)
        return op.results[0]

    def bcast(self, x, shape):
        shape = tuple(shape)
        return x if shape_of(x.type) == shape else self("broadcast_to", [x], shape=shape)

    def swap(self, x):
        r = len(shape_of(x.type))
        return self("transpose", [x], perm=tuple(range(r - 2)) + (r - 1, r - 2))

    def reshape(self, x, shape):
        shape = tuple(shape)
        return x if shape_of(x.type) == shape else self("reshape", [x], shape=shape)


def _rewrite(e: _Emit, op):
    a, b = op.operands
    out = shape_of(op.results[0].type)
    batch, (M, N) = out[:-2], out[-2:]
    K = shape_of(a.type)[-1]
    r = len(out)
    if K == 1:  # outer product: C[.., i, j] = A[.., i, 0] * B[.., 0, j]
        return e("mul", [e.bcast(a, out), e.bcast(b, out)])
    if min(M, N) > 1:  # a general matmul without a packed gemm (f64, integers)
        return _rewrite_general(e, a, b, batch, M, K, N)
    if N == 1:  # C[.., i, 0] = sum_k A[.., i, k] * B[.., k, 0]
        if _transposed(a):  # A = X.T: X[k, i] is contiguous in i
            pa = e.bcast(e.swap(a), batch + (K, M))
            pb = e.bcast(b, batch + (K, M))
            s = e("sum", [e("mul", [pa, pb])], axes=(r - 2,), keepdims=True)
        else:
            pa = e.bcast(a, batch + (M, K))
            pb = e.bcast(e.swap(b), batch + (M, K))
            s = e("sum", [e("mul", [pa, pb])], axes=(r - 1,), keepdims=True)
        return e.reshape(s, out)
    # M == 1: C[.., 0, j] = sum_k A[.., 0, k] * B[.., k, j]
    if _transposed(b):  # B = X.T: X[j, k] is contiguous in k
        pa = e.bcast(a, batch + (N, K))
        pb = e.bcast(e.swap(b), batch + (N, K))
        s = e("sum", [e("mul", [pa, pb])], axes=(r - 1,), keepdims=True)
    else:
        pa = e.bcast(e.swap(a), batch + (K, N))
        pb = e.bcast(b, batch + (K, N))
        s = e("sum", [e("mul", [pa, pb])], axes=(r - 2,), keepdims=True)
    return e.reshape(s, out)


def _rewrite_general(e: _Emit, a, b, batch, M, K, N):
    """C = sum_k A[.., i, k] * B[.., k, j] as one reduction over a broadcast product that
    fusion never materializes: laid out (.., M, K, N) and reduced over K (axis -2), i.e.
    `for i: for k: C[i, :] += A[i, k] * B[k, :]` with the row of C in cache and the inner
    loop along the contiguous rows of B; when B = X.T (X[j, k] contiguous in k) laid out
    (.., M, N, K) and reduced over the last axis (a dot product per element)."""
    sa, r = shape_of(a.type), len(batch) + 2
    if _transposed(b):
        x = e.swap(b)   # (.., N, K)
        pa = e.bcast(e.reshape(a, sa[:-2] + (M, 1, K)), batch + (M, N, K))
        pb = e.bcast(e.reshape(x, shape_of(x.type)[:-2] + (1, N, K)), batch + (M, N, K))
        return e("sum", [e("mul", [pa, pb])], axes=(r,), keepdims=False)
    sb = shape_of(b.type)
    pa = e.bcast(e.reshape(a, sa[:-2] + (M, K, 1)), batch + (M, K, N))
    pb = e.bcast(e.reshape(b, sb[:-2] + (1, K, N)), batch + (M, K, N))
    return e("sum", [e("mul", [pa, pb])], axes=(r - 1,), keepdims=False)


def rewrite_small_matmuls(module):
    """`module`, or a rewritten clone of it, with degenerate matmuls as maps/reductions."""
    from rlxc.dialect.module import get_func

    f = get_func(module)
    if not any(op.name == "rlx.matmul" and _qualifies(op) for op in f.body.block.ops):
        return module
    module = module.clone()
    block = get_func(module).body.block
    for op in list(block.ops):
        if isinstance(op, func.ReturnOp) or op.name != "rlx.matmul" or not _qualifies(op):
            continue
        new = _rewrite(_Emit(block, op), op)
        op.results[0].replace_all_uses_with(new)
        block.erase_op(op)
    return module


__all__ = ["rewrite_small_matmuls"]

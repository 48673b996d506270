"""Degenerate matmuls as fused loops: outer products and matrix-vector products.

    rlx.matmul(A: (..., M, K), B: (..., K, N))
          │ rewrite_small_matmuls (CPU lowering, before fusion.Plan)
          │   first merge_sibling_matvecs: A @ b1, ..., A @ bn with the same 2-D
          │   matrix and independent vectors -> one sum over (M, n, K) (or (K, n, M)
          │   for A = X.T), sliced per vector: A is read once (an HVP's W@x and W@v,
          │   and its two W.T@...: 2 passes over W instead of 4)
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


# --------------------------------------------------------------------------
# sibling matrix-vector products: one pass over the matrix for several vectors

def _sibling_key(op):
    """(matrix, layout) of a 2-D matrix @ vector (N == 1) whose matrix is worth sharing, or
    None.  The layout is "T" when the matrix is a transpose (the key is its source)."""
    if op.name != "rlx.matmul":
        return None
    a, b = op.operands
    out = shape_of(op.results[0].type)
    if len(out) != 2 or len(shape_of(b.type)) != 2:
        return None
    M, N = out
    K = shape_of(a.type)[-1]
    if N != 1 or M < 2 or K < 2:
        return None
    return (a.owner.operands[0], "T") if _transposed(a) else (a, "N")


def _descendants(op, stop) -> set:
    """Ops before `stop` in op's block that use op's result, transitively."""
    seen, todo = set(), [op]
    while todo:
        for res in todo.pop().results:
            for use in list(res.uses):
                user = use.operation
                if user not in seen and user.parent is op.parent and user.is_before_in_block(stop):
                    seen.add(user)
                    todo.append(user)
    return seen


def _depends(op, p) -> bool:
    """Does `op` (later in the block) use `p`'s result, directly or through other ops?"""
    producers = {o.owner for o in op.operands}
    return p in producers or bool(producers & _descendants(p, op))


def _merge_group(block, group) -> None:
    """Replace the matvecs of `group` (same matrix, mutually independent vectors) by one
    reduction over [M, n, K] (or [K, n, M] for a transposed matrix): each row of the
    matrix is read once from memory and reused from L1 for the n vectors.  The merged op
    sits where the last one was; ops that consumed the earlier results in between move
    after it."""
    last = group[-1]
    cone = set()
    for op in group[:-1]:
        cone |= _descendants(op, last)
    anchor = last.next_op
    e = _Emit(block, last)
    a = group[0].operands[0]
    M, K = shape_of(a.type)
    n = len(group)
    if _transposed(a):
        x = a.owner.operands[0]                                         # X: (K, M), A = X.T
        cols = e("concat", [op.operands[1] for op in group], axis=1)    # (K, n)
        pa = e.bcast(e.reshape(x, (K, 1, M)), (K, n, M))
        pb = e.bcast(e.reshape(cols, (K, n, 1)), (K, n, M))
        s = e("sum", [e("mul", [pa, pb])], axes=(0,), keepdims=False)  # (n, M)
        outs = [e.reshape(e("slice", [s], starts=(i, 0), limits=(i + 1, M), strides=(1, 1)),
                          (M, 1)) for i in range(n)]
    else:
        rows = e("concat", [e.reshape(op.operands[1], (1, K)) for op in group], axis=0)
        pa = e.bcast(e.reshape(a, (M, 1, K)), (M, n, K))
        pb = e.bcast(e.reshape(rows, (1, n, K)), (M, n, K))
        s = e("sum", [e("mul", [pa, pb])], axes=(2,), keepdims=False)  # (M, n)
        outs = [e("slice", [s], starts=(0, i), limits=(M, i + 1), strides=(1, 1))
                for i in range(n)]
    for op, new in zip(group, outs):
        op.results[0].replace_all_uses_with(new)
        block.erase_op(op)
    for op in [o for o in list(block.ops) if o in cone]:   # in block order
        block.detach_op(op)
        if anchor is None:
            block.add_op(op)
        else:
            block.insert_op_before(op, anchor)


def merge_sibling_matvecs(block) -> int:
    """Merge matrix-vector products of one block that share their matrix and whose
    vectors do not depend on each other (an HVP's W@x and W@v, and its two W.T@...).
    Returns how many matmuls were folded into another."""
    groups: dict = {}
    for op in block.ops:
        k = _sibling_key(op)
        if k is not None:
            groups.setdefault(k, []).append(op)
    merged = 0
    for ops in groups.values():
        while len(ops) >= 2:
            pick, rest = [ops[0]], []
            for op in ops[1:]:
                if any(_depends(op, p) for p in pick):
                    rest.append(op)
                else:
                    pick.append(op)
            if len(pick) >= 2:
                _merge_group(block, pick)
                merged += len(pick) - 1
            ops = rest
    return merged


def rewrite_small_matmuls(module):
    """`module`, or a rewritten clone of it, with degenerate matmuls as maps/reductions
    (sibling matrix-vector products first merged into one pass over their matrix)."""
    from rlxc.dialect.module import get_func

    f = get_func(module)
    if not any(op.name == "rlx.matmul" and _qualifies(op) for op in f.body.block.ops):
        return module
    module = module.clone()
    block = get_func(module).body.block
    merge_sibling_matvecs(block)
    for op in list(block.ops):
        if isinstance(op, func.ReturnOp) or op.name != "rlx.matmul" or not _qualifies(op):
            continue
        new = _rewrite(_Emit(block, op), op)
        op.results[0].replace_all_uses_with(new)
        block.erase_op(op)
    return module


__all__ = ["rewrite_small_matmuls", "merge_sibling_matvecs"]

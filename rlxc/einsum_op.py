"""`rlxc.einsum(spec, *tensors)`: decomposed at trace time into existing ops.

    "bij,bjk->bik"  ──►  transpose/reshape each operand to (batch, free, contracted)
                         ──► one rlx.matmul ──► reshape/transpose to the output order

Algorithm, per operand first:
1. diagonals: a letter repeated r times in one operand ("ii", "bii") moves
   those axes to the end, merges them into one axis of n**r elements and takes
   a slice with stride 1 + n + ... + n**(r-1) (the diagonal), then moves it back;
2. letters that appear in no other operand and not in the output are summed.
Then operands are contracted left to right, two at a time: a letter shared by
both that is still needed (by the output or a later operand) is a batch dim,
a shared letter needed nowhere else is contracted, the others are free; the
pair becomes `matmul((batch, free_a, K), (batch, K, free_b))`.  Finally the
result is permuted to the output order ("ii->" is a trace: diagonal then sum).
Since everything is existing ops, grad, jvp, vmap and every backend come free.
A dynamic (symbolic) free letter becomes a broadcast batch axis of the matmul; a
symbolic contracted letter together with others falls back to multiply-and-sum.
Implicit output (no "->"): the letters seen once, sorted (NumPy's rule).
"..." is not supported: name the dims.
"""
from __future__ import annotations

from rlxc.dialect.shapes import ShapeError, numel
from rlxc.runtime.dims import describe


def _parse(spec: str, n: int):
    if not isinstance(spec, str):
        raise TypeError(f"einsum: spec must be a string, got {type(spec).__name__}")
    s = spec.replace(" ", "")
    if "." in s:
        raise ValueError(f"einsum {spec!r}: '...' is not supported; name every dim")
    lhs, arrow, out = s.partition("->")
    ins = lhs.split(",")
    if len(ins) != n:
        raise ValueError(f"einsum {spec!r}: {len(ins)} operand specs for {n} tensors")
    for t in ins + [out]:
        for c in t:
            if not c.isalpha():
                raise ValueError(f"einsum {spec!r}: {c!r} is not a letter")
    if not arrow:
        counts = {}
        for t in ins:
            for c in t:
                counts[c] = counts.get(c, 0) + 1
        out = "".join(sorted(c for c, k in counts.items() if k == 1))
    if len(set(out)) != len(out):
        raise ValueError(f"einsum {spec!r}: output {out!r} repeats a letter")
    missing = set(out) - set("".join(ins))
    if missing:
        raise ValueError(f"einsum {spec!r}: output letters {sorted(missing)} are in no operand")
    return ins, out


def _permute(x, letters: str, order: str):
    perm = tuple(letters.index(c) for c in order)
    return x if perm == tuple(range(len(perm))) else x.transpose(perm)


def _diagonal(x, letters: str):
    """Take the diagonal of every repeated letter; returns (tensor, letters without repeats)."""
    while True:
        rep = next((c for c in letters if letters.count(c) > 1), None)
        if rep is None:
            return x, letters
        pos = [i for i, c in enumerate(letters) if c == rep]
        rest = [i for i in range(len(letters)) if i not in pos]
        x = x.transpose(tuple(rest + pos))
        n, r = x.shape[-1], len(pos)
        if isinstance(n, str):
            raise ShapeError(f"einsum: the diagonal of letter {rep!r} over {describe(n)} is "
                             "not supported (it merges a dynamic dimension with itself)")
        x = x.reshape(x.shape[:len(rest)] + (n ** r,))
        stride = sum(n ** j for j in range(r))
        if n:
            x = x.slice((0,) * len(x.shape), x.shape, (1,) * len(rest) + (stride,))
        else:
            x = x.reshape(x.shape[:-1] + (0,))
        letters = "".join(letters[i] for i in rest) + rep


def _group(dims):
    """The dims of one matmul axis as one dim: their product when all are static, the
    symbol when it is alone; None when a symbol would merge with another dim."""
    if len(dims) == 1:
        return dims[0]
    return None if any(isinstance(d, str) for d in dims) else numel(dims)


def _contract(a, la: str, b, lb: str, keep: set):
    """a (letters la) and b (lb) -> their product with letters (batch, free_a, free_b).

    A dynamic (symbolic) free letter cannot merge into the matmul's M or N axis, so it
    becomes a batch axis of its own operand (size 1 in the other; matmul broadcasts)."""
    shared = [c for c in la if c in lb]
    batch = [c for c in shared if c in keep]
    red = [c for c in shared if c not in keep]
    dims = {c: a.shape[la.index(c)] for c in la}
    dims.update({c: b.shape[lb.index(c)] for c in lb})
    sym = {c for c, d in dims.items() if isinstance(d, str)}
    sa = [c for c in la if c not in lb and c in sym]
    sb = [c for c in lb if c not in la and c in sym]
    fa = [c for c in la if c not in lb and c not in sym]
    fb = [c for c in lb if c not in la and c not in sym]
    k = _group([dims[c] for c in red]) if red else 1
    if k is None:      # a symbolic contracted letter among others: multiply, then sum
        return _broadcast_contract(a, la, b, lb, batch, red, dims)
    a = _permute(a, la, "".join(batch + sa + fa + red))
    b = _permute(b, lb, "".join(batch + sb + red + fb))
    bs = tuple(dims[c] for c in batch)
    m, n = numel([dims[c] for c in fa]), numel([dims[c] for c in fb])
    y = a.reshape(bs + tuple(dims[c] for c in sa) + (1,) * len(sb) + (m, k)) @ \
        b.reshape(bs + (1,) * len(sa) + tuple(dims[c] for c in sb) + (k, n))
    order = batch + sa + sb + fa + fb
    return y.reshape(tuple(dims[c] for c in order)), "".join(order)


def _broadcast_contract(a, la, b, lb, batch, red, dims):
    """a * b broadcast over the union of letters, summed over `red` (the general path)."""
    union = batch + [c for c in la if c not in batch] + \
        [c for c in lb if c not in la and c not in batch]
    full = tuple(dims[c] for c in union)

    def aligned(t, lt):
        order = "".join(c for c in union if c in lt)
        t = _permute(t, lt, order)
        return t.reshape(tuple(dims[c] if c in lt else 1 for c in union)).broadcast_to(full)
    y = (aligned(a, la) * aligned(b, lb)).sum(tuple(union.index(c) for c in red))
    return y, "".join(c for c in union if c not in red)


def einsum(spec: str, *tensors):
    """Einstein summation over traced Tensors, NumPy's spec syntax (without '...')."""
    from rlxc.tensor import Tensor

    if not tensors:
        raise ValueError("einsum: needs at least one tensor")
    for i, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            raise TypeError(f"einsum: operand {i} must be a traced Tensor, got "
                            f"{type(t).__name__}")
    ins, out = _parse(spec, len(tensors))
    sizes: dict = {}
    for i, (t, l) in enumerate(zip(tensors, ins)):
        if len(l) != t.ndim:
            raise ShapeError(f"einsum {spec!r}: operand {i} has {t.ndim} dims, spec {l!r} "
                             f"names {len(l)}")
        for c, d in zip(l, t.shape):
            if sizes.setdefault(c, d) != d:
                raise ShapeError(f"einsum {spec!r}: letter {c!r} is {sizes[c]} in one place "
                                 f"and {d} in another")
    ops = []
    for j, (t, l) in enumerate(zip(tensors, ins)):
        t, l = _diagonal(t, l)
        others = set(out).union(*[set(x) for i, x in enumerate(ins) if i != j])
        red = tuple(i for i, c in enumerate(l) if c not in others)
        if red:
            t = t.sum(red)
            l = "".join(c for i, c in enumerate(l) if i not in red)
        ops.append((t, l))
    x, lx = ops[0]
    for j in range(1, len(ops)):
        y, ly = ops[j]
        keep = set(out).union(*[set(l) for _, l in ops[j + 1:]])
        x, lx = _contract(x, lx, y, ly, keep)
        red = tuple(i for i, c in enumerate(lx) if c not in keep)   # (only when a letter is
        if red:                                                     #  in neither: never here)
            x = x.sum(red)
            lx = "".join(c for i, c in enumerate(lx) if i not in red)
    return _permute(x, lx, out)


__all__ = ["einsum"]

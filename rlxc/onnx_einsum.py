"""einsum as transpose / reshape / sum / matmul (for ONNX Einsum; no einsum op needed).

    "bij,bjk->bik": each operand sums away the letters nobody else needs, then a pair
    becomes  A[batch, free_a, contract] @ B[batch, contract, free_b]  (one rlx.matmul),
    reshaped to batch + free_a + free_b and transposed to the output's order.
    More than two operands contract left to right, keeping the letters still needed.

Supported: explicit or implicit output, `...` (same rank in every operand using it).
Not supported: a letter repeated within one operand (diagonals), size-1 broadcasting.
"""
from __future__ import annotations

import math

from .onnx_import import OnnxImportError

_SPARE = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _parse(eq: str, ranks: list[int]) -> tuple[list[str], str]:
    eq = eq.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise OnnxImportError(f"Einsum {eq!r}: {len(terms)} terms for {len(ranks)} inputs")
    ell = ""
    for i, (t, r) in enumerate(zip(terms, ranks)):
        if "..." in t:
            n = r - (len(t) - 3)
            e = _SPARE[:n]
            if ell and len(e) != len(ell):
                raise OnnxImportError(f"Einsum {eq!r}: '...' stands for different ranks")
            ell = e
            terms[i] = t.replace("...", e)
    if arrow:
        out = out.replace("...", ell)
    else:
        letters = "".join(terms)
        out = ell + "".join(sorted(c for c in set(letters) if letters.count(c) == 1
                                   and c not in ell))
    for t, r in zip(terms, ranks):
        if len(t) != r:
            raise OnnxImportError(f"Einsum {eq!r}: term {t!r} for a rank-{r} input")
        if len(set(t)) != len(t):
            raise OnnxImportError(f"Einsum {eq!r}: a letter repeated in one term (diagonal) "
                                  "is not supported")
    return terms, out


def _sum_unused(x, term: str, keep: set):
    ax = tuple(i for i, c in enumerate(term) if c not in keep)
    if not ax:
        return x, term
    return x.sum(ax), "".join(c for c in term if c in keep)


def _to(x, term: str, out: str):
    if term == out:
        return x
    return x.transpose(tuple(term.index(c) for c in out))


def _pair(a, ta: str, b, tb: str, keep: set):
    """Contract a (letters ta) with b (tb); result letters: batch + free_a + free_b."""
    size = {c: d for t, x in ((ta, a), (tb, b)) for c, d in zip(t, x.shape)}
    for c in set(ta) & set(tb):
        if dict(zip(ta, a.shape))[c] != dict(zip(tb, b.shape))[c]:
            raise OnnxImportError(f"Einsum: letter {c!r} has sizes "
                                  f"{dict(zip(ta, a.shape))[c]} and {dict(zip(tb, b.shape))[c]}")
    batch = [c for c in ta if c in tb and c in keep]
    con = [c for c in ta if c in tb and c not in keep]
    fa = [c for c in ta if c not in tb]
    fb = [c for c in tb if c not in ta]
    n = lambda cs: math.prod(size[c] for c in cs)  # noqa: E731
    A = _to(a, ta, "".join(batch + fa + con)).reshape(n(batch), n(fa), n(con))
    B = _to(b, tb, "".join(batch + con + fb)).reshape(n(batch), n(con), n(fb))
    r = (A @ B).reshape(tuple(size[c] for c in batch + fa + fb))
    return r, "".join(batch + fa + fb)


def einsum(eq: str, xs: list):
    terms, out = _parse(eq, [x.ndim for x in xs])
    if any(isinstance(d, str) for x in xs for d in x.shape):
        # a dynamic (dim_param) letter: the pairwise matmul below merges letters by reshape,
        # which a symbol cannot take part in; rlxc.einsum contracts without merging
        from .einsum_op import einsum as traced_einsum

        return traced_einsum(",".join(terms) + "->" + out, *xs)
    xs = list(xs)
    for i in range(len(xs)):   # letters only this operand has and the output lacks: sum
        others = set(out).union(*(set(t) for j, t in enumerate(terms) if j != i))
        xs[i], terms[i] = _sum_unused(xs[i], terms[i], others)
    x, t = xs[0], terms[0]
    for i in range(1, len(xs)):
        keep = set(out).union(*(set(tt) for tt in terms[i + 1:]))
        x, t = _pair(x, t, xs[i], terms[i], keep)
    x, t = _sum_unused(x, t, set(out))
    return _to(x, t, out)

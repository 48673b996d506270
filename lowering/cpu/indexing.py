"""Index expressions of the loop IR: affine forms over loop variables and atoms.

    view ops (broadcast, transpose, reshape, slice, pad, gather) on a multi-index
          │ fusion.gen composes index maps; these constructors simplify as they go
          ▼
    Affine = c0 + sum(coeff_k * atom_k)
             atom := Var(i, extent) | FloorDiv(Affine, c) | Mod(Affine, c)
                   | Clamp(Affine, lo, hi) | Min(Affine, Affine) | LoadIdx(buf, Affine, bound)

Every index value is an integer; every variable ranges over [0, extent).  The
constructors keep expressions canonical (terms sorted, zero coefficients
dropped) and simplify with interval bounds, the rules an index simplifier
needs to undo reshape arithmetic:

  floordiv(c*q + r, c) = q + floordiv(r, c)   and = q      when 0 <= r < c
  mod(c*q + r, c)      = mod(r, c)            and = r      when 0 <= r < c
  floordiv(floordiv(x, a), b) = floordiv(x, a*b)                 (x >= 0)
  k*c*floordiv(x, c) + k*mod(x, c) = k*x                         ("pair rule")

so that, e.g., reading a contiguous (4, 3) buffer through reshape(12) gives
offset `3*(j // 3) + (j % 3)` = `j`, and two adjacent loops can be collapsed
into one whenever substituting i = j // n, k = j % n simplifies away.
FloorDiv and Mod are only built on non-negative arguments (indices are never
negative outside a Clamp), so code generation may use unsigned division.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass


class Atom:
    """A non-affine leaf of an index expression."""

    __slots__ = ()


@dataclass(frozen=True)
class Var(Atom):
    name: str
    extent: int

    def __str__(self):
        return self.name


@dataclass(frozen=True)
class FloorDiv(Atom):
    x: "Affine"
    c: int

    def __str__(self):
        return f"({self.x} // {self.c})"


@dataclass(frozen=True)
class Mod(Atom):
    x: "Affine"
    c: int

    def __str__(self):
        return f"({self.x} % {self.c})"


@dataclass(frozen=True)
class Clamp(Atom):
    x: "Affine"
    lo: int
    hi: int

    def __str__(self):
        return f"clamp({self.x}, {self.lo}, {self.hi})"


@dataclass(frozen=True)
class Min(Atom):
    a: "Affine"
    b: "Affine"

    def __str__(self):
        return f"min({self.a}, {self.b})"


@dataclass(frozen=True)
class LoadIdx(Atom):
    """An integer loaded from an index buffer, known (checked) to lie in [0, bound)."""

    buf: object  # loops.Buffer (hashed by identity)
    off: "Affine"
    bound: int

    def __str__(self):
        return f"{self.buf.name}[{self.off}]"


@functools.lru_cache(maxsize=None)
def _order(atom: Atom):
    return (type(atom).__name__ != "Var", str(atom))


@dataclass(frozen=True)
class Affine:
    terms: tuple  # ((atom, coeff), ...), sorted, coeff != 0
    const: int = 0

    def __str__(self):
        parts = []
        for a, k in self.terms:
            parts.append(str(a) if k == 1 else f"{a}*{k}")
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts).replace("+ -", "- ")

    def __add__(self, other):
        return add(self, other)

    def __mul__(self, k: int):
        return scale(self, k)

    def coeffs(self) -> dict:
        return dict(self.terms)

    def is_const(self) -> bool:
        return not self.terms

    def atoms(self):
        return [a for a, _ in self.terms]


ZERO = Affine((), 0)


def _int(c):
    """int(c), or c itself when it is a symbolic size (lowering/cpu/symint.py)."""
    return c if hasattr(c, "coef") else int(c)


def const(c: int) -> Affine:
    return Affine((), _int(c))


def var(v: Var) -> Affine:
    return Affine(((v, 1),), 0)


def of(x) -> Affine:
    """Coerce an int, an Atom or an Affine to an Affine."""
    if isinstance(x, Affine):
        return x
    if isinstance(x, int) or hasattr(x, "coef"):
        return const(x)
    if isinstance(x, Atom):
        return Affine(((x, 1),), 0)
    raise TypeError(f"not an index expression: {x!r}")


def _build(terms: dict, c: int) -> Affine:
    terms = {a: k for a, k in terms.items() if k}
    changed = True
    while changed:  # pair rule: k*c*(x // c) + k*(x % c) = k*x
        changed = False
        for a, k in list(terms.items()):
            if isinstance(a, Mod) and a in terms:
                partner = floordiv(a.x, a.c)
                if len(partner.terms) == 1 and partner.const == 0 and partner.terms[0][1] == 1:
                    fd = partner.terms[0][0]
                    if terms.get(fd) == k * a.c:
                        del terms[a], terms[fd]
                        for b, kb in a.x.terms:
                            terms[b] = terms.get(b, 0) + k * kb
                        c += k * a.x.const
                        terms = {x: v for x, v in terms.items() if v}
                        changed = True
                        break
    return Affine(tuple(sorted(terms.items(), key=lambda t: _order(t[0]))), _int(c))


def add(*xs) -> Affine:
    terms: dict = {}
    c = 0
    for x in xs:
        x = of(x)
        for a, k in x.terms:
            terms[a] = terms.get(a, 0) + k
        c += x.const
    return _build(terms, c)


def scale(x, k: int) -> Affine:
    x = of(x)
    if k == 0:
        return ZERO
    return Affine(tuple((a, c * k) for a, c in x.terms), x.const * k)


def bounds(x) -> tuple[int, int]:
    """Inclusive [lo, hi] of an index expression."""
    x = of(x)
    lo = hi = x.const
    for a, k in x.terms:
        alo, ahi = atom_bounds(a)
        if k > 0:
            lo, hi = lo + k * alo, hi + k * ahi
        else:
            lo, hi = lo + k * ahi, hi + k * alo
    return lo, hi


@functools.lru_cache(maxsize=None)
def atom_bounds(a: Atom) -> tuple[int, int]:
    if isinstance(a, Var):
        return 0, max(a.extent - 1, 0)
    if isinstance(a, FloorDiv):
        lo, hi = bounds(a.x)
        return lo // a.c, hi // a.c
    if isinstance(a, Mod):
        return 0, a.c - 1
    if isinstance(a, Clamp):
        return a.lo, a.hi
    if isinstance(a, Min):
        (alo, ahi), (blo, bhi) = bounds(a.a), bounds(a.b)
        return min(alo, blo), min(ahi, bhi)
    if isinstance(a, LoadIdx):
        return 0, max(a.bound - 1, 0)
    raise TypeError(a)


def _split(x: Affine, c: int):
    q, r = {}, {}
    for a, k in x.terms:
        if k % c == 0:
            q[a] = k // c
        else:
            r[a] = k
    return _build(q, x.const // c), _build(r, x.const % c)


def _digit(r: Affine, c: int):
    """(d, s, t) with r == d*s + t, 0 <= t < d, d > 1 a proper divisor of c (the largest
    coefficient of r that works), or None.  Then r // c == s // (c/d) and r % c ==
    d*(s % (c/d)) + t: a pixel row*W + col (col < W) divided by 2W is row // 2."""
    for d in sorted({abs(k) for _, k in r.terms if 1 < abs(k) < c and c % abs(k) == 0},
                    reverse=True):
        s = {a: k // d for a, k in r.terms if k % d == 0}
        t = _build({a: k for a, k in r.terms if k % d}, r.const % d)
        lo, hi = bounds(t)
        if 0 <= lo and hi < d:
            return d, _build(s, r.const // d), t
    return None


def floordiv(x, c: int) -> Affine:
    x = of(x)
    if c == 1:
        return x
    if c <= 0:
        raise ValueError(f"floordiv by {c}")
    q, r = _split(x, c)
    lo, hi = bounds(r)
    if 0 <= lo and hi < c:
        return q
    if lo < 0:
        raise ValueError(f"internal: floordiv of a possibly negative index {x}")
    if len(r.terms) == 1 and r.const == 0 and r.terms[0][1] == 1 and isinstance(r.terms[0][0],
                                                                                   FloorDiv):
        inner = r.terms[0][0]
        return add(q, floordiv(inner.x, inner.c * c))
    dg = _digit(r, c)
    if dg is not None:
        d, s, _ = dg
        return add(q, floordiv(s, c // d))
    return add(q, of(FloorDiv(r, c)))


def mod(x, c: int) -> Affine:
    x = of(x)
    if c == 1:
        return ZERO
    _, r = _split(x, c)
    lo, hi = bounds(r)
    if 0 <= lo and hi < c:
        return r
    if lo < 0:
        raise ValueError(f"internal: mod of a possibly negative index {x}")
    dg = _digit(r, c)
    if dg is not None:
        d, s, t = dg
        return add(scale(mod(s, c // d), d), t)
    return of(Mod(r, c))


def clamp(x, lo: int, hi: int) -> Affine:
    x = of(x)
    xlo, xhi = bounds(x)
    if lo <= xlo and xhi <= hi:
        return x
    if xhi <= lo:
        return const(lo)
    if xlo >= hi:
        return const(hi)
    return of(Clamp(x, lo, hi))


def minimum(a, b) -> Affine:
    a, b = of(a), of(b)
    alo, ahi = bounds(a)
    blo, bhi = bounds(b)
    if ahi <= blo:
        return a
    if bhi <= alo:
        return b
    return of(Min(a, b))


def linearize(idx, shape) -> Affine:
    """Row-major offset of a multi-index in a contiguous tensor of `shape`."""
    terms = []
    stride = 1
    for i, d in zip(reversed(list(idx)), reversed(list(shape))):
        if d != 1:
            terms.append(scale(i, stride))
        stride *= d
    return add(*terms) if terms else ZERO


def delinearize(flat, shape) -> list:
    """The multi-index of row-major offset `flat` in `shape`."""
    out = []
    stride = 1
    strides = []
    for d in reversed(list(shape)):
        strides.append(stride)
        stride *= d
    strides.reverse()
    for d, st in zip(shape, strides):
        out.append(ZERO if d == 1 else mod(floordiv(flat, st), d))
    return out


def subst(x, mapping: dict) -> Affine:
    """Replace variables by index expressions (re-simplifying every atom)."""
    x = of(x)
    parts = [const(x.const)]
    for a, k in x.terms:
        parts.append(scale(subst_atom(a, mapping), k))
    return add(*parts)


def subst_atom(a: Atom, mapping: dict) -> Affine:
    if isinstance(a, Var):
        return of(mapping.get(a, a))
    if isinstance(a, FloorDiv):
        return floordiv(subst(a.x, mapping), a.c)
    if isinstance(a, Mod):
        return mod(subst(a.x, mapping), a.c)
    if isinstance(a, Clamp):
        return clamp(subst(a.x, mapping), a.lo, a.hi)
    if isinstance(a, Min):
        return minimum(subst(a.a, mapping), subst(a.b, mapping))
    if isinstance(a, LoadIdx):
        return of(LoadIdx(a.buf, subst(a.off, mapping), a.bound))
    raise TypeError(a)


def variables(x) -> set:
    """Every Var occurring in x (also inside atoms)."""
    out = set()
    for a, _ in of(x).terms:
        if isinstance(a, Var):
            out.add(a)
        elif isinstance(a, (FloorDiv, Mod, Clamp)):
            out |= variables(a.x)
        elif isinstance(a, Min):
            out |= variables(a.a) | variables(a.b)
        elif isinstance(a, LoadIdx):
            out |= variables(a.off)
    return out


def is_plain(x) -> bool:
    """True when x is c0 + sum(k * Var) (no atoms other than variables)."""
    return all(isinstance(a, Var) for a, _ in of(x).terms)

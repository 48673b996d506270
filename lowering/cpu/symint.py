"""SymInt: an integer that is a linear function of dimension symbols (c0 + sum k_s * s).

    lowering at sample sizes ──(dynsizes.merge: fit each differing int)──► SymInt
    codegen: c64(SymInt) ──► i64 instructions at the top of the current function,
             computed from that function's size arguments (one per symbol)

Arithmetic with ints and with SymInts stays linear (a product of two non-constant
SymInts raises).  Ordering comparisons and int() raise `DynamicSizeError`: code that
decides something from a size cannot serve every size, so the one-library path
refuses that graph (and the caller falls back to one program per size).  `==` is
structural and `bool(x)` means "not identically zero" (x is non-constant, so it is
nonzero for some sizes: code guarded by it is the general code path).
"""
from __future__ import annotations

import llvmlite.ir as ir


class DynamicSizeError(Exception):
    """The lowering needed a size as a number: no single program serves every size."""


def _canon(const: int, coef: dict):
    coef = tuple(sorted((s, k) for s, k in coef.items() if k))
    return SymInt(const, coef) if coef else const


class SymInt:
    __slots__ = ("const", "coef")

    def __init__(self, const: int, coef: tuple):
        self.const, self.coef = int(const), coef

    # ---------------------------------------------------------------- algebra
    @staticmethod
    def parts(x):
        if isinstance(x, SymInt):
            return x.const, dict(x.coef)
        if isinstance(x, bool) or not isinstance(x, int):
            raise DynamicSizeError(f"size arithmetic with {type(x).__name__}")
        return x, {}

    def __add__(self, o):
        c1, k1 = SymInt.parts(self)
        c2, k2 = SymInt.parts(o)
        for s, k in k2.items():
            k1[s] = k1.get(s, 0) + k
        return _canon(c1 + c2, k1)

    __radd__ = __add__

    def __neg__(self):
        return _canon(-self.const, {s: -k for s, k in self.coef})

    def __sub__(self, o):
        return self + (-o if isinstance(o, SymInt) else -SymInt.parts(o)[0])

    def __rsub__(self, o):
        return (-self) + o

    def __mul__(self, o):
        if isinstance(o, SymInt):
            raise DynamicSizeError(f"product of two sizes ({self}) * ({o})")
        c, _ = SymInt.parts(o)
        return _canon(self.const * c, {s: k * c for s, k in self.coef})

    __rmul__ = __mul__

    def _refuse(self, *_):
        raise DynamicSizeError(f"the lowering compared or converted the size {self}")

    __lt__ = __le__ = __gt__ = __ge__ = __int__ = __index__ = __floordiv__ = \
        __rfloordiv__ = __mod__ = __rmod__ = __float__ = _refuse

    def __bool__(self):
        return True

    def __eq__(self, o):
        return isinstance(o, SymInt) and o.const == self.const and o.coef == self.coef

    def __ne__(self, o):
        return not self == o

    def __hash__(self):
        return hash((self.const, self.coef))

    def __str__(self):
        t = [s if k == 1 else f"{k}*{s}" for s, k in self.coef]
        return " + ".join(t + ([str(self.const)] if self.const else []))

    __repr__ = __str__

    def eval(self, env: dict) -> int:
        return self.const + sum(k * env[s] for s, k in self.coef)

    def to_json(self) -> list:
        return [self.const, [[s, k] for s, k in self.coef]]


def evaluate(x, env: dict) -> int:
    return x.eval(env) if isinstance(x, SymInt) else int(x)


def from_json(j):
    return j if isinstance(j, int) else _canon(j[0], {s: k for s, k in j[1]})


def upper64(x):
    """A multiple-of-64 upper bound of x for every size >= 1, still linear."""
    if not isinstance(x, SymInt):
        return (int(x) + 63) // 64 * 64
    return _canon((x.const + 63) // 64 * 64, {s: (k + 63) // 64 * 64 for s, k in x.coef})


def always_le(a, b) -> bool:
    """a <= b for every assignment of sizes >= 1 (linear: at all-ones and per slope)."""
    c, k = SymInt.parts(b - a) if isinstance(b - a, SymInt) else (b - a, {})
    return all(v >= 0 for v in k.values()) and c + sum(k.values()) >= 0


# ---------------------------------------------------------------- codegen context

I64 = ir.IntType(64)


class _Ctx:
    fn = None      # the function being emitted
    dims = None    # {symbol: i64 value in fn}
    side = None    # a detached block collecting the size computations of fn
    at = 0         # where they go in fn's entry block (after the size loads)
    memo: dict = {}


CTX = _Ctx()


def enter(fn, dims: dict | None, at: int = 0) -> None:
    """Sizes for c64(SymInt) now come from `dims` (values of `fn`).  The computations
    collect in a side block and move to the top of fn's entry block on `flush` (when
    fn is complete: a builder's position is an index, so nothing may be inserted above
    it while it is in use)."""
    CTX.fn, CTX.dims, CTX.at, CTX.memo = fn, dims, at, {}
    CTX.side = ir.Block(parent=fn, name="sizes") if fn is not None else None


def save() -> tuple:
    return CTX.fn, CTX.dims, CTX.side, CTX.at, CTX.memo


def restore(t: tuple) -> None:
    """Back to a saved context; the (completed) function left is flushed."""
    if CTX.fn is not t[0]:
        flush()
    CTX.fn, CTX.dims, CTX.side, CTX.at, CTX.memo = t


def flush() -> None:
    """Move the collected size computations to the top of the function's entry block."""
    if CTX.side is None or not CTX.side.instructions:
        return
    entry = CTX.fn.entry_basic_block
    for j, i in enumerate(entry.instructions):   # below the size loads, wherever allocas
        if any(i is v for v in CTX.dims.values()):   # hoisted to the top moved them
            CTX.at = max(CTX.at, j + 1)
    for i in CTX.side.instructions:
        i.parent = entry
    entry.instructions[CTX.at:CTX.at] = CTX.side.instructions
    CTX.at += len(CTX.side.instructions)
    CTX.side.instructions = []


def value(x: "SymInt"):
    """An i64 value of `x` in the current function (it dominates every use)."""
    if CTX.dims is None:
        raise DynamicSizeError(f"size {x} needed outside a function with size arguments")
    r = CTX.memo.get(x)
    if r is not None:
        return r
    b = ir.IRBuilder(CTX.side)
    acc = ir.Constant(I64, x.const)
    for s, k in x.coef:
        t = b.mul(CTX.dims[s], ir.Constant(I64, k), flags=["nsw"])
        acc = b.add(acc, t, flags=["nsw"])
    CTX.memo[x] = acc
    return acc

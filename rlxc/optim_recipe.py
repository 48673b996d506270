"""Per-step optimizer scalars as C: symbolic `t` and `lr` for `Optimizer.scalar_recipe`.

Purpose
-------
`rlxc compile --train` computes each step's float32 scalars in C from the
update number t and the lr.  Instead of a per-optimizer table, an optimizer's
own `scalars(t, lr)` is called once with `Sym` values for t and lr: every
arithmetic operation on them records a C double expression (`pow` for `**`,
`cond ? a : b` for `select`) and, alongside, the same computation in Python
(`ev`), so the recipe can be checked against `scalars` for a few (t, lr).
Python and C evaluate the same IEEE double operations in the same order
(constants as exact hexadecimal literals; `x ** y` is `pow` in both), so the
float32-rounded results agree bit for bit.

Also here: `code_fingerprint`, a process-independent hash of a function's
code, which keys an optimizer class's emitted graph.
"""
from __future__ import annotations

__all__ = ["Sym", "select", "code_fingerprint"]


def _val(x, t, lr):
    return x.ev(t, lr) if isinstance(x, Sym) else x


def _ctext(x) -> str:
    if isinstance(x, Sym):
        return x.c
    if isinstance(x, bool):
        return "1.0" if x else "0.0"
    return float(x).hex()  # a C99 hexadecimal double literal: exact


class Sym:
    """A value of `scalars(t, lr)` that depends on t or lr: a C double expression
    (`c`) and the same computation in Python (`ev(t, lr)`, Python's own number
    semantics, so it reproduces `scalars` exactly)."""

    __slots__ = ("c", "ev")

    def __init__(self, c: str, ev):
        self.c, self.ev = c, ev

    def _bin(self, other, op: str, fn, swap=False):
        if not isinstance(other, (Sym, int, float)):
            return NotImplemented
        a, b = (other, self) if swap else (self, other)
        c = f"pow({_ctext(a)}, {_ctext(b)})" if op == "**" else f"({_ctext(a)} {op} {_ctext(b)})"
        return Sym(c, lambda t, lr: fn(_val(a, t, lr), _val(b, t, lr)))

    def __add__(self, o): return self._bin(o, "+", lambda a, b: a + b)
    def __radd__(self, o): return self._bin(o, "+", lambda a, b: a + b, True)
    def __sub__(self, o): return self._bin(o, "-", lambda a, b: a - b)
    def __rsub__(self, o): return self._bin(o, "-", lambda a, b: a - b, True)
    def __mul__(self, o): return self._bin(o, "*", lambda a, b: a * b)
    def __rmul__(self, o): return self._bin(o, "*", lambda a, b: a * b, True)
    def __truediv__(self, o): return self._bin(o, "/", lambda a, b: a / b)
    def __rtruediv__(self, o): return self._bin(o, "/", lambda a, b: a / b, True)
    def __pow__(self, o): return self._bin(o, "**", lambda a, b: a ** b)
    def __rpow__(self, o): return self._bin(o, "**", lambda a, b: a ** b, True)
    def __lt__(self, o): return self._bin(o, "<", lambda a, b: a < b)
    def __le__(self, o): return self._bin(o, "<=", lambda a, b: a <= b)
    def __gt__(self, o): return self._bin(o, ">", lambda a, b: a > b)
    def __ge__(self, o): return self._bin(o, ">=", lambda a, b: a >= b)

    def __neg__(self):
        return Sym(f"(-{self.c})", lambda t, lr: -self.ev(t, lr))

    def __abs__(self):
        return Sym(f"fabs({self.c})", lambda t, lr: abs(self.ev(t, lr)))

    def _refuse(self, *_):
        raise TypeError("a value that depends on the update number t or on lr was used as a "
                        "plain number (if/min/max/math.*/float()); write it with arithmetic, "
                        "** and optim.select(cond, a, b)")

    __bool__ = __float__ = __int__ = __index__ = __round__ = _refuse


def select(cond, a, b):
    """`a if cond else b`, also for a `cond` that depends on t or lr in `scalars`
    (where it becomes C's `cond ? a : b`).  Both `a` and `b` are computed."""
    if not any(isinstance(x, Sym) for x in (cond, a, b)):
        return a if cond else b
    return Sym(f"({_ctext(cond)} ? {_ctext(a)} : {_ctext(b)})",
                lambda t, lr: _val(a, t, lr) if _val(cond, t, lr) else _val(b, t, lr))


def code_fingerprint(fn) -> str:
    """A process-independent hash of a function's code (nested code objects included)."""
    import hashlib

    h = hashlib.sha256()

    def add(code):
        h.update(code.co_code)
        h.update(repr(code.co_names).encode())
        for c in code.co_consts:
            if hasattr(c, "co_code"):
                add(c)
            else:
                h.update(repr(c).encode())

    code = getattr(fn, "__code__", None)
    if code is not None:
        add(code)
    return h.hexdigest()[:16]

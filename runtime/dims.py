"""Symbolic dimensions at run time (stdlib only: compiled modules use it without the compiler).

A dimension of a declared shape is an int or a symbol name (a str, dialect/symdims.py).
`bind_sizes` reads each symbol's size off one call's arrays, checking that every
use of a symbol agrees and that no symbol is 0; `resolve` turns a symbolic shape
into the call's ints.
"""
from __future__ import annotations

from .errors import ShapeError


def is_sym(d) -> bool:
    return isinstance(d, str)


def is_dynamic(shape) -> bool:
    return any(isinstance(d, str) for d in shape)


def label(d):
    """A dim as users see it: the int, the symbol's name, or for an anonymous symbol (None
    in an input's shape, "?x.0") its name without the "?": "x.0" is axis 0 of input x."""
    return d[1:] or d if is_sym(d) and d.startswith("?") else d


def describe(d) -> str:
    """A dim in an error message: "dimension 'B'", "anonymous dimension 'x.0' (None at
    axis 0 of input 'x')", or the int."""
    if is_sym(d):
        if not d.startswith("?"):
            return f"dimension {d!r}"
        inp, _, axis = d[1:].rpartition(".")
        where = f" (None at axis {axis} of input {inp!r})" if axis.isdigit() and inp else ""
        return f"anonymous dimension {label(d)!r}{where}"
    return str(d)


def bind_sizes(args, shapes, what: str = "run") -> dict:
    """Each symbol's size from one call: `args` (objects with name/kind/shape) and the
    given arrays' `shapes`, in order.  Every use of a symbol must agree, a size must
    be >= 1, and the static dims must match."""
    env: dict = {}
    where: dict = {}
    for a, got in zip(args, shapes):
        want = tuple(a.shape)
        if not is_dynamic(want):
            continue
        if len(got) != len(want) or any(not is_sym(w) and w != g for w, g in zip(want, got)):
            raise ShapeError(f"{what}: {a.kind} {a.name!r} expects shape "
                             f"{pretty(want)}, got {tuple(got)}")
        for i, (w, g) in enumerate(zip(want, got)):
            if not is_sym(w):
                continue
            if g == 0:
                raise ValueError(f"{what}: {describe(w)} is 0 from {a.kind} {a.name!r} "
                                 f"(axis {i}); a dynamic dimension must be at least 1")
            if w in env and env[w] != g:
                raise ShapeError(f"{what}: {describe(w)} is {env[w]} from {where[w]} but {g} "
                                 f"from {a.kind} {a.name!r}")
            env.setdefault(w, int(g))
            where.setdefault(w, f"{a.kind} {a.name!r}")
    return env


def pretty(shape) -> str:
    """A symbolic shape for messages: ('B', 784) -> "(B, 784)"."""
    return "(" + ", ".join(str(label(d)) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def resolve(shape, env: dict) -> tuple:
    """`shape` with every symbol replaced by its size in `env`."""
    return tuple(env[d] if isinstance(d, str) else d for d in shape)

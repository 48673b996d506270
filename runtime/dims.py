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


def describe(d) -> str:
    """A dim in an error message: 'B', or 'an anonymous dimension' for `None` symbols."""
    if is_sym(d):
        return "an anonymous dynamic dimension" if d.startswith("?") else f"dimension {d!r}"
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
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def resolve(shape, env: dict) -> tuple:
    """`shape` with every symbol replaced by its size in `env`."""
    return tuple(env[d] if isinstance(d, str) else d for d in shape)

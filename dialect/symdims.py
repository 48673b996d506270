"""Symbolic dimensions: a dimension is an int or a symbol name (a str). No xDSL.

    s.input("x", ("B", 784))        a named symbol: every use of "B" is one size
    s.input("x", (None, 784))       an anonymous symbol named after its input and axis:
                                    "?x.0", shown as x.0 (runtime/dims.label)
          │
          ▼ shape functions (dialect/shapes.py) compute on dims through this module
    TType(("B", 784), "f32")        prints tensor<?x784xf32>
          │
          ▼ IR (dialect/types.py): tensor<?x784xf32, ["B", ""]>; the function's
            arguments also carry rlx.dims = ["B", ""]; an op parameter that holds a
            dimension (reshape/broadcast_to shape, slice limits, scatter_add dim)
            stores -1 for a symbol and reads it back from the op's types (FILL)
          ▼ running: `bind_sizes` reads each symbol's size off the call's arrays
            and checks that every use agrees; `resolve` turns a symbolic shape into
            ints for one call

Algebra (deliberately small, so every result stays a plain dim): broadcasting
B vs 1 -> B, B vs B -> B, B vs anything else -> ShapeError naming B; the size
of a symbolic shape is `coef * product(symbols)` (a monomial), so a reshape may
move a symbol, merge it with static dims that divide out, or resolve -1 to a
symbol ((B, 28, 28) -> (B, 784), (B, 784) -> (-1, 28, 28)); anything needing a
product of symbols or a symbol plus a number as one dim (concat along a
symbolic axis, padding it) is a ShapeError naming the symbol.
"""
from __future__ import annotations

import itertools
import operator

from rlxc.runtime.dims import (  # noqa: F401  (re-exported)
    bind_sizes, describe, is_dynamic, is_sym, pretty, resolve)
from rlxc.runtime.errors import ShapeError

DYN = -1   # how an op's integer parameter stores a symbolic dim (the IR's `?`)
_anon = itertools.count(1)


def symbols(shape) -> tuple:
    """The symbols of `shape` in order of first appearance."""
    out = []
    for d in shape:
        if isinstance(d, str) and d not in out:
            out.append(d)
    return tuple(out)


def fresh(axis=None) -> str:
    """A new anonymous symbol (`None` in a user's shape; GraphScope names an input's after
    the input and `axis`)."""
    return f"?{next(_anon)}"


def user_dims(shape, what: str, new=fresh, anon_ok: bool = False) -> tuple:
    """A user's shape: ints, symbol names (str) or None (a fresh symbol: new(axis)).
    `anon_ok`: a str may also be an anonymous symbol ("?x.0") read off a tensor's shape
    (reshape / broadcast_to; their shape functions check that every symbol exists)."""
    dims = tuple(shape) if hasattr(shape, "__iter__") and not isinstance(shape, str) \
        else (shape,)
    out = []
    for d in dims:
        if d is None:
            out.append(new(len(out)))
        elif isinstance(d, str) and anon_ok and d.startswith("?"):
            out.append(d)
        elif isinstance(d, str):
            if not d or not (d[0].isalpha() or d[0] == "_") or \
                    not d.replace("_", "a").replace(".", "a").isalnum():
                raise ValueError(f"{what}: dimension symbol {d!r} is not a name "
                                 "(letters, digits, _ and ., starting with a letter or _)")
            out.append(d)
        else:
            try:
                out.append(operator.index(d))
            except TypeError:
                raise TypeError(f"{what}: shape {dims}: dimension {d!r} is not an integer "
                                f"({type(d).__name__}); a dimension is an int, a symbol "
                                "name (str) or None") from None
    return tuple(out)


def static_numel(shape) -> int:
    """The element count with every symbol read as 1 (for size bounds)."""
    n = 1
    for d in shape:
        n *= 1 if isinstance(d, str) else int(d)
    return n


def monomial(shape) -> tuple[int, tuple]:
    """The size of `shape` as (static factor, sorted symbols with repeats)."""
    return static_numel(shape), tuple(sorted(d for d in shape if isinstance(d, str)))


def broadcast_dim(x, y, what: str, a, b):
    """One dim of NumPy broadcasting on symbolic dims (the error names the symbol)."""
    if x == y or y == 1:
        return x
    if x == 1:
        return y
    s = x if is_sym(x) else y
    if is_sym(s):
        raise ShapeError(f"{what}: shapes {pretty(a)} and {pretty(b)} do not broadcast: "
                         f"{describe(x)} vs {describe(y)} (a dynamic dimension only "
                         "broadcasts against itself or 1)")
    raise ShapeError(f"{what}: shapes {a} and {b} do not broadcast ({x} vs {y})")


def same_dim(x, y, what: str) -> None:
    """`x` and `y` must be the same dim (a matmul's inner dims, concat's other dims)."""
    if x != y:
        if is_sym(x) or is_sym(y):
            raise ShapeError(f"{what}: {describe(x)} vs {describe(y)} (a dynamic dimension "
                             "only equals itself)")
        raise ShapeError(f"{what}: {x} != {y}")


def reshape_target(src, target, what: str = "reshape") -> tuple:
    """Resolve a reshape of symbolic `src` to `target` (ints, symbols, one -1)."""
    src, target = tuple(src), tuple(target)
    if sum(1 for d in target if d == -1) > 1:
        raise ShapeError(f"{what}: at most one -1 in {target}")
    sc, ss = monomial(src)
    tc, ts = monomial(tuple(d for d in target if d != -1))
    rest = list(ss)
    for s in ts:
        if s not in rest:
            raise ShapeError(f"{what}: cannot reshape {src} to {target}: {describe(s)} is "
                             "not a dimension of the input")
        rest.remove(s)
    if -1 in target:
        if tc == 0 or sc % tc:
            raise ShapeError(f"{what}: cannot reshape {src} to {target}")
        k = sc // tc
        if not rest:
            fill = k
        elif len(rest) == 1 and k == 1:
            fill = rest[0]
        else:
            raise ShapeError(f"{what}: cannot reshape {src} to {target}: -1 would be "
                             f"{' * '.join([str(k)] * (k != 1) + [repr(r) for r in rest])}, "
                             "not one dimension (a dynamic dimension cannot be merged "
                             "with another dimension)")
        return tuple(fill if d == -1 else d for d in target)
    if rest or sc != tc:
        left = f" ({', '.join(describe(r) for r in rest)} unused)" if rest else ""
        raise ShapeError(f"{what}: cannot reshape {src} to {target}{left}")
    return target


def resolve_value(v, env: dict):
    """An op parameter (an int, a symbol or a tuple of them) with symbols resolved."""
    if isinstance(v, str):
        return env.get(v, v)
    if isinstance(v, tuple) and any(isinstance(x, str) for x in v):
        return tuple(env[x] if isinstance(x, str) and x in env else x for x in v)
    return v

"""Validation of call arguments against a function's signature (NumPy only).

Used by `Func.run` on every device and by compiled modules loaded without the
compiler, so both give the same errors: an input must have the declared shape,
or be flat with the same element count (RLX passes flat data); a missing input,
an unknown name or an unbound param raises an error listing the valid names.
"""
from __future__ import annotations

import numpy as np

from .dims import bind_sizes, is_dynamic, pretty
from .errors import NameLookupError, ShapeError

NP_DTYPES = {"f32": np.float32, "f64": np.float64, "i1": np.bool_, "i32": np.int32,
             "i64": np.int64, "u32": np.uint32}


def _count(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def coerce(kind: str, name: str, value, shape, dtype: str) -> np.ndarray:
    """`value` as a C-contiguous array of the declared shape and dtype, or a clear error."""
    want = NP_DTYPES[dtype]
    a = value if isinstance(value, np.ndarray) else np.asarray(value)
    if a.dtype.kind not in "biuf":
        raise TypeError(f"{kind} {name!r}: expects numbers ({dtype}), got dtype {a.dtype}")
    if dtype in ("i32", "i64", "i1", "u32") and a.dtype.kind == "f":
        raise TypeError(f"{kind} {name!r}: expects integers ({dtype}), got {a.dtype}")
    shape = tuple(shape)
    if is_dynamic(shape):      # symbols: any size >= 1, the rank and static dims as declared
        if a.ndim != len(shape) or any(not isinstance(d, str) and d != g
                                       for d, g in zip(shape, a.shape)):
            raise ShapeError(f"{kind} {name!r} expects shape {pretty(shape)}, got {a.shape}")
    elif a.shape != shape:
        if a.ndim == 1 and a.size == _count(shape):
            a = a.reshape(shape)
        elif a.shape == () and shape == (1,) or a.shape == (1,) and shape == ():
            a = a.reshape(shape)
        else:
            raise ShapeError(f"{kind} {name!r} expects shape {shape}, got {a.shape}")
    if dtype in ("i32", "i64", "u32") and a.dtype.kind in "iu" and a.size and a.dtype != want:
        lim = np.iinfo(want)
        if int(a.max()) > lim.max or int(a.min()) < lim.min:
            raise ValueError(f"{kind} {name!r}: values do not fit in {dtype} "
                             f"({lim.min} .. {lim.max})")
    if a.dtype != want or not a.flags.c_contiguous:
        a = np.ascontiguousarray(a, dtype=want)
    return a


def bind_args(args, given: dict, bound: dict, what: str = "run") -> list:
    """Arrays for every argument of `args` (objects with name/kind/shape/dtype), in order.

    `given` maps names to arrays (inputs, or params to override a binding);
    `bound` maps param names to their bound arrays (already coerced)."""
    names = {a.name for a in args}
    unknown = [k for k in given if k not in names]
    if unknown:
        valid = [a.name for a in args if a.kind == "input"]
        raise NameLookupError(f"{what}: unknown input {unknown[0]!r}; valid inputs: {valid}"
                              + (f", params: {[a.name for a in args if a.kind == 'param']}"
                                 if any(a.kind == "param" for a in args) else ""))
    out = []
    for a in args:
        if a.name in given:
            out.append(coerce(a.kind, a.name, given[a.name], a.shape, a.dtype))
        elif a.kind == "param":
            if a.name not in bound:
                unbound = [b.name for b in args if b.kind == "param" and b.name not in bound
                           and b.name not in given]
                raise NameLookupError(
                    f"{what}: param {a.name!r} is not bound; unbound params: {unbound} "
                    "(bind with with_param / init_randn / init_params)")
            out.append(bound[a.name])
        else:
            missing = [b.name for b in args if b.kind == "input" and b.name not in given]
            raise NameLookupError(f"{what}: missing input {a.name!r}; expected inputs: "
                                  f"{[b.name for b in args if b.kind == 'input']}, missing: "
                                  f"{missing}")
    if any(is_dynamic(a.shape) for a in args):   # every use of a symbol agrees, none is 0
        bind_sizes(args, [x.shape for x in out], what)
    return out

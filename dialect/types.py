"""Tensor types of the rlx dialect and their NumPy counterparts.

rlx values are ranked builtin tensors, `tensor<4x3xf32>`. A rank-0 tensor
(`tensor<f32>`) is a scalar; full reductions produce one. Element types:
f32 (the compute type), f64 (the interpreter's gradient-check mode and
explicit casts), i1 (masks from comparisons), i32/i64 (indices).
"""
from __future__ import annotations

import numpy as np

from rlxc.runtime.errors import ShapeError  # noqa: F401  (re-exported)
from xdsl.dialects.builtin import (
    BytesAttr,
    DenseIntOrFPElementsAttr,
    Float32Type,
    Float64Type,
    IntegerType,
    TensorType,
    f32,
    f64,
    i1,
    i32,
    i64,
)

DTYPES = {"f32": f32, "f64": f64, "i1": i1, "i32": i32, "i64": i64}
NP_DTYPES = {"f32": np.float32, "f64": np.float64, "i1": np.bool_, "i32": np.int32, "i64": np.int64}
FLOAT_DTYPES = ("f32", "f64")
INT_DTYPES = ("i32", "i64")


def dtype_name(elem) -> str:
    if isinstance(elem, Float32Type):
        return "f32"
    if isinstance(elem, Float64Type):
        return "f64"
    if isinstance(elem, IntegerType):
        w = elem.width.data
        return {1: "i1", 32: "i32", 64: "i64"}.get(w, f"i{w}")
    raise TypeError(f"unsupported element type {elem}")


def tensor_type(shape, dtype: str = "f32") -> TensorType:
    if dtype not in DTYPES:
        raise TypeError(f"unknown dtype {dtype!r}; valid: {', '.join(DTYPES)}")
    return TensorType(DTYPES[dtype], [int(d) for d in shape])


def shape_of(t) -> tuple[int, ...]:
    """Shape of a TensorType (or of an SSA value's type)."""
    t = getattr(t, "type", t)
    return tuple(int(d) for d in t.get_shape())


def dtype_of(t) -> str:
    t = getattr(t, "type", t)
    return dtype_name(t.element_type)


def numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def dense_attr(array: np.ndarray, dtype: str | None = None) -> DenseIntOrFPElementsAttr:
    """Build a dense elements attribute from an array without per-element Python work."""
    array = np.asarray(array)
    if dtype is None:
        dtype = {np.dtype(np.float64): "f64", np.dtype(np.bool_): "i1", np.dtype(np.int32): "i32",
                 np.dtype(np.int64): "i64"}.get(array.dtype, "f32")
    arr = np.array(array, dtype=NP_DTYPES[dtype], order="C")  # keeps rank 0
    if dtype == "i1":
        arr = arr.astype(np.int8)
    typ = tensor_type(arr.shape, dtype)
    if arr.size > 1 and np.all(arr.reshape(-1) == arr.reshape(-1)[0]) and not np.isnan(
            arr.reshape(-1)[0] if arr.dtype.kind == "f" else 0):
        arr = arr.reshape(-1)[:1]  # splat: one stored value
    return DenseIntOrFPElementsAttr(typ, BytesAttr(arr.tobytes()))


def dense_value(attr: DenseIntOrFPElementsAttr) -> np.ndarray:
    """The NumPy array a dense attribute holds (splats expanded)."""
    typ = attr.type
    dtype = dtype_of(typ)
    shape = shape_of(typ)
    raw = attr.data.data
    npdt = np.int8 if dtype == "i1" else NP_DTYPES[dtype]
    flat = np.frombuffer(raw, dtype=npdt)
    if dtype == "i1":
        flat = flat.astype(np.bool_)
    if flat.size == 1 and numel(shape) != 1:
        return np.full(shape, flat[0], dtype=NP_DTYPES[dtype])
    return flat.reshape(shape).copy()


def is_splat(attr: DenseIntOrFPElementsAttr) -> bool:
    typ = attr.type
    esize = 1 if dtype_of(typ) == "i1" else np.dtype(NP_DTYPES[dtype_of(typ)]).itemsize
    return len(attr.data.data) == esize


def broadcast_shapes(a, b, what: str = "broadcast") -> tuple[int, ...]:
    """NumPy broadcasting of two shapes; the error names the op and both shapes."""
    a, b = tuple(a), tuple(b)
    n = max(len(a), len(b))
    pa, pb = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    out = []
    for x, y in zip(pa, pb):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            raise ShapeError(f"{what}: shapes {a} and {b} do not broadcast ({x} vs {y})")
    return tuple(out)

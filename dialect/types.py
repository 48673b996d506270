"""Tensor types of the rlx dialect and their NumPy counterparts.

rlx values are ranked builtin tensors, `tensor<4x3xf32>`. A rank-0 tensor
(`tensor<f32>`) is a scalar; full reductions produce one. Element types:
f32 (the compute type), f64 (the interpreter's gradient-check mode and
explicit casts), i1 (masks from comparisons), i32/i64 (indices), u32 (`ui32`:
the keys of rlxc.random; bits, not numbers: only views, gather, concat, select,
casts and rlx.philox take it, see shapes.U32_OPS).

The xDSL-free parts (dtype names, shape arithmetic, constant bytes) live in
dialect/shapes.py and are re-exported here.
"""
from __future__ import annotations

import numpy as np

from rlxc.runtime.errors import ShapeError  # noqa: F401  (re-exported)
from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    ArrayAttr,
    BytesAttr,
    DenseIntOrFPElementsAttr,
    Float32Type,
    Float64Type,
    IntegerType,
    Signedness,
    StringAttr,
    TensorType,
    f32,
    f64,
    i1,
    i32,
    i64,
)

from .shapes import (  # noqa: F401  (re-exported)
    FLOAT_DTYPES,
    INT_DTYPES,
    NP_DTYPES,
    TType,
    broadcast_shapes,
    dense_bytes,
    numel,
)

DTYPES = {"f32": f32, "f64": f64, "i1": i1, "i32": i32, "i64": i64,
          "u32": IntegerType(32, Signedness.UNSIGNED)}


def dtype_name(elem) -> str:
    if isinstance(elem, Float32Type):
        return "f32"
    if isinstance(elem, Float64Type):
        return "f64"
    if isinstance(elem, IntegerType):
        w = elem.width.data
        if w == 32 and elem.signedness.data == Signedness.UNSIGNED:
            return "u32"
        return {1: "i1", 32: "i32", 64: "i64"}.get(w, f"i{w}")
    raise TypeError(f"unsupported element type {elem}")


def tensor_type(shape, dtype: str = "f32") -> TensorType:
    """`tensor<4x3xf32>`; a shape with symbols (dialect/symdims.py) is
    `tensor<?x3xf32, ["B", ""]>`: `?` dims, their names in the encoding."""
    if dtype not in DTYPES:
        raise TypeError(f"unknown dtype {dtype!r}; valid: {', '.join(DTYPES)}")
    if any(isinstance(d, str) for d in shape):
        return TensorType(DTYPES[dtype], [DYNAMIC_INDEX if isinstance(d, str) else int(d)
                                          for d in shape], dims_attr(shape))
    return TensorType(DTYPES[dtype], [int(d) for d in shape])


def dims_attr(shape) -> ArrayAttr:
    """The symbol names of a shape, "" for a static dim (a type's encoding, rlx.dims)."""
    return ArrayAttr([StringAttr(d if isinstance(d, str) else "") for d in shape])


def shape_of(t) -> tuple:
    """Shape of a TensorType (or of an SSA value's type); a dynamic dim is its symbol
    name (from the type's encoding; "?" when a `?` dim carries no name)."""
    t = getattr(t, "type", t)
    dims = t.get_shape()
    if DYNAMIC_INDEX not in dims:
        return tuple(int(d) for d in dims)
    enc = getattr(t, "encoding", None)
    names = [a.data for a in enc.data] if isinstance(enc, ArrayAttr) and \
        len(enc.data) == len(dims) and all(isinstance(a, StringAttr) for a in enc.data) \
        else [""] * len(dims)
    return tuple((names[i] or "?") if d == DYNAMIC_INDEX else int(d) for i, d in enumerate(dims))


def dtype_of(t) -> str:
    t = getattr(t, "type", t)
    return dtype_name(t.element_type)


def dense_attr(array: np.ndarray, dtype: str | None = None) -> DenseIntOrFPElementsAttr:
    """Build a dense elements attribute from an array without per-element Python work."""
    shape, dtype, raw = dense_bytes(array, dtype)
    return DenseIntOrFPElementsAttr(tensor_type(shape, dtype), BytesAttr(raw))


def ttype(t) -> TType:
    """The (shape, dtype) of a TensorType (or of an SSA value's type) as a TType."""
    return TType(shape_of(t), dtype_of(t))


def hex_form(vals: np.ndarray) -> bool:
    """Whether float constants `vals` are printed in MLIR's hex form `dense<"0x...">`
    (raw little-endian bytes): when large (fast), non-finite (exact), or holding a value
    that xDSL would print as an unquoted hex integer (1048576.0 in f32: its 6-digit
    scientific form does not round-trip and %.9g has no point), which its parser reads
    back as that integer's value (1.23e9)."""
    if vals.dtype.kind != "f":
        return False
    if vals.size > 256 or not np.all(np.isfinite(vals)):
        return True
    digits = 9 if vals.dtype == np.float32 else 17
    for v in vals.reshape(-1).tolist():
        s = f"{v:.5e}"
        if vals.dtype.type(float(s)) != v and "." not in f"{v:.{digits}g}":
            return True
    return False


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


def splat_element(attr: DenseIntOrFPElementsAttr):
    """The one element of a splat dense attribute (is_splat) as a NumPy scalar (int8 for
    i1), without expanding it to the attribute's shape (which may be huge)."""
    dtype = dtype_of(attr.type)
    return np.frombuffer(attr.data.data, dtype=np.int8 if dtype == "i1" else NP_DTYPES[dtype])[0]


def is_splat(attr: DenseIntOrFPElementsAttr) -> bool:
    typ = attr.type
    esize = 1 if dtype_of(typ) == "i1" else np.dtype(NP_DTYPES[dtype_of(typ)]).itemsize
    return len(attr.data.data) == esize

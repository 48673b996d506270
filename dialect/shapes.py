"""Shape functions of the rlx ops, on plain (shape, dtype) types: no xDSL.

    tracer (rlxc/tensor.py) ──┐
                              ├─> SHAPES["rlx.NAME"].infer([TType, ...], **params)
    verifier (dialect/ops.py) ┘       -> (shape, dtype)
                                  (ops.py converts xDSL tensor types to TType first)

One shape function per op, shared by the tracer and the op verifiers, so a
graph the tracer builds is exactly what the verifier accepts.  They live
here, apart from the xDSL op classes, so that tracing a function (rlxc's
light trace, dialect/trace.py) does not import xDSL: a warm process that
finds its compiled code in the disk cache never builds IR at all.

`TType` prints as the MLIR type (`tensor<4x3xf32>`), so error messages read
the same whether they come from the tracer or from the verifier.

Each entry also carries the op's properties (OpShape: cost class, dtypes,
math kernel, root, combine, view).  Lowering derives every op-name set and the
transcendentals' lowering rows from them (`ops_where`), so an elementwise op is
one row here (UNARY_OPS / BINARY_OPS) plus its interpreter and derivative rows.
"""
from __future__ import annotations

import operator
from typing import Callable, NamedTuple

import numpy as np

from rlxc.runtime.errors import ShapeError

from . import symdims as sd

# u32: the key dtype of rlxc.random (bits, not numbers): views, gather, concat, select,
# casts and rlx.philox take it; arithmetic and compares on it are TypeErrors (U32_OPS)
DTYPE_NAMES = ("f32", "f64", "i1", "i32", "i64", "u32")
NP_DTYPES = {"f32": np.float32, "f64": np.float64, "i1": np.bool_, "i32": np.int32, "i64": np.int64,
             "u32": np.uint32}
DTYPE_BYTES = {d: np.dtype(t).itemsize for d, t in NP_DTYPES.items()}   # i1: one byte
FLOAT_DTYPES = ("f32", "f64")
INT_DTYPES = ("i32", "i64")


class TType(NamedTuple):
    """A ranked tensor type: shape (tuple of ints, or symbol names: dialect/symdims.py)
    and dtype name."""

    shape: tuple
    dtype: str

    def __str__(self):
        dims = "".join("?x" if isinstance(d, str) else f"{d}x" for d in self.shape)
        return f"tensor<{dims}{self.dtype}>"


def numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


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
            sd.broadcast_dim(x, y, what, a, b)   # raises, naming a symbol if one is involved
    return tuple(out)


def as_int(x, what: str, kind: str = "dimension") -> int:
    """`x` as a Python int when it is an integer (int, NumPy integer); else TypeError.

    NumPy's rule: floats are rejected even when integral (3.0), never truncated."""
    try:
        return operator.index(x)
    except TypeError:
        raise TypeError(f"{what}: {kind} {x!r} is not an integer "
                        f"({type(x).__name__})") from None


def as_dims(shape, what: str) -> tuple[int, ...]:
    """A user's shape (an int or a sequence of ints) as a tuple of Python ints."""
    dims = tuple(shape) if hasattr(shape, "__iter__") else (shape,)
    return tuple(as_int(d, f"{what}: shape {dims}") for d in dims)


def normalize_axes(axes, rank: int, what: str) -> tuple[int, ...]:
    if axes is None:
        return tuple(range(rank))
    if not hasattr(axes, "__iter__"):
        axes = (axes,)
    out = []
    for a in axes:
        a = as_int(a, what, "axis")
        if not -rank <= a < rank:
            raise ShapeError(f"{what}: axis {a} out of range for rank {rank}")
        out.append(a % rank)
    if len(set(out)) != len(out):
        raise ShapeError(f"{what}: repeated axis in {tuple(axes)}")
    return tuple(sorted(out))


def dense_bytes(array, dtype: str | None = None) -> tuple[tuple, str, bytes]:
    """(shape, dtype, raw little-endian bytes) of a dense constant; a splat keeps one value.

    The exact content of an rlx.constant (types.dense_attr wraps it)."""
    array = np.asarray(array)
    if dtype is None:
        dtype = {np.dtype(np.float64): "f64", np.dtype(np.bool_): "i1", np.dtype(np.int32): "i32",
                 np.dtype(np.int64): "i64", np.dtype(np.uint32): "u32"}.get(array.dtype, "f32")
    arr = np.array(array, dtype=NP_DTYPES[dtype], order="C")  # keeps rank 0
    if dtype == "i1":
        arr = arr.astype(np.int8)
    shape = tuple(int(d) for d in arr.shape)
    flat = arr.reshape(-1)
    if flat.size > 1 and not (arr.dtype.kind == "f" and np.isnan(flat[0])):
        raw = flat.view(np.uint8).reshape(flat.size, -1)
        if (raw == raw[0]).all():  # bitwise, so [0.0, -0.0] is not a splat
            arr = flat[:1]  # splat: one stored value
    return shape, dtype, arr.tobytes()


# -- op parameters: how each kind is normalised (the value an xDSL property holds) ---

def _i64(v) -> int:
    """An op's integer parameter: stored as a signed 64-bit IR attribute."""
    i = as_int(v, "op parameter", "value")
    if not -2 ** 63 <= i < 2 ** 63:
        raise ValueError(f"integer parameter {i} does not fit in 64 bits")
    return i


def _dim64(v):
    """An integer parameter that may hold a dimension: a symbol name stays a str."""
    return v if isinstance(v, str) else _i64(v)


PARAM_KINDS = {
    "ints": lambda v: tuple(_dim64(x) for x in v),
    "int": _dim64,
    "float": float,
    "flag": bool,
    "str": str,           # optional: "" when absent (not stored in the IR)
}


ALL_DTYPES = ("f32", "f64", "i1", "i32", "i64")   # the number dtypes (u32 is a key dtype)
ELEMENTWISE_FAMILIES = ("unary", "binary", "compare", "select", "cast", "random")


class OpShape(NamedTuple):
    """An op's entry: family, parameter kinds, shape function, and the properties every
    lowering reads (the backends' op-name sets are derived from these, never kept by hand).

    cost    "cheap" | "costly" (a division, square root: ~4 adds) | "heavy" (a
            transcendental: ~10 adds); the schedulers' work estimates
    dtypes  the element types the backends compute it in (unary/binary families; a
            dtype outside it is a NotImplementedError naming the op and the dtype)
    math    the shared math-library kernel that *is* the op (lowering/shared/mathlib.py):
            its lowering row is `mathlib.emit(b, math, x)`, derived, on every backend
    root    computed by a kernel of its own (an accumulation or a scatter), never inlined
            as an expression at one index
    combine the accumulator update of a reduction ("add", "mul", "max", "min")
    view    a pure index map (the element at i is the operand's element at f(i))
    """

    family: str
    params: dict          # name -> kind ("ints", "int", "float", "flag")
    infer: Callable       # (types: list[TType], **params) -> (shape, dtype)
    cost: str = "cheap"
    dtypes: tuple = ALL_DTYPES
    math: str | None = None
    root: bool = False
    combine: str | None = None
    view: bool = False

    @property
    def elementwise(self) -> bool:
        return self.family in ELEMENTWISE_FAMILIES

    def canonical(self, params: dict) -> dict:
        """The op's parameters as stored in the IR (ints, floats, bools, int tuples)."""
        return {k: PARAM_KINDS[kind](params[k] if k in params or kind != "str" else "")
                for k, kind in self.params.items()}


SHAPES: dict[str, OpShape] = {}


def _shape(opname: str, family: str, infer: Callable, params: dict | None = None, **props):
    if props.get("math"):
        props.setdefault("cost", "heavy")
    SHAPES[f"rlx.{opname}"] = OpShape(family, dict(params or {}), infer, **props)


def ops_where(pred: Callable[[OpShape], bool]) -> frozenset:
    """Names of the ops whose entry satisfies `pred` (how lowering derives its name sets)."""
    return frozenset(n for n, s in SHAPES.items() if pred(s))


# ---------------------------------------------------------------- constants, casts

def _infer_constant(types, **_):
    raise AssertionError("constants carry their type")


def _infer_cast(types, dtype):
    return types[0].shape, dtype


_shape("constant", "constant", _infer_constant)
_shape("cast", "cast", _infer_cast)


# ---------------------------------------------------------------- elementwise

def _same_float(opname):
    def infer(types, **_):
        (t,) = types
        if t.dtype not in FLOAT_DTYPES:
            raise ShapeError(f"{opname}: expects a float tensor, got {t.dtype}")
        return t.shape, t.dtype
    return infer


def _same_any(types, **_):
    (t,) = types
    return t.shape, t.dtype


def _binary_infer(opname):
    def infer(types, **_):
        a, b = types
        if a.shape != b.shape or a.dtype != b.dtype:
            raise ShapeError(f"{opname}: operand types differ: {a} vs {b} "
                             "(the tracer inserts rlx.broadcast_to)")
        return a.shape, a.dtype
    return infer


def _compare_infer(opname):
    def infer(types, **_):
        a, b = types
        if a.shape != b.shape or a.dtype != b.dtype:
            raise ShapeError(f"{opname}: operand types differ: {a} vs {b}")
        return a.shape, "i1"
    return infer


F32 = ("f32",)                    # computed in float32 only (fake_quant)
FLOATS = FLOAT_DTYPES
NUMBERS = ("f32", "f64", "i32", "i64")   # not on i1 masks
_HEAVY, _COSTLY = {"cost": "heavy"}, {"cost": "costly"}

# name: (summary, properties).  A transcendental names its math-library kernel (`math`).
UNARY_OPS = {
    "neg": ("negation, -x", {"dtypes": FLOATS}),
    "exp": ("e to the x", {"math": "exp", "dtypes": FLOATS}),
    "log": ("natural logarithm", {"math": "log", "dtypes": FLOATS}),
    "sqrt": ("square root", {"dtypes": FLOATS, **_COSTLY}),
    "rsqrt": ("1/sqrt(x)", {"dtypes": FLOATS, **_COSTLY}),
    "tanh": ("hyperbolic tangent", {"math": "tanh", "dtypes": FLOATS}),
    "sigmoid": ("logistic 1/(1+exp(-x))", {"math": "sigmoid", "dtypes": FLOATS}),
    "relu": ("max(x, 0)", {"dtypes": FLOATS}),
    "gelu": ("GELU, erf form: 0.5x(1+erf(x/sqrt 2))", {"math": "gelu", "dtypes": FLOATS}),
    "gelu_tanh": ("GELU, tanh approximation", {"math": "gelu_tanh", "dtypes": FLOATS}),
    "silu": ("x*sigmoid(x)", {"math": "silu", "dtypes": FLOATS}),
    "softplus": ("log(1+exp(x)), computed stably", {"math": "softplus", "dtypes": FLOATS}),
    "abs": ("absolute value", {"dtypes": FLOATS}),
    "sin": ("sine", {"math": "sin", "dtypes": FLOATS}),
    "cos": ("cosine", {"math": "cos", "dtypes": FLOATS}),
    "sign": ("sign: -1, 0 or 1 (NaN stays NaN)", {"dtypes": FLOATS}),
    "reciprocal": ("1/x", {"dtypes": FLOATS}),
    "erf": ("the error function", {"math": "erf", "dtypes": FLOATS}),
    "stop_gradient": ("identity whose derivative is zero", {}),
    "floor": ("round down to an integer value (float result)", {"dtypes": FLOATS}),
    "ceil": ("round up to an integer value (float result)", {"dtypes": FLOATS}),
    "round": ("round to the nearest integer value, halves to even (NumPy's np.round)",
              {"dtypes": FLOATS}),
    "expm1": ("e to the x, minus 1 (accurate near 0)", {"math": "expm1", "dtypes": FLOATS}),
    "log1p": ("log(1 + x) (accurate near 0)", {"math": "log1p", "dtypes": FLOATS}),
    "exp2": ("2 to the x", {"math": "exp2", "dtypes": FLOATS}),
    "log2": ("base-2 logarithm", {"math": "log2", "dtypes": FLOATS}),
    "log10": ("base-10 logarithm", {"math": "log10", "dtypes": FLOATS}),
    "tan": ("tangent", {"math": "tan", "dtypes": FLOATS}),
    "atan": ("inverse tangent (NumPy: arctan)", {"math": "atan", "dtypes": FLOATS}),
    "asin": ("inverse sine (NumPy: arcsin)", {"math": "asin", "dtypes": FLOATS}),
    "acos": ("inverse cosine (NumPy: arccos)", {"math": "acos", "dtypes": FLOATS}),
    "sinh": ("hyperbolic sine", {"math": "sinh", "dtypes": FLOATS}),
    "cosh": ("hyperbolic cosine", {"math": "cosh", "dtypes": FLOATS}),
    "asinh": ("inverse hyperbolic sine (NumPy: arcsinh)", {"math": "asinh", "dtypes": FLOATS}),
    "acosh": ("inverse hyperbolic cosine (NumPy: arccosh)", {"math": "acosh", "dtypes": FLOATS}),
    "atanh": ("inverse hyperbolic tangent (NumPy: arctanh)",
              {"math": "atanh", "dtypes": FLOATS}),
}
BINARY_OPS = {
    "add": ("a + b", {}), "sub": ("a - b", {"dtypes": NUMBERS}), "mul": ("a * b", {}),
    "div": ("a / b (integers: truncated toward zero, saturating; x/0 = 0)",
            {"dtypes": NUMBERS, **_COSTLY}),
    "pow": ("a ** b", {"dtypes": NUMBERS, **_HEAVY}),
    "maximum": ("elementwise max (NaN propagates)", {}),
    "minimum": ("elementwise min (NaN propagates)", {}),
    "rem": ("truncated remainder, C fmod: the sign of a; integer a rem 0 is 0",
            {"dtypes": NUMBERS, **_COSTLY}),
    "atan2": ("the angle of (b, a): atan(a/b) in the right quadrant (NumPy: arctan2)",
              {"math": "atan2", "dtypes": FLOATS}),
    "hypot": ("sqrt(a*a + b*b) without overflow", {"math": "hypot", "dtypes": FLOATS}),
}
UNARY = {n: s for n, (s, _) in UNARY_OPS.items()}
BINARY = {n: s for n, (s, _) in BINARY_OPS.items()}
COMPARE = {"eq": "a == b", "ne": "a != b", "lt": "a < b", "le": "a <= b",
           "gt": "a > b", "ge": "a >= b"}

for _n, (_s, _p) in UNARY_OPS.items():
    _shape(_n, "unary", _same_float(_n) if _n != "stop_gradient" else _same_any, **_p)
for _n, (_s, _p) in BINARY_OPS.items():
    _shape(_n, "binary", _binary_infer(_n), **_p)


def _float_binary(opname):
    def infer(types, **_):
        shape, dtype = _binary_infer(opname)(types)
        if dtype not in FLOAT_DTYPES:
            raise ShapeError(f"{opname}: expects float tensors, got {dtype}")
        return shape, dtype
    return infer


for _n, (_s, _p) in BINARY_OPS.items():   # the binary transcendentals: floats only
    if _p.get("math"):
        _shape(_n, "binary", _float_binary(_n), **_p)


def _infer_rem(types, **_):
    shape, dtype = _binary_infer("rem")(types)
    if dtype == "i1":
        raise ShapeError("rem: expects float or i32/i64 tensors, got i1")
    return shape, dtype


_shape("rem", "binary", _infer_rem, **BINARY_OPS["rem"][1])
for _n in COMPARE:
    _shape(_n, "compare", _compare_infer(_n))


def _infer_select(types, **_):
    c, a, b = types
    if c.dtype != "i1":
        raise ShapeError(f"select: condition must be i1, got {c.dtype}")
    if not (c.shape == a.shape == b.shape) or a.dtype != b.dtype:
        raise ShapeError(f"select: types differ: {c}, {a}, {b}")
    return a.shape, a.dtype


_shape("select", "select", _infer_select)


def _infer_fake_quant(types, exp_bits, man_bits, max_normal):
    (t,) = types
    if t.dtype not in FLOAT_DTYPES:
        raise ShapeError(f"fake_quant: expects a float tensor, got {t.dtype}")
    if exp_bits < 1 or man_bits < 0 or not max_normal > 0:
        raise ShapeError(f"fake_quant: bad format e{exp_bits}m{man_bits} max {max_normal}")
    return t.shape, t.dtype


_shape("fake_quant", "unary", _infer_fake_quant,
       {"exp_bits": "int", "man_bits": "int", "max_normal": "float"}, dtypes=F32, cost="costly")


# ---------------------------------------------------------------- reductions

def _reduce_infer(opname):
    def infer(types, axes, keepdims):
        (t,) = types
        shp = t.shape
        ax = normalize_axes(axes, len(shp), opname)
        if tuple(axes) != ax:
            raise ShapeError(f"{opname}: axes must be sorted and non-negative, got {tuple(axes)}")
        if opname in ("max", "min") and any(shp[a] == 0 for a in ax):
            raise ShapeError(f"{opname}: reduction over an empty axis of {shp}")
        if keepdims:
            out = tuple(1 if i in ax else d for i, d in enumerate(shp))
        else:
            out = tuple(d for i, d in enumerate(shp) if i not in ax)
        return out, t.dtype
    return infer


REDUCE = {"sum": "sum", "mean": "mean", "max": "maximum", "min": "minimum", "prod": "product"}
_COMBINE = {"sum": "add", "mean": "add", "max": "max", "min": "min", "prod": "mul"}
for _n in REDUCE:
    _shape(_n, "reduce", _reduce_infer(_n), {"axes": "ints", "keepdims": "flag"}, root=True,
           combine=_COMBINE[_n])


# ---------------------------------------------------------------- linear algebra

def _infer_matmul(types, **_):
    a, b = types
    sa, sb = a.shape, b.shape
    if len(sa) < 2 or len(sb) < 2:
        raise ShapeError(f"matmul: {sa} @ {sb}: operands need rank >= 2 "
                         "(the tracer reshapes vectors)")
    if sa[-1] != sb[-2]:
        sd.same_dim(sa[-1], sb[-2], f"matmul: {sa} @ {sb}: inner dimensions")
    if a.dtype != b.dtype:
        raise ShapeError(f"matmul: dtypes differ: {a.dtype} vs {b.dtype}")
    batch = broadcast_shapes(sa[:-2], sb[:-2], f"matmul: {sa} @ {sb}: batch dims")
    return batch + (sa[-2], sb[-1]), a.dtype


_shape("matmul", "matmul", _infer_matmul, root=True)


# ---------------------------------------------------------------- shape ops

def _infer_transpose(types, perm):
    (t,) = types
    shp = t.shape
    if sorted(perm) != list(range(len(shp))):
        raise ShapeError(f"transpose: {tuple(perm)} is not a permutation of rank {len(shp)}")
    return tuple(shp[p] for p in perm), t.dtype


def _infer_reshape(types, shape):
    (t,) = types
    if sd.is_dynamic(shape) or sd.is_dynamic(t.shape):
        if -1 in shape or sd.reshape_target(t.shape, shape) != tuple(shape):
            raise ShapeError(f"reshape: cannot reshape {t.shape} to {tuple(shape)}")
        return tuple(shape), t.dtype
    if numel(shape) != numel(t.shape) or any(d < 0 for d in shape):
        raise ShapeError(f"reshape: cannot reshape {t.shape} to {tuple(shape)}")
    return tuple(shape), t.dtype


def _infer_broadcast(types, shape):
    (t,) = types
    shp = t.shape
    try:
        out = broadcast_shapes(shp, shape, "broadcast_to")
    except ShapeError:
        if sd.is_dynamic(shp) or sd.is_dynamic(shape):
            raise               # the message names the symbol
        out = None
    if out != tuple(shape):
        raise ShapeError(f"broadcast_to: cannot broadcast {shp} to {tuple(shape)}")
    return tuple(shape), t.dtype


def _infer_slice(types, starts, limits, strides):
    (t,) = types
    shp = t.shape
    if not (len(starts) == len(limits) == len(strides) == len(shp)):
        raise ShapeError(f"slice: starts/limits/strides need {len(shp)} entries each")
    out = []
    for d, s, l, st in zip(shp, starts, limits, strides):
        if sd.is_sym(d) or sd.is_sym(l):
            if (s, l, st) != (0, d, 1):
                raise ShapeError(f"slice: [{s}:{l}:{st}] of {sd.describe(d)} of {shp}: a "
                                 "dynamic dimension is only sliced whole ([0:size:1])")
            out.append(d)
            continue
        if st < 1 or not 0 <= s <= l <= d:
            raise ShapeError(f"slice: [{s}:{l}:{st}] out of range for dim {d} of {shp}")
        out.append((l - s + st - 1) // st)
    return tuple(out), t.dtype


def _infer_pad(types, low, high):
    (t,) = types
    shp = t.shape
    if not (len(low) == len(high) == len(shp)) or min(low + high, default=0) < 0:
        raise ShapeError(f"pad: low/high need {len(shp)} non-negative entries")
    for d, a, b in zip(shp, low, high):
        if sd.is_sym(d) and (a or b):
            raise ShapeError(f"pad: cannot pad {sd.describe(d)} of {shp} (a dynamic "
                             "dimension plus a number is not one dimension)")
    return tuple(d if sd.is_sym(d) else d + a + b for d, a, b in zip(shp, low, high)), t.dtype


def _infer_concat(types, axis):
    if not types:
        raise ShapeError("concat: needs at least one tensor")
    s0 = types[0].shape
    if not 0 <= axis < len(s0):
        raise ShapeError(f"concat: axis {axis} out of range for rank {len(s0)}")
    total = 0
    for t in types:
        s = t.shape
        if t.dtype != types[0].dtype:
            raise ShapeError(f"concat: dtypes differ: {types[0].dtype} {s0} and {t.dtype} {s}; "
                             "use .cast()")
        if len(s) != len(s0) or any(a != b for i, (a, b) in enumerate(zip(s, s0)) if i != axis):
            raise ShapeError(f"concat: {s} does not match {s0} outside axis {axis}")
        if sd.is_sym(s[axis]) and len(types) > 1:
            raise ShapeError(f"concat: along {sd.describe(s[axis])} (axis {axis} of {s}): "
                             "the sum of dynamic dimensions is not one dimension")
        total = s[axis] if sd.is_sym(s[axis]) else total + s[axis]
    return s0[:axis] + (total,) + s0[axis + 1:], types[0].dtype


def _infer_gather(types, axis, label=""):
    table, idx = types
    st, si = table.shape, idx.shape
    if not 0 <= axis < len(st):
        raise ShapeError(f"gather: axis {axis} out of range for table {st}")
    if idx.dtype not in INT_DTYPES:
        raise ShapeError(f"gather: indices must be i32 or i64, got {idx.dtype}")
    return st[:axis] + si + st[axis + 1:], table.dtype


def _infer_scatter_add(types, axis, dim, label=""):
    idx, upd = types
    si, su = idx.shape, upd.shape
    if idx.dtype not in INT_DTYPES:
        raise ShapeError(f"scatter_add: indices must be i32 or i64, got {idx.dtype}")
    n = len(si)
    if not 0 <= axis <= len(su) - n or su[axis:axis + n] != si:
        raise ShapeError(f"scatter_add: updates {su} do not hold indices {si} at axis {axis}")
    return su[:axis] + (dim,) + su[axis + n:], upd.dtype


_shape("transpose", "shape", _infer_transpose, {"perm": "ints"}, view=True)
_shape("reshape", "shape", _infer_reshape, {"shape": "ints"}, view=True)
_shape("broadcast_to", "shape", _infer_broadcast, {"shape": "ints"}, view=True)
_shape("slice", "shape", _infer_slice, {"starts": "ints", "limits": "ints", "strides": "ints"},
       view=True)
_shape("pad", "shape", _infer_pad, {"low": "ints", "high": "ints"})
_shape("concat", "variadic", _infer_concat, {"axis": "int"})
# `label` (optional) names the user's indexing that made the op (`x[idx]` on axis 0 of a
# (5, 3) tensor); index-out-of-range errors quote it, also from the backward's scatter_add.
_shape("gather", "gather", _infer_gather, {"axis": "int", "label": "str"})
_shape("scatter_add", "gather", _infer_scatter_add, {"axis": "int", "dim": "int", "label": "str"},
       root=True)


# ---------------------------------------------------------------- randomness (rlxc/random.py)
# rlx.philox(k0, k1, ctr) {word, stream}: element i is word `word` of the Philox-4x32-10
# block with key (k0, k1) and counter (ctr, stream, 0, 0), as a uniform f32 in [0, 1):
# (bits >> 8) * 2**-24.  Elementwise: every operand has the result's shape (the key words
# are broadcast u32 views, ctr the i32 linear index), so vmap, fusion and both backends
# treat it like any elementwise op (lowering/shared/philox.py, dialect/philox.py).

def _infer_philox(types, word, stream):
    k0, k1, c = types
    if not (k0.shape == k1.shape == c.shape):
        raise ShapeError(f"philox: operand shapes differ: {k0}, {k1}, {c}")
    if k0.dtype != "u32" or k1.dtype != "u32" or c.dtype != "i32":
        raise ShapeError(f"philox: expects u32 key words and an i32 counter, got {k0}, {k1}, {c}")
    if not 0 <= word < 4 or not 0 <= stream < 2 ** 32:
        raise ShapeError(f"philox: word {word} not in [0, 4) or stream {stream} not in [0, 2**32)")
    return c.shape, "f32"


_shape("philox", "random", _infer_philox, {"word": "int", "stream": "int"}, cost="heavy")

# the ops that accept u32 operands (the tracer rejects any other op on them)
U32_OPS = frozenset(n for n, s in SHAPES.items() if s.view) | {
    "rlx.gather", "rlx.concat", "rlx.select", "rlx.stop_gradient", "rlx.cast", "rlx.philox",
    "rlx.pad"}


def check_u32(name: str, dtypes) -> None:
    """TypeError unless op `name` accepts its operands' dtypes: u32 only reaches U32_OPS
    (the tracer and the verifier, so IR read from text obeys it too)."""
    if name not in U32_OPS and "u32" in dtypes:
        raise TypeError(f"{name}: u32 tensors are random keys (bits), not numbers: only "
                        "views, gather, concat, where, casts and rlxc.random take them")
# ---------------------------------------------------------------- convolution (dialect/conv_shapes.py)

from .conv_shapes import CONV_SHAPES  # noqa: E402

for _n, (_f, _p) in CONV_SHAPES.items():
    _shape(_n, "conv", _f, _p, root=True)
# ---------------------------------------------------------------- attention (dialect/attention.py)

ATTENTION_MASKS = ("", "causal", "sliding", "tensor")


def _infer_attention(types, scale, softcap, kind="", window=0):
    """q (B, H, Sq, D), k and v (B, H, Sk, D); with kind "tensor" a 4th operand, an i1
    mask whose dims are each 1 or the full (B, H, Sq, Sk) size. Result (B, H, Sq, D)."""
    if kind not in ATTENTION_MASKS:
        raise ShapeError(f"attention: mask kind {kind!r} is not one of {ATTENTION_MASKS}")
    want = 4 if kind == "tensor" else 3
    if len(types) != want:
        raise ShapeError(f"attention: mask kind {kind!r} takes {want} operands, got {len(types)}")
    q, k, v = types[:3]
    for n, t in (("q", q), ("k", k), ("v", v)):
        if len(t.shape) != 4:
            raise ShapeError(f"attention: {n} must be (B, H, S, D), got shape {t.shape}")
        if t.dtype not in FLOAT_DTYPES or t.dtype != q.dtype:
            raise ShapeError(f"attention: {n} must be a float tensor of q's dtype, got {t.dtype}")
    (B, H, Sq, D), (Sk,) = q.shape, k.shape[2:3]
    if k.shape != (B, H, Sk, D) or v.shape != (B, H, Sk, D):
        raise ShapeError(f"attention: q {q.shape} needs k and v of shape (B, H, Sk, D) = "
                         f"({B}, {H}, Sk, {D}); got k {k.shape}, v {v.shape}")
    if kind == "tensor":
        m = types[3]
        full = (B, H, Sq, Sk)
        if m.dtype != "i1" or len(m.shape) != 4 or any(a not in (1, f) for a, f in
                                                        zip(m.shape, full)):
            raise ShapeError(f"attention: mask must be a rank-4 i1 tensor broadcasting to "
                             f"{full}, got {m}")
    if kind == "sliding" and window < 1:
        raise ShapeError(f"attention: sliding window must be >= 1, got {window}")
    if softcap < 0:
        raise ShapeError(f"attention: softcap must be > 0 (0: none), got {softcap}")
    return q.shape, q.dtype


_shape("attention", "attention", _infer_attention,
       {"scale": "float", "softcap": "float", "kind": "str", "window": "int"}, root=True,
       cost="heavy", dtypes=FLOAT_DTYPES)

from .attention_bwd import ATTN_PARAMS, BWD_SHAPES  # noqa: E402  (attention's fused backward)

for _n, _f in BWD_SHAPES.items():
    _shape(_n, "attention", _f, ATTN_PARAMS, root=True, cost="heavy", dtypes=FLOAT_DTYPES)

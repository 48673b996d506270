"""The rlx dialect: every op, declared in one place.

Each op has a one-line summary, an MLIR example, a custom assembly format and a
verifier. Verification and the tracer share one shape function per op
(`infer(operand_types, **params) -> (shape, dtype)`), so a graph the tracer
builds is exactly what the verifier accepts.

Conventions (documented once, relied on by every pass):
- Inputs and params are the arguments of the one `func.func` in a module,
  carrying `{rlx.name = "x", rlx.kind = "input" | "param"}` argument
  attributes, in declaration order. Results are the outputs in order.
- Elementwise binary ops take operands of one identical type. NumPy
  broadcasting is made explicit by the tracer with `rlx.broadcast_to`, so
  every transform rule sees equal shapes (and the VJP of broadcasting is the
  one rule of `rlx.broadcast_to`: a sum).
- A full reduction returns a rank-0 tensor, shape `()`.
- expand_dims / squeeze / flatten are `rlx.reshape`; narrow is `rlx.slice`.

Ops are grouped in families (unary, binary, compare, reduce); the transform
and lowering tables register rules for whole families via `FAMILY`.
"""
from __future__ import annotations

from typing import Callable, ClassVar

import numpy as np

from xdsl.dialects.builtin import (
    AnyFloat,
    DenseArrayBase,
    DenseIntOrFPElementsAttr,
    FloatAttr,
    IntegerAttr,
    TensorType,
    UnitAttr,
    f64,
    i64,
)
from xdsl.ir import Dialect
from xdsl.irdl import (
    AnyAttr,
    IRDLOperation,
    ParamAttrConstraint,
    VarConstraint,
    irdl_op_definition,
    operand_def,
    opt_prop_def,
    prop_def,
    result_def,
    traits_def,
    var_operand_def,
)
from xdsl.traits import Pure
from xdsl.utils.exceptions import VerifyException

from .types import (
    FLOAT_DTYPES,
    dense_attr,
    dense_value,
    INT_DTYPES,
    ShapeError,
    broadcast_shapes,
    dtype_of,
    numel,
    shape_of,
    tensor_type,
)

# How each kind of op parameter is stored as an xDSL property.
_PARAM_KINDS = {
    "ints": lambda: prop_def(DenseArrayBase.constr(i64)),
    "int": lambda: prop_def(IntegerAttr[i64]),
    "float": lambda: prop_def(FloatAttr),
    "flag": lambda: opt_prop_def(UnitAttr),
}


def _to_prop(kind: str, value):
    if kind == "ints":
        return DenseArrayBase.from_list(i64, [int(v) for v in value])
    if kind == "int":
        return IntegerAttr(int(value), i64)
    if kind == "float":
        return FloatAttr(float(value), f64)
    if kind == "flag":
        return UnitAttr() if value else None
    raise KeyError(kind)


def _from_prop(kind: str, attr):
    if kind == "ints":
        return tuple(int(v) for v in attr.get_values())
    if kind == "int":
        return int(attr.value.data)
    if kind == "float":
        return float(attr.value.data)
    if kind == "flag":
        return attr is not None
    raise KeyError(kind)


class RlxOp(IRDLOperation):
    """Shared behaviour of rlx ops: typed parameters and shape verification."""

    FAMILY: ClassVar[str] = ""
    PARAMS: ClassVar[dict] = {}

    @staticmethod
    def infer(types, **params):  # pragma: no cover - every op overrides
        raise NotImplementedError

    def params(self) -> dict:
        """This op's parameters as plain Python values (tuples, ints, floats, bools)."""
        return {k: _from_prop(kind, self.properties.get(k)) for k, kind in self.PARAMS.items()}

    def verify_(self) -> None:
        types = [o.type for o in self.operands]
        try:
            shape, dtype = self.infer(types, **self.params())
        except ShapeError as e:
            raise VerifyException(str(e)) from e
        want = tensor_type(shape, dtype)
        got = self.results[0].type
        if want != got:
            raise VerifyException(f"{self.name}: result type should be {want}, got {got}")


def make_op(cls, operands, **params):
    """Build an op of class `cls`, inferring its result type (the tracer's entry point)."""
    types = [o.type for o in operands]
    shape, dtype = cls.infer(types, **params)
    props = {}
    for k, kind in cls.PARAMS.items():
        p = _to_prop(kind, params[k])
        if p is not None:
            props[k] = p
    return cls.create(operands=list(operands), result_types=[tensor_type(shape, dtype)],
                      properties=props)


OPS: dict[str, type] = {}


def _register(cls):
    cls = irdl_op_definition(cls)
    OPS[cls.name] = cls
    return cls


def _define(opname: str, summary: str, example: str, family: str, fields: dict,
            fmt: str, infer: Callable, params: dict | None = None, pure: bool = True):
    doc = f"{summary}\n\nExample:\n\n    {example}\n"
    body = dict(fields)
    body.update({
        "name": f"rlx.{opname}",
        "__doc__": doc,
        "__module__": __name__,
        "__annotations__": {"FAMILY": ClassVar[str], "PARAMS": ClassVar[dict]},
        "FAMILY": family,
        "PARAMS": dict(params or {}),
        "infer": staticmethod(infer),
        "assembly_format": fmt,
    })
    for k, kind in (params or {}).items():
        body[k] = _PARAM_KINDS[kind]()
    if pure:
        body["traits"] = traits_def(Pure())
    clsname = "".join(p.capitalize() for p in opname.split("_")) + "Op"
    return _register(type(clsname, (RlxOp,), body))


def _sig(t):
    return shape_of(t), dtype_of(t)


# ---------------------------------------------------------------- constants

def _infer_constant(types, **_):
    raise AssertionError("constants carry their type")


@_register
class ConstantOp(RlxOp):
    """A dense constant tensor (splats are stored once).

    Example:

        %c = rlx.constant dense<[1.0, 2.0]> : tensor<2xf32>
    """

    name = "rlx.constant"
    FAMILY: ClassVar[str] = "constant"
    _T: ClassVar = VarConstraint("T", AnyAttr())
    value = prop_def(ParamAttrConstraint(DenseIntOrFPElementsAttr, (_T, AnyAttr())))
    result = result_def(_T)
    traits = traits_def(Pure())

    def verify_(self) -> None:
        pass

    def params(self) -> dict:
        return {}

    def print(self, printer) -> None:
        """`rlx.constant dense<...> : type`. Non-finite or large float constants use
        MLIR's hex form `dense<"0x...">` (raw little-endian bytes): exact for inf/NaN,
        and fast to print and parse."""
        vals = dense_value(self.value)
        if vals.dtype.kind == "f" and (vals.size > 256 or not np.all(np.isfinite(vals))):
            printer.print_string(f' dense<"0x{self.value.data.data.hex().upper()}"> : ')
            printer.print_attribute(self.value.type)
        else:
            printer.print_string(" ")
            printer.print_attribute(self.value)
        if self.attributes:
            printer.print_op_attributes(self.attributes)

    @classmethod
    def parse(cls, parser) -> "ConstantOp":
        value = parser.parse_attribute()
        if not isinstance(value, DenseIntOrFPElementsAttr):
            parser.raise_error("rlx.constant expects a dense elements attribute")
        attrs = parser.parse_optional_attr_dict()
        value = dense_attr(dense_value(value), dtype_of(value.type))  # splats stored once
        return cls.create(result_types=[value.type], properties={"value": value},
                          attributes=attrs)


# ---------------------------------------------------------------- elementwise

def _same_float(opname):
    def infer(types, **_):
        (t,) = types
        if dtype_of(t) not in FLOAT_DTYPES:
            raise ShapeError(f"{opname}: expects a float tensor, got {dtype_of(t)}")
        return _sig(t)
    return infer


def _same_any(types, **_):
    (t,) = types
    return _sig(t)


def _binary_infer(opname):
    def infer(types, **_):
        a, b = types
        if shape_of(a) != shape_of(b) or dtype_of(a) != dtype_of(b):
            raise ShapeError(f"{opname}: operand types differ: {a} vs {b} "
                             "(the tracer inserts rlx.broadcast_to)")
        return _sig(a)
    return infer


def _compare_infer(opname):
    def infer(types, **_):
        a, b = types
        if shape_of(a) != shape_of(b) or dtype_of(a) != dtype_of(b):
            raise ShapeError(f"{opname}: operand types differ: {a} vs {b}")
        return shape_of(a), "i1"
    return infer


UNARY = {
    "neg": "negation, -x",
    "exp": "e to the x",
    "log": "natural logarithm",
    "sqrt": "square root",
    "rsqrt": "1/sqrt(x)",
    "tanh": "hyperbolic tangent",
    "sigmoid": "logistic 1/(1+exp(-x))",
    "relu": "max(x, 0)",
    "gelu": "GELU, erf form: 0.5x(1+erf(x/sqrt 2))",
    "gelu_tanh": "GELU, tanh approximation",
    "silu": "x*sigmoid(x)",
    "softplus": "log(1+exp(x)), computed stably",
    "abs": "absolute value",
    "sin": "sine",
    "cos": "cosine",
    "sign": "sign: -1, 0 or 1 (NaN stays NaN)",
    "reciprocal": "1/x",
    "erf": "the error function",
    "stop_gradient": "identity whose derivative is zero",
}
BINARY = {
    "add": "a + b", "sub": "a - b", "mul": "a * b", "div": "a / b",
    "pow": "a ** b", "maximum": "elementwise max (NaN propagates)",
    "minimum": "elementwise min (NaN propagates)",
}
COMPARE = {"eq": "a == b", "ne": "a != b", "lt": "a < b", "le": "a <= b",
           "gt": "a > b", "ge": "a >= b"}

for _n, _s in UNARY.items():
    _T = VarConstraint("T", AnyAttr())
    _define(_n, f"Elementwise {_s}.", f"%y = rlx.{_n} %x : tensor<4xf32>", "unary",
            {"input": operand_def(_T), "result": result_def(_T)},
            "$input attr-dict `:` type($result)",
            _same_float(_n) if _n != "stop_gradient" else _same_any)

for _n, _s in BINARY.items():
    _T = VarConstraint("T", AnyAttr())
    _define(_n, f"Elementwise {_s}; operands share one type.",
            f"%z = rlx.{_n} %x, %y : tensor<4x3xf32>", "binary",
            {"lhs": operand_def(_T), "rhs": operand_def(_T), "result": result_def(_T)},
            "$lhs `,` $rhs attr-dict `:` type($result)", _binary_infer(_n))

for _n, _s in COMPARE.items():
    _T = VarConstraint("T", AnyAttr())
    _define(_n, f"Elementwise comparison {_s}, giving an i1 mask.",
            f"%m = rlx.{_n} %x, %y : tensor<4xf32> -> tensor<4xi1>", "compare",
            {"lhs": operand_def(_T), "rhs": operand_def(_T), "result": result_def(TensorType)},
            "$lhs `,` $rhs attr-dict `:` type($lhs) `->` type($result)", _compare_infer(_n))


def _infer_select(types, **_):
    c, a, b = types
    if dtype_of(c) != "i1":
        raise ShapeError(f"select: condition must be i1, got {dtype_of(c)}")
    if not (shape_of(c) == shape_of(a) == shape_of(b)) or dtype_of(a) != dtype_of(b):
        raise ShapeError(f"select: types differ: {c}, {a}, {b}")
    return _sig(a)


_T = VarConstraint("T", AnyAttr())
SelectOp = _define(
    "select", "Elementwise where(cond, a, b).",
    "%z = rlx.select %m, %x, %y : tensor<4xi1>, tensor<4xf32>", "select",
    {"cond": operand_def(TensorType), "on_true": operand_def(_T), "on_false": operand_def(_T),
     "result": result_def(_T)},
    "$cond `,` $on_true `,` $on_false attr-dict `:` type($cond) `,` type($result)", _infer_select)


def _infer_fake_quant(types, exp_bits, man_bits, max_normal):
    (t,) = types
    if dtype_of(t) not in FLOAT_DTYPES:
        raise ShapeError(f"fake_quant: expects a float tensor, got {dtype_of(t)}")
    if exp_bits < 1 or man_bits < 0 or not max_normal > 0:
        raise ShapeError(f"fake_quant: bad format e{exp_bits}m{man_bits} max {max_normal}")
    return _sig(t)


_T = VarConstraint("T", AnyAttr())
FakeQuantOp = _define(
    "fake_quant",
    "Round to a low-precision float grid (round to nearest even, subnormals, saturating); "
    "straight-through gradient.",
    "%q = rlx.fake_quant %w exp = 4 man = 3 max = 4.480000e+02 : tensor<8xf32>", "unary",
    {"input": operand_def(_T), "result": result_def(_T)},
    "$input `exp` `=` $exp_bits `man` `=` $man_bits `max` `=` $max_normal attr-dict `:` type($result)",
    _infer_fake_quant, {"exp_bits": "int", "man_bits": "int", "max_normal": "float"})


# ---------------------------------------------------------------- reductions

def normalize_axes(axes, rank: int, what: str) -> tuple[int, ...]:
    if axes is None:
        return tuple(range(rank))
    if isinstance(axes, int):
        axes = (axes,)
    out = []
    for a in axes:
        a = int(a)
        if not -rank <= a < rank:
            raise ShapeError(f"{what}: axis {a} out of range for rank {rank}")
        out.append(a % rank)
    if len(set(out)) != len(out):
        raise ShapeError(f"{what}: repeated axis in {tuple(axes)}")
    return tuple(sorted(out))


def _reduce_infer(opname):
    def infer(types, axes, keepdims):
        (t,) = types
        shp = shape_of(t)
        ax = normalize_axes(axes, len(shp), opname)
        if tuple(axes) != ax:
            raise ShapeError(f"{opname}: axes must be sorted and non-negative, got {tuple(axes)}")
        if opname in ("max", "min") and any(shp[a] == 0 for a in ax):
            raise ShapeError(f"{opname}: reduction over an empty axis of {shp}")
        if keepdims:
            out = tuple(1 if i in ax else d for i, d in enumerate(shp))
        else:
            out = tuple(d for i, d in enumerate(shp) if i not in ax)
        return out, dtype_of(t)
    return infer


REDUCE = {"sum": "sum", "mean": "mean", "max": "maximum", "min": "minimum", "prod": "product"}
for _n, _s in REDUCE.items():
    _define(_n, f"Reduce by {_s} over `axes` (sorted), optionally keeping them as size 1.",
            f"%s = rlx.{_n} %x axes = [1] keepdims : tensor<4x3xf32> -> tensor<4x1xf32>",
            "reduce", {"input": operand_def(TensorType), "result": result_def(TensorType)},
            "$input `axes` `=` $axes (`keepdims` $keepdims^)? attr-dict `:` type($input) `->` "
            "type($result)", _reduce_infer(_n), {"axes": "ints", "keepdims": "flag"})


# ---------------------------------------------------------------- linear algebra

def _infer_matmul(types, **_):
    a, b = types
    sa, sb = shape_of(a), shape_of(b)
    if len(sa) < 2 or len(sb) < 2:
        raise ShapeError(f"matmul: {sa} @ {sb}: operands need rank >= 2 "
                         "(the tracer reshapes vectors)")
    if sa[-1] != sb[-2]:
        raise ShapeError(f"matmul: {sa} @ {sb}: inner dimensions {sa[-1]} != {sb[-2]}")
    if dtype_of(a) != dtype_of(b):
        raise ShapeError(f"matmul: dtypes differ: {dtype_of(a)} vs {dtype_of(b)}")
    batch = broadcast_shapes(sa[:-2], sb[:-2], f"matmul: {sa} @ {sb}: batch dims")
    return batch + (sa[-2], sb[-1]), dtype_of(a)


MatmulOp = _define(
    "matmul", "Matrix product with NumPy semantics: batched, batch dims broadcast.",
    "%c = rlx.matmul %a, %b : tensor<8x4xf32>, tensor<4x3xf32> -> tensor<8x3xf32>", "matmul",
    {"lhs": operand_def(TensorType), "rhs": operand_def(TensorType),
     "result": result_def(TensorType)},
    "$lhs `,` $rhs attr-dict `:` type($lhs) `,` type($rhs) `->` type($result)", _infer_matmul)


# ---------------------------------------------------------------- shape ops

def _infer_transpose(types, perm):
    (t,) = types
    shp = shape_of(t)
    if sorted(perm) != list(range(len(shp))):
        raise ShapeError(f"transpose: {tuple(perm)} is not a permutation of rank {len(shp)}")
    return tuple(shp[p] for p in perm), dtype_of(t)


TransposeOp = _define(
    "transpose", "Permute dimensions: result dim i is input dim perm[i].",
    "%t = rlx.transpose %x perm = [1, 0] : tensor<4x3xf32> -> tensor<3x4xf32>", "shape",
    {"input": operand_def(TensorType), "result": result_def(TensorType)},
    "$input `perm` `=` $perm attr-dict `:` type($input) `->` type($result)",
    _infer_transpose, {"perm": "ints"})


def _infer_reshape(types, shape):
    (t,) = types
    if numel(shape) != numel(shape_of(t)) or any(d < 0 for d in shape):
        raise ShapeError(f"reshape: cannot reshape {shape_of(t)} to {tuple(shape)}")
    return tuple(shape), dtype_of(t)


ReshapeOp = _define(
    "reshape", "Same elements in row-major order, new shape (also expand_dims/squeeze).",
    "%r = rlx.reshape %x shape = [12] : tensor<4x3xf32> -> tensor<12xf32>", "shape",
    {"input": operand_def(TensorType), "result": result_def(TensorType)},
    "$input `shape` `=` $shape attr-dict `:` type($input) `->` type($result)",
    _infer_reshape, {"shape": "ints"})


def _infer_broadcast(types, shape):
    (t,) = types
    shp = shape_of(t)
    try:
        out = broadcast_shapes(shp, shape, "broadcast_to")
    except ShapeError:
        out = None
    if out != tuple(shape):
        raise ShapeError(f"broadcast_to: cannot broadcast {shp} to {tuple(shape)}")
    return tuple(shape), dtype_of(t)


BroadcastToOp = _define(
    "broadcast_to", "NumPy broadcast to `shape` (dims aligned on the right).",
    "%b = rlx.broadcast_to %x shape = [4, 3] : tensor<3xf32> -> tensor<4x3xf32>", "shape",
    {"input": operand_def(TensorType), "result": result_def(TensorType)},
    "$input `shape` `=` $shape attr-dict `:` type($input) `->` type($result)",
    _infer_broadcast, {"shape": "ints"})


def _infer_slice(types, starts, limits, strides):
    (t,) = types
    shp = shape_of(t)
    if not (len(starts) == len(limits) == len(strides) == len(shp)):
        raise ShapeError(f"slice: starts/limits/strides need {len(shp)} entries each")
    out = []
    for d, s, l, st in zip(shp, starts, limits, strides):
        if st < 1 or not 0 <= s <= l <= d:
            raise ShapeError(f"slice: [{s}:{l}:{st}] out of range for dim {d} of {shp}")
        out.append((l - s + st - 1) // st)
    return tuple(out), dtype_of(t)


SliceOp = _define(
    "slice", "Strided window x[starts:limits:strides] per dim (narrow is a slice).",
    "%s = rlx.slice %x starts = [0, 1] limits = [4, 3] strides = [1, 1] : "
    "tensor<4x3xf32> -> tensor<4x2xf32>", "shape",
    {"input": operand_def(TensorType), "result": result_def(TensorType)},
    "$input `starts` `=` $starts `limits` `=` $limits `strides` `=` $strides attr-dict `:` "
    "type($input) `->` type($result)", _infer_slice,
    {"starts": "ints", "limits": "ints", "strides": "ints"})


def _infer_pad(types, low, high):
    (t,) = types
    shp = shape_of(t)
    if not (len(low) == len(high) == len(shp)) or min(low + high, default=0) < 0:
        raise ShapeError(f"pad: low/high need {len(shp)} non-negative entries")
    return tuple(d + a + b for d, a, b in zip(shp, low, high)), dtype_of(t)


PadOp = _define(
    "pad", "Zero padding: `low[i]` zeros before and `high[i]` after dim i "
    "(the transpose of slice with unit strides).",
    "%p = rlx.pad %x low = [0, 1] high = [0, 0] : tensor<4x2xf32> -> tensor<4x3xf32>", "shape",
    {"input": operand_def(TensorType), "result": result_def(TensorType)},
    "$input `low` `=` $low `high` `=` $high attr-dict `:` type($input) `->` type($result)",
    _infer_pad, {"low": "ints", "high": "ints"})


def _infer_concat(types, axis):
    if not types:
        raise ShapeError("concat: needs at least one tensor")
    s0 = shape_of(types[0])
    if not 0 <= axis < len(s0):
        raise ShapeError(f"concat: axis {axis} out of range for rank {len(s0)}")
    total = 0
    for t in types:
        s = shape_of(t)
        if len(s) != len(s0) or any(a != b for i, (a, b) in enumerate(zip(s, s0)) if i != axis) \
                or dtype_of(t) != dtype_of(types[0]):
            raise ShapeError(f"concat: {s} does not match {s0} outside axis {axis}")
        total += s[axis]
    return s0[:axis] + (total,) + s0[axis + 1:], dtype_of(types[0])


ConcatOp = _define(
    "concat", "Join tensors along `axis`.",
    "%c = rlx.concat %a, %b axis = 0 : (tensor<2xf32>, tensor<3xf32>) -> tensor<5xf32>",
    "variadic", {"inputs": var_operand_def(TensorType), "result": result_def(TensorType)},
    "$inputs `axis` `=` $axis attr-dict `:` `(` type($inputs) `)` `->` type($result)",
    _infer_concat, {"axis": "int"})


def _infer_gather(types, axis):
    table, idx = types
    st, si = shape_of(table), shape_of(idx)
    if not 0 <= axis < len(st):
        raise ShapeError(f"gather: axis {axis} out of range for table {st}")
    if dtype_of(idx) not in INT_DTYPES:
        raise ShapeError(f"gather: indices must be i32 or i64, got {dtype_of(idx)}")
    return st[:axis] + si + st[axis + 1:], dtype_of(table)


GatherOp = _define(
    "gather", "Take slices of `table` along `axis` at integer `indices` "
    "(index_select, embedding lookup).",
    "%e = rlx.gather %table[%ids] axis = 0 : tensor<100x16xf32>, tensor<8xi32> -> "
    "tensor<8x16xf32>", "gather",
    {"table": operand_def(TensorType), "indices": operand_def(TensorType),
     "result": result_def(TensorType)},
    "$table `[` $indices `]` `axis` `=` $axis attr-dict `:` type($table) `,` type($indices) "
    "`->` type($result)", _infer_gather, {"axis": "int"})


def _infer_scatter_add(types, axis, dim):
    idx, upd = types
    si, su = shape_of(idx), shape_of(upd)
    if dtype_of(idx) not in INT_DTYPES:
        raise ShapeError(f"scatter_add: indices must be i32 or i64, got {dtype_of(idx)}")
    n = len(si)
    if not 0 <= axis <= len(su) - n or su[axis:axis + n] != si:
        raise ShapeError(f"scatter_add: updates {su} do not hold indices {si} at axis {axis}")
    return su[:axis] + (dim,) + su[axis + n:], dtype_of(upd)


ScatterAddOp = _define(
    "scatter_add", "Zeros of the result shape with `updates` added at `indices` along `axis` "
    "(the transpose of gather).",
    "%g = rlx.scatter_add %ids, %upd axis = 0 dim = 100 : tensor<8xi32>, tensor<8x16xf32> -> "
    "tensor<100x16xf32>", "gather",
    {"indices": operand_def(TensorType), "updates": operand_def(TensorType),
     "result": result_def(TensorType)},
    "$indices `,` $updates `axis` `=` $axis `dim` `=` $dim attr-dict `:` type($indices) `,` "
    "type($updates) `->` type($result)", _infer_scatter_add, {"axis": "int", "dim": "int"})


def _infer_cast(types, **_):
    raise AssertionError("cast carries its result type")


@_register
class CastOp(RlxOp):
    """Convert element type (f32, f64, i1, i32, i64); float to int truncates toward zero.

    Example:

        %f = rlx.cast %m : tensor<4xi1> -> tensor<4xf32>
    """

    name = "rlx.cast"
    FAMILY: ClassVar[str] = "cast"
    input = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    @staticmethod
    def infer(types, dtype):
        return shape_of(types[0]), dtype

    def params(self) -> dict:
        return {"dtype": dtype_of(self.results[0].type)}


RLX = Dialect("rlx", list(OPS.values()), [])


def op_class(name: str):
    """The op class for `rlx.NAME` or `NAME`; unknown names list the valid ones."""
    key = name if name.startswith("rlx.") else f"rlx.{name}"
    try:
        return OPS[key]
    except KeyError:
        raise KeyError(f"unknown op {name!r}; valid: {', '.join(sorted(OPS))}") from None

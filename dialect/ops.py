"""The rlx dialect: every op, declared in one place.

Each op has a one-line summary, an MLIR example, a custom assembly format and a
verifier. Verification and the tracer share one shape function per op
(`infer(operand_types, **params) -> (shape, dtype)`, in dialect/shapes.py with
the op's family and parameter kinds, free of xDSL so that tracing needs none),
so a graph the tracer builds is exactly what the verifier accepts.

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
and lowering tables register rules for whole families via `FAMILY`.  The
properties lowering reads (cost, dtypes, math kernel, ...) sit on the op's
entry in shapes.py (`SHAPES[name]`, also `cls.PROPS`).
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
    StringAttr,
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

from .shapes import (  # noqa: F401  (BINARY..REDUCE, normalize_axes: re-exported)
    BINARY,
    COMPARE,
    REDUCE,
    SHAPES,
    UNARY,
    check_u32,
    ShapeError,
    normalize_axes,
)
from .symdims import DYN
from .types import dense_attr, dense_value, hex_form, dtype_of, shape_of, tensor_type, ttype

# How each kind of op parameter is stored as an xDSL property.
_PARAM_KINDS = {
    "ints": lambda: prop_def(DenseArrayBase.constr(i64)),
    "int": lambda: prop_def(IntegerAttr[i64]),
    "float": lambda: prop_def(FloatAttr),
    "flag": lambda: opt_prop_def(UnitAttr),
    "str": lambda: opt_prop_def(StringAttr),
}


def _to_prop(kind: str, value):
    if kind == "ints":   # a symbolic dim is stored as DYN (-1); params() reads it back
        return DenseArrayBase.from_list(i64, [DYN if isinstance(v, str) else int(v)
                                              for v in value])
    if kind == "int":
        return IntegerAttr(DYN if isinstance(value, str) else int(value), i64)
    if kind == "float":
        return FloatAttr(float(value), f64)
    if kind == "flag":
        return UnitAttr() if value else None
    if kind == "str":
        return StringAttr(str(value)) if value else None
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
    if kind == "str":
        return attr.data if attr is not None else ""
    raise KeyError(kind)


class RlxOp(IRDLOperation):
    """Shared behaviour of rlx ops: typed parameters and shape verification."""

    FAMILY: ClassVar[str] = ""
    PARAMS: ClassVar[dict] = {}
    PROPS: ClassVar = None     # the op's entry in shapes.SHAPES (family, properties)

    @staticmethod
    def infer(types, **params):  # pragma: no cover - every op overrides
        raise NotImplementedError

    def params(self) -> dict:
        """This op's parameters as plain Python values (tuples, ints, floats, bools); a
        symbolic dim stored as DYN reads back as its symbol (symdims.FILL)."""
        p = {k: _from_prop(kind, self.properties.get(k)) for k, kind in self.PARAMS.items()}
        fill = FILL.get(self.name)
        return fill(self, p) if fill is not None else p

    def verify_(self) -> None:
        types = [o.type for o in self.operands]
        try:
            check_u32(self.name, [dtype_of(t) for t in types])
            shape, dtype = self.infer(types, **self.params())
        except (ShapeError, TypeError) as e:
            raise VerifyException(str(e)) from e
        want = tensor_type(shape, dtype)
        got = self.results[0].type
        if want != got:
            raise VerifyException(f"{self.name}: result type should be {want}, got {got}")


def make_op(cls, operands, **params):
    """Build an op of class `cls`, inferring its result type (the passes' entry point)."""
    types = [o.type for o in operands]
    shape, dtype = cls.infer(types, **params)
    return create_op(cls, operands, tensor_type(shape, dtype), **params)


def create_op(cls, operands, result_type, **params):
    """Build an op of class `cls` with a known result type (not checked: verify does)."""
    props = {}
    for k, kind in cls.PARAMS.items():
        p = _to_prop(kind, params[k] if k in params or kind != "str" else "")
        if p is not None:
            props[k] = p
    return cls.create(operands=list(operands), result_types=[result_type], properties=props)


OPS: dict[str, type] = {}


# -- op parameters that hold dimensions: a symbol is stored as DYN and read back here,
# from the op's own types (the result of a reshape/broadcast_to is its target shape; a
# dynamic dim is only sliced whole, so its limit is the operand's dim) --------------

def _fill_from(key: str, src):
    def fill(op, p):
        v = p[key]
        if DYN not in v:
            return p
        return {**p, key: tuple(s if d == DYN else d for d, s in zip(v, src(op)))}
    return fill


def _fill_scatter_dim(op, p):
    if p["dim"] != DYN:
        return p
    return {**p, "dim": shape_of(op.results[0].type)[p["axis"]]}


FILL = {
    "rlx.reshape": _fill_from("shape", lambda op: shape_of(op.results[0].type)),
    "rlx.broadcast_to": _fill_from("shape", lambda op: shape_of(op.results[0].type)),
    "rlx.slice": _fill_from("limits", lambda op: shape_of(op.operands[0].type)),
    "rlx.scatter_add": _fill_scatter_dim,
    "rlx.iota": lambda op, p: {**p, "size": shape_of(op.results[0].type)[0]}
    if p["size"] == DYN else p,
}


def _register(cls):
    cls = irdl_op_definition(cls)
    OPS[cls.name] = cls
    return cls


def _on_xdsl(infer: Callable) -> Callable:
    """The op's shape function (dialect/shapes.py), called with xDSL types or values."""
    def on_types(types, **params):
        return infer([ttype(t) for t in types], **params)
    on_types.__doc__ = infer.__doc__
    return on_types


def _define(opname: str, summary: str, example: str, fields: dict, fmt: str,
            pure: bool = True):
    """Declare `rlx.OPNAME`; its family, parameters and shape function come from SHAPES."""
    shape = SHAPES[f"rlx.{opname}"]
    doc = f"{summary}\n\nExample:\n\n    {example}\n"
    body = dict(fields)
    body.update({
        "name": f"rlx.{opname}",
        "__doc__": doc,
        "__module__": __name__,
        "__annotations__": {"FAMILY": ClassVar[str], "PARAMS": ClassVar[dict],
                            "PROPS": ClassVar[object]},
        "FAMILY": shape.family,
        "PARAMS": dict(shape.params),
        "PROPS": shape,
        "infer": staticmethod(_on_xdsl(shape.infer)),
    })
    for k, kind in shape.params.items():
        body[k] = _PARAM_KINDS[kind]()
    if pure:
        body["traits"] = traits_def(Pure())
    clsname = "".join(p.capitalize() for p in opname.split("_")) + "Op"
    return _lazy_format(_register(type(clsname, (RlxOp,), body)), fmt)


def _lazy_format(cls, fmt: str):
    """Give `cls` the declarative assembly format `fmt`, parsed on its first print or
    parse (as xDSL's `assembly_format` would, but not at import: parsing every op's
    format took ~25 ms of each cold compile, which prints a few kinds of op).
    `format_program(cls)` parses it now (a test checks every op's)."""
    op_def = cls.get_irdl_definition()
    op_def.assembly_format = fmt
    cls.assembly_format = fmt

    @classmethod
    def parse(c, parser):
        return format_program(c).parse(parser, c)

    def print_(self, printer):
        return format_program(type(self)).print(printer, self)

    cls.parse, cls.print = parse, print_
    return cls


def format_program(cls):
    """The parsed assembly format of op class `cls` (cached on the class)."""
    prog = cls.__dict__.get("_format_program")
    if prog is None:
        from xdsl.irdl.declarative_assembly_format import FormatProgram

        prog = FormatProgram.from_str(cls.assembly_format, cls.get_irdl_definition())
        cls._format_program = prog
    return prog


# ---------------------------------------------------------------- constants

@_register
class ConstantOp(RlxOp):
    """A dense constant tensor (splats are stored once).

    Example:

        %c = rlx.constant dense<[1.0, 2.0]> : tensor<2xf32>
    """

    name = "rlx.constant"
    FAMILY: ClassVar[str] = "constant"
    PROPS: ClassVar = SHAPES["rlx.constant"]
    _T: ClassVar = VarConstraint("T", AnyAttr())
    value = prop_def(ParamAttrConstraint(DenseIntOrFPElementsAttr, (_T, AnyAttr())))
    result = result_def(_T)
    traits = traits_def(Pure())

    def verify_(self) -> None:
        pass

    def params(self) -> dict:
        return {}

    def print(self, printer) -> None:
        """`rlx.constant dense<...> : type`. Non-finite, large or xDSL-ambiguous float
        constants use MLIR's hex form `dense<"0x...">` (raw little-endian bytes; types.
        hex_form): exact for inf/NaN, and fast to print and parse."""
        if hex_form(dense_value(self.value)):
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

for _n, _s in UNARY.items():
    _T = VarConstraint("T", AnyAttr())
    _define(_n, f"Elementwise {_s}.", f"%y = rlx.{_n} %x : tensor<4xf32>",
            {"input": operand_def(_T), "result": result_def(_T)},
            "$input attr-dict `:` type($result)")

for _n, _s in BINARY.items():
    _T = VarConstraint("T", AnyAttr())
    _define(_n, f"Elementwise {_s}; operands share one type.",
            f"%z = rlx.{_n} %x, %y : tensor<4x3xf32>",
            {"lhs": operand_def(_T), "rhs": operand_def(_T), "result": result_def(_T)},
            "$lhs `,` $rhs attr-dict `:` type($result)")

for _n, _s in COMPARE.items():
    _T = VarConstraint("T", AnyAttr())
    _define(_n, f"Elementwise comparison {_s}, giving an i1 mask.",
            f"%m = rlx.{_n} %x, %y : tensor<4xf32> -> tensor<4xi1>",
            {"lhs": operand_def(_T), "rhs": operand_def(_T), "result": result_def(TensorType)},
            "$lhs `,` $rhs attr-dict `:` type($lhs) `->` type($result)")


_T = VarConstraint("T", AnyAttr())
SelectOp = _define(
    "select", "Elementwise where(cond, a, b).",
    "%z = rlx.select %m, %x, %y : tensor<4xi1>, tensor<4xf32>",
    {"cond": operand_def(TensorType), "on_true": operand_def(_T), "on_false": operand_def(_T),
     "result": result_def(_T)},
    "$cond `,` $on_true `,` $on_false attr-dict `:` type($cond) `,` type($result)")


_T = VarConstraint("T", AnyAttr())
FakeQuantOp = _define(
    "fake_quant",
    "Round to a low-precision float grid (round to nearest even, subnormals, saturating); "
    "straight-through gradient.",
    "%q = rlx.fake_quant %w exp = 4 man = 3 max = 4.480000e+02 : tensor<8xf32>",
    {"input": operand_def(_T), "result": result_def(_T)},
    "$input `exp` `=` $exp_bits `man` `=` $man_bits `max` `=` $max_normal attr-dict `:` type($result)")


# ---------------------------------------------------------------- reductions

for _n, _s in REDUCE.items():
    _define(_n, f"Reduce by {_s} over `axes` (sorted), optionally keeping them as size 1.",
            f"%s = rlx.{_n} %x axes = [1] keepdims : tensor<4x3xf32> -> tensor<4x1xf32>",
            {"input": operand_def(TensorType), "result": result_def(TensorType)},
            "$input `axes` `=` $axes (`keepdims` $keepdims^)? attr-dict `:` type($input) `->` "
            "type($result)")


# ---------------------------------------------------------------- linear algebra

MatmulOp = _define(
    "matmul", "Matrix product with NumPy semantics: batched, batch dims broadcast.",
    "%c = rlx.matmul %a, %b : tensor<8x4xf32>, tensor<4x3xf32> -> tensor<8x3xf32>",
    {"lhs": operand_def(TensorType), "rhs": operand_def(TensorType),
     "result": result_def(TensorType)},
    "$lhs `,` $rhs attr-dict `:` type($lhs) `,` type($rhs) `->` type($result)")


# ---------------------------------------------------------------- shape ops

TransposeOp = _define(
    "transpose", "Permute dimensions: result dim i is input dim perm[i].",
    "%t = rlx.transpose %x perm = [1, 0] : tensor<4x3xf32> -> tensor<3x4xf32>",
    {"input": operand_def(TensorType), "result": result_def(TensorType)},
    "$input `perm` `=` $perm attr-dict `:` type($input) `->` type($result)")

ReshapeOp = _define(
    "reshape", "Same elements in row-major order, new shape (also expand_dims/squeeze).",
    "%r = rlx.reshape %x shape = [12] : tensor<4x3xf32> -> tensor<12xf32>",
    {"input": operand_def(TensorType), "result": result_def(TensorType)},
    "$input `shape` `=` $shape attr-dict `:` type($input) `->` type($result)")

BroadcastToOp = _define(
    "broadcast_to", "NumPy broadcast to `shape` (dims aligned on the right).",
    "%b = rlx.broadcast_to %x shape = [4, 3] : tensor<3xf32> -> tensor<4x3xf32>",
    {"input": operand_def(TensorType), "result": result_def(TensorType)},
    "$input `shape` `=` $shape attr-dict `:` type($input) `->` type($result)")

SliceOp = _define(
    "slice", "Strided window x[starts:limits:strides] per dim (narrow is a slice).",
    "%s = rlx.slice %x starts = [0, 1] limits = [4, 3] strides = [1, 1] : "
    "tensor<4x3xf32> -> tensor<4x2xf32>",
    {"input": operand_def(TensorType), "result": result_def(TensorType)},
    "$input `starts` `=` $starts `limits` `=` $limits `strides` `=` $strides attr-dict `:` "
    "type($input) `->` type($result)")

PadOp = _define(
    "pad", "Zero padding: `low[i]` zeros before and `high[i]` after dim i "
    "(the transpose of slice with unit strides).",
    "%p = rlx.pad %x low = [0, 1] high = [0, 0] : tensor<4x2xf32> -> tensor<4x3xf32>",
    {"input": operand_def(TensorType), "result": result_def(TensorType)},
    "$input `low` `=` $low `high` `=` $high attr-dict `:` type($input) `->` type($result)")

ConcatOp = _define(
    "concat", "Join tensors along `axis`.",
    "%c = rlx.concat %a, %b axis = 0 : (tensor<2xf32>, tensor<3xf32>) -> tensor<5xf32>",
    {"inputs": var_operand_def(TensorType), "result": result_def(TensorType)},
    "$inputs `axis` `=` $axis attr-dict `:` `(` type($inputs) `)` `->` type($result)")

GatherOp = _define(
    "gather", "Take slices of `table` along `axis` at integer `indices` "
    "(index_select, embedding lookup).",
    "%e = rlx.gather %table[%ids] axis = 0 : tensor<100x16xf32>, tensor<8xi32> -> "
    "tensor<8x16xf32>",
    {"table": operand_def(TensorType), "indices": operand_def(TensorType),
     "result": result_def(TensorType)},
    "$table `[` $indices `]` `axis` `=` $axis (`label` $label^)? attr-dict `:` type($table) `,` "
    "type($indices) `->` type($result)")

ScatterAddOp = _define(
    "scatter_add", "Zeros of the result shape with `updates` added at `indices` along `axis` "
    "(the transpose of gather).",
    "%g = rlx.scatter_add %ids, %upd axis = 0 dim = 100 : tensor<8xi32>, tensor<8x16xf32> -> "
    "tensor<100x16xf32>",
    {"indices": operand_def(TensorType), "updates": operand_def(TensorType),
     "result": result_def(TensorType)},
    "$indices `,` $updates `axis` `=` $axis `dim` `=` $dim (`label` $label^)? attr-dict `:` "
    "type($indices) `,` type($updates) `->` type($result)")


@_register
class CastOp(RlxOp):
    """Convert element type (f32, f64, i1, i32, i64); float to int truncates toward zero.

    Example:

        %f = rlx.cast %m : tensor<4xi1> -> tensor<4xf32>
    """

    name = "rlx.cast"
    FAMILY: ClassVar[str] = "cast"
    PROPS: ClassVar = SHAPES["rlx.cast"]
    input = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    infer = staticmethod(_on_xdsl(SHAPES["rlx.cast"].infer))

    def params(self) -> dict:
        return {"dtype": dtype_of(self.results[0].type)}


PhiloxOp = _define(
    "philox", "Counter-based random draws: element i is word `word` of the Philox-4x32-10 "
    "block with key (key0[i], key1[i]) and counter (counter[i], stream, 0, 0), as a uniform "
    "f32 in [0, 1) (the top 24 bits times 2**-24); rlxc.random builds on it.",
    "%u = rlx.philox %k0, %k1, %ctr word = 0 stream = 0 : tensor<8xui32>, tensor<8xui32>, "
    "tensor<8xi32> -> tensor<8xf32>",
    {"key0": operand_def(TensorType), "key1": operand_def(TensorType),
     "counter": operand_def(TensorType), "result": result_def(TensorType)},
    "$key0 `,` $key1 `,` $counter `word` `=` $word `stream` `=` $stream attr-dict `:` "
    "type($key0) `,` type($key1) `,` type($counter) `->` type($result)")
# ---------------------------------------------------------------- convolution (dialect/conv_shapes.py)

for _n, _s in {
        "conv2d": ("2-D convolution, NCHW input, (O, C/groups, kH, kW) weight; padding is "
                   "(top, bottom, left, right)",
                   "%y = rlx.conv2d %x, %w stride = array<i64: 1, 1> padding = array<i64: 0, 0, 0, 0> "
                   "dilation = array<i64: 1, 1> groups = 1 : tensor<2x3x8x8xf32>, "
                   "tensor<4x3x3x3xf32> -> tensor<2x4x6x6xf32>"),
        "conv_transpose2d": ("Transposed 2-D convolution (the adjoint of conv2d in its input), "
                             "weight (C_in, C_out/groups, kH, kW)",
                             "%x = rlx.conv_transpose2d %y, %w ... output_padding = "
                             "array<i64: 0, 0> : tensor<2x4x6x6xf32>, tensor<4x3x3x3xf32> -> "
                             "tensor<2x3x8x8xf32>"),
        "conv2d_filter_grad": ("The adjoint of conv2d in its weight: dw from input x and output "
                               "gradient dy",
                               "%dw = rlx.conv2d_filter_grad %x, %dy ... kernel = "
                               "array<i64: 3, 3> : tensor<2x3x8x8xf32>, tensor<2x4x6x6xf32> -> "
                               "tensor<4x3x3x3xf32>")}.items():
    _params = " ".join(f"`{k}` `=` ${k}" for k in SHAPES[f"rlx.{_n}"].params)
    _define(_n, _s[0] + ".", _s[1],
            {"lhs": operand_def(TensorType), "rhs": operand_def(TensorType),
             "result": result_def(TensorType)},
            f"$lhs `,` $rhs {_params} attr-dict `:` type($lhs) `,` type($rhs) `->` type($result)")
# ---------------------------------------------------------------- attention (dialect/attention.py)

AttentionOp = _define(
    "attention", "softmax(mask(softcap(scale * q k^T))) v over (B, H, S, D) tensors; a fully "
    "masked row gives zeros. Mask kinds: none, causal, sliding (window), tensor (4th operand).",
    "%o = rlx.attention %q, %k, %v scale = 1.250000e-01 softcap = 0.000000e+00 kind = \"causal\" "
    "window = 0 : (tensor<1x2x8x64xf32>, tensor<1x2x8x64xf32>, tensor<1x2x8x64xf32>) -> "
    "tensor<1x2x8x64xf32>",
    {"inputs": var_operand_def(TensorType), "result": result_def(TensorType)},
    "$inputs `scale` `=` $scale `softcap` `=` $softcap (`kind` `=` $kind^)? `window` `=` $window "
    "attr-dict `:` `(` type($inputs) `)` `->` type($result)")

# attention's fused backward (dialect/attention_bwd.py)
AttentionLseOp = _define(
    "attention_lse", "Per-row logsumexp of rlx.attention's masked scores, (B, H, Sq, 1); a "
    "fully masked row gives 0. Operands and params as rlx.attention.",
    "%l = rlx.attention_lse %q, %k, %v scale = 1.250000e-01 softcap = 0.000000e+00 kind = "
    "\"causal\" window = 0 : (tensor<1x2x8x64xf32>, tensor<1x2x8x64xf32>, "
    "tensor<1x2x8x64xf32>) -> tensor<1x2x8x1xf32>",
    {"inputs": var_operand_def(TensorType), "result": result_def(TensorType)},
    "$inputs `scale` `=` $scale `softcap` `=` $softcap (`kind` `=` $kind^)? `window` `=` $window "
    "attr-dict `:` `(` type($inputs) `)` `->` type($result)")
AttentionBwdOp = _define(
    "attention_bwd", "rlx.attention's gradients from q, k, v, o, dO, L [, mask]: [dq; dk; dv] "
    "stacked on axis 2, (B, H, Sq + 2 Sk, D), P recomputed from q, k and L.",
    "%g = rlx.attention_bwd %q, %k, %v, %o, %do, %l scale = 1.250000e-01 softcap = "
    "0.000000e+00 kind = \"causal\" window = 0 : (tensor<1x2x8x64xf32>, tensor<1x2x8x64xf32>, "
    "tensor<1x2x8x64xf32>, tensor<1x2x8x64xf32>, tensor<1x2x8x64xf32>, tensor<1x2x8x1xf32>) -> "
    "tensor<1x2x24x64xf32>",
    {"inputs": var_operand_def(TensorType), "result": result_def(TensorType)},
    "$inputs `scale` `=` $scale `softcap` `=` $softcap (`kind` `=` $kind^)? `window` `=` $window "
    "attr-dict `:` `(` type($inputs) `)` `->` type($result)")


from .control import CONTROL_OPS  # noqa: E402  (rlx.scan/while/if/yield: regions)
from .iota import IotaOp  # noqa: E402  (rlx.iota: dynamic modules only, dialect/iota.py)

SYMBOLIC_OPS = {IotaOp.name: IotaOp}   # dynamic modules only (specialize; dialect/iota.py)
RLX = Dialect("rlx", list(OPS.values()) + list(CONTROL_OPS.values()) + [IotaOp], [])


def op_class(name: str):
    """The op class for `rlx.NAME` or `NAME`; unknown names list the valid ones."""
    key = name if name.startswith("rlx.") else f"rlx.{name}"
    try:
        return OPS[key]
    except KeyError:
        raise KeyError(f"unknown op {name!r}; valid: {', '.join(sorted(OPS))}") from None


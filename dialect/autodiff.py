"""Reverse-mode autodiff over the rlx dialect: the `rlx-grad` and
`rlx-value-and-grad` passes.

    func(args) -> [loss, ...]      ==>      func(args) -> [(loss,) grads...]

Algorithm (one function, straight-line SSA):
1. Clone the module (the input is never mutated).
2. Activity: walking forward, a value is *active* when it is a float value
   computed from a `wrt` argument through differentiable ops (stop_gradient,
   comparisons, casts to/from integers and integer values cut the chain).
3. Seed the loss (output 0) with a ones constant of its shape, so a non-scalar
   loss differentiates sum(loss).
4. Walk the ops backward from the return. An op whose result holds a cotangent
   and that has an active operand dispatches into `VJP_RULES[op.name]`, which
   emits rlx ops (before the return, after the whole forward: the backward
   reads the forward SSA values and never recomputes them) and yields one
   cotangent per operand. Fan-out adds cotangents. A cotangent that is
   symbolically zero is `None` and never materialised; only ops reachable
   backward from the loss are visited, and an op there without a rule fails
   with "no VJP rule for rlx.X".
5. Return `[grads...]` (or `[loss, grads...]`) in `wrt` order; a wrt argument
   without a cotangent gets a zeros constant.

Rules emit only rlx ops through `Builder` / `V` (an SSA value with arithmetic
operators), so the backward graph is itself differentiable: grad(grad),
jvp(grad) (hvp) and vmap(grad) compose to any depth. Rules come from family
helpers (JAX's defvectorized / defbroadcasting / defreducer): an elementwise op
declares each operand's cotangent as one expression in (g, inputs, output);
those expressions are `g * partial`, so `dialect/jvp.py` reuses them as the
forward-mode rules with g := tangent.

Documented choices: maximum/minimum and the max/min reductions split the
cotangent evenly between ties (JAX's convention); prod uses a zero-safe form
(exact first derivatives with zeros present; second derivatives are exact only
away from zeros); fake_quant is straight-through; sign, floor, ceil, round, stop_gradient
and the comparisons have zero derivative (also at their jumps); d/dx x**z is 0
where z == 0, even at x = 0 (PyTorch/autograd); abs'(0) = sign(0) = 0 and
relu'(0) = 0 (README, "Derivatives at kinks"); casts between floats pass the cotangent
through a cast back, casts to or from integers give none.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from xdsl.context import Context
from xdsl.dialects import builtin, func
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from rlxc.runtime.errors import NameLookupError

from .module import get_func, outputs, signature
from .ops import OPS, UNARY, CastOp, ConstantOp, make_op
from .types import (
    FLOAT_DTYPES,
    BytesAttr,
    DenseIntOrFPElementsAttr,
    dense_bytes,
    dtype_of,
    numel,
    shape_of,
    tensor_type,
)
from .symdims import is_dynamic, is_sym


# ---------------------------------------------------------------- building

class V:
    """An SSA value of the graph being built; arithmetic and unary methods emit rlx ops."""

    __slots__ = ("b", "v")

    def __init__(self, b: "Builder", v):
        self.b, self.v = b, v

    @property
    def shape(self) -> tuple[int, ...]:
        return shape_of(self.v.type)

    @property
    def dtype(self) -> str:
        return dtype_of(self.v.type)

    def _bin(self, name, other, swap=False):
        o = other if isinstance(other, V) else self.b.full(other, self.shape, self.dtype)
        return self.b.op(name, o, self) if swap else self.b.op(name, self, o)

    def __add__(self, o): return self._bin("add", o)
    def __radd__(self, o): return self._bin("add", o, True)
    def __sub__(self, o): return self._bin("sub", o)
    def __rsub__(self, o): return self._bin("sub", o, True)
    def __mul__(self, o): return self._bin("mul", o)
    def __rmul__(self, o): return self._bin("mul", o, True)
    def __truediv__(self, o): return self._bin("div", o)
    def __rtruediv__(self, o): return self._bin("div", o, True)
    def __pow__(self, o): return self._bin("pow", o)
    def __neg__(self): return self.b.op("neg", self)

    def __getattr__(self, name):  # x.exp(), x.gt(y), x.maximum(y), ...
        if name in UNARY:
            return lambda: self.b.op(name, self)
        if name in ("eq", "ne", "lt", "le", "gt", "ge", "maximum", "minimum"):
            return lambda o: self._bin(name, o)
        raise AttributeError(name)


class Builder:
    """Emits rlx ops before a fixed anchor op (the function's return)."""

    def __init__(self, block, anchor):
        self.block, self.anchor = block, anchor
        self._consts: dict = {}

    def wrap(self, value) -> V:
        return V(self, value)

    def emit(self, cls, operands, **params) -> V:
        op = make_op(cls, [o.v for o in operands], **params)
        self.block.insert_op_before(op, self.anchor)
        return V(self, op.results[0])

    def op(self, name: str, *operands: V, **params) -> V:
        return self.emit(OPS[f"rlx.{name}"], operands, **params)

    def full(self, value, shape, dtype) -> V:
        """A splat constant (one per value, shape and dtype in this builder)."""
        shape = tuple(shape)
        key = (float(value), shape, dtype)
        hit = self._consts.get(key)
        if hit is None and is_dynamic(shape):   # a rank-0 constant broadcast per call
            hit = self._consts[key] = self.broadcast_to(self.full(value, (), dtype), shape)
        if hit is None:
            # one stored value whatever the shape: never an array of the full size
            raw = dense_bytes(np.asarray(value), dtype)[2] if numel(shape) else b""
            attr = DenseIntOrFPElementsAttr(tensor_type(shape, dtype), BytesAttr(raw))
            op = ConstantOp.create(result_types=[tensor_type(shape, dtype)],
                                   properties={"value": attr})
            self.block.insert_op_before(op, self.anchor)
            hit = self._consts[key] = V(self, op.results[0])
        return hit

    def count(self, like: V, dims) -> V:
        """The element count of `dims` (some dynamic) as a tensor of `like`'s shape:
        the sum of ones over those dims, so it is the call's size on every backend."""
        ones = self.full(1, tuple(dims), like.dtype)
        n = self.reduce("sum", ones, range(len(dims)))
        return self.broadcast_to(n, like.shape)

    def zeros_like(self, x) -> V:
        return self.full(0, x.shape, x.dtype)

    # -- shape helpers that skip identities ---------------------------------
    def cast(self, x: V, dtype: str) -> V:
        return x if x.dtype == dtype else self.emit(CastOp, [x], dtype=dtype)

    def reshape(self, x: V, shape) -> V:
        shape = tuple(shape)
        return x if x.shape == shape else self.op("reshape", x, shape=shape)

    def broadcast_to(self, x: V, shape) -> V:
        shape = tuple(shape)
        return x if x.shape == shape else self.op("broadcast_to", x, shape=shape)

    def transpose(self, x: V, perm) -> V:
        perm = tuple(perm)
        return x if perm == tuple(range(len(perm))) else self.op("transpose", x, perm=perm)

    def reduce(self, name: str, x: V, axes, keepdims=False) -> V:
        axes = tuple(sorted(axes))
        if not axes:
            return x
        return self.op(name, x, axes=axes, keepdims=bool(keepdims))

    def select(self, c: V, a: V, b: V) -> V:
        return self.op("select", c, a, b)

    def mT(self, x: V) -> V:
        """Swap the last two dims."""
        n = len(x.shape)
        return self.transpose(x, tuple(range(n - 2)) + (n - 1, n - 2))

    def sum_to(self, x: V, shape) -> V:
        """Sum `x` down to `shape`, the shape it was broadcast from (NumPy rules)."""
        shape = tuple(shape)
        xs = x.shape
        if xs == shape:
            return x
        lead = len(xs) - len(shape)
        inner = tuple(lead + i for i, d in enumerate(shape) if d == 1 and xs[lead + i] != 1)
        if not lead:  # same rank: keep the reduced dims, no reshape
            return self.reduce("sum", x, inner, keepdims=True)
        return self.reshape(self.reduce("sum", x, tuple(range(lead)) + inner), shape)

    def unreduce(self, g: V, x_shape, axes, keepdims: bool) -> V:
        """Broadcast a reduction's result `g` back to the input shape."""
        if not keepdims and any(a != i for i, a in enumerate(axes)):
            # reduced axes are not a prefix: restore them as size-1 dims first
            g = self.reshape(g, tuple(1 if i in axes else d for i, d in enumerate(x_shape)))
        return self.broadcast_to(g, x_shape)

    def add_opt(self, a: V | None, b: V | None) -> V | None:
        """Sum of two possibly-symbolic-zero (None) values."""
        if a is None:
            return b
        if b is None:
            return a
        return a + b


# ---------------------------------------------------------------- rule table

# rule(b, op, g, need) -> [cotangent or None per operand]; `need[i]` says
# whether operand i wants one (rules skip the others).
VJP_RULES: dict[str, Callable] = {}
# Elementwise expressions shared with forward mode: fn(g, x, y) (unary) or
# one fn(g, x, z, y) per operand (binary); each is linear in g: g * partial.
UNARY_VJPS: dict[str, Callable] = {}
BINARY_VJPS: dict[str, tuple] = {}
# Ops whose derivative is zero everywhere (rules return no cotangent).
ZERO_DERIVATIVE = {"rlx.sign": "piecewise constant", "rlx.stop_gradient": "cuts the gradient",
                   "rlx.floor": "piecewise constant", "rlx.ceil": "piecewise constant",
                   "rlx.round": "piecewise constant",
                   "rlx.eq": "i1 result", "rlx.ne": "i1 result", "rlx.lt": "i1 result",
                   "rlx.le": "i1 result", "rlx.gt": "i1 result", "rlx.ge": "i1 result"}


def _ops(op, b):
    return [b.wrap(o) for o in op.operands], b.wrap(op.results[0])


def defunary(name: str, fn: Callable | None):
    """Elementwise unary op: `fn(g, x, y)` is the cotangent of x (None: zero derivative)."""
    UNARY_VJPS[name] = fn

    def rule(b, op, g, need):
        (x,), y = _ops(op, b)
        return [fn(g, x, y) if fn is not None else None]
    VJP_RULES[name] = rule


def defbinary(name: str, da: Callable, db: Callable):
    """Elementwise binary op: `da(g, x, z, y)`, `db(...)` are the cotangents of x and z."""
    BINARY_VJPS[name] = (da, db)

    def rule(b, op, g, need):
        (x, z), y = _ops(op, b)
        return [fn(g, x, z, y) if n else None for fn, n in zip((da, db), need)]
    VJP_RULES[name] = rule


def defzero(name: str):
    """No cotangent for any operand (comparisons: i1 results)."""
    VJP_RULES[name] = lambda b, op, g, need: [None] * len(op.operands)


def defrule(name: str):
    def deco(fn):
        VJP_RULES[name] = fn
        return fn
    return deco


# ---- elementwise unary: one expression each
_SQRT_2 = float(np.sqrt(2.0))
_INV_SQRT_2PI = float(1 / np.sqrt(2 * np.pi))
_TWO_OVER_SQRT_PI = float(2 / np.sqrt(np.pi))
_GELU_C = float(np.sqrt(2 / np.pi))
_LN2, _LN10 = float(np.log(2.0)), float(np.log(10.0))


def _relu_grad(g, x, y):
    # y > 0 exactly where x > 0 (NaN and -0 included); testing the output lets the
    # forward's pre-activation die at the relu, so the lowering fuses bias + relu
    # into the matmul that produces it instead of keeping x for the backward
    b = g.b
    return b.select(y.gt(b.zeros_like(y)), g, b.zeros_like(g))


def _gelu_grad(g, x, y):
    cdf = 0.5 * ((x * (1 / _SQRT_2)).erf() + 1.0)
    pdf = (x * x * -0.5).exp() * _INV_SQRT_2PI
    return g * (cdf + x * pdf)


def _gelu_tanh_grad(g, x, y):
    t = ((x + x * x * x * 0.044715) * _GELU_C).tanh()
    du = (x * x * (3 * 0.044715) + 1.0) * _GELU_C
    return g * ((t + 1.0) * 0.5 + x * 0.5 * (1.0 - t * t) * du)


def _silu_grad(g, x, y):
    s = x.sigmoid()
    return g * (s * (x * (1.0 - s) + 1.0))


defunary("rlx.neg", lambda g, x, y: -g)
defunary("rlx.exp", lambda g, x, y: g * y)
defunary("rlx.log", lambda g, x, y: g / x)
defunary("rlx.sqrt", lambda g, x, y: g / (y * 2.0))
defunary("rlx.rsqrt", lambda g, x, y: g * y / x * -0.5)
defunary("rlx.tanh", lambda g, x, y: g * (1.0 - y * y))
defunary("rlx.sigmoid", lambda g, x, y: g * (y * (1.0 - y)))
defunary("rlx.relu", _relu_grad)
defunary("rlx.gelu", _gelu_grad)
defunary("rlx.gelu_tanh", _gelu_tanh_grad)
defunary("rlx.silu", _silu_grad)
defunary("rlx.softplus", lambda g, x, y: g * x.sigmoid())
defunary("rlx.abs", lambda g, x, y: g * x.sign())
defunary("rlx.sin", lambda g, x, y: g * x.cos())
defunary("rlx.cos", lambda g, x, y: -(g * x.sin()))
defunary("rlx.sign", None)
defunary("rlx.reciprocal", lambda g, x, y: -(g * y * y))
defunary("rlx.erf", lambda g, x, y: g * (-(x * x)).exp() * _TWO_OVER_SQRT_PI)
defunary("rlx.stop_gradient", None)
defunary("rlx.fake_quant", lambda g, x, y: g)  # straight-through estimator
defunary("rlx.expm1", lambda g, x, y: g * (y + 1.0))
defunary("rlx.log1p", lambda g, x, y: g / (x + 1.0))
defunary("rlx.exp2", lambda g, x, y: g * y * _LN2)
defunary("rlx.log2", lambda g, x, y: g / (x * _LN2))
defunary("rlx.log10", lambda g, x, y: g / (x * _LN10))
defunary("rlx.tan", lambda g, x, y: g * (y * y + 1.0))
defunary("rlx.atan", lambda g, x, y: g / (x * x + 1.0))
defunary("rlx.asin", lambda g, x, y: g * (1.0 - x * x).rsqrt())
defunary("rlx.acos", lambda g, x, y: -(g * (1.0 - x * x).rsqrt()))
defunary("rlx.sinh", lambda g, x, y: g * x.cosh())
defunary("rlx.cosh", lambda g, x, y: g * x.sinh())
defunary("rlx.asinh", lambda g, x, y: g * (x * x + 1.0).rsqrt())
defunary("rlx.acosh", lambda g, x, y: g * ((x - 1.0) * (x + 1.0)).rsqrt())
defunary("rlx.atanh", lambda g, x, y: g / ((1.0 - x) * (1.0 + x)))
for _n in ("floor", "ceil", "round"):  # piecewise constant: 0, also at the jumps (as sign)
    defunary(f"rlx.{_n}", None)


# ---- elementwise binary: one expression per operand
def _safe_log(x):
    """log(x) with log(0) := 0: the d/dz of x**z term vanishes at x == 0 (JAX's choice)."""
    b = x.b
    return b.select(x.eq(b.zeros_like(x)), b.full(1, x.shape, x.dtype), x).log()


def _max_weight(x, z, gt):
    """1 where x wins, 0.5 at ties, 0 where z wins (ties split evenly)."""
    b = x.b
    one, half, zero = (b.full(v, x.shape, x.dtype) for v in (1, 0.5, 0))
    return b.select(getattr(x, gt)(z), one, b.select(x.eq(z), half, zero))


defbinary("rlx.add", lambda g, x, z, y: g, lambda g, x, z, y: g)
defbinary("rlx.sub", lambda g, x, z, y: g, lambda g, x, z, y: -g)
defbinary("rlx.mul", lambda g, x, z, y: g * z, lambda g, x, z, y: g * x)
defbinary("rlx.div", lambda g, x, z, y: g / z, lambda g, x, z, y: -(g * y / z))
def _pow_dx(g, x, z, y):
    """z * x**(z-1), and 0 where z == 0: d/dx x**0 is 0 also at x = 0, where the
    formula gives 0 * 0**-1 = NaN (PyTorch's and autograd's choice; the limit)."""
    b = x.b
    zero = b.zeros_like(z)
    return g * b.select(z.eq(zero), zero, z * x ** (z - 1.0))


def _trunc(v):
    """Round toward zero (the integer part of a float)."""
    b = v.b
    return b.select(v.lt(b.zeros_like(v)), v.ceil(), v.floor())


defbinary("rlx.pow", _pow_dx, lambda g, x, z, y: g * y * _safe_log(x))
# x rem z = x - trunc(x / z) * z
defbinary("rlx.rem", lambda g, x, z, y: g, lambda g, x, z, y: -(g * _trunc(x / z)))
defbinary("rlx.maximum", lambda g, x, z, y: g * _max_weight(x, z, "gt"),
          lambda g, x, z, y: g * _max_weight(z, x, "gt"))
defbinary("rlx.minimum", lambda g, x, z, y: g * _max_weight(x, z, "lt"),
          lambda g, x, z, y: g * _max_weight(z, x, "lt"))


def _hypot_d(g, a, y):
    """d hypot / da = a / hypot, and 0 at the origin (where a = 0 too: the subgradient
    of |(a, b)| of least norm, as for abs)."""
    b = y.b
    zero = b.zeros_like(y)
    return g * b.select(y.eq(zero), zero, a / y)


def _atan2_w(x, z):
    """1 / (x*x + z*z), and 0 at the origin (atan2 is not differentiable there; 0 as PyTorch)."""
    b = x.b
    r = x * x + z * z
    zero = b.zeros_like(r)
    return b.select(r.eq(zero), zero, 1.0 / r)


# atan2(x, z) = the angle of the point (z, x): d/dx = z / r^2, d/dz = -x / r^2
defbinary("rlx.atan2", lambda g, x, z, y: g * z * _atan2_w(x, z),
          lambda g, x, z, y: -(g * x * _atan2_w(x, z)))
defbinary("rlx.hypot", lambda g, x, z, y: _hypot_d(g, x, y), lambda g, x, z, y: _hypot_d(g, z, y))
for _n in ("eq", "ne", "lt", "le", "gt", "ge"):
    defzero(f"rlx.{_n}")


@defrule("rlx.select")
def _select_vjp(b, op, g, need):
    c = b.wrap(op.operands[0])
    zero = b.zeros_like(g)
    return [None, b.select(c, g, zero) if need[1] else None,
            b.select(c, zero, g) if need[2] else None]


# ---- reductions
def reduce_weights(b, op):
    """d y / d x for max/min (argmax indicator over tie count) and prod (zero-safe),
    as a tensor of x's shape (the unreduced partials)."""
    (x,), y = _ops(op, b)
    p = op.params()
    axes, shp, dt = p["axes"], x.shape, x.dtype
    if op.name in ("rlx.max", "rlx.min"):
        yb = b.unreduce(y, shp, axes, p["keepdims"])
        m = b.cast(x.eq(yb), dt)
        return m / b.broadcast_to(b.reduce("sum", m, axes, True), shp)
    # prod: product of the other elements, without dividing by zero
    zero, one = b.zeros_like(x), b.full(1, shp, dt)
    isz = x.eq(zero)
    nz = b.broadcast_to(b.reduce("sum", b.cast(isz, dt), axes, True), shp)
    xs = b.select(isz, one, x)
    pb = b.broadcast_to(b.reduce("prod", xs, axes, True), shp)
    return b.select(isz, b.select(nz.eq(one), pb, zero),
                    b.select(nz.eq(zero), pb / xs, zero))


def defreducer(name: str):
    @defrule(name)
    def rule(b, op, g, need):
        p = op.params()
        shp = shape_of(op.operands[0].type)
        if name == "rlx.mean" and is_dynamic([shp[a] for a in p["axes"]]):
            g = g / b.count(g, [shp[a] for a in p["axes"]])   # the count is known per call
        elif name == "rlx.mean":  # scale before broadcasting: fewer elements
            g = g * (1.0 / max(numel(shp[a] for a in p["axes"]), 1))
        gb = b.unreduce(g, shp, p["axes"], p["keepdims"])
        if name in ("rlx.sum", "rlx.mean"):
            return [gb]
        return [gb * reduce_weights(b, op)]


for _n in ("sum", "mean", "max", "min", "prod"):
    defreducer(f"rlx.{_n}")


# ---- linear algebra and shape ops
@defrule("rlx.matmul")
def _matmul_vjp(b, op, g, need):
    (x, z), _ = _ops(op, b)
    gx = b.sum_to(b.op("matmul", g, b.mT(z)), x.shape) if need[0] else None
    gz = b.sum_to(b.op("matmul", b.mT(x), g), z.shape) if need[1] else None
    return [gx, gz]


@defrule("rlx.transpose")
def _transpose_vjp(b, op, g, need):
    perm = op.params()["perm"]
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return [b.transpose(g, inv)]


VJP_RULES["rlx.reshape"] = lambda b, op, g, need: [b.reshape(g, shape_of(op.operands[0].type))]
VJP_RULES["rlx.broadcast_to"] = lambda b, op, g, need: [b.sum_to(g, shape_of(op.operands[0].type))]


@defrule("rlx.slice")
def _slice_vjp(b, op, g, need):
    """Transpose of a strided window: spread each strided dim by interleaving zeros
    (reshape to (n, 1), pad to (n, s), reshape to n*s, trim), then one zero pad."""
    p = op.params()
    shp = shape_of(op.operands[0].type)
    for ax, (s, st) in enumerate(zip(p["starts"], p["strides"])):
        if st == 1:
            continue
        gs = g.shape
        n = gs[ax]
        g = b.reshape(g, gs[:ax] + (n, 1) + gs[ax + 1:])
        zeros = [0] * (len(gs) + 1)
        high = list(zeros)
        high[ax + 1] = st - 1
        g = b.op("pad", g, low=tuple(zeros), high=tuple(high))
        g = b.reshape(g, gs[:ax] + (n * st,) + gs[ax + 1:])
        keep = min(n * st, shp[ax] - s)
        if keep != n * st:
            lim = list(g.shape)
            lim[ax] = keep
            g = b.op("slice", g, starts=(0,) * len(gs), limits=tuple(lim), strides=(1,) * len(gs))
    high = tuple(0 if is_sym(d) else d - s - k for d, s, k in zip(shp, p["starts"], g.shape))
    if any(p["starts"]) or any(high):
        g = b.op("pad", g, low=p["starts"], high=high)
    return [g]


@defrule("rlx.pad")
def _pad_vjp(b, op, g, need):
    p = op.params()
    shp = shape_of(op.operands[0].type)
    return [b.op("slice", g, starts=p["low"], limits=tuple(d if is_sym(d) else l + d
                                                           for l, d in zip(p["low"], shp)),
                 strides=(1,) * len(shp))]


@defrule("rlx.concat")
def _concat_vjp(b, op, g, need):
    axis = op.params()["axis"]
    out, off = [], 0
    for o, n in zip(op.operands, need):
        s = shape_of(o.type)
        if n:
            starts = [0] * len(s)
            limits = list(g.shape)
            starts[axis], limits[axis] = off, off + s[axis]
            out.append(b.op("slice", g, starts=tuple(starts), limits=tuple(limits),
                            strides=(1,) * len(s)))
        else:
            out.append(None)
        off += s[axis]
    return out


@defrule("rlx.gather")
def _gather_vjp(b, op, g, need):
    p = op.params()
    table, idx = op.operands
    return [b.op("scatter_add", b.wrap(idx), g, axis=p["axis"], dim=shape_of(table.type)[p["axis"]],
                 label=p["label"]), None]


@defrule("rlx.scatter_add")
def _scatter_add_vjp(b, op, g, need):
    p = op.params()
    return [None, b.op("gather", g, b.wrap(op.operands[0]), axis=p["axis"], label=p["label"])]


defzero("rlx.philox")          # random draws: integer operands (key, counter)
ZERO_DERIVATIVE["rlx.philox"] = "integer operands (key, counter)"


@defrule("rlx.cast")
def _cast_vjp(b, op, g, need):
    src = dtype_of(op.operands[0].type)
    if src in FLOAT_DTYPES and dtype_of(op.results[0].type) in FLOAT_DTYPES:
        return [b.cast(g, src)]
    return [None]


# ---- convolution family (dialect/conv_shapes.py): each op's adjoints are the other two
def _conv_common(p):
    return {k: p[k] for k in ("stride", "padding", "dilation", "groups")}


def _conv_output_padding(in_shape, p, kernel):
    """output_padding that makes conv_transpose2d give back the conv2d input's H, W."""
    return tuple((in_shape[2 + a] + p["padding"][2 * a] + p["padding"][2 * a + 1]
                  - p["dilation"][a] * (kernel[a] - 1) - 1) % p["stride"][a] for a in range(2))


def _conv_input_grad(b, dy, w, x_shape, p, kernel):
    """The adjoint of conv2d(x, w) in x applied to dy: conv_transpose2d(dy, w) cut to x's
    H, W (conv2d's VJP in x, and conv2d_filter_grad's in x with w = its cotangent)."""
    return b.op("conv_transpose2d", dy, w, **_conv_common(p),
                output_padding=_conv_output_padding(x_shape, p, kernel))


@defrule("rlx.conv2d")
def _conv2d_vjp(b, op, g, need):
    (x, w), _ = _ops(op, b)
    p = op.params()
    gx = _conv_input_grad(b, g, w, x.shape, p, w.shape[2:]) if need[0] else None
    gw = b.op("conv2d_filter_grad", x, g, **_conv_common(p), kernel=w.shape[2:]) \
        if need[1] else None
    return [gx, gw]


@defrule("rlx.conv_transpose2d")
def _conv_transpose2d_vjp(b, op, g, need):
    (y, w), _ = _ops(op, b)
    c = _conv_common(op.params())
    gy = b.op("conv2d", g, w, **c) if need[0] else None
    gw = b.op("conv2d_filter_grad", g, y, **c, kernel=w.shape[2:]) if need[1] else None
    return [gy, gw]


@defrule("rlx.conv2d_filter_grad")
def _conv2d_filter_grad_vjp(b, op, g, need):
    (x, dy), _ = _ops(op, b)
    p = op.params()
    gx = _conv_input_grad(b, dy, g, x.shape, p, p["kernel"]) if need[0] else None
    gdy = b.op("conv2d", x, g, **_conv_common(p)) if need[1] else None
    return [gx, gdy]
def _attention_vjp(b, op, g, need):  # dialect/attention.py: recomputes P block by block
    from .attention import attention_vjp

    return attention_vjp(b, op, g, need)


VJP_RULES["rlx.attention"] = _attention_vjp


def _attention_derived_vjp(b, op, g, need):  # dialect/attention_bwd.py: by expansion
    from .attention_bwd import vjp_by_expansion

    return vjp_by_expansion(b, op, g, need)


VJP_RULES["rlx.attention_lse"] = _attention_derived_vjp
VJP_RULES["rlx.attention_bwd"] = _attention_derived_vjp


# ---------------------------------------------------------------- the transform

def differentiable(value) -> bool:
    return dtype_of(value.type) in FLOAT_DTYPES


def resolve_names(f, names: list[str], what: str) -> list:
    """The block arguments named `names` (inputs or params); unknown names list valid ones."""
    sig = signature(f)
    by_name = {a.name: v for a, v in zip(sig, f.body.block.args)}
    if not names:
        raise ValueError(f"{what}: no names given; valid inputs and params: "
                         f"{[a.name for a in sig]}")
    for n in names:
        if n not in by_name:
            raise NameLookupError(f"{what}: unknown name {n!r}; valid inputs and params: "
                                  f"{[a.name for a in sig]}")
        if not differentiable(by_name[n]):
            raise TypeError(f"{what}: cannot differentiate with respect to {n!r} of dtype "
                            f"{dtype_of(by_name[n].type)} (float inputs and params only)")
    return [by_name[n] for n in names]


def set_outputs(f, block, outs) -> None:
    """Replace the function's return with one of `outs`, fixing its type."""
    old = block.last_op
    block.add_op(func.ReturnOp(*outs))
    block.erase_op(old)
    f.function_type = builtin.FunctionType.from_lists([a.type for a in block.args],
                                                      [o.type for o in outs])


def grad_module(module: ModuleOp, wrt: list[str], with_value: bool = False) -> ModuleOp:
    """A new module returning [grads...] (or [loss, grads...]) of output 0 w.r.t. `wrt`."""
    from .control_ad import VJP_CONTROL
    what = "rlx-value-and-grad" if with_value else "rlx-grad"
    module = module.clone()
    f = get_func(module)
    block = f.body.block
    targets = resolve_names(f, list(wrt), what)
    outs = outputs(f)
    if not outs:
        raise ValueError(f"{what}: the function has no outputs")
    loss = outs[0]
    if not differentiable(loss):
        dt = dtype_of(loss.type)
        kind = "boolean" if dt == "i1" else "integer"
        raise TypeError(f"{what}: output 0 is a {kind} ({dt}) tensor, which is not "
                        f"differentiable: its values are piecewise constant in the inputs (a "
                        f"comparison, a cast to an integer, integer arithmetic), so a gradient "
                        f"would be zero wherever it exists. Differentiate a float output "
                        f"(e.g. compute the loss before comparing or casting).")
    ops = [op for op in block.ops if op is not block.last_op]

    # forward: which values carry derivative information from `wrt`
    active = set(targets)
    for op in ops:
        if op.name in ZERO_DERIVATIVE or not op.results:
            continue
        for r in op.results:   # one result, or several for a region op (rlx.scan, ...)
            if differentiable(r) and any(o in active for o in op.operands):
                active.add(r)

    b = Builder(block, block.last_op)
    ct: dict = {}
    if loss in active:
        ct[loss] = b.full(1, shape_of(loss.type), dtype_of(loss.type))
    for op in reversed(ops):
        if not ct or not op.results:
            continue
        if op.name in VJP_CONTROL:   # region ops: several results (dialect/control_ad.py)
            gs = [ct.pop(r, None) for r in op.results]
            need = tuple(o in active for o in op.operands)
            if all(x is None for x in gs) or not any(need):
                continue
            for o, n, c in zip(op.operands, need, VJP_CONTROL[op.name](b, op, gs, need)):
                if n and c is not None:
                    ct[o] = b.add_opt(ct.get(o), c)
            continue
        g = ct.pop(op.results[0], None)
        if g is None:
            continue
        need = tuple(o in active for o in op.operands)
        if not any(need):
            continue
        rule = VJP_RULES.get(op.name)
        if rule is None:
            raise NotImplementedError(f"{what}: no VJP rule for {op.name}")
        for o, n, c in zip(op.operands, need, rule(b, op, g, need)):
            if n and c is not None:
                ct[o] = b.add_opt(ct.get(o), c)

    grads = [ct[t] if t in ct else b.zeros_like(b.wrap(t)) for t in targets]
    set_outputs(f, block, ([loss] if with_value else []) + [g.v for g in grads])
    return module


def replace_module(module: ModuleOp, new: ModuleOp) -> None:
    """Make `module` hold `new`'s function (a ModulePass rewrites in place)."""
    old, fn = get_func(module), get_func(new)
    new.body.block.detach_op(fn)
    module.body.block.insert_op_before(fn, old)
    module.body.block.erase_op(old)


def split_names(names) -> list[str]:
    """`"a,b"` or `("a", "b")` (how a pipeline string passes a list) to a list of names."""
    if isinstance(names, str):
        names = names.split(",")
    return [n.strip() for n in names if n.strip()]


@dataclass(frozen=True)
class GradPass(ModulePass):
    """`rlx-grad{wrt=w1,w2}`: the function returns the gradients of output 0."""

    name = "rlx-grad"
    wrt: str | tuple[str, ...]

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        replace_module(op, grad_module(op, split_names(self.wrt), False))


@dataclass(frozen=True)
class ValueAndGradPass(ModulePass):
    """`rlx-value-and-grad{wrt=w}`: the function returns [loss, gradients...]."""

    name = "rlx-value-and-grad"
    wrt: str | tuple[str, ...]

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        replace_module(op, grad_module(op, split_names(self.wrt), True))


__all__ = ["VJP_RULES", "UNARY_VJPS", "BINARY_VJPS", "ZERO_DERIVATIVE", "grad_module",
           "GradPass", "ValueAndGradPass", "Builder", "V", "defunary", "defbinary"]

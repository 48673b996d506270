"""Scalar rules of the elementwise rlx ops for GPU kernels (one register in, one out).

    SCALAR_RULES[op name](ctx, op, *registers) -> register
          │ float ops: IEEE instructions (fdiv → div.rn, llvm.sqrt → sqrt.rn),
          │            transcendentals from gpu_math (mathlib), NaN kept like NumPy
          │            (relu via an unordered compare, max/min = llvm.maximum/minimum)
          │ int ops:   add/sub/mul/sdiv/smax/smin, signed compares; i1 masks
          │ cast:      float → int truncates (as the interpreter), → i1 is x != 0
          │ fake_quant: bit-exact rlxc.lowp.quantize (round to nearest even, saturate)
          ▼
    gpu_expr applies a rule per lane; gpu_kernels' reductions use combine/nan_identity

float64 is supported by arithmetic, compares, casts and reductions; the
transcendentals are float32 only and say so (NotImplementedError naming the op).
"""
from __future__ import annotations

import math

import llvmlite.ir as ir

from rlxc.dialect.types import dtype_of

from . import gpu_math

F32 = ir.FloatType()
F64 = ir.DoubleType()
I1 = ir.IntType(1)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
REG_TYPE = {"f32": F32, "f64": F64, "i1": I1, "i32": I32, "i64": I64}


def _fdt(op):
    return dtype_of(op.results[0].type)


def _math(name):
    def fn(ctx, op, *xs):
        if _fdt(op) != "f32":
            raise NotImplementedError(f"GPU lowering: {op.name} on {_fdt(op)} "
                                      "(GPU math is float32 only)")
        return gpu_math.emit(ctx.b, name, *xs)
    return fn


def _fconst(dt, v):
    return ir.Constant(REG_TYPE[dt], float(v))


def _relu(ctx, op, x):
    z = _fconst(_fdt(op), 0.0)
    return ctx.b.select(ctx.b.fcmp_unordered(">", x, z), x, z)   # NaN stays NaN


def _sign(ctx, op, x):
    b, dt = ctx.b, _fdt(op)
    if dt in ("i32", "i64"):
        t = REG_TYPE[dt]
        pos = b.select(b.icmp_signed(">", x, ir.Constant(t, 0)), ir.Constant(t, 1), x)
        return b.select(b.icmp_signed("<", x, ir.Constant(t, 0)), ir.Constant(t, -1), pos)
    pos = b.select(b.fcmp_ordered(">", x, _fconst(dt, 0)), _fconst(dt, 1), x)
    return b.select(b.fcmp_ordered("<", x, _fconst(dt, 0)), _fconst(dt, -1), pos)


def _intrin(name, ctx, dt, *xs):
    suffix = {"f32": "f32", "f64": "f64", "i32": "i32", "i64": "i64"}[dt]
    return gpu_math.intrinsic(ctx.b, f"llvm.{name}.{suffix}", REG_TYPE[dt], list(xs))


def _abs(ctx, op, x):
    dt = _fdt(op)
    if dt in ("i32", "i64"):
        return ctx.b.select(ctx.b.icmp_signed("<", x, ir.Constant(x.type, 0)), ctx.b.neg(x), x)
    return _intrin("fabs", ctx, dt, x)


def _neg(ctx, op, x):
    return ctx.b.neg(x) if _fdt(op) in ("i32", "i64") else ctx.b.fneg(x)


def _sqrt(ctx, op, x):
    return _intrin("sqrt", ctx, _fdt(op), x)


def _rsqrt(ctx, op, x):
    return ctx.b.fdiv(_fconst(_fdt(op), 1.0), _sqrt(ctx, op, x))


def _recip(ctx, op, x):
    return ctx.b.fdiv(_fconst(_fdt(op), 1.0), x)


def _fake_quant(ctx, op, x):
    """Round to the (exp_bits, man_bits, max_normal) grid exactly as rlxc.lowp.quantize:
    unit exponent ex = max(floor(log2|x|), emin) from the f32 exponent bits, then
    rint(x * 2^(M-ex)) * 2^(ex-M) (two exact power-of-two scalings each way), saturate."""
    if _fdt(op) != "f32":
        raise NotImplementedError("GPU lowering: rlx.fake_quant on f64")
    p = op.params()
    e_bits, m_bits, max_normal = p["exp_bits"], p["man_bits"], p["max_normal"]
    emin = 2 - 2 ** (e_bits - 1)
    b = ctx.b

    def c(v):
        return ir.Constant(I32, int(v))

    def pow2(n):
        return b.bitcast(b.shl(b.add(n, c(127)), c(23)), F32)

    bits = b.bitcast(x, I32)
    ex = b.sub(b.and_(b.lshr(bits, c(23)), c(0xFF)), c(127))
    ex = b.select(b.icmp_signed("<", ex, c(emin)), c(emin), ex)
    s = b.sub(c(m_bits), ex)
    s1 = b.ashr(s, c(1))
    s2 = b.sub(s, s1)
    y = b.fmul(b.fmul(x, pow2(s1)), pow2(s2))
    r = gpu_math.intrinsic(b, "llvm.rint.f32", F32, [y])
    r = b.fmul(b.fmul(r, pow2(b.neg(s1))), pow2(b.neg(s2)))
    mx = gpu_math.fconst(max_normal)
    over = b.fcmp_ordered(">", gpu_math.intrinsic(b, "llvm.fabs.f32", F32, [r]), mx)
    return b.select(over, gpu_math.intrinsic(b, "llvm.copysign.f32", F32, [mx, x]), r)


def _binary(fop, iop):
    def fn(ctx, op, x, y):
        if _fdt(op) in ("f32", "f64"):
            return getattr(ctx.b, fop)(x, y)
        if iop is None:
            raise NotImplementedError(f"GPU lowering: {op.name} on {_fdt(op)}")
        return getattr(ctx.b, iop)(x, y)
    return fn


def _rounding(name):
    def fn(ctx, op, x):  # floor, ceil, round (halves to even): cvt.rmi / rpi / rni
        return _intrin(name, ctx, _fdt(op), x)
    return fn


def _rem(ctx, op, x, y):
    """Truncated remainder (C fmod); integer x rem 0 and INT_MIN rem -1 give 0 (NumPy)."""
    b, dt = ctx.b, _fdt(op)
    if dt in ("f32", "f64"):
        return b.frem(x, y)
    t = REG_TYPE[dt]
    bad = b.or_(b.icmp_signed("==", y, ir.Constant(t, 0)),
                b.icmp_signed("==", y, ir.Constant(t, -1)))
    return b.srem(x, b.select(bad, ir.Constant(t, 1), y))


def _pow(ctx, op, x, y):
    if _fdt(op) != "f32":
        raise NotImplementedError(f"GPU lowering: rlx.pow on {_fdt(op)}")
    return gpu_math.emit(ctx.b, "pow", x, y)


def _minmax(fname, iname):
    def fn(ctx, op, x, y):
        dt = _fdt(op)
        if dt in ("f32", "f64"):
            return _intrin(fname, ctx, dt, x, y)   # NaN propagates (llvm.maximum)
        return _intrin(iname, ctx, dt, x, y)
    return fn


_FCMP = {"eq": ("==", "ordered"), "ne": ("!=", "unordered"), "lt": ("<", "ordered"),
         "le": ("<=", "ordered"), "gt": (">", "ordered"), "ge": (">=", "ordered")}


def _compare(name):
    pred, kind = _FCMP[name]

    def fn(ctx, op, x, y):
        dt = dtype_of(op.operands[0].type)
        if dt in ("f32", "f64"):
            f = ctx.b.fcmp_ordered if kind == "ordered" else ctx.b.fcmp_unordered
            return f(pred, x, y)
        if dt == "i1":
            return ctx.b.icmp_unsigned(pred, x, y)
        return ctx.b.icmp_signed(pred, x, y)
    return fn


def _select(ctx, op, c, x, y):
    return ctx.b.select(c, x, y)


def convert(b, x, src: str, dst: str):
    """Cast a register value between rlx dtypes (float → int truncates, like the interpreter)."""
    if src == dst:
        return x
    fl = ("f32", "f64")
    t = REG_TYPE[dst]
    if src in fl and dst in fl:
        return b.fpext(x, t) if dst == "f64" else b.fptrunc(x, t)
    if src in fl:
        if dst == "i1":
            return b.fcmp_unordered("!=", x, ir.Constant(x.type, 0.0))
        return b.fptosi(x, t)
    if src == "i1":
        return b.uitofp(x, t) if dst in fl else b.zext(x, t)
    if dst in fl:
        return b.sitofp(x, t)
    if dst == "i1":
        return b.icmp_signed("!=", x, ir.Constant(x.type, 0))
    return b.sext(x, t) if t.width > x.type.width else b.trunc(x, t)


def _cast(ctx, op, x):
    return convert(ctx.b, x, dtype_of(op.operands[0].type), _fdt(op))


def _identity(ctx, op, x):
    return x


def nan_identity(name: str, dt: str):
    """Identity element of reduction `name` for dtype `dt` (as an IR constant)."""
    t = REG_TYPE[dt]
    fl = dt in ("f32", "f64")
    if name in ("rlx.sum", "rlx.mean"):
        return ir.Constant(t, 0.0 if fl else 0)
    if name == "rlx.prod":
        return ir.Constant(t, 1.0 if fl else 1)
    if name == "rlx.max":
        return ir.Constant(t, -math.inf if fl else -(2 ** (t.width - 1)))
    if name == "rlx.min":
        return ir.Constant(t, math.inf if fl else 2 ** (t.width - 1) - 1)
    raise KeyError(name)


def combine(b, name: str, dt: str, acc, x):
    """acc <op> x for reduction `name` (max/min propagate NaN, like NumPy)."""
    fl = dt in ("f32", "f64")
    if name in ("rlx.sum", "rlx.mean"):
        return b.fadd(acc, x) if fl else b.add(acc, x)
    if name == "rlx.prod":
        return b.fmul(acc, x) if fl else b.mul(acc, x)
    suffix = {"f32": "f32", "f64": "f64", "i32": "i32", "i64": "i64"}[dt]
    if name == "rlx.max":
        iname = f"llvm.maximum.{suffix}" if fl else f"llvm.smax.{suffix}"
    else:
        iname = f"llvm.minimum.{suffix}" if fl else f"llvm.smin.{suffix}"
    return gpu_math.intrinsic(b, iname, REG_TYPE[dt], [acc, x])


SCALAR_RULES = {
    "rlx.neg": _neg,
    "rlx.exp": _math("exp"),
    "rlx.log": _math("log"),
    "rlx.sqrt": _sqrt,
    "rlx.rsqrt": _rsqrt,
    "rlx.tanh": _math("tanh"),
    "rlx.sigmoid": _math("sigmoid"),
    "rlx.relu": _relu,
    "rlx.gelu": _math("gelu"),
    "rlx.gelu_tanh": _math("gelu_tanh"),
    "rlx.silu": _math("silu"),
    "rlx.softplus": _math("softplus"),
    "rlx.abs": _abs,
    "rlx.sin": _math("sin"),
    "rlx.cos": _math("cos"),
    "rlx.sign": _sign,
    "rlx.reciprocal": _recip,
    "rlx.erf": _math("erf"),
    "rlx.stop_gradient": _identity,
    "rlx.floor": _rounding("floor"),
    "rlx.ceil": _rounding("ceil"),
    "rlx.round": _rounding("roundeven"),
    "rlx.rem": _rem,
    "rlx.fake_quant": _fake_quant,
    "rlx.add": _binary("fadd", "add"),
    "rlx.sub": _binary("fsub", "sub"),
    "rlx.mul": _binary("fmul", "mul"),
    "rlx.div": _binary("fdiv", "sdiv"),
    "rlx.pow": _pow,
    "rlx.maximum": _minmax("maximum", "smax"),
    "rlx.minimum": _minmax("minimum", "smin"),
    **{f"rlx.{n}": _compare(n) for n in _FCMP},
    "rlx.select": _select,
    "rlx.cast": _cast,
}

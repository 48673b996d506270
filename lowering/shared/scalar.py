"""The one scalar lowering table of the rlx elementwise ops, shared by every backend.

    LOWER_RULES["rlx.X"](At(b, dtype, arg_dtype, params), *args) -> value
          │ args: float / double / iK registers (GPU, width 1) or <N x T> vectors (CPU
          │ loop bodies and sgemm epilogues, width N): every rule is width-generic
          │ (constants splat to the argument's type)
          ▼
    fadd/fcmp/select/bitcast ..., mathlib.emit for transcendentals, llvm.* intrinsics

Users: the CPU (lowering/cpu/codegen.py through `emit_op`, the loop IR adapter) and
the GPU (lowering/gpu/expr.py, one register per lane, with `gpu/scalar.py`'s
override table: only what NVPTX cannot do, i.e. `pow`).  The reductions of both
backends update accumulators with `combine` and start from `identity`.
A transcendental op's row is derived from its `math` property in
dialect/shapes.py (`math="exp"` -> `mathlib.emit(b, "exp", x)`, `math="atan2"` ->
`mathlib.emit(b, "atan2", y, x)`: unary and binary alike): adding one is a
shapes.py row and a mathlib kernel, no line here.  Dtype support comes from the
op's `dtypes` property (`check`).

Edge semantics (decided here once; the NumPy interpreter, dialect/interpreter.py,
implements the same; tests/test_edge_semantics.py runs every op's edge cases
through the CPU, the GPU emulator and the interpreter):
  compares       ordered (false on NaN) except `ne` (true on NaN); i1 compares unsigned
  maximum/min    NaN propagates; -0 < +0 (IEEE 754-2019 maximum/minimum, llvm.maximum);
                 the max/min reductions too (so their result does not depend on order)
  relu           NaN passes; relu(-0) = +0
  sign           NaN and +-0 pass through; else +-1
  abs, neg       the sign bit (fabs / fneg); integers wrap (abs(INT_MIN) = INT_MIN)
  add/sub/mul    IEEE, round to nearest, no fast-math flags; integers wrap; on i1
                 add/max = or, mul/min = and
  div            floats IEEE; integers truncate toward zero and saturate
                 (INT_MIN / -1 = INT_MAX), and x / 0 = 0 (also 0 / 0)
  rem            truncated remainder (C fmod, the sign of x); integers: x rem 0 = 0 and
                 INT_MIN rem -1 = 0 (NumPy); `%` and `//` are built from it by the tracer
  floor/ceil/round  llvm.floor / ceil / roundeven (round: halves to even, as np.round)
  pow            floats: C/NumPy pow with C99's special values (pow_exp_log): CPU float32
                 exp(y*log|x|) in float64, rounded once (correctly rounded but for float64's
                 ~2^-44 error; no libm call, vectorized), float64 libm pow; GPU
                 exp(y*log|x|) in the type itself; a few constant exponents are products
                 and square roots (_POW_CONST); integers: exact, by squaring, wrapping
                 like NumPy's; a negative exponent gives the quotient truncated toward
                 zero, 1 / x ** -y (1 ** -y = 1, (-1) ** -y = +-1, else 0; 0 ** -y = 0),
                 where NumPy raises (the tracer raises for a constant negative exponent)
  cast           float -> int truncates toward zero and saturates to the type's range,
                 NaN -> 0 (llvm.fptosi.sat); float/int -> i1 is x != 0 (NaN -> 1);
                 i1 -> number is 0/1; int narrowing keeps the low bits; f64 -> f32
                 rounds to nearest (overflow -> inf)
  fake_quant     the integer algorithm below, bit-exact with rlxc.lowp.quantize
  transcendentals  mathlib (ulp bounds in its header; NaN -> NaN; the IEEE values at
                 +-inf and +-0 listed there)
  gather/scatter an index outside [0, d) is an IndexError naming the op and the bound
                 (CPU: a check kernel before any memory is touched; GPU: an error flag
                 the runtime reads after the launches; not a scalar rule)

fake_quant rounds to the (exp_bits, man_bits) grid with integer arithmetic on
the float's bits: with a = |x| bits, e the unbiased exponent and
ex = max(e, emin), the low d = (ex - M) - (max(e, -126) - 23) bits of a are
rounded to nearest even (a carry into the exponent field is the correct next
binade); magnitudes below half the smallest subnormal of the format become 0
(one d == 24 tie case becomes that subnormal); then |r| is clipped to
max_normal (inf included) and the sign restored.  NaN passes.
"""
from __future__ import annotations

import math
import struct
from typing import NamedTuple

import llvmlite.ir as ir
import numpy as np

from rlxc.dialect.shapes import SHAPES
from rlxc.lowering.shared.philox import philox_rule

F32 = ir.FloatType()
F64 = ir.DoubleType()
I1 = ir.IntType(1)
I8 = ir.IntType(8)
I32 = ir.IntType(32)
I64 = ir.IntType(64)

TYPES = {"f32": F32, "f64": F64, "i1": I1, "i32": I32, "i64": I64, "u32": I32}
MEM_TYPES = {"f32": F32, "f64": F64, "i1": I8, "i32": I32, "i64": I64, "u32": I32}
FCMP = {"eq": "==", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


class At(NamedTuple):
    """What a rule knows besides its operands."""

    b: ir.IRBuilder
    dtype: str            # the result's dtype
    arg_dtype: str        # the first operand's dtype (compares, casts)
    params: dict          # the op's parameters (fake_quant's format)


# ---------------------------------------------------------------- helpers

def vtype(dt: str, width=None):
    t = TYPES[dt]
    return ir.VectorType(t, width) if width else t


def width_of(v):
    return v.type.count if isinstance(v.type, ir.VectorType) else None


def const(ty, value):
    """Constant of type ty (scalar or vector; vectors get a splat)."""
    if isinstance(ty, ir.VectorType):
        return ir.Constant(ty, [_scalar(ty.element, value)] * ty.count)
    return ir.Constant(ty, _scalar(ty, value))


def _scalar(ty, value):
    if isinstance(ty, (ir.FloatType, ir.DoubleType)):
        return float(value)
    if ty.width == 1:
        return int(bool(value))
    return int(value)


def intrinsic(b: ir.IRBuilder, base: str, ty, nargs: int = 1, ret=None, suffix=None):
    """Declare/get `llvm.<base>.<suffix>` taking nargs values of `ty`."""
    if suffix is None:
        suffix = _suffix(ty)
    name = f"{base}.{suffix}"
    fn = b.module.globals.get(name)
    if fn is None:
        fn = ir.Function(b.module, ir.FunctionType(ret or ty, [ty] * nargs), name)
    return fn


def _suffix(ty):
    if isinstance(ty, ir.VectorType):
        return f"v{ty.count}{_suffix(ty.element)}"
    if isinstance(ty, ir.FloatType):
        return "f32"
    if isinstance(ty, ir.DoubleType):
        return "f64"
    return f"i{ty.width}"


def _is_float(dt):
    return dt in ("f32", "f64")


def _like(ty, elem):
    """`elem` with the lane count of `ty`."""
    return ir.VectorType(elem, ty.count) if isinstance(ty, ir.VectorType) else elem


def _fptosi(b, x, ity):
    fn = intrinsic(b, "llvm.fptosi.sat", x.type, 1, ret=ity,
                   suffix=f"{_suffix(ity)}.{_suffix(x.type)}")
    return b.call(fn, [x])


# ---------------------------------------------------------------- arithmetic

def _add(b, x, y, dt, flags=()):
    return b.fadd(x, y, flags=flags) if _is_float(dt) else (b.or_(x, y) if dt == "i1"
                                                             else b.add(x, y))


def _sub(b, x, y, dt, flags=()):
    return b.fsub(x, y) if _is_float(dt) else b.sub(x, y)


def _mul(b, x, y, dt, flags=()):
    return b.fmul(x, y, flags=flags) if _is_float(dt) else (b.and_(x, y) if dt == "i1"
                                                             else b.mul(x, y))


def _div(b, x, y, dt, flags=()):
    if _is_float(dt):
        return b.fdiv(x, y)
    ty = x.type
    zero = b.icmp_signed("==", y, const(ty, 0))
    if dt in ("i1", "i32"):  # exact in f64 (|x|, |y| < 2^31), vectorizes; saturates
        fty = _like(ty, F64)
        q = _fptosi(b, b.fdiv(b.sitofp(x, fty), b.sitofp(y, fty)), ty)
        return b.select(zero, const(ty, 0), q)
    bits = ty.element.width if isinstance(ty, ir.VectorType) else ty.width
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    ovf = b.and_(b.icmp_signed("==", x, const(ty, lo)), b.icmp_signed("==", y, const(ty, -1)))
    q = b.sdiv(x, b.select(b.or_(zero, ovf), const(ty, 1), y))   # never traps
    return b.select(zero, const(ty, 0), b.select(ovf, const(ty, hi), q))


def _max(b, x, y, dt, flags=()):
    if _is_float(dt):
        return b.call(intrinsic(b, "llvm.maximum", x.type, 2), [x, y])
    if dt == "i1":
        return b.or_(x, y)
    return b.select(b.icmp_signed(">", x, y), x, y)


def _min(b, x, y, dt, flags=()):
    if _is_float(dt):
        return b.call(intrinsic(b, "llvm.minimum", x.type, 2), [x, y])
    if dt == "i1":
        return b.and_(x, y)
    return b.select(b.icmp_signed("<", x, y), x, y)


def _sqrt_pow(b, x, ty):
    """pow(x, 0.5): sqrt(x) + 0 (pow(-0, 0.5) = +0, sqrt(-0) = -0), +inf for x = -inf."""
    r = b.fadd(b.call(intrinsic(b, "llvm.sqrt", ty), [x]), const(ty, 0.0))
    return b.select(b.fcmp_ordered("==", x, const(ty, -math.inf)), const(ty, math.inf), r)


# pow(x, k) for a few constant k without the libm call (powf costs ~6 ns per element and
# vectorizes only as one call per lane): x*x*x (k = 3, within 2 ulp), (x*x)^2 (4, within 3
# ulp), (1/x)^2 (-2, within 2 ulp; 1/(x*x) loses up to 2 bits where
# x*x is subnormal), sqrt (0.5, correctly rounded) and 1/sqrt (-0.5, within
# 1.5 ulp); every special value of C99's pow comes out the same (signed zeros, infinities,
# NaN); k = 1, 2, -1 and 0 (or -0) are x, x*x, 1/x and 1 exactly
def _square(b, v):
    return b.fmul(v, v)


_POW_CONST = {
    1.0: lambda b, x, ty: x,
    2.0: lambda b, x, ty: _square(b, x),
    -1.0: lambda b, x, ty: b.fdiv(const(ty, 1.0), x),
    0.0: lambda b, x, ty: const(ty, 1.0),
    3.0: lambda b, x, ty: b.fmul(_square(b, x), x),
    4.0: lambda b, x, ty: _square(b, _square(b, x)),
    -2.0: lambda b, x, ty: _square(b, b.fdiv(const(ty, 1.0), x)),
    0.5: _sqrt_pow,
    -0.5: lambda b, x, ty: b.fdiv(const(ty, 1.0), _sqrt_pow(b, x, ty)),
}


def pow_exp_log(b, x, y, wide=None):
    """x**y as exp(y*log|x|) (mathlib's kernels) with C99's / NumPy's special values, for
    float or double scalars or vectors.  wide=F64 (float32 x, y): computed in float64 and
    rounded once to float32, so correctly rounded but for float64's 2^-44-sized error (the
    product y*log|x| is at most ~150 in size where the result is finite).  Rules: y == 0,
    x == 1 or (x, y) = (-1, +-inf) give 1 (NaN included); an odd integer y keeps the sign of
    x (-0 and -inf too); a finite x < 0 with a non-integer y gives NaN."""
    ty = x.type
    el = ty.element if isinstance(ty, ir.VectorType) else ty
    ity = _like(ty, I64 if isinstance(el, ir.DoubleType) else I32)
    from rlxc.lowering.shared import mathlib

    def fabs(v):
        return b.call(intrinsic(b, "llvm.fabs", v.type), [v])

    if wide is None:
        r = mathlib.emit(b, "exp", b.fmul(y, mathlib.emit(b, "log", fabs(x))))
    else:
        wt = _like(ty, wide)
        xw, yw = b.fpext(fabs(x), wt), b.fpext(y, wt)
        r = b.fptrunc(mathlib.emit(b, "exp", b.fmul(yw, mathlib.emit(b, "log", xw))), ty)
    yt = b.call(intrinsic(b, "llvm.trunc", ty), [y])
    yint = b.fcmp_ordered("==", yt, y)                   # y integral (+-inf too, NaN not)
    limit = 9007199254740992.0 if isinstance(el, ir.DoubleType) else 16777216.0
    big = b.fcmp_ordered(">=", fabs(y), const(ty, limit))  # every float this big is even
    small_int = b.and_(yint, b.not_(big))
    odd = b.trunc(b.fptosi(b.select(small_int, yt, const(ty, 0.0)), ity), _like(ty, I1))
    odd = b.and_(small_int, odd)
    signbit = b.icmp_signed("<", b.bitcast(x, ity), const(ity, 0))   # -0 and -inf too
    r = b.select(b.and_(signbit, odd), b.fneg(r), r)
    xneg = b.and_(b.fcmp_ordered("<", x, const(ty, 0.0)),
                  b.fcmp_ordered("!=", x, const(ty, -math.inf)))       # finite x < 0
    r = b.select(b.and_(xneg, b.not_(yint)), const(ty, math.nan), r)
    one = b.or_(b.fcmp_ordered("==", y, const(ty, 0.0)), b.fcmp_ordered("==", x, const(ty, 1.0)))
    one = b.or_(one, b.and_(b.fcmp_ordered("==", x, const(ty, -1.0)),        # (-1)^+-inf
                            b.fcmp_ordered("==", fabs(y), const(ty, math.inf))))
    return b.select(one, const(ty, 1.0), r)


def pow_exp_log_path(dt: str, k: float | None, rules=None) -> bool:
    """Whether rlx.pow on dtype `dt` with exponent `k` (a constant, or None) under `rules`
    (LOWER_RULES or LIBM_POW_RULES) is the float32 exp(y*log|x|) of pow_exp_log (a long
    dependency chain per element: lowering/cpu/vmap.py runs its loops as explicit vectors
    with two independent chains)."""
    return dt == "f32" and (rules is None or rules is LOWER_RULES) and \
        (k is None or k not in _POW_CONST)


def _uniform_float(v):
    """The value of a float constant, scalar or splat vector (elements given as floats or as
    constants), else None."""
    c = getattr(v, "constant", None)
    if isinstance(c, list):
        vals = {float(getattr(e, "constant", e)) for e in c}
        return vals.pop() if len(vals) == 1 else None
    return float(c) if isinstance(c, float) else None


def _pow(b, x, y, dt, flags=(), wide=True):
    ty = x.type
    if _is_float(dt):
        k = _uniform_float(y)
        fast = _POW_CONST.get(k)
        if fast is not None:
            return fast(b, x, ty)
        if wide and pow_exp_log_path(dt, k):   # vectorizes (libm's powf: one call per lane)
            return pow_exp_log(b, x, y, wide=F64)
        return b.call(intrinsic(b, "llvm.pow", ty, 2), [x, y])
    return int_pow(b, x, y, ty)


def int_pow(b, x, y, ty):
    """x ** y on integers (header): square-and-multiply over the exponent's bits, with
    selects (no branches, so it vectorizes; a constant exponent folds to its products)."""
    bits = (ty.element if isinstance(ty, ir.VectorType) else ty).width
    zero, one = const(ty, 0), const(ty, 1)
    neg = b.icmp_signed("<", y, zero)
    e = b.select(neg, zero, y)
    r, base = one, x
    for i in range(bits - 1):           # the sign bit is handled by `neg`
        bit = b.icmp_signed("!=", b.and_(e, const(ty, 1 << i)), zero)
        r = b.select(bit, b.mul(r, base), r)
        if i < bits - 2:
            base = b.mul(base, base)
    # y < 0: 1 / x ** -y truncated: 1 for x = 1, (-1) ** y for x = -1, else 0
    odd = b.icmp_signed("!=", b.and_(y, one), zero)
    m1 = b.select(odd, const(ty, -1), one)
    inv = b.select(b.icmp_signed("==", x, one), one,
                   b.select(b.icmp_signed("==", x, const(ty, -1)), m1, zero))
    return b.select(neg, inv, r)


def _rem(b, x, y, dt, flags=()):
    """Truncated remainder (C fmod): the sign of x.  Integers: x rem 0 and INT_MIN rem -1
    are 0 (NumPy's results; srem would trap)."""
    if _is_float(dt):
        return b.frem(x, y)
    ty = x.type
    bad = b.or_(b.icmp_signed("==", y, const(ty, 0)), b.icmp_signed("==", y, const(ty, -1)))
    return b.srem(x, b.select(bad, const(ty, 1), y))


_COMBINE = {"add": _add, "sub": _sub, "mul": _mul, "div": _div, "max": _max, "min": _min,
            "pow": _pow, "rem": _rem,
            "or": lambda b, x, y, dt, flags=(): b.or_(x, y),
            "and": lambda b, x, y, dt, flags=(): b.and_(x, y)}


def combine(b, op, x, y, dt, flags=()):
    """Binary arithmetic `x op y` on dtype dt: the binary rows below and the accumulator
    updates of reductions (op: add, sub, mul, div, pow, max, min, and, or)."""
    fn = _COMBINE.get(op)
    if fn is None:
        raise NotImplementedError(f"lowering: no combine rule for {op!r}; valid: "
                                  f"{sorted(_COMBINE)}")
    return fn(b, x, y, dt, flags)


def identity(op: str, dt: str):
    """The identity element of accumulator update `op` on dtype dt, as a Python value."""
    if dt == "i1":
        return {"add": False, "or": False, "max": False, "mul": True, "and": True,
                "min": True}[op]
    if dt in ("i32", "i64"):
        bits = 31 if dt == "i32" else 63
        return {"add": 0, "mul": 1, "max": -(1 << bits), "min": (1 << bits) - 1}[op]
    return {"add": 0.0, "mul": 1.0, "max": -math.inf, "min": math.inf}[op]


# ---------------------------------------------------------------- casts, fake_quant

def cast(b, x, src: str, dst: str):
    """Convert x from dtype src to dst (rules in the header)."""
    if src == dst:
        return x
    to = vtype(dst, width_of(x))
    if _is_float(src):
        if _is_float(dst):
            return b.fpext(x, to) if dst == "f64" else b.fptrunc(x, to)
        if dst == "i1":
            return b.fcmp_unordered("!=", x, const(x.type, 0.0))
        return _fptosi(b, x, to)
    if src in ("i1", "u32"):   # unsigned sources: zero-extended
        if _is_float(dst):
            return b.uitofp(x, to)
        if dst == "i1":
            return b.icmp_unsigned("!=", x, const(x.type, 0))
        if TYPES[dst].width == TYPES[src].width:
            return x
        return b.zext(x, to) if TYPES[dst].width > TYPES[src].width else b.trunc(x, to)
    if _is_float(dst):
        return b.sitofp(x, to)
    if dst == "i1":
        return b.icmp_signed("!=", x, const(x.type, 0))
    sw, dw = TYPES[src].width, TYPES[dst].width
    if sw == dw:               # i32 <-> u32: the same bits
        return x
    return b.sext(x, to) if dw > sw else b.trunc(x, to)


def _f32_bits(v: float) -> int:
    return struct.unpack("<I", struct.pack("<f", float(np.float32(v))))[0]


def fake_quant(b, x, exp_bits: int, man_bits: int, max_normal: float):
    """Round f32 (or <N x f32>) x to the (exp_bits, man_bits) grid; see the header."""
    E, M = int(exp_bits), int(man_bits)
    if not (1 <= E <= 8 and 0 <= M <= 23):
        raise NotImplementedError(f"lowering: rlx.fake_quant e{E}m{M} does not fit in f32")
    emin = 2 - 2 ** (E - 1)
    q = emin - M
    qbits = ((q + 127) << 23) if q >= -126 else (1 << (q + 149))
    limit = _f32_bits(max_normal)
    ity = _like(x.type, I32)

    def k(v):
        return const(ity, v & 0xFFFFFFFF if v >= 0 else v)

    def smax(p, r):
        return b.select(b.icmp_signed(">", p, r), p, r)

    def smin(p, r):
        return b.select(b.icmp_signed("<", p, r), p, r)

    u = b.bitcast(x, ity)
    sign = b.and_(u, k(-0x80000000))
    a = b.and_(u, k(0x7FFFFFFF))
    eb = b.lshr(a, k(23))
    e_eff = b.sub(smax(eb, k(1)), k(127))
    ex = smax(b.sub(eb, k(127)), k(emin))
    d = b.add(b.sub(ex, e_eff), k(23 - M))
    dc = smin(smax(d, k(0)), k(24))
    one = b.shl(k(1), dc)
    mask = b.sub(one, k(1))
    half = b.lshr(one, k(1))
    low = b.and_(a, mask)
    base = b.and_(a, b.xor(mask, k(-1)))  # a carry out of the mantissa bumps the exponent
    # parity of the kept significand: bit d of the mantissa with its implicit 1 (d = 23
    # reaches the implicit bit, which a's exponent field does not hold)
    sig = b.select(b.icmp_unsigned("!=", eb, k(0)), b.or_(b.and_(a, k(0x7FFFFF)), k(0x800000)), a)
    odd = b.icmp_unsigned("!=", b.and_(b.lshr(sig, dc), k(1)), k(0))
    up = b.or_(b.icmp_unsigned(">", low, half),
               b.and_(b.icmp_unsigned("==", low, half), odd))
    up = b.and_(up, b.icmp_signed(">", d, k(0)))
    r = b.add(base, b.select(up, one, k(0)))
    big = b.and_(b.icmp_unsigned("!=", eb, k(0)), b.icmp_signed(">=", d, k(24)))
    tie_up = b.and_(b.icmp_signed("==", d, k(24)),
                    b.icmp_unsigned("!=", b.and_(a, k(0x7FFFFF)), k(0)))
    r = b.select(big, b.select(tie_up, k(qbits), k(0)), r)
    r = b.select(b.icmp_unsigned(">", r, k(limit)), k(limit), r)
    res = b.bitcast(b.or_(r, sign), x.type)
    isnan = b.icmp_unsigned(">", a, k(0x7F800000))
    return b.select(isnan, x, res)


# ---------------------------------------------------------------- the rules

def _neg(c, x):
    return c.b.fneg(x) if _is_float(c.dtype) else c.b.sub(const(x.type, 0), x)


def _sqrt(c, x):
    return c.b.call(intrinsic(c.b, "llvm.sqrt", x.type), [x])


def _rsqrt(c, x):
    return c.b.fdiv(const(x.type, 1.0), _sqrt(c, x))


def _reciprocal(c, x):
    return c.b.fdiv(const(x.type, 1.0), x)


def _relu(c, x):
    z = const(x.type, 0.0)
    return c.b.select(c.b.fcmp_unordered(">", x, z), x, z)   # NaN stays NaN


def _abs(c, x):
    b, ty = c.b, x.type
    if _is_float(c.dtype):
        return b.call(intrinsic(b, "llvm.fabs", ty), [x])
    return b.select(b.icmp_signed("<", x, const(ty, 0)), b.sub(const(ty, 0), x), x)


def _sign(c, x):
    b, ty = c.b, x.type
    if _is_float(c.dtype):
        pos, neg = b.fcmp_ordered(">", x, const(ty, 0.0)), b.fcmp_ordered("<", x, const(ty, 0.0))
        return b.select(pos, const(ty, 1.0), b.select(neg, const(ty, -1.0), x))
    pos, neg = b.icmp_signed(">", x, const(ty, 0)), b.icmp_signed("<", x, const(ty, 0))
    return b.select(pos, const(ty, 1), b.select(neg, const(ty, -1), const(ty, 0)))


def _rounding(intrin):
    """floor / ceil / round (halves to even): one intrinsic each (vroundps; cvt.rmi/rpi/rni)."""
    return lambda c, x: c.b.call(intrinsic(c.b, intrin, x.type), [x])


def _math(name):
    def rule(c, *args):   # unary (exp) or binary (atan2, hypot): mathlib knows the arity
        from rlxc.lowering.shared import mathlib

        return mathlib.emit(c.b, name, *args)
    rule.__name__ = f"math_{name}"
    return rule


def _binary(kind):
    return lambda c, x, y: combine(c.b, kind, x, y, c.dtype)


def _mul(c, x, y):
    """x * y; a product of two ratio-form transcendentals (tanh(u) * sigmoid(v), ...) with
    one division instead of one per factor (lowering/shared/mathlib_ratio.py)."""
    if c.dtype == "f32":
        from rlxc.lowering.shared.mathlib_ratio import fused_product

        r = fused_product(c.b, x, y)
        if r is not None:
            return r
    return combine(c.b, "mul", x, y, c.dtype)


def _compare(name):
    def rule(c, x, y):
        b, adt = c.b, c.arg_dtype
        if _is_float(adt):
            return b.fcmp_unordered("!=", x, y) if name == "ne" else \
                b.fcmp_ordered(FCMP[name], x, y)
        sym = "!=" if name == "ne" else FCMP[name]
        return (b.icmp_unsigned if adt == "i1" else b.icmp_signed)(sym, x, y)
    return rule


LOWER_RULES = {
    "rlx.neg": _neg,
    "rlx.sqrt": _sqrt,
    "rlx.rsqrt": _rsqrt,
    "rlx.reciprocal": _reciprocal,
    "rlx.relu": _relu,
    "rlx.abs": _abs,
    "rlx.sign": _sign,
    "rlx.stop_gradient": lambda c, x: x,
    "rlx.floor": _rounding("llvm.floor"),
    "rlx.ceil": _rounding("llvm.ceil"),
    "rlx.round": _rounding("llvm.roundeven"),
    "rlx.fake_quant": lambda c, x: fake_quant(c.b, x, **c.params),
    "rlx.cast": lambda c, x: cast(c.b, x, c.arg_dtype, c.dtype),
    "rlx.select": lambda c, m, x, y: c.b.select(m, x, y),
    "rlx.add": _binary("add"),
    "rlx.sub": _binary("sub"),
    "rlx.mul": _mul,
    "rlx.div": _binary("div"),
    "rlx.pow": _binary("pow"),
    "rlx.maximum": _binary("max"),
    "rlx.minimum": _binary("min"),
    "rlx.rem": _binary("rem"),
    **{f"rlx.{n}": _compare(n) for n in (*FCMP, "ne")},
    "rlx.philox": philox_rule,     # lowering/shared/philox.py
    # every transcendental: derived from its `math` property (dialect/shapes.py)
    **{name: _math(s.math) for name, s in SHAPES.items() if s.math},
}

# Targets without FMA (baseline x86-64, AVX without FMA): float32 pow through libm's powf, whose
# one call per lane beat the float64 exp/log there (SSE2, 1M floats, Zen 3: 8.7 ms against
# 13.9 ms); codegen picks the table per CPU (cpu_rules)
LIBM_POW_RULES = {**LOWER_RULES,
                  "rlx.pow": lambda c, x, y: _pow(c.b, x, y, c.dtype, wide=False)}


def cpu_rules(fma: bool) -> dict:
    """The rule table for a CPU target with or without FMA."""
    return LOWER_RULES if fma else LIBM_POW_RULES

_missing = sorted(n for n, s in SHAPES.items() if s.elementwise and n not in LOWER_RULES)
assert not _missing, f"no lowering rule for {_missing}"


def check(name: str, dtype: str, target: str) -> None:
    """NotImplementedError unless op `name` computes in `dtype` (its `dtypes` property)."""
    s = SHAPES.get(name)
    if s is not None and s.family in ("unary", "binary") and dtype not in s.dtypes:
        raise NotImplementedError(
            f"{target}: {name} on {dtype} is not supported (computed in "
            f"{'/'.join(s.dtypes)}) - cast to f32 before compiling")


def emit(b: ir.IRBuilder, name: str, args: list, dtype: str, arg_dtype: str | None = None,
         params: dict | None = None, rules: dict = LOWER_RULES, target: str = "lowering"):
    """Apply the rule of op `name` ("rlx.exp") to the emitted `args` (scalars or vectors)."""
    rule = rules.get(name)
    if rule is None:
        raise NotImplementedError(f"{target}: no scalar lowering rule for {name}")
    check(name, dtype, target)
    return rule(At(b, dtype, arg_dtype or dtype, dict(params or {})), *args)


def emit_op(b: ir.IRBuilder, node, args: list, rules: dict = LOWER_RULES):
    """The CPU loop IR's loops.Op `node` applied to its emitted `args` (the rule of
    rlx.<node.op> in `rules`; `and`/`or` are the loop IR's mask operators)."""
    op = node.op
    if op in ("and", "or"):
        return combine(b, op, args[0], args[1], node.dtype)
    adt = node.args[0].dtype if node.args else node.dtype
    return emit(b, f"rlx.{op}", args, node.dtype, adt, dict(node.params), rules,
                target="cpu backend")

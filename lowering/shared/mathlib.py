"""Vectorizable elementwise math, float32 and float64, emitted as LLVM IR (llvmlite.ir).

    emit(builder, "gelu", x)          x: float, double, <N x float> or <N x double>
    emit(builder, "atan2", y, x)      two-argument functions: atan2, hypot
        │ defines once per module:  define internal float @rlx.math.gelu.f32(float) alwaysinline
        │                           (@rlx.math.gelu.v8f32, @rlx.math.gelu.f64, ...v4f64, ...)
        ▼
    call -> after O3: inlined straight-line fmul/fadd/select/bitcast code, which the loop
            vectorizer widens on x86-64 and which NVPTX lowers to plain PTX instructions.

FUNCTIONS = {name: Fn(arity, ulp_f32, ulp_f64)} is the table other code derives name sets
from (names(dtype, arity) lists them); BOUNDS holds the bounds the tests enforce.  Kernels:
float32 here, float64 in mathlib_f64.py, the inverse-trigonometric, hyperbolic and base-2/10
functions for both types in mathlib_more.py (their headers give the algorithms), the shared
builder helpers in mathlib_core.py.

No function here calls libm or the llvm.exp/llvm.log/llvm.sin intrinsics (those become
libm calls on x86 and are unsupported on NVPTX).  The only intrinsics used are llvm.fmuladd
(an FMA where the target has one, mul+add otherwise: every algorithm below is accurate with
either), llvm.fabs, llvm.copysign, llvm.fshl (sin/cos) and llvm.sqrt (mathlib_more).  No
llvm.floor/rint either (libcalls on baseline x86-64): rounding to an integer is the add/sub
of 1.5*2^23 (1.5*2^52) trick.  Special cases are selects; the only branch is the uniform
one of sin/cos/tan into Payne-Hanek for huge arguments, and the only memory read is the
40-entry constant table of 2/pi that float64 Payne-Hanek takes its bits from.

Max error in ulps of the exact result, over every finite input (subnormal ulp 2^-149 /
2^-1074), enforced by tests/test_mathlib.py, test_mathlib_f64.py, test_mathlib_more.py on
large random + special samples for host code (FMA) and baseline x86-64 (no FMA).  Measured
maxima over ~1M points per function (x2 seeds, host and baseline; scripts/mathlib_measure.py)
in parentheses:

    name       float32        float64        name    float32      float64
    exp        1.5 (1.00)     1 (0.75)       atan    2.5 (2.02)   3 (2.35)
    expm1      2 (1.50)       2 (1.41)       atan2   2.5 (2.08)   3 (2.22)
    log        1 (0.76)       1 (0.78)       asin    3 (2.31)     3 (2.14)
    log1p      2 (1.44)       2 (1.43)       acos    1.5 (1.07)   1.5 (1.16)
    sin        2 (1.55)       1 (0.77)       sinh    3 (2.27)     3 (2.21)
    cos        2 (1.55)       1 (0.77)       cosh    2 (1.51)     2 (1.17)
    tanh       2 (1.70)       3 (2.34)       tan     3 (2.32)     3 (2.04)
    sigmoid    3 (2.33)       2.5 (1.98)     asinh   2.5 (1.81)   2.5 (1.88)
    silu       3 (2.34)       3.5 (2.84)     acosh   2.5 (2.02)   2.5 (1.80)
    erf        1.5 (0.94)     1.5 (0.98)     atanh   2.5 (1.83)   2.5 (1.80)
    erfc       3.5 (2.98)     3.5 (2.69)     log2    2 (1.65)     2 (1.55)
    gelu       4 (2.82)       5 (3.89)       log10   2.5 (1.90)   3.5 (2.80)
    gelu_tanh  3.5* (2.51)    3.5* (2.77)    exp2    1.5 (0.98)   1.5 (1.00)
    softplus   2.5 (1.83)     2 (1.79)       hypot   2.5 (1.90)   2.5 (1.86)
    * for x >= GELU_TANH_EXACT_FROM = -1 (below: see gelu_tanh).

float32 algorithms (in parentheses the maximum measured over all 2^32 inputs with host code
(FMA) / over every 8th float32 with baseline x86-64 code (no FMA)):

  exp       Cody-Waite: n = round(x/ln2) by the 1.5*2^23 trick, r = x - n*ln2 in two parts
            (ln2_hi has 9 bits, so n*ln2_hi is exact), e^r = 1 + r + r^2*Q(r) (Cephes, degree
            5), and 2^n applied as two exponent-field multiplies, 2^(n/2) * 2^(n-n/2), so
            overflow gives inf and underflow rounds once into the subnormals.  x is clamped to
            [-110, 89] with ordered compares (NaN passes through).          1.5 ulp (1.01 / 0.98)
  expm1     the same reduction; 2^n*(e^r-1) + (2^n-1) with e^r-1 = r + r^2*Q(r); e^x for
            x > 18.                                                           2 ulp (1.44 / 1.56)
  log       x = 2^e*m, m in [sqrt(1/2), sqrt(2)), by integer arithmetic on the bits (subnormals
            are scaled by 2^23 first); log(m) = f - f^2/2 + f^3*P(f), f = m-1 exact (Cephes,
            degree 8); e*ln2 added in two parts.                              1 ulp (0.83 / 0.80)
  log1p     log(u) + (x - (u-1))/u, u = 1+x (the rounding of u, corrected).  2 ulp (1.44 / 1.34)
  sin, cos  j = round(x*2/pi); r = x - j*pi/2 with pi/2 in five parts (68 bits), the first four
            10 bits wide so every j*P_k is exact for |j| < 2^14; the chain is exact up to two
            Knuth two-sums, so r is off by at most ~0.5 ulp even next to a multiple of pi/2
            (|r| >= 2^-27.8 for float32 |x| < 2^15).  Finite |x| >= 2^14: Payne-Hanek in
            64-bit integers (see _reduce_pio2_large_f32: 96 bits of 2/pi cut out by the
            exponent, no table, no loads), then r rounded once to float32.  That block runs
            only when some lane needs it (a uniform branch: free in scalar, GPU and explicit
            vector code; LLVM's loop vectorizer if-converts it, so an auto-vectorized sin
            pays for it on every element: 1M-element rlxc sin 0.59 -> 1.56 ms).  sin r, cos r: Cephes
            polynomials on [-pi/4, pi/4]; j mod 4 picks the polynomial and the sign.
            +-inf gives NaN.  The bound holds for every finite float32.   2 ulp (1.58 / 1.57)
  tanh, sigmoid, silu, gelu_tanh share a cheaper exp core, e^(c*v) = 2^(n+k)*(1 + c*h) for
            c = -1 or 2: reduced on v itself (the polynomial's coefficients absorb the power-of-
            two c, so -v or 2v costs nothing), e^r = 1 + r + r^2*Q(r) of degree 6 (minimax,
            2^-28.3), and 2^(n+k) read off the rounding sum t = c*v/ln2 + 1.5*2^23 + 127 + k as
            bits(t) << 23 (no ldexp: the callers keep n + k in the normal range).
  tanh      one exp and one division for every |x| (no second polynomial for small |x|:
            W1's fused tanh*sigmoid loop is bound by vector ALU ops, not by its divisions):
            g = (e^2a - 1)/2 and D = (e^2a + 1)/2 (a = |x|), each (2^n -+ 1)/2 + 2^n*h
            rounded once; a >= 0.625: 1 - 1/D; below, q = g/D refined as g - g*q (the
            error of q scaled by g < 1.2).  ln2 as one float in the reduction (the argument
            moves by <= 3e-8, < 0.05 ulp of tanh); a clamped to 10; copysign.
                                                                              2 ulp (1.77 / 1.86)
  sigmoid   2^-64 / (2^-64 + e^-x*2^-64), x clamped to [-110, 40]: e^-x*2^-64 is a normal
            number, the one division rounds the result once, also into the subnormals; the
            denominator is one FMA, s*p + 2^-64, p = e^r as one Horner chain (no cancellation).
                                                                              3 ulp (2.48 / 2.45)
  tanh(u) * sigmoid(v), a product of the two (W1 of benchmarks/compare.py), is formed with
            one division by the `rlx.mul` rule: mathlib_ratio.py (4.5 ulp of the product).
  silu      x*sigmoid(x) = x/(1+e), e = e^-|x|; x < 0: (x*e*2^64)/((1+e)*2^64), x*e formed
            as x*2^(n+64) + (x*2^(n+64))*em with one rounding, so a tiny result rounds once
            into the subnormals.                                              3 ulp (2.67 / 2.73)
  erf       |x| < 0.8: x + x*Q(x^2) (degree 5, minimax); else 1 - erfc(|x|).  1.5 ulp (0.95 / 0.94)
  erfc      z >= 0.5: erfc(z) = e^(-z^2) * R(z), R = P1(z-1.25) (degree 10) on [0.5, 2] and
            R = P2(1/z^2)/z (degree 8) on (2, 10.5] (coefficients chosen by select; both
            minimax fits of erfcx(z) = e^(z^2)*erfc(z) in relative error).  z^2 = zh^2 +
            zl*(z+zh) with zh = z cut to 12 bits (zh^2 exact) goes to exp as a hi/lo pair, so
            e^(-z^2) has no error from rounding z^2.  R's polynomial: Estrin's scheme above
            its three lowest terms (Ops.estrin: ~5 multiply-add latencies instead of 10; the
            Horner steps at the bottom carry the rounding).  x < -0.5: 2 - erfc(-x); |x| < 0.5:
            1 - erf(x).                                                     3.5 ulp (2.87 / 2.88)
  gelu      0.5*x*(1+erf(x/sqrt2)); for x/sqrt2 <= -0.5 it is 0.5*x*erfc(|x|/sqrt2), with
            (x/sqrt2)^2 = x^2/2 formed exactly from the split of x and the /z of P2 folded into
            the constant 0.5*x/|z| = -1/sqrt2: accurate to the last subnormal of the tail.
            One reciprocal 1/|z| gives P2's 1/z^2 and the x > 0 side's erfc /z (damped there
            by 2 - erfc), and both signs share one e^r and one 2^n (erf's 1 - erfc likewise:
            one reciprocal).  Measured after that change on every 31st float32 of [-16, 16]
            (71M points): 2.63 / 2.85 ulp (erf on [-4.5, 4.5]: 0.93 / 0.91).
                                                                              4 ulp (3.02 / 3.24)
  gelu_tanh 0.5*x*(1+tanh(u)), u = sqrt(2/pi)*(x+0.044715x^3), as x*sigmoid(2u) (no
            cancellation for x < 0).  The bound holds for x >= GELU_TANH_EXACT_FROM = -1.
            Below, the rounding of the cubic w = 2u (relative ~2^-23) is amplified by e^w: the
            error is at most 4 + 3*|w| ulp (measured 4 + 2.73*|w|; ~200 ulp of a 1e-37 result
            at x = -10, where it underflows).  Evaluated like silu, f = x, w = 2u.
                                                                            3.5 ulp (2.80 / 2.83)
  softplus  max(x, 0) + log1p(e^-|x|): no overflow, softplus(-large) = e^x with subnormals,
            softplus(large) = x.                                            2.5 ulp (1.99 / 1.96)

IEEE behaviour: a NaN input gives NaN for every op (clamps use ordered compares, so NaN is
never turned into a number); exp(+-inf) = inf/0, log(0) = -inf, log(<0) = NaN, log(inf) = inf,
tanh/erf(+-inf) = +-1, sigmoid(+-inf) = 1/0, sin/cos(+-inf) = NaN, softplus(+inf) = inf,
gelu/silu/gelu_tanh(-inf) = -0, (+inf) = inf; odd functions keep the sign of -0.  The same
for float64, and for mathlib_more's functions (C99 Annex F values: atan2 of zeros and
infinities, hypot(+-inf, NaN) = inf, asin/acos/acosh/atanh outside the domain = NaN).
"""
from __future__ import annotations

from typing import NamedTuple

from llvmlite import ir

__all__ = ["emit", "get_function", "names", "FUNCTIONS", "Fn", "BOUNDS", "SUPPORTED",
           "GELU_TANH_EXACT_FROM"]

from .mathlib_core import F32, F64, I32, I64, KERNELS, Ops as _Ops, two_sum as _two_sum, type_suffix
from .mathlib_core import log1p_via, log_specials

class Fn(NamedTuple):
    """One math function: its arity and its max error in ulps of the exact result over all
    finite inputs (None: not available for that dtype; the header gives the exceptions)."""
    arity: int
    ulp_f32: float | None
    ulp_f64: float | None

    def ulp(self, dtype: str) -> float | None:
        return self.ulp_f32 if dtype == "f32" else self.ulp_f64


# Max error in ulps of the exact result (float32: subnormal ulp 2^-149; float64: 2^-1074) over
# all finite inputs, enforced by tests/test_mathlib*.py; gelu_tanh f32: for x >=
# GELU_TANH_EXACT_FROM (the header gives the error elsewhere).  FUNCTIONS is built from this
# and the registered kernels; every kernel must have a bound here.
BOUNDS: dict[str, dict[str, float]] = {
    "f32": {
        "exp": 1.5, "expm1": 2.0, "log": 1.0, "log1p": 2.0,
        "sin": 2.0, "cos": 2.0, "tanh": 2.0, "sigmoid": 3.0, "silu": 3.0,
        "erf": 1.5, "erfc": 3.5, "gelu": 4.0, "gelu_tanh": 3.5, "softplus": 2.5,
        "atan": 2.5, "atan2": 2.5, "asin": 3.0, "acos": 1.5, "sinh": 3.0, "cosh": 2.0,
        "tan": 3.0, "asinh": 2.5, "acosh": 2.5, "atanh": 2.5, "log2": 2.0, "log10": 2.5,
        "exp2": 1.5, "hypot": 2.5,
    },
    "f64": {
        "exp": 1.0, "expm1": 2.0, "log": 1.0, "log1p": 2.0, "sin": 1.0, "cos": 1.0,
        "tanh": 3.0, "sigmoid": 2.5, "silu": 3.5, "softplus": 2.0, "gelu_tanh": 3.5,
        "erf": 1.5, "erfc": 3.5, "gelu": 5.0,
        "atan": 3.0, "atan2": 3.0, "asin": 3.0, "acos": 1.5, "sinh": 3.0, "cosh": 2.0,
        "tan": 3.0, "asinh": 2.5, "acosh": 2.5, "atanh": 2.5, "log2": 2.0, "log10": 3.5,
        "exp2": 1.5, "hypot": 2.5,
    },
}
GELU_TANH_EXACT_FROM = -1.0     # below: <= 4 + 3*|2u| ulp, 2u = 2*sqrt(2/pi)*(x + 0.044715x^3)


# ---------------------------------------------------------------------------- exp family
_LOG2E = 1.4426950408889634
_MAGIC = 12582912.0          # 1.5*2^23: (v + MAGIC) - MAGIC = round(v) for |v| < 2^22
_MAGIC_BITS = 0x4B400000
_LN2_HI = 0.693359375        # 9 significant bits: n*_LN2_HI exact for |n| < 2^15
_LN2_LO = -2.12194440e-4     # ln2 - _LN2_HI
_LN2 = 0.6931471824645996   # ln2 rounded to float32 (ln2 - _LN2 = -1.9e-9)
# e^r = 1 + r + r^2*Q(r) on |r| <= ln2/2 (Cephes expf)
_EXP_Q = (5.0000001201e-1, 1.6666665459e-1, 4.1665795894e-2, 8.3334519073e-3,
          1.3981999507e-3, 1.9875691500e-4)
_EXP_MIN, _EXP_MAX = -110.0, 89.0   # e^-110 < 2^-150/2 (rounds to 0), e^89 > FLT_MAX


def _exp_reduce(o, hi, lo=None):
    """x = hi (+ lo) -> (r, n) with e^x = e^r * 2^n, |r| <~ ln2/2.  hi - n*ln2_hi is exact
    for any float |hi| <= 128, so a hi/lo pair carries extra precision into r."""
    hi = o.clamp(hi, _EXP_MIN, _EXP_MAX)
    t = o.fma(hi, o.f(_LOG2E), o.f(_MAGIC))
    n = o.isub(o.bits(t), o.i(_MAGIC_BITS))
    nf = o.sub(t, o.f(_MAGIC))
    r = o.fma(nf, o.f(-_LN2_HI), hi)
    r = o.fma(nf, o.f(-_LN2_LO), r)
    if lo is not None:
        r = o.add(r, lo)
    return r, n


def _expm1_poly(o, r):
    return o.fma(o.mul(r, r), o.horner(r, _EXP_Q), r)


def _exp_parts(o, hi, lo=None):
    """e^(hi+lo) = p * 2^n with p in [0.7, 1.42]."""
    r, n = _exp_reduce(o, hi, lo)
    return o.add(_expm1_poly(o, r), o.f(1.0)), n


def _exp(o, x):
    p, n = _exp_parts(o, x)
    return o.ldexp(p, n)


def _expm1(o, x):
    r, n = _exp_reduce(o, o.sel(o.lt(x, o.f(-30.0)), o.f(-30.0), x))
    em = _expm1_poly(o, r)
    s = o.pow2(n)                                    # only used for x <= 18 (n <= 26)
    small = o.fma(s, em, o.sub(s, o.f(1.0)))
    big = o.ldexp(o.add(em, o.f(1.0)), n)            # e^x - 1 == e^x to float precision
    res = o.sel(o.gt(x, o.f(18.0)), big, small)
    return o.sel(o.eq(x, o.f(0.0)), x, res)          # expm1(-0) = -0


def _exp_nonpos(o, x):
    """e^x for x <= 0 (or NaN), the exp above without its overflow path: one exponent-field
    multiply instead of ldexp's two; x < -87 gives 0 (so e^-inf = 0 exactly, and no
    subnormal results), NaN stays NaN.  The online softmax of the attention kernels calls
    it on score - running max, which is never positive."""
    tiny = o.lt(x, o.f(-87.0))
    xc = o.sel(tiny, o.f(-87.0), x)
    t = o.fma(xc, o.f(_LOG2E), o.f(_MAGIC))
    nf = o.sub(t, o.f(_MAGIC))
    r = o.fma(nf, o.f(-_LN2_HI), xc)
    r = o.fma(nf, o.f(-_LN2_LO), r)
    p = o.add(_expm1_poly(o, r), o.f(1.0))
    scale = o.flt(o.shl(o.iadd(o.bits(t), o.i(127 - _MAGIC_BITS)), 23))
    return o.sel(tiny, o.f(0.0), o.mul(p, scale))


def exp_nonpos(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """Inline e^x for x <= 0 (float or <N x float>): see _exp_nonpos."""
    return _exp_nonpos(_Ops(builder, x.type), x)


# ---------------------------------------------------------------------------- log family
_SQRT_HALF_BITS = 0x3F3504F3
# log(1+f) = f - f^2/2 + f^3*P(f) on f in [sqrt(1/2)-1, sqrt(2)-1] (Cephes logf)
_LOG_P = (3.3333331174e-1, -2.4999993993e-1, 2.0000714765e-1, -1.6668057665e-1,
          1.4249322787e-1, -1.2420140846e-1, 1.1676998740e-1, -1.1514610310e-1,
          7.0376836292e-2)


def _log_parts(o, x):
    """(e, log(m)) with x = 2^e*m, m in [sqrt(1/2), sqrt(2)); log(1) = 0 exactly."""
    tiny = o.lt(x, o.f(2.0 ** -126))
    xs = o.sel(tiny, o.mul(x, o.f(2.0 ** 23)), x)
    ix = o.isub(o.bits(xs), o.i(_SQRT_HALF_BITS))
    e = o.iadd(o.ashr(ix, 23), o.b.select(tiny, o.i(-23), o.i(0)))
    f = o.sub(o.flt(o.iadd(o.iand(ix, o.i(0x7FFFFF)), o.i(_SQRT_HALF_BITS))), o.f(1.0))
    z = o.mul(f, f)
    y = o.fma(z, o.f(-0.5), o.mul(f, o.mul(z, o.horner(f, _LOG_P))))
    return o.itof(e), o.add(f, y)


def _log(o, x, specials=True):
    tiny = o.lt(x, o.f(2.0 ** -126))
    xs = o.sel(tiny, o.mul(x, o.f(2.0 ** 23)), x)
    ix = o.isub(o.bits(xs), o.i(_SQRT_HALF_BITS))
    e = o.iadd(o.ashr(ix, 23), o.b.select(tiny, o.i(-23), o.i(0)))
    m = o.flt(o.iadd(o.iand(ix, o.i(0x7FFFFF)), o.i(_SQRT_HALF_BITS)))
    f = o.sub(m, o.f(1.0))                           # exact (Sterbenz)
    ef = o.itof(e)
    z = o.mul(f, f)
    y = o.mul(f, o.mul(z, o.horner(f, _LOG_P)))
    y = o.fma(ef, o.f(_LN2_LO), y)
    y = o.fma(z, o.f(-0.5), y)
    r = o.fma(ef, o.f(_LN2_HI), o.add(f, y))
    if not specials:
        return r
    return log_specials(o, x, r)


def _log1p(o, x):
    return log1p_via(o, x, _log)


def _softplus(o, x):
    e = _exp(o, o.sub(o.f(0.0), o.abs(x)))           # in [0, 1]; NaN stays NaN
    u = o.add(o.f(1.0), e)                           # in [1, 2]: no specials needed
    l1p = o.add(_log(o, u, specials=False), o.div(o.sub(e, o.sub(u, o.f(1.0))), u))
    return o.add(o.sel(o.gt(x, o.f(0.0)), x, o.f(0.0)), l1p)


# ---------------------------------------------------------------------------- logistic family
# e^r = 1 + r + r^2*Q(r) on |r| <= ln2/2, degree 6 (minimax in relative error, 2^-28.3 after
# rounding the coefficients): one FMA less than Cephes' degree 7, for tanh and sigmoid
_EXP_Q4 = (0.4999999403953552, 0.1666652113199234, 0.041668254882097244, 0.008368662558495998,
           0.0013821468455716968)


def _exp_scaled(o, v, c, k, one_part=False, whole=False):
    """e^(c*v) = s * (1 + c*h) * 2^-k for c = -1 or 2 and an already clamped v (NaN passes).
    The reduction is done on v itself: u = v - n*ln2/c = r/c, h = u + c*u^2*Q(c*u) = em/c,
    with the coefficients of Q(c*u)*c scaled by powers of two, so h is em/c with the same
    roundings and neither -v nor 2v costs an instruction.  s = 2^(n+k) comes straight from the
    bits of the rounding sum: with the magic 1.5*2^23 + 127 + k, bits(t) << 23 is the float
    2^(n+k) (the magic's own bits shift out), for n + k + 127 in [1, 254].  one_part: ln2 as
    one float (one FMA less; the argument moves by n*1.9e-9/c, which only tanh can afford).
    whole: returns (s, p) with e^(c*v) = s*p*2^-k, p = 1 + c*u + (c*u)^2*Q(c*u) as one
    Horner chain (for callers that add e^(c*v) to something of its size: no cancellation)."""
    magic = _MAGIC + 127.0 + k
    t = o.fma(v, o.f(c * _LOG2E), o.f(magic))
    nf = o.sub(t, o.f(magic))
    if one_part:                                     # ln2 as one float: u off by n*1.9e-9/c
        u = o.fma(nf, o.f(-_LN2 / c), v)
    else:
        u = o.fma(nf, o.f(-_LN2_HI / c), v)          # exact, as in _exp_reduce
        u = o.fma(nf, o.f(-_LN2_LO / c), u)
    sc = o.flt(o.shl(o.bits(t), 23))
    if whole:                                        # e^(c*u) itself, one Horner chain
        return sc, o.horner(u, [1.0, float(c)] + [qk * c ** (i + 2)
                                                  for i, qk in enumerate(_EXP_Q4)])
    q = o.horner(u, [qk * c ** (i + 1) for i, qk in enumerate(_EXP_Q4)])
    return sc, o.fma(o.mul(u, u), q, u)


_SCALE = 2.0 ** -64


def _sigmoid(o, x):
    # 1/(1 + e^-x) = 2^-64 / (2^-64 + e^-x*2^-64): e^-x*2^-64 is a normal float for x in
    # [-110, 40], so the one division rounds the result once, also into the subnormals.
    # Beyond the clamp the result is 0 (x < -103.98) or 1 (x > 17.3).
    s, p = _exp_scaled(o, o.clamp(x, -110.0, 40.0), -1.0, -64, whole=True)
    den = o.fma(s, p, o.f(_SCALE))                   # (e^-x + 1) * 2^-64, one rounding
    return o.div(o.f(_SCALE), den)


def _scaled_logistic(o, w, f):
    """f * sigmoid(w) = num / (1 + e), e = e^-|w|, num = f (w >= 0) or f*e (w < 0), so
    nothing cancels and a tiny result keeps its precision: for w < 0 numerator and
    denominator are formed times 2^64 (f*e*2^64 is normal down to w = -110), and the one
    division rounds into the subnormals.  (f*2^64 could overflow: w >= 0 divides by 1 + e.)"""
    wc = o.sel(o.gt(o.abs(w), o.f(110.0)), o.f(110.0), o.abs(w))
    s, h = _exp_scaled(o, wc, -1.0, 64)              # e^-|w| * 2^64 = s*(1 - h)
    e = o.fma(o.neg(s), h, s)
    neg = o.lt(w, o.f(0.0))
    fs = o.mul(f, s)                                 # exact: a power of two, no over/underflow
    num = o.sel(neg, o.fma(o.neg(fs), h, fs), f)
    den = o.sel(neg, o.add(e, o.f(1.0 / _SCALE)), o.fma(e, o.f(_SCALE), o.f(1.0)))
    return o.div(num, den)


def _silu(o, x):
    xc = o.sel(o.lt(x, o.f(-110.0)), o.f(-110.0), x)  # silu(x < -110) = -0, and -inf*0 is NaN
    return _scaled_logistic(o, xc, xc)


_GELU_C1 = 1.5957691216057308            # 2*sqrt(2/pi)
_GELU_C3 = 1.5957691216057308 * 0.044715


def _gelu_tanh(o, x):
    # 0.5*x*(1 + tanh(u)) == x * sigmoid(2u)
    xc = o.sel(o.lt(x, o.f(-11.0)), o.f(-11.0), x)    # result underflows to -0 below -10.9
    w = o.mul(xc, o.fma(o.f(_GELU_C3), o.mul(xc, xc), o.f(_GELU_C1)))
    return _scaled_logistic(o, w, xc)


def _tanh(o, x):
    # One exp and one division for every |x|: e^2a = sc*(1 + 2h) (sc = 2^n), g = (e^2a - 1)/2
    # and D = (e^2a + 1)/2 = g + 1, each rounded once ((sc -+ 1)/2 is exact while it
    # matters, n <= 24), so tanh(a) = g/D.  With num = g (a < 0.625) or 1, q = num/D and
    # tanh = num - num*q: 1 - 1/D above, and below q = g/D refined as g - g*q (= g*(1 -
    # tanh) = tanh), which scales q's error by g <~ 1.2 and replaces Cephes' separate
    # polynomial for small |x|: one FMA for both branches.  a is clamped to 10, where the
    # result rounds to 1; the one-part reduction (ln2 in one float) moves the argument by
    # n*1e-9 <= 3e-8: (1 - tanh^2)*3e-8, under 0.05 ulp.  copysign gives tanh(-0) = -0.
    a = o.abs(x)
    sc, h = _exp_scaled(o, o.sel(o.gt(a, o.f(10.0)), o.f(10.0), a), 2.0, 0, one_part=True)
    g = o.fma(sc, h, o.fma(sc, o.f(0.5), o.f(-0.5)))
    dd = o.fma(sc, h, o.fma(sc, o.f(0.5), o.f(0.5)))
    num = o.sel(o.lt(a, o.f(_TANH_SMALL)), g, o.f(1.0))
    q = o.div(num, dd)
    return o.copysign(o.fma(o.neg(num), q, num), x)     # g - g*q, or 1 - 1/D


_TANH_SMALL = 0.625     # below: g/D refined; above: 1 - 1/D (the result is >= 0.55)


# ---------------------------------------------------------------------------- erf family
# erf(z) = z + z*Q(z^2), |z| < 0.8 (minimax, relative)
_ERF_Q = (0.12837916612625122, -0.3761260211467743, 0.11283113062381744,
          -0.026820816099643707, 0.0050851451233029366, -0.0006535319262184203)
# erfcx(z) = e^(z^2)*erfc(z) = P1(z - 1.25) on [0.5, 2]  (minimax, relative)
_ERFCX_P1 = (0.36782291531562805, -0.20882189273834229, 0.10679556429386139,
             -0.05021785944700241, 0.022011438384652138, -0.00908578559756279,
             0.0035533756017684937, -0.0013089455896988511, 0.00047084808466024697,
             -0.0001922531664604321, 6.163374928291887e-05)
# z*erfcx(z) = P2(1/z^2) on [2, 10.5]  (minimax, relative)
_ERFCX_P2 = (0.5641895532608032, -0.2820865511894226, 0.4225422441959381,
             -1.0359749794006348, 3.2344577312469482, -10.11299991607666,
             25.187152862548828, -40.27606201171875, 29.628524780273438)
_ERF_SMALL = 0.8          # erf, and 1 + erf(z) for z > 0: no cancellation below this
_ERFC_SMALL = 0.5         # 1 - erf(z) cancels: erfc takes the e^(-z^2) branch from here
_ERFC_MAX = 10.5                            # erfc(10.06) < 2^-150


def _erf_small(o, z):
    return o.fma(z, o.horner(o.mul(z, z), _ERF_Q), z)


def _erfc_big(o, z, z2h, z2l, inv=None):
    """erfc(z) = R*(1 + em) * 2^n / (z if big else 1) for z in [0.5, 10.5], given
    z^2 = z2h + z2l with z2h exact; returns (R, em, n, big).  The caller applies the factor
    (1 + em) = e^r with a single rounding, fma(em, h, h), after its own scaling h of R.
    inv: 1/z, when the caller has it (then 1/z^2 = inv*inv: R moves by < 0.2 ulp)."""
    big = o.gt(z, o.f(2.0))
    v = o.sel(big, o.mul(inv, inv) if inv is not None else o.div(o.f(1.0), o.mul(z, z)),
              o.sub(z, o.f(1.25)))
    p2 = _ERFCX_P2 + (0.0,) * (len(_ERFCX_P1) - len(_ERFCX_P2))
    coeffs = [o.sel(big, o.f(c), o.f(a)) for a, c in zip(_ERFCX_P1, p2)]
    r, n = _exp_reduce(o, o.sub(o.f(0.0), z2h), o.sub(o.f(0.0), z2l))
    return o.estrin(v, coeffs, 3), _expm1_poly(o, r), n, big


def _erfc_pos(o, z, z2h, z2l, damped=False):
    """erfc(z) for z in [0.5, 10.5].  damped: the caller scales erfc's error down (erf's
    1 - erfc(z) for z >= 0.8: by erfc/erf < 0.35), so one reciprocal of z serves both
    divisions (R's 1/z^2 and the /z), each then off by an extra rounding."""
    if not damped:
        rr, em, n, big = _erfc_big(o, z, z2h, z2l)
        h = o.div(rr, o.sel(big, z, o.f(1.0)))
    else:
        inv = o.div(o.f(1.0), z)
        rr, em, n, big = _erfc_big(o, z, z2h, z2l, inv)
        h = o.mul(rr, o.sel(big, inv, o.f(1.0)))
    return o.ldexp(o.fma(em, h, h), n)


def _square_hilo(o, x, scale=1.0):
    """scale*x^2 as hi + lo with hi exact (scale a power of two)."""
    xh, xl = o.split(x)
    hi, lo = o.mul(xh, xh), o.mul(xl, o.add(x, xh))
    if scale != 1.0:
        hi, lo = o.mul(hi, o.f(scale)), o.mul(lo, o.f(scale))
    return hi, lo


def _erf(o, x):
    a = o.abs(x)
    ac = o.sel(o.gt(a, o.f(4.0)), o.f(4.0), a)        # erf(4) rounds to 1
    big = o.sub(o.f(1.0), _erfc_pos(o, ac, *_square_hilo(o, ac), damped=True))
    res = o.sel(o.lt(a, o.f(_ERF_SMALL)), _erf_small(o, a), big)
    return o.copysign(res, x)


def _erfc(o, x):
    a = o.abs(x)
    ac = o.sel(o.gt(a, o.f(_ERFC_MAX)), o.f(_ERFC_MAX), a)
    e = _erfc_pos(o, ac, *_square_hilo(o, ac))
    big = o.sel(o.lt(x, o.f(0.0)), o.sub(o.f(2.0), e), e)
    small = o.sub(o.f(1.0), _erf_small(o, x))
    return o.sel(o.lt(a, o.f(_ERFC_SMALL)), small, big)


_INV_SQRT2 = 0.7071067811865476


def _gelu(o, x):
    xc = o.clamp(x, -15.0, 15.0)                      # gelu(<-15) = -0, gelu(>15) = x
    z = o.mul(xc, o.f(_INV_SQRT2))
    az = o.abs(z)
    # 1/|z| once, off the critical path: 1/z^2 for R, and erfc's /z for x > 0 (where
    # 2 - erfc damps erfc's error: erfc(2) < 0.005)
    inv = o.div(o.f(1.0), az)
    rr, em, n, big = _erfc_big(o, az, *_square_hilo(o, xc, 0.5), inv)  # (x/sqrt2)^2 = x^2/2
    half_x = o.mul(x, o.f(0.5))
    # one scaling of R, one e^r and one 2^n for both signs (a lane takes one of them):
    # x < 0: 0.5*x*erfc(|z|) = R*e^r*2^n * (0.5*x, or 0.5*x/|z| = -1/sqrt2 where erfc has /z);
    # x > 0: e = erfc(z) = R*e^r*2^n * (1, or 1/z), and the result 0.5*x*(2 - e)
    negx = o.lt(x, o.f(0.0))
    h = o.mul(rr, o.sel(negx, o.sel(big, o.f(-_INV_SQRT2), o.mul(xc, o.f(0.5))),
                        o.sel(big, inv, o.f(1.0))))
    e = o.ldexp(o.fma(em, h, h), n)
    big_res = o.sel(negx, e, o.mul(half_x, o.sub(o.f(2.0), e)))
    small = o.mul(half_x, o.add(o.f(1.0), _erf_small(o, z)))
    in_small = o.b.and_(o.gt(z, o.f(-_ERFC_SMALL)), o.lt(z, o.f(_ERF_SMALL)))
    return o.sel(in_small, small, big_res)


# ---------------------------------------------------------------------------- sin / cos
_TWO_OVER_PI = 0.6366197723675814
# pi/2 = _PIO2[0] + ... + _PIO2[4]; the first four have 10 significant bits (j*P exact for
# |j| < 2^14), the last is the float nearest the remainder.
_PIO2 = (1.5703125, 0.00048351287841796875, 3.1385570764541626e-07, 6.070877134334296e-11,
         6.223371969669989e-14)
# sin r = r + r^3*S(r^2), cos r = 1 - r^2/2 + r^4*C(r^2) on |r| <= pi/4 (Cephes sinf/cosf)
_SIN_S = (-1.6666654611e-1, 8.3321608736e-3, -1.9515295891e-4)
_COS_C = (4.166664568298827e-2, -1.388731625493765e-3, 2.443315711809948e-5)


# 2/pi = TWO_OVER_PI_BITS * 2^-1280 (the first 1280 bits, truncated; fdlibm's ipio2 table)
TWO_OVER_PI_BITS = int(
    "a2f9836e4e441529fc2757d1f534ddc0db6295993c439041fe5163abdebbc561b7246e3a424dd2e006492eea"
    "09d1921cfe1deb1cb129a73ee88235f52ebb4484e99c7026b45f7e413991d639835339f49c845f8bbdf9283b"
    "1ff897ffde05980fef2f118b5a0a6d1f6d367ecf27cb09b74f463f669e5fea2d7527bac7ebe5f17b3d0739f7"
    "8a5292ea6bfb5fb11f8d5d0856033046fc7b6babf0cfbc209af4361d", 16)
_PH_E0 = 141                # biased exponent of 2^14: Payne-Hanek takes |x| >= 16384


# the 32-bit words of 2/pi's fraction, W[k] = bits 32k+1 .. 32k+32, behind one zero word
_PH_WORDS = [0] + [(TWO_OVER_PI_BITS >> (1280 - 32 * (k + 1))) & 0xFFFFFFFF for k in range(9)]
_PH_WORDS64 = [(_PH_WORDS[2 * k] << 32) | _PH_WORDS[2 * k + 1] for k in range(5)]


def _reduce_pio2_large_f32(o, x):
    """Payne-Hanek for float32 |x| >= 2^14 (E >= _PH_E0), table-free, branch-free, in
    integer arithmetic: x = m*2^q, m a 24-bit integer, q = E - 150 in [-9, 104].  Bits of
    2/pi of weight >= 2^(2-q) contribute multiples of 4 to x*2/pi and are dropped; the next
    96 bits (V = 2^q*2/pi mod 4 to 2^-94) are cut out of the constant 64-bit words by 5-way
    selects and two funnel shifts, as 32-bit words A, B, C (lsb weights 2^-30, 2^-62,
    2^-94).  In 64-bit integers (units 2^-62, wrapping = mod 4):
        F = (m*A << 32) + m*B + (m*C >> 32)      (each product 56 bits, exact)
    has error < 2^-61 from the shift and m*2^-94 < 2^-70 from the truncated 2/pi, against
    |x*2/pi - j| >= 2^-29.86 for every float32 (x = 16367173*2^72 is the nearest to a
    multiple of pi/2): a relative error below 2^-31.  j = F rounded
    to the nearest quadrant (top two bits), the signed rest converted to float64 and scaled
    by pi/2*2^-62, then rounded to float32.  Returns (r, j in the low bits of an integer);
    sin/cos(-x) reduce |x| and negate both."""
    L = o.like(F64)                                  # integer ops on i64 lanes: L.ity
    bits = o.bits(x)
    e = o.iand(o.lshr(bits, 23), o.i(255))
    m = L.b.zext(o.ior(o.iand(bits, o.i(0x7FFFFF)), o.i(0x800000)), L.ity)
    sp = o.iadd(e, o.i(30 - 150))                    # bit q-1 of 2/pi, +31: in [21, 135]
    sp = L.b.zext(o.isel(o.icmp("<", sp, o.i(0)), o.i(0), sp), L.ity)
    g, sh = L.lshr(sp, 6), L.iand(sp, L.i(63))
    is_g = [L.icmp("==", g, L.i(k)) for k in (1, 2)]
    words = []
    for t in range(3):                               # G[g + t], g in 0..2
        v = L.i(_signed64(_PH_WORDS64[t]))
        for k in (1, 2):
            v = L.isel(is_g[k - 1], L.i(_signed64(_PH_WORDS64[k + t])), v)
        words.append(v)
    fshl = L._intrinsic_int("llvm.fshl", 3)
    hi = L.b.call(fshl, [words[0], words[1], sh])
    lo = L.b.call(fshl, [words[1], words[2], sh])
    a, b_, c = L.lshr(hi, 32), L.iand(hi, L.i(0xFFFFFFFF)), L.lshr(lo, 32)
    f = L.iadd(L.iadd(L.shl(L.b.mul(m, a), 32), L.b.mul(m, b_)), L.lshr(L.b.mul(m, c), 32))
    f = L.iadd(f, L.i(1 << 61))                      # + half a quadrant: j = top two bits
    jq = o.b.trunc(L.lshr(f, 62), o.ity)
    rest = L.isub(L.iand(f, L.i((1 << 62) - 1)), L.i(1 << 61))
    rd = L.mul(L.b.sitofp(rest, L.ty), L.f(1.5707963267948966 * 2.0 ** -62))
    y = o.convert(rd, L)
    neg = o.lt(x, o.f(0.0))
    return o.sel(neg, o.neg(y), y), o.isel(neg, o.isub(o.i(0), jq), jq)


def _signed64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


# ops whose kernels hold an if_any block (sin, cos, tan: the Payne-Hanek reduction): the CPU
# backend emits their elementwise loops as explicit vectors (lowering/cpu/vmap.py), since the
# loop vectorizer would if-convert the block into every element's path
UNIFORM_BRANCH = frozenset({"sin", "cos", "tan"})


def if_any(o, mask, compute, fallback):
    """Values `compute()` where `mask` holds, `fallback` elsewhere, with compute() emitted in
    a block that runs only when some lane of mask is set (a uniform branch: free on a GPU
    and for explicit vectors; LLVM's loop vectorizer if-converts it into selects)."""
    b = o.b
    anyset = mask if o.n is None else b.icmp_unsigned(
        "!=", b.bitcast(mask, ir.IntType(o.n)), ir.Constant(ir.IntType(o.n), 0))
    entry = b.block
    slow = b.append_basic_block("rare")
    join = b.append_basic_block("join")
    b.cbranch(anyset, slow, join)
    b.position_at_end(slow)
    vals = [b.select(mask, v, f) for v, f in zip(compute(), fallback)]
    slow_end = b.block
    b.branch(join)
    b.position_at_end(join)
    out = []
    for v, f in zip(vals, fallback):
        phi = b.phi(f.type)
        phi.add_incoming(f, entry)
        phi.add_incoming(v, slow_end)
        out.append(phi)
    return out


def _sincos(o, x, quadrant_offset):
    s, c, q = _sincos_parts(o, x)
    q = o.iadd(q, o.i(quadrant_offset))
    odd = o.b.icmp_unsigned("!=", o.iand(q, o.i(1)), o.i(0))
    res = o.sel(odd, c, s)
    return o.flt(o.ixor(o.bits(res), o.shl(o.iand(q, o.i(2)), 30)))   # negate in q = 2, 3


def _sincos_parts(o, x):
    """(sin r, cos r, j) for x = j*pi/2 + r (j mod 4 in the low bits of an integer)."""
    r, q = _pio2_reduce(o, x)
    z = o.mul(r, r)
    s = o.fma(o.mul(r, z), o.horner(z, _SIN_S), r)
    c = o.fma(o.mul(z, z), o.horner(z, _COS_C), o.fma(z, o.f(-0.5), o.f(1.0)))
    return s, c, q


def _pio2_reduce(o, x):
    """(r, j): x = j*pi/2 + r, |r| <= pi/4 (float32), j mod 4 in the low bits of an integer."""
    t = o.fma(x, o.f(_TWO_OVER_PI), o.f(_MAGIC))
    j = o.sub(t, o.f(_MAGIC))
    p1, p2, p3, p4, p5 = (o.f(-p) for p in _PIO2)
    r = o.fma(j, p2, o.fma(j, p1, x))                 # exact (Sterbenz, 10-bit parts)
    r, e3 = _two_sum(o, r, o.mul(j, p3))              # j*p3, j*p4 exact; sums exact with e
    r, e4 = _two_sum(o, r, o.mul(j, p4))
    r = o.add(r, o.fma(j, p5, o.add(e3, e4)))         # the only rounding of size ulp(r)
    q = o.bits(t)                                     # low bits of t's mantissa = j mod 4
    # finite |x| >= 2^14: Payne-Hanek, in a block entered only when some lane needs it
    be = o.iand(o.lshr(o.bits(x), 23), o.i(255))
    large = o.b.and_(o.icmp(">=", be, o.i(_PH_E0)), o.icmp("<", be, o.i(255)))
    return if_any(o, large, lambda: _reduce_pio2_large_f32(o, x), (r, q))


def _sin(o, x):
    return o.sel(o.eq(x, o.f(0.0)), x, _sincos(o, x, 0))   # sin(-0) = -0


def _cos(o, x):
    return _sincos(o, x, 1)


# ---------------------------------------------------------------------------- registry / API
KERNELS.update({(name, "f32"): fn for name, fn in {
    "exp": _exp, "expm1": _expm1, "log": _log, "log1p": _log1p,
    "sin": _sin, "cos": _cos, "tanh": _tanh, "sigmoid": _sigmoid, "silu": _silu,
    "erf": _erf, "erfc": _erfc, "gelu": _gelu, "gelu_tanh": _gelu_tanh, "softplus": _softplus,
}.items()})
KERNELS.update({("_sincos_parts", "f32"): _sincos_parts, ("_log_parts", "f32"): _log_parts,
                ("_pio2_reduce", "f32"): _pio2_reduce,
                ("_expm1_poly", "f32"): _expm1_poly,    # building blocks of mathlib_more
                ("_exp_scaled", "f32"): _exp_scaled})   # and of mathlib_ratio
from . import mathlib_f64, mathlib_more  # noqa: E402,F401  (register their kernels)

FUNCTIONS: dict[str, Fn] = {}
for (_name, _dt), _fn in KERNELS.items():
    if _name.startswith("_"):
        continue
    _arity = _fn.__code__.co_argcount - len(_fn.__defaults__ or ()) - 1    # fn(o, *args)
    _have = FUNCTIONS.get(_name, Fn(_arity, None, None))
    _ulp = BOUNDS[_dt][_name]
    FUNCTIONS[_name] = (_have._replace(ulp_f32=_ulp) if _dt == "f32"
                        else _have._replace(ulp_f64=_ulp))
FUNCTIONS = dict(sorted(FUNCTIONS.items()))
SUPPORTED = {n: f.ulp_f32 for n, f in FUNCTIONS.items() if f.ulp_f32 is not None}


def names(dtype: str = "f32", arity: int | None = None) -> list[str]:
    """The function names available for dtype ("f32" or "f64"), optionally of one arity."""
    return [n for n, f in FUNCTIONS.items()
            if f.ulp(dtype) is not None and (arity is None or f.arity == arity)]


def _check(name: str, types: list) -> str:
    fn = FUNCTIONS.get(name)
    if fn is None:
        raise KeyError(f"rlx.math: no elementwise math rule for {name!r} "
                       f"(have: {', '.join(FUNCTIONS)})")
    if len(types) != fn.arity:
        raise TypeError(f"rlx.math.{name}: takes {fn.arity} argument(s), got {len(types)}")
    ty = types[0]
    elem = ty.element if isinstance(ty, ir.VectorType) else ty
    if not isinstance(elem, (ir.FloatType, ir.DoubleType)) or any(t != ty for t in types):
        raise TypeError(f"rlx.math.{name}: expected float, double or a vector of them "
                        f"(all arguments alike), got {', '.join(map(str, types))}")
    dt = "f64" if isinstance(elem, ir.DoubleType) else "f32"
    if fn.ulp(dt) is None:
        raise TypeError(f"rlx.math.{name}: no {dt} version (have: {', '.join(names(dt))})")
    return dt


def get_function(module: ir.Module, name: str, ty: ir.Type) -> ir.Function:
    """The internal alwaysinline function `rlx.math.<name>.<f32|f64|vNf32|vNf64>` of `module`
    (arguments and result of type ty), defined on first use."""
    dt = _check(name, [ty] * FUNCTIONS[name].arity if name in FUNCTIONS else [ty])
    fname = f"rlx.math.{name}.{type_suffix(ty)}"
    fn = module.globals.get(fname)
    if fn is None:
        arity = FUNCTIONS[name].arity
        fn = ir.Function(module, ir.FunctionType(ty, [ty] * arity), fname)
        fn.linkage = "internal"
        fn.attributes.add("alwaysinline")
        fn.attributes.add("nounwind")
        for a, nm in zip(fn.args, "xy"):
            a.name = nm
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        b.ret(KERNELS[(name, dt)](_Ops(b, ty), *fn.args))
    return fn


def emit(builder: ir.IRBuilder, name: str, *args: ir.Value) -> ir.Value:
    """Emit `name(*args)` at the builder's position; the arguments are all float, double or
    <N x float|double> of one type, and so is the result.  Calls an internal alwaysinline
    helper (defined once per module and type)."""
    _check(name, [a.type for a in args])
    fn = get_function(builder.module, name, args[0].type)
    return builder.call(fn, list(args), name=name)

"""float64 kernels of mathlib (the table of bounds is in mathlib.py's header).

Same rules as the float32 kernels: selects (sin/cos: one uniform branch), no libm, no
llvm.exp/log/sin/floor, only llvm.fmuladd/fabs/copysign, NaN in gives NaN out.  Integer views
are i64; rounding to an integer is the add/sub of 1.5*2^52.

  exp       Cody-Waite: n = round(x/ln2), r = x - n*ln2_hi - n*ln2_lo (ln2_hi 32 bits, the
            first step exact), e^r - 1 = r + r^2*Q(r), Q the Taylor series to r^13/13!
            (truncation < 2^-60 on |r| <= ln2/2), 2^n as two exponent-field multiplies (one
            rounding, also into the subnormals); x clamped to [-746, 710].
  expm1     the same; x <= 38: ((2^n - 1) + 2^n*r) + 2^n*r^2*Q(r) for n > 0 (2^n*r exact),
            2^n*(e^r-1) + (2^n-1) by one FMA for n <= 0; e^x above.
  log       fdlibm's e_log: x = 2^k(1+f), 1+f in [sqrt(1/2), sqrt(2)), s = f/(2+f),
            log(1+f) = f - (f^2/2 - s(f^2/2 + R(s^2))), R the atanh series to s^21.
  log1p     log(u) + (x - (u-1))/u, u = 1 + x.
  sin, cos  j = round(x*2/pi), x - j*pi/2 with pi/2 in four parts (three of 27 bits: exact
            products for |j| < 2^26), two-sums, giving r = hi + lo; fdlibm's __kernel_sin /
            __kernel_cos on (hi, lo).  Finite |x| >= 2^26: Payne-Hanek (_reduce_pio2_large:
            192 bits of 2/pi from a 40-limb constant table, 32x32-bit products summed in
            64-bit integers, a double-double times pi/2), behind a uniform branch.
  tanh      fdlibm's s_tanh: |x| < 1: -t/(t+2), t = expm1(-2|x|); else 1 - 2/(expm1(2|x|)+2).
  sigmoid   e = e^-|x|: 1/(1+e) or e/(1+e) (no cancellation, subnormal tails exact-ish).
  silu, gelu_tanh  f*sigmoid(w) = f/(1+e) or (f*e*2^64)/((1+e)*2^64) for w < 0, so a tiny
            result is rounded once (f = x; w = x or 2*sqrt(2/pi)*(x + 0.044715x^3)).
  softplus  max(x, 0) + log1p(e^-|x|).
  erf       |x| < 0.8: x + x*Q(x^2) (degree 14, least squares); else 1 - erfc(|x|).
  erfc      z in [0.5, 27.3]: e^(-z^2) * P(t)/(1 + 2z), t = (z-3)/(z+3), P of degree 30 fitted
            to (1+2z)e^(z^2)erfc(z) (after Shepherd and Laframboise 1981; coefficients from
            scripts/mathlib_fit.py); z^2 split exactly into hi + lo for the exponential, which
            is applied last (one rounding into the subnormals).  x < -0.5: 2 - erfc(-x);
            |x| < 0.5: 1 - erf(x).
  gelu      0.5*x*(1 + erf(x/sqrt2)); for x/sqrt2 <= -0.5 it is 0.5*x*erfc(|x|/sqrt2) with
            (x/sqrt2)^2 = x^2/2 exact from the split of x.
"""
from __future__ import annotations

import math

from llvmlite import ir

from .mathlib_core import F64, I32, I64, KERNELS, log1p_via, log_specials, two_sum

_LOG2E = 1.4426950408889634
_MAGIC = 6755399441055744.0               # 1.5*2^52: (v + MAGIC) - MAGIC = round(v), |v| < 2^51
_MAGIC_BITS = 0x4338000000000000
_LN2_HI = 6.93147180369123816490e-01      # 32 significant bits: n*_LN2_HI exact for |n| < 2^21
_LN2_LO = 1.90821492927058770002e-10      # ln2 - _LN2_HI
# e^r - 1 = r + r^2*Q(r), Q = sum r^k/(k+2)!, k <= 11: truncation < 2^-60 for |r| <= ln2/2
_EXP_Q = tuple(1.0 / math.factorial(k + 2) for k in range(12))
_EXP_MIN, _EXP_MAX = -746.0, 710.0        # e^-746 < 2^-1075 rounds to 0, e^710 > DBL_MAX


def _exp_reduce(o, x, lo=_EXP_MIN):
    """x -> (r, n), e^x = e^r * 2^n, |r| <= ln2/2 + tiny; x - n*ln2_hi is exact."""
    x = o.clamp(x, lo, _EXP_MAX)
    t = o.fma(x, o.f(_LOG2E), o.f(_MAGIC))
    n = o.isub(o.bits(t), o.i(_MAGIC_BITS))
    nf = o.sub(t, o.f(_MAGIC))
    r = o.fma(nf, o.f(-_LN2_HI), x)
    return o.fma(nf, o.f(-_LN2_LO), r), n


def _expm1_poly(o, r):
    return o.fma(o.mul(r, r), o.horner(r, _EXP_Q), r)


def _exp(o, x):
    """e^r = (1 + r) + r^2*Q(r) with 1 + r as an exact sum s + err (Fast2Sum): only the
    last addition rounds at the size of the result."""
    r, n = _exp_reduce(o, x)
    s = o.add(o.f(1.0), r)
    err = o.add(o.sub(o.f(1.0), s), r)
    q = o.mul(o.mul(r, r), o.horner(r, _EXP_Q))
    return o.ldexp(o.add(s, o.add(err, q)), n)


def _expm1(o, x):
    r, n = _exp_reduce(o, o.sel(o.lt(x, o.f(-40.0)), o.f(-40.0), x))
    em = _expm1_poly(o, r)
    s = o.pow2(n)                                    # used for x <= 38 (n <= 55)
    # n > 0: s*e^r - 1 = ((s - 1) + s*r) + s*r^2*Q(r), s*r exact, so only the first sum and
    # the last round at the size of the result (s - 1 is exact for n <= 53); n <= 0: one FMA
    q = o.mul(o.mul(r, r), o.horner(r, _EXP_Q))
    up = o.fma(s, q, o.fma(s, r, o.sub(s, o.f(1.0))))
    small = o.sel(o.gt(s, o.f(1.0)), up, o.fma(s, em, o.sub(s, o.f(1.0))))   # n <= 0: as was
    big = o.ldexp(o.add(em, o.f(1.0)), n)            # e^x - 1 == e^x to double precision
    res = o.sel(o.gt(x, o.f(38.0)), big, small)
    return o.sel(o.eq(x, o.f(0.0)), x, res)          # expm1(-0) = -0


_SQRT_HALF_BITS = 0x3FE6A09E667F3BCD
# log(1+f) = 2 atanh(s), s = f/(2+f): R(z) = sum 2 z^k/(2k+1), k = 1..10, z = s^2 <= 0.0295
_LOG_R = tuple(2.0 / (2 * k + 1) for k in range(1, 11))


def _log_parts(o, x):
    """(e, log(m)) with x = 2^e*m, m in [sqrt(1/2), sqrt(2)); log(1) = 0 exactly."""
    tiny = o.lt(x, o.f(2.0 ** -1022))
    xs = o.sel(tiny, o.mul(x, o.f(2.0 ** 54)), x)
    ix = o.isub(o.bits(xs), o.i(_SQRT_HALF_BITS))
    e = o.iadd(o.ashr(ix, 52), o.b.select(tiny, o.i(-54), o.i(0)))
    f = o.sub(o.flt(o.iadd(o.iand(ix, o.i((1 << 52) - 1)), o.i(_SQRT_HALF_BITS))), o.f(1.0))
    s = o.div(f, o.add(o.f(2.0), f))
    z = o.mul(s, s)
    hfsq = o.mul(o.f(0.5), o.mul(f, f))
    return o.itof(e), o.sub(f, o.sub(hfsq, o.mul(s, o.add(hfsq, o.mul(z, o.horner(z, _LOG_R))))))


def _log(o, x, specials=True):
    """fdlibm's e_log: x = 2^k*(1+f), 1+f in [sqrt(1/2), sqrt(2)), log(1+f) = f - (hfsq -
    s*(hfsq + R)), hfsq = f^2/2, k*ln2 added in two parts; < 1 ulp."""
    tiny = o.lt(x, o.f(2.0 ** -1022))
    xs = o.sel(tiny, o.mul(x, o.f(2.0 ** 54)), x)
    ix = o.isub(o.bits(xs), o.i(_SQRT_HALF_BITS))
    e = o.iadd(o.ashr(ix, 52), o.b.select(tiny, o.i(-54), o.i(0)))
    m = o.flt(o.iadd(o.iand(ix, o.i((1 << 52) - 1)), o.i(_SQRT_HALF_BITS)))
    f = o.sub(m, o.f(1.0))                           # exact (Sterbenz)
    k = o.itof(e)
    s = o.div(f, o.add(o.f(2.0), f))
    z = o.mul(s, s)
    rr = o.mul(z, o.horner(z, _LOG_R))
    hfsq = o.mul(o.f(0.5), o.mul(f, f))
    inner = o.fma(s, o.add(hfsq, rr), o.mul(k, o.f(_LN2_LO)))
    r = o.fma(k, o.f(_LN2_HI), o.sub(f, o.sub(hfsq, inner)))
    if not specials:
        return r
    return log_specials(o, x, r)


def _log1p(o, x):
    return log1p_via(o, x, _log)


# ---------------------------------------------------------------------------- logistic family
def _exp_neg_abs(o, x):
    """e^-|x| (NaN stays NaN)."""
    return _exp(o, o.neg(o.abs(x)))


def _sigmoid(o, x):
    e = _exp_neg_abs(o, x)
    d = o.add(o.f(1.0), e)
    return o.sel(o.lt(x, o.f(0.0)), o.div(e, d), o.div(o.f(1.0), d))


def _scaled_logistic(o, w, f):
    """f * sigmoid(w) = f/(1+e) (w >= 0) or f*e/(1+e) (w < 0), e = e^-|w|: no cancellation.
    For w < 0 numerator and denominator are formed times 2^64 (f*e*2^64 stays normal down
    to w = -700), so a tiny result is rounded once, by the division, into the subnormals."""
    r, n = _exp_reduce(o, o.neg(o.abs(w)), -800.0)   # e^-800 * 2^64 * 800 underflows
    p = o.add(_expm1_poly(o, r), o.f(1.0))           # e = p * 2^n
    e = o.ldexp(p, n)
    neg = o.lt(w, o.f(0.0))
    num = o.sel(neg, o.mul(f, o.ldexp(p, o.iadd(n, o.i(64)))), f)
    den = o.add(o.f(1.0), e)
    return o.div(num, o.sel(neg, o.mul(den, o.f(2.0 ** 64)), den))


def _silu(o, x):
    xc = o.sel(o.lt(x, o.f(-800.0)), o.f(-800.0), x)  # silu(-inf) = -0, not -inf*0
    return _scaled_logistic(o, xc, xc)


_GELU_C1 = 1.5957691216057308            # 2*sqrt(2/pi)
_GELU_C3 = 1.5957691216057308 * 0.044715


def _gelu_tanh(o, x):
    xc = o.sel(o.lt(x, o.f(-40.0)), o.f(-40.0), x)    # the result is -0 long before -40
    w = o.mul(xc, o.fma(o.f(_GELU_C3), o.mul(xc, xc), o.f(_GELU_C1)))
    return _scaled_logistic(o, w, xc)


def _softplus(o, x):
    e = _exp_neg_abs(o, x)
    u = o.add(o.f(1.0), e)                           # in [1, 2]
    l1p = o.add(_log(o, u, specials=False), o.div(o.sub(e, o.sub(u, o.f(1.0))), u))
    return o.add(o.sel(o.gt(x, o.f(0.0)), x, o.f(0.0)), l1p)


def _tanh(o, x):
    """fdlibm's s_tanh: |x| < 1: -t/(t+2), t = expm1(-2|x|); else 1 - 2/(expm1(2|x|) + 2);
    |x| clamped to 20 (tanh rounds to 1)."""
    a = o.sel(o.gt(o.abs(x), o.f(20.0)), o.f(20.0), o.abs(x))
    a2 = o.add(a, a)
    tn = _expm1(o, o.neg(a2))
    small = o.div(o.neg(tn), o.add(tn, o.f(2.0)))
    tp = _expm1(o, a2)
    large = o.sub(o.f(1.0), o.div(o.f(2.0), o.add(tp, o.f(2.0))))
    return o.copysign(o.sel(o.lt(a, o.f(1.0)), small, large), x)


# ---------------------------------------------------------------------------- sin / cos
_TWO_OVER_PI = 0.6366197723675814
# pi/2 = C1 + C2 + C3 + C4: C1..C3 27 bits each (j*C_k exact for |j| < 2^26), C4 rounded
_PIO2 = (1.570796325802803, 9.920935739593517e-10, 5.721188709663575e-18,
         1.6446256936324258e-26)
SIN_COS_MAX = 2.0 ** 26                   # the reduction is exact below (|j| < 2^26 * 2/pi)
# fdlibm __kernel_sin / __kernel_cos on [-pi/4, pi/4]
_S = (-1.66666666666666324348e-01, 8.33333333332248946124e-03, -1.98412698298579493134e-04,
      2.75573137070700676789e-06, -2.50507602534068634195e-08, 1.58969099521155010221e-10)
_C = (4.16666666666666019037e-02, -1.38888888888741095749e-03, 2.48015872894767294178e-05,
      -2.75573143513906633035e-07, 2.08757232129817482790e-09, -1.13596475577881948265e-11)


def _reduce_pio2(o, x):
    """x = j*pi/2 + (hi + lo), |hi + lo| <= pi/4 + tiny, exact up to ~2^-106 for |x| < 2^26:
    x - j*C1 is exact, j*C2 and j*C3 are added with two-sums, j*C4 rounded once."""
    t = o.fma(x, o.f(_TWO_OVER_PI), o.f(_MAGIC))
    j = o.sub(t, o.f(_MAGIC))
    c1, c2, c3, c4 = (o.f(-c) for c in _PIO2)
    r1 = o.fma(j, c1, x)
    r2, e2 = two_sum(o, r1, o.mul(j, c2))
    r3, e3 = two_sum(o, r2, o.mul(j, c3))
    tail = o.fma(j, c4, o.add(e2, e3))
    hi = o.add(r3, tail)
    lo = o.sub(tail, o.sub(hi, r3))
    return hi, lo, o.bits(t)                         # low bits of t = j mod 4


def _ksin(o, x, y):
    """sin(x + y), |x| <= pi/4, |y| <= ulp(x)/2 (fdlibm __kernel_sin with iy = 1)."""
    z = o.mul(x, x)
    v = o.mul(z, x)
    r = o.horner(z, _S[1:])
    inner = o.sub(o.mul(z, o.sub(o.mul(o.f(0.5), y), o.mul(v, r))), y)
    return o.sub(x, o.sub(inner, o.mul(v, o.f(_S[0]))))


def _kcos(o, x, y):
    """cos(x + y) (fdlibm __kernel_cos)."""
    z = o.mul(x, x)
    r = o.mul(z, o.horner(z, _C))
    hz = o.mul(o.f(0.5), z)
    w = o.sub(o.f(1.0), hz)
    return o.add(w, o.add(o.sub(o.sub(o.f(1.0), w), hz), o.sub(o.mul(z, r), o.mul(x, y))))


# 2/pi's fraction as 32-bit limbs behind one zero limb (mathlib.TWO_OVER_PI_BITS, 1280 bits)
def _limbs() -> list[int]:
    from .mathlib import TWO_OVER_PI_BITS
    return [0] + [(TWO_OVER_PI_BITS >> (1280 - 32 * (k + 1))) & 0xFFFFFFFF for k in range(39)]


def _lookup(o, name: str, values: list[int], idx):
    """values[idx] per lane from an internal constant i64 table (scalar loads)."""
    mod = o.b.module
    g = mod.globals.get(name)
    if g is None:
        arr = ir.ArrayType(I64, len(values))
        g = ir.GlobalVariable(mod, arr, name)
        g.linkage, g.global_constant = "internal", True
        g.initializer = ir.Constant(arr, values)
    zero = ir.Constant(I32, 0)
    if o.n is None:
        return o.b.load(o.b.gep(g, [zero, idx], inbounds=True))
    out = ir.Constant(o.ity, ir.Undefined)
    for k in range(o.n):
        i = o.b.extract_element(idx, ir.Constant(I32, k))
        v = o.b.load(o.b.gep(g, [zero, i], inbounds=True))
        out = o.b.insert_element(out, v, ir.Constant(I32, k))
    return out


def _two_prod(o, a, bh, bl, b):
    """a*b = p + e exactly (Dekker, no FMA; b given pre-split as bh + bl)."""
    c = o.mul(a, o.f(134217729.0))                   # 2^27 + 1
    ah = o.sub(c, o.sub(c, a))
    al = o.sub(a, ah)
    p = o.mul(a, b)
    e = o.add(o.add(o.add(o.sub(o.mul(ah, bh), p), o.mul(ah, bl)), o.mul(al, bh)), o.mul(al, bl))
    return p, e


_PIO2_HI, _PIO2_LO = 1.5707963267948966, 6.123233995736766e-17
_PIO2_HH = 1.5707963109016418                    # _PIO2_HI cut to 26 bits
_M32 = 0xFFFFFFFF


def _reduce_pio2_large(o, x):
    """Payne-Hanek for finite |x| >= 2^26: x = m*2^q, m a 53-bit integer, q = E - 1075 in
    [-26, 971].  The 192 bits of 2/pi after those of weight >= 2^(2-q) (which give multiples
    of 4) are six 32-bit limbs w0..w5, cut by the exponent out of a constant table (7 loads
    and funnel shifts); m*W mod 2^192 is summed by columns of 32x32-bit products in 64-bit
    integers with a carry chain; its top 128 bits F (2 bits of quadrant, 126 of fraction;
    error <= 2^-125 from the cut and the truncated 2/pi) are rounded to the nearest quadrant
    j, and the signed rest becomes a double-double times pi/2 (Dekker's product).  |x*2/pi
    - j| >= 2^-61 for every double, so r = hi + lo is good to ~2^-100 relative."""
    bits = o.bits(o.abs(x))
    e = o.lshr(bits, 52)
    m = o.ior(o.iand(bits, o.i((1 << 52) - 1)), o.i(1 << 52))
    p = o.iadd(e, o.i(30 - 1075))                    # bit q-1 of 2/pi, + 31: in [4, 1001]
    p = o.isel(o.icmp("<", p, o.i(0)), o.i(0), p)
    g, sh = o.lshr(p, 5), o.iand(p, o.i(31))
    g = o.isel(o.icmp(">", g, o.i(32)), o.i(32), g)  # inf/NaN lanes: any in-range index
    limbs = [_lookup(o, "rlx.math.two_over_pi_limbs", _limbs(), o.iadd(g, o.i(k)))
             for k in range(7)]
    rsh = o.isub(o.i(32), sh)
    w = [o.iand(o.ior(o.b.shl(limbs[k], sh), o.b.lshr(limbs[k + 1], rsh)), o.i(_M32))
         for k in range(6)]                          # w[0] holds the weights 2^1 .. 2^-30
    ml, mh = o.iand(m, o.i(_M32)), o.lshr(m, 32)
    col = [o.i(0)] * 6                               # column c: units 2^(32c - 190)
    for k in range(6):
        for mp, shift in ((ml, 0), (mh, 1)):
            c = 5 - k + shift
            if c > 5:
                continue
            pr = o.b.mul(mp, w[k])
            col[c] = o.iadd(col[c], o.iand(pr, o.i(_M32)))
            if c + 1 <= 5:
                col[c + 1] = o.iadd(col[c + 1], o.lshr(pr, 32))
    limb, carry = [], o.i(0)
    for c in range(6):
        v = o.iadd(col[c], carry)
        limb.append(o.iand(v, o.i(_M32)))
        carry = o.lshr(v, 32)
    fhi = o.iadd(o.ior(o.shl(limb[5], 32), limb[4]), o.i(1 << 61))   # units 2^-62, + half
    j = o.lshr(fhi, 62)
    rest = o.isub(o.iand(fhi, o.i((1 << 62) - 1)), o.i(1 << 61))      # signed, units 2^-62
    a = o.mul(o.itof(o.ashr(rest, 32)), o.f(2.0 ** 32))
    b = o.itof(o.iand(rest, o.i(_M32)))
    small = o.add(o.mul(o.itof(limb[3]), o.f(2.0 ** -32)), o.mul(o.itof(limb[2]), o.f(2.0 ** -64)))
    s1, e1 = two_sum(o, a, b)
    t = o.add(e1, small)
    hi = o.add(s1, t)
    lo = o.sub(t, o.sub(hi, s1))
    hi, lo = o.mul(hi, o.f(2.0 ** -62)), o.mul(lo, o.f(2.0 ** -62))
    ph, pe = _two_prod(o, hi, o.f(_PIO2_HH), o.f(_PIO2_HI - _PIO2_HH), o.f(_PIO2_HI))
    t2 = o.add(pe, o.add(o.mul(hi, o.f(_PIO2_LO)), o.mul(lo, o.f(_PIO2_HI))))
    yh = o.add(ph, t2)
    yl = o.sub(t2, o.sub(yh, ph))
    neg = o.lt(x, o.f(0.0))
    return (o.sel(neg, o.neg(yh), yh), o.sel(neg, o.neg(yl), yl),
            o.isel(neg, o.isub(o.i(0), j), j))


def _sincos_parts(o, x):
    """(sin r, cos r, j) for x = j*pi/2 + r (j mod 4 in the low bits of an integer)."""
    from .mathlib import if_any
    hi, lo, q = _reduce_pio2(o, x)
    a = o.abs(x)
    large = o.b.and_(o.b.fcmp_ordered(">=", a, o.f(SIN_COS_MAX)), o.lt(a, o.f(float("inf"))))
    hi, lo, q = if_any(o, large, lambda: _reduce_pio2_large(o, x), (hi, lo, q))
    return _ksin(o, hi, lo), _kcos(o, hi, lo), q


def _sincos(o, x, quadrant_offset):
    s, c, q = _sincos_parts(o, x)
    q = o.iadd(q, o.i(quadrant_offset))
    odd = o.b.icmp_unsigned("!=", o.iand(q, o.i(1)), o.i(0))
    res = o.sel(odd, c, s)
    res = o.flt(o.ixor(o.bits(res), o.shl(o.iand(q, o.i(2)), 62)))   # negate in q = 2, 3
    return res


def _sin(o, x):
    return o.sel(o.eq(x, o.f(0.0)), x, _sincos(o, x, 0))   # sin(-0) = -0


def _cos(o, x):
    return _sincos(o, x, 1)



# ---------------------------------------------------------------------------- erf family
# erf(x) = x + x*Q(x^2) on |x| <= 0.8 (least squares, absolute error 2^-56.2: mathlib_fit.py)
_ERF_Q = (
    0.1283791670955126, -0.37612638903183754, 0.11283791670955126, -0.026866170645131252,
    0.005223977625442184, -0.0008548327023450213, 0.00012055332981728829,
    -1.4925650354443913e-05, 1.6462114183483433e-06, -1.6365838658992525e-07,
    1.4807048863161583e-08, -1.2288095077452497e-09, 9.393323348276638e-11,
    -6.475930291644152e-12, 3.314152834379707e-13)
# (1 + 2z) e^(z^2) erfc(z) = P(t), t = (z - 3)/(z + 3), z in [0.5, 27] (after Shepherd and
# Laframboise 1981; least squares in relative error, 2^-54.4: scripts/mathlib_fit.py)
_ERFC_T = (
    1.2530080582697296, -0.1356211061245812, -0.04756229435345119, 0.12964515870276264,
    -0.11927366341527385, 0.06830802734392262, -0.02377051491967061, 0.0025293918167134397,
    0.0018886903738853983, -0.0007798322754670288, -0.00010515991870969811,
    0.00012509935579691284, 4.950080359905265e-06, -2.0100516425764e-05,
    -7.334672522262527e-07, 3.472096291983587e-06, 3.611893787107916e-07,
    -6.156935914526627e-07, -1.482193268561336e-07, 1.0008818094963897e-07,
    4.864946118840344e-08, -1.1134286402907291e-08, -1.3176423766231703e-08,
    -8.099934772756292e-10, 2.886859095044101e-09, 9.608664143837333e-10,
    -4.92941960368115e-10, -3.096772252640609e-10, 7.070378390669258e-11, 4.73370928841404e-11,
    -9.661058027140779e-12)
_ERF_SMALL, _ERFC_SMALL, _ERFC_MAX = 0.8, 0.5, 27.3     # erfc(27.3) < 2^-1075


def _erf_small(o, x):
    return o.fma(x, o.horner(o.mul(x, x), _ERF_Q), x)


def _square_hilo(o, x, scale=1.0):
    """scale*x^2 = hi + lo, hi exact (x cut to 26 bits; scale a power of two)."""
    xh = o.flt(o.iand(o.bits(x), o.i(-(1 << 27))))
    xl = o.sub(x, xh)
    hi, lo = o.mul(xh, xh), o.mul(xl, o.add(x, xh))
    return o.mul(hi, o.f(scale)), o.mul(lo, o.f(scale))


def _erfc_parts(o, z, z2h, z2l, factor=None):
    """erfc(z) * factor for z in [0.5, 27.3], z^2 = z2h + z2l: e^(-z^2) applied last, with one
    rounding (so a subnormal result is rounded once)."""
    t = o.div(o.sub(z, o.f(3.0)), o.add(z, o.f(3.0)))
    h = o.div(o.horner(t, _ERFC_T), o.fma(z, o.f(2.0), o.f(1.0)))
    if factor is not None:
        h = o.mul(h, factor)
    r, n = _exp_reduce(o, o.neg(z2h))
    em = _expm1_poly(o, o.sub(r, z2l))
    return o.ldexp(o.fma(em, h, h), n)


def _erf(o, x):
    a = o.abs(x)
    ac = o.clamp(a, _ERFC_SMALL, 6.0)                 # erf(6) rounds to 1
    big = o.sub(o.f(1.0), _erfc_parts(o, ac, *_square_hilo(o, ac)))
    return o.copysign(o.sel(o.lt(a, o.f(_ERF_SMALL)), _erf_small(o, a), big), x)


def _erfc(o, x):
    a = o.abs(x)
    ac = o.clamp(a, _ERFC_SMALL, _ERFC_MAX)
    e = _erfc_parts(o, ac, *_square_hilo(o, ac))
    big = o.sel(o.lt(x, o.f(0.0)), o.sub(o.f(2.0), e), e)
    small = o.sub(o.f(1.0), _erf_small(o, x))
    return o.sel(o.lt(a, o.f(_ERFC_SMALL)), small, big)


_INV_SQRT2 = 0.7071067811865476


def _gelu(o, x):
    """0.5*x*(1 + erf(x/sqrt2)); for x/sqrt2 <= -0.5 it is 0.5*x*erfc(|x|/sqrt2) with
    (x/sqrt2)^2 = x^2/2 formed exactly from the split of x (no cancellation, exact exponent)."""
    xc = o.clamp(x, -38.6, 38.6)                      # gelu(<-38.6) = -0, gelu(>38.6) = x
    z = o.mul(xc, o.f(_INV_SQRT2))
    az = o.clamp(o.abs(z), _ERFC_SMALL, _ERFC_MAX)
    z2h, z2l = _square_hilo(o, xc, 0.5)
    half_x = o.mul(x, o.f(0.5))
    neg = _erfc_parts(o, az, z2h, z2l, o.mul(xc, o.f(0.5)))
    pos = o.mul(half_x, o.sub(o.f(2.0), _erfc_parts(o, az, z2h, z2l)))
    small = o.mul(half_x, o.add(o.f(1.0), _erf_small(o, z)))
    in_small = o.b.and_(o.gt(z, o.f(-_ERFC_SMALL)), o.lt(z, o.f(_ERF_SMALL)))
    return o.sel(in_small, small, o.sel(o.lt(x, o.f(0.0)), neg, pos))


KERNELS.update({(name, "f64"): fn for name, fn in {
    "exp": _exp, "expm1": _expm1, "log": _log, "log1p": _log1p,
    "sin": _sin, "cos": _cos, "tanh": _tanh, "sigmoid": _sigmoid, "silu": _silu,
    "gelu_tanh": _gelu_tanh, "softplus": _softplus, "erf": _erf, "erfc": _erfc, "gelu": _gelu,
    "_sincos_parts": _sincos_parts, "_log_parts": _log_parts, "_expm1_poly": _expm1_poly,
}.items()})
assert F64  # the kernels take Ops of a double type

"""Inverse trigonometric, hyperbolic and base-2/10 kernels of mathlib, float32 and float64
from one definition each (the table of bounds is in mathlib.py's header).

Each kernel takes Ops `o` of either float type and builds on the core kernels of that
type through mathlib_core.kernel(o, name) (exp, expm1, log, log1p, the sin/cos reduction,
the exp polynomial), so it inherits their accuracy; constants that must be exact for
the result to be accurate are split in hi + lo parts.  Branch-free selects, no libm;
sqrt is llvm.sqrt (sqrtps/sqrtpd on x86, sqrt.rn on NVPTX: correctly rounded).

  atan      |x| <= tan(pi/8): x + x^3 P(x^2); < tan(3pi/8): pi/4 + atan((x-1)/(x+1));
            else pi/2 + atan(-1/x) (pi/4, pi/2 in two parts).
  atan2     t = min(|x|,|y|)/max(|x|,|y|) in [0, 1], r = atan(t) as above, then pi/2 - r
            (|y| > |x|), pi - r (x < 0 or x = -0), pi/2 + r (both), sign of y; IEEE values for zeros and
            infinities (atan2(+-0, -0) = +-pi, atan2(+-inf, +-inf) = +-pi/4, +-3pi/4).
  asin      |x| <= 0.5: x + x^3 P(x^2); else pi/2 - 2 asin(sqrt((1-|x|)/2)) (fdlibm's split).
  acos      pi/2 - asin(x) for |x| <= 0.5; 2 asin(sqrt((1-x)/2)), or pi - that for x < -0.5.
  sinh      0.5*(em + em/(em+1)), em = expm1(|x|); past the exp overflow 0.5*h*h, h = e^(|x|/2).
  cosh      |x| < 0.5: 1 + em^2/(2(1+em)); else 0.5*e + 0.5/e, e = e^|x|; large as sinh.
  tan       the sin/cos reduction of x, then float32: t = r + r^3 P(r^2) (fitted), or -1/t in
            odd quadrants; float64: sin r/cos r (or -cos r/sin r).
  asinh     log1p(a + a^2/(1 + sqrt(1 + a^2))) (no cancellation); a > 2^28: log(a) + ln2.
  acosh     x < 2: log1p(t + sqrt(2t + t^2)), t = x - 1; else log(2x - 1/(x + sqrt(x^2-1)));
            x > 2^28: log(x) + ln2.
  atanh     0.5*log1p(2a + 2a^2/(1 - a)) (a < 0.5), 0.5*log1p(2a/(1 - a)); sign of x.
  log2      e + log(m)*log2(e) from log's own reduction x = 2^e*m: exact for powers of two.
  log10     e*log10(2) (in two parts) + log(m)*log10(e).
  exp2      n = round(x), e^((x - n)*ln2) with ln2 in two parts, times 2^n: exact at integers.
  hypot     big*sqrt(1 + (small/big)^2); hypot(+-inf, NaN) = inf (IEEE), else NaN in, NaN out.
"""
from __future__ import annotations

import math
import struct

from .mathlib_core import KERNELS, kernel

# atan(u) = u + u^3 P(u^2), |u| <= tan(pi/8) (least squares: scripts/mathlib_fit.py)
_ATAN_P = {
    "f64": (-0.3333333333333333, 0.19999999999999804, -0.14285714285659412, 0.11111111105117975,
            -0.09090908751763316, 0.07692296327996745, -0.06666424091547113,
            0.058789203820967806, -0.05230394206727706, 0.04551333133935233,
            -0.03456419588045029, 0.01627902648057774),
    "f32": (-0.33333333278554195, 0.19999977058578208, -0.1428414198492259, 0.11071216131856246,
            -0.08623691242161631, 0.05045854661649492),
}
_TAN_PI_8, _TAN_3PI_8 = 0.41421356237309503, 2.414213562373095


def _round(o, v: float) -> float:
    return v if o.is64 else struct.unpack("f", struct.pack("f", v))[0]


def _hilo(o, v: float):
    """v as o-typed hi + lo (lo = the rounding error of hi)."""
    hi = _round(o, v)
    return hi, _round(o, v - hi)


def _dt(o):
    return "f64" if o.is64 else "f32"


def _atan_poly(o, u):
    z = o.mul(u, u)
    return o.fma(o.mul(u, z), o.horner(z, _ATAN_P[_dt(o)]), u)


def _atan_pos(o, a, reduce_big=True):
    """atan(a) for a >= 0 (or NaN): (base_hi, base_lo, u) with atan(a) = base + atan(u)."""
    mid = o.div(o.sub(a, o.f(1.0)), o.add(a, o.f(1.0)))
    small = o.b.fcmp_ordered("<=", a, o.f(_TAN_PI_8))
    if reduce_big:
        is_mid = o.lt(a, o.f(_TAN_3PI_8))
        u = o.sel(small, a, o.sel(is_mid, mid, o.div(o.f(-1.0), a)))
        h4, l4 = _hilo(o, math.pi / 4)
        h2, l2 = _hilo(o, math.pi / 2)
        bh = o.sel(small, o.f(0.0), o.sel(is_mid, o.f(h4), o.f(h2)))
        bl = o.sel(small, o.f(0.0), o.sel(is_mid, o.f(l4), o.f(l2)))
    else:                                             # a in [0, 1]
        u = o.sel(small, a, mid)
        h4, l4 = _hilo(o, math.pi / 4)
        bh = o.sel(small, o.f(0.0), o.f(h4))
        bl = o.sel(small, o.f(0.0), o.f(l4))
    p = _atan_poly(o, u)
    return o.add(bh, o.add(p, bl))


def _atan(o, x):
    return o.copysign(_atan_pos(o, o.abs(x)), x)


def _atan2(o, y, x):
    ax, ay = o.abs(x), o.abs(y)
    swap = o.gt(ay, ax)
    big, small = o.sel(swap, ay, ax), o.sel(swap, ax, ay)
    t = o.div(small, big)
    inf = o.f(float("inf"))
    both_inf = o.b.and_(o.eq(ax, inf), o.eq(ay, inf))
    t = o.sel(both_inf, o.f(1.0), o.sel(o.eq(big, o.f(0.0)), o.f(0.0), t))
    r = _atan_pos(o, t, reduce_big=False)             # in [0, pi/4]
    # result = base +- r: (no swap, x >= 0): r; (swap, x >= 0): pi/2 - r;
    # (swap, x < 0): pi/2 + r; (no swap, x < 0): pi - r  (x = -0 counts as negative)
    h2, l2 = _hilo(o, math.pi / 2)
    hp, lp = _hilo(o, math.pi)
    xneg = o.b.icmp_signed("<", o.bits(x), o.i(0))
    bh = o.sel(swap, o.f(h2), o.sel(xneg, o.f(hp), o.f(0.0)))
    bl = o.sel(swap, o.f(l2), o.sel(xneg, o.f(lp), o.f(0.0)))
    minus = o.b.xor(swap, xneg)
    r = o.add(bh, o.add(bl, o.sel(minus, o.neg(r), r)))
    r = o.copysign(r, y)
    nan = o.b.fcmp_unordered("uno", x, y)
    return o.sel(nan, o.add(x, y), r)


def _sqrt(o, v):
    return o.b.call(o._intrinsic("llvm.sqrt", 1), [v])


# asin(u) = u + u^3 P(u^2), |u| <= 0.5 (least squares: scripts/mathlib_fit.py)
_ASIN_P = {
    "f64": (0.16666666666666669, 0.0749999999999843, 0.04464285714636173, 0.030381944138046662,
            0.022372172961334005, 0.01735239227429941, 0.013971219544977282,
            0.01147911390775028, 0.010323222974141113, 0.005455772997012878,
            0.01740553771621538, -0.0148590684677662, 0.028762690011846594),
    "f32": (0.16666666338575503, 0.07500094314117335, 0.04459947498245213, 0.031099839887568655,
            0.017152999882572188, 0.03368482942749032),
}


def _asin_parts(o, x):
    """(small, a, big_half, is_big): asin(x) = small for |x| <= 0.5; for |x| > 0.5,
    asin(|x|) = pi/2 - 2*h with h = asin(sqrt((1-|x|)/2)) = big_half ((1-|x|)/2 exact)."""
    a = o.abs(x)
    is_big = o.gt(a, o.f(0.5))
    z = o.sel(is_big, o.mul(o.sub(o.f(1.0), a), o.f(0.5)), o.mul(x, x))
    u = o.sel(is_big, _sqrt(o, z), x)
    p = o.fma(o.mul(u, z), o.horner(z, _ASIN_P[_dt(o)]), u)
    return p, is_big


def _asin(o, x):
    p, is_big = _asin_parts(o, x)                     # |x| > 1 or NaN: sqrt gives NaN
    h2, l2 = _hilo(o, math.pi / 2)
    big = o.add(o.f(h2), o.sub(o.f(l2), o.add(p, p)))
    return o.sel(is_big, o.copysign(big, x), p)


def _acos(o, x):
    p, is_big = _asin_parts(o, x)
    h2, l2 = _hilo(o, math.pi / 2)
    hp, lp = _hilo(o, math.pi)
    small = o.add(o.f(h2), o.sub(o.f(l2), p))         # pi/2 - asin(x)
    neg = o.lt(x, o.f(0.0))
    big = o.sel(neg, o.add(o.f(hp), o.sub(o.f(lp), o.add(p, p))), o.add(p, p))
    return o.sel(is_big, big, small)


def _exp_overflow(o):
    return 709.0 if o.is64 else 88.0


def _big_half_exp(o, a):
    """0.5*e^a for large a (past exp's overflow) as (h*0.5)*h, h = e^(a/2)."""
    h = kernel(o, "exp")(o, o.mul(a, o.f(0.5)))
    return o.mul(o.mul(h, o.f(0.5)), h)


def _sinh(o, x):
    a = o.abs(x)
    em = kernel(o, "expm1")(o, a)
    r = o.mul(o.f(0.5), o.add(em, o.div(em, o.add(em, o.f(1.0)))))
    r = o.sel(o.gt(a, o.f(_exp_overflow(o))), _big_half_exp(o, a), r)
    return o.copysign(r, x)


def _cosh(o, x):
    a = o.abs(x)
    em = kernel(o, "expm1")(o, a)
    small = o.add(o.f(1.0), o.div(o.mul(em, em), o.mul(o.f(2.0), o.add(em, o.f(1.0)))))
    e = kernel(o, "exp")(o, a)
    mid = o.add(o.mul(o.f(0.5), e), o.div(o.f(0.5), e))
    r = o.sel(o.lt(a, o.f(0.5)), small, mid)
    return o.sel(o.gt(a, o.f(_exp_overflow(o))), _big_half_exp(o, a), r)


# float32 tan(r) = r + r^3 P(r^2) on |r| <= pi/4 (least squares: scripts/mathlib_fit.py)
_TAN_P32 = (0.3333333329015813, 0.13333342412459262, 0.05396515634284797, 0.021909282886903855,
            0.008615810162022687, 0.004409518444623561, 1.881856541232831e-05,
            0.0017804602321781836)


def _tan(o, x):
    if o.is64:
        s, c, q = kernel(o, "_sincos_parts")(o, x)
        odd = o.b.icmp_unsigned("!=", o.iand(q, o.i(1)), o.i(0))
        r = o.sel(odd, o.div(o.neg(c), s), o.div(s, c))
    else:
        r, q = kernel(o, "_pio2_reduce")(o, x)
        z = o.mul(r, r)
        t = o.fma(o.mul(r, z), o.horner(z, _TAN_P32), r)
        odd = o.b.icmp_unsigned("!=", o.iand(q, o.i(1)), o.i(0))
        r = o.sel(odd, o.div(o.f(-1.0), t), t)
    return o.sel(o.eq(x, o.f(0.0)), x, r)             # tan(-0) = -0


def _large_log(o, a):
    h, l_ = _hilo(o, math.log(2.0))
    return o.add(kernel(o, "log")(o, a), o.add(o.f(h), o.f(l_)))


def _big_arg(o):
    return 2.0 ** 28 if o.is64 else 2.0 ** 12


def _asinh(o, x):
    a = o.abs(x)
    a2 = o.mul(a, a)
    mid = kernel(o, "log1p")(o, o.add(a, o.div(a2, o.add(o.f(1.0), _sqrt(o, o.add(o.f(1.0), a2))))))
    r = o.sel(o.gt(a, o.f(_big_arg(o))), _large_log(o, a), mid)
    return o.copysign(r, x)


def _acosh(o, x):
    t = o.sub(x, o.f(1.0))
    near = kernel(o, "log1p")(o, o.add(t, _sqrt(o, o.fma(t, t, o.add(t, t)))))
    mid = kernel(o, "log")(o, o.sub(o.add(x, x), o.div(o.f(1.0), o.add(x, _sqrt(o, o.fma(x, x, o.f(-1.0)))))))
    r = o.sel(o.lt(x, o.f(2.0)), near, mid)
    r = o.sel(o.gt(x, o.f(_big_arg(o))), _large_log(o, x), r)
    return o.sel(o.ult(x, o.f(1.0)), o.f(float("nan")), r)   # x < 1 or NaN


def _atanh(o, x):
    a = o.abs(x)
    one_m = o.sub(o.f(1.0), a)
    small = o.add(o.add(a, a), o.div(o.mul(o.add(a, a), a), one_m))
    big = o.div(o.add(a, a), one_m)
    r = o.mul(o.f(0.5), kernel(o, "log1p")(o, o.sel(o.lt(a, o.f(0.5)), small, big)))
    return o.copysign(r, x)


def _log2(o, x):
    e, lm = kernel(o, "_log_parts")(o, x)
    h, l_ = _hilo(o, 1.0 / math.log(2.0))
    r = o.add(e, o.fma(lm, o.f(h), o.mul(lm, o.f(l_))))
    return _log_specials(o, x, r)


def _log10(o, x):
    e, lm = kernel(o, "_log_parts")(o, x)
    # log10(2) = hi + lo, hi cut to 20 (float32: 12) bits so that e*hi is exact
    bits = 20 if o.is64 else 12
    hi = float(int(math.log10(2.0) * 2 ** bits)) / 2 ** bits
    lo = math.log10(2.0) - hi
    h, l_ = _hilo(o, 1.0 / math.log(10.0))
    rest = o.fma(e, o.f(lo), o.fma(lm, o.f(h), o.mul(lm, o.f(l_))))
    return _log_specials(o, x, o.fma(e, o.f(hi), rest))


def _log_specials(o, x, r):
    r = o.sel(o.eq(x, o.f(float("inf"))), x, r)
    r = o.sel(o.eq(x, o.f(0.0)), o.f(float("-inf")), r)
    return o.sel(o.ult(x, o.f(0.0)), o.f(float("nan")), r)   # x < 0 or NaN


def _exp2(o, x):
    lo, hi = (-1100.0, 1030.0) if o.is64 else (-160.0, 130.0)
    xc = o.clamp(x, lo, hi)
    magic = 6755399441055744.0 if o.is64 else 12582912.0
    nf = o.sub(o.add(xc, o.f(magic)), o.f(magic))     # round(x)
    d = o.sub(xc, nf)                                 # exact, |d| <= 0.5
    h, l_ = _hilo(o, math.log(2.0))
    r = o.fma(d, o.f(h), o.mul(d, o.f(l_)))
    p = o.add(kernel(o, "_expm1_poly")(o, r), o.f(1.0))
    n = o.b.fptosi(nf, o.ity)
    return o.ldexp(p, n)


def _hypot(o, x, y):
    ax, ay = o.abs(x), o.abs(y)
    swap = o.gt(ay, ax)
    big, small = o.sel(swap, ay, ax), o.sel(swap, ax, ay)
    t = o.div(small, big)
    r = o.mul(big, _sqrt(o, o.fma(t, t, o.f(1.0))))
    r = o.sel(o.eq(big, o.f(0.0)), o.f(0.0), r)
    inf = o.f(float("inf"))
    nan = o.b.fcmp_unordered("uno", x, y)
    r = o.sel(nan, o.add(x, y), r)
    return o.sel(o.b.or_(o.eq(ax, inf), o.eq(ay, inf)), inf, r)


for _dtype in ("f32", "f64"):
    KERNELS.update({(name, _dtype): fn for name, fn in {
        "atan": _atan, "atan2": _atan2, "asin": _asin, "acos": _acos, "sinh": _sinh,
        "cosh": _cosh, "tan": _tan, "asinh": _asinh, "acosh": _acosh, "atanh": _atanh,
        "log2": _log2, "log10": _log10, "exp2": _exp2, "hypot": _hypot,
    }.items()})

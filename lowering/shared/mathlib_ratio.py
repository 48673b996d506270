"""Products of bounded ratio-form functions with one division (float32): tanh(u) * sigmoid(v).

    fused_product(builder, x, y)   x, y: values just emitted by mathlib.emit (calls of
        │                          @rlx.math.<f>.<f32|vNf32>), both with a row in RATIO
        ▼
    n1*n2 / (d1*d2) * 2^(s1+s2)    one division instead of one per factor; the two calls
                                   are left without users (DCE removes them after inlining);
                                   None when the pair does not qualify (the caller multiplies)
                                   (a factor also used elsewhere keeps its call there: its
                                   exp is then computed twice)
    fused_parts(builder, x, y, lut=None) -> (q, scale): the same as q * 2^(s1+s2), for a sum
                                   that scales once (lowering/cpu/codegen.py, vsum.py); with
                                   `lut` (AVX2 vpermps, lowering/cpu/vsum.py) the exps are
                                   table-driven (see "table-driven exponentials" below)

Why: W1 of benchmarks/compare.py, sum(tanh(x*a+b) * sigmoid(x)), is bound by its vector
ALU instructions and the divider; tanh and sigmoid each end in a division.  The shared
`rlx.mul` rule (lowering/shared/scalar.py) asks this module first, so every backend (CPU
loops, sgemm epilogues, the GPU) gets the fused form of such a product.

RATIO[name] = Ratio(fn, num_hi, den_lo, den_hi, scale, fma_den): fn(o, x) -> (num, den_fn)
with f(x) = num/den * 2^scale (den_fn(None) = den, den_fn(d) = den*d, one FMA where
fma_den, i.e. den itself is never rounded), |num| < 2^num_hi (num None: exactly 1, num_hi
0), den in [2^den_lo, 2^den_hi], den * 2^-scale >= 1 and |f| <= 1.  A product qualifies
when at most one factor has a numerator (num_hi 0 for the other: a product of two
numerators is one rounding more; tanh*tanh measured 4.41 ulp, above the 4.5 its separate
bounds allow only by a margin too thin to promise) and den_lo1 + den_lo2 >= -126, den_hi1
+ den_hi2 <= 127: then d1*d2 never overflows or loses bits to underflow; the numerator may
be subnormal, but since the denominators are >= 2^scale the result is at most that small
too, so the absolute error stays within the subnormal ulp.  q = num/den is at most 2^-scale
(<= 2^64 here), and q * 2^scale is exact or rounds once into the subnormals.  tanh*sigmoid
qualifies; tanh*tanh (two numerators) and sigmoid*sigmoid (denominators up to 2^95 each)
do not.

  tanh     g = (e^2a - 1)/2 (a = |u| clamped to 10, as mathlib's tanh, the sign of u or-ed
           into g, so tanh(-0) = -0), D = g + 1: tanh(u) = g/D, |g| < 2^28, D in [1, 2^28).
           D is never rounded: D*d = g*d + d, one FMA (g/(g+1) shares g's rounding between
           numerator and denominator; a separately rounded D measured up to 4.3 ulp of the
           product, D as its own FMA of the exp 5.0, this form 3.8, and it is one
           instruction less than either).
  sigmoid  1 / (e^-v*2^-64 + 2^-64) * 2^-64, v clamped to [-110, 40] (mathlib's sigmoid
           without its division): den in [2^-64, 2^95).

Accuracy: the fused tanh(u)*sigmoid(v) is within FUSED_ULP = 4.5 ulp of the exact product
for every finite u, v (computed separately: tanh 2 + sigmoid 3 + the multiply's 0.5 = 5.5);
measured max 3.80 over 29M random pairs (host with FMA; 3.72 on baseline x86-64 without),
tests/test_mathlib_ratio.py.  NaN in either argument gives NaN (the clamps use ordered
compares); +-inf and +-0 give the products of the IEEE values of the factors (tanh(+-inf)
= +-1, sigmoid(-inf) = 0, tanh(-0) = -0).  Cost (the built W1 loop, per vector): one
`vdivps` instead of two and 3 (AVX-512) / 6 (AVX2, --cpu znver3) fewer other vector ALU
instructions (37 and 38 left); the sum's one scale (fused_parts) one multiply less.  With
the tables (AVX2): max 4.12 ulp over 60M pairs (tests/test_mathlib_ratio_lut.py), 24 FMA-port
instructions per <8 x float> (were 29), W1 on one thread 0.83x the CPU time with vsum.py.
On AVX-512 sigmoid's exponential is table-driven with vscalefps ("AVX-512" below): max 3.95
ulp over 8M pairs (tests/test_mathlib_ratio_avx512.py).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

from llvmlite import ir

import math
import struct

from . import mathlib as _mathlib  # registers the float32 kernels and building blocks
from .mathlib_core import F32, Ops, kernel

FUSED_ULP = 4.5
SCALE = 2.0 ** -64    # sigmoid's scale, as in mathlib's sigmoid: e^-v*2^-64 stays normal


class Ratio(NamedTuple):
    fn: Callable          # fn(o, x) -> (num or None, den_fn)
    num_hi: int           # |num| < 2^num_hi
    den_lo: int           # den >= 2^den_lo
    den_hi: int           # den < 2^den_hi
    scale: int            # f = num/den * 2^scale
    fma_den: bool         # den_fn(d) = den*d with one rounding (den itself not rounded)


# ---------------------------------------------------------------- table-driven exponentials
# With `lut` (an in-register lookup of N = lut.n 32-bit entries by the low log2(N) bits of
# each lane; AVX2 vpermps: lowering/cpu/vsum.py), e^x = 2^n * T_j * e^w for
# x = (N*n + j)*ln2/N + w, |w| <= ln2/(2N), T_j = 2^(j/N) rounded to float32: 2^n * T_j is
# one integer add of a table entry to the rounding sum's bits shifted into the exponent field,
# and e^w takes a degree-4 polynomial instead of Cephes' degree 6 over ln2/2.
#   tanh     (e^2w - 1)/2 = w + w^2*Q(w) (relative: it is tanh's g itself for small |u|);
#            T_j's rounding would be amplified by the cancellation in g = (e^2a - 1)/2 (up
#            to 6.6 ulp of the product measured), so it is moved into the argument: w - delta_j/2
#            with delta_j = ln T_j - j*ln2/N from a second table (both lookups by one index).
#   sigmoid  e^-w = 1 - w + w^2*(c2 + c3*w + c4*w^2); T_j's rounding (<= 3.2e-8 relative,
#            damped by e^-v/(1 + e^-v)) is left in: 4.12 ulp max over 60M pairs (4.07 against 3.79
#            with a delta table, an extra lookup and add, on 32M; 4.29 with degree 3).
# Per <8 x float>: sigmoid 2 FMAs fewer, tanh 2 fewer, for three vpermps (a shuffle port) and
# two integer adds and a float add; the FMA ports are what bound W1 on AVX2 (--cpu znver3:
# 0.90x the CPU time of the table-free form, with the explicit loop of vsum.py).
# Coefficients: minimax (relative error) on |w| <= ln2/(2N) (N = 8: sigmoid 2^-32.5, tanh
# 2^-27.6; N = 16: 2^-37.5, 2^-31.6).
#
# AVX-512 (`lut` with scalef: vsum.Avx512Ops, vpermps over 16 lanes and vscalefps, all on the
# two 512-bit ports that bound W1 there).  sigmoid: v clamped to [-110, 110]; the rounding sum
# t = -v*log2(e) + 1.5*2^19 rounds to multiples of 1/16, so nf = t - 1.5*2^19 = n + j/16
# exactly and the low 4 bits of t are j, the table index; w = v + nf*ln2 (two parts: nf has
# at most 12 significant bits, nf*LN2_HI is exact); den = vscalefps(T_j*2^-64, nf) * e^-w +
# 2^-64 with T_j*2^-64 from the table and e^-w = 1 - w + c2*w^2 + c3*w^3 (minimax on
# |w| <= ln2/32, 2^-28.7); vscalefps scales by 2^floor(nf) = 2^n exactly, also down into
# the subnormals and to 0 (v > 104: den = 2^-64), NaN stays NaN.  12 instructions per
# register (the table-free form: 14; an exponent built from t's bits, as on AVX2, would
# need an asymmetric clamp and a shift and an add).  T_j's rounding is left in: max
# 3.95 ulp of the product over 8M pairs (3.80 table-free).  tanh keeps the table-free
# form: its delta table (a lookup and a subtract) and a 2^n*T_j (a lookup and vscalefps)
# cost more than the two FMAs a shorter polynomial saves.  W1, 1 thread: 0.89-0.90x the
# CPU time (with vsum's one-register loop, lowering/cpu/vsum.py).
_LUT_SIG = {8: (0.5000000127408148, -0.16668024689113026, 0.04166042514783269),
            16: (0.5000000007964341, -0.16667006179457333, 0.04166510597075933)}
# sigmoid with vscalefps (AVX-512): e^-w = 1 - w + c2*w^2 + c3*w^3 on |w| <= ln2/32, minimax
# relative error 2^-28.7
_SCALEF_SIG = {16: (0.5000195499887177, -0.1666705766464035)}
_LUT_TANH = {8: (1.0000000080966156, 0.6667184305083009, 0.33332613140240197),
             16: (1.0000000005060656, 0.6666796075666533, 0.33333153262267917)}


def _f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def _bits(x: float) -> int:
    return struct.unpack("<i", struct.pack("<f", x))[0]


def _i32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


def lut_tables(n: int, k: int = 0) -> dict:
    """The N-entry tables (int32 bit patterns): 'exp' bits(T_j) - (j << shift) (plus the
    rounding sum's bits << shift and the exponent bias << 23: T_j * 2^n), 'delta' bits of
    delta_j = ln T_j - j*ln2/N and 'half_delta' of delta_j/2; shift = 23 - log2 N; 't' bits
    of T_j * 2^k (exact: a power of two times T_j)."""
    sh = 23 - (n.bit_length() - 1)
    t = [_f32(2.0 ** (j / n)) for j in range(n)]
    delta = [math.log(tj) - j * math.log(2.0) / n for j, tj in enumerate(t)]
    return {"exp": [_i32(_bits(tj) - (j << sh)) for j, tj in enumerate(t)],
            "delta": [_bits(_f32(d)) for d in delta],
            "half_delta": [_bits(_f32(d / 2)) for d in delta], "shift": sh,
            "t": [_bits(tj * 2.0 ** k) for tj in t]}


def _lut_reduce(o, x, mul, lut, exp_bias):
    """(s, w) for x already clamped (NaN passes), n8 = N*n + j = round(mul*x*N/ln2) and
    s = T_j * 2^(n + exp_bias):  mul = -1: w = x + n8*ln2/N, e^-x = s * e^-w * 2^-exp_bias
    (T_j's rounding aside; ln2 in two parts, n8 up to 1270);  mul = 2: w = x - n8*ln2/(2N)
    - delta_j/2, e^2x = s * e^2w * 2^-exp_bias (ln2 in one float, n8 <= 231, as mathlib's
    one_part)."""
    n = lut.n
    tab = lut_tables(n)
    magic = _mathlib._MAGIC
    t = o.fma(x, o.f(mul * n * _mathlib._LOG2E), o.f(magic))
    nf = o.sub(t, o.f(magic))
    if mul < 0:
        w = o.fma(nf, o.f(_mathlib._LN2_HI / (n * -mul)), x)
        w = o.fma(nf, o.f(_mathlib._LN2_LO / (n * -mul)), w)
    else:
        w = o.fma(nf, o.f(-_mathlib._LN2 / (n * mul)), x)
        w = o.sub(w, o.flt(lut(o, tab["half_delta"], o.bits(t))))
    e = lut(o, [_i32(v + (exp_bias << 23)) for v in tab["exp"]], o.bits(t))
    return o.flt(o.iadd(e, o.shl(o.bits(t), tab["shift"]))), w


def _tanh_ratio(o, u, lut=None):
    a = o.abs(u)
    a = o.sel(o.gt(a, o.f(10.0)), o.f(10.0), a)
    if lut is not None and lut.tanh_table:
        sc, w = _lut_reduce(o, a, 2.0, lut, 0)
        h = o.fma(o.mul(w, w), o.horner(w, _LUT_TANH[lut.n]), w)     # (e^2w - 1)/2
    else:
        sc, h = kernel(o, "_exp_scaled")(o, a, 2.0, 0, one_part=True)
    g = o.fma(sc, h, o.fma(sc, o.f(0.5), o.f(-0.5)))     # (e^2a - 1)/2 >= 0 (or NaN)
    sgn = o.iand(o.bits(u), o.i(-(2 ** 31)))
    # D = g + 1, never rounded on its own: D * d = g*d + d, one FMA
    return (o.flt(o.ior(o.bits(g), sgn)),
            lambda d: o.add(g, o.f(1.0)) if d is None else o.fma(g, d, d))


def _sigmoid_ratio(o, v, lut=None):
    if lut is not None and hasattr(lut, "scalef"):
        return None, _sigmoid_den_scalef(o, v, lut)
    if lut is not None:
        s, w = _lut_reduce(o, o.clamp(v, -110.0, 40.0), -1.0, lut, -64)
        p = o.horner(w, (1.0, -1.0) + _LUT_SIG[lut.n])      # e^-w
        den = o.fma(s, p, o.f(SCALE))                      # (e^-v + 1) * 2^-64
        return None, lambda d: den if d is None else o.mul(den, d)
    s, p = kernel(o, "_exp_scaled")(o, o.clamp(v, -110.0, 40.0), -1.0, -64, whole=True)
    den = o.fma(s, p, o.f(SCALE))                          # (e^-v + 1) * 2^-64
    return None, lambda d: den if d is None else o.mul(den, d)


def _sigmoid_den_scalef(o, v, lut):
    """den_fn of sigmoid with lut.scalef (AVX-512; see "AVX-512" above)."""
    n = lut.n
    vc = o.clamp(v, -110.0, 110.0)
    magic = _mathlib._MAGIC / n                            # rounds to multiples of 1/N
    t = o.fma(vc, o.f(-_mathlib._LOG2E), o.f(magic))
    nf = o.sub(t, o.f(magic))                              # (N*n + j)/N, exact
    w = o.fma(nf, o.f(_mathlib._LN2_HI), vc)               # exact: nf*LN2_HI has < 24 bits
    w = o.fma(nf, o.f(_mathlib._LN2_LO), w)
    p = o.horner(w, (1.0, -1.0) + _SCALEF_SIG[n])          # e^-w
    tj = o.flt(lut(o, lut_tables(n, -64)["t"], o.bits(t)))  # T_j * 2^-64
    den = o.fma(lut.scalef(o, tj, nf), p, o.f(SCALE))      # (e^-v + 1) * 2^-64
    return lambda d: den if d is None else o.mul(den, d)


RATIO = {
    "tanh": Ratio(_tanh_ratio, 28, 0, 28, 0, True),
    "sigmoid": Ratio(_sigmoid_ratio, 0, -64, 95, -64, False),
}


def _ratio_call(v) -> tuple[str, ir.Value] | None:
    """(name, argument) when `v` is a call of @rlx.math.<name>.<f32|vNf32> with a RATIO row."""
    if not isinstance(v, ir.CallInstr) or len(v.args) != 1:
        return None
    parts = getattr(v.callee, "name", "").split(".")
    if len(parts) != 4 or parts[:2] != ["rlx", "math"] or parts[2] not in RATIO:
        return None
    ty = v.type.element if isinstance(v.type, ir.VectorType) else v.type
    return (parts[2], v.args[0]) if ty == F32 else None


def qualifies(f: str, g: str) -> bool:
    """Whether RATIO[f] * RATIO[g] can be formed with one division (see the header)."""
    r1, r2 = RATIO[f], RATIO[g]
    return (min(r1.num_hi, r2.num_hi) == 0 and r1.num_hi + r2.num_hi <= 126 and
            r1.den_lo + r2.den_lo >= -126 and r1.den_hi + r2.den_hi <= 127 and
            -(r1.scale + r2.scale) <= 126)


def fused_product(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value | None:
    """x * y with one division when both are ratio-form mathlib calls that qualify;
    None otherwise."""
    parts = fused_parts(b, x, y)
    if parts is None:
        return None
    q, scale = parts
    return q if scale == 1.0 else Ops(b, q.type).mul(q, Ops(b, q.type).f(scale))


def fused_parts(b: ir.IRBuilder, x: ir.Value, y: ir.Value,
                lut=None) -> tuple[ir.Value, float] | None:
    """(q, scale) with x * y = q * scale, scale a power of two (the multiply is exact, or
    rounds once into the subnormals) and |q| <= 1/scale (or NaN; 2^64 for tanh*sigmoid);
    None when the pair does not qualify.  A sum of such products may add the q's and scale
    the sum once (lowering/cpu/codegen.py and vsum.py do for a float sum of one product).
    `lut`: table-driven exponentials (see "table-driven exponentials"; with AVX-512's
    vscalefps: "AVX-512")."""
    cx, cy = _ratio_call(x), _ratio_call(y)
    if cx is None or cy is None or x.type != y.type or not qualifies(cx[0], cy[0]):
        return None
    o = Ops(b, x.type)
    (n1, d1), (n2, d2) = (RATIO[c[0]].fn(o, c[1], lut) for c in (cx, cy))
    num = n1 if n2 is None else n2 if n1 is None else o.mul(n1, n2)
    # den1 * den2: the factor whose product is one FMA outermost (tanh: g*d + d)
    outer_y = RATIO[cy[0]].fma_den and not RATIO[cx[0]].fma_den
    q = o.div(o.f(1.0) if num is None else num, d2(d1(None)) if outer_y else d1(d2(None)))
    return q, 2.0 ** (RATIO[cx[0]].scale + RATIO[cy[0]].scale)

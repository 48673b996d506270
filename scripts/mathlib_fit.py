"""Fit the float64 polynomial coefficients of lowering/shared/mathlib_f64.py (and mathlib_more.py)
with mpmath, and print them with their measured max relative error.

    python scripts/mathlib_fit.py [name ...]        (needs mpmath; not a runtime dependency)

Method: least squares in relative error at 4*degree Chebyshev nodes of the interval, at
200-bit precision, then the coefficients rounded to float64 and the relative error of the
rounded polynomial measured at 3000 points (evaluated exactly).  Least squares is within a
small factor of minimax; the degrees below leave that margin under 2^-57.
"""
from __future__ import annotations

import sys

import mpmath as mp

mp.mp.prec = 200


def fit(f, a, b, deg, var=lambda u: u, npts=None, absolute=False):
    """Coefficients c_0..c_deg of P(v) ~ f(u) on u in [a, b], v = var(u); relative error
    (or absolute, for a function with a zero inside)."""
    n = npts or 4 * deg + 8
    us = [(a + b) / 2 + (b - a) / 2 * mp.cos(mp.pi * (k + mp.mpf(0.5)) / n) for k in range(n)]
    rows, rhs = [], []
    for u in us:
        fu, v = f(u), var(u)
        wgt = 1 if absolute else fu
        rows.append([v ** j / wgt for j in range(deg + 1)])
        rhs.append(fu if absolute else mp.mpf(1))
    A, y = mp.matrix(rows), mp.matrix(rhs)
    c = mp.lu_solve(A.T * A, A.T * y)
    cs = [float(c[j]) for j in range(deg + 1)]
    worst = mp.mpf(0)
    for k in range(3001):
        u = a + (b - a) * k / 3000
        v = var(u)
        p = mp.mpf(0)
        for cj in reversed(cs):
            p = p * v + mp.mpf(cj)
        worst = max(worst, abs(p - f(u)) if absolute else abs(p / f(u) - 1))
    return cs, float(mp.log(worst, 2))


K_ERFC = 3.0


def _erfcx_scaled(x):
    return (1 + 2 * x) * mp.exp(x * x) * mp.erfc(x)


FITS = {
    # erf(x)/x - 1 = P(x^2) on |x| <= 0.8 (absolute error: the target crosses zero)
    "erf_small": lambda: fit(lambda t: (mp.erf(mp.sqrt(t)) / mp.sqrt(t) if t else
                                        2 / mp.sqrt(mp.pi)) - 1, mp.mpf(0), mp.mpf(0.64), 14,
                             absolute=True),
    # (1+2x) e^(x^2) erfc(x) = P(t), t = (x - K)/(x + K), x in [0.5, 27]
    "erfc_t": lambda: fit(lambda t: _erfcx_scaled(K_ERFC * (1 + t) / (1 - t)),
                          (mp.mpf(0.5) - K_ERFC) / (mp.mpf(0.5) + K_ERFC),
                          (mp.mpf(27) - K_ERFC) / (mp.mpf(27) + K_ERFC), 30),
    # atan(u) = u + u^3 P(u^2) on |u| <= tan(pi/8): P(t) = (atan(sqrt t) - sqrt t)/t^1.5
    "atan_f64": lambda: fit(_atan_p, mp.mpf(0), mp.tan(mp.pi / 8) ** 2, 11),
    "atan_f32": lambda: fit(_atan_p, mp.mpf(0), mp.tan(mp.pi / 8) ** 2, 5),
    # asin(u) = u + u^3 P(u^2) on |u| <= 0.5: P(t) = (asin(sqrt t) - sqrt t)/t^1.5
    "asin_f64": lambda: fit(_asin_p, mp.mpf(0), mp.mpf(0.25), 12),
    "asin_f32": lambda: fit(_asin_p, mp.mpf(0), mp.mpf(0.25), 5),
    # tan(r) = r + r^3 P(r^2) on |r| <= pi/4 (float32)
    "tan_f32": lambda: fit(_tan_p, mp.mpf(0), (mp.pi / 4) ** 2 * mp.mpf(1.0001), 7),
}


def _tan_p(t):
    if t == 0:
        return mp.mpf(1) / 3
    r = mp.sqrt(t)
    return (mp.tan(r) - r) / (r * t)


def _asin_p(t):
    if t == 0:
        return mp.mpf(1) / 6
    r = mp.sqrt(t)
    return (mp.asin(r) - r) / (r * t)


def _atan_p(t):
    if t == 0:
        return mp.mpf(-1) / 3
    r = mp.sqrt(t)
    return (mp.atan(r) - r) / (r * t)


if __name__ == "__main__":
    for name in sys.argv[1:] or FITS:
        cs, err = FITS[name]()
        print(f"{name}: max relative error 2^{err:.1f}")
        print("    (" + ",\n     ".join(repr(c) for c in cs) + ")")

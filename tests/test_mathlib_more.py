"""lowering/shared/mathlib_more.py (atan, atan2, asin, acos, sinh, cosh, tan, asinh, acosh, atanh,
log2, log10, exp2, hypot), float32 and float64: max error in ulps against NumPy in the next
wider type (float64 for float32 results; x87 long double for float64), IEEE special values
and NaN propagation, explicit <8 x T> and auto-vectorized scalar loops agreeing bit for bit."""
from __future__ import annotations

import math
import zlib

import numpy as np
import pytest

from mathlib_kernels import Kernels, TARGETS, random_bits, ulp_error
from rlxc.lowering.shared import mathlib

NEW = ["atan", "atan2", "asin", "acos", "sinh", "cosh", "tan", "asinh", "acosh", "atanh",
       "log2", "log10", "exp2", "hypot"]
PAIRS = [(op, dt) for op in NEW for dt in ("f32", "f64")]
LD = np.longdouble
pytestmark = pytest.mark.skipif(np.finfo(LD).nmant < 63, reason="needs x87 long double")

REF = {"atan": np.arctan, "atan2": np.arctan2, "asin": np.arcsin, "acos": np.arccos,
       "sinh": np.sinh, "cosh": np.cosh, "tan": np.tan, "asinh": np.arcsinh,
       "acosh": np.arccosh, "atanh": np.arctanh, "log2": np.log2, "log10": np.log10,
       "exp2": np.exp2, "hypot": np.hypot}
SWEEP = {"atan": (-5, 5), "atan2": (-3, 3), "asin": (-1, 1), "acos": (-1, 1),
         "sinh": (-20, 20), "cosh": (-20, 20), "tan": (-10, 10), "asinh": (-10, 10),
         "acosh": (1, 10), "atanh": (-1, 1), "log2": (0, 8), "log10": (0, 8),
         "exp2": (-160, 130), "hypot": (-3, 3)}
WIDE = {"f32": np.float64, "f64": LD}
NPT = {"f32": np.float32, "f64": np.float64}

_CACHE: dict = {}


@pytest.fixture(scope="module", params=list(TARGETS))
def k(request):
    if request.param not in _CACHE:
        _CACHE[request.param] = Kernels(request.param, PAIRS)
    return _CACHE[request.param]


def inputs(op, dt, rng):
    lo, hi = SWEEP[op]
    npt = NPT[dt]
    n = 60_000
    parts = [np.linspace(lo, hi, n), random_bits(rng, n, dt).astype(np.float64),
             rng.uniform(lo, hi, n), np.exp(rng.uniform(-20, 5, n)),
             -np.exp(rng.uniform(-20, 5, n))]
    if op == "exp2":
        parts.append(np.arange(-160, 131, 1.0))
        if dt == "f64":
            parts.append(rng.uniform(-1100, 1030, n))
    x = np.concatenate(parts).astype(npt)
    x = x[np.isfinite(x)]
    if mathlib.FUNCTIONS[op].arity == 1:
        return (x,)
    y = np.concatenate([random_bits(rng, x.size, dt)[:x.size], rng.permutation(x)])[:x.size]
    y = np.resize(y, x.size).astype(npt)
    grid = np.array([0.0, -0.0, 1.0, -1.0, 1e-30, 3.0, -3.0, 1e30], npt)
    gx, gy = np.meshgrid(grid, grid)
    return (np.concatenate([x, gx.ravel()]), np.concatenate([y, gy.ravel()]))


def measure(k, op, dt, xs, kind="vec"):
    y = k.run(op, dt, *xs, kind=kind)
    with np.errstate(all="ignore"):
        ref = REF[op](*[x.astype(WIDE[dt]) for x in xs])
    return y, ulp_error(y, ref, dt)


@pytest.mark.parametrize("op,dt", PAIRS)
def test_accuracy_more(k, op, dt):
    xs = inputs(op, dt, np.random.default_rng(zlib.crc32(f"{op}{dt}".encode())))
    y, err = measure(k, op, dt, xs)
    w = int(np.argmax(err))
    bound = mathlib.FUNCTIONS[op].ulp(dt)
    assert err.max() <= bound, (f"{op} {dt}: {err[w]:.3f} ulp at {[x[w] for x in xs]} "
                                f"(got {y[w]!r})")
    ys = k.run(op, dt, *xs, kind="scalar")
    u = np.uint32 if dt == "f32" else np.uint64
    same = (ys.view(u) == y.view(u)) | (np.isnan(ys) & np.isnan(y))
    assert same.all(), f"{op} {dt}: scalar loop differs at {[x[~same][:4] for x in xs]}"


INF, NAN = math.inf, math.nan
SPECIAL = {   # (args, expected): compared bitwise, sign of zero included
    "atan": [((INF,), math.pi / 2), ((-INF,), -math.pi / 2), ((0.0,), 0.0), ((-0.0,), -0.0)],
    "atan2": [((0.0, 0.0), 0.0), ((-0.0, 0.0), -0.0), ((0.0, -0.0), math.pi),
              ((-0.0, -0.0), -math.pi), ((INF, INF), math.pi / 4), ((-INF, -INF), -3 * math.pi / 4),
              ((1.0, INF), 0.0), ((1.0, -INF), math.pi), ((INF, 1.0), math.pi / 2),
              ((NAN, 1.0), NAN), ((1.0, NAN), NAN), ((-1.0, -0.0), -math.pi / 2)],
    "asin": [((1.0,), math.pi / 2), ((-1.0,), -math.pi / 2), ((-0.0,), -0.0), ((2.0,), NAN),
             ((INF,), NAN)],
    "acos": [((1.0,), 0.0), ((-1.0,), math.pi), ((0.0,), math.pi / 2), ((1.5,), NAN)],
    "sinh": [((INF,), INF), ((-INF,), -INF), ((-0.0,), -0.0), ((1e4,), INF)],
    "cosh": [((INF,), INF), ((-INF,), INF), ((0.0,), 1.0), ((-1e4,), INF)],
    "tan": [((INF,), NAN), ((-INF,), NAN), ((0.0,), 0.0), ((-0.0,), -0.0)],
    "asinh": [((INF,), INF), ((-INF,), -INF), ((-0.0,), -0.0)],
    "acosh": [((1.0,), 0.0), ((INF,), INF), ((0.5,), NAN), ((-INF,), NAN)],
    "atanh": [((1.0,), INF), ((-1.0,), -INF), ((-0.0,), -0.0), ((2.0,), NAN)],
    "log2": [((0.0,), -INF), ((-1.0,), NAN), ((INF,), INF), ((1.0,), 0.0), ((8.0,), 3.0),
             ((2.0 ** -130,), -130.0)],
    "log10": [((0.0,), -INF), ((-1.0,), NAN), ((INF,), INF), ((1.0,), 0.0)],
    "exp2": [((INF,), INF), ((-INF,), 0.0), ((0.0,), 1.0), ((10.0,), 1024.0),
             ((-149.0,), 2.0 ** -149), ((-3.0,), 0.125), ((2000.0,), INF)],
    "hypot": [((INF, NAN), INF), ((NAN, -INF), INF), ((NAN, 1.0), NAN), ((0.0, -0.0), 0.0),
              ((3.0, 4.0), 5.0), ((-INF, 1.0), INF)],
}


@pytest.mark.parametrize("op,dt", PAIRS)
def test_special_values_more(k, op, dt):
    npt = NPT[dt]
    cases = SPECIAL[op] * 3                          # through the vector body and the tail
    xs = [np.array([c[0][i] for c in cases], npt) for i in range(len(cases[0][0]))]
    want = np.array([c[1] for c in cases], npt)
    u = np.uint32 if dt == "f32" else np.uint64
    for kind in ("vec", "scalar"):
        got = k.run(op, dt, *xs, kind=kind)
        for i, (g, w) in enumerate(zip(got, want)):
            ok = (np.isnan(g) and np.isnan(w)) or g.view(u) == w.view(u)
            assert ok, f"{op}_{dt}_{kind}{tuple(x[i] for x in xs)} = {g!r}, want {w!r}"


@pytest.mark.parametrize("op,dt", PAIRS)
def test_nan_propagates_more(k, op, dt):
    npt = NPT[dt]
    nan = np.full(11, np.nan, npt)
    args = [nan] * mathlib.FUNCTIONS[op].arity
    if op == "hypot":
        args = [nan, np.full(11, 2.0, npt)]
    for kind in ("vec", "scalar"):
        assert np.isnan(k.run(op, dt, *args, kind=kind)).all(), op

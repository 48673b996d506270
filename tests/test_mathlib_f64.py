"""mathlib float64 kernels (lowering/shared/mathlib_f64.py): accuracy in float64 ulps against
references computed in x87 extended precision (np.longdouble, 64-bit significand: the
reference's own error is ~2^-11 ulp), IEEE special values, NaN propagation, explicit
<8 x double> and auto-vectorized scalar loops giving the same bits, no libm calls."""
from __future__ import annotations

import math
import re
import zlib

import numpy as np
import pytest

from mathlib_kernels import PI_LD, Kernels, TARGETS, erf_ld, erfc_ld, random_bits, ulp_error
from rlxc.lowering.shared import mathlib

# the float64 kernels of mathlib_f64.py (mathlib_more's are in test_mathlib_more.py)
OPS = ["cos", "erf", "erfc", "exp", "expm1", "gelu", "gelu_tanh", "log", "log1p", "sigmoid",
       "silu", "sin", "softplus", "tanh"]
LD = np.longdouble
pytestmark = pytest.mark.skipif(np.finfo(LD).nmant < 63, reason="needs x87 long double")

_CACHE: dict = {}


@pytest.fixture(scope="module", params=list(TARGETS))
def k(request):
    if request.param not in _CACHE:
        _CACHE[request.param] = Kernels(request.param, [(op, "f64") for op in OPS])
    return _CACHE[request.param]


def _sigmoid(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _gelu_tanh_w(x):
    return 2 * np.sqrt(LD(2) / PI_LD) * (x + LD(0.044715) * x ** 3)


REF = {     # x: np.longdouble array
    "exp": np.exp, "expm1": np.expm1, "log": np.log, "log1p": np.log1p,
    "sin": np.sin, "cos": np.cos, "tanh": np.tanh, "sigmoid": _sigmoid,
    "silu": lambda x: x * _sigmoid(x), "softplus": lambda x: np.logaddexp(LD(0), x),
    "gelu_tanh": lambda x: x * _sigmoid(_gelu_tanh_w(x)),
    "erf": erf_ld, "erfc": erfc_ld,
    "gelu": lambda x: x / 2 * erfc_ld(-x / np.sqrt(LD(2))),
}
SWEEP = {
    "exp": (-746.0, 710.0), "expm1": (-40.0, 710.0), "log": (0.0, 16.0), "log1p": (-1.0, 16.0),
    "sin": (-40.0, 40.0), "cos": (-40.0, 40.0), "tanh": (-25.0, 25.0),
    "sigmoid": (-750.0, 750.0), "silu": (-750.0, 750.0), "softplus": (-750.0, 750.0),
    "gelu_tanh": (-40.0, 40.0), "erf": (-7.0, 7.0), "erfc": (-7.0, 28.0), "gelu": (-40.0, 40.0),
}


def inputs(op: str, rng) -> np.ndarray:
    lo, hi = SWEEP[op]
    parts = [np.linspace(lo, hi, 200_001), random_bits(rng, 100_000, "f64"),
             np.exp(rng.uniform(math.log(1e-300), math.log(1e3), 30_000)),
             rng.uniform(-2, 2, 30_000),
             rng.integers(1, 2 ** 52, 3_000, dtype=np.uint64).view(np.float64)]
    if op in ("sin", "cos"):     # up to the Cody-Waite limit 2^26, and huge (Payne-Hanek)
        parts.append(rng.uniform(-2.0 ** 26, 2.0 ** 26, 100_000))
        parts.append(np.exp(rng.uniform(math.log(2.0 ** 25), math.log(1.79e308), 100_000)))
    x = np.concatenate(parts + [-p for p in parts[2:]])
    if op in ("erf", "erfc", "gelu"):            # the long double series are slow
        x = x[::5]
    return x[np.isfinite(x)]


def mask(op: str, x: np.ndarray) -> np.ndarray:
    """Where BOUNDS['f64'][op] applies (the mathlib header documents the rest)."""
    if op == "gelu_tanh":
        return x >= mathlib.GELU_TANH_EXACT_FROM
    return np.ones(x.shape, bool)


def measure(k, op, x, kind="vec"):
    y = k.run(op, "f64", x, kind=kind)
    with np.errstate(all="ignore"):
        ref = REF[op](x.astype(LD))
    return y, ulp_error(y, ref, "f64")


@pytest.mark.parametrize("op", OPS)
def test_accuracy_f64(k, op):
    x = inputs(op, np.random.default_rng(zlib.crc32(op.encode())))
    y, err = measure(k, op, x)
    m = mask(op, x)
    bound = mathlib.FUNCTIONS[op].ulp_f64
    w = int(np.argmax(np.where(m, err, -1)))
    assert err[m].max() <= bound, f"{op}: {err[w]:.3f} ulp at x={x[w]!r} (got {y[w]!r})"
    ys = k.run(op, "f64", x, kind="scalar")
    same = (ys.view(np.uint64) == y.view(np.uint64)) | (np.isnan(ys) & np.isnan(y))
    assert same.all(), f"{op}: scalar loop differs at x={x[~same][:4]}"


INF, NAN = math.inf, math.nan
SPECIAL = {
    "exp": [(INF, INF), (-INF, 0.0), (0.0, 1.0), (-0.0, 1.0), (710.0, INF), (-746.0, 0.0),
            (-745.0, 5e-324), (709.782712893384, 1.7976931348622732e308)],
    "expm1": [(INF, INF), (-INF, -1.0), (0.0, 0.0), (-0.0, -0.0), (1e-300, 1e-300),
              (5e-324, 5e-324), (-50.0, -1.0)],
    "log": [(0.0, -INF), (-0.0, -INF), (-1.0, NAN), (-INF, NAN), (INF, INF), (1.0, 0.0),
            (5e-324, -744.4400719213812)],
    "log1p": [(-1.0, -INF), (-2.0, NAN), (INF, INF), (0.0, 0.0), (-0.0, -0.0),
              (5e-324, 5e-324), (-INF, NAN)],
    "sin": [(INF, NAN), (-INF, NAN), (0.0, 0.0), (-0.0, -0.0), (5e-324, 5e-324)],
    "cos": [(INF, NAN), (-INF, NAN), (0.0, 1.0), (-0.0, 1.0)],
    "tanh": [(INF, 1.0), (-INF, -1.0), (0.0, 0.0), (-0.0, -0.0), (5e-324, 5e-324),
             (-5e-324, -5e-324), (30.0, 1.0)],
    "sigmoid": [(INF, 1.0), (-INF, 0.0), (0.0, 0.5), (-0.0, 0.5), (-800.0, 0.0), (800.0, 1.0)],
    "silu": [(INF, INF), (-INF, -0.0), (0.0, 0.0), (-0.0, -0.0), (-800.0, -0.0)],
    "softplus": [(INF, INF), (-INF, 0.0), (0.0, math.log(2.0)), (1e300, 1e300),
                 (-800.0, 0.0)],
    "erf": [(INF, 1.0), (-INF, -1.0), (0.0, 0.0), (-0.0, -0.0), (7.0, 1.0), (-5e-324, -5e-324)],
    "erfc": [(INF, 0.0), (-INF, 2.0), (0.0, 1.0), (-0.0, 1.0), (28.0, 0.0), (-28.0, 2.0)],
    "gelu": [(INF, INF), (-INF, -0.0), (0.0, 0.0), (-0.0, -0.0), (50.0, 50.0), (-50.0, -0.0)],
    "gelu_tanh": [(INF, INF), (-INF, -0.0), (0.0, 0.0), (-0.0, -0.0), (50.0, 50.0),
                  (-50.0, -0.0)],
}


# the double nearest a multiple of pi/2 (|x*2/pi - j| ~ 2^-61), the 2^26 switch, extremes
HUGE = [6381956970095103 * 2.0 ** 797, 2.0 ** 26, np.nextafter(2.0 ** 26, 0), 1e22, 2.0 ** 60,
        1e300, 1.7976931348623157e308, 5.319372648326541e255, 2.0 ** 1023, 1e16, 123456789.0]


def test_sin_cos_f64_huge_arguments(k):
    x = np.array(HUGE)
    with np.errstate(over="ignore"):
        x = np.concatenate([x, -x, np.nextafter(x, np.inf), np.nextafter(x, 0)])
    x = x[np.isfinite(x)]
    for op in ("sin", "cos"):
        y, err = measure(k, op, x)
        assert err.max() <= mathlib.FUNCTIONS[op].ulp_f64, (op, x[np.argmax(err)], err.max())


@pytest.mark.parametrize("op", OPS)
def test_special_values_f64(k, op):
    xs = np.array([x for x, _ in SPECIAL[op]] * 3)     # through the vector body and the tail
    want = np.array([w for _, w in SPECIAL[op]] * 3)
    for kind in ("vec", "scalar"):
        got = k.run(op, "f64", xs, kind=kind)
        for xi, gi, wi in zip(xs, got, want):
            ok = (np.isnan(gi) and np.isnan(wi)) or gi.view(np.uint64) == wi.view(np.uint64)
            assert ok, f"{op}_{kind}({xi!r}) = {gi!r}, want {wi!r}"


@pytest.mark.parametrize("op", OPS)
def test_nan_propagates_f64(k, op):
    nans = np.array([0x7FF8000000000000, 0xFFF8000000000000, 0x7FF0000000000001,
                     0x7FFFFFFFFFFFFFFF] * 3, np.uint64).view(np.float64)
    for kind in ("vec", "scalar"):
        assert np.isnan(k.run(op, "f64", nans, kind=kind)).all(), op


_LIBM = re.compile(r"call[^\n]*@(?!llvm\.)([\w.]+)")


@pytest.mark.parametrize("op", OPS)
def test_f64_loop_vectorizes_without_libm(op):
    k = _CACHE.get("host") or Kernels("host", [(o, "f64") for o in OPS])
    _CACHE["host"] = k
    text = k.ir_of(f"{op}_f64_scalar")
    # sin/cos hold a uniform branch whose Payne-Hanek block reads a table: the AVX2 cost
    # model leaves their loop scalar (the CPU backend emits explicit vectors for them:
    # lowering/cpu/vmap.py); every other op's loop vectorizes on every x86-64 target
    if op not in mathlib.UNIFORM_BRANCH:
        assert re.search(r"<\d+ x double>", text), f"{op}: scalar f64 loop not vectorized"
    assert not _LIBM.findall(text), f"{op}: calls {_LIBM.findall(text)}"
    assert not re.search(r"@llvm\.(exp|exp2|log|log2|log10|pow|sin|cos|tan|floor)\.", text)

"""x ** k for the constant exponents that skip libm's pow (lowering/shared/scalar.py
_POW_CONST: 3, 4, -2, 0.5, -0.5): no llvm.pow in the IR, C99 pow's special values bit for
bit (signed zeros, infinities, NaN, negative bases), finite values within the documented ulps
of the float64 (float32) / long double (float64) reference, on the CPU and through grad."""
import numpy as np
import pytest

from rlxc import Func
from rlxc.lowering.cpu.driver import emit_llvm

ULP = {3.0: 2.0, 4.0: 3.0, -2.0: 2.0, 0.5: 0.5, -0.5: 1.5}
NP = {"f32": np.float32, "f64": np.float64}
WIDE = {"f32": np.float64, "f64": np.longdouble}
SPECIALS = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 2.0, -2.0, 0.5, -3.0, 1e-30, -1e-30,
            1e30, -1e30, 3e38, 1e-45, -1e-45]


def _f(k, dt, n):
    return Func(f"pow{k}_{dt}".replace(".", "p").replace("-", "m"),
                lambda s: s.input("x", (n,), dt) ** k)


def _ulps(got, ref, dt):
    npt = NP[dt]
    fi = np.finfo(npt)
    e = np.frexp(np.abs(ref))[1]
    ulp = np.ldexp(WIDE[dt](1.0), (np.maximum(e - 1, fi.minexp) - fi.nmant).astype(np.int32))
    return np.abs(got.astype(WIDE[dt]) - ref) / ulp


@pytest.mark.parametrize("k", list(ULP))
def test_no_libm_pow(k):
    assert "llvm.pow" not in emit_llvm(_f(k, "f32", 64).module, "p")


@pytest.mark.parametrize("dt", ["f32", "f64"])
@pytest.mark.parametrize("k", list(ULP))
def test_specials_bitwise(k, dt):
    x = np.array(SPECIALS * 3, NP[dt])               # through the vector body and the tail
    got = _f(k, dt, len(x)).jit().run(x=x)[0]
    with np.errstate(all="ignore"):
        want = np.power(x, np.full_like(x, k))    # an array exponent: C99's pow (a scalar 0.5
                                                   # takes NumPy's sqrt: pow(-0, 0.5) = -0)
    for xi, g, w in zip(x, got, want):
        if not np.isfinite(w) or w == 0 or np.isnan(w) or abs(xi) in (0.0, 1.0):
            assert (np.isnan(g) and np.isnan(w)) or (g == w and np.signbit(g) == np.signbit(w)), \
                f"pow({xi!r}, {k}) = {g!r}, want {w!r}"


@pytest.mark.parametrize("dt", ["f32", "f64"])
@pytest.mark.parametrize("k", list(ULP))
def test_accuracy(k, dt):
    rng = np.random.default_rng(3)
    n = 4099
    x = (rng.standard_normal(n) * np.exp(rng.uniform(-8, 8, n))).astype(NP[dt])
    if k in (0.5, -0.5):
        x = np.abs(x)
    # bases whose square is subnormal while x**-2 is finite (and beyond)
    fi = np.finfo(NP[dt])
    edge = np.sqrt(fi.tiny) * np.array([0.55, 0.6, 0.8, 0.99, 1.0, 1.01, 1.5], NP[dt])
    x = np.concatenate([x, edge, -edge]).astype(NP[dt])
    n = len(x)
    got = _f(k, dt, n).jit().run(x=x)[0]
    ref = np.power(x.astype(WIDE[dt]), WIDE[dt](k))
    ok = np.isfinite(ref) & (np.abs(ref) > np.finfo(NP[dt]).tiny) & \
        (np.abs(ref) < np.finfo(NP[dt]).max)
    u = _ulps(got[ok], ref[ok], dt)
    assert u.max() <= ULP[k], f"x**{k} ({dt}) off by {u.max():.2f} ulp"


def test_grad_through_cube():
    f = Func("cube", lambda s: (s.input("x", (5,)) ** 3).sum())
    x = np.array([-2.0, -0.5, 0.0, 1.5, 3.0], np.float32)
    np.testing.assert_allclose(f.grad(["x"]).run(x=x)[0], 3 * x * x, rtol=1e-6)

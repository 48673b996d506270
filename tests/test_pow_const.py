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


def host_fma() -> bool:
    """Whether this host's vector ISA has FMA (float32 pow leaves libm only there)."""
    from rlxc.lowering.cpu.sgemm_kernels import ISAS, sgemm_config
    return ISAS[sgemm_config("native").isa].fma


@pytest.mark.skipif(not host_fma(), reason="this host has no FMA: float32 pow calls libm's "
                    "powf here (test_float32_pow_without_fma_calls_libm checks that choice)")
@pytest.mark.parametrize("k", [None, 2.5, -1.5, 1.0 / 3.0, 7.0, 1e-3])
def test_float32_pow_is_correctly_rounded(k):
    """float32 x ** y (a runtime y, or a constant off the fast list) is exp(y*log|x|) in
    float64 (scalar.pow_exp_log), no libm call: the float64 result is within ~2^-44 of the
    exact power, so the float32 one is the correctly rounded value (libm's powf missed it
    on 628 of 1M random pairs), through the explicit vector loop (vmap) and its tail."""
    rng = np.random.default_rng(11)
    n = 20011
    x = np.abs(rng.standard_normal(n) * np.exp(rng.uniform(-20, 20, n))).astype(np.float32)
    y = (rng.standard_normal(n) * np.exp(rng.uniform(-4, 3, n))).astype(np.float32)
    if k is None:
        f = Func("powxy", lambda s: s.input("x", (n,)) ** s.input("y", (n,)))
        got, yy = f.jit().run(x, y)[0], y
    else:
        f = _f(k, "f32", n)
        got, yy = f.jit().run(x=x)[0], np.full(n, k, np.float32)
    assert "llvm.pow" not in emit_llvm(f.module, "p")
    with np.errstate(all="ignore"):
        ref = np.power(x.astype(np.float64), yy.astype(np.float64))
    ok = np.isfinite(ref) & (np.abs(ref) >= np.finfo(np.float32).tiny) & \
        (np.abs(ref) <= np.finfo(np.float32).max)
    assert ok.sum() > n // 3
    np.testing.assert_array_equal(got[ok], ref[ok].astype(np.float32))
    assert _ulps(got[ok], ref[ok], "f32").max() <= 0.5 + 2.0 ** -10
    with np.errstate(all="ignore"):
        want = ref[~ok].astype(np.float32)           # overflow to inf, underflow, subnormals
    np.testing.assert_array_equal(got[~ok], want)


@pytest.mark.parametrize("k", [3.0, 0.5, 2.5, 2.0])
def test_constant_exponent_in_an_explicit_vector_loop(k):
    """sin(x) ** k compiles (the explicit vector loop of lowering/cpu/vmap.py hands pow a
    splat vector of constants; reading its value raised TypeError) and keeps the fast path."""
    x = np.linspace(0.0, 3.0, 67).astype(np.float32)
    f = Func("sinpow", lambda s: s.input("x", (67,)).sin() ** k)
    got = f.jit().run(x=x)[0]
    np.testing.assert_allclose(got, np.sin(x.astype(np.float64)) ** k, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("cpu,libm", [("x86-64", True), ("sandybridge", True),
                                      ("x86-64-v3", False), ("znver3", False)])
def test_float32_pow_without_fma_calls_libm(cpu, libm):
    """Without FMA (baseline x86-64, AVX-only) the float64 exp/log ran slower than libm's
    powf (scalar.LIBM_POW_RULES), so only FMA targets leave libm."""
    f = Func("powcpu", lambda s: s.input("x", (64,)) ** s.input("y", (64,)))
    assert ("llvm.pow" in emit_llvm(f.module, "p", cpu=cpu)) == libm

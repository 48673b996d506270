"""NumPy's elementwise family as rlx ops, in float32 and float64 (issue 12, issue 20 items 4-5).

Every op with a `math` property (dialect/shapes.py) runs in float64 on the native CPU
and on the GPU emulator and is compared with an extended-precision reference (NumPy's
long double loops, or a stable formula) within its float64 ulp bound from the mathlib
table (+1 ulp for the reference's own rounding where it is a double); the PTX of the
float64 kernels assembles with ptxas; the NumPy spellings (arcsin, arctan2, ...) are
methods; gradients of the family on the CPU in float64 match central differences.
Per-op float32 cases live in tests/opcases.py and tests/test_autodiff.py, the edge
values (NaN, inf, +-0, huge) in tests/test_edge_semantics.py.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import rlxc
from rlxc.dialect.shapes import SHAPES
from rlxc.lowering.gpu import emu
from rlxc.lowering.gpu import nvptx
from rlxc.lowering.shared import mathlib

LD = np.longdouble
MATH = sorted(n[4:] for n, s in SHAPES.items() if s.math)
UNARY = [n for n in MATH if SHAPES[f"rlx.{n}"].family == "unary"]
BINARY = [n for n in MATH if SHAPES[f"rlx.{n}"].family == "binary"]
rng = np.random.default_rng(20)


def _erf_like(fn, sign):
    """math.erf / erfc (double) at the long double v, corrected to first order for the
    rounding of v to double (in the tails that rounding alone costs ~2v^2 ulps)."""
    def f(v):
        v = np.asarray(v, LD)
        vd = v.astype(np.float64)
        base = np.vectorize(fn, otypes=[np.float64])(vd).astype(LD)
        dens = (2 / np.sqrt(LD(np.pi))) * np.exp(-vd.astype(LD) ** 2)   # |erf'(vd)|
        return base + sign * (v - vd.astype(LD)) * dens
    return f


_erf, _erfc = _erf_like(math.erf, 1), _erf_like(math.erfc, -1)


def _sig(v):
    return 1 / (1 + np.exp(-v))


# name -> (reference on long doubles, input range, slack in ulps for a double-only reference)
REFS = {
    "exp": (np.exp, (-700, 700), 0), "expm1": (np.expm1, (-40, 40), 0),
    "exp2": (np.exp2, (-1000, 1000), 0), "log": (np.log, (1e-300, 1e300), 0),
    "log1p": (np.log1p, (-0.99, 1e6), 0), "log2": (np.log2, (1e-300, 1e300), 0),
    "log10": (np.log10, (1e-300, 1e300), 0), "sin": (np.sin, (-1e4, 1e4), 0),
    "cos": (np.cos, (-1e4, 1e4), 0), "tan": (np.tan, (-100, 100), 0),
    "tanh": (np.tanh, (-20, 20), 0), "sigmoid": (_sig, (-40, 40), 0),
    "silu": (lambda x: x * _sig(x), (-40, 40), 0),
    "softplus": (lambda x: np.logaddexp(LD(0), x), (-40, 40), 0),
    "gelu_tanh": (lambda x: x * _sig(2 * np.sqrt(LD(2) / np.pi) * (x + LD(0.044715) * x ** 3)),
                  (-1, 8), 0),
    "erf": (_erf, (-6, 6), 1), "gelu": (lambda x: x / 2 * _erfc(-x / np.sqrt(LD(2))), (-6, 8), 2),
    "atan": (np.arctan, (-1e6, 1e6), 0), "asin": (np.arcsin, (-1, 1), 0),
    "acos": (np.arccos, (-1, 1), 0), "sinh": (np.sinh, (-700, 700), 0),
    "cosh": (np.cosh, (-700, 700), 0), "asinh": (np.arcsinh, (-1e6, 1e6), 0),
    "acosh": (np.arccosh, (1, 1e6), 0), "atanh": (np.arctanh, (-0.999, 0.999), 0),
    "atan2": (np.arctan2, (-100, 100), 0), "hypot": (np.hypot, (-1e200, 1e200), 0),
}


def test_every_transcendental_has_a_reference():
    assert set(REFS) == set(MATH), sorted(set(MATH) ^ set(REFS))


def _sample(name, n=1500):
    lo, hi = REFS[name][1]
    if lo > 0 and hi / lo > 1e6:     # log-uniform over wide positive ranges
        return np.exp(rng.uniform(np.log(lo), np.log(hi), n))
    x = rng.uniform(lo, hi, n)
    small = rng.uniform(max(lo, -1), min(hi, 1), n // 3)    # the region near 0 as well
    return np.concatenate([x, small, [max(lo, 0.0), min(hi, 1e-300)]])


def _f64_ulps(got, ref):
    r64 = ref.astype(np.float64)
    ulp = np.maximum(np.abs(np.spacing(r64)), 2.0 ** -1074)
    return np.abs((got.astype(LD) - ref) / ulp.astype(LD)).astype(np.float64)


def _func(name, dt):
    if name in BINARY:
        return rlxc.Func(f"fam_{name}_{dt}", lambda s: getattr(s.input("x", (N2,), dt),
                                                                   name)(s.input("y", (N2,), dt)))
    return rlxc.Func(f"fam_{name}_{dt}", lambda s: getattr(s.input("x", (N1,), dt), name)())


N1, N2 = 2002, 1000


def _inputs(name):
    if name in BINARY:
        lo, hi = REFS[name][1]
        return {"x": rng.uniform(lo, hi, N2), "y": rng.uniform(lo, hi, N2)}
    x = _sample(name)
    return {"x": np.resize(x, N1)}


@pytest.mark.parametrize("name", MATH)
def test_f64_transcendental_cpu_and_gpu(name):
    """float64 on the native CPU (no longer 'not supported') and the GPU emulator, within
    the mathlib float64 bound of an extended-precision reference."""
    ref_fn, _, slack = REFS[name]
    inputs = _inputs(name)
    with np.errstate(all="ignore"):
        ref = ref_fn(*(v.astype(LD) for v in inputs.values()))
    f = _func(name, "f64")
    bound = mathlib.BOUNDS["f64"][name] + slack
    if name == "gelu_tanh":
        assert min(inputs["x"]) >= mathlib.GELU_TANH_EXACT_FROM
    for where, got in (("cpu", f.run_on("cpu", **inputs)[0]),
                       ("gpu-emu", emu.emulate(f.module, f.bind_call((), inputs))[0])):
        assert got.dtype == np.float64, where
        fin = np.isfinite(ref.astype(np.float64))
        np.testing.assert_array_equal(np.isfinite(got), fin, err_msg=f"{where}: finiteness")
        u = _f64_ulps(got[fin], ref[fin])
        worst = int(np.argmax(u))
        assert u[worst] <= bound, f"{where}: {name} f64 {u[worst]:.2f} ulp at " \
            f"{[v[fin][worst] for v in inputs.values()]} (bound {bound})"


def test_f64_exp_on_cpu_no_longer_raises():
    """Regression (issue 20 item 5): f64 exp on cpu raised 'rlx.exp on f64 is not supported'."""
    x = np.array([-1.5, 0.0, 1e-10, 2.0, 700.0])
    got = rlxc.Func("exp64", lambda s: s.input("x", (5,), "f64").exp()).run_on("cpu", x=x)[0]
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, np.exp(x), rtol=2e-16)


def test_numpy_aliases():
    x = rng.uniform(-0.9, 0.9, 6).astype(np.float32)
    y = rng.uniform(0.2, 2, 6).astype(np.float32)

    def build(s):
        a, b = s.input("x", (6,)), s.input("y", (6,))
        return [a.arctan2(b), a.arcsin(), a.arccos(), a.arctan(), a.arcsinh(), a.arctanh(),
                (b + 1.0).arccosh(), a.atan2(b), a.hypot(b), a.log1p(), a.expm1()]

    want = [np.arctan2(x, y), np.arcsin(x), np.arccos(x), np.arctan(x), np.arcsinh(x),
            np.arctanh(x), np.arccosh(y + 1), np.arctan2(x, y), np.hypot(x, y), np.log1p(x),
            np.expm1(x)]
    f = rlxc.Func("aliases", build)
    for dev in ("cpu", "interp"):
        for g, w in zip(f.run_on(dev, x=x, y=y), want):
            np.testing.assert_allclose(g, w, rtol=4e-7, atol=1e-7, err_msg=dev)
    assert rlxc.Tensor.arctan2 is rlxc.Tensor.atan2 and rlxc.Tensor.arcsin is rlxc.Tensor.asin


def test_family_gradients_f64_on_cpu_against_fd():
    """d/dx of sum_k w_k * f_k(x_k) for every transcendental, compiled for the CPU in float64,
    against central differences of the NumPy functions."""
    names = [n for n in MATH if n in UNARY]
    xs = {}
    for n in names:
        lo, hi = {"asin": (-0.8, 0.8), "acos": (-0.8, 0.8), "atanh": (-0.8, 0.8),
                  "acosh": (1.2, 3), "log": (0.3, 3), "log1p": (-0.5, 3), "log2": (0.3, 3),
                  "log10": (0.3, 3), "tan": (-1.2, 1.2)}.get(n, (-2, 2))
        xs[n] = rng.uniform(lo, hi, 5)
    a, b = rng.uniform(-2, 2, 5), rng.uniform(0.3, 2, 5)

    def build(s):
        tot = None
        for n in names:
            t = getattr(s.input(n, (5,), "f64"), n)().sum()
            tot = t if tot is None else tot + t
        p, q = s.input("a", (5,), "f64"), s.input("b", (5,), "f64")
        return tot + p.atan2(q).sum() + p.hypot(q).sum()

    f = rlxc.Func("family_grad64", build)
    wrt = names + ["a", "b"]
    inputs = {**xs, "a": a, "b": b}
    grads = f.grad(wrt).run_on("cpu", **inputs)
    h = 1e-6
    np_fn = {n: REFS[n][0] for n in names}
    for n, g in zip(names, grads):
        x = xs[n].astype(LD)
        fd = (np_fn[n](x + LD(h)) - np_fn[n](x - LD(h))) / LD(2 * h)
        np.testing.assert_allclose(g, fd.astype(np.float64), rtol=1e-7, atol=1e-9, err_msg=n)
    A, B = a.astype(LD), b.astype(LD)
    for g, fd in ((grads[-2], (np.arctan2(A + LD(h), B) - np.arctan2(A - LD(h), B)
                               + np.hypot(A + LD(h), B) - np.hypot(A - LD(h), B)) / LD(2 * h)),
                  (grads[-1], (np.arctan2(A, B + LD(h)) - np.arctan2(A, B - LD(h))
                               + np.hypot(A, B + LD(h)) - np.hypot(A, B - LD(h))) / LD(2 * h))):
        np.testing.assert_allclose(g, fd.astype(np.float64), rtol=1e-7, atol=1e-9)


def test_hypot_and_atan2_gradients_at_the_origin_are_zero():
    def build(s):
        x, y = s.input("x", (2,)), s.input("y", (2,))
        return x.hypot(y).sum() + x.atan2(y).sum()
    f = rlxc.Func("origin", build)
    z = np.zeros(2, np.float32)
    for dev in ("cpu", "interp"):
        for g in f.grad(["x", "y"]).run_on(dev, x=z, y=z):
            np.testing.assert_array_equal(g, 0.0, err_msg=dev)


@pytest.mark.skipif(nvptx.find_ptxas() is None, reason="no ptxas found")
@pytest.mark.parametrize("dt", ["f32", "f64"])
def test_family_ptx_assembles(dt):
    """Every transcendental and pow in one kernel for sm_90, float32 and float64."""
    from rlxc.lowering.gpu import driver as gpu_driver

    def build(s):
        x, y = s.input("x", (64,), dt), s.input("y", (64,), dt)
        return [getattr(x, n)() for n in UNARY] + [getattr(x, n)(y) for n in BINARY] + [x ** y]
    f = rlxc.Func(f"family_ptx_{dt}", build)
    art = gpu_driver.compile_cuda(f.module, ptxas=nvptx.find_ptxas())
    assert ".target sm_90" in art.ptx
    assert art.cubin and art.cubin[:4] == b"\x7fELF"     # ptxas assembled it

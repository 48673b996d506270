"""Elementwise maps with a transcendental as explicit vector loops (lowering/cpu/vmap.py).

Golden IR: the map's innermost loop is the `.mbody` vector loop (two registers of the dtype
per iteration: <16 x float> / <8 x double> on AVX2, twice that on AVX-512), for sin/cos/tan
with their Payne-Hanek block still a branch (`rare`), then the scalar rest; maps without a
transcendental, maps of mixed dtypes and a shifted in-place read are left to the loop
vectorizer.  Numerics against NumPy
at lengths around the vector width (the scalar rest), with huge arguments in some lanes (the
rare block for a whole vector), NaN/inf, an invariant operand and a parallel 1-D map run on
1 and 2 threads.
"""
import re

import numpy as np
import pytest

from rlxc import Func
from rlxc.lowering.cpu import indexing as ix, loops, vmap
from rlxc.lowering.cpu.driver import emit_llvm
from rlxc.lowering.cpu.sgemm_kernels import sgemm_config

RNG = np.random.default_rng(11)
NP = {"f32": np.float32, "f64": np.float64}
TOL = {"f32": 3e-7, "f64": 5e-16}     # relative, against float64 / the reference's rounding


def _map(op, n, dt, scaled=False):
    def build(s):
        x = s.input("x", (n,), dt)
        y = getattr(x, op)()
        return y * s.input("w", (), dt) + 0.5 if scaled else y
    return Func(f"{op}_{dt}", build)


def _vector_loop(text):
    return re.search(r"\.mbody", text) is not None


@pytest.mark.parametrize("dt", ["f32", "f64"])
@pytest.mark.parametrize("op", ["sin", "cos", "tan"])
def test_golden_map_is_an_explicit_vector_loop(op, dt):
    text = emit_llvm(_map(op, 1000, dt).module, "m")
    assert _vector_loop(text), text[:2000]
    lanes = vmap.REGISTERS[dt] * sgemm_config("native").vl // (1 if dt == "f32" else 2)
    elt = "float" if dt == "f32" else "double"
    assert f"<{lanes} x {elt}>" in text
    assert re.search(r"^rare[\w.]*:", text, re.M), "the Payne-Hanek block is a branch"


@pytest.mark.parametrize("op", ["exp", "tanh", "gelu", "log", "atan2"])
def test_golden_every_transcendental_map_is_an_explicit_vector_loop(op):
    """vmap.REGISTERS dependency chains per iteration for every mathlib kernel
    (vmap.CHAINED)."""
    if op == "atan2":
        f = Func("atan2", lambda s: s.input("y", (1000,)).atan2(s.input("x", (1000,))))
    else:
        f = _map(op, 1000, "f32")
    text = emit_llvm(f.module, "m")
    assert _vector_loop(text)
    assert f"<{vmap.REGISTERS['f32'] * sgemm_config('native').vl} x float>" in text


def test_golden_other_maps_are_left_to_the_vectorizer():
    plain = Func("plain", lambda s: (s.input("x", (1000,)) * 2.0 + 1.0).relu())
    assert not _vector_loop(emit_llvm(plain.module, "m"))
    mixed = Func("mixed", lambda s: s.input("x", (1000,), "f64").sin().cast("f32"))
    assert not _vector_loop(emit_llvm(mixed.module, "m"))


def test_shifted_in_place_read_is_refused():
    x, y = loops.Buffer("x", "input", "f32", 9), loops.Buffer("y", "output", "f32", 9)
    v = ix.Var("i", 8)
    i = ix.var(v)

    def loop(src, off):
        sin = loops.Op("sin", (loops.Load(src, off),), "f32")
        return loops.For(v, ix.ZERO, ix.const(8), [loops.Store(y, i, sin)])
    assert vmap.applies(loop(x, i + 1)) == "f32"
    assert vmap.applies(loop(y, i)) == "f32"          # in place, same element
    assert vmap.applies(loop(y, i + 1)) is None       # reads what the next vector writes


@pytest.mark.parametrize("dt", ["f32", "f64"])
@pytest.mark.parametrize("op", ["sin", "cos", "tan"])
@pytest.mark.parametrize("n", [1, 15, 16, 17, 33, 1000])
def test_map_matches_numpy(op, dt, n):
    x = (RNG.standard_normal(n) * 4).astype(NP[dt])
    x[::7] *= NP[dt](1e7)                       # |x| past 2^19: some vectors take the rare block
    if n > 3:
        x[1], x[2], x[3] = np.nan, np.inf, -0.0
    got = _map(op, n, dt).jit().run(x=x)[0]
    with np.errstate(invalid="ignore"):
        want = getattr(np, op)(x.astype(np.float64)).astype(NP[dt])
    bad = np.isnan(want)
    assert np.isnan(got[bad]).all()
    if n > 3:
        assert np.signbit(got[3]) == (op != "cos")
    np.testing.assert_allclose(got[~bad], want[~bad], rtol=TOL[dt] * 8, atol=TOL[dt])


def test_invariant_operand_and_threads():
    n = (1 << 18) + 13
    f = _map("sin", n, "f32", scaled=True)
    j = f.jit()
    x = (RNG.standard_normal(n) * 100).astype(np.float32)
    w = np.float32(-1.5)
    want = (np.sin(x.astype(np.float64)) * -1.5 + 0.5).astype(np.float32)
    for t in (1, 2):
        j.set_num_threads(t)
        np.testing.assert_allclose(j.run(x=x, w=w)[0], want, rtol=1e-6, atol=3e-7)


@pytest.mark.parametrize("dt", ["f32", "f64"])
@pytest.mark.parametrize("op", ["exp", "tanh", "gelu", "log1p", "erf", "sigmoid"])
@pytest.mark.parametrize("n", [1, 17, 33, 1000])
def test_chained_maps_match_numpy(op, dt, n):
    """Through the explicit vector loop and its scalar rest, NaN and infinities included."""
    import math
    x = (RNG.standard_normal(n) * 3).astype(NP[dt])
    if op == "log1p":
        x = np.abs(x)
    if n > 3:
        x[1], x[2], x[3] = np.nan, np.inf, -np.inf
    ref = {"exp": np.exp, "tanh": np.tanh, "log1p": np.log1p,
           "sigmoid": lambda v: 1 / (1 + np.exp(-v)),
           "erf": np.vectorize(math.erf, otypes=[np.float64]),
           "gelu": lambda v: np.where(np.isneginf(v), -0.0, 0.5 * v * (1 + np.vectorize(
               math.erf, otypes=[np.float64])(v / math.sqrt(2))))}[op]   # gelu(-inf) = -0
    got = _map(op, n, dt).jit().run(x=x)[0]
    with np.errstate(all="ignore"):
        want = ref(x.astype(np.float64))
    bad = np.isnan(want)
    assert np.isnan(got[bad]).all()
    np.testing.assert_allclose(got[~bad], want[~bad].astype(NP[dt]), rtol=TOL[dt] * 16,
                               atol=TOL[dt])

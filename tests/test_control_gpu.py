"""Control flow on the GPU backend (issue 16): a host-side loop of kernel launches
(lowering/gpu/regions.py, runtime/cuda_steps.py), run on the emulator (the real launch
plan and runtime, kernels on the CPU) against the interpreter, and PTX that ptxas
assembles for sm_90 (skipped without ptxas)."""
from __future__ import annotations

import numpy as np
import pytest

import rlxc
from rlxc import Func
from rlxc.lowering.gpu import driver as gpu_driver
from rlxc.lowering.gpu import nvptx
from rlxc.lowering.gpu.emu import emulate

from test_control_cpu import gru_build, gru_data, nested_build

RNG = np.random.default_rng(5)
PTXAS = nvptx.find_ptxas()


def _args(f, d):
    return [d[a.name] if a.name in d else f.param_binding(a.name) for a in f.signature()]


def _close(got, want, tol=1e-5):
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64),
                                   rtol=tol, atol=tol)


@pytest.mark.parametrize("p", [True, False])
def test_emulated_scan_while_if_match_the_interpreter(p):
    f = nested_build(fori=False)
    d = {"x": RNG.standard_normal((5, 4)).astype(np.float32),
         "w": RNG.standard_normal(4).astype(np.float32), "p": np.bool_(p)}
    _close(emulate(f.module, _args(f, d)), f.run_on("interp", **d))


@pytest.mark.slow
def test_emulated_gru_gradient_and_index_error():
    g = gru_build().init_randn(seed=3, stddev=0.4).value_and_grad(["wx", "wh", "wo"])
    d = gru_data()
    _close(emulate(g.module, _args(g, d)), g.run_on("interp", **d), 1e-4)

    def build(s):
        ids = s.input("ids", (3, 2), "i32")
        table = s.input("table", (4, 2))
        return rlxc.scan(lambda c, i: (c + table[i].sum(0), None), table[0], ids)[0]
    f = Func("emb", build)
    t = RNG.standard_normal((4, 2)).astype(np.float32)
    with pytest.raises(IndexError, match="index out of range"):
        emulate(f.module, [np.array([[0, 1], [2, 9], [1, 1]], np.int32), t])


@pytest.mark.skipif(PTXAS is None, reason="no ptxas found")
def test_ptx_of_a_scan_assembles_for_sm90():
    g = gru_build().value_and_grad(["wh"])
    art = gpu_driver.compile_cuda(g.module, ptxas=PTXAS)
    assert art.cubin is not None
    assert any(k.startswith("gru_scan") for k in art.kernels)


def test_empty_scan_no_carries_int_rows_zero_trip_while_cpu_and_emulated():
    def build(s):
        x = s.input("x", (0, 3))
        a = s.input("a", (3,))
        ids = s.input("ids", (4,), "i32")
        c, ys = rlxc.scan(lambda c, xt: (c + xt, c * xt), a, x)                 # length 0
        _, zs = rlxc.scan(lambda c, i: (c, (i * 2).cast("f32") + a), (), ids)  # no carry
        n = rlxc.while_loop(lambda v: v.sum() < -1e9, lambda v: v * 2.0, a)    # no trip
        return c, ys, zs, n
    f = Func("edge", build)
    d = {"x": np.zeros((0, 3), np.float32), "a": np.arange(3, dtype=np.float32),
         "ids": np.arange(4, dtype=np.int32)}
    want = f.run_on("interp", **d)
    assert [w.shape for w in want] == [(3,), (0, 3), (4, 3), (3,)]
    _close(f.run_on("cpu", **d), want)
    _close(emulate(f.module, _args(f, d)), want)


def test_emulated_scan_with_a_u32_key_capture():
    """A region operand of dtype u32 (an RNG key captured by a scan body) has a byte size
    on the GPU launch plan (one DTYPE_BYTES table for every backend; it lacked u32)."""
    def build(s):
        key = s.input("key", (2,), "u32")
        x = s.input("x", (3, 4))

        def body(c, row):
            noise = rlxc.random.uniform(key, (4,))
            return c + row * noise, c.sum()
        return rlxc.scan(body, s.constant(np.zeros(4, np.float32)), x)

    f = Func("keyscan", build)
    d = {"key": np.array([7, 9], np.uint32), "x": RNG.standard_normal((3, 4)).astype(np.float32)}
    _close(emulate(f.module, _args(f, d)), f.run_on("interp", **d))

"""Regression tests of the conv / batched-matmul speed work (issue 15, speed part):
constant gather indices are range-checked at compile time (no check kernel per call), a
conv2d is one GEMM over the whole batch with bias + activation in the sgemm epilogue, and
a (B, T, K) @ (K, N) matmul is one (B*T, K) @ (K, N) GEMM."""
import numpy as np
import pytest

import rlxc
from rlxc.lowering.cpu.driver import lower
from rlxc.lowering.cpu.loops import CheckKernel, MatmulKernel

rng = np.random.default_rng(15)


def _kinds(prog, cls):
    return [k for k in prog.kernels if isinstance(k, cls)]


def test_constant_gather_indices_checked_at_compile_time():
    """In-range constant indices (im2col) need no per-call check kernel; an input index does."""
    def build(s):
        x = s.input("x", (4, 3, 12, 12))
        h = x.conv2d(s.param("w", (5, 3, 3, 3)), s.param("b", (5,)), padding=1).relu()
        return h.reshape(4, 5 * 144).gather(s.input("i", (3,), "i32"), axis=1)
    prog = lower(rlxc.Func("cc", build).module)
    checks = _kinds(prog, CheckKernel)
    assert len(checks) == 1 and checks[0].buf.kind == "input"


def test_constant_gather_out_of_range_still_raises():
    """A constant index that is out of range keeps its runtime check (an IndexError, no crash)."""
    x = np.arange(6, dtype=np.float32)
    f = rlxc.Func("oob", lambda s: s.input("x", (6,)).gather(np.array([1, 7], np.int32)))
    assert len(_kinds(lower(f.module), CheckKernel)) == 1
    with pytest.raises(IndexError, match="out of range"):
        f.run(x=x)


def _conv_relu_two_uses(s):
    h = s.input("x", (4, 3, 12, 12)).conv2d(s.param("w", (5, 3, 3, 3)), s.param("b", (5,)),
                                             padding=1).relu()
    return h.max_pool2d(2), (h * h).sum()


def test_conv_bias_relu_is_the_gemm_epilogue():
    """bias + relu after a conv2d run in the sgemm epilogue: no pass over the conv output."""
    f = rlxc.Func("cbr", _conv_relu_two_uses)
    prog = lower(f.module)
    (mm,) = _kinds(prog, MatmulKernel)
    assert mm.epilogue is not None
    from rlxc.lowering.cpu.loops import format_expr
    text = format_expr(mm.epilogue)
    assert text == "relu(add(acc, %p1_b[i]))", text
    assert len(prog.kernels) == 4   # gather, sgemm(+epilogue), pool, sum of squares
    x = rng.standard_normal((4, 3, 12, 12)).astype(np.float32)
    w = rng.standard_normal((5, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    f = f.with_params({"w": w, "b": b})
    got = f.run(x=x)
    want = f.run_on("interp", x=x)
    for g_, w_ in zip(got, want):
        np.testing.assert_allclose(g_, w_, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("groups,scale", [(1, 2.0), (2, 2.0), (6, 0.5)])
def test_conv_epilogue_chain_matches_interpreter(groups, scale):
    """The replayed chain (bias, splat scale, relu; grouped/depthwise fall back) is exact."""
    def build(s):
        h = s.input("x", (2, 6, 9, 9)).conv2d(s.param("w", (6, 6 // groups, 3, 3)),
                                             s.param("b", (6,)), groups=groups)
        h = (h * scale).relu()
        return h.max_pool2d(2), h.sum()
    x = rng.standard_normal((2, 6, 9, 9)).astype(np.float32)
    P = {"w": rng.standard_normal((6, 6 // groups, 3, 3)).astype(np.float32),
         "b": rng.standard_normal(6).astype(np.float32)}
    f = rlxc.Func(f"chain{groups}", build).with_params(P)
    from rlxc.dialect.conv_decompose import decompose_conv
    from rlxc.dialect.interpreter import interpret
    vals = [x, P["w"], P["b"]]
    for u, v in zip(interpret(f.module, vals, np.float64),
                    interpret(decompose_conv(f.module), vals, np.float64)):
        np.testing.assert_allclose(u, v, rtol=1e-10, atol=1e-10)
    for u, v in zip(f.run(x=x), f.run_on("interp", x=x)):
        np.testing.assert_allclose(u, v, rtol=1e-4, atol=1e-4)

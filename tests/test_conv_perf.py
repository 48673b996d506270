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
    # pad + gather (im2col; one loop over the images, rowfuse.py), sgemm(+epilogue), pool,
    # sum of squares
    assert len(prog.kernels) == 4, [k.name for k in prog.kernels]
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


def _mm_case(build, feeds):
    f = rlxc.Func("mm3", build)
    prog = lower(f.module)
    got = f.run(**feeds)
    return prog, got


def test_batched_activation_times_weight_is_one_gemm():
    """(B, T, K) @ (K, N) + bias, relu: ONE sgemm of B*T rows with the epilogue fused."""
    x = rng.standard_normal((3, 5, 7)).astype(np.float32)
    w = rng.standard_normal((7, 4)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    prog, got = _mm_case(lambda s: (s.input("x", x.shape) @ s.input("w", w.shape)
                                    + s.input("b", b.shape)).relu(), {"x": x, "w": w, "b": b})
    (mm,) = _kinds(prog, MatmulKernel)
    assert (mm.batch, mm.m, mm.n, mm.k) == ([], 15, 4, 7) and mm.epilogue is not None
    np.testing.assert_allclose(got[0], np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["rowwise", "batch_bcast", "a_transposed", "w_batched"])
def test_batched_matmul_fold_only_when_rows_follow(case):
    """Folding needs A's rows batch-major and B shared; otherwise one GEMM per batch."""
    x = rng.standard_normal((2, 3, 5, 6)).astype(np.float32)
    w = rng.standard_normal((6, 4)).astype(np.float32)
    z = rng.standard_normal((2, 3, 5, 4)).astype(np.float32)
    zt = rng.standard_normal((5, 4)).astype(np.float32)
    wb = rng.standard_normal((2, 3, 6, 4)).astype(np.float32)
    builds = {
        "rowwise": (lambda s: s.input("x", x.shape) @ s.input("w", w.shape) * s.input("z", z.shape),
                    {"x": x, "w": w, "z": z}, x @ w * z, True),
        "batch_bcast": (lambda s: s.input("x", x.shape) @ s.input("w", w.shape) + s.input("z", zt.shape),
                        {"x": x, "w": w, "z": zt}, x @ w + zt, False),
        "a_transposed": (lambda s: s.input("x", x.shape).transpose((1, 0, 2, 3))
                         @ s.input("w", w.shape),
                         {"x": x, "w": w}, x.transpose(1, 0, 2, 3) @ w, False),
        "w_batched": (lambda s: s.input("x", x.shape) @ s.input("w", wb.shape),
                      {"x": x, "w": wb}, x @ wb, False),
    }
    build, feeds, want, folds = builds[case]
    prog, got = _mm_case(build, feeds)
    (mm,) = _kinds(prog, MatmulKernel)
    assert (mm.batch == [] and mm.m == 30) == folds
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5)

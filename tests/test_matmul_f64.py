"""float64 and integer matmul on the native CPU (issue 20 item 5).

The packed sgemm is float32 only; lowering/cpu/matvec.py rewrites every f64/i32/i64
matmul into one fused reduction over a broadcast product (never materialized: the
loop IR holds no M*K*N buffer).  Checked against NumPy float64 at rtol 1e-12, integers
exactly, plain / batched / broadcast-batched / transposed operands, and gradients.
"""
from __future__ import annotations

import numpy as np
import pytest

import rlxc
from rlxc.lowering.cpu.driver import emit_loops

rng = np.random.default_rng(64)


def _swap(t):
    r = len(t.shape)
    return t.transpose(*range(r - 2), r - 1, r - 2)


# label -> (A shape, B shape, B given transposed (as X.T))
SHAPES = {
    "plain": ((5, 7), (7, 3), False),
    "square": ((33, 33), (33, 33), False),
    "batched": ((2, 5, 7), (7, 4), False),
    "batched_both": ((3, 6, 9), (3, 9, 2), False),
    "broadcast_batch": ((2, 1, 5, 7), (3, 7, 4), False),
    "b_transposed": ((6, 7), (4, 7), True),
    "batched_b_transposed": ((3, 6, 7), (3, 4, 7), True),
    "vector": ((1, 7), (7, 5), False),
}


def _func(sa, sb, tb, dt):
    def build(s):
        a, b = s.input("a", sa, dt), s.input("b", sb, dt)
        return a @ (_swap(b) if tb else b)
    return rlxc.Func("mm_" + dt, build)


def _ref(A, B, tb):
    return A @ (np.swapaxes(B, -1, -2) if tb else B)


@pytest.mark.parametrize("label", list(SHAPES))
def test_f64_matmul_matches_numpy(label):
    sa, sb, tb = SHAPES[label]
    A, B = rng.standard_normal(sa), rng.standard_normal(sb)
    got = _func(sa, sb, tb, "f64").run_on("cpu", a=A, b=B)[0]
    want = _ref(A, B, tb)
    assert got.dtype == np.float64 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dt", ["i32", "i64"])
@pytest.mark.parametrize("label", ["plain", "broadcast_batch", "b_transposed"])
def test_integer_matmul_is_exact(label, dt):
    sa, sb, tb = SHAPES[label]
    npdt = np.int32 if dt == "i32" else np.int64
    A, B = rng.integers(-50, 50, sa).astype(npdt), rng.integers(-50, 50, sb).astype(npdt)
    got = _func(sa, sb, tb, dt).run_on("cpu", a=A, b=B)[0]
    want = _ref(A, B, tb)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def _sum_to(g, shape):
    """Sum a broadcast gradient back to `shape` (NumPy's broadcasting, undone)."""
    while g.ndim > len(shape):
        g = g.sum(0)
    for i, d in enumerate(shape):
        if d == 1 and g.shape[i] != 1:
            g = g.sum(i, keepdims=True)
    return g


@pytest.mark.parametrize("label", ["plain", "batched_both", "broadcast_batch", "b_transposed"])
def test_f64_matmul_gradients(label):
    """d sum((A @ B) * W) / dA = W @ B^T and / dB = A^T @ W (summed over broadcast batch)."""
    sa, sb, tb = SHAPES[label]
    A, B = rng.standard_normal(sa), rng.standard_normal(sb)
    Bm = np.swapaxes(B, -1, -2) if tb else B
    W = rng.standard_normal(np.broadcast_shapes(A.shape[:-2], Bm.shape[:-2])
                            + (A.shape[-2], Bm.shape[-1]))

    def build(s):
        a, b = s.input("a", sa, "f64"), s.input("b", sb, "f64")
        return ((a @ (_swap(b) if tb else b)) * s.constant(W, "f64")).sum()
    loss, da, db = rlxc.Func("mmg", build).value_and_grad(["a", "b"]).run_on("cpu", a=A, b=B)
    gA = _sum_to(W @ np.swapaxes(Bm, -1, -2), A.shape)
    gBm = _sum_to(np.swapaxes(A, -1, -2) @ W, Bm.shape)
    gB = np.swapaxes(gBm, -1, -2) if tb else gBm
    np.testing.assert_allclose(loss, np.sum(_ref(A, B, tb) * W), rtol=1e-12)
    np.testing.assert_allclose(da, gA, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(db, gB, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("tb", [False, True])
def test_f64_matmul_is_one_fused_reduction(tb):
    """No M*K*N product buffer: the multiply lives inside the reduction's loop nest."""
    M, K, N = 24, 40, 56
    f = _func((M, K), (N, K) if tb else (K, N), tb, "f64")
    text = emit_loops(f.module)
    assert f"[{M * K * N}]" not in text, text
    kernels = [ln for ln in text.splitlines() if ln.startswith("kernel ")]
    assert len(kernels) == 1 and "reduce" in kernels[0], text
    assert "mul(" in text


def test_f32_matmul_still_uses_sgemm():
    text = emit_loops(_func((24, 40), (40, 56), False, "f32").module)
    assert "sgemm(M=24, N=56, K=40" in text and "reduce" not in text, text

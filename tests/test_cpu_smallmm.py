"""Degenerate matmuls (K == 1, M == 1, N == 1) lowered as loops (lowering/cpu/matvec.py)."""
import numpy as np
import pytest

from rlxc import Func
from rlxc.lowering.cpu.driver import emit_loops

CASES = [  # (a shape, b shape, transpose a, transpose b)
    ((5, 1), (1, 7), False, False),            # outer product
    ((3, 5, 1), (3, 1, 7), False, False),      # batched outer products (vmap'd x^T @ delta)
    ((2, 1, 5, 1), (3, 1, 7), False, False),   # broadcast batch dims
    ((6, 9), (9, 1), False, False),            # A @ x (dot per row)
    ((9, 6), (9, 1), True, False),             # A.T @ x (axpy over rows of A)
    ((1, 9), (9, 6), False, False),            # x @ B
    ((1, 9), (6, 9), False, True),             # x @ B.T
    ((4, 1, 9), (9, 6), False, False),         # batched x @ B, B shared
    ((4, 6, 9), (4, 9, 1), False, False),      # batched A @ x
    ((4, 9, 6), (4, 9, 1), True, False),       # batched A.T @ x
    ((1, 9), (9, 1), False, False),            # dot product
    ((1, 5000), (5000, 3), False, False),      # long K (blocked f64 partial sums)
    ((1, 33), (33, 300), False, False),        # x @ B, 300 columns: blocks of 128 + rest
    ((4, 1, 33), (33, 256), False, False),     # batched x @ B, blocks of 128
    ((40, 259), (40, 1), True, False),         # A.T @ x, 259 rows: blocks of 128 + rest
]


@pytest.mark.parametrize("sa,sb,ta,tb", CASES)
def test_small_matmul_matches_numpy(sa, sb, ta, tb):
    rng = np.random.default_rng(0)
    a = rng.standard_normal(sa).astype(np.float32)
    b = rng.standard_normal(sb).astype(np.float32)

    def build(s):
        x, y = s.input("a", sa), s.input("b", sb)
        if ta:
            x = x.transpose(tuple(range(len(sa) - 2)) + (len(sa) - 1, len(sa) - 2))
        if tb:
            y = y.transpose(tuple(range(len(sb) - 2)) + (len(sb) - 1, len(sb) - 2))
        return (x @ y).tanh()
    f = Func("smm", build)
    assert "sgemm" not in emit_loops(f.module)
    av = np.swapaxes(a, -1, -2) if ta else a
    bv = np.swapaxes(b, -1, -2) if tb else b
    want = np.tanh(av.astype(np.float64) @ bv.astype(np.float64))
    got = f.run(a=a, b=b)[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_per_example_grad_has_no_sgemm_per_example():
    """vmap(grad) of a linear layer: the weight gradient is one fused outer-product map."""
    def build(s):
        x = s.input("x", (1, 8))
        return (x @ s.param("w", (8, 4))).tanh().sum()
    f = Func("pe", build).with_param("w", np.ones((8, 4), np.float32) * 0.1)
    g = f.grad(["w"]).vmap(["x"], 16)
    text = emit_loops(g.module)
    assert "K=1," not in text  # the forward (16, 8) @ (8, 4) stays one sgemm
    x = np.random.default_rng(1).standard_normal((16, 1, 8)).astype(np.float32)
    got = g.run(x=x)[0]
    want = np.stack([f.grad(["w"]).run_on("interp", x=xi)[0] for xi in x])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_column_blocked_reductions():
    """Buffer-mode reductions over a long kept-inner dim run in column blocks."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, 300)).astype(np.float32)
    y = rng.standard_normal((3, 7, 1000)).astype(np.float32)

    def build(s):
        a, b = s.input("x", x.shape), s.input("y", y.shape)
        return a.sum(0), a.max(0), b.mean(1), (a * a).sum(0, keepdims=True)
    f = Func("colred", build)
    assert "_blk" in emit_loops(f.module)
    got = f.run(x=x, y=y)
    want = [x.sum(0), x.max(0), y.mean(1), (x * x).sum(0, keepdims=True)]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)

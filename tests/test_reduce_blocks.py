"""Register blocking of reductions (lowering/cpu/reduce.py): a buffer-mode reduction's
column blocks are QBLOCK_VECTORS vector registers of the target in all (also when the
merged matrix-vector products of an HVP add a kept dim before the columns), and a
scalar reduction over rows computes several rows at once (unroll and jam).  Checked on
the loop IR and against NumPy, NaN included."""
import re

import numpy as np
import pytest

from rlxc import Func
from rlxc.lowering.cpu.driver import emit_loops


def _kernel(text: str, marker: str) -> str:
    for k in text.split("\nkernel ")[1:]:
        if marker in k:
            return k
    raise AssertionError(f"no kernel with {marker!r} in\n{text}")


def _hvp(n=256):
    W = (np.random.default_rng(3).standard_normal((n, n)) / np.sqrt(n)).astype(np.float32)
    f = Func("rb_hvp", lambda s: (s.param("W", (n, n)) @ s.input("x", (n,))).tanh().sum())
    return W, f.with_param("W", W).hvp(["x"])


@pytest.mark.parametrize("cpu,width", [("native", None), ("znver3", 32), ("skylake-avx512", 64)])
def test_merged_transposed_matvecs_are_column_blocked(cpu, width):
    _, h = _hvp()
    text = emit_loops(h.module, cpu=cpu)
    # W.T @ [g, h]: out[n, m] += W[k, m] * g[k, n] over k, 2 x 256 outputs
    k = _kernel(text, "for i0 in [0, 256):\n      for i1 in [0, 2):\n        for i2 in [i2_blk")
    m = re.search(r"for i2 in \[i2_blk\*(\d+), i2_blk\*\d+ \+ (\d+)\)", k)
    assert m and m.group(1) == m.group(2)
    if width is not None:   # 8 registers for 2 vectors of outputs
        assert int(m.group(1)) == width


def test_hvp_numerics_after_blocking():
    W, h = _hvp()
    rng = np.random.default_rng(4)
    x, v = rng.standard_normal((2, 256)).astype(np.float32)
    outs = h.jit().run(x, v)
    t = np.tanh(W.astype(np.float64) @ x)
    s = 1 - t * t
    np.testing.assert_allclose(outs[1], W.T.astype(np.float64) @ s, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(outs[-1], W.T.astype(np.float64) @ (-2 * t * s * (W @ v)),
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cpu,width", [("native", None), ("znver3", 64)])
def test_vector_matrix_blocks_fit_registers(cpu, width):
    # one thread's worth of work (a parallel one, 784 x 512, is split over its rows:
    # tests/test_reduce_rowsplit.py)
    f = Func("rb_xw", lambda s: s.input("x", (1, 256)) @ s.param("w", (256, 512)))
    text = emit_loops(f.module, cpu=cpu)
    m = re.search(r"for i1 in \[i1_blk\*(\d+), ", text)
    assert m, text
    if width is not None:
        assert int(m.group(1)) == width


def test_row_reductions_are_jammed():
    f = Func("rb_mv", lambda s: s.param("w", (512, 256)) @ s.input("x", (256,)))
    k = _kernel(emit_loops(f.module), "rlx.sum")
    assert "i0_jam in [0, 128)" in k and "acc4" in k


@pytest.mark.parametrize("rows", [1, 3, 6, 8, 12])
@pytest.mark.parametrize("op", ["sum", "max", "min", "mean"])
def test_jammed_row_reductions_match_numpy_and_keep_nan(rows, op):
    rng = np.random.default_rng(rows)
    a = rng.standard_normal((rows, 96)).astype(np.float32)
    if rows > 2:
        a[2, 17] = np.nan
    f = Func(f"rb_{op}{rows}", lambda s: getattr(s.input("a", (rows, 96)) * 2.0, op)(axes=(1,)))
    got = f.jit().run(a)[0]
    want = getattr(np, op)(a.astype(np.float64) * 2.0, axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    if rows > 2:
        assert np.isnan(got[2]) and not np.isnan(np.delete(got, 2)).any()


def test_jam_keeps_a_parallel_outer_loop_wide():
    # 8 long rows, enough work to fork: jamming 4 rows would leave 2 parallel iterations
    f = Func("rb_par", lambda s: (s.input("a", (8, 32768)) * 1.5 + 0.5).max(axes=(1,)))
    k = _kernel(emit_loops(f.module), "rlx.max")
    assert "parallel for i0 in [0, 8)" in k and "_jam" not in k
    a = np.random.default_rng(0).standard_normal((8, 32768)).astype(np.float32)
    np.testing.assert_allclose(f.jit().run(a)[0], (1.5 * a + 0.5).max(1), rtol=1e-6)


def test_avx2_hvp_keeps_its_accumulators_in_registers():
    """AVX2 has 16 ymm: 128-column blocks (16 accumulators) and the unblocked 2 x 256
    outputs of the merged W.T @ [g, h] spilled (~360 stack moves in the HVP); the
    8-register blocks spill none."""
    from rlxc.lowering.cpu.driver import emit_asm

    _, h = _hvp()
    asm = emit_asm(h.module, cpu="znver3")
    spills = re.findall(r"vmov[ua]ps\s+(?:%ymm\d+,\s*-?\w*\(%rsp\)|-?\w*\(%rsp\),\s*%ymm)", asm)
    assert not spills, spills[:4]

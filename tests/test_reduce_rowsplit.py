"""Parallel buffer-mode reductions split over their rows (lowering/cpu/reduce.py
_buffer_split): x @ W at batch 1 and column sums of a large matrix run as
`parallel for c: part[c, :] = sum over rows of chunk c`, then a combine of the
partial rows.  Checked against NumPy, including a ragged last chunk and mean/max."""
import numpy as np
import pytest

from rlxc import Func
from rlxc.lowering.cpu import reduce as R
from rlxc.lowering.cpu.driver import emit_loops


def _mlp1(sizes=(784, 512, 512, 10)):
    def build(s):
        h = s.input("x", (1, sizes[0]))
        for i in range(len(sizes) - 1):
            h = h.linear(s.param(f"w{i}", (sizes[i], sizes[i + 1])),
                         s.param(f"b{i}", (sizes[i + 1],)))
            if i < len(sizes) - 2:
                h = h.relu()
        return h
    return Func("rowsplit_mlp1", build)


@pytest.mark.parametrize("cpu", ["native", "x86-64-v3"])
def test_batch1_matvec_layers_split_over_rows(cpu):
    text = emit_loops(_mlp1().module, "rowsplit_mlp1", cpu)
    rows = [ln for ln in text.splitlines() if ln.startswith("kernel") and "reduce_rows" in ln]
    assert len(rows) == 2, text            # the 784x512 and 512x512 layers
    assert "row chunks" in rows[0] and "parallel for c" in text
    # the 512x10 layer is too small to run in parallel: one plain reduction
    assert "reduce_combine" in text


def test_batch1_mlp_matches_numpy():
    rng = np.random.default_rng(3)
    sizes = (784, 512, 512, 10)
    P = {}
    for i in range(3):
        P[f"w{i}"] = (rng.standard_normal((sizes[i], sizes[i + 1])) /
                      np.sqrt(sizes[i])).astype(np.float32)
        P[f"b{i}"] = (0.1 * rng.standard_normal(sizes[i + 1])).astype(np.float32)
    x = rng.standard_normal((1, 784)).astype(np.float32)
    got = _mlp1().with_params(P).jit().run(x)[0]
    h = x
    for i in range(3):
        h = h.astype(np.float64) @ P[f"w{i}"] + P[f"b{i}"]
        if i < 2:
            h = np.maximum(h, 0)
    np.testing.assert_allclose(got, h, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("kind", ["sum", "mean", "max"])
def test_column_reduction_chunks(kind):
    """1004 rows (4 chunks of 251) x 600 columns: above the parallel threshold, so the
    rows are split; every kind's combine and mean's division."""
    n, m = 1004, 600
    f = Func(f"rowsplit_{kind}", lambda s: getattr(s.input("a", (n, m)), kind)(axes=(0,)))
    text = emit_loops(f.module, f"rowsplit_{kind}", "native")
    assert "reduce_rows" in text and "c*251 + 251" in text, text
    a = np.random.default_rng(5).standard_normal((n, m)).astype(np.float32)
    got = f.jit().run(a)[0]
    want = getattr(a.astype(np.float64), kind)(axis=0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_uneven_rows_keep_column_blocks():
    """1003 rows: no equal chunks, so no split (chunk bounds must stay linear in the
    row count for size-generic programs); the result is still right."""
    n, m = 1003, 600
    f = Func("rowsplit_odd", lambda s: s.input("a", (n, m)).sum(axes=(0,)))
    assert "reduce_rows" not in emit_loops(f.module, "rowsplit_odd", "native")
    a = np.random.default_rng(6).standard_normal((n, m)).astype(np.float32)
    np.testing.assert_allclose(f.jit().run(a)[0], a.astype(np.float64).sum(0),
                               rtol=1e-5, atol=1e-4)


def test_dynamic_batch_sum_is_one_program():
    """A sum over a dynamic batch B (a bias gradient) above the parallel threshold still
    lowers to ONE size-generic program (a ragged row split would not: ceil(B/4))."""
    from rlxc.lowering.cpu import dynsizes

    f = Func("rowsplit_dyn", lambda s: (s.input("x", ("B", 512)) * 2.0 + 1.0).relu().sum(0))
    prog = dynsizes.lower_dynamic(f.module, dynsizes.module_symbols(f.module),
                                  "rowsplit_dyn", "native")
    assert prog.dims == ["B"]


def test_row_split_off_restores_column_blocks(monkeypatch):
    monkeypatch.setattr(R, "ROW_SPLIT_CHUNKS", 0)
    text = emit_loops(_mlp1().module, "rowsplit_mlp1", "native")
    assert "reduce_rows" not in text

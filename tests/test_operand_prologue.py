"""The operand-prologue pass (lowering/cpu/operand_prologue.py): a conv's im2col, when
larger than the L2, is gathered per image right before each image's GEMM.

    structure  a LeNet-style train step (value_and_grad): the im2col gathers are gone,
               both the forward GEMM and the filter-gradient GEMM carry a prologue
               writing their own slice, and the workspace shrinks; under the L2 (the
               real one, at this small size) nothing changes
    numerics   the same step against the interpreter (float64) on 1, 2 and 3 threads of
               a library compiled for 3 (the batch team: one slice per thread), at an
               odd batch (a team's ranges of unequal length)
    dynamic    a symbolic batch (its library, whichever it is) against the interpreter
"""
from __future__ import annotations

import numpy as np
import pytest

import rlxc
from rlxc.lowering.cpu import operand_prologue as op_pro
from rlxc.lowering.cpu.driver import lower
from rlxc.lowering.cpu.loops import LoopKernel, MatmulKernel, format_program

SMALL_L2 = 24 << 10   # bytes: the im2col buffers (148 and 50 KB at N = 7; slices of 21 and
#                      7 KB) are "larger than the L2"
N = 7


def _net(n):
    def build(s):
        h = s.input("x", (n, 3, 16, 16)).conv2d(s.param("c1w", (8, 3, 3, 3)),
                                                 s.param("c1b", (8,))).relu().max_pool2d(2)
        h = h.conv2d(s.param("c2w", (5, 8, 3, 3)), s.param("c2b", (5,))).relu()
        return (h * h).mean()
    return build


def _params(seed=3):
    rng = np.random.default_rng(seed)
    return {"c1w": (rng.standard_normal((8, 3, 3, 3)) / 5).astype(np.float32),
            "c1b": rng.standard_normal(8).astype(np.float32) / 10,
            "c2w": (rng.standard_normal((5, 8, 3, 3)) / 8).astype(np.float32),
            "c2b": rng.standard_normal(5).astype(np.float32) / 10}


def _step(n=N):
    return rlxc.Func(f"opro{n}", _net(n)).with_params(_params()).value_and_grad_all()


@pytest.fixture
def small_l2(monkeypatch):
    import rlxc.backends as backends

    monkeypatch.setattr(op_pro, "_l2", lambda cpu: SMALL_L2)
    monkeypatch.setattr(backends, "_libs", {})


def _gathers(prog):
    return [k for k in prog.kernels if isinstance(k, LoopKernel) and "gather" in k.what]


def test_structure(small_l2, monkeypatch):
    f = _step()
    prog = lower(f.module, "opro", max_threads=3)
    text = format_program(prog)
    mms = [k for k in prog.kernels if isinstance(k, MatmulKernel) and k.prologue]
    assert not _gathers(prog), text
    # conv1 and conv2: forward GEMM + filter-gradient GEMM each
    assert len(mms) == 4, text
    for k in mms:
        assert k.slice_floats * 4 <= SMALL_L2
        slices = {st.buf.name for st in op_pro_stores(k)}
        assert len(slices) == 1 and (k.a.buf.name in slices or k.b.buf.name in slices)
        assert "prologue:" in text
    # the full-batch buffers are gone: a smaller workspace than without the pass
    monkeypatch.setattr(op_pro, "_l2", lambda cpu: 1 << 40)
    plain = lower(f.module, "opro", max_threads=3)
    assert _gathers(plain) and not any(getattr(k, "prologue", None) for k in plain.kernels)
    assert prog.workspace_size < plain.workspace_size


def op_pro_stores(k):
    from rlxc.lowering.cpu.loops import Store, walk

    return [s for s in walk(k.prologue) if isinstance(s, Store)]


def test_not_taken_under_the_l2():
    prog = lower(_step().module, "opro", max_threads=2)
    assert _gathers(prog) and not any(getattr(k, "prologue", None) for k in prog.kernels)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_numerics_against_interpreter(small_l2, monkeypatch, threads):
    monkeypatch.setenv("RLXC_MAX_THREADS", "3")
    monkeypatch.setenv("RLXC_ADAPTIVE_THREADS", "0")
    monkeypatch.setenv("RLXC_NUM_THREADS", str(threads))
    f = _step()
    x = np.random.default_rng(threads).standard_normal((N, 3, 16, 16)).astype(np.float32)
    got = f.run(x=x)
    want = f.run_on("interp", x=x)
    assert len(got) == len(want) == 5
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("n", [3, N])
def test_dynamic_batch(small_l2, n):
    """A symbolic batch: whichever library serves it (size-generic, or specialized to the
    call's batch, where the pass runs) agrees with the interpreter."""
    f = rlxc.Func("oprodyn", _net("N")).with_params(_params()).value_and_grad_all()
    x = np.random.default_rng(n).standard_normal((n, 3, 16, 16)).astype(np.float32)
    for g, w in zip(f.run(x=x), f.run_on("interp", x=x)):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5)

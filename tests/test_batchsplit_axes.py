"""Batch split with the batch axis at any position (lowering/cpu/batchsplit.py rules).

The rules track the batch axis of every value: a transpose moves it, a reshape keeps it
when the dims before and after it keep their products, a batched matmul keeps it, a
reduction over other axes keeps it.  Checked: graphs that move the batch axis away
from axis 0 and back are separable (and the compiled split equals the unsplit call);
graphs where an axis-moving op mixes rows are refused with the reason; the ONNX
transformer encoder layer (its QKV reshape/transpose puts the batch on axis 1) splits
and matches onnxruntime's outputs and the unsplit library.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

import rlxc
from rlxc.lowering.cpu import batchsplit

from test_batchsplit import _func, _inputs, _split_vs_unsplit, threads3  # noqa: F401

HERE = os.path.dirname(os.path.abspath(__file__))
ENCODER = os.path.join(HERE, "fixtures", "onnx", "encoder.onnx")


# ---------------------------------------------------------------- graphs

def _heads(s):
    """(N, 6, 8) -> (N, 6, 2, 4) -> (2, N, 6, 4): the batch on axis 1, a per-head
    product, then back to (N, 6, 8)."""
    x = s.input("x", ("N", 6, 8))
    h = (x @ s.param("w", (8, 8))).reshape("N", 6, 2, 4).transpose(2, 0, 1, 3)
    a = (h @ h.transpose(0, 1, 3, 2)).softmax(-1) @ h            # (2, N, 6, 4)
    return a.transpose(1, 2, 0, 3).reshape("N", 6, 8).tanh()


def _moved_and_reduced(s):
    """The batch on axis 1 of a (4, N, 8), reduced over axis 0 (not the batch)."""
    x = s.input("x", ("N", 4, 8))
    return (x.transpose(1, 0, 2) * s.param("g", (4, 1, 8))).sum(0)   # (4, N, 8) -> (N, 8)


def _reduced_after_move(s):
    """The batch on axis 1 of a (4, N, 8), reduced over axis 2, moved back."""
    x = s.input("x", ("N", 4, 8))
    return x.transpose(1, 0, 2).exp().max(2).transpose(1, 0)


def _reshape_mixes(s):
    """(N, 2, 6) -> (2, N, 6) -> (N, 2, 6) by reshape: rows change places."""
    x = s.input("x", ("N", 2, 6))
    return x.transpose(1, 0, 2).reshape("N", 2, 6) + 1.0


def _contracts_moved(s):
    """The batch moved to axis 1 and contracted by a matmul: a Gram matrix over rows."""
    x = s.input("x", ("N", 3))
    return (x.transpose(1, 0) @ x).sum(1)


def _reduces_moved(s):
    x = s.input("x", ("N", 3, 4))
    return x.transpose(2, 0, 1).sum(1)                            # over the batch at axis 1


def _output_moved(s):
    return s.input("x", ("N", 3)).transpose(1, 0).exp()


MOVING = {"heads": _heads, "moved_and_reduced": _moved_and_reduced,
          "reduced_after_move": _reduced_after_move}
REFUSED = {
    "reshape after transpose mixes rows": (_reshape_mixes, "does not keep the batch axis whole"),
    "matmul contracts the moved batch axis": (_contracts_moved, "contracts the batch axis"),
    "sum over the moved batch axis": (_reduces_moved, "reduces the batch axis N away"),
    "output with the batch on axis 1": (_output_moved, "off axis 0"),
}


@pytest.mark.parametrize("name", list(MOVING))
def test_batch_axis_moved_and_back_is_separable(name):
    d = batchsplit.decide(_func(MOVING[name], name).module)
    assert d.symbol == "N", d.reason
    assert 1 in d.axes.values() or 2 in d.axes.values(), d.axes   # it did move


@pytest.mark.parametrize("kind", list(REFUSED))
def test_axis_moving_ops_that_mix_rows_are_refused(kind):
    fn, why = REFUSED[kind]
    d = batchsplit.decide(_func(fn, "mix").module)
    assert d.symbol is None and why in d.reason, d.reason


@pytest.mark.parametrize("name", list(MOVING))
def test_moved_axis_split_matches_unsplit(threads3, name):
    f = _func(MOVING[name], name)
    j = _split_vs_unsplit(f, exact=False)
    x = _inputs(f, 65)
    for g, w in zip(j.run(**x), f.run_on("interp", **x)):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5)


def test_onnx_encoder_is_separable_with_batch_on_axis_1():
    pytest.importorskip("onnx")
    d = batchsplit.decide(rlxc.from_onnx(ENCODER).module)
    assert d.symbol == "batch" and d.inputs == [(6, 32)] and d.outputs == [(6, 32)], d
    assert 1 in d.axes.values(), "the QKV split's (3, batch, 4, 6, 8) has it on axis 1"


def test_onnx_encoder_split_matches_unsplit_and_onnxruntime(threads3):
    pytest.importorskip("onnx")
    from rlxc.dynone import fallback_reason

    f = rlxc.from_onnx(ENCODER)
    j = _split_vs_unsplit(f, exact=False)
    assert fallback_reason(f) is None
    ref = np.load(os.path.join(HERE, "fixtures", "onnx", "encoder_ref.npz"))
    for b in ("b2", "b5"):   # torch's outputs, exported beside the model
        out = j.run(x=ref[f"{b}/x"].astype(np.float32))[0]
        np.testing.assert_allclose(out, ref[f"{b}/y"], rtol=1e-4, atol=1e-5)
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(ENCODER, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(7).normal(size=(64, 6, 32)).astype(np.float32)
    j._one.lib.set_batch_split(0)
    got = j.run(x=x)[0]
    assert j._one.lib.last_split() == 3
    np.testing.assert_allclose(got, sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)

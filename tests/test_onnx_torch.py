"""Models exported by torch.onnx.export, imported with rlxc.from_onnx, run and fine-tuned.

Two sources: the committed exports in tests/fixtures/onnx/ (written by
scripts/export_onnx_fixtures.py with PyTorch's outputs and autograd gradients, so
these checks run without torch), and fresh exports at test time when torch is
installed (skipped otherwise). Checked: outputs against PyTorch and onnxruntime at
two batch sizes of the dynamic batch axis, and the gradients of the cross-entropy
loss from `from_onnx(...).value_and_grad_all()` against PyTorch's autograd.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

import rlxc  # noqa: E402
from rlxc.onnx_import import with_loss  # noqa: E402

from onnx_torch_models import input_shape  # noqa: E402

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "onnx")
MODELS = ("mlp", "cnn", "encoder")


def _grad_check(path, name, ref, batch, device):
    f = rlxc.from_onnx(path, input_shapes={"x": input_shape(name, batch)})
    vg = with_loss(f, "cross_entropy").value_and_grad_all()
    loss, *grads = vg.run_on(device, x=ref["x"], labels=ref["labels"])
    np.testing.assert_allclose(float(loss), float(ref["loss"]), rtol=1e-4)
    checked = 0
    for pname, g in zip(f.param_names(), grads):
        if "grad:" + pname in ref:
            np.testing.assert_allclose(g, ref["grad:" + pname], rtol=1e-3, atol=1e-5,
                                       err_msg=pname)
            checked += 1
    torch_params = [k for k in ref if k.startswith("grad:")]
    assert checked == len(torch_params), (f.param_names(), torch_params)


@pytest.mark.parametrize("name", MODELS)
def test_committed_export_matches_pytorch_at_two_batch_sizes(name):
    path = os.path.join(FIX, f"{name}.onnx")
    refs = np.load(os.path.join(FIX, f"{name}_ref.npz"))
    for batch, device in ((2, "cpu"), (5, "interp")):
        f = rlxc.from_onnx(path, input_shapes={"x": input_shape(name, batch)})
        y = f.run_on(device, x=refs[f"b{batch}/x"])[0]
        np.testing.assert_allclose(y, refs[f"b{batch}/y"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_committed_export_gradients_match_pytorch_autograd(name):
    """The fine-tuning gradients (cross-entropy, every param: for the CNN the convs,
    the batchnorm scales/shifts and the linear) against PyTorch's autograd, stored in
    the fixture: batch 5 compiled for the CPU, batch 2 in the reference interpreter."""
    path = os.path.join(FIX, f"{name}.onnx")
    refs = np.load(os.path.join(FIX, f"{name}_ref.npz"))
    for batch, device in ((5, "cpu"), (2, "interp")):
        ref = {k.split("/", 1)[1]: refs[k] for k in refs if k.startswith(f"b{batch}/")}
        assert any(k.startswith("grad:") for k in ref), f"{name}_ref.npz has no gradients"
        _grad_check(path, name, ref, batch, device)


def test_committed_export_matches_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    path = os.path.join(FIX, "encoder.onnx")
    x = np.random.default_rng(9).normal(size=input_shape("encoder", 3)).astype(np.float32)
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    f = rlxc.from_onnx(path, input_shapes={"x": x.shape})
    np.testing.assert_allclose(f.run_on("interp", x=x)[0], want[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", MODELS)
def test_fresh_torch_export(name, tmp_path):
    pytest.importorskip("torch", reason="torch is an optional test dependency")
    from onnx_torch_models import export, reference

    path = export(name, tmp_path / f"{name}.onnx")
    for batch in (1, 4):
        ref = reference(name, batch, seed=batch + 10)
        f = rlxc.from_onnx(path, input_shapes={"x": input_shape(name, batch)})
        np.testing.assert_allclose(f.run_on("interp", x=ref["x"])[0], ref["y"], rtol=1e-4,
                                   atol=1e-5)
        if "labels" in ref:
            _grad_check(path, name, ref, batch, "interp")

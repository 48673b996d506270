"""`rlxc compile model.onnx`: an ONNX model as SRC, like path/model.py:factory.

Builds a small MLP with onnx.helper (dynamic batch axis), compiles it with
--input-shape, --loss cross_entropy and --train, loads the artifact with the rlxc
runtime, checks its outputs against onnxruntime and that its C train step lowers
the loss; and the usage errors of the ONNX-only options.
"""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from click.testing import CliRunner  # noqa: E402
from onnx import TensorProto as TP  # noqa: E402
from onnx import helper as h  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402

from rlxc.cli.main import main  # noqa: E402


@pytest.fixture(scope="module")
def mlp_onnx(tmp_path_factory):
    rng = np.random.default_rng(0)
    g = h.make_graph(
        [h.make_node("Gemm", ["x", "fc1.weight", "fc1.bias"], ["h"], transB=1),
         h.make_node("Relu", ["h"], ["r"]),
         h.make_node("Gemm", ["r", "fc2.weight", "fc2.bias"], ["logits"], transB=1)], "mlp",
        [h.make_tensor_value_info("x", TP.FLOAT, ("batch", 4))],
        [h.make_tensor_value_info("logits", TP.FLOAT, ("batch", 3))],
        [nh.from_array(rng.normal(size=(16, 4)).astype(np.float32) * .5, "fc1.weight"),
         nh.from_array(rng.normal(size=16).astype(np.float32) * .1, "fc1.bias"),
         nh.from_array(rng.normal(size=(3, 16)).astype(np.float32) * .5, "fc2.weight"),
         nh.from_array(np.zeros(3, np.float32), "fc2.bias")])
    p = tmp_path_factory.mktemp("onnx") / "digits-mlp.onnx"   # graph "mlp"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), str(p))
    return p


def cli(*args):
    return CliRunner().invoke(main, ["compile", *[str(a) for a in args]])


def test_compile_onnx_with_train_and_loss(mlp_onnx, tmp_path):
    from rlxc.runtime import load

    out = tmp_path / "out"
    r = cli(mlp_onnx, "--input-shape", "x=8,4", "--loss", "cross_entropy", "--train",
            "--optimizer", "sgd", "--lr", "0.5", "-o", out)
    assert r.exit_code == 0, r.output
    assert "libdigits_mlp.so" in r.output   # named after the file, not the graph
    m = load(out)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(8, 4)).astype(np.float32)
    y = (np.arange(8) % 3).astype(np.int32)
    ref = ort.InferenceSession(str(mlp_onnx)).run(None, {"x": x})[0]
    loss0, logits = m.run(x=x, labels=y)
    np.testing.assert_allclose(logits, ref, rtol=1e-4, atol=1e-5)
    z = ref - ref.max(-1, keepdims=True)
    ce = -(z - np.log(np.exp(z).sum(-1, keepdims=True)))[np.arange(8), y].mean()
    np.testing.assert_allclose(float(loss0), ce, rtol=1e-4)
    losses = [float(m.train_step(x=x, labels=y)) for _ in range(20)]
    assert losses[0] == pytest.approx(float(loss0), rel=1e-5)
    assert losses[-1] < 0.5 * losses[0]


def test_compile_onnx_emit_rlx_and_errors(mlp_onnx, tmp_path):
    r = cli(mlp_onnx, "--input-shape", "x=2,4", "--emit", "rlx")
    assert r.exit_code == 0, r.output
    assert 'rlx.name = "fc1.weight"' in r.output and "tensor<2x4xf32>" in r.output
    r = cli(mlp_onnx, "--emit", "rlx")    # dim_param -> a symbol, kept in the IR
    assert r.exit_code == 0 and "tensor<?x4xf32" in r.output, r.output
    r = cli(mlp_onnx, "--emit", "llvm")   # one size's code: needs the size
    assert r.exit_code == 1 and "dynamic dimensions ['batch']" in r.output and \
        "--sizes batch=SIZE" in r.output
    r = cli(mlp_onnx, "--input-shape", "x=2,4", "--train", "-o", tmp_path / "o")
    assert r.exit_code == 2 and "--loss mse|cross_entropy" in r.output
    r = cli(mlp_onnx, "--input-shape", "x=two", "--emit", "rlx")
    assert r.exit_code == 2 and "NAME=D0,D1" in r.output
    r = cli(mlp_onnx, "--input-shape", "x=2,4", "--loss", "hinge", "--emit", "rlx")
    assert r.exit_code == 2 and "hinge" in r.output
    py = tmp_path / "m.py"
    py.write_text("def f():\n    pass\n")
    r = cli(f"{py}:f", "--loss", "mse", "--emit", "rlx")
    assert r.exit_code == 2 and "apply to a .onnx SRC only" in r.output


@pytest.mark.slow
def test_finetune_onnx_example(tmp_path):
    """examples/finetune_onnx.py end to end: fine-tunes the exported CNN (conv, batchnorm,
    max pool) on digits (test accuracy from chance to > 0.9) and its .so gives the
    fine-tuned accuracy (~17 s, hence slow)."""
    import os
    import subprocess
    import sys

    pytest.importorskip("sklearn")
    ex = os.path.join(os.path.dirname(__file__), "..", "examples", "finetune_onnx.py")
    p = subprocess.run([sys.executable, ex, "--out", str(tmp_path)], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "cnn.onnx: params 0.weight" in p.stdout, p.stdout
    assert "fine-tuned" in p.stdout and (tmp_path / "lib" / "libdigits_cnn.so").is_file()

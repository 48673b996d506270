"""examples/train_cnn.py runs (small size) and rlxc.nn_conv declares its params."""
from __future__ import annotations

import numpy as np
import pytest

import rlxc
from rlxc.nn_conv import conv2d, he_init

from scripts import load_script


def test_train_cnn_example_small(tmp_path, capsys):
    pytest.importorskip("sklearn")
    mod = load_script("examples/train_cnn.py", "train_cnn")
    assert mod.main(["--epochs", "6", "--width", "8", "--min-acc", "0.97",
                     "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "reloaded test accuracy" in out
    assert (tmp_path / "digits_cnn.safetensors").exists()


def test_nn_conv2d_declares_params_and_matches_the_op():
    def build(s):
        x = s.input("x", (2, 4, 6, 6))
        return conv2d(s, "c1", x, 6, (3, 2), stride=2, padding=1, groups=2)
    f = rlxc.Func("nnconv", build)
    assert f.param_names() == ["c1_w", "c1_b"]
    assert f.param_shape_of("c1_w") == (6, 2, 3, 2) and f.param_shape_of("c1_b") == (6,)
    f = he_init(f, seed=3)
    w, b = f.param_binding("c1_w"), f.param_binding("c1_b")
    assert np.all(b == 0) and 0.3 < w.std() / np.sqrt(2 / 12) < 1.7
    x = np.random.default_rng(0).standard_normal((2, 4, 6, 6)).astype(np.float32)
    g = rlxc.Func("ref", lambda s: s.input("x", x.shape).conv2d(
        s.input("w", w.shape), stride=2, padding=1, groups=2))
    np.testing.assert_allclose(f.run(x=x)[0], g.run_on("interp", x=x, w=w)[0], rtol=1e-5,
                               atol=1e-5)


def test_nn_conv2d_bad_groups():
    with pytest.raises(rlxc.ShapeError, match="nn.conv2d 'c'.*groups=2"):
        rlxc.Func("bad", lambda s: conv2d(s, "c", s.input("x", (1, 3, 4, 4)), 4, 3,
                                          groups=2)).module

"""Checkpoints: safetensors round trip, strict name/shape checks, clear errors
for missing and corrupt files, atomic writes."""
import os

import numpy as np
import pytest

from rlxc import checkpoint
from rlxc.checkpoint import CheckpointError, load_tensors, read_metadata, save_tensors

F32 = np.float32


@pytest.fixture
def tensors():
    rng = np.random.default_rng(0)
    return {"w1": rng.normal(size=(4, 3)).astype(F32),
            "layer.0.b": rng.normal(size=(3,)).astype(F32),
            "empty": np.zeros((0, 5), F32)}


def test_round_trip_bit_exact_with_metadata(tmp_path, tensors):
    extra = {"t": np.array([7], np.int64), "hp.lr": np.array([0.1]),
             "kind": np.frombuffer(b"adam", np.uint8).copy(),
             "strided": np.arange(12, dtype=F32).reshape(3, 4)[:, ::2]}
    path = tmp_path / "model.safetensors"
    save_tensors(path, {**tensors, **extra}, metadata={"step": "7", "format": "rlxc"})
    out = load_tensors(str(path))
    assert set(out) == set(tensors) | set(extra)
    for k, v in {**tensors, **extra}.items():
        assert out[k].dtype == v.dtype and out[k].shape == v.shape
        assert np.array_equal(out[k], v), k
    assert read_metadata(path) == {"step": "7", "format": "rlxc"}


def test_expected_shapes(tmp_path, tensors):
    path = tmp_path / "m.safetensors"
    save_tensors(path, tensors)
    expected = {k: v.shape for k, v in tensors.items()}
    assert set(load_tensors(path, expected)) == set(tensors)

    with pytest.raises(CheckpointError, match=r"missing tensor\(s\) \['w2'\]"):
        load_tensors(path, {**expected, "w2": (2,)})
    with pytest.raises(CheckpointError,
                       match=r"'w1' expected shape \(3, 4\), got \(4, 3\)"):
        load_tensors(path, {**expected, "w1": (3, 4)})
    few = {"w1": (4, 3)}
    with pytest.raises(CheckpointError, match=r"unexpected tensor\(s\) \['empty', 'layer.0.b'\]"):
        load_tensors(path, few)
    with pytest.raises(CheckpointError, match=str(path)):
        load_tensors(path, few)


def test_non_strict_ignores_extras_only(tmp_path, tensors):
    path = tmp_path / "m.safetensors"
    save_tensors(path, tensors)
    out = load_tensors(path, {"w1": [4, 3]}, strict=False)
    assert list(out) == ["w1"] and np.array_equal(out["w1"], tensors["w1"])
    with pytest.raises(CheckpointError, match="missing"):
        load_tensors(path, {"w1": (4, 3), "nope": (1,)}, strict=False)
    with pytest.raises(CheckpointError, match=r"expected shape \(12,\), got \(4, 3\)"):
        load_tensors(path, {"w1": (12,)}, strict=False)


def test_missing_file(tmp_path):
    path = tmp_path / "absent.safetensors"
    with pytest.raises(FileNotFoundError, match="absent.safetensors"):
        load_tensors(path)
    with pytest.raises(FileNotFoundError, match="absent.safetensors"):
        read_metadata(path)


@pytest.mark.parametrize("corrupt", [
    lambda data: b"",
    lambda data: b"not a safetensors file at all",
    lambda data: data[:-5],
    lambda data: data[:8] + b"[" + data[9:],      # header JSON broken
])
def test_corrupt_file(tmp_path, tensors, corrupt):
    path = tmp_path / "bad.safetensors"
    save_tensors(path, tensors)
    path.write_bytes(corrupt(path.read_bytes()))
    with pytest.raises(CheckpointError, match="bad.safetensors"):
        load_tensors(path)


def test_overwrite_is_atomic_and_leaves_no_temp_files(tmp_path, tensors, monkeypatch):
    path = tmp_path / "m.safetensors"
    save_tensors(path, tensors)
    save_tensors(path, {"w1": tensors["w1"] * 2})
    assert list(load_tensors(path)) == ["w1"]
    assert os.listdir(tmp_path) == ["m.safetensors"]

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        save_tensors(path, {"other": np.ones(2, F32)})
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["m.safetensors"]
    assert np.array_equal(load_tensors(path)["w1"], tensors["w1"] * 2)


@pytest.mark.parametrize("bad, meta", [
    ({"w": [1.0, 2.0]}, None),
    ({3: np.ones(2, F32)}, None),
    ({"w": np.ones(2, F32)}, {"step": 3}),
])
def test_bad_save_arguments(tmp_path, bad, meta):
    with pytest.raises(TypeError):
        save_tensors(tmp_path / "x.safetensors", bad, metadata=meta)
    assert os.listdir(tmp_path) == []


# -- issue 13 item 20: params keep their dtype; a lossy conversion warns --------------------

MIXED = '''builtin.module {
  func.func @mixed(%x: tensor<3xf32> {rlx.kind = "input", rlx.name = "x"}, %w: tensor<3xf32> {rlx.kind = "param", rlx.name = "w"}, %k: tensor<3xi32> {rlx.kind = "param", rlx.name = "k"}, %d: tensor<3xf64> {rlx.kind = "param", rlx.name = "d"}) -> (tensor<f32>) {
    %0 = rlx.cast %k : tensor<3xi32> -> tensor<3xf32>
    %1 = rlx.cast %d : tensor<3xf64> -> tensor<3xf32>
    %2 = rlx.mul %x, %w : tensor<3xf32>
    %3 = rlx.mul %2, %0 : tensor<3xf32>
    %4 = rlx.add %3, %1 : tensor<3xf32>
    %5 = rlx.mul %4, %4 : tensor<3xf32>
    %6 = rlx.sum %5 axes = [0] : tensor<3xf32> -> tensor<f32>
    func.return %6 : tensor<f32>
  }
}'''
K = np.array([3, -2, 16777217], np.int32)   # 2**24 + 1: not a float32
D = np.array([1 / 3, -0.1, 1e-300])          # not float32 values either


def _mixed():
    from rlxc import Func

    return Func.from_mlir(MIXED).with_params({"w": np.array([0.5, -1, 2], np.float32),
                                              "k": K, "d": D})


@pytest.mark.parametrize("device", ["interp", "cpu"])
def test_trainer_keeps_integer_and_float64_params(device, tmp_path):
    from rlxc.optim import SGD

    f = _mixed()
    x = {"x": np.array([0.25, 0.5, 1e-7], np.float32)}
    tr = f.trainer(SGD(1e-3), wrt=["w"], device=device)
    loss = tr.step(x)
    want_f, want_loss = f.train_step(SGD(1e-3), x, wrt=["w"], device=device)
    assert loss == want_loss  # the step read the int32 / float64 data as such
    sd = tr.state_dict()
    assert sd["params.k"].dtype == np.int32 and sd["params.d"].dtype == np.float64
    np.testing.assert_array_equal(sd["params.k"], K)
    np.testing.assert_array_equal(sd["params.d"], D)
    np.testing.assert_array_equal(sd["params.w"], want_f.params()["w"])
    got = tr.func.params()
    assert got["k"].dtype == np.int32 and got["d"].dtype == np.float64
    tr.save(tmp_path / "t.safetensors")
    again = f.trainer(SGD(1e-3), wrt=["w"], device=device)
    again.load(tmp_path / "t.safetensors")
    for n, a in again.state_dict().items():
        assert a.dtype == sd[n].dtype, n
        np.testing.assert_array_equal(a, sd[n], err_msg=n)


def test_load_params_keeps_dtypes_and_warns_on_lossy_conversion(tmp_path):
    import warnings

    from rlxc.checkpoint import LossyConversionWarning

    f = _mixed()
    p = tmp_path / "p.safetensors"
    f.save_params(p)
    assert {n: a.dtype for n, a in load_tensors(p).items()} == \
        {"w": np.float32, "k": np.int32, "d": np.float64}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g = f.load_params(p)
        assert g.params()["k"].dtype == np.int32 and g.params()["d"].dtype == np.float64
        np.testing.assert_array_equal(g.params()["k"], K)
        np.testing.assert_array_equal(g.params()["d"], D)
        # exact conversions stay silent: float64 halves into f32, small ints into f32
        save_tensors(p, {"w": np.array([0.5, 0.25, 2.0]), "k": K, "d": D.astype(np.float32)})
        g = f.load_params(p)
        assert g.params()["w"].dtype == np.float32 and g.params()["d"].dtype == np.float64
    save_tensors(p, {"w": np.array([1 / 3, 0, 0]), "k": K, "d": D})
    with pytest.warns(LossyConversionWarning, match=r"tensor 'w' converted from float64 to "
                                                    r"the param's float32 changes values"):
        f.load_params(p)
    save_tensors(p, {"w": np.zeros(3, np.float32), "k": np.array([1.5, 0, 0]), "d": D})
    with pytest.warns(LossyConversionWarning, match="tensor 'k'"):
        f.load_params(p)
    save_tensors(p, {"w": np.array([2**24 + 1, 0, 0], np.int32), "k": K, "d": D})
    with pytest.warns(LossyConversionWarning, match=r"'w'.*16777217 -> 16777216.0"):
        f.load_params(p)


def test_trainer_load_state_dict_warns_on_lossy_conversion():
    from rlxc.checkpoint import LossyConversionWarning
    from rlxc.optim import SGD

    tr = _mixed().trainer(SGD(0.1), wrt=["w"], device="interp")
    sd = tr.state_dict()
    sd["params.w"] = np.array([1 / 3, 0.5, 2.0])
    with pytest.warns(LossyConversionWarning, match="trainer.load_state_dict: tensor 'w'"):
        tr.load_state_dict(sd)
    assert tr.func.params()["w"].dtype == np.float32
    np.testing.assert_array_equal(tr.func.params()["w"], np.array([1 / 3, 0.5, 2.0], F32))

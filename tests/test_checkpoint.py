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

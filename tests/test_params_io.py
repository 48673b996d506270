"""Func.save_params / Func.load_params: safetensors round trip, strict checks
that name the offending tensor, strict=False ignoring extras."""
import numpy as np
import pytest

from rlxc import Func
from rlxc.checkpoint import CheckpointError, load_tensors, read_metadata, save_tensors
from rlxc.runtime.errors import NameLookupError

F32 = np.float32


def model():
    def build(s):
        x = s.input("x", (2, 3))
        return x.linear(s.param("w", (3, 4)), s.param("b", (4,))).sum()
    return Func("m", build).init_randn(5, 1.0)


def test_round_trip_is_bit_exact(tmp_path):
    f = model()
    path = tmp_path / "p.safetensors"
    f.save_params(path)
    assert sorted(load_tensors(path)) == ["b", "w"]
    assert read_metadata(path)["rlxc.func"] == "m"
    other = Func("other", lambda s: s.param("w", (3, 4)).sum() + s.param("b", (4,)).sum())
    g = other.load_params(path)  # any Func with these names and shapes
    for n, a in f.params().items():
        assert np.array_equal(g.params()[n], a) and g.params()[n].dtype == F32
    h = model().with_params({"w": np.zeros((3, 4)), "b": np.zeros(4)}).load_params(str(path))
    x = np.ones((2, 3), F32)
    assert h.run_on("interp", x=x)[0] == f.run_on("interp", x=x)[0]


def test_strict_errors_name_the_tensor(tmp_path):
    f = model()
    p = f.params()
    path = tmp_path / "bad.safetensors"
    save_tensors(path, {"w": p["w"]})
    with pytest.raises(CheckpointError, match=r"missing tensor\(s\) \['b'\]"):
        f.load_params(path)
    with pytest.raises(CheckpointError, match=r"missing tensor\(s\) \['b'\]"):
        f.load_params(path, strict=False)  # strict=False only forgives extras
    save_tensors(path, {"w": p["w"], "b": np.zeros(5, F32)})
    with pytest.raises(CheckpointError, match=r"'b' expected shape \(4,\), got \(5,\)"):
        f.load_params(path)
    save_tensors(path, {**p, "extra": np.zeros(1, F32)})
    with pytest.raises(CheckpointError, match=r"unexpected tensor\(s\) \['extra'\]"):
        f.load_params(path)
    g = f.with_params({"w": np.zeros((3, 4)), "b": np.zeros(4)}).load_params(path, strict=False)
    assert np.array_equal(g.params()["w"], p["w"])
    with pytest.raises(FileNotFoundError, match="nope.safetensors"):
        f.load_params(tmp_path / "nope.safetensors")


def test_save_needs_every_param_bound(tmp_path):
    f = Func("u", lambda s: (s.param("a", (2,)) * s.param("b", (2,))).sum()).with_param(
        "a", [1, 2])
    with pytest.raises(NameLookupError, match=r"params \['b'\] of u are not bound"):
        f.save_params(tmp_path / "u.safetensors")

"""The Func API: tracing, immutability, params, init_randn, and error messages."""
import math

import numpy as np
import pytest

import rlxc
from rlxc import NameLookupError, ShapeError


def _mlp(s):
    x = s.input("x", (4, 3))
    w = s.param("w", (3, 2))
    b = s.param("b", (2,))
    return (x @ w + b).relu().sum(), x.sum(0)


def test_quickstart_forward():
    f = rlxc.Func("sum_sq", lambda s: (s.input("x", (3,)) ** 2).sum(0))
    np.testing.assert_allclose(f.run_on("interp", x=np.array([1, 2, 3], np.float32))[0], 14)
    assert f.input_names() == ["x"] and f.output_count() == 1


def test_signature_and_immutability():
    f = rlxc.Func("mlp", _mlp)
    assert f.param_names() == ["w", "b"] and f.input_names() == ["x"]
    assert f.param_shape_of("w") == (3, 2) and f.output_count() == 2
    g = f.with_param("w", np.ones((3, 2)))
    assert f.param_binding("w") is None and g.param_binding("w").dtype == np.float32
    h = g.with_param("b", [1.0, 2.0])
    assert h.param_binding("w") is g.param_binding("w")
    with pytest.raises(ValueError):
        h.param_binding("w")[0, 0] = 5  # bound data is read-only
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    loss, xs = h.run_on("interp", x=x)
    np.testing.assert_allclose(loss, np.maximum(x @ np.ones((3, 2)) + [1, 2], 0).sum())
    np.testing.assert_allclose(xs, x.sum(0))
    # dict form and flat inputs (RLX passes flat data)
    np.testing.assert_allclose(h.run_on("interp", {"x": x.ravel()})[0], loss)


def test_mlir_round_trip_and_from_module():
    f = rlxc.Func("mlp", _mlp)
    g = rlxc.Func.from_mlir(f.mlir())
    assert g.mlir() == f.mlir() and g.name == "mlp"
    h = rlxc.Func.from_module(f.module.clone())
    assert h.param_names() == ["w", "b"]


def test_init_params():
    f = rlxc.Func("mlp", _mlp).init_params(lambda n, d: np.full(d, 0.5))
    assert np.all(f.param_binding("b") == 0.5)
    with pytest.raises(TypeError, match=r"init_params: expects a function fn\(name, dims\).*"
                                        r"with_params"):
        rlxc.Func("mlp", _mlp).init_params({"b": np.zeros(3)})


def _splitmix_reference(seed, count):
    """The algorithm, one draw at a time, in plain Python integers."""
    mask = (1 << 64) - 1
    state = (seed ^ 0x9E3779B97F4A7C15) & mask
    out = []
    for _ in range(count):
        state = (state + 0x9E3779B97F4A7C15) & mask
        x = state
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
        x ^= x >> 31
        out.append((x >> 11) / float(2 ** 53))
    return out


def _randn_reference(seed, shapes, stddev):
    total = sum(math.prod(max(d, 1) for d in s) for s in shapes)
    u = _splitmix_reference(seed, 2 * total)
    vals = []
    for i in range(total):
        u1, u2 = max(u[2 * i], 1e-12), u[2 * i + 1]
        g = math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)
        vals.append(np.float32(g) * np.float32(stddev))
    out, k = [], 0
    for s in shapes:
        n = math.prod(max(d, 1) for d in s)
        chunk = vals[k:k + n]
        k += n
        out.append(np.array(chunk, np.float32).reshape(s) if math.prod(s) == n
                   else np.zeros(s, np.float32))
    return out


def test_init_randn_matches_the_algorithm_bit_for_bit():
    def build(s):
        a = s.param("a", (3, 4))
        z = s.param("z", (0, 5))  # a dim of 0 counts as 1 in the stream
        b = s.param("b", (7,))
        return a.sum() + b.sum() + z.sum()

    f = rlxc.Func("r", build).init_randn(1234, 0.1)
    ref = _randn_reference(1234, [(3, 4), (0, 5), (7,)], 0.1)
    for n, r in zip(["a", "z", "b"], ref):
        got = f.param_binding(n)
        assert got.shape == r.shape
        assert np.array_equal(got.view(np.uint32), r.view(np.uint32)), n
    # first value golden: computed once from the algorithm above
    assert f.param_binding("a").ravel()[0] == ref[0].ravel()[0]
    g = rlxc.Func("r", build).init_randn(1234, 0.1)
    assert np.array_equal(g.param_binding("b"), f.param_binding("b"))
    assert not np.array_equal(rlxc.Func("r", build).init_randn(5, 0.1).param_binding("b"),
                              f.param_binding("b"))


def test_init_randn_is_vectorized():
    import time

    f = rlxc.Func("big", lambda s: s.param("w", (2000, 1000)).sum())
    t = time.perf_counter()
    f.init_randn(1, 0.02)
    assert time.perf_counter() - t < 2.0  # 2M params; 100M take seconds, not minutes


# -- errors -------------------------------------------------------------------

def test_input_shape_error_names_input_and_shapes():
    f = rlxc.Func("mlp", _mlp).init_randn(0, 0.1)
    with pytest.raises(ShapeError, match=r"input 'x' expects shape \(4, 3\), got \(3,\)"):
        f.run_on("interp", x=np.ones(3))


def test_missing_unknown_and_unbound_names():
    f = rlxc.Func("mlp", _mlp)
    with pytest.raises(NameLookupError, match=r"param 'w' is not bound.*\['w', 'b'\]"):
        f.run_on("interp", x=np.ones((4, 3)))
    f = f.init_randn(0, 0.1)
    with pytest.raises(NameLookupError, match=r"missing input 'x'.*\['x'\]"):
        f.run_on("interp")
    with pytest.raises(NameLookupError, match=r"unknown input 'y'.*valid inputs: \['x'\]"):
        f.run_on("interp", x=np.ones((4, 3)), y=1)
    with pytest.raises(NameLookupError, match=r"unknown param 'q'.*\['w', 'b'\]"):
        f.with_param("q", [1])
    with pytest.raises(ShapeError, match=r"param 'b' expects shape \(2,\), got \(3,\)"):
        f.with_param("b", [1, 2, 3])


def test_trace_time_shape_errors_name_op_and_shapes():
    with pytest.raises(ShapeError, match=r"matmul: \(3, 4\) @ \(5, 2\): inner dimensions 4 != 5"):
        rlxc.Func("f", lambda s: s.input("a", (3, 4)) @ s.input("b", (5, 2)))
    with pytest.raises(ShapeError, match=r"rlx.add: shapes \(3,\) and \(4,\) do not broadcast"):
        rlxc.Func("f", lambda s: s.input("a", (3,)) + s.input("b", (4,)))
    with pytest.raises(ShapeError, match=r"reshape: cannot reshape \(3, 4\) to \(5, -1\)"):
        rlxc.Func("f", lambda s: s.input("a", (3, 4)).reshape(5, -1))
    with pytest.raises(ShapeError, match="sum: axis 2 out of range for rank 2"):
        rlxc.Func("f", lambda s: s.input("a", (3, 4)).sum(2))
    with pytest.raises(ShapeError, match=r"concat: \(2, 4\) does not match \(2, 3\)"):
        rlxc.Func("f", lambda s: rlxc.concat([s.input("a", (2, 3)), s.input("b", (2, 4))], 0))
    with pytest.raises(ValueError, match="duplicate name 'x'"):
        rlxc.Func("f", lambda s: s.input("x", 3) + s.param("x", 3))
    with pytest.raises(TypeError, match="dtypes differ"):
        rlxc.Func("f", lambda s: s.input("x", 3) + s.input("i", 3, "i32"))


def test_unknown_device_and_bad_dtype():
    f = rlxc.Func("f", lambda s: s.input("x", (2,)).exp())
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        f.run_on("tpu", x=[1, 2])
    with pytest.raises(TypeError, match="unknown dtype 'f16'"):
        rlxc.Func("f", lambda s: s.input("x", (2,), "f16"))
    g = rlxc.Func("g", lambda s: s.input("x", (2,)).gather(s.input("i", (3,), "i32")))
    with pytest.raises(TypeError, match="input 'i': expects integers"):
        g.run_on("interp", x=[1, 2], i=[0.5, 1, 0])
    with pytest.raises(IndexError, match="gather: index out of range"):
        g.run_on("interp", x=[1, 2], i=[0, 2, 1])


def test_several_outputs_and_int_labels():
    def build(s):
        logits = s.input("logits", (3, 4))
        y = s.input("y", (3,), "i64")
        return logits.cross_entropy(y), logits.softmax()

    f = rlxc.Func("ce", build)
    z = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
    loss, p = f.run_on("interp", logits=z, y=np.array([0, 3, 1]))
    lp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    np.testing.assert_allclose(loss, -lp[range(3), [0, 3, 1]].mean(), rtol=1e-6)
    np.testing.assert_allclose(p.sum(-1), 1, rtol=1e-6)

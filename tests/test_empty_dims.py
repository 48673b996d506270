"""Zero-size dimensions: every op on cpu, the GPU emulator and interp against NumPy.

A (3, 0) tensor holds no data, but sums of it are 0, products 1, means NaN,
matmuls with K == 0 are zeros, and views, concats and grads keep their empty
shapes (lowering/shared/empty.py).  max/min over an empty axis raise at trace time,
as NumPy raises.
"""
import numpy as np
import pytest

import rlxc
from rlxc import Func
from rlxc.runtime.errors import ShapeError

F32 = np.float32
rng = np.random.default_rng(11)
pytestmark = pytest.mark.filterwarnings("ignore:Mean of empty slice:RuntimeWarning")


def R(*s):
    return rng.standard_normal(s).astype(F32)


E = np.zeros((3, 0), F32)      # the empty operand of most cases

# name -> (build, inputs, NumPy reference of the outputs)
CASES = {
    "elementwise": (
        lambda x, b: [(x.exp() + 1.0) * x,
                   x.lt(0.5).where(x, 2.0),
                   x.cast("i32"), x.fake_quant("e4m3"),
                   x + b],
        {"x": E, "b": R(1)},
        lambda x, b: [np.zeros((3, 0), F32), np.zeros((3, 0), F32), np.zeros((3, 0), np.int32),
                      np.zeros((3, 0), F32), np.zeros((3, 0), F32)]),
    "full_reductions": (
        lambda x: [x.sum(), x.mean(),
                   x.prod(), x.sum(keepdims=True)],
        {"x": E},
        lambda x: [np.array(0, F32), np.array(np.nan, F32), np.array(1, F32),
                   np.zeros((1, 1), F32)]),
    "reductions_along_empty_axis": (
        lambda x, y: [x.sum(1), x.mean(1),
                   x.prod(1), x.sum(1, keepdims=True),
                   x.sum(1) + y],
        {"x": E, "y": R(3)},
        lambda x, y: [np.zeros(3, F32), np.full(3, np.nan, F32), np.ones(3, F32),
                      np.zeros((3, 1), F32), y]),
    "reductions_along_nonempty_axis": (
        lambda x: [x.sum(0), x.mean(0),
                   x.max(0), x.min(0, keepdims=True)],
        {"x": E},
        lambda x: [np.zeros(0, F32), np.zeros(0, F32), np.zeros(0, F32), np.zeros((1, 0), F32)]),
    "matmul_k0": (
        lambda v, w, a, c, d: [v.reshape(1, 0) @ w,
                   a @ c,
                   a @ c + d],
        {"v": np.zeros(0, F32), "w": np.zeros((0, 16), F32), "a": np.zeros((2, 4, 0), F32),
         "c": np.zeros((2, 0, 5), F32), "d": R(5)},
        lambda v, w, a, c, d: [np.zeros((1, 16), F32), np.zeros((2, 4, 5), F32),
                               np.broadcast_to(d, (2, 4, 5))]),
    "matmul_m0_n0_batch0": (
        lambda a, b, c, p, q: [a @ b,
                   b.T @ c,
                   p @ q],
        {"a": np.zeros((0, 5), F32), "b": R(5, 4), "c": np.zeros((5, 0), F32),
         "p": np.zeros((0, 2, 3), F32), "q": np.zeros((0, 3, 4), F32)},
        lambda a, b, c, p, q: [np.zeros((0, 4), F32), np.zeros((4, 0), F32),
                               np.zeros((0, 2, 4), F32)]),
    "views": (
        lambda x, y: [x.T, x.reshape(0, 7),
                   x.reshape(1, 0).broadcast_to((4, 0)),
                   y[:, 2:2], y[1:1] * 2.0,
                   x.expand_dims(0)],
        {"x": E, "y": R(3, 4)},
        lambda x, y: [np.zeros((0, 3), F32), np.zeros((0, 7), F32), np.zeros((4, 0), F32),
                      np.zeros((3, 0), F32), np.zeros((0, 4), F32), np.zeros((1, 3, 0), F32)]),
    "concat": (
        lambda x, y, z: [rlxc.concat([x, y], 1),
                   rlxc.concat([y, x,
                                y * 2.0], 1),
                   rlxc.concat([z, y], 0).exp(),
                   rlxc.concat([x, x], 0)],
        {"x": E, "y": R(3, 4), "z": np.zeros((0, 4), F32)},
        lambda x, y, z: [y, np.concatenate([y, 2 * y], 1), np.exp(y), np.zeros((6, 0), F32)]),
    "gather_empty_indices": (
        lambda t, i: [t.gather(i, 0),
                   t.gather(i, 1).sum()],
        {"t": R(5, 4), "i": np.zeros(0, np.int32)},
        lambda t, i: [np.zeros((0, 4), F32), np.array(0, F32)]),
    "pad_scatter_composites": (
        lambda v, u, i, x, y: [
            v.scope.emit("rlx.pad", [v], low=(1,), high=(2,)),
            v.scope.emit("rlx.scatter_add", [i, u], axis=0, dim=5),
            x.softmax(0), x.log_softmax(0), y.cross_entropy(i), (x * x).mean(1).sqrt()],
        {"v": np.zeros(0, F32), "u": np.zeros((0, 4), F32), "i": np.zeros(0, np.int32),
         "x": E, "y": np.zeros((0, 3), F32)},
        lambda v, u, i, x, y: [np.zeros(3, F32), np.zeros((5, 4), F32), np.zeros((3, 0), F32),
                               np.zeros((3, 0), F32), np.array(np.nan, F32),
                               np.full(3, np.nan, F32)]),
}


def _build(name):
    """The case's Func (its inputs declared from the arrays) and the expected outputs."""
    build, inputs, ref = CASES[name]

    def trace(s):
        return build(**{k: s.input(k, a.shape, "i32" if a.dtype == np.int32 else "f32")
                        for k, a in inputs.items()})

    return Func(f"empty_{name}", trace), inputs, ref(**inputs)


def _same(got, want, who):
    assert len(got) == len(want), who
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and g.dtype == w.dtype, (who, k, g.shape, g.dtype, w.shape)
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=0, err_msg=f"{who} output {k}")


@pytest.mark.parametrize("name", list(CASES))
def test_empty_dims_cpu_and_interp(name):
    f, inputs, want = _build(name)
    _same(f.run_on("interp", **inputs), want, "interp")
    _same(f.run_on("cpu", **inputs), want, "cpu")


@pytest.mark.parametrize("name", list(CASES))
def test_empty_dims_gpu_emulator(name):
    from rlxc.lowering.gpu import emu as gpu_emu

    f, inputs, want = _build(name)
    prog = gpu_emu.emulate_program(f.module, gpu_emu.EmuDriver())
    try:
        got = prog.run(f.bind_call((), dict(inputs)))
    finally:
        prog.close()
    _same(got, want, "gpu emulator")


def test_grads_through_empty_dims():
    """d/dx of losses that read empty tensors: empty grads, and the non-empty parts exact."""
    def build(s):
        x, w, y = s.input("x", (4, 0)), s.input("w", (0, 3)), s.input("y", (4, 3))
        z = s.input("z", (2, 0))
        h = (x @ w + y).tanh()
        return (h * h).sum() + z.sum() + rlxc.concat([z, z * 3.0], 1).mean(0).sum() \
            + (z.T @ z).sum()

    inputs = {"x": np.zeros((4, 0), F32), "w": np.zeros((0, 3), F32), "y": R(4, 3),
              "z": np.zeros((2, 0), F32)}
    f = Func("empty_grad", build).value_and_grad(["x", "w", "y", "z"])
    ref = f.run_on("interp", **inputs)
    got = f.run_on("cpu", **inputs)
    t = np.tanh(inputs["y"].astype(np.float64))
    want_y = (2 * t * (1 - t * t)).astype(F32)
    for g, r in zip(got, ref):
        assert g.shape == r.shape and g.dtype == r.dtype
    assert [g.shape for g in got] == [(), (4, 0), (0, 3), (4, 3), (2, 0)]
    np.testing.assert_allclose(got[0], np.sum(t * t), rtol=1e-6)
    np.testing.assert_allclose(got[3], want_y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ref[3], want_y, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["max", "min"])
def test_max_min_of_empty_raise_at_trace(op):
    with pytest.raises(ShapeError, match=f"{op}: reduction over an empty axis of \\(3, 0\\)"):
        Func("bad", lambda s: getattr(s.input("x", (3, 0)), op)()).module
    with pytest.raises(ValueError, match=f"{op}: reduction over an empty axis"):
        Func("bad", lambda s: getattr(s.input("x", (3, 0)), op)(1)).module


def test_rewrite_is_needed_and_leaves_the_module_alone():
    """The rewrite turns empty computations into constants, on a clone only."""
    from rlxc.lowering.shared.empty import rewrite_empty

    f = Func("empty_sum", lambda s: [s.input("x", (3, 0)).sum(), s.input("y", (2,)) * 2.0])
    before = str(f.module)
    out = rewrite_empty(f.module)
    assert out is not f.module and str(f.module) == before
    assert "rlx.sum" not in str(out) and "rlx.mul" in str(out)
    g = Func("full", lambda s: s.input("y", (2,)).sum())
    assert rewrite_empty(g.module) is g.module


def test_gather_from_empty_table():
    """Every index is out of range: cpu and interp raise; the GPU (gathers clamp, no error
    channel) gives zeros instead of reading outside a zero-byte buffer."""
    from rlxc.lowering.gpu import emu as gpu_emu

    f = Func("empty_table", lambda s: s.input("t", (0, 4)).gather(s.input("i", (2,), "i32"), 0)
             * 2.0)
    inputs = {"t": np.zeros((0, 4), F32), "i": np.zeros(2, np.int32)}
    for device in ("cpu", "interp"):
        with pytest.raises(IndexError, match=r"rlx.gather: index out of range \[0, 0\)"):
            f.run_on(device, **inputs)
    prog = gpu_emu.emulate_program(f.module, gpu_emu.EmuDriver())
    try:
        got = prog.run(f.bind_call((), inputs))
    finally:
        prog.close()
    _same(got, [np.zeros((2, 4), F32)], "gpu emulator")

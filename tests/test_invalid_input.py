"""Invalid input raises instead of being silently accepted (issue 13 item 18).

- cross_entropy labels outside [0, classes): IndexError at run time (cpu, interp,
  the loss and its gradient), like gather's index check;
- transpose axes outside the rank: ShapeError at trace time (NumPy's AxisError);
- float dimensions and axes (2.7, and integral 3.0 too): TypeError naming the input.
"""
import numpy as np
import pytest

from rlxc import Func
from rlxc.runtime.errors import ShapeError

F32 = np.float32
LOGITS = np.random.default_rng(3).standard_normal((4, 3)).astype(F32)


def _ce(dtype="i32"):
    def build(s):
        return s.input("x", (4, 3)).cross_entropy(s.input("y", (4,), dtype))
    return build


def _ce_ref(x, y):
    x = x.astype(np.float64)
    lse = np.log(np.exp(x - x.max(1, keepdims=True)).sum(1)) + x.max(1)
    return np.mean(lse - x[np.arange(len(y)), y])


@pytest.mark.parametrize("device", ["cpu", "interp"])
@pytest.mark.parametrize("bad", [5, 3, -1, 2 ** 30])
def test_cross_entropy_label_out_of_range_raises(device, bad):
    y = np.array([0, 2, bad, 1], np.int32)
    f = Func("ce_labels", _ce())
    with pytest.raises(IndexError, match=r"index out of range \[0, 3\)"):
        f.run_on(device, x=LOGITS, y=y)
    with pytest.raises(IndexError, match=r"index out of range \[0, 3\)"):
        f.value_and_grad(["x"]).run_on(device, x=LOGITS, y=y)


def test_cross_entropy_interp_names_label_and_row():
    f = Func("ce_labels", _ce("i64"))
    y = np.array([0, 2, 1, 2 ** 40], np.int64)
    with pytest.raises(IndexError, match=rf"{2 ** 40} at position \(3,\)"):
        f.run_on("interp", x=LOGITS, y=y)


def test_cross_entropy_constant_labels_raise_at_run_time():
    f = Func("ce_const", lambda s: s.input("x", (4, 3)).cross_entropy(np.array([0, 1, 7, 2])))
    for device in ("cpu", "interp"):
        with pytest.raises(IndexError, match=r"out of range \[0, 3\)"):
            f.run_on(device, x=LOGITS)


@pytest.mark.parametrize("device", ["cpu", "interp"])
def test_cross_entropy_valid_labels_unchanged(device):
    y = np.array([0, 2, 1, 2], np.int32)
    loss, dx = Func("ce_labels", _ce()).value_and_grad(["x"]).run_on(device, x=LOGITS, y=y)
    np.testing.assert_allclose(loss, _ce_ref(LOGITS, y), rtol=1e-6)
    p = np.exp(LOGITS - LOGITS.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(4), y] -= 1
    np.testing.assert_allclose(dx, p / 4, rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------- transpose axes

@pytest.mark.parametrize("axes", [(0, 5), (2, 0), (-3, 0), (0, 1, 2)])
def test_transpose_axes_outside_rank_raise(axes):
    with pytest.raises(ShapeError, match="transpose: axes .* out of range for rank 2"):
        Func("t", lambda s: s.input("x", (2, 3)).transpose(*axes))
    with pytest.raises(ValueError):       # NumPy raises too
        np.transpose(np.ones((2, 3)), axes)


def test_transpose_valid_and_bad_permutations():
    x = np.arange(24, dtype=F32).reshape(2, 3, 4)
    def build(s):
        v = s.input("x", (2, 3, 4))
        return [v.transpose(-1, 0, 1), v.transpose((2, 1, 0))]

    f = Func("t", build)
    for got, want in zip(f.run_on("interp", x=x), [x.transpose(-1, 0, 1), x.transpose(2, 1, 0)]):
        np.testing.assert_array_equal(got, want)
    for axes in [(0, 0), (1, 0)]:
        with pytest.raises(ShapeError, match="not a permutation"):
            Func("t", lambda s: s.input("x", (2, 3, 4)).transpose(*axes))
    with pytest.raises(TypeError, match="transpose: axis 1.0 is not an integer"):
        Func("t", lambda s: s.input("x", (2, 3)).transpose(1.0, 0))


# ---------------------------------------------------------------- float dimensions

@pytest.mark.parametrize("build, msg", [
    (lambda s: s.input("x", (2.7, 3)), r"input 'x': shape \(2.7, 3\): dimension 2.7 is not"),
    (lambda s: s.input("x", (3.0, 3)), r"input 'x': shape \(3.0, 3\): dimension 3.0 is not"),
    (lambda s: s.input("x", 2.5), r"input 'x': shape \(2.5,\): dimension 2.5"),
    (lambda s: s.input("x", (np.float32(2), 3)), r"input 'x'.* is not an integer \(float32\)"),
    (lambda s: s.param("w", (4, 2.5)), r"param 'w': shape \(4, 2.5\)"),
    (lambda s: s.input("x", (2, 3)).reshape(3.0, 2), r"reshape: shape \(3.0, 2\)"),
    (lambda s: s.input("x", (2, 3)).reshape((1.5, -1)), r"reshape: shape \(1.5, -1\)"),
    (lambda s: s.input("x", (3,)).broadcast_to((2.0, 3)), r"broadcast_to: shape \(2.0, 3\)"),
    (lambda s: s.input("x", (2, 3)).sum(1.5), r"sum: axis 1.5 is not an integer"),
    (lambda s: s.input("x", (2, 3)).expand_dims(0.5), r"expand_dims: axis 0.5"),
    (lambda s: s.input("x", (4, 3)).narrow(0, 1.5, 2), r"narrow: start 1.5"),
])
def test_float_dimensions_raise(build, msg):
    with pytest.raises(TypeError, match=msg):
        Func("f", build)


def test_integer_like_dimensions_still_accepted():
    f = Func("f", lambda s: s.input("x", (np.int64(2), np.int32(3))).reshape(np.int64(3), -1)
             .broadcast_to((np.int16(4), 3, 2)).sum(np.int64(0)))
    got = f.run_on("interp", x=np.ones((2, 3), F32))[0]
    np.testing.assert_array_equal(got, np.full((3, 2), 4, F32))


@pytest.mark.parametrize("device", ["cpu", "interp"])
@pytest.mark.parametrize("labels, bad, row", [([0, 5, 1, 2], 5, 1), ([0, 1, -1, 2], -1, 2),
                                              ([2**30, 0, 0, 0], 2**30, 0)])
def test_cross_entropy_error_names_the_label_and_its_row(device, labels, bad, row):
    """The compiled check reads the offending label back on the error path (issue 13
    item 18): the message names the op, the label and its row on every backend."""
    f = Func("ce_row", lambda s: s.input("x", (4, 3)).cross_entropy(
        s.input("y", (4,), "i32")))
    x = np.zeros((4, 3), np.float32)
    for g in (f, f.grad(["x"])):
        with pytest.raises(IndexError, match=rf"cross_entropy labels .*\[0, 3\).*: {bad} at "
                                             rf"position \({row},\)"):
            g.run_on(device, x=x, y=np.array(labels, np.int32))

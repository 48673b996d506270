"""NumPy semantics of masks and integers meeting Python scalars, integer means and pow.

- A mask in arithmetic counts as 0/1 (README): `mask + 1` is i32, `mask * 0.5` f32,
  `mask.sum()` / `mask.prod()` count in i32, `mask == 2` compares the 0/1 values.
- The mean of integers is f64 (NumPy's float64), never a truncated integer; a mask's mean
  (a fraction) is f32, the default float, so it combines with f32 losses.
- A Python scalar never wraps into an integer dtype: an integer beyond the dtype's range
  raises OverflowError in arithmetic (NumPy 2) and compares exactly (every element alike);
  a non-integer float raises TypeError in arithmetic and `where`, and compares in f64;
  `where` of two Python scalars takes NumPy's kind (i32, f32 or a mask).
- Integer `**` is exact and wraps like NumPy's (square and multiply, not f64 pow); a
  constant negative exponent raises ValueError as NumPy does, a runtime one gives the
  truncated 1 / x ** -y (lowering/shared/scalar.py's header).
Checked on the native CPU backend and the interpreter (the ops' definition) alike.
"""
from __future__ import annotations

import numpy as np
import pytest

from rlxc import Func, where
from rlxc.runtime.errors import ShapeError

DEVICES = ["cpu", "interp"]


@pytest.mark.parametrize("dev", DEVICES)
def test_a_mask_in_arithmetic_and_reductions_counts_as_0_1(dev):
    x = np.array([1.0, 2.0, 3.0, 0.0, 5.0], np.float32)

    def build(s):
        m = s.input("x", (5,)) > 1.5
        return [m.sum(), m.sum(0, keepdims=True), m.mean(), m + 1, m * 2, 1 - m, m * 0.5,
                m.prod(), m.max(), m == 2, m == 1, m < 0.5, m & 1, m | 0, m == np.True_]

    got = Func("masks", build).run_on(dev, x=x)
    m = x > 1.5
    want = [np.int32(3), np.array([3], np.int32), np.float32(0.6),
            (m + 1).astype(np.int32), (m * 2).astype(np.int32), (1 - m.astype(np.int32)),
            (m * 0.5).astype(np.float32), np.int32(0), np.True_, m == 2, m == 1, m < 0.5,
            m & True, m | False, m]
    for i, (g, w) in enumerate(zip(got, want)):
        w = np.asarray(w)
        assert g.dtype == w.dtype, (i, g.dtype, w.dtype)
        np.testing.assert_allclose(np.asarray(g).reshape(w.shape), w, err_msg=str(i))


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("dt", ["i32", "i64"])
def test_integer_mean_is_float64(dev, dt):
    a = np.array([[1, 2], [4, 4], [-7, 2]], dt.replace("i", "int"))
    f = Func("imean", lambda s: (lambda t: [t.mean(1), t.mean(0), t.mean()])(
        s.input("a", (3, 2), dt)))
    got = f.run_on(dev, a=a)
    for g, w in zip(got, [a.mean(1), a.mean(0), a.mean()]):
        assert g.dtype == np.float64
        np.testing.assert_allclose(np.asarray(g).reshape(np.shape(w)), w, rtol=1e-15)


@pytest.mark.parametrize("dev", DEVICES)
def test_out_of_range_integer_scalars_compare_exactly(dev):
    x = np.array([0, 1, -1, 5, 2 ** 31 - 1, -2 ** 31], np.int32)
    y = np.array([0, 2 ** 62, -5, 2 ** 63 - 1], np.int64)

    def build(s):
        t, u = s.input("x", (6,), "i32"), s.input("y", (4,), "i64")
        return [t < 2 ** 31, t == 2 ** 32, t >= 1e10, 2 ** 31 > t, t > -2 ** 40,
                t != 2 ** 33, t < 2.5, t == float("nan"), t < float("inf"),
                u < 2 ** 63, u > -2 ** 64, u == 2 ** 64, u <= 2 ** 63 - 1]

    got = Func("icmp", build).run_on(dev, x=x, y=y)
    want = [x < 2 ** 31, x == 2 ** 32, x >= 1e10, 2 ** 31 > x, x > -2 ** 40, x != 2 ** 33,
            x < 2.5, x == np.nan, x < np.inf,
            np.ones(4, bool), np.ones(4, bool), np.zeros(4, bool), np.ones(4, bool)]
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(g, w, err_msg=str(i))


@pytest.mark.parametrize("case, err, match", [
    (lambda t: t + 2 ** 32, OverflowError, r"4294967296 out of bounds for i32"),
    (lambda t: 2 ** 40 * t, OverflowError, r"out of bounds for i32"),
    (lambda t: t.cast("i64") - 2 ** 64, OverflowError, r"out of bounds for i64"),
    (lambda t: where(t > 0, t, 2.5), TypeError, r"float scalar 2.5 with i32"),
    (lambda t: where(t > 0, t, float("nan")), TypeError, r"float scalar nan with i32"),
    (lambda t: where(t > 0, 2 ** 31, t), OverflowError, r"out of bounds for i32"),
    (lambda t: (t > 0) & 2, TypeError, r"a mask combines with masks or True/False"),
    (lambda t: t ** -1, ValueError, r"negative integer powers"),
])
def test_scalars_that_would_change_value_raise(case, err, match):
    with pytest.raises(err, match=match):
        Func("bad", lambda s: case(s.input("x", (4,), "i32")))


@pytest.mark.parametrize("dev", DEVICES)
def test_integer_pow_is_exact_and_wraps_like_numpy(dev):
    a = np.array([3, 5, 7, -3, 2, 0, 1, -1, 9], np.int64)
    b = np.array([39, 27, 19, 37, 64, 0, 100, 63, 21], np.int64)
    a32 = np.array([7, -9, 2, 3, 0, -1, 46341], np.int32)
    b32 = np.array([13, 11, 31, 21, 5, 4, 2], np.int32)

    def build(s):
        x, y = s.input("a", (9,), "i64"), s.input("b", (9,), "i64")
        x32, y32 = s.input("a32", (7,), "i32"), s.input("b32", (7,), "i32")
        return [x ** y, x32 ** y32, x32 ** 3, 3 ** y32]

    got = Func("ipow", build).run_on(dev, a=a, b=b, a32=a32, b32=b32)
    with np.errstate(over="ignore"):
        want = [a ** b, a32 ** b32, a32 ** 3, np.int32(3) ** b32]
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w, err_msg=str(i))


@pytest.mark.parametrize("dev", DEVICES)
def test_integer_pow_with_a_runtime_negative_exponent_truncates(dev):
    a = np.array([1, -1, -1, 2, -2, 0, 5], np.int32)
    b = np.array([-3, -3, -2, -1, -5, -1, -2 ** 31], np.int32)
    f = Func("ipowneg", lambda s: s.input("a", (7,), "i32") ** s.input("b", (7,), "i32"))
    (got,) = f.run_on(dev, a=a, b=b)
    np.testing.assert_array_equal(got, [1, -1, 1, 0, 0, 0, 0])


def test_concat_of_two_dtypes_names_them():
    from rlxc import concat

    with pytest.raises(ShapeError, match=r"concat: dtypes differ: f32 \(2, 3\) and f64"):
        Func("cat", lambda s: concat([s.input("a", (2, 3)), s.input("b", (4, 3), "f64")]))


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "logsumexp"])
def test_row_op_over_an_empty_axis_names_the_op(op):
    with pytest.raises(ShapeError, match=rf"^{op}: axis 1 of \(3, 0\) is empty"):
        Func("e", lambda s: getattr(s.input("x", (3, 0)), op)(-1))


def test_i64_input_rejects_values_beyond_its_range():
    f = Func("i64in", lambda s: s.input("i", (2,), "i64") + 1)
    with pytest.raises(ValueError, match=r"input 'i': values do not fit in i64"):
        f.run(i=np.array([2 ** 63, 2 ** 64 - 1], np.uint64))
    (got,) = f.run(i=np.array([2 ** 63 - 2, 0], np.uint64))
    np.testing.assert_array_equal(got, [2 ** 63 - 1, 1])


def test_integer_pow_compiles_for_the_gpu():
    """The square-and-multiply rows are shared with the GPU lowering: PTX, assembled by
    ptxas when one is installed."""
    from rlxc.lowering.gpu import driver as gpu_kernels
    from rlxc.lowering.gpu import nvptx

    f = Func("gpow", lambda s: [s.input("a", (64,), "i64") ** s.input("b", (64,), "i64"),
                                s.input("c", (64,), "i32") ** 5])
    art = gpu_kernels.compile_cuda(f.module, ptxas=nvptx.find_ptxas() or False)
    assert "mul.lo.s64" in art.ptx and "mul.lo.s32" in art.ptx


@pytest.mark.parametrize("dev", DEVICES)
def test_integer_true_division_round_neg_abs_sign_follow_numpy(dev):
    """`/` on integers and masks is NumPy's true division (f64; rlx.div truncates, for
    `//`); round with negative decimals rounds integers to tens (halves to even); unary
    minus, abs and sign take integers."""
    x = np.array([-39, 38, 45, 35, 25, 1234, 0, -7], np.int32)
    y = np.array([2, -4, 7, 3, 5, 10, 1, 2], np.int32)

    def build(s):
        a, b = s.input("x", (8,), "i32"), s.input("y", (8,), "i32")
        m = a > 0
        return [a / b, a / 2, 1 / b, m / 2, a.cast("i64") / 4, a.round(-1), a.round(-2),
                a.round(1), -a, abs(a), a.sign(), a.cast("i64").abs(), a // b, a % b]

    got = Func("intdiv", build).run_on(dev, x=x, y=y)
    m = x > 0
    want = [x / y, x / 2, 1 / y, m / 2, x.astype(np.int64) / 4, np.round(x, -1),
            np.round(x, -2), np.round(x, 1), -x, np.abs(x), np.sign(x),
            np.abs(x.astype(np.int64)), x // y, x % y]
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype, (i, g.dtype, w.dtype)
        np.testing.assert_array_equal(g, w, err_msg=str(i))


@pytest.mark.parametrize("dev", DEVICES)
def test_uniform_stays_below_maxval(dev):
    """u * (hi - lo) + lo rounds up to hi for some u < 1 in f32 (1000 + 0.99999994 * 1):
    the draws are clamped into [minval, maxval), as documented."""
    import rlxc

    f = Func("unif", lambda s: rlxc.random.uniform(s.input("key", (2,), "u32"), (1 << 20,),
                                                    minval=1000.0, maxval=1001.0))
    (u,) = f.run_on(dev, key=np.array([7, 11], np.uint32))
    assert u.max() < 1001.0 and u.min() >= 1000.0
    assert (u > 1000.999).any()


@pytest.mark.parametrize("dev", DEVICES)
def test_masks_with_float_tensors_powers_and_floor_division(dev):
    """A mask (or an integer) divided by a float Tensor takes the float's type (it was a
    TypeError once `/` of integers became f64); mask ** k and mask // k count 0/1;
    x.sum() / mask.sum() and mask.mean() * x.sum() combine with f32."""
    x = np.array([1.5, -2.0, 0.5, 4.0], np.float32)

    def build(s):
        t = s.input("x", (4,))
        m = t > 0
        return [m / t, t / m, m.cast("i32") / t, m ** 2, m ** 3, m // 2, m % 2,
                t.sum() / m.sum(), m.mean() * t.sum()]

    got = Func("maskdiv", build).run_on(dev, x=x)
    m = x > 0
    with np.errstate(divide="ignore"):
        want = [(m / x).astype(np.float32), (x / m).astype(np.float32),
                (m.astype(np.int32) / x).astype(np.float32), m.astype(np.int32) ** 2,
                m.astype(np.int32) ** 3, m.astype(np.int32) // 2, m.astype(np.int32) % 2,
                np.float32(x.sum() / m.sum()), np.float32(m.mean() * x.sum())]
    for i, (g, w) in enumerate(zip(got, want)):
        w = np.asarray(w)
        assert g.dtype == w.dtype, (i, g.dtype, w.dtype)
        np.testing.assert_allclose(np.asarray(g).reshape(w.shape), w, rtol=1e-6, err_msg=str(i))


def test_subtracting_masks_is_a_type_error():
    with pytest.raises(TypeError, match="subtracting masks is not defined"):
        Func("msub", lambda s: (lambda m: m - m)(s.input("x", (3,)) > 0))
    with pytest.raises(TypeError, match="float scalar -0.5 with i32"):
        Func("ipow", lambda s: s.input("i", (3,), "i32") ** -0.5)


def test_tall_float_product_over_rows():
    """prod(0) of a tall f32 matrix took the row-split buffer mode with f64 product steps
    stored into f32 partials (an LLVM type error at compile time)."""
    x = np.ones((70000, 3), np.float32)
    x[5, 1], x[69999, 2] = 2.0, -0.5
    (got,) = Func("tallprod", lambda s: s.input("x", (70000, 3)).prod(0)).run(x=x)
    np.testing.assert_array_equal(got, [1.0, 2.0, -0.5])


@pytest.mark.parametrize("dev", DEVICES)
def test_where_of_two_python_scalars_takes_numpys_kind(dev):
    """np.where(m, 1, 0) is an integer, (m, 1, 0.5) a float, (m, True, False) a bool:
    rlxc gives i32, f32 and an i1 mask (its default widths), no longer f32 for all."""
    x = np.array([1.0, 2.0, 3.0], np.float32)

    def build(s):
        m = s.input("x", (3,)) > 1.5
        return [where(m, 1, 0), where(m, 1, 0.5), where(m, True, False), m.where(2, np.int64(7)),
                where(m, 1, 0) * 3]

    got = Func("where_kinds", build).run_on(dev, x=x)
    m = x > 1.5
    want = [np.where(m, 1, 0).astype(np.int32), np.where(m, 1, 0.5).astype(np.float32), m,
            np.where(m, 2, 7).astype(np.int32), np.where(m, 3, 0).astype(np.int32)]
    for g, w in zip(got, want):
        assert np.asarray(g).dtype == w.dtype
        np.testing.assert_array_equal(g, w)


def test_where_of_scalars_out_of_range_or_not_numbers():
    with pytest.raises(OverflowError, match="where: Python integer 4294967296"):
        Func("w_big", lambda s: where(s.input("x", (3,)) > 0, 2 ** 32, 0)).module
    with pytest.raises(TypeError, match="where: a branch must be a Tensor or a real number"):
        Func("w_str", lambda s: where(s.input("x", (3,)) > 0, "a", 0)).module

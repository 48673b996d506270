"""NumPy semantics of Tensor (issue 20 items 1, 2, 3, 6, 7; issue 13 items 19, 20):
operators, remainder/floor division/rounding, advanced indexing, pow at 0, the
not-differentiable error, the subgradients at kinks, symbolic scalar splats and
logsumexp with infinities. Values are checked against NumPy on both backends
(cpu and interp), gradients against finite differences in float64.
"""
from __future__ import annotations

import time
import tracemalloc

import numpy as np
import pytest

import rlxc
from rlxc import Func
from rlxc.runtime.errors import ShapeError

DEVICES = ["cpu", "interp"]
RNG = np.random.default_rng(20)


def _run(f, dev, **inputs):
    return f.run_on(dev, **inputs)


# ---------------------------------------------------------------- item 1: operators

@pytest.mark.parametrize("dev", DEVICES)
def test_comparison_operators_are_elementwise(dev):
    x = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    y = np.array([1.0, 0.0, 3.0, 5.0], np.float32)

    def build(s):
        a, b = s.input("x", (4,)), s.input("y", (4,))
        return [a == b, a != b, a < b, a <= b, a > b, a >= b,
                a == 2.0, 2.0 == a, a < 3, 3 < a, a >= np.array([1, 5, 1, 5], np.float32),
                a * (b == a)]  # the silent case: a mask counts as 0/1

    got = _run(Func("cmp", build), dev, x=x, y=y)
    want = [x == y, x != y, x < y, x <= y, x > y, x >= y, x == 2, 2 == x, x < 3, 3 < x,
            x >= np.array([1, 5, 1, 5]), x * (y == x)]
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(got[-1], [1, 0, 3, 0])


def test_integer_tensor_against_a_fractional_scalar_compares_exactly():
    f = Func("icmp", lambda s: (lambda i: [i < 2.5, i == 2.5, 2.5 > i])(s.input("i", (4,), "i32")))
    i = np.arange(4, dtype=np.int32)
    for dev in DEVICES:
        got = _run(f, dev, i=i)
        np.testing.assert_array_equal(got[0], i < 2.5)
        np.testing.assert_array_equal(got[1], i == 2.5)
        np.testing.assert_array_equal(got[2], 2.5 > i)


def test_tensor_stays_hashable_by_identity():
    seen = {}

    def build(s):
        x = s.input("x", (3,))
        y = x * 2.0
        seen[x], seen[y] = "x", "y"
        assert seen[x] == "x" and seen[y] == "y" and len({x, y, x}) == 2
        assert hash(x) == hash(x) and hash(x) != hash(y)
        assert (x == "not a tensor") is False and (x != None) is True  # noqa: E711
        assert x in [x] and y in {x: 1, y: 2}
        return y

    Func("h", build)
    assert len(seen) == 2


def test_mask_logic_operators():
    x = np.array([-2.0, -0.5, 0.5, 2.0], np.float32)
    f = Func("logic", lambda s: (lambda a: [(a > -1) & (a < 1), (a < -1) | (a > 1), ~(a > 0),
                                             (a > 0) ^ (a > 1)])(s.input("x", (4,))))
    want = [(x > -1) & (x < 1), (x < -1) | (x > 1), ~(x > 0), (x > 0) ^ (x > 1)]
    for dev in DEVICES:
        for g, w in zip(_run(f, dev, x=x), want):
            np.testing.assert_array_equal(g, w)
    with pytest.raises(TypeError, match="i1 masks"):
        Func("bad", lambda s: s.input("x", (4,)) & s.input("y", (4,)))


_FA = np.array([7.0, -7.0, 7.0, -7.0, 1.0, 5.5, -5.5, 0.0, -0.0, 3.0, np.inf, 1.0, -1.0, 1e7],
               np.float32)
_FB = np.array([3.0, 3.0, -3.0, -3.0, 0.1, 2.0, 2.0, 3.0, -3.0, 0.0, 2.0, np.inf, np.inf, 3.0],
               np.float32)


@pytest.mark.parametrize("dt", ["f32", "f64"])
@pytest.mark.parametrize("dev", DEVICES)
def test_float_remainder_and_floor_division_match_numpy(dev, dt):
    a, b = _FA.astype(dt.replace("f", "float")), _FB.astype(dt.replace("f", "float"))
    n = a.size

    def build(s):
        x, y = s.input("x", (n,), dt), s.input("y", (n,), dt)
        return [x % y, x // y, x.fmod(y), x % 2.5, 7.0 % y, x // 2.0, 7.0 // y,
                divmod(x, y)[0]]

    got = _run(Func("fmodf", build), dev, x=a, y=b)
    with np.errstate(all="ignore"):
        want = [np.remainder(a, b), np.floor_divide(a, b), np.fmod(a, b), a % 2.5, 7.0 % b,
                a // 2.0, 7.0 // b, np.floor_divide(a, b)]
    for k, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(g, w.astype(g.dtype), err_msg=f"output {k}")
    assert got[1][4] == 9.0  # 1.0 // 0.1 is 9 (0.1 is slightly above 1/10), not floor(10.0)


@pytest.mark.parametrize("dt", ["i32", "i64"])
@pytest.mark.parametrize("dev", DEVICES)
def test_integer_remainder_and_floor_division_match_numpy(dev, dt):
    npdt = np.int32 if dt == "i32" else np.int64
    lo = np.iinfo(npdt).min
    hi = np.iinfo(npdt).max
    a = np.array([7, -7, 7, -7, 0, 5, -5, 6, lo, lo, 123456, -1, hi, hi - 6, lo + 1], npdt)
    b = np.array([3, 3, -3, -3, 3, 0, 0, -1, -1, 7, -100, 5, 3, -7, 1], npdt)
    n = a.size

    def build(s):
        x, y = s.input("x", (n,), dt), s.input("y", (n,), dt)
        return [x % y, x // y, x.fmod(y), x % 4, -9 // y, x // -4]

    got = _run(Func("imod", build), dev, x=a, y=b)
    with np.errstate(all="ignore"):
        want = [np.remainder(a, b), np.floor_divide(a, b), np.fmod(a, b), a % 4,
                np.floor_divide(npdt(-9), b), a // -4]
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == npdt
        np.testing.assert_array_equal(g, w, err_msg=f"output {k}")
    # the documented division-by-zero result: 0, as NumPy's integer ops give
    assert got[0][5] == got[1][5] == got[2][5] == 0


@pytest.mark.parametrize("dev", DEVICES)
def test_floor_ceil_round_clip_match_numpy(dev):
    x = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, -0.49, 0.51, 3.7, -3.7, 0.0, 1.25, 2.675,
                  np.inf, -np.inf, np.nan, 1e8 + 0.5], np.float32)
    n = x.size

    def build(s):
        t = s.input("x", (n,))
        i = s.input("i", (3,), "i32")
        return [t.floor(), t.ceil(), t.round(), round(t), t.round(1), t.round(-1),
                t.clip(-1.0, 2.0), t.clip(None, 0.5), t.clip(0.5), i.round(), i.floor(),
                i.clip(0, 1)]

    i = np.array([-3, 0, 4], np.int32)
    got = _run(Func("rnd", build), dev, x=x, i=i)
    want = [np.floor(x), np.ceil(x), np.round(x), np.round(x), np.round(x, 1), np.round(x, -1),
            np.clip(x, -1, 2), np.clip(x, None, 0.5), np.clip(x, 0.5, None), np.round(i),
            np.floor(i), np.clip(i, 0, 1)]
    for k, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(g, w, err_msg=f"output {k}")


def test_rounding_ops_have_zero_derivative_in_every_transform():
    x = np.array([0.3, 1.5, -2.7, 2.0], np.float32)
    f = Func("r", lambda s: (lambda t: (t.floor() + t.ceil() * 2.0 + t.round() * 3.0
                                        + (t // 0.7) + t * 0.5).sum())(s.input("x", (4,))))
    for dev in DEVICES:
        np.testing.assert_array_equal(f.grad("x").run_on(dev, x=x)[0], np.full(4, 0.5))
        _, t = f.jvp("x").run_on(dev, x=x, tangent_x=np.ones(4, np.float32))
        np.testing.assert_allclose(t, 2.0)
    g = Func("v", lambda s: (lambda t: [t.floor(), t.round(), t % 1.5, t // 1.5])(
        s.input("x", (4,)))).vmap("x", 3)
    xb = RNG.uniform(-4, 4, (3, 4)).astype(np.float32)
    for dev in DEVICES:
        got = g.run_on(dev, x=xb)
        for k, w in enumerate([np.floor(xb), np.round(xb), xb % np.float32(1.5),
                               xb // np.float32(1.5)]):
            np.testing.assert_array_equal(got[k], w)


def _fd(fn, x, eps=1e-6):
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        d = np.zeros_like(x)
        d[i] = eps
        g[i] = (fn(x + d) - fn(x - d)) / (2 * eps)
    return g


def test_remainder_gradient_against_finite_differences():
    b = np.array([1.3, -1.3, 0.9, -0.7])
    a = b * np.array([2.4, -1.6, 3.3, 0.55])  # quotients away from integers
    f = Func("m", lambda s: (lambda x, y: ((x % y) * np.array([1.0, 2.0, 3.0, 4.0])).sum()
                             + (x.fmod(y) * 0.5).sum())(s.input("x", (4,), "f64"),
                                                        s.input("y", (4,), "f64")))
    gx, gy = f.grad(["x", "y"]).run_on("interp", x=a, y=b)
    fx = _fd(lambda v: f.run_on("interp", x=v, y=b)[0], a)
    fy = _fd(lambda v: f.run_on("interp", x=a, y=v)[0], b)
    np.testing.assert_allclose(gx, fx, rtol=1e-6)
    np.testing.assert_allclose(gy, fy, rtol=1e-6)
    g32 = f.grad(["x", "y"]).run_on("cpu", x=a, y=b)
    np.testing.assert_allclose(g32[0], gx, rtol=1e-6)
    np.testing.assert_allclose(g32[1], gy, rtol=1e-6)


# ---------------------------------------------------------------- item 2: indexing

X = np.arange(4 * 5 * 6, dtype=np.float32).reshape(4, 5, 6)
KEYS = {
    "int_list": lambda: [0, 3, -1, 3],
    "nd_array": lambda: np.array([[0, 1], [-4, 2]]),
    "scalar_array": lambda: np.array(2),
    "two_arrays": lambda: (np.array([0, 3, -1]), np.array([4, 0, -2])),
    "two_arrays_broadcast": lambda: (np.array([[0], [3]]), np.array([1, 2, -1])),
    "slice_then_array": lambda: (slice(None), [4, 0, 0]),
    "slice_then_two": lambda: (slice(1, 3), [4, 0], [5, -6]),
    "int_and_array": lambda: (1, slice(None), [0, 5]),
    "array_int": lambda: ([0, 2], 3),
    "separated_arrays": lambda: ([0, 2], slice(None), [1, 5]),
    "ellipsis_array": lambda: (Ellipsis, [5, 0, 1]),
    "none_and_array": lambda: (None, [1, 2], None),
    "array_slice_step": lambda: ([3, 1], slice(None, None, -2), slice(4, 1, -1)),
    "mask": lambda: X[:, :, 0] % 3 == 0,
    "mask_1d_then_slice": lambda: (np.array([True, False, True, True]), slice(1, 3)),
    "mask_middle": lambda: (slice(None), np.array([False, True, True, False, True])),
    "neg_step": lambda: (slice(None, None, -1),),
    "neg_step_ranges": lambda: (slice(3, 0, -2), slice(5, 1, -2), slice(None, None, -3)),
    "neg_step_empty": lambda: (slice(1, 3, -1),),
    "basic": lambda: (1, slice(1, 4), None, -1),
}


@pytest.mark.parametrize("form", sorted(KEYS))
@pytest.mark.parametrize("dev", DEVICES)
def test_indexing_with_constant_keys_matches_numpy(dev, form):
    key = KEYS[form]()
    f = Func("ix", lambda s: s.input("x", X.shape)[key])
    got = _run(f, dev, x=X)[0]
    want = X[key]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


RUNTIME = {  # name -> (index shapes, numpy values, key builder)
    "one": ([(2, 3)], [np.array([[0, -1, 2], [3, 3, -4]])], lambda x, i: x[i]),
    "axis1": ([(4,)], [np.array([4, -5, 0, 4])], lambda x, i: x[:, i]),
    "two": ([(3,), (2, 1)], [np.array([0, -1, 2]), np.array([[5], [-6]])],
            lambda x, i, j: x[j % 4, :, i]),
    "with_const": ([(3,)], [np.array([0, -2, 4])], lambda x, i: x[[1, -1, 0], i]),
    "take": ([(5,)], [np.array([-1, 0, 5, -6, 2])], lambda x, i: x.take(i, axis=2)),
}


@pytest.mark.parametrize("dt", ["i32", "i64"])
@pytest.mark.parametrize("form", sorted(RUNTIME))
@pytest.mark.parametrize("dev", DEVICES)
def test_indexing_with_runtime_index_tensors_matches_numpy(dev, form, dt):
    shapes, vals, fn = RUNTIME[form]
    names = [f"i{k}" for k in range(len(shapes))]
    f = Func("rix", lambda s: fn(s.input("x", X.shape),
                                *[s.input(n, sh, dt) for n, sh in zip(names, shapes)]))
    npdt = np.int32 if dt == "i32" else np.int64
    got = _run(f, dev, x=X, **{n: v.astype(npdt) for n, v in zip(names, vals)})[0]
    want = fn(X, *vals) if form != "take" else np.take(X, vals[0], axis=2)
    np.testing.assert_array_equal(got, want)


def test_flip_matches_numpy():
    f = Func("fl", lambda s: (lambda x: [x.flip(), x.flip(1), x.flip((0, 2)), x[::-1, ::-2]])(
        s.input("x", X.shape)))
    want = [np.flip(X), np.flip(X, 1), np.flip(X, (0, 2)), X[::-1, ::-2]]
    for dev in DEVICES:
        for g, w in zip(_run(f, dev, x=X), want):
            np.testing.assert_array_equal(g, w)


GRAD_FORMS = {
    "repeated": lambda x, i: x[[0, 2, 2, -1, 0, 0]],
    "two_arrays_repeated": lambda x, i: x[[0, 0, 1, -1], [2, 2, -1, 2]],
    "slice_array": lambda x, i: x[:, [3, 3, 0]],
    "mask": lambda x, i: x[np.array([[True, False, True, False], [True, True, False, False],
                                     [False, False, False, True]])],
    "neg_step": lambda x, i: x[::-1, 3:0:-2],
    "flip": lambda x, i: np.flip(x, 1) if isinstance(x, np.ndarray) else x.flip(1),
    "runtime": lambda x, i: x[i, 1:],
    "runtime_two": lambda x, i: x[i, i + 1],
}


@pytest.mark.parametrize("form", sorted(GRAD_FORMS))
def test_indexing_gradients_against_finite_differences(form):
    """Gradients accumulate over repeated indices (scatter_add); float64 FD on interp, and
    the compiled gradient equals the interpreter's."""
    x0 = RNG.normal(size=(3, 4))
    idx = np.array([2, -1, 0, 2, -3])
    w = RNG.uniform(0.5, 1.5, size=GRAD_FORMS[form](x0, idx).shape)

    def build(s):
        x = s.input("x", (3, 4), "f64")
        i = s.input("i", (5,), "i32")
        return ((GRAD_FORMS[form](x, i) * w) ** 2.0).sum()

    f = Func("gi", build)
    i32 = idx.astype(np.int32)
    (g,) = f.grad("x").run_on("interp", x=x0, i=i32)
    fd = _fd(lambda v: f.run_on("interp", x=v, i=i32)[0], x0)
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8)
    (gc,) = f.grad("x").run_on("cpu", x=x0, i=i32)
    np.testing.assert_allclose(gc, g, rtol=1e-12)


@pytest.mark.parametrize("dev", DEVICES)
def test_out_of_range_runtime_index_names_the_indexing(dev):
    def build(s):
        x = s.param("w", (5, 3))
        return x[s.input("i", (4,), "i32")].sum()

    f = Func("oob", build).with_param("w", np.ones((5, 3), np.float32))
    ok = np.array([0, -1, 4, -5], np.int32)
    np.testing.assert_allclose(f.run_on(dev, i=ok)[0], 12.0)
    for bad in (5, -6):
        i = np.array([0, bad, 1, 1], np.int32)
        msg = r"x\[\.\.\.\] with x of shape \(5, 3\), index array on axis 0.*\[0, 5\)"
        with pytest.raises(IndexError, match=msg):
            f.run_on(dev, i=i)
        # the gradient alone runs only the backward's scatter_add: it names the indexing too
        with pytest.raises(IndexError, match=msg) as e:
            f.grad("w").run_on(dev, i=i)
        assert not str(e.value).startswith("rlx.scatter_add")
    g = Func("oob2", lambda s: s.input("x", (5, 3))[s.input("i", (2,), "i32"),
                                                     s.input("j", (2,), "i32")])
    x = np.zeros((5, 3), np.float32)
    with pytest.raises(IndexError, match=r"index array on axis 1.*\[0, 3\)"):
        g.run_on(dev, x=x, i=np.array([0, 1], np.int32), j=np.array([0, 3], np.int32))


def test_constant_out_of_range_and_bad_keys_raise_at_trace_time():
    def ix(key, shape=(5, 3)):
        return Func("k", lambda s: s.input("x", shape)[key])

    with pytest.raises(IndexError, match="index 5 is out of bounds for axis 0 with size 5"):
        ix([0, 5])
    with pytest.raises(IndexError, match="index -4 is out of bounds for axis 1 with size 3"):
        ix((slice(None), np.array([-4])))
    with pytest.raises(IndexError, match="too many indices"):
        ix((0, 0, 0))
    with pytest.raises(IndexError, match="boolean mask of shape"):
        ix(np.array([True, False]))
    with pytest.raises(TypeError, match="integer or bool"):
        ix(np.array([0.5]))
    with pytest.raises(TypeError, match="integer"):
        Func("k", lambda s: s.input("x", (5,))[s.input("f", (2,))])


def test_traced_mask_index_is_a_clear_error():
    with pytest.raises(TypeError, match="boolean mask Tensor.*static mask"):
        Func("m", lambda s: (lambda x: x[x > 0])(s.input("x", (5,))))
    # a mask Tensor that is a constant is static
    m = np.array([True, False, True, True, False])
    f = Func("mc", lambda s: s.input("x", (5,))[s.constant(m)])
    x = np.arange(5, dtype=np.float32)
    np.testing.assert_array_equal(f.run_on("interp", x=x)[0], x[m])


# ---------------------------------------------------------------- item 3: pow at 0

@pytest.mark.parametrize("dev", DEVICES)
def test_pow_derivative_at_zero_base(dev):
    x = np.array([0.0, -2.0, 1.5, -1.0], np.float32)
    f = Func("p", lambda s: (lambda t: [t ** 0.0, t ** 1.0, t ** 3.0, t ** 4, t ** 1])(
        s.input("x", (4,))))
    want = [np.zeros(4), np.ones(4), 3 * x ** 2, 4 * x ** 3, np.ones(4)]
    for k, w in enumerate(want):
        loss = Func("l", lambda s, k=k: [t.sum() for t in f_outs(s)][k])
        (g,) = loss.grad("x").run_on(dev, x=x)
        np.testing.assert_allclose(g, w, rtol=1e-6, err_msg=f"vjp of output {k}")
        _, t = loss.jvp("x").run_on(dev, x=x, tangent_x=np.ones(4, np.float32))
        np.testing.assert_allclose(t, w.sum(), rtol=1e-6, err_msg=f"jvp of output {k}")
    assert all(np.isfinite(o).all() for o in f.run_on(dev, x=x))


def f_outs(s):
    t = s.input("x", (4,))
    return [t ** 0.0, t ** 1.0, t ** 3.0, t ** 4, t ** 1]


@pytest.mark.parametrize("dev", DEVICES)
def test_pow_runtime_exponent_zero_at_zero_base(dev):
    f = Func("pz", lambda s: (s.input("x", (3,)) ** s.input("z", (3,))).sum())
    x = np.array([0.0, 0.0, -2.0], np.float32)
    z = np.array([0.0, 1.0, 3.0], np.float32)
    (g,) = f.grad("x").run_on(dev, x=x, z=z)
    np.testing.assert_allclose(g, [0.0, 1.0, 12.0])


# ---------------------------------------------------------------- item 6: bool/int outputs

@pytest.mark.parametrize("out,kind", [(lambda x: x > 0, "boolean"),
                                      (lambda x: x.cast("i32"), "integer")])
def test_grad_of_a_boolean_or_integer_output_says_why(out, kind):
    f = Func("b", lambda s: out(s.input("x", (3,))))
    with pytest.raises(TypeError, match=rf"output 0 is a {kind} .* not differentiable: its "
                                        r"values are piecewise constant"):
        f.grad("x")


# ---------------------------------------------------------------- item 7: kinks

KINKS = {  # the README table "Derivatives at kinks": op -> (build, x, derivative)
    "abs": (lambda t: t.abs(), [0.0, -1.0, 2.0], [0.0, -1.0, 1.0]),
    "relu": (lambda t: t.relu(), [0.0, -1.0, 2.0], [0.0, 0.0, 1.0]),
    "sign": (lambda t: t.sign(), [0.0, -1.0, 2.0], [0.0, 0.0, 0.0]),
    "round": (lambda t: t.round(), [0.5, 1.5, 0.2], [0.0, 0.0, 0.0]),
    "floor": (lambda t: t.floor(), [1.0, -1.0, 0.5], [0.0, 0.0, 0.0]),
    "ceil": (lambda t: t.ceil(), [1.0, -1.0, 0.5], [0.0, 0.0, 0.0]),
    "maximum_tie": (lambda t: t.maximum(1.0), [1.0, 0.0, 2.0], [0.5, 0.0, 1.0]),
    "minimum_tie": (lambda t: t.minimum(1.0), [1.0, 0.0, 2.0], [0.5, 1.0, 0.0]),
    "max_reduce_tie": (lambda t: t.max() * 3.0, [2.0, 2.0, 1.0], [1.5, 1.5, 0.0]),
    "clip_at_bound": (lambda t: t.clip(0.0, 1.0), [0.0, 1.0, 0.5], [0.5, 0.5, 1.0]),
    "sqrt_at_0": (lambda t: t.sqrt(), [0.0, 1.0, 4.0], [np.inf, 0.5, 0.25]),
}


@pytest.mark.parametrize("name", sorted(KINKS))
@pytest.mark.parametrize("dev", DEVICES)
def test_subgradients_at_kinks_follow_the_documented_table(dev, name):
    build, x, want = KINKS[name]
    f = Func("k", lambda s: build(s.input("x", (3,))).sum())
    x = np.array(x, np.float32)
    (g,) = f.grad("x").run_on(dev, x=x)
    np.testing.assert_array_equal(g, np.array(want, np.float32))
    _, t = f.jvp("x").run_on(dev, x=x, tangent_x=np.ones(3, np.float32))
    if np.isfinite(want).all():
        np.testing.assert_allclose(t, np.sum(want), rtol=1e-6)


def test_readme_documents_the_kink_table():
    import pathlib

    text = (pathlib.Path(__file__).parent.parent / "README.md").read_text()
    assert "Derivatives at kinks" in text
    for op in ("abs", "relu", "sign", "round", "floor", "maximum", "clip"):
        assert f"`{op}" in text.split("Derivatives at kinks")[1][:3000], op


# ---------------------------------------------------------------- issue 13 item 19: splats

def test_scalar_operands_never_build_full_size_arrays_while_tracing():
    tracemalloc.start()
    try:
        t0 = time.perf_counter()
        f = Func("big", lambda s: (lambda x: [x * 2.0, (x > 0.5).where(x, 0.0), 1.0 - x,
                                              x.clip(0, 1)])(s.input("x", (8192, 8192))))
        f.trace_hash()
        f.module  # the rlx module too: the constants are rank-0
        dt = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20e6, f"tracing allocated {peak / 1e6:.0f} MB (a (8192, 8192) f32 is 268 MB)"
    assert dt < 5.0


def test_grad_of_a_large_function_builds_no_full_size_constants():
    f = Func("bigg", lambda s: (s.input("x", (8192, 8192)) * 2.0).relu().sum())
    f.module
    tracemalloc.start()
    try:
        g = f.grad("x")  # seeds, zeros and the relu mask's constants are splats
        g.module
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 50e6, f"grad allocated {peak / 1e6:.0f} MB"


def test_huge_comparison_traces_fast():
    t0 = time.perf_counter()
    f = Func("huge", lambda s: (s.input("x", (65536, 32768)) > 0.0).cast("f32").sum())
    f.module
    assert time.perf_counter() - t0 < 5.0


def test_impossible_size_names_the_op():
    with pytest.raises(ShapeError, match=r"rlx.broadcast_to: a tensor of shape \(1099511627776, "
                                         r"1099511627776\) f32 would hold"):
        Func("imp", lambda s: s.input("x", (2 ** 40, 1)) * s.input("y", (1, 2 ** 40)))
    with pytest.raises(ShapeError, match=r"input 'x': a tensor of shape"):
        Func("imp2", lambda s: s.input("x", (2 ** 40, 2 ** 40)))


# ---------------------------------------------------------------- issue 13 item 20: logsumexp

@pytest.mark.parametrize("dev", DEVICES)
def test_logsumexp_with_infinite_rows(dev):
    inf = np.inf
    x = np.array([[1.0, inf, 0.0], [-inf, -inf, -inf], [-inf, 1.0, 2.0], [1.0, 2.0, 3.0]],
                 np.float32)
    f = Func("lse", lambda s: s.input("x", (4, 3)).logsumexp(1))
    got = f.run_on(dev, x=x)[0]
    assert got[0] == inf and got[1] == -inf
    ref = np.log(np.exp(x[2:].astype(np.float64)).sum(1))
    np.testing.assert_allclose(got[2:], ref, rtol=1e-6)
    # gradients: rows with finite values (some -inf included) stay finite: softmax weights
    g = Func("lseg", lambda s: (s.input("x", (4, 3)).logsumexp(1)
                                * np.array([0.0, 0.0, 1.0, 1.0], np.float32)).sum())
    xs = x.copy()
    xs[0, 1], xs[1] = 1.0, 0.0   # the special rows get weight 0 but still run
    (gx,) = g.grad("x").run_on(dev, x=xs)
    assert np.isfinite(gx).all()
    e = np.exp(xs[2:].astype(np.float64))
    np.testing.assert_allclose(gx[2:], e / e.sum(1, keepdims=True), rtol=1e-6, atol=1e-7)
    (gi,) = g.grad("x").run_on(dev, x=x)
    assert np.isfinite(gi[2:]).all()


def test_new_ops_compile_for_the_gpu():
    """floor/ceil/round/rem (float and integer), masks' | and indexing lower to PTX
    (rows of the shared table, lowering/shared/scalar.py); assembled by ptxas when one is
    installed."""
    from rlxc.lowering.gpu import driver as gpu_kernels
    from rlxc.lowering.gpu import nvptx

    def build(s):
        x, y = s.input("x", (64,)), s.input("y", (64,))
        xi, yi = x.cast("i32"), y.cast("i64")
        return [x % y, x // y, x.round(), x.floor(), x.ceil(), xi % yi.cast("i32"),
                yi // xi.cast("i64"), (x > 0) | (y > 0), x[s.input("i", (3,), "i32")], x[::-2]]

    art = gpu_kernels.compile_cuda(Func("g", build).module, ptxas=nvptx.find_ptxas() or False)
    for ins in ("cvt.rmi.f32.f32", "cvt.rpi.f32.f32", "cvt.rni.f32.f32", "rem.s32", "rem.s64"):
        assert ins in art.ptx, ins

"""The small-op call path (runtime/call.py fast_runner, used by Jitted.run): the common
call of a jitted function with bound params runs one generated straight-line function.
It must give the general path's results (an HVP like benchmarks/compare.py W6 at
awkward sizes, against NumPy), hand every other call to the general path unchanged
(conversions, named inputs, errors), keep per-thread frames, and raise the library's
errors."""
import threading

import numpy as np
import pytest

from rlxc import Func


def _hvp(n, seed=0):
    rng = np.random.default_rng(seed)
    W = (rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32)

    def build(s):
        return (s.param("W", (n, n)) @ s.input("x", (n,))).tanh().sum()
    return W, Func(f"w6fc_{n}", build).with_param("W", W).hvp(["x"]).jit()


def _ref(W, x, v):
    W, x, v = (a.astype(np.float64) for a in (W, x, v))
    t = np.tanh(W @ x)
    g = 1.0 - t * t
    wv = W @ v
    return [t.sum(), W.T @ g, (g * wv).sum(), W.T @ (-2.0 * t * g * wv)]


@pytest.mark.parametrize("n", [1, 7, 255, 257])
def test_fast_path_hvp_matches_numpy(n):
    W, j = _hvp(n)
    assert j._fast is not None
    rng = np.random.default_rng(n)
    for _ in range(3):
        x = rng.standard_normal(n).astype(np.float32)
        v = rng.standard_normal(n).astype(np.float32)
        fast = j._fast((x, v))
        assert fast is not None                     # the shortcut was taken
        got = j.run(x, v)
        slow = j.run(x=x, tangent_x=v)              # named: the general path
        for a, b, r in zip(fast, got, _ref(W, x, v)):
            assert a.dtype == np.float32 and a.shape == np.shape(r)
            np.testing.assert_allclose(a, r, rtol=2e-4, atol=2e-5)
            np.testing.assert_array_equal(a, b)
        for a, b in zip(got, slow):
            np.testing.assert_array_equal(a, b)


def test_fast_path_declines_what_it_does_not_check():
    W, j = _hvp(7)
    x = np.linspace(-1, 1, 7, dtype=np.float32)
    v = np.ones(7, np.float32)
    want = j.run(x, v)
    declined = [(x.astype(np.float64), v),                  # dtype
                (x.reshape(7, 1), v),                       # shape
                (np.linspace(-1, 1, 14, dtype=np.float32)[::2], v),  # strided
                (x.tolist(), v),                            # not an ndarray
                (x,), (x, v, v)]                            # count
    for args in declined:
        assert j._fast(args) is None
    # ... and the general path still converts or rejects them as before
    np.testing.assert_array_equal(j.run(x.astype(np.float64), v)[-1], want[-1])
    np.testing.assert_array_equal(j.run(x.tolist(), v)[-1], want[-1])
    with pytest.raises(Exception, match="'x'.*expects shape"):
        j.run(np.zeros(6, np.float32), v)
    with pytest.raises(TypeError, match="positional inputs"):
        j.run(x, v, v)
    # a param given by name at call time overrides the bound one (general path)
    got = j.run(x=x, tangent_x=v, W=np.zeros((7, 7), np.float32))
    np.testing.assert_array_equal(got[-1], np.zeros(7, np.float32))
    np.testing.assert_array_equal(j.run(x, v)[-1], want[-1])   # bound pointers restored


def test_fast_path_outputs_are_fresh_and_threads_have_own_frames():
    W, j = _hvp(33)
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(33).astype(np.float32) for _ in range(4)]
    v = np.ones(33, np.float32)
    first = j.run(xs[0], v)
    second = j.run(xs[1], v)
    assert all(a is not b and not np.shares_memory(a, b) for a, b in zip(first, second))
    want = [j.run(x, v)[-1] for x in xs]
    bad = []

    def work(k):
        for _ in range(200):
            if not np.array_equal(j.run(xs[k], v)[-1], want[k]):
                bad.append(k)
    ts = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not bad


def test_fast_path_raises_the_library_error():
    j = Func("w6fc_take", lambda s: s.input("x", (4,))[s.input("i", (2,), "i32")]).jit()
    x = np.arange(4, dtype=np.float32)
    ok = np.array([3, 0], np.int32)
    assert j._fast((x, ok)) is not None
    with pytest.raises(IndexError, match="index out of range"):
        j._fast((x, np.array([1, 9], np.int32)))
    with pytest.raises(IndexError, match="index out of range"):
        j.run(x, np.array([1, 9], np.int32))
    np.testing.assert_array_equal(j.run(x, ok)[0], [3, 0])


def test_no_fast_path_without_bound_params():
    def build(s):
        return s.param("w", (3,)) * s.input("x", (3,))
    f = Func("w6fc_unbound", build)
    j = f.jit()
    assert j._fast is None
    x = np.ones(3, np.float32)
    np.testing.assert_array_equal(j.run(x=x, w=np.full(3, 2, np.float32))[0], [2, 2, 2])


def test_fast_path_without_inputs_and_with_scalar_inputs():
    w = np.arange(5, dtype=np.float32)
    j = Func("w6fc_noin", lambda s: s.param("w", (5,)) * 3.0).with_param("w", w).jit()
    assert j._fast(()) is not None
    np.testing.assert_array_equal(j.run()[0], 3 * w)
    k = Func("w6fc_scalar", lambda s: s.param("w", (5,)) * s.input("a", ())).with_param("w", w).jit()
    np.testing.assert_array_equal(k._fast((np.array(2, np.float32),))[0], 2 * w)
    assert k._fast((np.float32(2),)) is None          # a NumPy scalar: the general path
    np.testing.assert_array_equal(k.run(np.float32(2))[0], 2 * w)
    np.testing.assert_array_equal(k.run(2.0)[0], 2 * w)

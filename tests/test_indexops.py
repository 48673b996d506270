"""Issue 15: argmax/argmin, cumsum, topk, one_hot, and rlxc.random (Philox) with dropout.

NumPy references run everywhere (CI); torch references run where torch is installed.
Each check runs on the interpreter, the CPU and the GPU emulator (the real GPU plan,
emulated kernels); the per-op table rows in tests/opcases.py cover PTX + ptxas.
"""
from __future__ import annotations

import numpy as np
import pytest

import philox_ref
import rlxc
from rlxc.dialect.philox import philox4x32, philox_uniform
from rlxc.lowering.gpu.emu import emulate
from rlxc.runtime.errors import ShapeError
from test_autodiff import check_vjp, float_args, grad_module

RNG = np.random.default_rng(150)


def _all(f, **inputs):
    """Outputs on the interpreter, the CPU and the GPU emulator (all three returned)."""
    names = f.input_names()
    return (f.run_on("interp", **inputs), f.run_on("cpu", **inputs),
            emulate(f.module, [inputs[n] for n in names]))


def _same(outs, rtol=0.0, atol=0.0):
    ref = outs[0]
    for got in outs[1:]:
        for a, b in zip(got, ref):
            assert a.dtype == b.dtype and a.shape == b.shape
            if rtol or atol:
                np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
            else:
                np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------- Philox generator

def test_philox_known_answers_three_implementations():
    """Random123's KAT vectors: the pure-Python reference, the NumPy rule and, through
    rlx.philox on every backend, the LLVM rule give the published words."""
    for ctr, key, want in philox_ref.KAT:
        assert tuple(philox_ref.philox4x32_10(ctr, key)) == want
        assert tuple(int(w) for w in philox4x32(*key, *ctr)) == want
    # the compiled rule: counter (i, stream, 0, 0) with the first KAT key; bits via the
    # uniform's top 24 bits, compared with the reference at 64 counters and 4 words
    key = np.array([0xA4093822, 0x299F31D0], np.uint32)

    def build(s):
        k = s.input("key", (2,), "u32")
        return [rlxc.random.uniform(k, (8, 8), stream=0x85A308D3)] + [
            s.emit("rlx.philox", [k[0].broadcast_to((64,)), k[1].broadcast_to((64,)),
                                  s.constant(np.arange(64), "i32")], word=w, stream=7)
            for w in range(4)]
    outs = _all(rlxc.Func("kat", build), key=key)
    _same(outs)
    for w in range(4):
        want = [philox_ref.philox4x32_10((i, 7, 0, 0), tuple(int(k) for k in key))[w] >> 8
                for i in range(64)]
        np.testing.assert_array_equal(outs[1][1 + w] * 2.0 ** 24, want)
    np.testing.assert_array_equal(outs[1][0], philox_ref.uniform(key, (8, 8), stream=0x85A308D3))


def test_uniform_normal_statistics_and_backends_agree():
    key = np.array([2026, 15], np.uint32)

    def build(s):
        k = s.input("key", (2,), "u32")
        return [rlxc.random.uniform(k, (64, 100)), rlxc.random.normal(k, (64, 100)),
                rlxc.random.uniform(k, (3,), minval=-2.0, maxval=2.0, stream=1),
                rlxc.random.uniform(k, (3,), dtype="f64")]
    outs = _all(rlxc.Func("stats", build), key=key)
    for got in outs[1:]:      # the uniforms: the same bits everywhere; the normals: the
        for j in (0, 2, 3):   # same bits through log/cos (NumPy vs mathlib: within 2 ulp)
            np.testing.assert_array_equal(got[j], outs[0][j])
        np.testing.assert_allclose(got[1], outs[0][1], rtol=1e-6, atol=1e-6)
    u, z, u2, u64 = outs[1]
    assert u.dtype == np.float32 and 0 <= u.min() and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.01 and abs(u.std() - np.sqrt(1 / 12)) < 0.01
    assert abs(z.mean()) < 0.04 and abs(z.std() - 1) < 0.03
    assert ((u2 >= -2) & (u2 < 2)).all() and u64.dtype == np.float64
    # different keys, different streams: different draws
    assert not np.array_equal(outs[1][0].reshape(-1)[:3], u2)
    other = rlxc.Func("stats", build).run_on("cpu", key=np.array([2026, 16], np.uint32))[0]
    assert np.mean(other == u) < 0.01


def test_dropout_mask_grad_and_vmap_over_keys():
    """Grad through dropout uses the forward's mask; vmap over a batch of keys gives each
    key's unbatched draw; the kept fraction is 1 - p."""
    p = 0.3
    x = RNG.normal(size=(16, 32)).astype(np.float32)
    f = rlxc.Func("drop", lambda s: (s.input("x", (16, 32)).dropout(
        p, s.input("key", (2,), "u32")) * 2.0).sum())
    key = np.array([7, 99], np.uint32)
    mask = philox_ref.uniform(key, (16, 32)) >= p
    assert abs(mask.mean() - (1 - p)) < 0.06
    g = f.grad("x")
    for outs in _all(g, x=x, key=key):
        np.testing.assert_allclose(outs[0], np.where(mask, 2.0 / (1 - p), 0.0), rtol=1e-6)
    y = rlxc.Func("y", lambda s: s.input("x", (16, 32)).dropout(p, s.input("key", (2,), "u32")))
    keys = np.array([[7, 99], [1, 2], [7, 100]], np.uint32)
    vb = y.vmap(["key"], 3)
    for outs in _all(vb, x=x, key=keys):
        for b in range(3):
            want = np.where(philox_ref.uniform(keys[b], (16, 32)) >= p, x / (1 - p), 0)
            np.testing.assert_allclose(outs[0][b], want, rtol=1e-6)


def test_dropout_fd_and_grad_of_grad():
    key = np.array([5, 6], np.uint32)

    def build(s):
        x = s.input("x", (3, 4))
        return (x.dropout(0.4, s.constant(key, "u32")) * x).sin().sum()
    m = rlxc.Func("dfd", build).module
    x = RNG.uniform(-1, 1, (3, 4))
    check_vjp(m, [x], rtol=1e-5, atol=1e-6)
    check_vjp(grad_module(m, float_args(m)), [x], float_args(m), rtol=1e-5, atol=1e-5)


def test_random_errors():
    s = rlxc.GraphScope()
    k = s.input("k", (2,), "u32")
    f32 = s.input("f", (2,))
    with pytest.raises(TypeError, match="u32 tensor of shape"):
        rlxc.random.uniform(f32, (3,))
    with pytest.raises(TypeError, match="u32 tensor of shape"):
        rlxc.random.normal(s.input("k3", (3,), "u32"), (3,))
    with pytest.raises(TypeError, match="random keys"):
        k + k
    with pytest.raises(TypeError, match="random keys"):
        k.sum()
    with pytest.raises(TypeError, match="cast to u32|only i32/i64"):
        f32.cast("u32")
    with pytest.raises(ValueError, match="dropout: probability"):
        f32.dropout(1.5, k)
    with pytest.raises(TypeError, match="dropout: expects a float"):
        k.cast("i32").dropout(0.5, k)
    with pytest.raises(TypeError, match="dtype must be f32 or f64"):
        rlxc.random.uniform(k, (2,), dtype="i32")
    f = rlxc.Func("u", lambda s: rlxc.random.uniform(s.input("key", (2,), "u32"), (4,)))
    with pytest.raises(ValueError, match="do not fit in u32"):
        f.run(key=np.array([-1, 3]))
    with pytest.raises(TypeError, match="expects integers"):
        f.run(key=np.array([1.0, 3.0]))
    assert f.run(key=[1, 3])[0].shape == (4,)          # Python ints are fine


def test_u32_key_through_compiled_module(tmp_path):
    """The u32 dtype crosses the artifact boundary: the header names it, the loader
    checks it, and the draws match the interpreter."""
    f = rlxc.Func("keyed", lambda s: rlxc.random.normal(s.input("key", (2,), "u32"), (5,)))
    out = f.run_on("cpu", key=np.array([4, 2], np.uint32))[0]
    np.testing.assert_allclose(out, f.run_on("interp", key=np.array([4, 2], np.uint32))[0],
                               rtol=1e-6, atol=1e-6)
    assert f.signature()[0].dtype == "u32"
    assert "ui32" in f.mlir() and "rlx.philox" in f.mlir()
    g = rlxc.Func.from_mlir(f.mlir())                 # the printed op parses back
    np.testing.assert_allclose(g.run_on("interp", key=np.array([4, 2], np.uint32))[0], out,
                               rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- argmax / argmin / one_hot

def test_argmax_argmin_ties_nan_ints():
    x = np.array([[1, 3, 3, -2, np.nan, 9, np.nan], [2, 2, 2, 2, 2, 2, 2],
                  [-np.inf, -np.inf, 0, 5, 5, -1, 0], [np.inf, 1, np.inf, 0, -5, -5, 0]],
                 np.float32)
    n = np.array([[3, 1, 3], [-7, 8, 8]], np.int64)

    def build(s):
        t, i = s.input("x", x.shape), s.input("n", n.shape, "i64")
        return [t.argmax(1), t.argmin(1), t.argmax(0, keepdims=True), t.argmin(),
                i.argmax(1), i.argmin(0), rlxc.argmax(t, -1), i.argmax(keepdims=True)]
    outs = _all(rlxc.Func("am", build), x=x, n=n)
    _same(outs)
    want = [np.argmax(x, 1), np.argmin(x, 1), np.argmax(x, 0)[None], np.argmin(x),
            np.argmax(n, 1), np.argmin(n, 0), np.argmax(x, -1), np.argmax(n, keepdims=True)]
    for got, w in zip(outs[1], want):
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, w)


def test_one_hot_and_errors():
    i = np.array([[0, 4, 2], [-1, 5, 3]], np.int32)
    f = rlxc.Func("oh", lambda s: [s.input("i", (2, 3), "i32").one_hot(5),
                                   rlxc.one_hot(s.input("j", (4,), "i64"), 3, dtype="i32")])
    j = np.array([2, 0, 1, 7])
    outs = _all(f, i=i, j=j)
    _same(outs)
    np.testing.assert_array_equal(outs[1][0], (i[..., None] == np.arange(5)).astype(np.float32))
    np.testing.assert_array_equal(outs[1][1], (j[:, None] == np.arange(3)).astype(np.int32))
    s = rlxc.GraphScope()
    x = s.input("x", (3, 4))
    with pytest.raises(TypeError, match="one_hot: expects an integer"):
        x.one_hot(3)
    with pytest.raises(ShapeError, match="argmax: axis 2 out of range"):
        x.argmax(2)
    with pytest.raises(ShapeError, match="argmin: axis 1 of .* is empty"):
        s.input("e", (3, 0)).argmin(1)
    with pytest.raises(TypeError, match="argmax: expects a f32/f64/i32/i64"):
        x.gt(0).argmax(0)
    with pytest.raises(TypeError, match="axis must be one integer"):
        x.argmax((0, 1))
    with pytest.raises(ShapeError, match="topk: k = 5 out of range"):
        x.topk(5)
    with pytest.raises(ShapeError, match="topk: k = 0 out of range"):
        x.topk(0, axis=0)
    with pytest.raises(ShapeError, match="cumsum: axis -3 out of range"):
        x.cumsum(-3)
    with pytest.raises(TypeError, match="cumsum: expects"):
        x.gt(0).cumsum(0)


# ---------------------------------------------------------------- cumsum / topk

CUMSUM_SHAPES = [((1,), 0), ((2,), 0), ((13,), 0), ((4, 9), 1), ((9, 4), 0), ((2, 3, 17), 1),
                 ((2, 33, 3), 1), ((3, 1, 64), -1)]


def test_cumsum_numpy_random_shapes():
    arrays = {f"x{k}": RNG.uniform(-1, 1, shp).astype(np.float32)
              for k, (shp, _) in enumerate(CUMSUM_SHAPES)}
    ints = RNG.integers(-1000, 1000, (5, 40)).astype(np.int32)

    def build(s):
        outs = [s.input(f"x{k}", shp).cumsum(ax) for k, (shp, ax) in enumerate(CUMSUM_SHAPES)]
        t = s.input("n", ints.shape, "i32")
        return outs + [t.cumsum(1), rlxc.cumsum(s.input("d", (3, 5), "f64"), None)]
    d = RNG.normal(size=(3, 5))
    outs = _all(rlxc.Func("cs", build), **arrays, n=ints, d=d)
    _same(outs, rtol=1e-6, atol=1e-6)
    for k, (shp, ax) in enumerate(CUMSUM_SHAPES):
        want = np.cumsum(arrays[f"x{k}"].astype(np.float64), ax)
        np.testing.assert_allclose(outs[1][k], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(outs[1][-2], np.cumsum(ints, 1))
    np.testing.assert_allclose(outs[1][-1], np.cumsum(d), rtol=1e-12)


# float32 axes longer than 8 * SCAN_BLOCK: blocks (indexops._blocked_cumsum), padded
# (65, 1000) or whole (1024), first, middle and last axes, a recursion over the block totals
LONG_CUMSUM = [((65,), 0), ((3, 1000), 1), ((2, 130, 3), 1), ((300, 2), 0), ((1024,), 0),
               ((5000,), 0)]


def test_blocked_cumsum_matches_numpy_everywhere():
    from rlxc import indexops

    assert all(n > 8 * indexops.SCAN_BLOCK for (shp, ax) in LONG_CUMSUM for n in [shp[ax]])
    arrays = {f"x{k}": RNG.uniform(-1, 1, shp).astype(np.float32)
              for k, (shp, _) in enumerate(LONG_CUMSUM)}
    f = rlxc.Func("lcs", lambda s: [s.input(f"x{k}", shp).cumsum(ax)
                                    for k, (shp, ax) in enumerate(LONG_CUMSUM)])
    for outs in _all(f, **arrays):
        for k, (shp, ax) in enumerate(LONG_CUMSUM):
            x = arrays[f"x{k}"].astype(np.float64)
            want = np.cumsum(x, ax)
            bound = 4 * 2.0 ** -24 * np.cumsum(np.abs(x), ax)    # a few roundings of the terms
            assert outs[k].shape == shp and outs[k].dtype == np.float32
            assert np.all(np.abs(outs[k] - want) <= bound + 1e-30), (shp, ax)


def test_blocked_cumsum_infinities_and_nan_propagate_forward_only():
    """IEEE order: the running sum is finite before the first non-finite element, +-inf after
    an inf, NaN after a NaN or after both infinities (a triangle-of-ones matmul would put
    inf * 0 = NaN before an inf inside its block)."""
    n = 203
    rows = np.ones((6, n), np.float32)
    rows[0, 50] = np.inf
    rows[1, 97], rows[1, 98] = -np.inf, 2.0
    rows[2, 64] = np.nan
    rows[3, 7], rows[3, 150] = np.inf, -np.inf
    rows[4, 0], rows[4, n - 1] = np.nan, np.inf
    rows[5, 33], rows[5, 34], rows[5, 35] = np.inf, np.inf, np.inf
    f = rlxc.Func("lci", lambda s: s.input("x", (6, n)).cumsum(1))
    with np.errstate(invalid="ignore"):
        want = np.cumsum(rows, 1)
    for got in _all(f, x=rows):
        np.testing.assert_array_equal(got[0], want)


def test_blocked_cumsum_along_a_leading_axis_needs_no_transpose():
    """Along axis 0 the blocks, the block totals' scan and the sum run in place along the axis
    (the trailing axis stays innermost: 1024 x 1024 took 14.5 ms through two strided
    transposes, ~1 ms in place), with IEEE order for infinities and NaN and its gradient."""
    n = 203
    cols = np.ones((n, 5), np.float32)
    cols[50, 0] = np.inf
    cols[97, 1], cols[98, 1] = -np.inf, 2.0
    cols[64, 2] = np.nan
    cols[7, 3], cols[150, 3] = np.inf, -np.inf
    f = rlxc.Func("lca", lambda s: s.input("x", (n, 5)).cumsum(0))
    assert "rlx.transpose" not in str(f.module)
    with np.errstate(invalid="ignore"):
        want = np.cumsum(cols, 0)
    for got in _all(f, x=cols):
        np.testing.assert_array_equal(got[0], want)
    w = RNG.normal(size=(100, 3)).astype(np.float32)
    g = rlxc.Func("lcw0", lambda s: (s.input("x", (100, 3)).cumsum(0) * w).sum())
    for outs in _all(g.grad("x"), x=np.zeros((100, 3), np.float32)):
        np.testing.assert_allclose(outs[0], np.cumsum(w[::-1], 0)[::-1], rtol=1e-5, atol=1e-5)


def test_blocked_cumsum_vjp_and_vmap():
    def build(s):
        x = s.input("x", (2, 70))
        return (x.cumsum(1).sin() * x).sum()
    m = rlxc.Func("lcg", build).module
    check_vjp(m, [RNG.uniform(-1, 1, (2, 70))], rtol=1e-5, atol=1e-6)
    w = RNG.normal(size=(3, 100)).astype(np.float32)
    g = rlxc.Func("lcw", lambda s: (s.input("x", (3, 100)).cumsum(1) * w).sum())
    want = np.cumsum(w[:, ::-1], 1)[:, ::-1]               # d/dx of sum(w * cumsum(x))
    for outs in _all(g.grad("x"), x=np.zeros((3, 100), np.float32)):
        np.testing.assert_allclose(outs[0], want, rtol=1e-5, atol=1e-5)
    x = RNG.normal(size=(4, 90)).astype(np.float32)
    vb = rlxc.Func("lcv", lambda s: s.input("x", (90,)).cumsum(0)).vmap(["x"], 4)
    np.testing.assert_allclose(vb.run_on("cpu", x=x)[0], np.cumsum(x, 1), rtol=1e-5, atol=1e-5)


def test_cumsum_topk_fd_and_grad_of_grad():
    def build(s):
        x = s.input("x", (3, 6))
        v, _ = x.topk(3, axis=1)                            # ranking
        w, _ = x.reshape(18).topk(2)                        # selection passes (2 * 8 < 18)
        return (x.cumsum(1).sin() * x).sum() + (v * v * s.constant(np.arange(3.0) + 1)).sum() \
            + (w * w * w).sum()
    m = rlxc.Func("ctk", build).module
    x = RNG.permutation(18).reshape(3, 6) * 0.2 - 1.3      # distinct: no topk ties
    check_vjp(m, [x], rtol=1e-5, atol=1e-6)
    check_vjp(grad_module(m, float_args(m)), [x], float_args(m), rtol=1e-5, atol=1e-5)
    f = rlxc.Func("ctk", build)
    for outs in _all(f.grad("x"), x=x.astype(np.float32))[1:]:
        np.testing.assert_allclose(outs[0], f.grad("x").run_on("interp", x=x)[0], rtol=1e-4,
                                   atol=1e-5)


def _np_topk(x, k, axis):
    xm = np.moveaxis(x, axis, -1)
    key = np.where(np.isnan(xm), np.inf, -xm)         # NaN first, then descending
    nan_first = np.lexsort((np.broadcast_to(np.arange(xm.shape[-1]), xm.shape),
                            key, ~np.isnan(xm)), axis=-1)[..., :k]
    return (np.moveaxis(np.take_along_axis(xm, nan_first, -1), -1, axis),
            np.moveaxis(nan_first, -1, axis).astype(np.int32))


# k * 8 < n takes the k-pass selection (rlxc/indexops.py), the others the ranking
TOPK_SHAPES = [((5,), 1, 0), ((5,), 5, 0), ((3, 8), 3, -1), ((8, 3), 2, 0), ((2, 5, 7), 4, 1),
               ((2, 3, 33), 5, 2), ((4, 50), 3, 1), ((41, 3), 5, 0), ((3, 100), 1, -1)]


def test_topk_numpy_random_shapes_ties_nan():
    arrays = {f"x{k}": RNG.uniform(-1, 1, shp).astype(np.float32)
              for k, (shp, _, _) in enumerate(TOPK_SHAPES)}
    arrays["x1"] = np.array([2, np.nan, 2, -np.inf, np.nan], np.float32)   # ties and NaN
    arrays["x3"] = np.round(arrays["x3"])                                   # many ties
    arrays["x7"] = np.round(arrays["x7"] * 2)                               # ties, selection
    arrays["x7"][[3, 7, 20], 1] = [np.nan, -np.inf, np.nan]
    arrays["x6"][1] = -np.inf                                               # all -inf row
    arrays["x6"][2, [4, 9]] = np.nan
    arrays["x6"][3] = -np.inf                                               # the lowest finite
    arrays["x6"][3, [30, 5]] = np.finfo(np.float32).min                     # float, then -inf
    ints = RNG.integers(-3, 3, (4, 9)).astype(np.int64)

    def build(s):
        outs = []
        for k, (shp, kk, ax) in enumerate(TOPK_SHAPES):
            outs += list(s.input(f"x{k}", shp).topk(kk, axis=ax))
        return outs + list(rlxc.topk(s.input("n", ints.shape, "i64"), 4))
    outs = _all(rlxc.Func("tk", build), **arrays, n=ints)
    _same(outs)
    for k, (shp, kk, ax) in enumerate(TOPK_SHAPES):
        v, i = _np_topk(arrays[f"x{k}"], kk, ax)
        np.testing.assert_array_equal(outs[1][2 * k], v)
        np.testing.assert_array_equal(outs[1][2 * k + 1], i)
    v, i = _np_topk(ints, 4, -1)
    np.testing.assert_array_equal(outs[1][-2], v)
    np.testing.assert_array_equal(outs[1][-1], i)


# ---------------------------------------------------------------- torch references

@pytest.mark.parametrize("shape,axis,k", [((4, 50), 1, 7), ((3, 20, 6), 1, 5), ((257,), 0, 10)])
def test_against_torch_topk_cumsum(shape, axis, k):
    torch = pytest.importorskip("torch")
    x = RNG.normal(size=shape).astype(np.float32)
    f = rlxc.Func("tt", lambda s: (lambda t: [t.cumsum(axis), *t.topk(k, axis=axis)])(
        s.input("x", shape)))
    c, v, i = f.run_on("cpu", x=x)
    tx = torch.tensor(x, requires_grad=True)
    tv, ti = torch.topk(tx, k, dim=axis)
    tc = torch.cumsum(tx, dim=axis)
    np.testing.assert_allclose(c, tc.detach().numpy(), rtol=1e-4, atol=1e-4 * np.abs(x).max())
    np.testing.assert_allclose(v, tv.detach().numpy(), rtol=1e-4)
    np.testing.assert_array_equal(i, ti.numpy())        # distinct values: same order
    w = RNG.normal(size=tv.shape).astype(np.float32)
    wc = RNG.normal(size=tc.shape).astype(np.float32)
    ((tv * torch.tensor(w)).sum() + (tc * torch.tensor(wc)).sum()).backward()
    g = rlxc.Func("tg", lambda s: (lambda t: (t.topk(k, axis=axis)[0] * w).sum()
                                   + (t.cumsum(axis) * wc).sum())(s.input("x", shape)))
    got = g.grad("x").run_on("cpu", x=x)[0]
    np.testing.assert_allclose(got, tx.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_vmap_of_index_ops_matches_a_loop():
    x = RNG.normal(size=(3, 6, 4)).astype(np.float32)
    f = rlxc.Func("vi", lambda s: (lambda t: [t.argmax(0), t.cumsum(1), *t.topk(2, axis=0),
                                              t.argmin(1).one_hot(4)])(s.input("x", (6, 4))))
    vb = f.vmap(["x"], 3)
    for outs in _all(vb, x=x):
        for b in range(3):
            for got, want in zip(outs, f.run_on("interp", x=x[b])):
                np.testing.assert_allclose(got[b], want, rtol=1e-6, atol=1e-6)


KEYED_C = r"""
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "keyed.h"

int main(void)
{
    static float x[KEYED_INPUT0_NUMEL], y[KEYED_OUTPUT0_NUMEL];
    uint32_t key[2] = {4000000000u, 17u};      /* above INT32_MAX: unsigned all the way */
    const float *in[2] = {x, (const float *)key};
    float *out[1] = {y};
    keyed_ctx *ctx = keyed_create();
    int i;
    if (strcmp(keyed_input_dtype(1), "u32") != 0) return 2;
    for (i = 0; i < (int)KEYED_INPUT0_NUMEL; ++i) x[i] = (float)i;
    if (keyed_run(ctx, in, out) != RLX_OK) { printf("%s\n", keyed_last_error(ctx)); return 3; }
    for (i = 0; i < (int)KEYED_OUTPUT0_NUMEL; ++i) printf("%.9g\n", y[i]);
    keyed_destroy(ctx);
    return 0;
}
"""


def test_u32_key_through_the_c_abi(tmp_path):
    """A C program passes a uint32_t key (one above INT32_MAX) to a compiled dropout."""
    import shutil
    import subprocess

    from rlxc import export as aot
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    f = rlxc.Func("keyed", lambda s: s.input("x", (4, 8)).dropout(
        0.5, s.input("key", (2,), "u32"), stream=3))
    aot.build_artifact(aot.spec_from_func(f, "keyed"), str(tmp_path))
    assert '"u32"' in (tmp_path / "keyed.h").read_text()
    (tmp_path / "main.c").write_text(KEYED_C)
    subprocess.run(["cc", "-std=c99", "-Wall", "-Werror", "-I", str(tmp_path),
                    str(tmp_path / "main.c"), "-L", str(tmp_path), "-lkeyed",
                    f"-Wl,-rpath,{tmp_path}", "-o", str(tmp_path / "main")], check=True)
    p = subprocess.run([str(tmp_path / "main")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    got = np.array([float(v) for v in p.stdout.split()], np.float32).reshape(4, 8)
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    key = np.array([4000000000, 17], np.uint32)
    mask = philox_ref.uniform(key, (4, 8), stream=3) >= 0.5
    np.testing.assert_array_equal(got, np.where(mask, x * 2, 0))
    np.testing.assert_array_equal(got, f.run_on("interp", x=x, key=key)[0])


def test_constant_splat_key_above_int32_max():
    """A constant key (a splat u32 above INT32_MAX, folded into the loop as an immediate)
    draws the same bits on every backend; 5000 elements stay unfolded (> FOLD_LIMIT)."""
    key = np.array([4000000000, 4000000000], np.uint32)
    f = rlxc.Func("sp", lambda s: s.input("x", (5000,)) * rlxc.random.uniform(
        s.constant(key, "u32"), (5000,)))
    outs = _all(f, x=np.ones(5000, np.float32))
    _same(outs)
    np.testing.assert_array_equal(outs[0][0][:64], philox_ref.uniform(key, (64,)))


def test_u32_arithmetic_read_from_mlir_is_rejected_by_the_verifier():
    """IR from text obeys the tracer's rule: u32 keys take no arithmetic (rlx.add here)."""
    ok = rlxc.Func("k", lambda s: s.input("key", (2,), "u32").cast("i32") + 1)
    text = ok.mlir()
    assert "ui32" in text
    bad = ("func.func @k(%key: tensor<2xui32>) -> tensor<2xui32> {\n"
           "  %0 = \"rlx.add\"(%key, %key) : (tensor<2xui32>, tensor<2xui32>) -> tensor<2xui32>\n"
           "  func.return %0 : tensor<2xui32>\n}\n")
    with pytest.raises(Exception, match="rlx.add: u32 tensors are random keys"):
        rlxc.Func.from_mlir("builtin.module {\n" + bad + "}\n")

"""Consecutive loop kernels over the same rows run as one loop (lowering/cpu/rowfuse.py).

Golden loop IR: a row softmax, a layer norm and an argmax become one kernel (the jammed
reductions' groups of 4 rows wrap the one-row kernels in `for i0_in_i0_jam in [0, 4)`);
a batch-1 linear layer's chunk combine and its bias + relu share one loop.  Refusals:
a consumer that reads another row of the producer's output (a transpose after a row max,
the previous row), a consumer that writes what the producer reads, an index read of a
written buffer, independent kernels, a row ratio above MAX_WRAP.  Numerics against NumPy
(float64 references) for sizes that are and are not multiples of the jam, rows with NaN and
inf, on 1 and 2 threads, and a gradient through the fused forward.
"""
import re

import numpy as np
import pytest

from rlxc import Func
from rlxc.lowering.cpu import indexing as ix, loops, rowfuse
from rlxc.lowering.cpu.driver import emit_loops

from gradcheck import fd_grad

RNG = np.random.default_rng(11)


def _kernels(f):
    return re.findall(r"^kernel (\S+)", emit_loops(f.module, f.name), re.M)


def test_golden_softmax_layernorm_argmax_are_one_kernel():
    sm = Func("sm", lambda s: s.input("a", (64, 256)).softmax(1))
    text = emit_loops(sm.module, "sm")
    assert re.findall(r"^kernel (\S+)", text, re.M) == ["k1_reduce_k2_k3_k4"]
    assert "for i0_jam in [0, 16):" in text and "for i0_in_i0_jam in [0, 4):" in text
    ln = Func("ln", lambda s: s.input("a", (64, 256)).layer_norm(
        -1, 1e-5, weight=s.param("g", (256,)), bias=s.param("b", (256,))))
    assert len(_kernels(ln)) == 1
    am = Func("am", lambda s: s.input("a", (64, 256)).argmax(1))
    assert len(_kernels(am)) == 1


def test_golden_batch1_linear_combine_and_relu_share_a_loop():
    f = Func("lin1", lambda s: (s.input("x", (1, 784)) @ s.param("w", (784, 512))
                                + s.param("b", (512,))).relu())
    ks = _kernels(f)
    assert ks == ["k1_reduce_rows", "k2_reduce_combine_k3"], ks


def test_a_read_of_another_row_is_not_fused():
    # (x - max).T reads m[j] for every j in row i: the max of later rows is not known yet
    f = Func("mt", lambda s: (lambda x: (x - x.max(1, keepdims=True)).T)(s.input("a", (40, 30))))
    assert len(_kernels(f)) == 2
    x = RNG.standard_normal((40, 30)).astype(np.float32)
    np.testing.assert_array_equal(f.jit().run(a=x)[0], (x - x.max(1, keepdims=True)).T)


def _k(name, var, body, par=False):
    return loops.LoopKernel(name, name, [loops.For(var, ix.ZERO, ix.const(var.extent), body, par)],
                            var.extent)


def _bufs():
    x = loops.Buffer("x", "input", "f32", 64 * 8)
    t = loops.Buffer("t", "temp", "f32", 64)
    y = loops.Buffer("y", "output", "f32", 64 * 8)
    return x, t, y


def test_fuse_pair_unit_rules():
    x, t, y = _bufs()
    o, c = ix.Var("o", 64), ix.Var("c", 8)
    row = ix.var(o) * 8 + ix.var(c)
    prod = _k("k1_p", o, [loops.Store(t, ix.var(o), loops.Load(x, ix.var(o) * 8))])

    def cons(t_off, name="k2_c", out=y, src=x):
        return _k(name, o, [loops.For(c, ix.ZERO, ix.const(8), [
            loops.Store(out, row, loops.Op("add", (loops.Load(src, row), loops.Load(t, t_off)),
                                           "f32"))])])
    fused = rowfuse.fuse_pair(prod, cons(ix.var(o)))
    assert fused is not None and fused.name == "k1_p_k2" and len(fused.body) == 1
    # another row's t (the previous one, row 0): not row-owned, refused
    assert rowfuse.fuse_pair(prod, cons(ix.add(ix.var(o), -1))) is None
    assert rowfuse.fuse_pair(prod, cons(ix.const(0))) is None            # row 0 from every row
    # the consumer writes what the producer reads
    assert rowfuse.fuse_pair(prod, cons(ix.var(o), out=x, src=y)) is None
    # nothing shared: nothing to gain
    other = loops.Buffer("u", "input", "f32", 64)
    indep = _k("k2_i", o, [loops.Store(y, ix.var(o) * 8, loops.Load(other, ix.var(o)))])
    assert rowfuse.fuse_pair(prod, indep) is None
    # an index read of a written buffer
    ti = loops.Buffer("ti", "temp", "i32", 64)
    pidx = _k("k1_i", o, [loops.Store(ti, ix.var(o), loops.Const(0, "i32"))])
    gather = _k("k2_g", o, [loops.Store(
        y, ix.var(o) * 8, loops.Load(x, ix.of(ix.LoadIdx(ti, ix.var(o), 64))))])
    assert rowfuse.fuse_pair(pidx, gather) is None


def test_fuse_pair_wraps_the_finer_kernel_up_to_max_wrap():
    x, t, y = _bufs()
    for u, ok in ((4, True), (rowfuse.MAX_WRAP, True), (2 * rowfuse.MAX_WRAP, False)):
        g = ix.Var("g", 64 // u)
        stores = [loops.Store(t, ix.var(g) * u + j, loops.Load(x, (ix.var(g) * u + j) * 8))
                  for j in range(u)]
        prod = _k("k1_j", g, stores, par=True)
        o = ix.Var("o", 64)
        cons = _k("k2_m", o, [loops.Store(y, ix.var(o) * 8, loops.Load(t, ix.var(o)))])
        fused = rowfuse.fuse_pair(prod, cons)
        assert (fused is not None) == ok, u
        if ok:
            loop = fused.body[0]
            assert loop.var == g and loop.parallel
            assert isinstance(loop.body[-1], loops.For) and loop.body[-1].var.extent == u


def _softmax(x, ax):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(ax, keepdims=True))
    return e / e.sum(ax, keepdims=True)


@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (8, 64), (7, 1030), (256, 300)])
def test_row_ops_match_numpy(shape):
    x = (RNG.standard_normal(shape) * 3).astype(np.float32)
    g = RNG.standard_normal(shape[1]).astype(np.float32)
    b = RNG.standard_normal(shape[1]).astype(np.float32)

    def build(s):
        a = s.input("a", shape)
        ln = a.layer_norm(-1, 1e-5, weight=s.param("g", (shape[1],)),
                          bias=s.param("b", (shape[1],)))
        return a.softmax(1), a.log_softmax(1), ln, a.argmax(1), a.argmin(1), \
            a - a.mean(1, keepdims=True)
    j = Func(f"rows{shape[0]}x{shape[1]}", build).with_params({"g": g, "b": b}).jit()
    x64 = x.astype(np.float64)
    mu = x64.mean(1, keepdims=True)
    ln = (x64 - mu) / np.sqrt(((x64 - mu) ** 2).mean(1, keepdims=True) + 1e-5) * g + b
    for t in (1, 2):
        j.set_num_threads(t)
        sm, lsm, got_ln, amax, amin, cen = j.run(a=x)
        np.testing.assert_allclose(sm, _softmax(x, 1), rtol=2e-6, atol=1e-7)
        np.testing.assert_allclose(lsm, np.log(_softmax(x, 1)), rtol=2e-6, atol=2e-6)
        np.testing.assert_allclose(got_ln, ln, rtol=1e-5, atol=3e-5)
        np.testing.assert_array_equal(amax, x.argmax(1))
        np.testing.assert_array_equal(amin, x.argmin(1))
        np.testing.assert_allclose(cen, x64 - mu, rtol=1e-5, atol=2e-6)


def test_nan_and_inf_rows():
    x = RNG.standard_normal((9, 40)).astype(np.float32)
    x[1, 7] = np.nan
    x[2, 3] = np.inf
    x[3, :] = -np.inf
    x[4, 5] = x[4, 30] = np.nan
    j = Func("rownan", lambda s: (lambda a: (a.softmax(1), a.argmax(1)))(
        s.input("a", (9, 40)))).jit()
    for t in (1, 2):
        j.set_num_threads(t)
        sm, am = j.run(a=x)
        with np.errstate(invalid="ignore"):
            np.testing.assert_allclose(sm, _softmax(x, 1), rtol=2e-6, atol=1e-7)
        np.testing.assert_array_equal(am, x.argmax(1))   # the first NaN wins (NumPy)
        assert np.isnan(sm[[1, 2, 3, 4]]).all()


def test_grad_through_fused_softmax_layernorm():
    shape = (12, 48)
    x = RNG.standard_normal(shape).astype(np.float32)
    w = RNG.standard_normal(shape).astype(np.float32)

    def build(s):
        a = s.input("a", shape)
        return (a.layer_norm(-1, 1e-5).softmax(1) * s.input("w", shape)).sum()
    f = Func("rowgrad", build)
    assert any("_k" in k for k in _kernels(f.grad(["a"])))
    g = f.grad(["a"]).jit().run(a=x, w=w)[0]

    def ref(a):
        mu = a.mean(1, keepdims=True)
        z = (a - mu) / np.sqrt(((a - mu) ** 2).mean(1, keepdims=True) + 1e-5)
        return (_softmax(z, 1) * w).sum()
    np.testing.assert_allclose(g, fd_grad(ref, x.astype(np.float64)), rtol=2e-3, atol=2e-4)


def test_dynamic_rows_fuse_alike_at_every_sampled_size():
    """The fusion is decided by structure, so the sampled programs of a dynamic batch merge
    (dynsizes.py): one library serves every size, with the fused kernel in it."""
    from rlxc.dynone import FALLBACKS, one_library
    from rlxc.lowering.cpu.dynsizes import lower_dynamic, module_symbols
    from rlxc.registry import backend

    def build(s):
        a = s.input("a", ("B", 48))
        return a.layer_norm(-1, 1e-5).softmax(1), a.argmax(1)
    f = Func("rows_dyn", build)
    prog = lower_dynamic(f.module, module_symbols(f.module), "rows_dyn")
    assert any(k.name.count("_k") >= 2 for k in prog.kernels), [k.name for k in prog.kernels]
    assert one_library(f, backend("cpu")) is not None, FALLBACKS.get(f.ir_hash())
    for B in (1, 3, 64, 301):
        x = RNG.standard_normal((B, 48)).astype(np.float32)
        x64 = x.astype(np.float64)
        z = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-5)
        sm, am = f.run(a=x)
        np.testing.assert_allclose(sm, _softmax(z, 1), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(am, x.argmax(1))

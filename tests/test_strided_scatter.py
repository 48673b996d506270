"""col2im as a strided scatter (lowering/cpu/strided_scatter.py).

    factors    affine_factors finds the (kh, kw, h, w) shape of conv_transpose's index
               table and its coefficients, and refuses non-affine, descending or
               out-of-range tables
    structure  conv2d's input gradient: the accumulate kernel is a strided nest, no index
               load, no check kernel, its leading (image, channel) loop parallel
    numerics   conv_transpose2d over strides, dilations, padding and groups, and a conv
               input gradient, against the interpreter; a scatter_add at non-affine
               indices keeps the indexed kernel and is still exact
"""
from __future__ import annotations

import numpy as np
import pytest

import rlxc
from rlxc.lowering.cpu.driver import lower
from rlxc.lowering.cpu.loops import CheckKernel, LoopKernel, format_kernel
from rlxc.lowering.cpu.strided_scatter import affine_factors

rng = np.random.default_rng(23)


def _col2im_idx(kh, kw, h, w, sh, sw, dh, dw, wc):
    i, j, p, q = np.ix_(range(kh), range(kw), range(h), range(w))
    return ((p * sh + i * dh) * wc + (q * sw + j * dw)).reshape(-1)


@pytest.mark.parametrize("case", [(5, 5, 10, 10, 1, 1, 1, 1, 14), (3, 3, 4, 5, 2, 2, 1, 1, 11),
                                  (3, 2, 4, 4, 1, 2, 2, 1, 9), (1, 1, 7, 7, 1, 1, 1, 1, 7)])
def test_factors_of_col2im(case):
    kh, kw, h, w, sh, sw, dh, dw, wc = case
    idx = _col2im_idx(*case)
    f = affine_factors(idx, 10 ** 6)
    assert f is not None
    c0, dims, coefs = f
    want = np.zeros(dims, np.int64) + c0
    for d, k in enumerate(coefs):
        want = want + k * np.arange(dims[d]).reshape((-1,) + (1,) * (len(dims) - d - 1))
    assert np.array_equal(want.reshape(-1), idx)


@pytest.mark.parametrize("arr,bound", [([0, 2, 1, 3, 9], 10), ([3, 2, 1, 0], 10),
                                       ([0, 1, 2, 3], 3), ([], 4), ([0, 1, 5, 7], 10)])
def test_factors_refused(arr, bound):
    assert affine_factors(np.array(arr, np.int64), bound) is None


def _input_grad(n=3, c=4, o=5, hw=11, k=3):
    def build(s):
        return (s.input("x", (n, c, hw, hw)).conv2d(s.param("w", (o, c, k, k))).relu() ** 2).sum()
    w = (rng.standard_normal((o, c, k, k)) / 4).astype(np.float32)
    return rlxc.Func("sgrad", build).with_params({"w": w}).grad("x")


def test_structure():
    prog = lower(_input_grad(n=64, c=6, o=16, hw=14, k=5).module, "sgrad", max_threads=2)
    acc = [k for k in prog.kernels if isinstance(k, LoopKernel) and "accumulate" in k.what]
    assert len(acc) == 1 and "(strided)" in acc[0].what, [k.what for k in prog.kernels]
    from rlxc.lowering.cpu import indexing as ix
    from rlxc.lowering.cpu.loops import For, Store, walk

    text = format_kernel(acc[0])
    stores = [s for s in walk(acc[0].body) if isinstance(s, Store)]
    assert len(stores) == 1 and ix.is_plain(stores[0].off), text   # no index-table read
    assert isinstance(acc[0].body[0], For) and acc[0].body[0].parallel, text
    assert not [k for k in prog.kernels if isinstance(k, CheckKernel)]


def test_input_grad_numerics():
    f = _input_grad(n=6, c=6, o=16, hw=14, k=5)   # LeNet conv2's shapes, 6 images
    x = rng.standard_normal((6, 6, 14, 14)).astype(np.float32)
    (got,), (want,) = f.run(x=x), f.run_on("interp", x=x)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("stride,pad,dil,groups", [(1, 0, 1, 1), (2, 1, 1, 1), (2, 0, 2, 1),
                                                   (3, 2, 1, 2), ((1, 2), (0, 1), (2, 1), 1)])
def test_conv_transpose_numerics(stride, pad, dil, groups):
    ci, co = 4, 6

    def build(s):
        return s.input("y", (2, ci, 5, 6)).conv_transpose2d(
            s.param("w", (ci, co // groups, 3, 3)), stride=stride, padding=pad, dilation=dil,
            groups=groups)
    w = rng.standard_normal((ci, co // groups, 3, 3)).astype(np.float32)
    f = rlxc.Func("sct", build).with_params({"w": w})
    y = rng.standard_normal((2, ci, 5, 6)).astype(np.float32)
    (got,), (want,) = f.run(y=y), f.run_on("interp", y=y)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_non_affine_scatter_keeps_the_index_path():
    """gather's gradient is a scatter_add at the gather's (here non-affine) indices."""
    idx = np.array([3, 0, 3, 1, 4, 4, 2], np.int32)
    g = rng.standard_normal((2, 7)).astype(np.float32)
    f = rlxc.Func("nsa", lambda s: (s.input("u", (2, 5)).gather(idx, axis=1) *
                                    s.input("g", (2, 7))).sum()).grad("u")
    u = rng.standard_normal((2, 5)).astype(np.float32)
    want = np.zeros((2, 5), np.float32)
    for j, t in enumerate(idx):
        want[:, t] += g[:, j]
    (got,) = f.run(u=u, g=g)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    prog = lower(f.module, "nsa")
    acc = [k for k in prog.kernels if isinstance(k, LoopKernel) and "accumulate" in k.what]
    assert acc and not any("(strided)" in k.what for k in acc)

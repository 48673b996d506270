"""The convolution family end to end: compiled CPU code (forward and gradients) against
references, on a sweep of shapes with strides, padding, dilation and groups.

- NumPy oracle (runs in CI): loop-form conv2d from tests/opcases.py; gradients from the
  adjoint identities checked in float64.
- PyTorch (importorskip): torch.nn.functional conv1d, conv2d, conv_transpose2d,
  max_pool2d, avg_pool2d, forward and gradients within 1e-4 relative.
- The decomposition pass (rlx-decompose-conv) and the ShapeErrors of bad arguments.

Each sweep is ONE traced function (every config an output of the loss), so one compile.
"""
from __future__ import annotations

import numpy as np
import pytest

import rlxc
from opcases import _np_conv2d
from rlxc.dialect import conv_ref
from rlxc.dialect.conv_decompose import decompose_conv
from rlxc.dialect.passes import run_pipeline

# (x shape, w shape, stride, padding, dilation, groups) -- PyTorch argument forms
CONV2D_SWEEP = [
    ((2, 3, 8, 8), (4, 3, 3, 3), 1, 0, 1, 1),
    ((2, 4, 9, 7), (6, 2, 3, 2), (2, 1), (1, 2), (1, 2), 2),
    ((1, 6, 10, 10), (6, 1, 3, 3), 2, 1, 1, 6),           # depthwise, strided
    ((3, 2, 7, 9), (4, 2, 5, 5), 1, "same", 1, 1),
    ((2, 4, 11, 6), (4, 2, 2, 3), (3, 2), 0, (2, 1), 2),
    ((2, 8, 5, 5), (4, 8, 1, 1), 1, 0, 1, 1),              # 1x1: no im2col
    ((1, 3, 12, 12), (2, 3, 4, 4), 2, 3, 3, 1),
]
CONV1D_SWEEP = [((2, 3, 16), (4, 3, 3), 2, 1, 1, 1), ((2, 4, 11), (6, 2, 4), 1, "same", 2, 2)]
# (x shape, w shape, stride, padding, output_padding, groups, dilation)
CONVT_SWEEP = [((2, 4, 5, 5), (4, 3, 3, 3), 2, 1, 1, 1, 1),
               ((2, 4, 4, 6), (4, 2, 3, 2), (2, 3), (0, 1), (1, 2), 2, (1, 2)),
               ((1, 3, 6, 6), (3, 2, 2, 2), 1, 0, 0, 1, 1)]
POOL_SWEEP = [((2, 3, 8, 8), 2, None, 0), ((2, 2, 9, 7), 3, 2, 1), ((1, 3, 7, 10), (2, 3), (1, 2), (1, 1))]

rng = np.random.default_rng(1515)


def _pad4(padding, k, d):
    if padding == "same":
        return tuple(x for kk, dd in zip(k, d) for x in (dd * (kk - 1) // 2, dd * (kk - 1) - dd * (kk - 1) // 2))
    p = padding if isinstance(padding, tuple) else (padding, padding)
    return (p[0], p[0], p[1], p[1])


def _pair(v):
    return v if isinstance(v, tuple) else (v, v)


def _sweep_func(configs, emit):
    """One Func: input x_i, param w_i per config; output 0 is sum_i sum(out_i * R_i), then
    every out_i (R fixed random)."""
    def build(s):
        outs = []
        for i, cfg in enumerate(configs):
            x = s.input(f"x{i}", cfg[0])
            w = s.param(f"w{i}", cfg[1]) if cfg[1] is not None else None
            outs.append(emit(x, w, cfg))
        loss = None
        for i, o in enumerate(outs):
            r = s.constant(np.random.default_rng(i).uniform(0.5, 1.5, o.shape).astype(np.float32))
            t = (o * r).sum()
            loss = t if loss is None else loss + t
        return [loss] + outs
    return build


def _arrays(configs):
    xs = {f"x{i}": rng.uniform(-1, 1, c[0]).astype(np.float32) for i, c in enumerate(configs)}
    ws = {f"w{i}": rng.uniform(-1, 1, c[1]).astype(np.float32)
          for i, c in enumerate(configs) if c[1] is not None}
    return xs, ws


def _run_grads(build, xs, ws, name):
    f = rlxc.Func(name, build).with_params(ws)
    outs = f.run(**xs)
    wrt = list(xs) + list(ws)
    g = f.value_and_grad(wrt).with_params(ws).run(**xs)
    return outs[1:], dict(zip(wrt, g[1:]))


def _emit_conv2d(x, w, c):
    return x.conv2d(w, stride=c[2], padding=c[3], dilation=c[4], groups=c[5])


def test_conv2d_sweep_against_numpy():
    """Compiled forward and both gradients vs the loop-form NumPy conv and its adjoints."""
    xs, ws = _arrays(CONV2D_SWEEP)
    outs, grads = _run_grads(_sweep_func(CONV2D_SWEEP, _emit_conv2d), xs, ws, "conv_sweep")
    for i, c in enumerate(CONV2D_SWEEP):
        x, w = xs[f"x{i}"].astype(np.float64), ws[f"w{i}"].astype(np.float64)
        k, d, s = c[1][2:], _pair(c[4]), _pair(c[2])
        pad = _pad4(c[3], k, d)
        want = _np_conv2d(x, w, s, pad, d, c[5])
        np.testing.assert_allclose(outs[i], want, rtol=1e-4, atol=1e-4, err_msg=f"config {c}")
        r = np.random.default_rng(i).uniform(0.5, 1.5, want.shape).astype(np.float32)
        gx = conv_ref.conv_transpose2d(r.astype(np.float64), w, s, pad, d, c[5], tuple(
            (x.shape[2 + a] + pad[2 * a] + pad[2 * a + 1] - d[a] * (k[a] - 1) - 1) % s[a]
            for a in range(2)))
        gw = conv_ref.conv2d_filter_grad(x, r.astype(np.float64), s, pad, d, c[5], k)
        np.testing.assert_allclose(grads[f"x{i}"], gx, rtol=1e-4, atol=1e-4, err_msg=f"dx {c}")
        np.testing.assert_allclose(grads[f"w{i}"], gw, rtol=1e-4, atol=1e-4, err_msg=f"dw {c}")


def test_reference_adjoints_in_float64():
    """conv_ref's three ops satisfy <conv2d(x, w), y> = <x, convT(y, w)> = <w, fgrad(x, y)>."""
    for c in CONV2D_SWEEP:
        k, d, s = c[1][2:], _pair(c[4]), _pair(c[2])
        pad = _pad4(c[3], k, d)
        x, w = rng.normal(size=c[0]), rng.normal(size=c[1])
        y0 = conv_ref.conv2d(x, w, s, pad, d, c[5])
        np.testing.assert_allclose(y0, _np_conv2d(x, w, s, pad, d, c[5]), rtol=1e-10, atol=1e-10)
        y = rng.normal(size=y0.shape)
        op = tuple((x.shape[2 + a] + pad[2 * a] + pad[2 * a + 1] - d[a] * (k[a] - 1) - 1) % s[a]
                   for a in range(2))
        lhs = np.sum(y0 * y)
        np.testing.assert_allclose(np.sum(x * conv_ref.conv_transpose2d(y, w, s, pad, d, c[5], op)),
                                   lhs, rtol=1e-10)
        np.testing.assert_allclose(np.sum(w * conv_ref.conv2d_filter_grad(x, y, s, pad, d, c[5], k)),
                                   lhs, rtol=1e-10)


def test_pools_and_upsample_gradients_cpu_vs_interp():
    """Pools are compositions: compiled gradients equal the float64 interpreter's."""
    def emit(x, w, c):
        k, st, p = c[2:]
        y = x.relu().max_pool2d(k, st, p) + x.avg_pool2d(k, st, p).sin()
        return y.upsample_nearest2d((2, 1))
    cfgs = [(c[0], None, *c[1:]) for c in POOL_SWEEP]
    xs, _ = _arrays(cfgs)
    f = rlxc.Func("pool_sweep", _sweep_func(cfgs, emit))
    g = f.value_and_grad(list(xs))
    got = g.run(**xs)
    want = g.run_on("interp", **xs)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- the decomposition pass

def test_decompose_pass_removes_conv_and_keeps_values():
    f = rlxc.Func("c", lambda s: s.input("x", (2, 3, 6, 6)).conv2d(s.param("w", (4, 3, 3, 3)),
                                                                   stride=2, padding=1))
    g = f.value_and_grad(["x", "w"])
    text = run_pipeline(g.module, "rlx-decompose-conv").__str__()
    assert "rlx.conv" not in text and "rlx.matmul" in text
    assert "rlx.conv2d_filter_grad" in g.mlir()       # the caller's module is untouched
    x, w = rng.normal(size=(2, 3, 6, 6)), rng.normal(size=(4, 3, 3, 3))
    from rlxc.dialect.interpreter import interpret
    a = interpret(g.module, [x, w], np.float64)
    b = interpret(decompose_conv(g.module), [x, w], np.float64)
    for u, v in zip(a, b):
        np.testing.assert_allclose(u, v, rtol=1e-10, atol=1e-12)
    nothing = rlxc.Func("n", lambda s: s.input("x", (3,)) * 2.0).module
    assert decompose_conv(nothing) is nothing


def test_conv2d_reaches_the_gemm():
    """A conv2d of a LeNet layer lowers to one packed-sgemm kernel (no scalar conv loop)."""
    from rlxc.lowering.cpu.driver import lower
    from rlxc.lowering.cpu.loops import MatmulKernel

    f = rlxc.Func("c", lambda s: s.input("x", (4, 3, 16, 16)).conv2d(
        s.param("w", (6, 3, 5, 5)), s.param("b", (6,))).relu())
    prog = lower(f.module)
    assert sum(isinstance(k, MatmulKernel) for k in prog.kernels) == 1


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize("build,match", [
    (lambda s: s.input("x", (2, 3, 8)).conv2d(s.param("w", (4, 3, 3, 3))), "conv2d: input must be NCHW"),
    (lambda s: s.input("x", (2, 4, 8, 8)).conv2d(s.param("w", (4, 3, 3, 3)), groups=2),
     r"conv2d: input \(2, 4, 8, 8\).*weight \(4, 3, 3, 3\).*groups=2"),
    (lambda s: s.input("x", (2, 3, 4, 4)).conv2d(s.param("w", (4, 3, 5, 5))), "does not fit"),
    (lambda s: s.input("x", (2, 3, 8, 8)).conv2d(s.param("w", (4, 3, 3, 3)), stride=2,
                                                 padding="same"), "'same' needs stride 1"),
    (lambda s: s.input("x", (2, 3, 8, 8)).conv2d(s.param("w", (4, 3, 3, 3)), padding="full"),
     "padding must be"),
    (lambda s: s.input("x", (2, 3, 8, 8)).conv2d(s.param("w", (4, 3, 3, 3)), s.param("b", (3,))),
     r"bias must have shape \(4,\)"),
    (lambda s: s.input("x", (2, 3, 8, 8)).conv_transpose2d(s.param("w", (3, 2, 3, 3)), stride=2,
                                                           output_padding=2), "output_padding"),
    (lambda s: s.input("x", (2, 3, 8, 8)).max_pool2d(3, padding=2), "at most half the kernel"),
    (lambda s: s.input("x", (2, 3, 2, 2)).avg_pool2d(3), "does not fit"),
    (lambda s: s.input("x", (2, 3, 8)).upsample_nearest2d(2), "NCHW"),
    (lambda s: s.input("x", (2, 3, 8)).conv1d(s.param("w", (4, 2, 3))), "conv2d: input"),
])
def test_bad_arguments_raise_shape_errors(build, match):
    with pytest.raises(rlxc.ShapeError, match=match):
        rlxc.Func("bad", build).module


def test_api_functions_match_methods():
    x = rng.uniform(-1, 1, (1, 2, 5, 5)).astype(np.float32)
    w = rng.uniform(-1, 1, (3, 2, 3, 3)).astype(np.float32)
    def build(s):
        xt, wt = s.input("x", x.shape), s.input("w", w.shape)
        return rlxc.conv2d(xt, wt, padding=1) - xt.conv2d(wt, padding=1)
    f = rlxc.Func("a", build)
    assert np.all(f.run_on("interp", x=x, w=w)[0] == 0)


# ---------------------------------------------------------------- PyTorch reference

def _torch():
    return pytest.importorskip("torch")


def _close(a, b, what):
    b = b.detach().numpy()
    scale = max(np.abs(b).max(), 1.0)
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * scale, err_msg=what)


def _torch_check(configs, emit, torch_fn, name):
    torch = _torch()
    xs, ws = _arrays(configs)
    outs, grads = _run_grads(_sweep_func(configs, emit), xs, ws, name)
    for i, c in enumerate(configs):
        tx = torch.tensor(xs[f"x{i}"], dtype=torch.float64, requires_grad=True)
        tw = torch.tensor(ws[f"w{i}"], dtype=torch.float64, requires_grad=True) \
            if c[1] is not None else None
        y = torch_fn(tx, tw, c)
        r = torch.tensor(np.random.default_rng(i).uniform(0.5, 1.5, tuple(y.shape))
                         .astype(np.float32), dtype=torch.float64)
        (y * r).sum().backward()
        _close(outs[i], y, f"{name} forward {c}")
        _close(grads[f"x{i}"], tx.grad, f"{name} dx {c}")
        if tw is not None:
            _close(grads[f"w{i}"], tw.grad, f"{name} dw {c}")


def test_conv2d_matches_torch():
    F = _torch().nn.functional
    _torch_check(CONV2D_SWEEP, _emit_conv2d,
                 lambda x, w, c: F.conv2d(x, w, stride=c[2], padding=c[3], dilation=c[4],
                                          groups=c[5]), "conv2d")


def test_conv1d_matches_torch():
    F = _torch().nn.functional
    _torch_check(CONV1D_SWEEP,
                 lambda x, w, c: x.conv1d(w, stride=c[2], padding=c[3], dilation=c[4], groups=c[5]),
                 lambda x, w, c: F.conv1d(x, w, stride=c[2], padding=c[3], dilation=c[4],
                                          groups=c[5]), "conv1d")


def test_conv_transpose2d_matches_torch():
    F = _torch().nn.functional
    _torch_check(CONVT_SWEEP,
                 lambda x, w, c: x.conv_transpose2d(w, stride=c[2], padding=c[3],
                                                    output_padding=c[4], groups=c[5], dilation=c[6]),
                 lambda x, w, c: F.conv_transpose2d(x, w, stride=c[2], padding=c[3],
                                                    output_padding=c[4], groups=c[5],
                                                    dilation=c[6]), "conv_transpose2d")


@pytest.mark.parametrize("kind", ["max", "avg"])
def test_pools_match_torch(kind):
    F = _torch().nn.functional
    cfgs = [(c[0], None, *c[1:]) for c in POOL_SWEEP]
    tfn = F.max_pool2d if kind == "max" else F.avg_pool2d
    _torch_check(cfgs, lambda x, w, c: getattr(x, f"{kind}_pool2d")(c[2], c[3], c[4]),
                 lambda x, w, c: tfn(x, c[2], c[3], c[4]), f"{kind}_pool2d")


# ---------------------------------------------------------------- GPU (emulated), edge sizes

def _tiny_cnn(n=2):
    def build(s):
        x = s.input("x", (n, 2, 8, 8))
        h = x.conv2d(s.param("w1", (4, 2, 3, 3)), s.param("b1", (4,)), padding=1).relu()
        h = h.max_pool2d(2).conv2d(s.param("w2", (6, 2, 3, 3)), stride=2, padding=1, groups=2)
        return (h.avg_pool2d(2) * h.avg_pool2d(2)).sum()
    return rlxc.Func("tiny_cnn", build)


def test_gpu_emulated_cnn_value_and_grad():
    """The whole backward (conv_transpose2d, filter grads, pools) through the GPU kernels."""
    from rlxc.lowering.gpu import emu as gpu_emu

    f = _tiny_cnn()
    params = {k: rng.uniform(-1, 1, f.param_shape_of(k)).astype(np.float32)
              for k in f.param_names()}
    g = f.with_params(params).value_and_grad(["x", "w1", "b1", "w2"])
    x = rng.uniform(-1, 1, (2, 2, 8, 8)).astype(np.float32)
    ref = g.run_on("interp", x=x)
    prog = gpu_emu.emulate_program(g.module, gpu_emu.EmuDriver())
    try:
        got = prog.run(g.bind_call((), {"x": x}))
    finally:
        prog.close()
    for a, b in zip(got, ref):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_empty_batch_and_vmap_compiled():
    """N = 0 gives empty results on the CPU; vmap over a batch of images runs compiled."""
    f = rlxc.Func("e", lambda s: s.input("x", (0, 2, 5, 5)).conv2d(s.param("w", (3, 2, 3, 3)))
                  .max_pool2d(3))
    out = f.with_params({"w": np.ones((3, 2, 3, 3), np.float32)}).run(
        x=np.zeros((0, 2, 5, 5), np.float32))[0]
    assert out.shape == (0, 3, 1, 1)
    h = rlxc.Func("v", lambda s: s.input("x", (1, 2, 5, 5)).conv2d(s.input("w", (3, 2, 3, 3)),
                                                                    padding=1).sum())
    vm = h.grad(["w"]).vmap(["x", "w"], 3)
    xs = rng.uniform(-1, 1, (3, 1, 2, 5, 5)).astype(np.float32)
    ws = rng.uniform(-1, 1, (3, 3, 2, 3, 3)).astype(np.float32)
    np.testing.assert_allclose(vm.run(x=xs, w=ws)[0], vm.run_on("interp", x=xs, w=ws)[0],
                               rtol=1e-4, atol=1e-5)

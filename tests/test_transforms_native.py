"""Transforms on both backends: every numerical case runs on the reference
interpreter and on the native CPU backend, and the two agree.

The FD checks of each rule live in test_autodiff.py / test_jvp.py (float64,
interpreter). Here the transformed graphs of every op case are compiled and
compared with the interpreter, and the RLX parity and composition cases are
checked on each device.
"""
import numpy as np
import pytest

import opcases
import rlxc

DEVICES = ["interp", "cpu"]


def f32(*a):
    return np.array(a, np.float32)


@pytest.fixture(params=DEVICES)
def dev(request):
    return request.param


def run(f, dev, **kw):
    return f.run_on(dev, **kw)


# -- RLX parity --------------------------------------------------------------

def test_parity_forward_grad_vmap(dev):
    f = rlxc.Func("sum_sq", lambda s: (s.input("x", (3,)) ** 2).sum())
    np.testing.assert_allclose(run(f, dev, x=f32(1, 2, 3))[0], 14)
    np.testing.assert_allclose(run(f.grad(["x"]), dev, x=f32(1, 2, 3))[0], [2, 4, 6])
    xb = f32([1, 2, 3], [4, 5, 6])
    np.testing.assert_allclose(run(f.vmap(["x"], 2), dev, x=xb)[0], [14, 77])
    np.testing.assert_allclose(run(f.grad(["x"]).vmap(["x"], 2), dev, x=xb)[0],
                               [[2, 4, 6], [8, 10, 12]])


def test_parity_param_grad_without_inputs(dev):
    f = rlxc.Func("w_sq", lambda s: (s.param("w", (3,)) ** 2).sum()).with_param("w", [1, 2, 3])
    np.testing.assert_allclose(run(f.grad(["w"]), dev)[0], [2, 4, 6])


def test_hvp_cases(dev):
    f = rlxc.Func("sq", lambda s: (s.input("x", (4,)) ** 2).sum()).hvp(["x"])
    x, v = f32(1, 2, 3, 4), f32(.5, -.25, 1, -1.5)
    loss, g, gv, hv = run(f, dev, x=x, tangent_x=v)
    np.testing.assert_allclose(loss, 30)
    np.testing.assert_allclose(g, 2 * x)
    np.testing.assert_allclose(gv, np.dot(2 * x, v), rtol=1e-6)
    np.testing.assert_allclose(hv, 2 * v)
    q = rlxc.Func("q", lambda s: (s.input("x", (3,)) ** 4).sum()).hvp(["x"])
    out = run(q, dev, x=f32(.5, -1, 2), tangent_x=f32(1, .25, -.5))
    np.testing.assert_allclose(out[-1], [3, 3, -24], rtol=1e-5)


# -- composition -------------------------------------------------------------

def _mlp(s):
    x = s.input("x", (6, 5))
    y = s.input("y", (6,), "i32")
    h = x.linear(s.param("w1", (5, 8)), s.param("b1", (8,))).tanh()
    return h.linear(s.param("w2", (8, 3)), s.param("b2", (3,))).cross_entropy(y)


@pytest.fixture(scope="module")
def mlp():
    rng = np.random.default_rng(0)
    f = rlxc.Func("mlp", _mlp).init_randn(7, 0.5)
    data = {"x": rng.normal(size=(6, 5)).astype(np.float32),
            "y": np.array([0, 1, 2, 0, 1, 2], np.int32)}
    return f, data


COMPOSITIONS = {
    "value_and_grad_all": lambda f: f.value_and_grad_all(),
    "grad_x": lambda f: f.grad(["x", "w1"]),
    "vmap_grad": lambda f: f.grad_all().vmap(["x", "y"], 3),
    "jvp_grad": lambda f: f.grad(["w2"]).jvp(["w2"]),
    "vmap_jvp": lambda f: f.jvp(["x"]).vmap(["x", "y", "tangent_x"], 2),
    "grad_of_vmapped_sum": lambda f: f.vmap(["x", "y"], 2).grad(["w1"]),
    "vmap_vmap": lambda f: f.vmap(["x", "y"], 2).vmap(["x"], 3),
    "hvp": lambda f: f.hvp(["b1"]),
}


def _inputs_for(g, data, rng):
    out = {}
    for a in g.signature():
        if a.kind != "input":
            continue
        if a.dtype == "i32":
            out[a.name] = rng.integers(0, 3, size=a.shape).astype(np.int32)
        else:
            out[a.name] = rng.normal(size=a.shape).astype(np.float32)
    return out


@pytest.mark.parametrize("name", sorted(COMPOSITIONS))
def test_compositions_native_matches_interpreter(mlp, name):
    f, data = mlp
    g = COMPOSITIONS[name](f)
    args = _inputs_for(g, data, np.random.default_rng(1))
    want = g.run_on("interp", **args)
    got = g.run_on("cpu", **args)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)
    jitted = g.jit().run(**args)  # jit() after any transform
    for a, b in zip(jitted, want):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)


def test_grad_of_grad_scalar_native():
    f = rlxc.Func("cube", lambda s: (s.input("x", (4,)) ** 3).sin().sum())
    x = f32(0.3, -0.7, 1.1, 0.5)
    # d/dx of sum(grad): the gradient graph inlined into a new trace, then differentiated
    h = rlxc.Func("gsum", lambda s: s.call(f.grad(["x"]), {"x": s.input("x", (4,))})[0].sum())
    d2 = h.grad(["x"])
    want = d2.run_on("interp", x=x)[0]
    got = d2.run_on("cpu", x=x)[0]
    xd = x.astype(np.float64)
    exact = 6 * xd * np.cos(xd ** 3) - 9 * xd ** 4 * np.sin(xd ** 3)
    np.testing.assert_allclose(want, exact, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got, exact, rtol=1e-4, atol=1e-5)


# -- every op's transformed graph, compiled ------------------------------------

@pytest.mark.parametrize("name", sorted(opcases.CASES))
def test_op_grad_and_jvp_compiled(name):
    f, _oracle, inputs, names = opcases.make_func(name)
    if name in ("stop_gradient", "eq", "ne", "lt", "le", "gt", "ge",
                "argmax", "argmin", "argmax_all", "topk_indices"):
        pytest.skip("no float path from the inputs to the output")
    g = f.grad(names)
    t = f.jvp(names)
    tangents = {f"tangent_{n}": np.random.default_rng(3).normal(size=inputs[n].shape)
                .astype(np.float32) for n in names}
    for fn, args in ((g, inputs), (t, {**inputs, **tangents})):
        want = fn.run_on("interp", **args)
        got = fn.run_on("cpu", **args)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=3e-4, atol=3e-5, err_msg=name)

"""Forward mode (dialect/jvp.py): every JVP rule against central finite
differences in float64 (cases shared with tests/test_autodiff.py), forward over
forward, reverse over forward, hvp parity with RLX, the signature layout, the
passes and error messages.
"""
from __future__ import annotations

import numpy as np
import pytest

import rlxc
from rlxc.dialect.autodiff import grad_module
from rlxc.dialect.jvp import JVP_RULES, HvpPass, JvpPass, hvp_module, jvp_module
from rlxc.dialect.module import get_func, signature

import opcases
from test_autodiff import (
    CASES,
    SHARED_SKIP,
    _u,
    check_vjp,
    fd_directional,
    float_args,
    make_case,
    mlp_build,
    rng,
    run,
)

try:
    from rlxc.dialect.passes import cleanup
except ImportError:
    cleanup = None


def check_jvp(module, arrays, names=None, rtol=1e-6, atol=1e-7, fd=True):
    """jvp_module(module) against FD of every output along random tangents."""
    sig = signature(get_func(module))
    names = names or float_args(module)
    jm = jvp_module(module, names)
    jm.verify()
    idx = [[a.name for a in sig].index(n) for n in names]
    vs = [rng.normal(size=np.shape(arrays[i])) for i in idx]
    got = run(jm, list(arrays) + vs)
    n_out = len(got) // 2
    prim = run(module, arrays)
    for a, b in zip(got[:n_out], prim):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    if fd:
        for k, (a, b) in enumerate(zip(got[n_out:], fd_directional(module, arrays, idx, vs))):
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"tangent {k}")
    return jm, vs, got[n_out:]


@pytest.mark.parametrize("op", sorted(JVP_RULES))
def test_every_rule_has_a_case(op):
    assert op in CASES, f"add a case for {op} to tests/test_autodiff.py CASES"


@pytest.mark.parametrize("op", sorted(JVP_RULES))
def test_jvp_against_fd(op):
    for label, inputs, build, flags in CASES.get(op, []):
        f = make_case(op, label, inputs, build, loss=False)
        _, vs, (t,) = check_jvp(f.module, list(inputs.values()), fd=flags.get("fd", True))
        if op == "rlx.fake_quant":  # straight-through
            np.testing.assert_allclose(t, vs[0])
        if op == "rlx.stop_gradient":
            np.testing.assert_array_equal(t, 0)


@pytest.mark.parametrize("op", sorted(JVP_RULES))
def test_jvp_of_jvp_against_fd(op):
    """The tangent graphs are themselves differentiable (forward over forward)."""
    for label, inputs, build, flags in CASES.get(op, []):
        if not flags.get("second", True):
            continue
        f = make_case(op, label, inputs, build)
        j1 = jvp_module(f.module, float_args(f.module))
        arrays = list(inputs.values()) + [rng.normal(size=np.shape(a)) for a in inputs.values()]
        check_jvp(j1, arrays, float_args(j1), rtol=1e-5, atol=1e-6,  # primals and tangents
                  fd=flags.get("fd", True))


def test_grad_of_jvp_against_fd():
    """Reverse over forward: grad of the tangent output w.r.t. primal and tangent inputs."""
    def build(s):
        x, w = s.input("x", (3, 4)), s.param("w", (4, 2))
        return ((x @ w).sin() * x.sum(1, keepdims=True)).sum()
    f = rlxc.Func("f", build)
    j = jvp_module(f.module, ["x", "w"])
    # make the tangent output the loss: keep only outputs [1]
    from rlxc.dialect.autodiff import set_outputs
    fn = get_func(j)
    set_outputs(fn, fn.body.block, [fn.body.block.last_op.operands[1]])
    arrays = [_u(3, 4), _u(4, 2), _u(3, 4), _u(4, 2)]
    check_vjp(j, arrays, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", sorted(opcases.CASES))
def test_jvp_of_shared_op_cases(name):
    if name in SHARED_SKIP:
        pytest.skip(SHARED_SKIP[name])
    f, _, inputs, _ = opcases.make_func(name)
    check_jvp(f.module, [np.asarray(a, np.float64) for a in inputs.values()], rtol=1e-5,
              atol=1e-6)


# ---------------------------------------------------------------- hvp parity with RLX

def test_hvp_sum_of_squares():
    f = rlxc.Func("f", lambda s: (s.input("x", (4,)) ** 2).sum())
    x, v = np.array([1.0, 2, 3, 4]), np.array([0.5, -0.25, 1, -1.5])
    loss, g, gv, hv = run(hvp_module(f.module, ["x"]), [x, v])
    assert loss == 30
    np.testing.assert_allclose(g, 2 * x)
    np.testing.assert_allclose(gv, np.dot(2 * x, v))  # <grad, v>: the jvp of the loss
    np.testing.assert_allclose(hv, 2 * v)
    if cleanup is not None:
        out = f.hvp("x").run_on("interp", x=x.astype(np.float32), tangent_x=v.astype(np.float32))
        np.testing.assert_allclose(out[3], 2 * v)


@pytest.mark.parametrize("quartic", [lambda x: x * x * x * x, lambda x: x ** 4],
                         ids=["mul", "pow"])
def test_hvp_quartic(quartic):
    f = rlxc.Func("f", lambda s: quartic(s.input("x", (3,))).sum())
    x, v = np.array([0.5, -1, 2]), np.array([1, 0.25, -0.5])
    loss, g, gv, hv = run(hvp_module(f.module, ["x"]), [x, v])
    np.testing.assert_allclose(loss, np.sum(x ** 4))
    np.testing.assert_allclose(g, 4 * x ** 3)
    np.testing.assert_allclose(gv, np.dot(4 * x ** 3, v))
    np.testing.assert_allclose(hv, [3, 3, -24])


def test_hvp_of_an_mlp_against_fd_of_the_gradient():
    f = rlxc.Func("mlp", mlp_build([6, 5, 3], act="tanh", batch=3))
    names = f.param_names()
    arrays = [_u(3, 6), np.array([0, 2, 1])] + [rng.normal(0, .5, size=f.param_shape_of(n))
                                                for n in names]
    vs = [rng.normal(size=a.shape) for a in arrays[2:]]
    h = hvp_module(f.module, names)
    assert [a.name for a in signature(get_func(h))][-len(names):] == [f"tangent_{n}"
                                                                      for n in names]
    got = run(h, arrays + vs)
    k = len(names)
    g = grad_module(f.module, names)
    want_hv = fd_directional(g, arrays, range(2, len(arrays)), vs)
    for a, b in zip(got[2 + k:], want_hv):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(got[1 + k], sum(np.sum(a * v) for a, v in zip(got[1:1 + k], vs)))


# ---------------------------------------------------------------- layout and zeros

def test_signature_and_output_layout():
    def build(s):
        x, w, n = s.input("x", (2, 3)), s.param("w", (3,)), s.input("n", (2,), "i32")
        y = x * w
        return y.sum(), y.sin(), n, w.exp()
    f = rlxc.Func("f", build)
    j = jvp_module(f.module, ["x"])
    sig = signature(get_func(j))
    assert [(a.name, a.kind, a.shape) for a in sig] == [
        ("x", "input", (2, 3)), ("w", "param", (3,)), ("n", "input", (2,)),
        ("tangent_x", "input", (2, 3))]
    x, w, n, v = _u(2, 3), _u(3), np.array([1, 2]), _u(2, 3)
    out = run(j, [x, w, n, v])
    assert len(out) == 8
    np.testing.assert_allclose(out[4], np.sum(v * w))
    np.testing.assert_allclose(out[5], np.cos(x * w) * v * w)
    np.testing.assert_array_equal(out[6], [0, 0])      # integer output: zero tangent
    np.testing.assert_array_equal(out[7], np.zeros(3))  # independent of x: zeros constant
    assert f.mlir() == rlxc.Func("f", build).mlir()      # the input module is untouched


@pytest.mark.skipif(cleanup is None, reason="rlxc.dialect.passes.cleanup not available yet")
def test_func_jvp_and_hvp():
    def build(s):
        x, w = s.input("x", (3,)), s.param("w", (3,))
        return (x * w).sin().sum(), x * 2.0
    w = np.array([0.5, -1.0, 2.0], np.float32)
    f = rlxc.Func("f", build).with_param("w", w)
    x, v = np.array([1.0, 2.0, -1.0], np.float32), np.array([1.0, 0.0, 2.0], np.float32)
    y, y2, t, t2 = f.jvp("x").run_on("interp", x=x, tangent_x=v)
    np.testing.assert_allclose(t, np.sum(np.cos(x * w) * w * v), rtol=1e-5)
    np.testing.assert_allclose(t2, 2 * v)
    loss, gw, gv, hv = f.hvp(["w"]).run_on("interp", x=x, tangent_w=v)
    np.testing.assert_allclose(gw, np.cos(x * w) * x, rtol=1e-5)
    np.testing.assert_allclose(hv, -np.sin(x * w) * x * x * v, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dev", ["interp", "cpu"])
def test_hvp_of_a_vector_output_is_of_its_sum(dev):
    """grad sums a non-scalar first output; hvp's <grad, v> is then that sum's directional
    derivative, a scalar (it was the output-shaped J v)."""
    f = rlxc.Func("cube", lambda s: s.input("x", (3,)) ** 3)
    x, v = np.array([1.0, 2.0, 3.0], np.float32), np.array([1.0, 0.5, -1.0], np.float32)
    y, g, gv, hv = f.hvp(["x"]).run_on(dev, x=x, tangent_x=v)
    np.testing.assert_allclose(y, x ** 3)
    np.testing.assert_allclose(g, 3 * x ** 2)
    assert np.shape(gv) == ()
    np.testing.assert_allclose(gv, np.sum(3 * x ** 2 * v), rtol=1e-6)
    np.testing.assert_allclose(hv, 6 * x * v, rtol=1e-6)


def test_zero_tangents_are_not_materialised():
    def build(s):
        x, y = s.input("x", (3,)), s.input("y", (3,))
        return (x * y + y.sin().exp()).sum()
    f = rlxc.Func("f", build)
    j = jvp_module(f.module, ["x"])
    names = [op.name for op in get_func(j).body.block.ops]
    new = names[len(list(get_func(f.module).body.block.ops)) - 1:]
    assert new == ["rlx.mul", "rlx.sum", "func.return"], new  # t*y, then sum: nothing else


GOLDEN_JVP = """\
builtin.module {
  func.func @f(%x: tensor<3xf32> {rlx.kind = "input", rlx.name = "x"}, %tangent_x: tensor<3xf32> {rlx.kind = "input", rlx.name = "tangent_x"}) -> (tensor<f32>, tensor<f32>) {
    %0 = rlx.mul %x, %x : tensor<3xf32>
    %1 = rlx.sum %0 axes = [0] : tensor<3xf32> -> tensor<f32>
    %2 = rlx.mul %tangent_x, %x : tensor<3xf32>
    %3 = rlx.mul %tangent_x, %x : tensor<3xf32>
    %4 = rlx.add %2, %3 : tensor<3xf32>
    %5 = rlx.sum %4 axes = [0] : tensor<3xf32> -> tensor<f32>
    func.return %1, %5 : tensor<f32>, tensor<f32>
  }
}"""


def test_golden_jvp_ir():
    f = rlxc.Func("f", lambda s: (lambda x: (x * x).sum())(s.input("x", (3,))))
    assert str(jvp_module(f.module, ["x"])) == GOLDEN_JVP


# ---------------------------------------------------------------- passes and errors

def test_passes_from_pipeline_strings():
    from xdsl.utils.arg_spec import parse_pipeline

    f = rlxc.Func("f", lambda s: (s.input("x", (2,)) * s.param("w", (2,))).sum())
    x, w, tx, tw = (np.array(a) for a in ([1.0, 2], [3.0, 4], [1.0, 0], [0.0, 1]))
    (spec,) = parse_pipeline("rlx-jvp{wrt=x,w}")
    m = f.module.clone()
    JvpPass.from_pass_spec(spec).apply(None, m)
    loss, t = run(m, [x, w, tx, tw])
    assert loss == 11 and t == 3 + 2
    (spec,) = parse_pipeline("rlx-hvp{wrt=w}")
    m = f.module.clone()
    HvpPass.from_pass_spec(spec).apply(None, m)
    loss, gw, gv, hv = run(m, [x, w, tw])
    assert np.allclose(gw, x) and gv == 2 and np.allclose(hv, 0)


def test_missing_rule_fails_at_transform_time(monkeypatch):
    monkeypatch.delitem(JVP_RULES, "rlx.sin")
    f = rlxc.Func("f", lambda s: s.input("x", (3,)).sin().sum())
    with pytest.raises(NotImplementedError, match="no JVP rule for rlx.sin"):
        jvp_module(f.module, ["x"])


def test_nested_jvp_names():
    f = rlxc.Func("f", lambda s: (s.input("x", (2,)) * s.input("tangent_x", (2,))).sum())
    j = jvp_module(f.module, ["x", "tangent_x"])
    assert [a.name for a in signature(get_func(j))] == ["x", "tangent_x", "tangent_x_2",
                                                        "tangent_tangent_x"]
    jj = jvp_module(j, ["x"])
    assert [a.name for a in signature(get_func(jj))][-1] == "tangent_x_3"


def test_bad_names():
    f = rlxc.Func("f", lambda s: (s.input("x", (2,)) * s.input("tangent_x", (2,))).sum())
    with pytest.raises(rlxc.NameLookupError, match=r"unknown name 'y'.*\['x', 'tangent_x'\]"):
        jvp_module(f.module, ["y"])
    with pytest.raises(ValueError, match="repeated"):
        jvp_module(f.module, ["tangent_x", "tangent_x"])
    with pytest.raises(rlxc.NameLookupError, match="rlx-hvp"):
        hvp_module(f.module, ["q"])

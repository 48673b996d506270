"""rlxc.scan / cond / while_loop against jax.lax (issue 16): values and gradients to 1e-5.

JAX is optional: without it the module skips (the NumPy and finite-difference checks
of the same programs are tests/test_control.py, which CI runs).  Both sides compute
in float64 (jax_enable_x64; rlxc's reference interpreter in float64) and on the native
CPU backend in float32 (checked to a float32 tolerance)."""
from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy

import rlxc  # noqa: E402
from rlxc import Func  # noqa: E402
from rlxc.dialect.interpreter import interpret  # noqa: E402

RNG = np.random.default_rng(7)
TOL = 1e-5


def run64(f, **kw):
    return interpret(f.module, [np.asarray(kw[a.name]) for a in f.signature()], np.float64)


def test_scan_values_and_grads_match_lax_scan():
    T, H = 7, 4

    def build(s):
        x = s.input("x", (T, H))
        h0 = s.input("h0", (H,))
        w = s.input("w", (H, H))

        def body(h, xt):
            h2 = (h @ w + xt).tanh()
            return h2, (h2 * xt).sum()
        h, ys = rlxc.scan(body, h0, x, reverse=True)
        return (h * h).sum() + (ys * ys).sum()

    def ref(x, h0, w):
        def body(h, xt):
            h2 = jnp.tanh(h @ w + xt)
            return h2, (h2 * xt).sum()
        h, ys = jax.lax.scan(body, h0, x, reverse=True)
        return (h * h).sum() + (ys * ys).sum()
    a = {"x": RNG.standard_normal((T, H)), "h0": RNG.standard_normal(H),
         "w": RNG.standard_normal((H, H)) * 0.5}
    f = Func("scan", build)
    np.testing.assert_allclose(run64(f, **a)[0], ref(**a), rtol=TOL)
    got = run64(f.grad(["x", "h0", "w"]), **a)
    want = jax.grad(ref, argnums=(0, 1, 2))(a["x"], a["h0"], a["w"])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=TOL, atol=TOL)
    native = f.grad(["w"]).run(**{k: v.astype(np.float32) for k, v in a.items()})[0]
    np.testing.assert_allclose(native, want[2], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("p", [True, False])
def test_cond_values_and_grads_match_lax_cond(p):
    def build(s):
        x = s.input("x", (3,))
        y = s.input("y", (3,))
        pred = s.input("p", (), "i1")
        out = rlxc.cond(pred, lambda a, b: (a * b).sin(), lambda a, b: a.exp() - b * b, x, y)
        return out.sum()

    def ref(x, y, p):
        return jax.lax.cond(p, lambda a, b: jnp.sin(a * b), lambda a, b: jnp.exp(a) - b * b,
                            x, y).sum()
    a = {"x": RNG.standard_normal(3), "y": RNG.standard_normal(3), "p": np.bool_(p)}
    f = Func("cond", build)
    np.testing.assert_allclose(run64(f, **a)[0], ref(**a), rtol=TOL)
    got = run64(f.grad(["x", "y"]), **a)
    want = jax.grad(ref, argnums=(0, 1))(a["x"], a["y"], a["p"])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=TOL, atol=TOL)


def test_while_loop_values_and_forward_mode_match_lax():
    def build(s):
        x = s.input("x", (3,))
        i, v = rlxc.while_loop(lambda c: c[1].sum() < 20.0,
                               lambda c: (c[0] + 1, c[1] * 1.7 + x * x),
                               (s.scalar(0, "i32"), x.abs()))
        return v.sum(), i

    def ref(x):
        i, v = jax.lax.while_loop(lambda c: c[1].sum() < 20.0,
                                  lambda c: (c[0] + 1, c[1] * 1.7 + x * x),
                                  (jnp.int32(0), jnp.abs(x)))
        return v.sum(), i
    x = RNG.standard_normal(3) + 0.5
    f = Func("wl", build)
    v, i = run64(f, x=x)
    rv, ri = ref(x)
    np.testing.assert_allclose(v, rv, rtol=TOL)
    assert int(i) == int(ri)
    t = RNG.standard_normal(3)
    got = run64(f.jvp(["x"]), x=x, tangent_x=t)[2]
    _, want = jax.jvp(lambda x: ref(x)[0], (x,), (t,))
    np.testing.assert_allclose(got, want, rtol=TOL, atol=TOL)
    # reverse mode: both refuse (JAX: a dynamic trip count)
    with pytest.raises(NotImplementedError, match="while_loop"):
        f.grad(["x"])
    with pytest.raises(ValueError):
        jax.grad(lambda x: ref(x)[0])(x)

"""Control flow as regions (issue 16): rlx.scan / rlx.while / rlx.if through tracing,
printing/parsing, verification, cleanup, grad, jvp, vmap, hvp, on the reference
interpreter against NumPy loops and central finite differences (float64)."""
from __future__ import annotations

import numpy as np
import pytest

import rlxc
from rlxc import Func, ShapeError
from rlxc.dialect import module as M
from rlxc.dialect.interpreter import interpret
from rlxc.dialect.passes import cleanup, run_pipeline

from gradcheck import fd_grad

RNG = np.random.default_rng(0)


def run64(f, **kw):
    """Interpret `f` in float64 on named arrays (signature order; bound params filled)."""
    args = []
    for a in f.signature():
        v = kw[a.name] if a.name in kw else f.param_binding(a.name)
        args.append(np.asarray(v))
    return interpret(f.module, args, float_dtype=np.float64)


def check_grads(f, wrt, inputs, tol=1e-6):
    """grad of output 0 w.r.t. each name in `wrt`, against central differences."""
    g = f.grad(wrt)
    got = run64(g, **inputs)
    for name, gv in zip(wrt, got):
        def loss(v, name=name):
            return float(np.sum(run64(f, **{**inputs, name: v})[0]))
        ref = fd_grad(loss, np.asarray(inputs[name], dtype=np.float64))
        np.testing.assert_allclose(gv, ref, atol=tol, rtol=1e-5, err_msg=f"d/d{name}")
    return g


def rnn_build(T=5, H=3):
    def build(s):
        x = s.input("x", (T, H))
        h0 = s.input("h0", (H,))
        w = s.input("w", (H, H))

        def body(h, xt):
            h2 = (h @ w + xt).tanh()
            return h2, h2 * h2
        h, ys = rlxc.scan(body, h0, x)
        return (h * h).sum() + ys.sum()
    return build


def rnn_ref(x, h0, w):
    h, tot = h0, 0.0
    for t in range(x.shape[0]):
        h = np.tanh(h @ w + x[t])
        tot += (h * h).sum()
    return tot + (h * h).sum()


def rnn_inputs(T=5, H=3):
    return {"x": RNG.standard_normal((T, H)), "h0": RNG.standard_normal(H),
            "w": RNG.standard_normal((H, H)) * 0.5}


# ---------------------------------------------------------------- dialect and tracing

def test_scan_values_and_mlir_round_trip():
    f = Func("rnn", rnn_build())
    a = rnn_inputs()
    np.testing.assert_allclose(run64(f, **a)[0], rnn_ref(**a), rtol=1e-12)
    text = f.mlir()
    assert '"rlx.scan"' in text and "rlx.yield" in text
    g = Func.from_mlir(text)
    assert g.mlir() == text
    np.testing.assert_allclose(run64(g, **a)[0], rnn_ref(**a), rtol=1e-12)
    # f32 on the interpreter device too
    out = f.run_on("interp", **{k: v.astype(np.float32) for k, v in a.items()})
    np.testing.assert_allclose(out[0], rnn_ref(**a), rtol=1e-5)


def test_scan_ir_does_not_grow_with_length():
    n_short = len(Func("a", rnn_build(T=4)).mlir().splitlines())
    n_long = len(Func("b", rnn_build(T=4000)).mlir().splitlines())
    assert n_short == n_long


def test_scan_tuple_carry_reverse_xs_none_and_fori():
    def build(s):
        x = s.input("x", (4, 2))
        a0 = s.input("a0", (2,))

        def body(c, xt):
            a, n = c
            return (a * 0.5 + xt, n + 1), (a.sum(), a * 2.0)
        (a, n), (sums, twice) = rlxc.scan(body, (a0, 0), x, reverse=True)
        (_, k), none = rlxc.scan(lambda c, _: ((c[0], c[1] + 2), None), (a0, 0), None, length=3)
        assert none is None
        tot = rlxc.fori_loop(1, 4, lambda i, v: v + i.cast("f32"), a0)
        return a, n, sums, twice, k, tot
    f = Func("f", build)
    x, a0 = RNG.standard_normal((4, 2)), RNG.standard_normal(2)
    a, n, sums, twice, k, tot = run64(f, x=x, a0=a0)
    ra, rs, rt = a0.copy(), [None] * 4, [None] * 4
    for t in (3, 2, 1, 0):
        rs[t], rt[t] = ra.sum(), ra * 2
        ra = ra * 0.5 + x[t]
    np.testing.assert_allclose(a, ra)
    np.testing.assert_allclose(sums, rs)
    np.testing.assert_allclose(twice, np.stack(rt))
    assert int(n) == 4 and int(k) == 6
    np.testing.assert_allclose(tot, a0 + 6)


def test_cond_and_while_values_with_captures():
    def build(s):
        x = s.input("x", (3,))
        p = s.input("p", (), "i1")
        w = s.input("w", (3,))
        y = rlxc.cond(p, lambda v: (v * w).exp(), lambda v: v - w, x)

        def body(c):
            i, v = c
            return i + 1, v * 0.5 + w     # captures w
        i, v = rlxc.while_loop(lambda c: c[1].sum() > 0.1, body, (s.scalar(0, "i32"), x.abs()))
        return y, i, v
    f = Func("f", build)
    x, w = RNG.standard_normal(3), RNG.standard_normal(3) * 0.01
    for p in (True, False):
        y, i, v = run64(f, x=x, p=np.bool_(p), w=w)
        np.testing.assert_allclose(y, np.exp(x * w) if p else x - w)
    ri, rv = 0, np.abs(x)
    while rv.sum() > 0.1:
        ri, rv = ri + 1, rv * 0.5 + w
    assert int(i) == ri
    np.testing.assert_allclose(v, rv)


def test_nested_regions_capture_through_each_level():
    def build(s):
        x = s.input("x", (4, 2))
        w = s.input("w", (2,))
        p = s.input("p", (), "i1")

        def body(c, xt):   # a cond inside the scan captures w from two levels up
            nc = rlxc.cond(p, lambda a: a + w * xt, lambda a: a - w, c)
            return nc, None
        c, _ = rlxc.scan(body, w * 0.0, x)
        return c
    f = Func("f", build)
    x, w = RNG.standard_normal((4, 2)), RNG.standard_normal(2)
    np.testing.assert_allclose(run64(f, x=x, w=w, p=np.bool_(True))[0], (w * x).sum(0))
    np.testing.assert_allclose(run64(f, x=x, w=w, p=np.bool_(False))[0], -4 * w)
    assert Func.from_mlir(f.mlir()).mlir() == f.mlir()


def test_cond_branch_mismatch_names_both_branches():
    def build(s):
        x = s.input("x", (3,))
        return rlxc.cond(x.sum() > 0, lambda v: v, lambda v: v.sum(), x)
    with pytest.raises(ShapeError, match=r"true_fn returns \(tensor<3xf32>\) but false_fn "
                                         r"returns \(tensor<f32>\)"):
        Func("f", build)


def test_scan_carry_mismatch_and_bad_predicates():
    def bad_carry(s):
        x = s.input("x", (3,))
        return rlxc.scan(lambda c, _: (c.sum(), None), x, None, length=2)[0]
    with pytest.raises(ShapeError, match="scan: body returns the carry"):
        Func("f", bad_carry)

    def bad_while(s):
        x = s.input("x", (3,))
        return rlxc.while_loop(lambda c: c.sum(), lambda c: c, x)
    with pytest.raises(TypeError, match="cond_fn must return a rank-0 boolean"):
        Func("g", bad_while)

    def bad_pred(s):
        x = s.input("x", (3,))
        return rlxc.cond(x > 0, lambda v: v, lambda v: v, x)
    with pytest.raises(ShapeError, match="pred must be a rank-0"):
        Func("h", bad_pred)


def test_verifier_rejects_mismatched_yield():
    text = Func("rnn", rnn_build()).mlir()
    M.parse(text)
    bad = text.replace("length = 5", "length = 6")
    assert bad != text
    with pytest.raises(Exception, match="rows along axis 0"):
        M.parse(bad)


# ---------------------------------------------------------------- cleanup across regions

def test_cleanup_hoists_invariants_and_folds_constant_cond():
    def build(s):
        x = s.input("x", (4, 3))
        w = s.input("w", (3, 3))

        def body(h, xt):
            wt = w.T * 0.5                                     # loop invariant
            h2 = (h @ wt + xt).tanh()
            h3 = rlxc.cond(s.scalar(True, "i1"), lambda a: a * 2.0, lambda a: a * 3.0, h2)
            return h3, h2.sum()
        h, ys = rlxc.scan(body, x[0], x)
        return h
    f = Func("f", build)
    m = cleanup(f.module.clone())
    text = str(m)
    body = text[text.index('"rlx.scan"'):]
    pre = text[:text.index('"rlx.scan"')]
    assert "rlx.transpose" in pre and "rlx.transpose" not in body   # hoisted
    assert "rlx.if" not in text                                     # folded
    assert "tensor<4xf32>" not in text                              # unused ys dropped
    x, w = RNG.standard_normal((4, 3)), RNG.standard_normal((3, 3))
    np.testing.assert_allclose(interpret(m, [x, w], np.float64)[0], run64(f, x=x, w=w)[0])
    # the named pass and a round trip through the pipeline runner
    assert "rlx.if" not in str(run_pipeline(f.module, "regions"))


# ---------------------------------------------------------------- transforms

def test_grad_of_scan_matches_finite_differences():
    f = Func("rnn", rnn_build())
    g = check_grads(f, ["w", "x", "h0"], rnn_inputs())
    text = g.mlir()
    assert text.count('"rlx.scan"') == 2 and "reverse" in text   # forward + reverse scan


def test_grad_of_scan_memory_is_length_times_carry():
    """Residuals are the carries per step: no value of the gradient holds more than
    length x (carry or row) elements, nothing quadratic in the length."""
    T, H = 64, 3
    g = Func("rnn", rnn_build(T, H)).grad(["w"])
    import re
    sizes = [np.prod([int(d) for d in m.split("x")[:-1]] or [1])
             for m in re.findall(r"tensor<([0-9x]*[a-z0-9]+)>", g.mlir())]
    assert max(sizes) <= T * H


def test_grad_of_cond_and_while_error():
    def build(s):
        x = s.input("x", (3,))
        p = s.input("p", (), "i1")
        return rlxc.cond(p, lambda v: (v * v).sin(), lambda v: v.exp() * 2.0, x).sum()
    f = Func("f", build)
    for p in (True, False):
        check_grads(f, ["x"], {"x": RNG.standard_normal(3), "p": np.bool_(p)})

    def wl(s):
        x = s.input("x", (3,))
        return rlxc.while_loop(lambda c: c.sum() < 10.0, lambda c: c * 2.0, x).sum()
    with pytest.raises(NotImplementedError, match="reverse-mode of while_loop with a dynamic "
                                                  "trip count is not supported; use scan or "
                                                  "fori_loop"):
        Func("w", wl).grad(["x"])


def _jvp_check(f, name, inputs, out=0):
    j = f.jvp([name])
    v = RNG.standard_normal(np.shape(inputs[name]))
    n_out = f.output_count()
    got = run64(j, **inputs, **{f"tangent_{name}": v})[n_out + out]
    eps = 1e-6
    hi = run64(f, **{**inputs, name: inputs[name] + eps * v})[out]
    lo = run64(f, **{**inputs, name: inputs[name] - eps * v})[out]
    np.testing.assert_allclose(got, (hi - lo) / (2 * eps), atol=1e-6, rtol=1e-5)


def test_jvp_of_scan_cond_while():
    _jvp_check(Func("rnn", rnn_build()), "w", rnn_inputs())

    def build(s):
        x = s.input("x", (3,))
        p = s.input("p", (), "i1")
        y = rlxc.cond(p, lambda v: (v * v).sin(), lambda v: v.exp(), x)
        z = rlxc.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, (c[1] * x).sin()),
                            (s.scalar(0, "i32"), x))[1]
        return y, z
    f = Func("f", build)
    for p in (True, False):
        a = {"x": RNG.standard_normal(3), "p": np.bool_(p)}
        _jvp_check(f, "x", a, 0)
        _jvp_check(f, "x", a, 1)


def test_vmap_of_scan_cond_while_against_a_loop():
    def build(s):
        x = s.input("x", (4, 2))
        h0 = s.input("h0", (2,))
        w = s.input("w", (2, 2))
        h, ys = rlxc.scan(lambda h, xt: ((h @ w + xt).tanh(),) * 2, h0, x)
        p = h.sum() > 0
        c = rlxc.cond(p, lambda a: a * 2.0, lambda a: a - 1.0, h)   # batched predicate
        n, v = rlxc.while_loop(lambda c: c[1].abs().sum() < 4.0,    # per-lane trip counts
                               lambda c: (c[0] + 1, c[1] * 1.5 + 0.1), (s.scalar(0, "i32"), h))
        return ys, c, n, v
    f = Func("f", build)
    B = 5
    xb, hb, w = (RNG.standard_normal((B, 4, 2)), RNG.standard_normal((B, 2)),
                 RNG.standard_normal((2, 2)))
    vf = f.vmap(["x", "h0"], B)
    got = run64(vf, x=xb, h0=hb, w=w)
    for b in range(B):
        ref = run64(f, x=xb[b], h0=hb[b], w=w)
        for g, r in zip(got, ref):
            np.testing.assert_allclose(g[b], r, rtol=1e-12)
    counts = {int(n) for n in got[2]}
    assert len(counts) > 1, "lanes should finish after different trip counts"


def test_hvp_and_per_example_grads_through_scan():
    f = Func("rnn", rnn_build())
    a = rnn_inputs()
    h = f.hvp(["w"])
    v = RNG.standard_normal((3, 3))
    got = run64(h, **a, tangent_w=v)[-1]
    g = f.grad(["w"])
    eps = 1e-6
    ref = (run64(g, **{**a, "w": a["w"] + eps * v})[0] -
           run64(g, **{**a, "w": a["w"] - eps * v})[0]) / (2 * eps)
    np.testing.assert_allclose(got, ref, atol=1e-6, rtol=1e-5)
    # vmap(grad): per-example gradients of an RNN
    B = 3
    pe = g.vmap(["x", "h0"], B)
    xb, hb = RNG.standard_normal((B, 5, 3)), RNG.standard_normal((B, 3))
    got = run64(pe, x=xb, h0=hb, w=a["w"])[0]
    for b in range(B):
        np.testing.assert_allclose(got[b], run64(g, x=xb[b], h0=hb[b], w=a["w"])[0],
                                   rtol=1e-12)


def test_rk4_ode_with_fori_loop_parameter_gradients_match_fd():
    """dy/dt = -k*y + a*sin(y), integrated with RK4 in a fori_loop; d(y_T)/d(k, a)."""
    dt, steps = 0.05, 40

    def build(s):
        y0 = s.input("y0", (2,))
        k = s.input("k", (2,))
        a = s.input("a", (2,))

        def f(y):
            return -k * y + a * y.sin()

        def step(i, y):
            k1 = f(y)
            k2 = f(y + k1 * (dt / 2))
            k3 = f(y + k2 * (dt / 2))
            k4 = f(y + k3 * dt)
            return y + (k1 + k2 * 2.0 + k3 * 2.0 + k4) * (dt / 6)
        return (rlxc.fori_loop(0, steps, step, y0) ** 2).sum()
    fn = Func("ode", build)
    check_grads(fn, ["k", "a", "y0"], {"y0": np.array([1.0, -0.5]), "k": np.array([0.7, 1.3]),
                                        "a": np.array([0.2, -0.4])})


def test_rlxc_opt_round_trips_region_ops(tmp_path):
    """`rlxc opt` reads the printed module (generic form of the region ops, custom form
    of the ops inside), runs passes into the regions and prints text that parses again."""
    import subprocess
    import sys
    src = tmp_path / "rnn.mlir"
    src.write_text(Func("rnn", rnn_build()).mlir())
    res = subprocess.run([sys.executable, "-m", "rlxc.cli.main", "opt", str(src), "-p",
                          "rlx-grad{wrt=w},cleanup"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    g = M.parse(res.stdout)
    assert res.stdout.count('"rlx.scan"') == 2
    a = rnn_inputs()
    want = run64(Func("rnn", rnn_build()).grad(["w"]), **a)[0]
    np.testing.assert_allclose(interpret(g, [a["x"], a["h0"], a["w"]], np.float64)[0], want)


def test_a_body_tensor_used_after_the_body_is_a_clear_error():
    leak = []

    def build(s):
        x = s.input("x", (3,))

        def body(c, _):
            leak.append(c * 2.0)
            return c, None
        c, _ = rlxc.scan(body, x, None, length=2)
        return c + leak[0]
    with pytest.raises(ValueError, match="inside a scan/while_loop/cond body that has finished"):
        Func("f", build)


def test_trace_digest_sees_the_bodies():
    """The trace hash keys the compile caches before any IR exists: bodies that differ
    (an op, a capture, a length) give different hashes; the same program the same."""
    def make(op="tanh", n=3, cap=True):
        def build(s):
            x = s.input("x", (n, 2))
            w = s.input("w", (2,))
            k = w if cap else x[0]
            return rlxc.scan(lambda c, xt: (getattr(c * k + xt, op)(), None), w, x)[0]
        return Func("f", build).trace_hash()
    assert make() == make()
    assert len({make(), make("sin"), make(n=4), make(cap=False)}) == 4


def test_vmap_cond_with_a_shared_predicate_keeps_one_if():
    def build(s):
        x = s.input("x", (3,))
        p = s.input("p", (), "i1")
        return rlxc.cond(p, lambda a: a.exp(), lambda a: a * 2.0, x)
    f = Func("f", build)
    vf = f.vmap(["x"], 4)
    assert vf.mlir().count('"rlx.if"') == 1 and "rlx.select" not in vf.mlir()
    xb = RNG.standard_normal((4, 3))
    for p in (True, False):
        got = run64(vf, x=xb, p=np.bool_(p))[0]
        np.testing.assert_allclose(got, np.exp(xb) if p else xb * 2)


def test_tracing_control_flow_imports_no_xdsl():
    import subprocess
    import sys
    code = ("import sys, rlxc\n"
            "f = rlxc.Func('f', lambda s: rlxc.scan(lambda c, x: (c + x, c * x), "
            "s.input('a', (2,)), s.input('x', (3, 2)))[1])\n"
            "f.trace_hash()\n"
            "assert 'xdsl' not in sys.modules and 'llvmlite' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)

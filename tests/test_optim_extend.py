"""Optimizers as an extension point (issue 13 item 5): a user's Optimizer subclass in
opt.step, Func.train_step, Trainer and `rlxc compile --train`; and RLX's NAdamW, RAdam,
LAMB, Adafactor and Muon against NumPy references over 10 steps (interp and cpu).

Two references per optimizer: its own float32 NumPy `step` (the op-by-op oracle the
compiled step follows: bit for bit on the interpreter except Muon's matmuls), and an
independent float64 textbook formula written here (checks the formula itself)."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from test_train import DEVICES

from rlxc import Func, LrSchedule
from rlxc.optim import LAMB, Adafactor, Muon, NAdamW, Optimizer, RAdam, select

F32 = np.float32
F64 = np.float64


def model():
    """Elementwise (fast to compile) with 2-D params both ways round and a 1-D one."""
    def build(s):
        x, y, z = s.input("x", (4, 3)), s.input("y", (4, 3)), s.input("z", (2, 5))
        w, b, w2 = s.param("w", (4, 3)), s.param("b", (3,)), s.param("w2", (2, 5))
        d = (x * w + b).tanh() - y
        return (d * d).mean() + (z * w2).sin().sum()
    return Func("m", build).init_randn(7, 0.5)


def data(n=10, seed=0):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((4, 3)).astype(F32),
             "y": rng.standard_normal((4, 3)).astype(F32),
             "z": rng.standard_normal((2, 5)).astype(F32)} for _ in range(n)]


def ref_steps(f, opt, batches, sched=None):
    """NumPy reference loop: grads on the interpreter, then opt.step (float32)."""
    vg = f.value_and_grad(f.param_names())
    params = {n: np.array(a, F32) for n, a in f.params().items()}
    for i, b in enumerate(batches):
        _, *gs = vg.run_on("interp", {**b, **params})
        if sched is not None:
            opt.set_lr(sched.lr_at(i))
        opt.step(params, dict(zip(f.param_names(), gs)))
    return params


MORE = [
    ("nadamw", lambda: NAdamW(0.02, weight_decay=0.05)),
    ("radam", lambda: RAdam(0.05, betas=(0.9, 0.99), weight_decay=0.01)),
    ("lamb", lambda: LAMB(0.02, weight_decay=0.01)),
    ("adafactor", lambda: Adafactor(0.02, weight_decay=0.01)),
    ("adafactor-b1", lambda: Adafactor(0.02, beta1=0.9)),
    ("muon", lambda: Muon(0.02)),
    ("muon-plain", lambda: Muon(0.02, nesterov=False, weight_decay=0.0)),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name, make", MORE, ids=[m[0] for m in MORE])
def test_more_optimizers_match_numpy_step_over_10_steps(device, name, make):
    f, batches = model(), data()
    sched = LrSchedule.warmup_cosine(make().lr, 0.0, 3, 10)
    want = ref_steps(f, make(), batches, sched)
    opt, g = make(), f
    for i, b in enumerate(batches):
        g, _ = g.train_step(opt, b, schedule=sched, step=i, device=device)
    assert opt.t == 10
    for n, a in want.items():
        if device == "interp" and not name.startswith("muon"):
            np.testing.assert_array_equal(g.params()[n], a, err_msg=n)
        else:  # compiled sums / matmuls round differently from NumPy's
            np.testing.assert_allclose(g.params()[n], a, rtol=1e-5, atol=2e-6, err_msg=n)
        assert not np.array_equal(g.params()[n], f.params()[n]), n


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name, make", MORE[:1] + MORE[3:6], ids=["nadamw", "adafactor",
                                                                   "adafactor-b1", "muon"])
def test_more_optimizers_in_the_trainer(device, name, make):
    f, batches = model(), data(6)
    tr = f.trainer(make(), device=device)
    for b in batches:
        tr.step(b)
    opt, g = make(), f
    for b in batches:
        g, _ = g.train_step(opt, b, device=device)
    for n, a in g.params().items():
        np.testing.assert_array_equal(tr.func.params()[n], a, err_msg=n)
    # the slots (shapes per param: Adafactor's factored r/c, Muon's unused v)
    sd = tr.state_dict()
    for p, st in opt.state.items():
        for s, a in st.items():
            np.testing.assert_array_equal(sd[f"optim.{s}.{p}"], a, err_msg=f"{s}.{p}")


# -- independent float64 references (textbook formulas) --------------------------------------

def _adam_mv(st, g, b1, b2):
    st["m"] = b1 * st.get("m", 0) + (1 - b1) * g
    st["v"] = b2 * st.get("v", 0) + (1 - b2) * g * g
    return st["m"], st["v"]


def nadamw64(p, g, st, t, lr, b1=0.9, b2=0.999, eps=1e-8, wd=0.05):
    m, v = _adam_mv(st, g, b1, b2)
    mh = b1 * m / (1 - b1 ** (t + 1)) + (1 - b1) * g / (1 - b1 ** t)
    return p - lr * (mh / (np.sqrt(v / (1 - b2 ** t)) + eps) + wd * p)


def radam64(p, g, st, t, lr, b1=0.9, b2=0.99, eps=1e-8, wd=0.01):
    m, v = _adam_mv(st, g, b1, b2)
    mh = m / (1 - b1 ** t)
    rho_inf = 2 / (1 - b2) - 1
    rho = rho_inf - 2 * t * b2 ** t / (1 - b2 ** t)
    if rho > 5:
        r = np.sqrt((rho - 4) * (rho - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho))
        u = mh * r * np.sqrt(1 - b2 ** t) / (np.sqrt(v) + eps)
    else:
        u = mh
    return p - lr * (u + wd * p)


def lamb64(p, g, st, t, lr, b1=0.9, b2=0.999, eps=1e-8, wd=0.01):
    m, v = _adam_mv(st, g, b1, b2)
    u = (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps) + wd * p
    pn, un = np.linalg.norm(p), np.linalg.norm(u)
    return p - lr * (pn / un if pn > 0 and un > 0 else 1.0) * u


def adafactor64(p, g, st, t, lr, wd=0.01, b1=0.0):
    b2t = 1 - t ** -0.8
    g2 = g * g + 1e-30
    if p.ndim == 2:
        st["r"] = b2t * st.get("r", 0) + (1 - b2t) * g2.mean(1)
        st["c"] = b2t * st.get("c", 0) + (1 - b2t) * g2.mean(0)
        vhat = np.outer(st["r"] / st["r"].mean(), st["c"])
    else:
        vhat = st["v"] = b2t * st.get("v", 0) + (1 - b2t) * g2
    u = g / np.sqrt(vhat)
    u = u / max(np.sqrt(np.mean(u * u)), 1.0)
    if b1:
        u = st["m"] = b1 * st.get("m", 0) + (1 - b1) * u
    return p - lr * (u + wd * p)


def muon64(p, g, st, t, lr, mu=0.95, b1=0.9, b2=0.999, eps=1e-8, wd=0.01):
    if p.ndim != 2:
        m, v = _adam_mv(st, g, b1, b2)
        return p - lr * ((m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps) + wd * p)
    st["m"] = mu * st.get("m", 0) + g
    u = g + mu * st["m"]
    x = u.T if u.shape[0] > u.shape[1] else u
    x = x / (np.linalg.norm(x) + 1e-7)
    for _ in range(5):
        a = x @ x.T
        x = 3.4445 * x + (-4.7750 * a + 2.0315 * a @ a) @ x
    x = x.T if u.shape[0] > u.shape[1] else x
    return p - lr * (x * max(1, p.shape[0] / p.shape[1]) ** 0.5 + wd * p)


TEXTBOOK = [
    ("nadamw", MORE[0][1], nadamw64),
    ("radam", MORE[1][1], radam64),
    ("lamb", MORE[2][1], lamb64),
    ("adafactor", MORE[3][1], adafactor64),
    ("adafactor-b1", lambda: Adafactor(0.02, beta1=0.9, weight_decay=0.01),
     lambda *a: adafactor64(*a, b1=0.9)),
    ("muon", MORE[5][1], muon64),
]


@pytest.mark.parametrize("name, make, ref", TEXTBOOK, ids=[t[0] for t in TEXTBOOK])
def test_numpy_step_matches_float64_textbook_formula(name, make, ref):
    rng = np.random.default_rng(3)
    shapes = {"w": (4, 3), "w2": (2, 5), "b": (3,)}
    p32 = {k: rng.standard_normal(s).astype(F32) for k, s in shapes.items()}
    p64 = {k: v.astype(F64) for k, v in p32.items()}
    st64 = {k: {} for k in shapes}
    opt = make()
    for t in range(1, 11):
        grads = {k: rng.standard_normal(s).astype(F32) for k, s in shapes.items()}
        opt.step(p32, grads)
        for k in shapes:
            p64[k] = ref(p64[k], grads[k].astype(F64), st64[k], t, opt.lr)
    for k in shapes:
        np.testing.assert_allclose(p32[k], p64[k], rtol=2e-5, atol=2e-6, err_msg=k)
        assert not np.allclose(p32[k], p64[k] + 1e-3), k


def test_adafactor_factored_state_and_resume():
    opt = Adafactor(0.01, beta1=0.5)
    p = {"w": np.ones((4, 3), F32), "b": np.ones(3, F32)}
    opt.step(p, {"w": np.full((4, 3), 0.5, F32), "b": np.full(3, 0.5, F32)})
    shapes = {k: {s: a.shape for s, a in st.items()} for k, st in opt.state.items()}
    assert shapes == {"w": {"r": (4,), "c": (3,), "v": (1,), "m": (4, 3)},
                      "b": {"r": (1,), "c": (1,), "v": (3,), "m": (3,)}}
    sd = opt.state_dict()
    again = Adafactor(0.5, beta1=0.5)
    again.load_state_dict(sd, params=p)
    g = {"w": np.full((4, 3), 0.25, F32), "b": np.full(3, 2.0, F32)}
    q = {k: v.copy() for k, v in p.items()}
    opt.step(p, g)
    again.step(q, g)
    for k in p:
        np.testing.assert_array_equal(p[k], q[k])
    sd["r.w"] = np.ones(3, F32)
    with pytest.raises(ValueError, match=r"param 'w' has shape \(4, 3\), its state 'r' has"):
        Adafactor(0.01, beta1=0.5).load_state_dict(sd, params=p)


# -- a user's optimizer ------------------------------------------------------------------------

class SignMomentum(Optimizer):
    """The Optimizer docstring's example, with a t-dependent scalar and a select."""

    kind = "signmomentum"
    slot_names = ("m",)
    numeric_hps = ("beta",)

    def __init__(self, lr, beta=0.9):
        super().__init__(lr=lr, beta=beta)

    def scalars(self, t, lr):
        beta = self.hyperparams()["beta"]
        warm = select(t < 3, 0.5, 1.0)  # half steps for the first two updates
        return {"lr": lr * warm / (1.0 + 0.1 * t), "beta": beta, "omb": 1.0 - beta}

    def update(self, b, p, g, state, s):
        m = state["m"] * s["beta"] + s["omb"] * g
        return p - s["lr"] * m.sign(), {"m": m}


def sign_momentum_reference(p, grads, lr, beta=0.9):
    """The same rule in NumPy float32, written out independently."""
    p, m = p.copy(), np.zeros_like(p)
    for t, g in enumerate(grads, 1):
        m = m * F32(beta) + F32(1 - beta) * g
        p = p - F32(lr * (0.5 if t < 3 else 1.0) / (1.0 + 0.1 * t)) * np.sign(m)
    return p


def lin():
    return Func("lin", lambda s: (s.param("w", (3,)) * s.input("c", (3,))).sum()) \
        .with_param("w", [1.0, -2.0, 0.5])


CS = [np.array(c, F32) for c in ([1, -1, 2], [0.5, 3, -1], [-2, 1, 1], [1, 1, 1], [3, -2, 1])]


def test_custom_optimizer_numpy_step_runs_update_on_the_interpreter():
    opt = SignMomentum(0.125)
    p = {"w": np.array([1.0, -2.0, 0.5], F32)}
    for c in CS:
        opt.step(p, {"w": c})
    np.testing.assert_array_equal(p["w"], sign_momentum_reference(
        np.array([1.0, -2.0, 0.5], F32), CS, 0.125))
    assert opt.t == 5 and opt.state["w"]["m"].shape == (3,)


@pytest.mark.parametrize("device", DEVICES)
def test_custom_optimizer_in_train_step_and_trainer(device):
    want = sign_momentum_reference(np.array([1.0, -2.0, 0.5], F32), CS, 0.125)
    opt, g = SignMomentum(0.125), lin()
    for c in CS:
        g, _ = g.train_step(opt, {"c": c}, device=device)
    np.testing.assert_array_equal(g.params()["w"], want)
    tr = lin().trainer(SignMomentum(0.125), device=device)
    for c in CS:
        tr.step({"c": c})
    np.testing.assert_array_equal(tr.func.params()["w"], want)
    # lr and numeric values are runtime scalars; zero-ness and the class are structure
    assert SignMomentum(0.125).structure() == SignMomentum(0.7, beta=0.5).structure()
    assert SignMomentum(0.125).structure() != SignMomentum(0.125, beta=0.0).structure()

    class Other(SignMomentum):
        def update(self, b, p, g, state, s):
            return p, state

    assert Other(0.125).structure() != SignMomentum(0.125).structure()


def test_subclass_without_update_names_the_method():
    class Half(Optimizer):
        def __init__(self, lr):
            super().__init__(lr=lr)

    with pytest.raises(NotImplementedError, match=r"Half: define update\(b, p, g, state, s\)"):
        lin().train_step(Half(0.1), {"c": CS[0]}, device="interp")


def test_scalar_recipe_is_c_of_t_and_lr_and_refuses_python_branches():
    rec = SignMomentum(0.1, beta=0.8).scalar_recipe()
    assert rec["beta"] == ("const", float(F32(0.8)))
    assert rec["lr"][0] == "expr" and "?" in rec["lr"][1] and "((double)t)" in rec["lr"][1]
    assert Adafactor(0.1).scalar_recipe()["lr"] == ("lr",)

    class Branchy(SignMomentum):
        def scalars(self, t, lr):
            return {"lr": lr if t > 2 else lr / 2, "beta": 0.9, "omb": 0.1}

    with pytest.raises(ValueError, match=r"Branchy.scalars\(t, lr\) cannot be computed in C.*"
                                         r"select"):
        Branchy(0.1).scalar_recipe()

    class Stateful(SignMomentum):
        calls = 0

        def scalars(self, t, lr):
            Stateful.calls += 1
            return {"lr": lr, "beta": 0.9 if Stateful.calls > 1 else 0.5, "omb": 0.1}

    with pytest.raises(ValueError, match="'beta' is not a function of t and lr alone"):
        Stateful(0.1).scalar_recipe()


from rlxc import export as aot


def test_custom_optimizer_in_the_c_train_step(tmp_path):
    from rlxc.runtime import load

    f = lin()
    spec = aot.spec_from_func(f, "lin")
    spec.train = aot.train_spec(f, SignMomentum(0.125))
    aot.build_artifact(spec, str(tmp_path))
    m = load(tmp_path)
    for c in CS:
        m.train_step(c=c)
    np.testing.assert_array_equal(
        m.get_param("w"), sign_momentum_reference(np.array([1.0, -2.0, 0.5], F32), CS, 0.125))


@pytest.mark.parametrize("make", [MORE[1][1], MORE[3][1], MORE[5][1]],
                         ids=["radam", "adafactor", "muon"])
def test_more_optimizers_in_the_c_train_step(make, tmp_path):
    """The C scalar recipe (RAdam's rectification switch, Adafactor's t**-0.8)."""
    from rlxc.runtime import load

    f, batches = model(), data(8)
    spec = aot.spec_from_func(f, "m")
    opt = make()
    spec.train = aot.train_spec(f, opt)
    aot.build_artifact(spec, str(tmp_path))
    m = load(tmp_path)
    g = f
    for b in batches:
        m.train_step(lr=opt.lr, **b)
        g, _ = g.train_step(opt, b, device="cpu")
    for n, a in g.params().items():
        np.testing.assert_allclose(m.get_param(n), a, rtol=1e-6, atol=1e-7, err_msg=n)


OPT_FILE = textwrap.dedent('''
    from rlxc.optim import Optimizer, select

    class SignMomentum(Optimizer):
        kind = "signmomentum"
        slot_names = ("m",)
        numeric_hps = ("beta",)

        def __init__(self, lr, beta=0.9):
            super().__init__(lr=lr, beta=beta)

        def scalars(self, t, lr):
            beta = self.hyperparams()["beta"]
            warm = select(t < 3, 0.5, 1.0)
            return {"lr": lr * warm / (1.0 + 0.1 * t), "beta": beta, "omb": 1.0 - beta}

        def update(self, b, p, g, state, s):
            m = state["m"] * s["beta"] + s["omb"] * g
            return p - s["lr"] * m.sign(), {"m": m}
''')

MODEL_FILE = textwrap.dedent('''
    import rlxc

    def lin():
        return rlxc.Func("lin", lambda s: (s.param("w", (3,)) * s.input("c", (3,))).sum()) \\
            .with_param("w", [1.0, -2.0, 0.5])
''')


def test_custom_optimizer_with_rlxc_compile_train(tmp_path):
    (tmp_path / "myopt.py").write_text(OPT_FILE)
    (tmp_path / "model.py").write_text(MODEL_FILE)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    p = subprocess.run([sys.executable, "-m", "rlxc.cli.main", "compile",
                        f"{tmp_path}/model.py:lin", "-o", str(out), "--train", "--lr", "0.125",
                        "--optimizer", f"{tmp_path}/myopt.py:SignMomentum"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    from rlxc.runtime import load

    m = load(out)
    for c in CS:
        m.train_step(c=c)
    np.testing.assert_array_equal(
        m.get_param("w"), sign_momentum_reference(np.array([1.0, -2.0, 0.5], F32), CS, 0.125))
    bad = subprocess.run([sys.executable, "-m", "rlxc.cli.main", "compile",
                          f"{tmp_path}/model.py:lin", "-o", str(out), "--train",
                          "--optimizer", f"{tmp_path}/myopt.py:Nope"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 2 and "has no optimizer class 'Nope'" in bad.stderr

"""Optimizer numerics: RLX parity problems, float64 formula oracles, the
float32 op-order contract, bit-exact resume through a checkpoint, and errors."""
import numpy as np
import pytest

from rlxc.checkpoint import load_tensors, save_tensors
from rlxc.optim import SGD, Adam, AdamW, Lion
from rlxc.schedules import LrSchedule

F32 = np.float32


# -- RLX parity problems ------------------------------------------------------

def test_sgd_minimizes_sum_of_squares():
    w = {"w": np.array([3.0, -4.0, 5.0], F32)}
    opt = SGD(0.1)
    for _ in range(100):
        opt.step(w, {"w": 2 * w["w"]})
    assert float(np.sum(w["w"] * w["w"])) < 1e-3
    assert opt.t == 100


QUADRATIC_TARGET = (0.1 * np.arange(16) - 0.8).astype(F32)


@pytest.mark.parametrize("make, steps, tol", [
    (lambda: SGD(0.5), 200, 1e-4),
    (lambda: Adam(0.1), 400, 1e-3),
    (lambda: AdamW(0.1, weight_decay=0.0), 400, 1e-3),
    (lambda: Lion(0.01), 400, 0.05),
], ids=["sgd", "adam", "adamw", "lion"])
def test_quadratic_target(make, steps, tol):
    opt = make()
    params = {"x": np.zeros(16, F32)}
    for _ in range(steps):
        opt.step(params, {"x": params["x"] - QUADRATIC_TARGET})
    assert np.max(np.abs(params["x"] - QUADRATIC_TARGET)) < tol


# -- float64 references, hand-written from the formulas -----------------------

def ref_sgd(p, grads, lr, mu=0.0, nesterov=False, wd=0.0):
    p, v = p.astype(np.float64), np.zeros_like(p, np.float64)
    for g in grads:
        d = g + wd * p
        if mu:
            v = mu * v + d
            p = p - lr * (d + mu * v if nesterov else v)
        else:
            p = p - lr * d
    return p


def ref_adam(p, grads, lr, b1=0.9, b2=0.999, eps=1e-8, wd=0.0, decoupled=False):
    p = p.astype(np.float64)
    m, v = np.zeros_like(p), np.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        if not decoupled:
            g = g + wd * p
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat, v_hat = m / (1 - b1 ** t), v / (1 - b2 ** t)
        u = m_hat / (np.sqrt(v_hat) + eps)
        p = p - lr * (u + wd * p if decoupled else u)
    return p


def ref_lion(p, grads, lr, b1=0.9, b2=0.99, wd=0.0):
    p, m = p.astype(np.float64), np.zeros_like(p, np.float64)
    for g in grads:
        p = p - lr * (np.sign(b1 * m + (1 - b1) * g) + wd * p)
        m = b2 * m + (1 - b2) * g
    return p


CASES = [
    ("sgd", lambda: SGD(0.1), lambda p, gs: ref_sgd(p, gs, 0.1)),
    ("sgd_wd", lambda: SGD(0.05, weight_decay=0.1),
     lambda p, gs: ref_sgd(p, gs, 0.05, wd=0.1)),
    ("sgd_momentum", lambda: SGD(0.1, momentum=0.9, weight_decay=0.01),
     lambda p, gs: ref_sgd(p, gs, 0.1, mu=0.9, wd=0.01)),
    ("sgd_nesterov", lambda: SGD(0.1, momentum=0.8, nesterov=True),
     lambda p, gs: ref_sgd(p, gs, 0.1, mu=0.8, nesterov=True)),
    ("adam", lambda: Adam(0.01), lambda p, gs: ref_adam(p, gs, 0.01)),
    ("adam_l2", lambda: Adam(0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
     lambda p, gs: ref_adam(p, gs, 0.01, 0.8, 0.99, 1e-6, wd=0.1)),
    ("adamw", lambda: AdamW(0.01), lambda p, gs: ref_adam(p, gs, 0.01, wd=0.01,
                                                          decoupled=True)),
    ("adamw_wd", lambda: AdamW(0.02, betas=(0.5, 0.9), weight_decay=0.3),
     lambda p, gs: ref_adam(p, gs, 0.02, 0.5, 0.9, wd=0.3, decoupled=True)),
    ("lion", lambda: Lion(0.01), lambda p, gs: ref_lion(p, gs, 0.01)),
    ("lion_wd", lambda: Lion(0.01, betas=(0.7, 0.95), weight_decay=0.5),
     lambda p, gs: ref_lion(p, gs, 0.01, 0.7, 0.95, wd=0.5)),
]


@pytest.mark.parametrize("name, make, ref", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("nsteps", [1, 2])
def test_matches_float64_reference(name, make, ref, nsteps):
    rng = np.random.default_rng(7)
    p0 = rng.normal(size=(3, 5)).astype(F32)
    grads = [rng.normal(size=(3, 5)).astype(F32) for _ in range(nsteps)]
    opt = make()
    params = {"p": p0.copy()}
    for g in grads:
        opt.step(params, {"p": g})
    expected = ref(p0, [g.astype(np.float64) for g in grads])
    np.testing.assert_allclose(params["p"], expected, rtol=2e-6, atol=2e-7)


# -- the float32 contract: constants rounded once, one rounding per op --------

def f32_adam_step(p, g, m, v, t, lr, b1, b2, eps, wd, decoupled):
    s = lambda x: F32(x)  # noqa: E731  (scalar computed in float64, rounded once)
    if wd and not decoupled:
        g = g + s(wd) * p
    m = s(b1) * m + s(1 - b1) * g
    v = s(b2) * v + s(1 - b2) * (g * g)
    u = (m / s(1 - b1 ** t)) / (np.sqrt(v / s(1 - b2 ** t)) + s(eps))
    if wd and decoupled:
        u = u + s(wd) * p
    return p - s(lr) * u, m, v


@pytest.mark.parametrize("cls, wd", [(Adam, 0.0), (Adam, 0.1), (AdamW, 0.05)])
def test_adam_float32_op_order_is_bit_exact(cls, wd):
    rng = np.random.default_rng(3)
    p = rng.normal(size=64).astype(F32)
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    opt = cls(0.003, betas=(0.9, 0.98), eps=1e-7, weight_decay=wd)
    params = {"p": p.copy()}
    for t in range(1, 6):
        g = rng.normal(size=64).astype(F32)
        opt.step(params, {"p": g})
        p, m, v = f32_adam_step(p, g, m, v, t, 0.003, 0.9, 0.98, 1e-7, wd, cls is AdamW)
        assert p.dtype == F32
        assert np.array_equal(params["p"], p)
    assert np.array_equal(opt.state["p"]["m"], m)
    assert np.array_equal(opt.state["p"]["v"], v)


def test_sgd_and_lion_float32_op_order_is_bit_exact():
    rng = np.random.default_rng(4)
    p0 = rng.normal(size=32).astype(F32)
    gs = [rng.normal(size=32).astype(F32) for _ in range(4)]
    sgd, lion = SGD(0.1, momentum=0.9, nesterov=True, weight_decay=0.01), \
        Lion(0.02, weight_decay=0.1)
    ps, pl = {"p": p0.copy()}, {"p": p0.copy()}
    p1, v, p2, m = p0.copy(), np.zeros_like(p0), p0.copy(), np.zeros_like(p0)
    for g in gs:
        sgd.step(ps, {"p": g})
        lion.step(pl, {"p": g})
        d = g + F32(0.01) * p1
        v = F32(0.9) * v + d
        p1 = p1 - F32(0.1) * (d + F32(0.9) * v)
        p2 = p2 - F32(0.02) * (np.sign(F32(0.9) * m + F32(1 - 0.9) * g) + F32(0.1) * p2)
        m = F32(0.99) * m + F32(1 - 0.99) * g
    assert np.array_equal(ps["p"], p1)
    assert np.array_equal(pl["p"], p2)


def test_step_scalars_are_float32_rounded_once_from_float64():
    opt = Adam(0.001, betas=(0.9, 0.999))
    s = opt.step_scalars()
    assert all(isinstance(x, np.float32) for x in s.values())
    assert s["omb1"] == F32(1.0 - 0.9)      # not F32(1) - F32(0.9)
    assert s["bc2"] == F32(1.0 - 0.999)     # t = 1 for the next update
    assert opt.step_scalars(t=3)["bc1"] == F32(1.0 - 0.9 ** 3)
    assert opt.step_scalars(lr=0.5)["lr"] == F32(0.5)
    with pytest.raises(ValueError):
        opt.step_scalars(t=0)


# -- bit-exact resume through a safetensors checkpoint ------------------------

RESUME = [
    ("sgd", lambda: SGD(0.1)),
    ("sgd_nesterov", lambda: SGD(0.05, momentum=0.9, nesterov=True, weight_decay=1e-3)),
    ("adam", lambda: Adam(0.01, weight_decay=1e-3)),
    ("adamw", lambda: AdamW(0.01)),
    ("lion", lambda: Lion(0.003, weight_decay=0.1)),
]


def _problem():
    rng = np.random.default_rng(11)
    params = {"w1": rng.normal(size=(4, 3)).astype(F32),
              "layer.0.b": rng.normal(size=(3,)).astype(F32)}
    targets = {k: rng.normal(size=v.shape).astype(F32) for k, v in params.items()}
    return params, targets


def _run(opt, params, targets, steps, sched):
    for _ in range(steps):
        grads = {k: (params[k] - targets[k]) * F32(1.7) for k in params}
        opt.step(params, grads, lr=sched.lr_at(opt.t))


@pytest.mark.parametrize("name, make", RESUME, ids=[r[0] for r in RESUME])
def test_bit_exact_resume(tmp_path, name, make):
    sched = LrSchedule.warmup_cosine(make().lr, 0.0, 2, 6)
    full, targets = _problem()
    _run(make(), full, targets, 6, sched)

    params, _ = _problem()
    opt = make()
    _run(opt, params, targets, 3, sched)
    ckpt = tmp_path / "ckpt.safetensors"
    save_tensors(ckpt, {**{f"param.{k}": v for k, v in params.items()},
                        **{f"opt.{k}": v for k, v in opt.state_dict().items()}})
    del opt, params

    loaded = load_tensors(ckpt)
    params = {k[len("param."):]: v for k, v in loaded.items() if k.startswith("param.")}
    state = {k[len("opt."):]: v for k, v in loaded.items() if k.startswith("opt.")}
    opt = make()
    opt.load_state_dict(state, params=params)
    assert opt.t == 3
    _run(opt, params, targets, 3, sched)
    for k in full:
        assert np.array_equal(params[k], full[k]), k


def test_state_dict_layout_and_snapshot():
    opt = Adam(0.01)
    params = {"w": np.ones((2, 2), F32)}
    opt.step(params, {"w": np.ones((2, 2), F32)})
    sd = opt.state_dict()
    assert set(sd) == {"kind", "t", "hp.lr", "hp.beta1", "hp.beta2", "hp.eps",
                       "hp.weight_decay", "m.w", "v.w"}
    assert sd["t"].dtype == np.int64 and sd["t"].tolist() == [1]
    assert sd["hp.lr"].dtype == np.float64 and sd["hp.lr"].shape == (1,)
    assert sd["m.w"].dtype == F32 and sd["m.w"].shape == (2, 2)
    before = sd["m.w"].copy()
    opt.step(params, {"w": np.ones((2, 2), F32)})
    assert np.array_equal(sd["m.w"], before), "state_dict must be a copy"


def test_load_state_dict_restores_hyperparams_and_lr():
    a = SGD(0.1, momentum=0.9)
    a.set_lr(0.025)
    b = SGD(1.0, momentum=0.9)
    b.load_state_dict(a.state_dict())
    assert b.lr == 0.025 and b.momentum == 0.9


# -- declarative description --------------------------------------------------

def test_descriptions():
    assert SGD(0.1).slots() == [] and SGD(0.1, momentum=0.5).slots() == ["v"]
    assert Adam(0.1).slots() == ["m", "v"] == AdamW(0.1).slots()
    assert Lion(0.1).slots() == ["m"]
    assert Adam(0.1).hyperparams() == {"lr": 0.1, "beta1": 0.9, "beta2": 0.999,
                                       "eps": 1e-8, "weight_decay": 0.0}
    assert AdamW(0.1).hyperparams()["weight_decay"] == 0.01
    assert Lion(0.1).betas == (0.9, 0.99)
    assert SGD(0.1, momentum=0.9, nesterov=True).hyperparams()["nesterov"] == 1.0
    assert [c(0.1).kind for c in (SGD, Adam, AdamW, Lion)] == \
        ["sgd", "adam", "adamw", "lion"]
    d = Lion(0.1).describe()
    assert d == {"kind": "lion", "slots": ["m"], "t": 0,
                 "hyperparams": {"lr": 0.1, "beta1": 0.9, "beta2": 0.99,
                                 "weight_decay": 0.0}}
    assert repr(SGD(0.1, 0.9, True)) == \
        "SGD(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.0)"


def test_lr_override_set_lr_and_counting():
    opt = SGD(1.0)
    p = {"w": np.array([1.0], F32)}
    opt.step(p, {"w": np.array([1.0], F32)}, lr=0.5)
    assert p["w"][0] == 0.5 and opt.lr == 1.0 and opt.t == 1
    opt.set_lr(0.25)
    opt.step(p, {"w": np.array([1.0], F32)})
    assert p["w"][0] == 0.25 and opt.t == 2
    opt.lr = 0.0
    assert opt.lr == 0.0


def test_updates_in_place_and_skips_params_without_grads():
    w, b = np.ones(3, F32), np.ones(2, F32)
    params = {"w": w, "b": b}
    opt = Adam(0.1)
    opt.step(params, {"w": np.full(3, 0.5)})  # float64 grad is cast to float32
    assert params["w"] is w and np.all(w < 1) and np.all(b == 1)
    assert "b" not in opt.state


# -- errors -------------------------------------------------------------------

@pytest.mark.parametrize("make", [
    lambda: SGD(-0.1), lambda: SGD(0.1, momentum=-0.5), lambda: SGD(0.1, momentum=1.0),
    lambda: SGD(0.1, nesterov=True), lambda: SGD(0.1, weight_decay=-1),
    lambda: Adam(float("nan")), lambda: Adam(0.1, betas=(1.0, 0.9)),
    lambda: Adam(0.1, betas=(0.9, -0.1)), lambda: Adam(0.1, betas=(0.9,)),
    lambda: Adam(0.1, eps=-1e-8), lambda: AdamW(0.1, weight_decay=-0.01),
    lambda: Lion(0.1, betas=(0.9, 1.5)), lambda: Lion("fast"),
])
def test_bad_constructor_arguments(make):
    with pytest.raises(ValueError):
        make()


def test_bad_lr_values():
    opt = Adam(0.1)
    with pytest.raises(ValueError, match="lr"):
        opt.set_lr(-1.0)
    p = {"w": np.zeros(2, F32)}
    with pytest.raises(ValueError, match="lr"):
        opt.step(p, {"w": np.zeros(2, F32)}, lr=-0.1)
    assert opt.t == 0


def test_step_errors_name_the_param_and_change_nothing():
    opt = Adam(0.1)
    w = np.ones((2, 3), F32)
    params = {"w": w, "b": np.ones(3, F32), "d": np.ones(3, np.float64)}
    good = np.ones((2, 3), F32)
    with pytest.raises(ValueError, match="unknown param 'nope'"):
        opt.step(params, {"w": good, "nope": good})
    with pytest.raises(ValueError, match=r"'b' has shape \(3,\).*\(2, 3\)"):
        opt.step(params, {"w": good, "b": good})
    with pytest.raises(ValueError, match="'d' must be a float32"):
        opt.step(params, {"d": np.ones(3)})
    assert opt.t == 0 and opt.state == {} and np.all(w == 1)
    ro = np.ones(3, F32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="'r' is read-only"):
        opt.step({"r": ro}, {"r": np.ones(3, F32)})


def test_state_shape_mismatch_on_step():
    opt = SGD(0.1, momentum=0.9)
    opt.step({"w": np.ones(3, F32)}, {"w": np.ones(3, F32)})
    with pytest.raises(ValueError, match="'w'.*state 'v' has shape"):
        opt.step({"w": np.ones(4, F32)}, {"w": np.ones(4, F32)})


def _adam_state():
    opt = Adam(0.1)
    opt.step({"w": np.ones(3, F32)}, {"w": np.ones(3, F32)})
    return opt.state_dict()


@pytest.mark.parametrize("mutate, match", [
    (lambda s: s.pop("t"), "missing entry 't'"),
    (lambda s: s.pop("v.w"), r"'w' lacks state \['v'\]"),
    (lambda s: s.pop("hp.eps"), r"missing \['eps'\]"),
    (lambda s: s.update({"hp.momentum": np.array([0.9])}), r"unexpected \['momentum'\]"),
    (lambda s: s.update({"q.w": np.ones(3, F32)}), "unexpected entry 'q.w'"),
    (lambda s: s.update({"v.w": np.ones(4, F32)}), "'w' has mixed shapes"),
    (lambda s: s.update({"m.w": np.ones(3)}), "'w' must be float32"),
    (lambda s: s.update({"t": np.array([1.5])}), "'t' must be"),
    (lambda s: s.update({"hp.beta1": np.array([1.0])}), "beta1"),
])
def test_load_state_dict_errors(mutate, match):
    state = _adam_state()
    mutate(state)
    opt = Adam(0.5)
    with pytest.raises(ValueError, match=match):
        opt.load_state_dict(state)
    assert opt.t == 0 and opt.lr == 0.5 and opt.state == {}


def test_load_state_dict_checks_kind_and_params():
    state = _adam_state()
    with pytest.raises(ValueError, match="kind 'adam', this is 'adamw'"):
        AdamW(0.1).load_state_dict(state)
    with pytest.raises(ValueError, match=r"'w' has shape \(4,\).*\(3,\)"):
        Adam(0.1).load_state_dict(state, params={"w": np.ones(4, F32)})
    with pytest.raises(ValueError, match="unknown param 'w'"):
        Adam(0.1).load_state_dict(state, params={"x": np.ones(3, F32)})

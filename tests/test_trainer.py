"""Trainer (the fused, compiled step): RLX parity problems, agreement with
train_step and with the NumPy reference loop, bit-exact resume, a softmax
cross-entropy model, schedules, and state-dict errors.

Every numerical test runs on the interpreter and on the native CPU backend."""
import numpy as np
import pytest
from test_train import DEVICES, assert_params, batches, ref_loop, tiny

from rlxc import Func, LrSchedule
from rlxc.optim import SGD, Adam, AdamW, Lion
from rlxc.runtime.errors import NameLookupError

F32 = np.float32
TARGET = (0.1 * np.arange(16) - 0.8).astype(F32)


def quadratic():
    def build(s):
        d = s.param("x", (16,)) - s.constant(TARGET)
        return 0.5 * (d * d).sum()
    return Func("quad", build).with_param("x", np.zeros(16, F32))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("make, steps, tol", [
    (lambda: SGD(0.5), 200, 1e-4),
    (lambda: Adam(0.1), 400, 1e-3),
    (lambda: AdamW(0.1, weight_decay=0.0), 400, 1e-3),
    (lambda: Lion(0.01), 400, 0.05),
], ids=["sgd", "adam", "adamw", "lion"])
def test_quadratic_target(device, make, steps, tol):
    tr = quadratic().trainer(make(), device=device)
    for _ in range(steps):
        tr.step({})
    assert tr.step_count == steps
    assert np.max(np.abs(tr.func.params()["x"] - TARGET)) < tol


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("make", [lambda: Adam(0.05, weight_decay=0.01),
                                  lambda: SGD(0.1, momentum=0.9),
                                  lambda: Lion(0.01)], ids=["adam", "sgd-momentum", "lion"])
def test_trainer_agrees_with_train_step_and_reference(device, make):
    f, data = tiny(), batches(5)
    sched = LrSchedule.cosine(make().lr, 0.001, 5)
    tr = f.trainer(make(), schedule=sched, max_grad_norm=1.0, device=device)
    t_losses = [tr.step(b) for b in data]
    opt, g, s_losses = make(), f, []
    for i, b in enumerate(data):
        g, loss = g.train_step(opt, b, schedule=sched, step=i, max_grad_norm=1.0, device=device)
        s_losses.append(loss)
    assert t_losses == s_losses  # same step function, same device: identical
    for n, a in g.params().items():
        np.testing.assert_array_equal(tr.func.params()[n], a, err_msg=n)
    ref, ref_losses = ref_loop(f, make(), data, schedule=sched, max_norm=1.0)
    for n, a in ref.items():  # compiled sums round differently from NumPy on the cpu
        np.testing.assert_allclose(tr.func.params()[n], a, rtol=1e-5, atol=1e-5, err_msg=n)
    np.testing.assert_allclose(t_losses, ref_losses, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_trainer_matches_reference_bitwise_without_clipping(device):
    f, data = tiny(), batches(4)
    tr = f.trainer(AdamW(0.05, weight_decay=0.1), device=device)
    losses = [tr.step(b) for b in data]
    ref, ref_losses = ref_loop(f, AdamW(0.05, weight_decay=0.1), data)
    assert_params(tr.func.params(), ref, device)
    if device == "interp":
        assert losses == ref_losses


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("via_file", [False, True], ids=["dict", "file"])
def test_bit_exact_resume(device, via_file, tmp_path):
    f, data = tiny(), batches(6)
    sched = LrSchedule.warmup_cosine(0.05, 0.0, 2, 6)
    full = f.trainer(Adam(0.05), schedule=sched, max_grad_norm=0.5, device=device)
    full_losses = [full.step(b) for b in data]

    first = f.trainer(Adam(0.05), schedule=sched, max_grad_norm=0.5, device=device)
    for b in data[:3]:
        first.step(b)
    if via_file:
        first.save(tmp_path / "ckpt.safetensors")
    else:
        state = first.state_dict()
    first.step(data[3])  # must not disturb the saved state

    fresh = tiny(seed=99).trainer(Adam(0.9), schedule=sched, max_grad_norm=0.5, device=device)
    if via_file:
        fresh.load(tmp_path / "ckpt.safetensors")
    else:
        fresh.load_state_dict(state)
    assert fresh.step_count == 3 and fresh.opt.lr == 0.05
    losses = [fresh.step(b) for b in data[3:]]
    assert losses == full_losses[3:]
    for n, a in full.func.params().items():
        assert np.array_equal(fresh.func.params()[n], a), n
    s_full, s_fresh = full.state_dict(), fresh.state_dict()
    assert s_full.keys() == s_fresh.keys()
    for k in s_full:
        assert np.array_equal(s_full[k], s_fresh[k]), k


@pytest.mark.parametrize("device", DEVICES)
def test_softmax_cross_entropy_model_learns(device):
    rng = np.random.default_rng(7)
    n, d, c = 64, 8, 4
    centers = rng.standard_normal((c, d)).astype(F32) * 2
    y = rng.integers(0, c, n).astype(np.int32)
    x = (centers[y] + 0.5 * rng.standard_normal((n, d))).astype(F32)

    def build(s):
        h = s.input("x", (n, d)).linear(s.param("w1", (d, 16)), s.param("b1", (16,))).relu()
        logits = h.linear(s.param("w2", (16, c)), s.param("b2", (c,)))
        return logits.cross_entropy(s.input("y", (n,), "i32"))

    f = Func("clf", build).init_randn(1234, 0.1)
    tr = f.trainer(AdamW(0.02), device=device)
    first = tr.step({"x": x, "y": y})
    for _ in range(60):
        last = tr.step({"x": x, "y": y})
    assert last < 0.25 * first
    assert tr.func.run_on(device, x=x, y=y)[0] < 0.25 * first


@pytest.mark.parametrize("device", DEVICES)
def test_wrt_subset_and_func_snapshot(device):
    f, data = tiny(), batches(3)
    tr = f.trainer(Adam(0.1), wrt=["w1"], device=device)
    snap = tr.func
    for b in data:
        tr.step(b)
    got = tr.func.params()
    assert not np.array_equal(got["w1"], snap.params()["w1"])  # snapshots are copies
    for n in ("b1", "w2", "b2"):
        np.testing.assert_array_equal(got[n], f.params()[n])
    assert sorted(tr.state_dict()) == sorted(
        ["params.w1", "params.b1", "params.w2", "params.b2", "optim.kind", "optim.t",
         "optim.hp.lr", "optim.hp.beta1", "optim.hp.beta2", "optim.hp.eps",
         "optim.hp.weight_decay", "optim.m.w1", "optim.v.w1"])


def test_structure_change_rebuilds_step():
    """Loading a state with weight decay switched on changes the formula."""
    f, data = tiny(), batches(2)
    tr = f.trainer(AdamW(0.05, weight_decay=0.0), device="interp")
    tr.step(data[0])
    state = tr.state_dict()
    state["optim.hp.weight_decay"] = np.array([0.5])
    tr.load_state_dict(state)
    before = tr.func.params()
    tr.step(data[1])
    opt = AdamW(0.05, weight_decay=0.5)
    opt.load_state_dict({k[6:]: v for k, v in state.items() if k.startswith("optim.")})
    ref, _ = ref_loop(f.with_params(before), opt, data[1:])
    assert_params(tr.func.params(), ref, "interp")


def test_trainer_resumes_from_optimizer_state():
    """A Trainer built from an optimizer that already has state continues it."""
    f, data = tiny(), batches(4)
    opt = Adam(0.05)
    g = f
    for b in data[:2]:
        g, _ = g.train_step(opt, b, device="interp")
    tr = g.trainer(opt, device="interp")
    for b in data[2:]:
        tr.step(b)
    ref, _ = ref_loop(f, Adam(0.05), data)
    assert_params(tr.func.params(), ref, "interp")
    assert tr.sync_optimizer() is opt and opt.t == 4


def test_load_state_dict_errors():
    f = tiny()
    tr = f.trainer(Adam(0.1), device="interp")
    good = tr.state_dict()
    bad = dict(good)
    del bad["params.w1"]
    with pytest.raises(NameLookupError, match=r"missing params \['w1'\]"):
        tr.load_state_dict(bad)
    with pytest.raises(NameLookupError, match=r"unexpected params \['zz'\]"):
        tr.load_state_dict({**good, "params.zz": np.zeros(2, F32)})
    with pytest.raises(ValueError, match="param 'b1' expects shape"):
        tr.load_state_dict({**good, "params.b1": np.zeros(2, F32)})
    with pytest.raises(ValueError, match="optimizer kind 'adam'"):
        f.trainer(SGD(0.1), device="interp").load_state_dict(good)
    with pytest.raises(TypeError, match="rlxc.optim optimizer"):
        f.trainer(object(), device="interp")


@pytest.mark.parametrize("device", DEVICES)
def test_state_stays_resident_between_steps(device):
    """Native: two buffer sets, swapped by pointer table; no per-step param arrays."""
    from rlxc.runtime.call import ExecutorLoop, ResidentCall

    f, data = tiny(), batches(4)
    tr = f.trainer(Adam(0.05), device=device)
    eng = tr._engine
    if device == "interp":
        assert isinstance(eng, ExecutorLoop)
        return
    assert isinstance(eng, ResidentCall)
    sets = [[b.ctypes.data for b in s] for s in eng.bufs]
    phases = []
    for b in data:
        tr.step(b)
        phases.append(eng.k)
    assert phases == [1, 0, 1, 0]
    assert [[b.ctypes.data for b in s] for s in eng.bufs] == sets
    assert tr._engine is eng


# -- issue 13 item 2: the schedule sets opt.lr, which persists and is saved ------------------

@pytest.mark.parametrize("device", DEVICES)
def test_trainer_schedule_sets_lr_and_the_checkpoint_keeps_it(device, tmp_path):
    sched = LrSchedule.warmup(0.1, 4)  # lr_at(i) = 0.1 * (i + 1) / 4
    tr = quadratic().trainer(Adam(1.0), schedule=sched, device=device)
    for _ in range(3):
        tr.step({})
    assert tr.opt.lr == sched.lr_at(2)
    assert tr.state_dict()["optim.hp.lr"].tolist() == [sched.lr_at(2)]
    tr.save(tmp_path / "ck.safetensors")
    again = quadratic().trainer(Adam(1.0), device=device)  # no schedule
    again.load(tmp_path / "ck.safetensors")
    assert again.opt.lr == sched.lr_at(2)
    again.step({})
    # RLX: the last scheduled lr stays in force for a step without a schedule
    opt, g = Adam(1.0), quadratic()
    for i in range(3):
        g, _ = g.train_step(opt, {}, schedule=sched, step=i, device=device)
    g, _ = g.train_step(opt, {}, device=device)
    np.testing.assert_array_equal(again.func.params()["x"], g.params()["x"])

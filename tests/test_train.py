"""Func.train_step: RLX parity problems, agreement with a NumPy reference loop
(value_and_grad + rlxc.optim), schedules, gradient clipping, and errors.

Every numerical test runs on the interpreter and on the native CPU backend."""
import numpy as np
import pytest

from rlxc import Func, LrSchedule
from rlxc.optim import SGD, Adam, AdamW, Lion
from rlxc.runtime.errors import NameLookupError
from rlxc.train import clip_reference, step_program

F32 = np.float32


def _devices():
    try:
        import rlxc.backends  # noqa: F401
        cpu = "cpu"
    except ImportError:
        cpu = pytest.param("cpu", marks=pytest.mark.skip(
            reason="native CPU backend (rlxc.backends) not available yet"))
    return ["interp", cpu]


DEVICES = _devices()


def sumsq():
    return Func("sumsq", lambda s: (lambda w: (w * w).sum())(s.param("w", (3,))))


def mlp(batch=8, nin=5, nh=7, nout=3, seed=1234):
    def build(s):
        x = s.input("x", (batch, nin))
        y = s.input("y", (batch,), "i32")
        h = x.linear(s.param("w1", (nin, nh)), s.param("b1", (nh,))).tanh()
        return h.linear(s.param("w2", (nh, nout)), s.param("b2", (nout,))).cross_entropy(y)
    return Func("mlp", build).init_randn(seed, 0.5)


def tiny(batch=8, classes=5, seed=1234):
    """An elementwise softmax classifier (no matmul: compiles in well under a second)."""
    def build(s):
        x = s.input("x", (batch, classes))
        h = (x * s.param("w1", (classes,)) + s.param("b1", (classes,))).tanh()
        logits = h * s.param("w2", (classes,)) + s.param("b2", (classes,))
        return logits.cross_entropy(s.input("y", (batch,), "i32"))
    return Func("tiny", build).init_randn(seed, 0.5)


def batches(n, batch=8, nin=5, nout=3, seed=0):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((batch, nin)).astype(F32),
             "y": rng.integers(0, nout, batch).astype(np.int32)} for _ in range(n)]


def ref_loop(f, opt, data, wrt=None, schedule=None, max_norm=0.0, quant=None):
    """NumPy reference: value_and_grad on the interpreter, then opt.step."""
    wrt = wrt or f.param_names()
    vg = f.value_and_grad(wrt)
    params = {n: np.array(a, F32) for n, a in f.params().items()}
    losses = []
    for i, b in enumerate(data):
        fwd = {n: (quant(n, a) if quant and n in wrt else a) for n, a in params.items()}
        loss, *gs = vg.run_on("interp", {**b, **fwd})
        grads, _ = clip_reference(dict(zip(wrt, gs)), max_norm)
        opt.step(params, grads, lr=schedule.lr_at(i) if schedule else None)
        losses.append(float(loss))
    return params, losses


def assert_params(got, want, device, atol=2e-5):
    for n in got:
        if device == "interp":
            np.testing.assert_array_equal(got[n], want[n], err_msg=n)
        else:
            np.testing.assert_allclose(got[n], want[n], rtol=1e-4, atol=atol, err_msg=n)


@pytest.mark.parametrize("device", DEVICES)
def test_sgd_sum_of_squares(device):
    f = sumsq().with_param("w", [3, -4, 5])
    opt = SGD(0.1)
    f1, loss0 = f.train_step(opt, {}, device=device)
    assert loss0 == 50.0  # the loss before the update
    np.testing.assert_allclose(f1.params()["w"], [2.4, -3.2, 4.0], rtol=1e-6)
    g = f1
    for _ in range(99):
        g, loss = g.train_step(opt, {}, device=device)
    assert opt.t == 100
    assert g.run_on(device)[0] < 1e-3
    assert loss < 1e-3
    assert f.params()["w"].tolist() == [3, -4, 5]  # the input Func is unchanged
    assert g.params()["w"].dtype == F32 and not g.params()["w"].flags.writeable


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("make", [
    lambda: SGD(0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    lambda: SGD(0.2),
    lambda: Adam(0.05, weight_decay=0.01),
    lambda: AdamW(0.05),
    lambda: Lion(0.01, weight_decay=0.1),
], ids=["sgd-nesterov-wd", "sgd", "adam-l2", "adamw", "lion-wd"])
def test_matches_numpy_reference(device, make):
    f, data = tiny(), batches(4)
    sched = LrSchedule.warmup_cosine(make().lr, 0.0, 2, 4)
    ref, ref_losses = ref_loop(f, make(), data, schedule=sched)
    opt, g, losses = make(), f, []
    for i, b in enumerate(data):
        g, loss = g.train_step(opt, b, schedule=sched, step=i, device=device)
        losses.append(loss)
    assert_params(g.params(), ref, device)
    np.testing.assert_allclose(losses, ref_losses, rtol=0 if device == "interp" else 1e-5)
    ref_opt = make()
    ref_loop(f, ref_opt, data, schedule=sched)
    for n, st in ref_opt.state.items():
        for s, a in st.items():
            assert_params({s: opt.state[n][s]}, {s: a}, device, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_mlp_matches_numpy_reference(device):
    """The same with matmuls in the forward and backward."""
    f, data = mlp(), batches(3)
    sched = LrSchedule.warmup(0.05, 2)
    ref, ref_losses = ref_loop(f, Adam(0.05, weight_decay=0.01), data, schedule=sched)
    opt, g, losses = Adam(0.05, weight_decay=0.01), f, []
    for i, b in enumerate(data):
        g, loss = g.train_step(opt, b, schedule=sched, step=i, device=device)
        losses.append(loss)
    assert_params(g.params(), ref, device)
    np.testing.assert_allclose(losses, ref_losses, rtol=0 if device == "interp" else 1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_wrt_subset_trains_only_those(device):
    f, data = tiny(), batches(2)
    opt = Adam(0.1)
    g, _ = f.train_step(opt, data[0], wrt=["w2", "b2"], device=device)
    g, _ = g.train_step(opt, data[1], wrt=["w2", "b2"], device=device)
    for n in ("w1", "b1"):
        np.testing.assert_array_equal(g.params()[n], f.params()[n])
    assert set(opt.state) == {"w2", "b2"}
    ref, _ = ref_loop(f, Adam(0.1), data, wrt=["w2", "b2"])
    assert_params({n: g.params()[n] for n in ("w2", "b2")}, ref, device)


@pytest.mark.parametrize("device", DEVICES)
def test_step_drives_schedule_only(device):
    """`step` picks the lr; the optimizer's own t drives bias correction."""
    f = sumsq().with_param("w", [1, 2, 3])
    sched = LrSchedule.step(0.1, 1, 0.5)  # lr = 0.1 * 0.5**step
    opt = SGD(1.0)
    g, _ = f.train_step(opt, {}, schedule=sched, step=3, device=device)
    np.testing.assert_array_equal(g.params()["w"],
                                  (np.array([1, 2, 3], F32) - F32(0.0125) * (2 * np.array(
                                      [1, 2, 3], F32))))
    opt = Adam(0.1)
    g, _ = f.train_step(opt, {}, step=7, device=device)
    assert opt.t == 1  # bias correction of update 1: the step moves every weight by lr
    np.testing.assert_allclose(g.params()["w"], [0.9, 1.9, 2.9], rtol=1e-6)


# -- gradient clipping ----------------------------------------------------------

def linear():
    """loss = sum(w * c): the gradient is the input c."""
    return Func("lin", lambda s: (s.param("w", (2,)) * s.input("c", (2,))).sum()) \
        .with_param("w", [0, 0])


@pytest.mark.parametrize("device", DEVICES)
def test_clip_scales_exactly_when_norm_exceeds_max(device):
    g, _ = linear().train_step(SGD(1.0), {"c": [3, 4]}, max_grad_norm=1.0, device=device)
    scale = F32(1.0 / 5.0)
    np.testing.assert_array_equal(g.params()["w"], [-(F32(3) * scale), -(F32(4) * scale)])
    g, _ = linear().train_step(SGD(1.0), {"c": [3, 4]}, max_grad_norm=0.5, device=device)
    scale = F32(0.5 / 5.0)
    np.testing.assert_array_equal(g.params()["w"], [-(F32(3) * scale), -(F32(4) * scale)])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("max_norm", [5.0, 10.0, 0.0, -1.0])
def test_clip_below_max_or_disabled_does_not_scale(device, max_norm):
    g, _ = linear().train_step(SGD(1.0), {"c": [3, 4]}, max_grad_norm=max_norm, device=device)
    np.testing.assert_array_equal(g.params()["w"], [-3, -4])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_clip_nonfinite_norm_does_not_scale(device, bad):
    g, _ = linear().train_step(SGD(1.0), {"c": [bad, 4]}, max_grad_norm=1.0, device=device)
    w = g.params()["w"]
    assert w[1] == -4.0  # unscaled
    assert np.isnan(w[0]) if np.isnan(bad) else w[0] == -bad


@pytest.mark.parametrize("device", DEVICES)
def test_clip_matches_reference(device):
    f, data = tiny(), batches(3)
    ref, _ = ref_loop(f, Adam(0.05), data, max_norm=0.05)
    opt, g = Adam(0.05), f
    for b in data:
        g, _ = g.train_step(opt, b, max_grad_norm=0.05, device=device)
    for n in ref:  # the cpu's forward/backward sums round differently
        np.testing.assert_allclose(g.params()[n], ref[n], rtol=1e-5, atol=1e-5, err_msg=n)


def test_clip_reference_contract():
    grads = {"a": np.array([3, 0], F32), "b": np.array([4], F32)}
    out, norm = clip_reference(grads, 1.0)
    assert norm == 5.0
    np.testing.assert_array_equal(out["a"], [F32(3) * F32(0.2), 0])
    same, _ = clip_reference(grads, 0.0)
    assert same is grads


# -- structure and errors ------------------------------------------------------------

def test_step_graph_is_one_function_and_cached():
    f = mlp()
    p1 = step_program(f, Adam(0.1), max_grad_norm=1.0, device="interp")
    p2 = step_program(f.with_param("b2", [1, 2, 3]), Adam(0.3), max_grad_norm=1.0,
                      device="interp")
    assert p1 is p2  # lr and params are runtime values: no rebuild
    assert step_program(f, AdamW(0.1), max_grad_norm=1.0, device="interp") is not p1
    assert "f64" in step_program(f, Adam(0.1), max_grad_norm=1.0, device="cpu").func.mlir()
    # an f32-only device gets the max-scaled f32 norm
    assert "f64" not in step_program(f, Adam(0.1), max_grad_norm=1.0, device="cuda").func.mlir()
    text = p1.func.mlir()
    assert text.count("func.func") == 1 and "rlx.sqrt" in text and "f64" in text
    assert p1.func.output_count() == 1 + 4 + 8  # loss, params, m and v


def test_errors_name_the_problem():
    f = mlp()
    with pytest.raises(NameLookupError, match="'nope' is not a param"):
        f.train_step(SGD(0.1), batches(1)[0], wrt=["nope"], device="interp")
    with pytest.raises(NameLookupError, match="missing input 'y'"):
        f.train_step(SGD(0.1), {"x": np.zeros((8, 5), F32)}, device="interp")
    with pytest.raises(NameLookupError, match="unknown input 'z'"):
        f.train_step(SGD(0.1), {**batches(1)[0], "z": 1}, device="interp")
    unbound = Func("u", lambda s: (s.param("w", (2,)) * 2).sum())
    with pytest.raises(NameLookupError, match=r"\['w'\].*not bound"):
        unbound.train_step(SGD(0.1), {}, device="interp")
    with pytest.raises(ValueError, match="unknown low-precision format 'fp3'"):
        f.train_step(SGD(0.1), batches(1)[0], quant="fp3", device="interp")
    opt = Adam(0.1)
    opt.state["w1"] = {"m": np.zeros(3, F32), "v": np.zeros(3, F32)}
    with pytest.raises(ValueError, match="state 'm' of 'w1' has shape"):
        f.train_step(opt, batches(1)[0], device="interp")


# -- issue 13: clipping cannot overflow (item 1) -------------------------------------------

HUGE = np.array([1.56e20, 2.08e20], F32)  # ||g|| = 2.6e20: its f32 sum of squares is inf


@pytest.mark.parametrize("device", DEVICES)
def test_clip_huge_gradient_is_clipped_bitwise_like_the_reference(device):
    want, norm = clip_reference({"w": HUGE}, 1.0)
    assert norm == pytest.approx(2.6e20)
    g, _ = linear().train_step(SGD(1.0), {"c": HUGE}, max_grad_norm=1.0, device=device)
    np.testing.assert_array_equal(g.params()["w"], -want["w"])
    assert abs(np.linalg.norm(g.params()["w"].astype(np.float64)) - 1.0) < 1e-6
    tr = linear().trainer(SGD(1.0), max_grad_norm=1.0, device=device)
    tr.step({"c": HUGE})
    np.testing.assert_array_equal(tr.func.params()["w"], -want["w"])


def two_vectors(n1=5000, n2=3000):
    def build(s):
        return (s.param("a", (n1,)) * s.input("x", (n1,))).sum() + \
            (s.param("b", (n2,)) * s.input("y", (n2,))).sum()
    return Func("two", build).with_param("a", np.zeros(n1, F32)).with_param("b", np.zeros(n2, F32))


@pytest.mark.parametrize("device", DEVICES)
def test_clip_many_large_grads_matches_reference_bitwise(device):
    rng = np.random.default_rng(5)
    c = {"x": (rng.standard_normal(5000) * 1e18).astype(F32),
         "y": (rng.standard_normal(3000) * 1e18).astype(F32)}
    want, norm = clip_reference({"a": c["x"], "b": c["y"]}, 2.5)
    assert 1e19 < norm < 1e38
    g, _ = two_vectors().train_step(SGD(1.0), c, max_grad_norm=2.5, device=device)
    np.testing.assert_array_equal(g.params()["a"], -want["a"])
    np.testing.assert_array_equal(g.params()["b"], -want["b"])


@pytest.mark.parametrize("device", DEVICES)
def test_clip_norm_beyond_float32_range(device):
    c = np.array([3e38, 3e38], F32)  # finite grads, norm 4.2e38 > FLT_MAX
    want, _ = clip_reference({"w": c}, 1.0)
    g, _ = linear().train_step(SGD(1.0), {"c": c}, max_grad_norm=1.0, device=device)
    np.testing.assert_allclose(g.params()["w"], [-0.70710677, -0.70710677], rtol=1e-4)
    np.testing.assert_array_equal(g.params()["w"], -want["w"])


@pytest.mark.parametrize("device", DEVICES)
def test_clip_scale_is_rlx_float32_division(device):
    c = np.array([16, 3], F32)
    out, norm = clip_reference({"w": c}, 0.05)
    scale = F32(0.05) / F32(norm)  # f32 / f32, not (f32)(0.05 / norm)
    np.testing.assert_array_equal(out["w"], c * scale)
    assert np.any(c * F32(0.05 / norm) != c * scale)  # the two roundings differ here
    g, _ = linear().train_step(SGD(1.0), {"c": c}, max_grad_norm=0.05, device=device)
    np.testing.assert_array_equal(g.params()["w"], -(c * scale))


@pytest.mark.parametrize("case", ["huge", "normal", "nan", "zero", "beyond"])
def test_clip_float32_only_devices_scale_by_max_first(monkeypatch, case):
    """The f32 norm of devices without f64 (cuda), run on the interpreter."""
    import rlxc.train as T

    monkeypatch.setitem(T.NORM_DTYPES, "interp", "f32")
    c = {"huge": HUGE, "normal": np.array([3, 4], F32), "nan": np.array([np.nan, 4], F32),
         "zero": np.zeros(2, F32), "beyond": np.array([3e38, 3e38], F32)}[case]
    prog = step_program(linear(), SGD(1.0), max_grad_norm=1.0, device="interp")
    assert "f64" not in prog.func.mlir()
    g, _ = linear().train_step(SGD(1.0), {"c": c}, max_grad_norm=1.0, device="interp")
    w = g.params()["w"]
    if case == "nan":
        assert np.isnan(w[0]) and w[1] == -4.0  # NaN norm: scale 1
    elif case == "zero":
        np.testing.assert_array_equal(w, [0, 0])
    else:
        want, _ = clip_reference({"w": c}, 1.0)
        np.testing.assert_allclose(w, -want["w"], rtol=1e-4)


# -- issue 13: a schedule sets the optimizer's lr (item 2) ----------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_schedule_sets_the_optimizer_lr_persistently(device):
    sched = LrSchedule.step(0.1, 1, 0.5)
    opt = SGD(1.0)
    g, _ = sumsq().with_param("w", [1, 2, 3]).train_step(opt, {}, schedule=sched, step=3,
                                                          device=device)
    assert opt.lr == sched.lr_at(3) == 0.0125
    w = g.params()["w"]
    g2, _ = g.train_step(opt, {}, device=device)  # no schedule: RLX keeps the set lr
    np.testing.assert_array_equal(g2.params()["w"], w - F32(0.0125) * (2 * w))
    assert opt.state_dict()["hp.lr"].tolist() == [0.0125]
    fresh = SGD(1.0)
    fresh.load_state_dict(opt.state_dict())
    assert fresh.lr == 0.0125


# -- issue 13: RLX call shapes (item 4) ----------------------------------------------------

def test_rlx_argument_order_is_refused_with_the_signature():
    f, b = mlp(), batches(1)[0]
    with pytest.raises(TypeError, match=r"list of names \['w1'\] where the inputs belong.*"
                                        r"f\.train_step\(opt, inputs, wrt=None"):
        f.train_step(SGD(0.1), ["w1"], b, device="interp")
    with pytest.raises(TypeError, match=r"list of names 'w1'"):
        f.train_step(SGD(0.1), "w1", b, device="interp")
    with pytest.raises(TypeError, match="a dict as wrt"):
        f.train_step(SGD(0.1), b, b, device="interp")
    with pytest.raises(TypeError, match="schedule must be an rlxc.LrSchedule"):
        f.train_step(SGD(0.1), b, None, 0.1, device="interp")
    with pytest.raises(TypeError, match="trainer: schedule must be an rlxc.LrSchedule"):
        f.trainer(SGD(0.1), ["w1"])


def _quarter_inplace(arr):  # RLX's in-place form: rewrite the array, return None
    np.round(arr * 4, out=arr)
    arr /= 4


def _quarter(name, arr):
    return np.round(arr * 4) / 4


@pytest.mark.parametrize("device", DEVICES)
def test_qat_callable_in_rlx_in_place_form(device):
    f, data = tiny(), batches(3, nin=5, nout=5)
    master = {n: a.copy() for n, a in f.params().items()}
    a, b, plain = f, f, f
    oa, ob, op = SGD(0.1), SGD(0.1), SGD(0.1)
    for d in data:
        a, la = a.train_step(oa, d, quant=_quarter_inplace, device=device)
        b, lb = b.train_step(ob, d, quant=_quarter, device=device)
        plain, lp = plain.train_step(op, d, device=device)
        assert la == lb != lp
    for n in master:
        np.testing.assert_array_equal(a.params()[n], b.params()[n])
        np.testing.assert_array_equal(f.params()[n], master[n])  # the input is not touched
    tr = f.trainer(SGD(0.1), quant=_quarter_inplace, device=device)
    for d in data:
        tr.step(d)
    for n in master:
        np.testing.assert_array_equal(tr.func.params()[n], b.params()[n])


def test_clip_huge_gradient_in_the_c_train_step(tmp_path):
    """`rlxc compile --train --max-grad-norm`: the same f64 norm and f32 scale in C."""
    from rlxc import export as aot
    from rlxc.runtime import load

    f = linear()
    spec = aot.spec_from_func(f, "lin")
    spec.train = aot.train_spec(f, SGD(1.0), max_grad_norm=1.0)
    aot.build_artifact(spec, str(tmp_path))
    m = load(tmp_path)
    m.train_step(c=HUGE)
    want, _ = clip_reference({"w": HUGE}, 1.0)
    np.testing.assert_array_equal(m.get_param("w"), -want["w"])

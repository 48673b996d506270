"""Dynamic dimensions (issue 14): symbols in shapes, shape functions on symbols, the IR
form (tensor<?x784xf32> + names), transforms keeping symbols, the interpreter at any
size, and the per-call checks (every use of a symbol agrees, no size is 0).

Oracle: the same build traced with a static shape at that size (and NumPy for the MLP)."""
import numpy as np
import pytest

import rlxc
from rlxc.dialect.shapes import ShapeError

SIZES = (1, 2, 7, 64)


def _mlp(B):
    def build(s):
        x = s.input("x", (B, 12))
        y = s.input("y", (B,), "i32")
        h = x.linear(s.param("w1", (12, 16)), s.param("b1", (16,))).relu()
        return h.linear(s.param("w2", (16, 3)), s.param("b2", (3,))).cross_entropy(y)
    return rlxc.Func("mlp", build).init_randn(seed=3, stddev=0.3)


def _data(B, seed=0):
    r = np.random.default_rng(seed + B)
    return r.normal(size=(B, 12)).astype(np.float32), (np.arange(B) % 3).astype(np.int32)


def _ref_mlp(f, x, y):
    p = f.params()
    h = np.maximum(x @ p["w1"] + p["b1"], 0)
    z = (h @ p["w2"] + p["b2"]).astype(np.float64)
    z = z - z.max(-1, keepdims=True)
    lp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return -lp[np.arange(len(y)), y].mean()


def test_signature_and_ir_text():
    f = _mlp("B")
    assert f.input_shape_of("x") == ("B", 12)
    assert f.input_shape_of("y") == ("B",)
    assert f.param_shape_of("w1") == (12, 16)
    assert f.output_shapes() == [()]
    text = f.mlir()
    assert 'tensor<?x12xf32, ["B", ""]>' in text and 'rlx.dims = ["B", ""]' in text
    g = rlxc.Func.from_mlir(text)
    assert g.input_shape_of("x") == ("B", 12) and g.mlir() == text
    assert rlxc.Func("h", lambda s: s.input("x", ("B", 3)) * 2).output_shapes() == [("B", 3)]


@pytest.mark.parametrize("B", SIZES)
def test_mlp_interp_any_size(B):
    f = _mlp("B")
    x, y = _data(B)
    (loss,) = f.run_on("interp", x=x, y=y)
    np.testing.assert_allclose(loss, _ref_mlp(f, x, y), rtol=1e-5)


def _same_as_static(build_dyn, build_static, inputs, transform=lambda f: f, rtol=1e-5):
    fd = transform(rlxc.Func("d", build_dyn).init_randn(seed=1, stddev=0.5))
    fs = transform(rlxc.Func("d", build_static).init_randn(seed=1, stddev=0.5))
    got = fd.run_on("interp", **inputs)
    want = fs.run_on("interp", **inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-6)
    return fd


@pytest.mark.parametrize("B", (1, 7))
@pytest.mark.parametrize("how", ["grad", "value_and_grad_all", "hvp", "jvp"])
def test_transforms_keep_symbols(B, how):
    x, y = _data(B)

    def build(shape):
        def b(s):
            h = s.input("x", shape).linear(s.param("w", (12, 5))).tanh()
            return (h * h).mean() + h.sum(0).softmax().max()
        return b
    t = {"grad": lambda f: f.grad(["x", "w"]), "value_and_grad_all": lambda f: f.value_and_grad_all(),
         "hvp": lambda f: f.hvp(["x"]), "jvp": lambda f: f.jvp(["x"])}[how]
    inputs = {"x": x}
    if how in ("hvp", "jvp"):
        inputs["tangent_x"] = np.ones_like(x)
    fd = _same_as_static(build(("B", 12)), build((B, 12)), inputs, t)
    if how == "grad":
        assert fd.output_shapes() == [("B", 12), (12, 5)]
        assert fd.input_shape_of("x") == ("B", 12)


OPS = {   # unary compositions on a ("B", 4) input, compared with the static trace
    "mse": lambda x: x.mse(x * 2), "rms_norm": lambda x: x.rms_norm(),
    "logsumexp": lambda x: x.logsumexp(-1), "log_softmax0": lambda x: x.log_softmax(0),
    "expand_squeeze": lambda x: x.expand_dims(1).squeeze(1) * x.expand_dims(0).sum(0),
    "where": lambda x: rlxc.tensor.where(x > 0, x, 0.0), "take1": lambda x: x.take([0, 2], 1),
    "index": lambda x: x[:, 1] + x[None, :, 1:3].sum((0, 2)), "flip1": lambda x: x.flip(1),
    "clip_mod": lambda x: x.clip(-0.5, 0.5) + x % 0.3, "prod_max": lambda x: x.prod(0) * x.max(0),
    "xTx": lambda x: x.T @ x, "vecmat": lambda x: x @ np.ones(4, np.float32),
    "gather1": lambda x: x.gather(np.array([3, 0], np.int32), axis=1),
}


@pytest.mark.parametrize("name", list(OPS))
def test_ops_values_grads_jvps(name):
    fn = OPS[name]
    fd = rlxc.Func(name, lambda s: fn(s.input("x", ("B", 4))))
    for B in (1, 5):
        fs = rlxc.Func(name, lambda s: fn(s.input("x", (B, 4))))
        x = np.random.default_rng(B).normal(size=(B, 4)).astype(np.float32)
        for t in (lambda f: f, lambda f: f.grad(["x"]), lambda f: f.jvp(["x"])):
            kw = {"x": x, "tangent_x": x} if "tangent_x" in t(fd).input_names() else {"x": x}
            for a, b in zip(t(fd).run_on("interp", **kw), t(fs).run_on("interp", **kw)):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("B", (1, 7))
def test_layer_norm_softmax_reshape_chain(B):
    def build(shape):
        def b(s):
            x = s.input("x", shape)                       # (B, 4, 6)
            y = x.reshape(-1, 24).layer_norm()            # (B, 24)
            z = y.reshape(-1, 6, 4).transpose(0, 2, 1)    # (B, 4, 6)
            w = z[:, 1:3, ::2].softmax(-1)                # slice on static axes
            c = rlxc.concat([w, w * 2], axis=1)           # concat on a static axis
            return c.mean(0), c.sum((0, 1))
        return b
    x = np.random.default_rng(B).normal(size=(B, 4, 6)).astype(np.float32)
    _same_as_static(build(("B", 4, 6)), build((B, 4, 6)), {"x": x})
    _same_as_static(build(("B", 4, 6)), build((B, 4, 6)), {"x": x},
                    lambda f: f.grad(["x"]))


def test_gather_matmul_batch_and_two_symbols():
    def build(shape):
        def b(s):
            ids = s.input("ids", shape, "i32")                     # (B, T)
            e = s.param("emb", (10, 4)).gather(ids)                # (B, T, 4)
            att = e @ e.transpose(0, 2, 1)                         # (B, T, T)
            return (att.softmax(-1) @ e).mean((0, 1))
        return b
    ids = (np.arange(15).reshape(3, 5) % 10).astype(np.int32)
    fd = _same_as_static(build(("B", "T")), build((3, 5)), {"ids": ids})
    _same_as_static(build(("B", "T")), build((3, 5)), {"ids": ids}, lambda f: f.grad_all())
    assert fd.output_shapes() == [(4,)]


def test_vmap_adds_static_leading_axis():
    def build(shape):
        return lambda s: (s.input("x", shape) * s.param("w", (3,))).sum(-1).tanh()
    x = np.random.default_rng(0).normal(size=(4, 7, 3)).astype(np.float32)
    fd = _same_as_static(build(("B", 3)), build((7, 3)), {"x": x}, lambda f: f.vmap(["x"], 4))
    assert fd.input_shape_of("x") == (4, "B", 3) and fd.output_shapes() == [(4, "B")]


def test_none_is_a_fresh_symbol():
    f = rlxc.Func("n", lambda s: s.input("a", (None, 2)).sum(1))
    again = rlxc.Func("n", lambda s: s.input("a", (None, 2)).sum(1))
    assert f.trace_hash() == again.trace_hash()     # names per scope: retracing is stable
    (sym,) = [d for d in f.input_shape_of("a") if isinstance(d, str)]
    assert sym.startswith("?")
    with pytest.raises(ShapeError, match="anonymous"):
        rlxc.Func("n2", lambda s: s.input("a", (None,)) + s.input("b", (None,)))


@pytest.mark.parametrize("build, match", [
    (lambda s: s.input("x", ("B",)) + s.input("y", ("C",)), "dimension 'B' vs dimension 'C'"),
    (lambda s: s.input("x", ("B",)) + s.input("y", (3,)), "dimension 'B' vs 3"),
    (lambda s: rlxc.concat([s.input("x", ("B",)), s.input("y", ("B",))]), "dimension 'B'"),
    (lambda s: s.input("x", ("B", 3)).reshape(-1), "cannot be merged"),
    (lambda s: s.input("x", ("B", 3)).reshape("C", 3), "'C' is not a dimension"),
    (lambda s: s.input("x", ("B", 3)) @ s.input("y", ("C", 2)), "inner dimensions"),
    (lambda s: s.input("x", ("B", 3))[1:], "only sliced whole"),
    (lambda s: s.input("x", ("B", 3)).narrow(0, 1, 2), "only sliced whole"),
    (lambda s: s.param("w", ("B", 3)), "params are static"),
    (lambda s: s.input("x", ("B", 3))[-1], "dimension 'B' is dynamic"),
    (lambda s: s.input("x", ("B", 3)).take([0, 1], 0), "dimension 'B' is dynamic"),
    (lambda s: s.input("x", ("B", 3)).flip(0), "dimension 'B' is dynamic"),
])
def test_trace_errors_name_the_symbol(build, match):
    with pytest.raises(ShapeError, match=match):
        rlxc.Func("bad", build)


def test_runtime_checks():
    f = rlxc.Func("two", lambda s: s.input("x", ("B", 2)).sum(1) + s.input("y", ("B",)))
    x, y = np.ones((32, 2), np.float32), np.ones(16, np.float32)
    for dev in ("interp",):
        with pytest.raises(ShapeError, match="dimension 'B' is 32 from input 'x' but 16 "
                                             "from input 'y'"):
            f.run_on(dev, x=x, y=y)
        with pytest.raises(ValueError, match="dimension 'B' is 0 from input 'x'"):
            f.run_on(dev, x=np.ones((0, 2), np.float32), y=np.ones(0, np.float32))
        with pytest.raises(ShapeError, match=r"expects shape \(B, 2\), got \(4, 3\)"):
            f.run_on(dev, x=np.ones((4, 3), np.float32), y=np.ones(4, np.float32))
        (out,) = f.run_on(dev, x=x[:5], y=np.arange(5, dtype=np.float32))
        np.testing.assert_allclose(out, 2 + np.arange(5))


def test_rlxc_opt_round_trip(tmp_path):
    from click.testing import CliRunner

    from rlxc.cli.main import main

    f = _mlp("B")
    p = tmp_path / "m.mlir"
    p.write_text(f.mlir())
    r = CliRunner().invoke(main, ["opt", str(p), "-p", "rlx-grad{wrt=w1},cleanup"])
    assert r.exit_code == 0, r.output
    g = rlxc.Func.from_mlir(r.output)
    assert g.output_shapes() == [(12, 16)] and g.input_shape_of("x") == ("B", 12)
    x, y = _data(5)
    want = f.grad(["w1"]).run_on("interp", x=x, y=y, **f.params())[0]
    np.testing.assert_allclose(g.run_on("interp", x=x, y=y, **f.params())[0], want, rtol=1e-6)


# -- native backends: one static program per distinct set of sizes (rlxc/dynamic.py) ----

def test_cpu_runs_any_size_and_caches_per_size():
    from rlxc.backends import STATS

    f = _mlp("B")
    j = f.jit_on("cpu")
    for B in (1, 7, 64, 7):
        x, y = _data(B)
        np.testing.assert_allclose(f.run_on("cpu", x=x, y=y)[0], _ref_mlp(f, x, y), rtol=1e-4)
        np.testing.assert_allclose(j.run(x=x, y=y)[0], _ref_mlp(f, x, y), rtol=1e-4)
    before = STATS["compiles"]
    x, y = _data(7)
    j.set_num_threads(1)
    j.run(x=x, y=y)
    f.run_on("cpu", x=x, y=y)
    assert STATS["compiles"] == before          # a size seen before compiles nothing
    with pytest.raises(ShapeError, match="dimension 'B' is 3 from input 'x' but 2"):
        j.run(x=np.ones((3, 12), np.float32), y=np.zeros(2, np.int32))
    with pytest.raises(ValueError, match="dimension 'B' is 0"):
        f.run_on("cpu", x=np.ones((0, 12), np.float32), y=np.zeros(0, np.int32))


def test_specialize():
    f = _mlp("B")
    g = f.specialize(B=5)
    assert g.input_shape_of("x") == (5, 12) and not g.is_dynamic() and f.is_dynamic()
    x, y = _data(5)
    np.testing.assert_allclose(g.run_on("interp", x=x, y=y)[0], f.run_on("interp", x=x, y=y)[0])
    with pytest.raises(ValueError, match="give a size for"):
        f.specialize()


@pytest.mark.parametrize("device", ["cpu", "interp"])
def test_train_step_and_trainer_any_batch(device):
    f = _mlp("B")
    sizes = (8, 8, 3, 8, 3)                     # partial batches, and back to a size seen
    g, opt_d = f, rlxc.optim.SGD(0.1)
    tr = f.trainer(rlxc.optim.SGD(0.1), device=device)
    ref, opt_s = f, rlxc.optim.SGD(0.1)
    for B in sizes:
        x, y = _data(B)
        g, loss = g.train_step(opt_d, {"x": x, "y": y}, device=device)
        lt = tr.step({"x": x, "y": y})
        s = ref.specialize(B=B)                 # oracle: the static step at this size
        s, want = s.train_step(opt_s, {"x": x, "y": y}, device="interp")
        ref = f.with_params(s.params())
        np.testing.assert_allclose([loss, lt], [want, want], rtol=1e-5)
    for n, w in ref.params().items():
        np.testing.assert_allclose(g.params()[n], w, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(tr.func.params()[n], w, rtol=1e-5, atol=1e-6)


def test_aot_compile_builds_one_library_or_at_a_size(tmp_path):
    from click.testing import CliRunner

    from rlxc.cli.main import main
    from rlxc.runtime import load

    f = _mlp("B")
    src = tmp_path / "m.mlir"
    src.write_text(f.mlir())
    r = CliRunner().invoke(main, ["compile", str(src), "-o", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output   # one library for every size (tests/test_aot_dynamic.py)
    m = load(tmp_path / "a", new=True)
    m.set_params(f.params())
    assert m.dims == ["B"]
    for B in (3, 8):
        x, y = _data(B)
        np.testing.assert_allclose(m.run(x=x, y=y)[0], f.run(x=x, y=y)[0], rtol=1e-5)
    r = CliRunner().invoke(main, ["compile", str(src), "--emit", "llvm"])
    assert r.exit_code != 0 and "dynamic dimensions ['B']" in r.output and "--sizes B=" in r.output
    r = CliRunner().invoke(main, ["compile", str(src), "-o", str(tmp_path / "a"), "--sizes", "C=3"])
    assert r.exit_code == 2 and "not a dynamic dimension" in r.output
    r = CliRunner().invoke(main, ["compile", str(src), "--emit", "rlx", "--sizes", "B=5"])
    assert r.exit_code == 0, r.output
    assert "tensor<5x12xf32>" in r.output and "?" not in r.output

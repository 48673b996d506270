"""Dynamic dims through this round's features (issue 14 x issues 15/16): conv and pools
with a dynamic batch N, attention with dynamic B/S under every mask kind, einsum,
argmax/cumsum/topk/one_hot along static axes, RNG draws and dropout of a dynamic shape,
scan/while/cond with dynamic carries, xs and a symbolic scan length, and grad/vmap of
these.

Oracle: the interpreter runs the symbolic module itself; the CPU runs one static
specialization per set of sizes (dialect/specialize.py, which walks into regions), so
interp == CPU at two sizes checks that specialization; the same graph traced with a
static shape gives the interpreter's oracle where a NumPy one is not at hand."""
import numpy as np
import pytest

import rlxc
from rlxc.dialect.shapes import ShapeError


def _inputs(f, sizes, seed=0):
    r = np.random.default_rng(seed + sum(sizes.values()))
    out = {}
    for a in f.signature():
        if a.kind != "input":
            continue
        shape = tuple(sizes[d] if isinstance(d, str) else d for d in a.shape)
        if a.dtype == "i1":
            out[a.name] = r.random(shape) > 0.3
        elif a.dtype == "u32":
            out[a.name] = np.array([7, 11], np.uint32)
        elif a.dtype in ("i32", "i64"):
            out[a.name] = r.integers(0, 3, size=shape).astype(a.dtype.replace("i", "int"))
        else:
            out[a.name] = r.normal(size=shape).astype(np.float32)
    return out


def _close(got, want, what, rtol=2e-4, atol=2e-5):
    assert len(got) == len(want), what
    for g, w in zip(got, want):
        assert g.shape == w.shape, what
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=what)


def _interp_vs_cpu(f, size_sets, fix=None):
    for sizes in size_sets:
        x = _inputs(f, sizes)
        if fix:
            fix(x)
        _close(f.run_on("cpu", **x), f.run_on("interp", **x), f"{f.name} {sizes}")


def _func(build, name="f"):
    return rlxc.Func(name, build).init_randn(seed=2, stddev=0.4)


# ---------------------------------------------------------------- control flow

def _rnn(s):
    xs = s.input("xs", ("T", "B", 4))
    h0 = s.input("h", ("B", 4))
    w = s.param("w", (4, 4))

    def body(h, x):
        h = (h.matmul(w) + x).tanh()
        return h, h.sum(-1)
    h, ys = rlxc.scan(body, h0, xs)
    return h.sum() + (ys * ys).mean()


def _while_cond(s):
    h0 = s.input("h", ("B", 4))
    p = s.input("p", (), "i1")
    w = s.param("w", (4, 4))
    _, h = rlxc.while_loop(lambda c: c[0] < 3,        # (no reverse mode through while)
                           lambda c: (c[0] + 1, (c[1] * 0.7).tanh()),
                           (s.constant(np.int32(0), "i32"), h0))
    return rlxc.cond(p, lambda a: a.matmul(w) * 2.0, lambda a: a.matmul(w).exp(), h).sum()


def _length_from_symbol(s):
    x = s.input("x", ("B", 3))
    w = s.param("w", (3,))
    # fori-style: no xs; the ys carry the symbol, the length is x's batch
    c, ys = rlxc.scan(lambda c, _: (c * 0.5 + w, (c * w).sum()), x.sum(0), None,
                      length=x.shape[0])
    return c.sum() + ys.sum(), ys


@pytest.mark.parametrize("build", [_rnn, _while_cond, _length_from_symbol])
def test_control_flow_dynamic_interp_vs_cpu_and_grad(build):
    f = _func(build, build.__name__.strip("_"))
    _interp_vs_cpu(f, [{"T": 3, "B": 2}, {"T": 1, "B": 5}])
    g = f.value_and_grad_all() if build is not _length_from_symbol else \
        rlxc.Func("l", lambda s: build(s)[0]).init_randn(seed=2, stddev=0.4).value_and_grad_all()
    _interp_vs_cpu(g, [{"T": 2, "B": 3}])


def test_scan_symbolic_length_sizes_and_vmap():
    f = _func(_length_from_symbol)
    for B in (1, 4):
        x = _inputs(f, {"B": B})
        _, ys = f.run_on("interp", **x)
        assert ys.shape == (B,)
    v = _func(_rnn).vmap(["h"], 2)
    assert v.input_shape_of("h") == (2, "B", 4)
    _interp_vs_cpu(v, [{"T": 2, "B": 3}])


def test_scan_carry_only_symbolic_length_is_a_clear_error():
    def build(s):
        x = s.input("x", ("B", 3))
        c, _ = rlxc.scan(lambda c, _: (c * 2.0, None), x.sum(0), None, length=x.shape[0])
        return c
    with pytest.raises(ShapeError, match="dimension 'B'"):
        rlxc.Func("c", build).output_shapes()


# ---------------------------------------------------------------- einsum

EINSUM = [("bij,jk->bik", (("B", 3, 4), (4, 5))),
          ("bhqd,bhkd->bhqk", (("B", 2, "S", 4), ("B", 2, "S", 4))),
          ("bi,bi->b", (("B", 3), ("B", 3))),
          ("bij->j", (("B", 3, 4),)),
          ("ij,bj->bi", ((3, 4), ("B", 4))),
          ("bs,bs->", (("B", "S"), ("B", "S"))),
          ("bs,sk->bk", (("B", "S"), ("S", 5)))]


@pytest.mark.parametrize("spec, shapes", EINSUM, ids=[e[0] for e in EINSUM])
def test_einsum_symbolic_letters_numpy_cpu(spec, shapes):
    def build(s):
        ts = [s.input(f"x{i}", sh) for i, sh in enumerate(shapes)]
        return rlxc.einsum(spec, *ts)
    f = rlxc.Func("e", build)
    for sizes in ({"B": 1, "S": 3}, {"B": 4, "S": 2}):
        x = _inputs(f, sizes)
        want = np.einsum(spec, *[x[f"x{i}"].astype(np.float64) for i in range(len(shapes))])
        (got,) = f.run_on("interp", **x)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        (cpu,) = f.run_on("cpu", **x)
        np.testing.assert_allclose(cpu, want, rtol=1e-4, atol=1e-5)


def test_einsum_symbolic_grad_and_diagonal_error():
    def build(s):
        x = s.input("x", ("B", 3, 4))
        return (rlxc.einsum("bij,jk->bik", x, s.param("w", (4, 5))).tanh() ** 2).mean()
    g = _func(build).value_and_grad_all()
    _interp_vs_cpu(g, [{"B": 2}, {"B": 5}])

    def diag(s):
        return rlxc.einsum("bb->b", s.input("x", ("B", "B")))
    with pytest.raises(ShapeError, match="dimension 'B'"):
        rlxc.Func("d", diag).output_shapes()


# ---------------------------------------------------------------- index ops

def _index_ops(s):
    x = s.input("x", ("B", 9))
    y = s.input("y", ("B", "S"), "i32")
    w = s.param("w", (9,))
    z = x * w
    v, i = z.topk(2)                      # select path (k * 8 < n is false: ranking)
    v3, i3 = z.reshape("B", 3, 3).topk(1, axis=1)
    return (z.cumsum(1) * z).sum() + v.sum() + v3.sum(), i, i3, z.argmax(-1), \
        z.argmin(1, keepdims=True), y.one_hot(4).sum(1)


def test_index_ops_static_axes_of_dynamic_tensors():
    f = _func(_index_ops)
    assert f.output_shapes()[1:] == [("B", 2), ("B", 1, 3), ("B",), ("B", 1), ("B", 4)]
    _interp_vs_cpu(f, [{"B": 1, "S": 2}, {"B": 6, "S": 3}])
    x = _inputs(f, {"B": 4, "S": 2})
    out = f.run_on("interp", **x)
    z = x["x"] * f.params()["w"]
    np.testing.assert_array_equal(out[1], np.argsort(-z, 1, kind="stable")[:, :2])
    np.testing.assert_array_equal(out[3], z.argmax(-1))
    np.testing.assert_array_equal(out[5], np.eye(4)[x["y"]].sum(1))
    g = rlxc.Func("g", lambda s: _index_ops(s)[0]).init_randn(seed=2, stddev=0.4)
    _interp_vs_cpu(g.value_and_grad_all(), [{"B": 3, "S": 2}])


@pytest.mark.parametrize("op", ["argmax", "cumsum", "topk"])
def test_index_ops_along_a_dynamic_axis_name_the_symbol(op):
    def build(s):
        x = s.input("x", ("B", 4))
        return x.topk(1, axis=0)[0] if op == "topk" else getattr(x, op)(0)
    with pytest.raises(ShapeError, match=f"{op}: axis 0 .* dimension 'B'"):
        rlxc.Func("e", build).output_shapes()


# ---------------------------------------------------------------- RNG and dropout

def _rng(shape):
    def build(s):
        x = s.input("x", shape)
        key = s.input("key", (2,), "u32")
        w = s.param("w", (shape[-1],))
        d = (x * w).dropout(0.3, key)
        u = rlxc.random.uniform(key, x.shape, stream=1)
        n = rlxc.random.normal(key, x.shape, stream=2)
        return (d * d).sum() + (u * x).sum(), d, u, n
    return build


@pytest.mark.parametrize("shape", [("B", 5), ("B", "S", 3)], ids=["B5", "BS3"])
def test_rng_dynamic_shapes_match_static_draws_and_cpu(shape):
    f = _func(_rng(shape))
    assert "rlx.iota" in f.mlir()
    g = rlxc.Func.from_mlir(f.mlir())                       # round-trips through the text
    assert g.output_shapes() == f.output_shapes()
    for sizes in ({"B": 1, "S": 2}, {"B": 6, "S": 3}):
        static = tuple(sizes.get(d, d) for d in shape)
        fs = _func(_rng(static))
        x = _inputs(f, sizes)
        _close(f.run_on("interp", **x), fs.run_on("interp", **x), f"static {sizes}",
               rtol=1e-6, atol=1e-7)
        _close(f.run_on("cpu", **x), f.run_on("interp", **x), f"cpu {sizes}")
    _interp_vs_cpu(rlxc.Func("l", lambda s: _rng(shape)(s)[0]).init_randn(seed=2, stddev=0.4)
                   .value_and_grad_all(), [{"B": 3, "S": 2}])


def test_dropout_inside_scan_and_vmap_of_keys():
    def build(s):
        xs = s.input("xs", ("T", "B", 4))
        key = s.input("key", (2,), "u32")
        w = s.param("w", (4, 4))

        def body(h, x):
            h = (h.matmul(w) + x.dropout(0.5, key)).tanh()
            return h, h
        h, ys = rlxc.scan(body, xs.sum(0) * 0.0, xs)
        return (ys * ys).mean()
    f = _func(build)
    _interp_vs_cpu(f.value_and_grad_all(), [{"T": 2, "B": 3}, {"T": 3, "B": 1}])
    v = _func(_rng(("B", 5))).vmap(["key"], 2)
    x = _inputs(v, {"B": 3})
    x["key"] = np.array([[1, 2], [3, 4]], np.uint32)
    got = v.run_on("interp", **x)
    one = _func(_rng(("B", 5)))
    for i in range(2):
        want = one.run_on("interp", x=x["x"], key=x["key"][i])
        _close([g[i] for g in got], want, f"vmap key {i}", rtol=1e-6, atol=1e-7)
    _close(v.run_on("cpu", **x), got, "vmap cpu")


def test_rng_shape_symbol_must_come_from_an_input():
    def build(s):
        x = s.input("x", ("B", 3))
        return rlxc.random.uniform(s.input("key", (2,), "u32"), ("N", 3)) + x.sum()
    with pytest.raises(ShapeError, match="dimension 'N' is not a dimension of any input"):
        rlxc.Func("r", build).output_shapes()


# ---------------------------------------------------------------- conv, pools, attention

def _cnn(s):
    x = s.input("x", ("N", 2, 8, 8))
    y = x.conv2d(s.param("w", (3, 2, 3, 3)), s.param("b", (3,)), padding=1).relu()
    y = y.max_pool2d(2).conv2d(s.param("wd", (3, 1, 3, 3)), groups=3, padding="same")
    y = y.conv_transpose2d(s.param("wt", (3, 2, 2, 2)), stride=2).avg_pool2d(2)
    z = s.input("z", ("N", 2, 9)).conv1d(s.param("w1", (3, 2, 3)), stride=2)
    return (y * y).mean() + z.tanh().sum() + y.upsample_nearest2d(2).sum() * 0.1, y


def _attn(mask):
    def build(s):
        q = s.input("q", ("B", 2, "S", 4))
        k = s.input("k", ("B", 2, "S", 4))
        v = s.input("v", ("B", 2, "S", 4))
        wq = s.param("wq", (4, 4))
        m = s.input("m", ("B", 1, "S", "S"), "i1") if mask == "tensor" else mask
        o = rlxc.attention(q.matmul(wq), k, v, mask=m, softcap=5.0 if mask is None else None)
        return (o * o).sum(), o
    return build


def _fix_mask(x):
    if "m" in x:
        x["m"][..., 0] = True        # no fully masked row (those give zeros, also fine)


@pytest.mark.parametrize("kind", ["conv", None, "causal", ("sliding", 2), "tensor"],
                         ids=["conv", "none", "causal", "sliding", "tensor"])
def test_conv_attention_dynamic_batch_interp_cpu_grad(kind):
    build = _cnn if kind == "conv" else _attn(kind)
    f = _func(build)
    sizes = [{"N": 1, "B": 1, "S": 3}, {"N": 3, "B": 2, "S": 5}]
    _interp_vs_cpu(f, sizes, _fix_mask)
    g = rlxc.Func("l", lambda s: build(s)[0]).init_randn(seed=2, stddev=0.4)
    _interp_vs_cpu(g.value_and_grad_all(), sizes[1:], _fix_mask)
    if kind == "conv":        # static oracle for the values at one size
        fs = _func(lambda s: _cnn_static(s, 3))
        x = _inputs(f, sizes[1])
        _close(f.run_on("interp", **x), fs.run_on("interp", **x), "conv static", 1e-5, 1e-6)


def _cnn_static(s, n):
    orig = s.input

    def inp(name, shape, *a):
        return orig(name, tuple(n if d == "N" else d for d in shape), *a)
    s.input = inp
    return _cnn(s)


def test_vmap_of_dynamic_conv_and_attention():
    f = _func(_attn("causal")).vmap(["q"], 2)
    assert f.input_shape_of("q") == (2, "B", 2, "S", 4)
    _interp_vs_cpu(f, [{"B": 2, "S": 3}])
    c = _func(_cnn).vmap(["x"], 2)
    _interp_vs_cpu(c, [{"N": 2}])


def test_gpu_emulator_dynamic_features_small():
    from rlxc.lowering.gpu import emu as gpu_emu

    for build, sizes in ((_attn("causal"), {"B": 1, "S": 3}), (_rnn, {"T": 2, "B": 2}),
                         (_rng(("B", 5)), {"B": 3})):
        f = _func(build)
        x = _inputs(f, sizes)
        s = f.specialize(**{k: v for k, v in sizes.items()
                            if any(k in a.shape for a in f.signature())})
        _close(gpu_emu.emulate(s.module, s.bind_call((), x)), f.run_on("interp", **x),
               f"gpu emulator {sizes}")


def test_distributed_trainer_with_a_dynamic_batch_is_a_clear_error():
    from rlxc.distributed import init

    def build(s):
        x = s.input("x", ("B", 3))
        return (x.linear(s.param("w", (3, 2))) ** 2).mean()
    f = _func(build)
    for kw in ({}, {"batch_size": 4}):
        with pytest.raises(ValueError, match="dynamic dimension 'B'.*specialize"):
            f.trainer(rlxc.optim.SGD(0.1), comm=init(), device="cpu", **kw)
    tr = f.specialize(B=4).trainer(rlxc.optim.SGD(0.1), comm=init(), device="cpu")
    assert np.isfinite(tr.step({"x": np.ones((4, 3), np.float32)}))


@pytest.mark.parametrize("dev", ["cpu", "interp"])
def test_indexing_with_an_index_tensor_of_dynamic_length(dev):
    """x[i] with i of shape (B,), alone and beside a constant array (which broadcasts into
    B): the constant part of the flat index no longer builds a NumPy array of shape B."""
    x = np.arange(36, dtype=np.float32).reshape(9, 4)
    f = rlxc.Func("dynidx", lambda s: (lambda x, i: (x[i], x[i, np.array([1])]))(
        s.input("x", (9, 4)), s.input("i", ("B",), "i32")))
    for i in ([1, 2], [0, -1, 3, 8, 2]):
        i = np.array(i, np.int32)
        a, b = f.run_on(dev, x=x, i=i)
        np.testing.assert_array_equal(a, x[i])
        np.testing.assert_array_equal(b, x[i, np.array([1])])


def test_jit_of_a_dynamic_func_takes_inputs_by_position():
    """SizedJitted.run takes positional inputs as the static Jitted.run does."""
    f = rlxc.Func("dynpos", lambda s: (s.input("x", ("B", 4)) * s.input("w", (4,))).sum(1))
    j = f.jit()
    x, w = np.ones((3, 4), np.float32), np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(j.run(x, w)[0], np.full(3, 6.0, np.float32))
    np.testing.assert_array_equal(j.run(x[:2], w=w)[0], np.full(2, 6.0, np.float32))
    with pytest.raises(TypeError, match="input 'x' given twice"):
        j.run(x, x=x)
    with pytest.raises(TypeError, match="3 positional inputs, expected at most 2"):
        j.run(x, w, w)

"""vmap against a Python loop over the unbatched function, for every op.

Oracle: for a function f and inputs where some carry a leading batch axis,
vmap(f)(xs)[b] must equal f(xs[b]) evaluated by the reference interpreter.
Every op with a batching rule has at least one case builder below (a test
fails when a rule has none), and every case is checked with each non-empty
subset of its inputs batched, so each operand side is covered.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import rlxc
from rlxc.dialect import module as M
from rlxc.dialect.interpreter import interpret
from rlxc.dialect.ops import OPS
from rlxc.dialect.passes import cleanup
from rlxc.dialect.vmap import BATCH_RULES, vmap_module
from rlxc.dialect.types import shape_of

B = 3


# ---------------------------------------------------------------- oracle

def _gen(rng, arg, gens):
    g = gens.get(arg.name)
    if g is not None:
        return g(rng, arg.shape)
    if arg.dtype == "i1":
        return rng.random(arg.shape) < 0.5
    if arg.dtype in ("i32", "i64"):
        return rng.integers(-5, 5, arg.shape).astype(np.int32 if arg.dtype == "i32" else np.int64)
    return rng.uniform(-2, 2, arg.shape).astype(np.float32)


def check_vmap(module, batched, gens=None, batch_size=B, seed=0, rtol=2e-5, atol=1e-5):
    """vmap(module) on stacked inputs equals a loop of the interpreter over the batch."""
    gens = gens or {}
    rng = np.random.default_rng(seed)
    sig = M.signature(M.get_func(module))
    per = {}  # name -> list of per-example arrays (batched) or one array (shared)
    for a in sig:
        if a.name in batched:
            per[a.name] = [_gen(rng, a, gens) for _ in range(batch_size)]
        else:
            per[a.name] = _gen(rng, a, gens)
    before = str(module)
    vm = vmap_module(module, batched, batch_size)
    assert str(module) == before, "vmap_module mutated its input"
    vm.verify()
    vsig = M.signature(M.get_func(vm))
    assert [a.name for a in vsig] == [a.name for a in sig]
    for a, va in zip(sig, vsig):
        want = ((batch_size,) + tuple(a.shape)) if a.name in batched else tuple(a.shape)
        assert tuple(va.shape) == want and va.kind == a.kind and va.dtype == a.dtype
    args = [np.stack(per[a.name]) if a.name in batched else per[a.name] for a in sig]
    got = interpret(vm, args)
    loops = [interpret(module, [per[a.name][b] if a.name in batched else per[a.name]
                                for a in sig]) for b in range(batch_size)]
    for i, g in enumerate(got):
        want = np.stack([lp[i] for lp in loops])
        assert g.shape == want.shape, f"output {i}: {g.shape} vs {want.shape}"
        np.testing.assert_allclose(g, want, rtol=rtol, atol=atol, err_msg=f"output {i}")
    return vm


def _module(build, name="f"):
    return rlxc.Func(name, build).module


def _op(name, inputs, **params):
    """A builder emitting exactly one `name` op on inputs [(name, shape, dtype)]."""
    def build(s):
        xs = [s.input(n, shp, dt) for n, shp, dt in inputs]
        return s.emit(OPS[name], xs, **params)
    return build


def _cast(dtype, inputs):
    def build(s):
        (n, shp, dt), = inputs
        return s.input(n, shp, dt).cast(dtype)
    return build


pos = {"a": lambda rng, shp: rng.uniform(0.5, 2.0, shp).astype(np.float32)}


def _ints(hi, dtype=np.int32):
    return lambda rng, shp: rng.integers(0, hi, shp).astype(dtype)


# ---------------------------------------------------------------- case builders, one row per op

F = "f32"
CASES: dict[str, list] = {}
for _n, _c in OPS.items():
    if _c.FAMILY == "unary" and _n != "rlx.fake_quant":
        CASES[_n] = [(_op(_n, [("a", (2, 3), F)]),
                      pos if _n in ("rlx.log", "rlx.sqrt", "rlx.rsqrt") else {})]
    elif _c.FAMILY in ("binary", "compare"):
        CASES[_n] = [(_op(_n, [("a", (2, 3), F), ("b", (2, 3), F)]),
                      pos if _n == "rlx.pow" else {})]
    elif _c.FAMILY == "reduce":
        CASES[_n] = [(_op(_n, [("a", (2, 3, 4), F)], axes=(1,), keepdims=False), {}),
                     (_op(_n, [("a", (2, 3, 4), F)], axes=(0, 2), keepdims=True), {}),
                     (_op(_n, [("a", (2, 3), F)], axes=(0, 1), keepdims=False), {}),
                     (_op(_n, [("a", (2, 3), F)], axes=(), keepdims=False), {})]

CASES["rlx.fake_quant"] = [(_op("rlx.fake_quant", [("a", (2, 3), F)], exp_bits=4, man_bits=3,
                                max_normal=448.0), {})]
CASES["rlx.select"] = [(_op("rlx.select", [("c", (2, 3), "i1"), ("a", (2, 3), F),
                                           ("b", (2, 3), F)]), {})]
CASES["rlx.cast"] = [(_cast("i32", [("a", (2, 3), F)]), {}),
                     (_cast("f32", [("a", (2, 3), "i1")]), {}),
                     (_cast("f64", [("a", (4,), "i32")]), {})]
CASES["rlx.matmul"] = [
    (_op("rlx.matmul", [("a", (2, 3), F), ("b", (3, 4), F)]), {}),
    (_op("rlx.matmul", [("a", (5, 2, 3), F), ("b", (3, 4), F)]), {}),
    (_op("rlx.matmul", [("a", (2, 3), F), ("b", (5, 3, 4), F)]), {}),
    (_op("rlx.matmul", [("a", (5, 2, 3), F), ("b", (5, 3, 4), F)]), {}),
    (_op("rlx.matmul", [("a", (1, 2, 3), F), ("b", (6, 4, 3, 2), F)]), {}),
]
CASES["rlx.transpose"] = [(_op("rlx.transpose", [("a", (2, 3, 4), F)], perm=(2, 0, 1)), {}),
                          (_op("rlx.transpose", [("a", (2, 3), F)], perm=(1, 0)), {})]
CASES["rlx.reshape"] = [(_op("rlx.reshape", [("a", (2, 3, 4), F)], shape=(6, 4)), {}),
                        (_op("rlx.reshape", [("a", (1,), F)], shape=()), {})]
CASES["rlx.broadcast_to"] = [
    (_op("rlx.broadcast_to", [("a", (3, 1), F)], shape=(2, 3, 4)), {}),
    (_op("rlx.broadcast_to", [("a", (), F)], shape=(2, 2)), {}),
    (_op("rlx.broadcast_to", [("a", (1, 4), F)], shape=(3, 4)), {}),
]
CASES["rlx.slice"] = [(_op("rlx.slice", [("a", (5, 6), F)], starts=(1, 0), limits=(5, 6),
                           strides=(2, 3)), {})]
CASES["rlx.pad"] = [(_op("rlx.pad", [("a", (2, 3), F)], low=(1, 0), high=(0, 2)), {})]
CASES["rlx.concat"] = [
    (_op("rlx.concat", [("a", (2, 3), F), ("b", (1, 3), F)], axis=0), {}),
    (_op("rlx.concat", [("a", (2, 3), F), ("b", (2, 1), F), ("c", (2, 2), F)], axis=1), {}),
]
CASES["rlx.gather"] = [
    (_op("rlx.gather", [("a", (5, 4), F), ("i", (3,), "i32")], axis=0), {"i": _ints(5)}),
    (_op("rlx.gather", [("a", (2, 5, 3), F), ("i", (2, 2), "i64")], axis=1),
     {"i": _ints(5, np.int64)}),
    (_op("rlx.gather", [("a", (2, 3, 5), F), ("i", (4,), "i32")], axis=2), {"i": _ints(5)}),
]
CASES["rlx.scatter_add"] = [
    (_op("rlx.scatter_add", [("i", (3,), "i32"), ("u", (3, 4), F)], axis=0, dim=5),
     {"i": _ints(5)}),
    (_op("rlx.scatter_add", [("i", (2, 2), "i64"), ("u", (3, 2, 2, 4), F)], axis=1, dim=6),
     {"i": _ints(6, np.int64)}),
    (_op("rlx.scatter_add", [("i", (4,), "i32"), ("u", (2, 4), F)], axis=1, dim=3),
     {"i": _ints(3)}),
]

_u32 = lambda rng, shp: rng.integers(0, 2 ** 32, shp, dtype=np.uint64).astype(np.uint32)  # noqa
CASES["rlx.philox"] = [   # rlxc.random: keys and counters batched in every combination
    (_op("rlx.philox", [("k0", (2, 3), "u32"), ("k1", (2, 3), "u32"), ("c", (2, 3), "i32")],
         word=1, stream=5), {"k0": _u32, "k1": _u32, "c": _ints(1000)})]
_CONV = dict(stride=(2, 1), padding=(1, 0, 2, 1), dilation=(1, 2), groups=2)
CASES["rlx.conv2d"] = [(_op("rlx.conv2d", [("x", (2, 4, 6, 5), F), ("w", (4, 2, 3, 2), F)],
                            **_CONV), {})]
CASES["rlx.conv_transpose2d"] = [(_op("rlx.conv_transpose2d", [("x", (2, 4, 3, 3), F),
                                                               ("w", (4, 1, 3, 2), F)],
                                      **_CONV, output_padding=(1, 0)), {})]
CASES["rlx.conv2d_filter_grad"] = [(_op("rlx.conv2d_filter_grad", [("x", (2, 4, 6, 5), F),
                                                                   ("y", (2, 4, 3, 6), F)],
                                        **_CONV, kernel=(3, 2)), {})]
_QKV = [("q", (2, 2, 3, 4), F), ("k", (2, 2, 5, 4), F), ("v", (2, 2, 5, 4), F)]
CASES["rlx.attention"] = [
    (_op("rlx.attention", _QKV, scale=0.5, softcap=0.0, kind="", window=0), {}),
    (_op("rlx.attention", _QKV, scale=0.5, softcap=2.0, kind="causal", window=0), {}),
    (_op("rlx.attention", _QKV, scale=0.5, softcap=0.0, kind="sliding", window=2), {}),
    (_op("rlx.attention", _QKV + [("m", (1, 2, 3, 5), "i1")], scale=0.5, softcap=0.0,
         kind="tensor", window=0), {}),
]
_QKVOL = _QKV + [("o", (2, 2, 3, 4), F), ("do", (2, 2, 3, 4), F), ("l", (2, 2, 3, 1), F)]
CASES["rlx.attention_lse"] = [
    (_op("rlx.attention_lse", _QKV, scale=0.5, softcap=2.0, kind="causal", window=0), {}),
    (_op("rlx.attention_lse", _QKV + [("m", (1, 2, 3, 5), "i1")], scale=0.5, softcap=0.0,
         kind="tensor", window=0), {})]
CASES["rlx.attention_bwd"] = [
    (_op("rlx.attention_bwd", _QKVOL, scale=0.5, softcap=2.0, kind="sliding", window=2), {}),
    (_op("rlx.attention_bwd", _QKVOL + [("m", (2, 1, 3, 5), "i1")], scale=0.5, softcap=0.0,
         kind="tensor", window=0), {})]


def _subsets(names):
    return [list(c) for r in range(1, len(names) + 1) for c in itertools.combinations(names, r)]


PARAMS = [pytest.param(name, i, id=f"{name}-{i}")
          for name in sorted(BATCH_RULES) for i in range(len(CASES.get(name, [None])))]


# ---------------------------------------------------------------- tests

def test_every_op_has_a_batching_rule():
    missing = sorted(set(OPS) - set(BATCH_RULES) - {"rlx.constant"})
    assert not missing, f"no batching rule for {missing}"


def test_every_rule_has_a_case():
    assert not sorted(set(BATCH_RULES) - set(CASES)), "add a case builder to CASES"


@pytest.mark.parametrize("name,i", PARAMS)
def test_op_against_loop(name, i):
    build, gens = CASES[name][i]
    mod = _module(build)
    names = [a.name for a in M.signature(M.get_func(mod))]
    assert any(op.name == name for op in M.get_func(mod).body.block.ops)
    for sub in _subsets(names):
        check_vmap(mod, sub, gens)


def test_rlx_parity_sum_of_squares():
    f = rlxc.Func("f", lambda s: (lambda x: (x * x).sum())(s.input("x", (3,))))
    g = f.vmap(["x"], 2)
    (out,) = g.run_on("interp", x=np.array([[1, 2, 3], [4, 5, 6]], np.float32))
    np.testing.assert_array_equal(out, [14, 77])


def test_func_vmap_run_on_interp():
    def build(s):
        x = s.input("x", (3,))
        w = s.param("w", (3, 2))
        return (x @ w).tanh()
    w = np.arange(6, dtype=np.float32).reshape(3, 2) / 10
    f = rlxc.Func("f", build).with_param("w", w)
    x = np.array([[1, 2, 3], [0, -1, 0.5]], np.float32)
    (out,) = f.vmap(["x"], 2).run_on("interp", x=x)
    np.testing.assert_allclose(out, np.tanh(x @ w), rtol=1e-6)
    assert f.vmap("x", 2).param_names() == ["w"]
    assert f.vmap("x", 2).param_binding("w") is not None  # params carried over


def _mlp(s, sizes=(20, 16, 16, 5), rows=8):
    x = s.input("x", (rows, sizes[0]))
    y = s.input("y", (rows,), "i32")
    h = x
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        h = h @ s.param(f"w{i}", (a, b)) + s.param(f"b{i}", (b,))
        if i < len(sizes) - 2:
            h = h.relu()
    return h.cross_entropy(y)


MLP_GENS = {"y": _ints(5)}


def _mlp_gens():
    g = dict(MLP_GENS)
    for n in ("w0", "w1", "w2"):
        g[n] = lambda rng, shp: (rng.normal(size=shp) / np.sqrt(shp[0])).astype(np.float32)
    return g


@pytest.mark.parametrize("batched", [["x", "y"], ["x"], ["y"]])
def test_mlp_cross_entropy(batched):
    mod = _module(_mlp, "mlp")
    vm = check_vmap(mod, batched, _mlp_gens(), batch_size=4)
    cleaned = cleanup(vm.clone())
    cleaned.verify()
    if batched != ["y"]:
        # a batched lhs against the (unbatched 2-D) weights stays one large matmul per layer
        mms = [op for op in M.get_func(cleaned).body.block.ops if op.name == "rlx.matmul"]
        assert len(mms) == 3
        assert all(len(shape_of(op.operands[0])) == 2 and len(shape_of(op.operands[1])) == 2
                   for op in mms)
        assert [shape_of(op.operands[0])[0] for op in mms] == [32, 32, 32]


def test_params_are_shared_not_copied():
    vm = cleanup(vmap_module(_module(_mlp, "mlp"), ["x", "y"], 4))
    f = M.get_func(vm)
    for a, v in zip(M.signature(f), f.args):
        if a.kind != "param":
            continue
        assert a.shape == shape_of(v)
        for use in v.uses:
            # a weight feeds a matmul directly; a bias is only ever viewed by broadcast_to
            assert use.operation.name in ("rlx.matmul", "rlx.broadcast_to"), use.operation.name


def test_unbatched_output_is_broadcast_and_shared_input_stays():
    def build(s):
        x, z = s.input("x", (3,)), s.input("z", (2,))
        return x.exp(), z * 2.0
    mod = _module(build)
    vm = check_vmap(mod, ["x"])
    f = M.get_func(vm)
    assert shape_of(f.args[1]) == (2,)
    assert [shape_of(v) for v in M.outputs(f)] == [(B, 3), (B, 2)]


def test_vmap_of_vmap():
    def build(s):
        x = s.input("x", (3,))
        w = s.param("w", (3, 2))
        return ((x @ w).softmax() * x.sum()).sum(), x.max()
    mod = _module(build)
    inner = vmap_module(mod, ["x"], 4)
    outer = vmap_module(inner, ["x"], 2)
    outer.verify()
    rng = np.random.default_rng(1)
    xs = rng.normal(size=(2, 4, 3)).astype(np.float32)
    w = rng.normal(size=(3, 2)).astype(np.float32)
    got = interpret(outer, [xs, w])
    for i in range(2):
        for j in range(4):
            want = interpret(mod, [xs[i, j], w])
            for g, wv in zip(got, want):
                np.testing.assert_allclose(g[i, j], wv, rtol=1e-5, atol=1e-6)
    # and through the oracle, on the cleaned-up inner module
    check_vmap(cleanup(inner.clone()), ["x"], batch_size=2)


def test_vmap_of_value_and_grad_gives_per_example_gradients():
    pytest.importorskip("rlxc.dialect.autodiff")
    f = rlxc.Func("mlp", _mlp)
    vg = f.value_and_grad_all()
    check_vmap(vg.module, ["x", "y"], _mlp_gens(), batch_size=3, rtol=1e-4, atol=1e-5)


def test_errors():
    mod = _module(lambda s: s.input("x", (3,)) * s.param("w", (3,)) + s.input("z", (3,)))
    with pytest.raises(ValueError, match="vmap: params are shared, not batched: 'w'"):
        vmap_module(mod, ["w"], 2)
    with pytest.raises(KeyError, match=r"unknown input 'q'.*\['x', 'z'\]"):
        vmap_module(mod, ["q"], 2)
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
            vmap_module(mod, ["x"], bad)
    check_vmap(mod, ["x"], batch_size=1)


def test_missing_rule_fails_at_transform_time(monkeypatch):
    monkeypatch.delitem(BATCH_RULES, "rlx.exp")
    mod = _module(lambda s: s.input("x", (3,)).exp())
    with pytest.raises(NotImplementedError, match=r"no batching rule for rlx\.exp"):
        vmap_module(mod, ["x"], 2)
    vmap_module(mod, [], 2)  # an unbatched exp is only copied: no rule needed


def test_vmap_pass_through_pipeline():
    from rlxc.dialect.passes import run_pipeline

    mod = _module(lambda s: (s.input("x", (3,)) * 2.0).sum())
    out = run_pipeline(mod, "rlx-vmap{batched=x size=4},cleanup")
    assert shape_of(M.get_func(out).args[0]) == (4, 3)
    assert shape_of(M.get_func(mod).args[0]) == (3,)  # run_pipeline works on a clone
    (r,) = interpret(out, [np.ones((4, 3), np.float32)])
    np.testing.assert_array_equal(r, [6, 6, 6, 6])

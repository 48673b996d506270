"""One native library per dynamic Func (issue 14): lowering/cpu/dynsizes.py, rlxc/dynone.py.

The graphs of test_dynamic_native.py (MLP, softmax cross-entropy, layer_norm, a reshape
chain; plain, value_and_grad_all, hvp, vmap) all take the one-library path: checked
here, with the interpreter at sizes 1, 2, 7, 64, 1000 through that one library, no
second compile and no new disk-cache entry at a new size, the workspace grown only
when the size grows, the per-call size checks, and the fallback of a graph that is not
size-generic (a product of two symbols), which still runs per size."""
import os

import numpy as np
import pytest

import rlxc
from rlxc.dynone import FALLBACKS, one_library
from rlxc.registry import backend
from rlxc.runtime.errors import ShapeError

from test_dynamic_native import GRAPHS, SIZES, TRANSFORMS, _close, _func, _inputs

CASES = [(g, t) for g in GRAPHS for t in TRANSFORMS]


@pytest.mark.parametrize("graph, transform", CASES)
def test_one_library_serves_every_size(graph, transform):
    f = _func(graph, transform)
    ex = one_library(f, backend("cpu"))
    assert ex is not None, FALLBACKS.get(f.ir_hash())
    for B in SIZES if transform != "vmap" else (1, 7, 64):
        x = _inputs(f, B)
        _close(ex.run(f.bind_call((), x)), f.run_on("interp", **x), f"{graph}/{transform} B={B}")


def _files(d):
    return sorted(os.path.join(r, n) for r, _, ns in os.walk(d) for n in ns) \
        if os.path.isdir(d) else []


def test_new_size_no_compile_no_cache_entry(monkeypatch, tmp_path):
    import rlxc.lowering.cpu.driver as driver
    import rlxc.lowering.cpu.dynsizes as dynsizes

    import rlxc.dynone as dynone

    monkeypatch.setattr(dynone, "_libs", {})   # compile afresh in this test
    monkeypatch.setenv("RLXC_CACHE_DIR", str(tmp_path))   # (the one library is disk-cached)
    f = _func("softmax_ce", "grad")
    calls = []
    real_dyn, real_static = dynsizes.compile_dynamic, driver.compile_cpu
    monkeypatch.setattr(dynsizes, "compile_dynamic",
                        lambda *a, **k: calls.append("dyn") or real_dyn(*a, **k))
    monkeypatch.setattr(driver, "compile_cpu",
                        lambda *a, **k: calls.append("static") or real_static(*a, **k))
    j = f.jit_on("cpu")
    x = _inputs(f, 8)
    _close(j.run(**x), f.run_on("interp", **x), "B=8")
    assert calls == ["dyn"]
    cache = os.environ.get("RLXC_CACHE_DIR", "")
    before = _files(cache)
    for B in (3, 9, 130):
        x = _inputs(f, B)
        _close(j.run(**x), f.run_on("interp", **x), f"B={B}")
        _close(f.run_on("cpu", **x), f.run_on("interp", **x), f"run B={B}")
    assert calls == ["dyn"], "a new size compiled something"
    assert _files(cache) == before, "a new size wrote to the compile cache"


@pytest.mark.parametrize("k", [3, 64, 784])
@pytest.mark.parametrize("transform", ["plain", "grad"])
def test_full_reduction_over_a_dynamic_batch_is_one_library(k, transform):
    """A dynamic batch's MSE: the full mean over (B, k) has B * k elements, which the
    sampled sizes put on both sides of the f64-block and split thresholds (k = 3: 3063
    and 6009 elements around reduce.BLOCK; k = 784: 49 or 50 chunks): a reduced symbol
    now takes one vectorized loop at every size (reduce.py, Builder.symbol_sizes)."""
    f = rlxc.Func(f"mse{k}", lambda s: ((s.input("x", ("B", k)) - s.input("t", ("B", k)))
                                        ** 2).mean())
    if transform == "grad":
        f = f.value_and_grad(["x"])
    ex = one_library(f, backend("cpu"))
    assert ex is not None, FALLBACKS.get(f.ir_hash())
    r = np.random.default_rng(k)
    for B in (1, 7, 1000, 5003):
        x = {n: r.standard_normal((B, k)).astype(np.float32) for n in ("x", "t")}
        want = f.run_on("interp", **x)
        got = ex.run(f.bind_call((), x))
        np.testing.assert_allclose(got[0], np.mean((x["x"] - x["t"]).astype(np.float64) ** 2),
                                   rtol=2e-5)
        _close(got, want, f"k={k} B={B}")


@pytest.mark.parametrize("draw", ["dropout", "uniform", "normal", "bernoulli"])
def test_random_draws_of_a_dynamic_shape_are_one_library(draw):
    """A draw of shape (B, 6): its counters are rlx.iota, which the size-generic lowering
    now computes (loops.IndexValue) instead of reading an arange constant of the call's
    size, whose data differed between the sampled sizes (a per-size fallback, and rlxc
    compile asked for --sizes).  The bits equal the per-size program's."""
    import rlxc.random as R

    def build(s):
        x, key = s.input("x", ("B", 6)), s.input("key", (2,), "u32")
        return {"dropout": lambda: x.dropout(0.3, key),
                "uniform": lambda: R.uniform(key, x.shape) + x,
                "normal": lambda: R.normal(key, x.shape) + x,
                "bernoulli": lambda: R.bernoulli(key, 0.3, x.shape).where(x, 0.0)}[draw]()

    f = rlxc.Func(f"dyn_{draw}", build)
    ex = one_library(f, backend("cpu"))
    assert ex is not None, FALLBACKS.get(f.ir_hash())
    key = np.array([5, 9], np.uint32)
    for B in (1, 7, 1000):
        x = np.random.default_rng(B).random((B, 6)).astype(np.float32)
        (got,) = ex.run(f.bind_call((), {"x": x, "key": key}))
        (per_size,) = f.specialize(B=B).run_on("cpu", x=x, key=key)
        np.testing.assert_array_equal(got, per_size)
        np.testing.assert_allclose(got, f.run_on("interp", x=x, key=key)[0], rtol=1e-6,
                                   atol=1e-6)


def test_workspace_grows_only_with_the_size():
    from rlxc.runtime.dyncpu import DynExecutor

    f = _func("mlp", "grad")
    ex = DynExecutor(one_library(f, backend("cpu")).lib)   # a fresh workspace
    ex.run(f.bind_call((), _inputs(f, 64)))
    ws = ex._local.ws
    assert ws.size >= ex.lib.workspace_size({"B": 64}) > ex.lib.workspace_size({"B": 7})
    ex.run(f.bind_call((), _inputs(f, 7)))
    assert ex._local.ws is ws                  # smaller: reused
    ex.run(f.bind_call((), _inputs(f, 1000)))
    assert ex._local.ws is not ws and ex._local.ws.size >= ex.lib.workspace_size({"B": 1000})


def test_size_checks_on_the_one_library():
    f = _func("softmax_ce", "plain")
    assert one_library(f, backend("cpu")) is not None
    x = _inputs(f, 4)
    with pytest.raises(ShapeError, match="dimension 'B' is 4 from input 'x' but 3"):
        f.run_on("cpu", x=x["x"], y=x["y"][:3])
    with pytest.raises(ValueError, match="dimension 'B' is 0"):
        f.run_on("cpu", x=x["x"][:0], y=x["y"][:0])


def _two_symbols(s):
    x = s.input("x", ("B", "S", 4))
    return (x * s.param("w", (4,))).tanh().sum(1)


def test_product_of_symbols_falls_back_per_size():
    f = rlxc.Func("two_symbols", _two_symbols).init_randn(seed=1, stddev=0.5)
    assert one_library(f, backend("cpu")) is None
    assert "DynamicSizeError" in FALLBACKS[f.ir_hash()]
    r = np.random.default_rng(0)
    for B, S in ((2, 3), (5, 1)):
        x = r.normal(size=(B, S, 4)).astype(np.float32)
        _close(f.run_on("cpu", x=x), f.run_on("interp", x=x), f"B={B} S={S}")


def test_unexpected_lowering_error_warns_and_falls_back(monkeypatch, tmp_path):
    """A bug in the size-generic lowering (anything but DynamicSizeError) still gets
    per-size programs, but with a SizeGenericFallbackWarning naming the Func and the
    error: a silent fallback hid the tiles' abs(SymInt) TypeError once."""
    import warnings

    import rlxc.lowering.cpu.dynsizes as dynsizes
    from rlxc.dynone import SizeGenericFallbackWarning

    def broken(*a, **k):
        raise TypeError("bad operand type for abs(): 'SymInt'")
    monkeypatch.setattr(dynsizes, "compile_dynamic", broken)
    monkeypatch.setenv("RLXC_CACHE_DIR", str(tmp_path))
    f = rlxc.Func("lowering_bug", lambda s: (s.input("x", ("B", 4)) * 2.0).tanh())
    with warnings.catch_warnings():
        warnings.simplefilter("always", SizeGenericFallbackWarning)   # not the suite's error
        with pytest.warns(SizeGenericFallbackWarning,
                          match=r"lowering_bug: the size-generic CPU lowering failed "
                                r"\(TypeError: bad operand type for abs"):
            assert one_library(f, backend("cpu")) is None
    assert FALLBACKS[f.ir_hash()].startswith("TypeError")
    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    _close(f.run_on("cpu", x=x), [np.tanh(2 * x)], "per-size fallback")


def test_control_flow_and_huge_splats_in_the_sampled_programs():
    """Two refusals the warning above brought out (they fell back without a word): control
    flow is refused as a DynamicSizeError (regions.py lowers it per static program), and
    a splat constant at a large sampled size is read as its one element, not expanded (a
    64 GiB np.full broke attention masks' samples)."""
    import rlxc as r
    from rlxc.dialect.fold import _splat_attr
    from rlxc.dialect.types import splat_element, tensor_type

    def scan(s):
        c, ys = r.scan(lambda c, x: (c + x, c * x), s.input("h", ("B", 3)) * 0.0,
                       s.input("xs", (4, "B", 3)))
        return c.sum() + ys.sum()
    f = rlxc.Func("scan_dyn", scan)
    assert one_library(f, backend("cpu")) is None
    assert "DynamicSizeError: control flow" in FALLBACKS[f.ir_hash()]   # or Refused: (cached)
    xs = np.arange(24, dtype=np.float32).reshape(4, 2, 3)
    _close(f.run_on("cpu", h=np.zeros((2, 3), np.float32), xs=xs),
           f.run_on("interp", h=np.zeros((2, 3), np.float32), xs=xs), "scan per size")
    attr = _splat_attr(-2.5, tensor_type((2003, 2, 2074, 2074)))
    assert splat_element(attr) == np.float32(-2.5)


def test_trainer_steps_any_batch_on_the_one_library(monkeypatch):
    import rlxc.lowering.cpu.driver as driver

    from test_dynamic_dims import _data, _mlp

    f = _mlp("B")
    tr = f.trainer(rlxc.optim.SGD(0.1), device="cpu")
    ref, opt = f, rlxc.optim.SGD(0.1)
    for i, B in enumerate((8, 3, 8, 5)):
        x, y = _data(B)
        lt = tr.step({"x": x, "y": y})
        if i == 0:   # the step's engine is the one library: later sizes compile nothing
            from rlxc.runtime.dyncpu import DynExecutor

            assert isinstance(tr._engine.ex, DynExecutor)
            monkeypatch.setattr(driver, "compile_cpu", lambda *a, **k: pytest.fail("compiled"))
        s, want = ref.specialize(B=B).train_step(opt, {"x": x, "y": y}, device="interp")
        ref = f.with_params(s.params())
        np.testing.assert_allclose(lt, want, rtol=1e-5)


def test_call_path_checks_each_shape_once(monkeypatch):
    """bench_dynamic W3 (issue 14): the per-call Python work of the one library was ~100 us
    over the static Jitted's (bind_call, then bind_sizes, spec dicts and size evaluation on
    every call).  Now `SizedJitted.run(**inputs)` skips bind_call for ndarrays of the right
    dtype, and the executor checks a set of shapes once (DynExecutor._plan); every check
    still runs on a new set of shapes, and a wrong dtype or a list still converts."""
    import rlxc.runtime.dyncpu as dyncpu

    f = _func("softmax_ce", "plain")
    j = f.jit_on("cpu")
    assert j._one is not None
    x = _inputs(f, 4)
    want = f.run_on("interp", **x)
    calls = []
    real = dyncpu.bind_sizes
    monkeypatch.setattr(dyncpu, "bind_sizes", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(type(f), "bind_call", lambda *a: pytest.fail("bind_call on the fast path"))
    for _ in range(3):
        _close(j.run(**x), want, "B=4")
    assert len(calls) == 1, "the shapes of a repeated call were checked again"
    monkeypatch.undo()
    with pytest.raises(ShapeError, match="dimension 'B' is 4 from input 'x' but 3"):
        j.run(x=x["x"], y=x["y"][:3])
    with pytest.raises(ValueError, match="dimension 'B' is 0"):
        j.run(x=x["x"][:0], y=x["y"][:0])
    with pytest.raises(ShapeError):
        j.run(x=x["x"][:, :-1], y=x["y"])          # a static dim of x differs
    _close(j.run(x=x["x"].astype(np.float64), y=x["y"].tolist()), want, "converted")
    _close(j.run(x=np.asfortranarray(x["x"]), y=x["y"]), want, "strided")


def test_bound_params_call_passes_only_the_inputs(monkeypatch):
    """A Jitted whose params are all bound (init_randn) calls the one library through a
    BoundCall (runtime/dyncpu.py): the params' ctypes table is built once and a call at
    known shapes re-checks only each input's dtype and layout (the ONNX CNN at batch 1
    spent ~5 us of ~15 on the params' identity check, the shape key over all 11 arrays
    and argtypes conversions).  Results at alternating sizes, and every check of the
    general path, stay as they were."""
    import rlxc.runtime.dyncpu as dyncpu

    f = _func("mlp", "plain")
    j = f.jit_on("cpu")
    assert j._bcall is not None
    xs = {B: _inputs(f, B) for B in (1, 3, 7)}
    want = {B: f.run_on("interp", **x) for B, x in xs.items()}
    for B in (1, 3, 7):
        _close(j.run(**xs[B]), want[B], f"B={B} first")
    general = []
    real = dyncpu.DynExecutor.run
    monkeypatch.setattr(dyncpu.DynExecutor, "run", lambda *a: general.append(1) or real(*a))
    for B in (1, 7, 3, 1):
        _close(j.run(**xs[B]), want[B], f"B={B} again")
    assert not general, "a call at known shapes left the bound path"
    x = xs[3]["x"]
    _close(j.run(x=np.asfortranarray(x)), want[3], "strided input")
    assert general, "a strided input must take the general path (it converts)"
    with pytest.raises(ShapeError):
        j.run(x=x[:, :-1])
    # the table holds the bound arrays' addresses: they cannot change under it
    p = j._fast[2][[a.kind for a in f.signature()].index("param")]
    assert not p.flags.writeable

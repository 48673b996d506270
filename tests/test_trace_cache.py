"""The light trace (dialect/trace.py) and the warm start it allows.

`Func(name, build)` records a trace without building IR; `trace_hash()` names
the IR before it exists.  A Trainer keys its compiled step by that hash, so a
warm process (disk cache filled) loads the step without importing xDSL or
llvmlite, and without tracing the step or running value_and_grad/cleanup.
Anything that changes the step IR (model, optimizer structure, clipping,
quantization, wrt, params' shapes) must miss; the lr and a schedule do not
change the IR (they travel in the scalar vector) and must hit.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import rlxc.backends as B
import rlxc.train as T
from rlxc import Func, LrSchedule
from rlxc.optim import SGD, Adam
from rlxc.runtime.errors import ShapeError

# -- the trace ---------------------------------------------------------------------


def _mlp(width=5, scale=2.0, name="tm", act="relu"):
    def build(s):
        x = s.input("x", (4, 3))
        h = getattr(x.linear(s.param("w", (3, width)), s.param("b", (width,))), act)()
        h = h * scale
        return h.linear(s.param("v", (width, 2))).cross_entropy(s.input("y", (4,), "i32"))
    return Func(name, build)


def test_trace_hash_follows_the_ir():
    a, b = _mlp(), _mlp()
    assert a.trace_hash() == b.trace_hash()
    assert a.trace_hash().startswith("trace:")
    others = [_mlp(width=6), _mlp(scale=3.0), _mlp(name="tm2"), _mlp(act="tanh")]
    hashes = {f.trace_hash() for f in others}
    assert len(hashes) == len(others) and a.trace_hash() not in hashes
    # the same trace gives the same module; different traces different modules
    assert a.mlir() == b.mlir()
    assert all(f.mlir() != a.mlir() for f in others)


def test_trace_hash_covers_params_and_constants():
    def f(const, dtype="f32", axes=(1,)):
        def build(s):
            x = s.input("x", (2, 3), dtype)
            return (x + np.asarray(const)).sum(axes)  # the array adopts x's dtype
        return Func("c", build)
    base = f([1.0, 2.0, 3.0])
    assert base.trace_hash() == f([1.0, 2.0, 3.0]).trace_hash()
    for other in (f([1.0, 2.0, 4.0]), f([1.0, 2.0, 3.0], "f64"), f([1.0, 2.0, 3.0], axes=(0,)),
                  f([-0.0, 2.0, 3.0])):
        assert other.trace_hash() != base.trace_hash()


def test_derived_funcs_share_the_trace_and_the_module():
    f = _mlp()
    g = f.with_param("w", np.ones((3, 5), np.float32))
    assert g.trace_hash() == f.trace_hash()
    assert g.module is f.module
    # a transform's result is keyed by its IR text
    vg = f.value_and_grad(["w"])
    assert vg.trace_hash() == vg.ir_hash()


def test_from_mlir_round_trip_of_a_trace():
    f = _mlp()
    g = Func.from_mlir(f.mlir())
    assert g.mlir() == f.mlir() and g.ir_hash() == f.ir_hash()
    assert g.signature() == f.signature()
    assert g.output_shapes() == f.output_shapes() == [()]
    assert g.output_count() == f.output_count() == 1


def test_trace_errors_stay_at_trace_time():
    with pytest.raises(ShapeError, match=r"matmul: \(4, 3\) @ \(4, 2\): inner dimensions"):
        Func("bad", lambda s: s.input("x", (4, 3)) @ s.input("w", (4, 2)))
    with pytest.raises(TypeError, match="unknown dtype 'f16'"):
        Func("bad", lambda s: s.input("x", (3,)) + s.scalar(1.0, "f16"))


def test_tensors_never_cross_traces():
    """A Tensor of one traced function used in another raises (its value number would
    otherwise name some unrelated value of the other trace), for every way in."""
    from rlxc import concat, where
    from rlxc.dialect import module as M

    cap = {}

    def first(s):
        x = s.input("x", (3,))
        cap["t"], cap["i"], cap["c"], cap["s"] = x.exp(), s.input("i", (2,), "i32"), x.gt(0.0), s
        return cap["t"]
    f = Func("first", first)
    h = Func("h", lambda s: s.input("x", (3,)).log())
    cases = {
        "concat": lambda s, y: concat([y, cap["t"]]),
        "binary": lambda s, y: y + cap["t"],
        "gather": lambda s, y: y.gather(cap["i"]),
        "where": lambda s, y: where(cap["c"], y, y),
        "call": lambda s, y: s.call(h, {"x": cap["t"]})[0],
    }
    for what, body in cases.items():
        with pytest.raises(ValueError, match="another|different scopes"):
            Func("bad", lambda s, body=body: body(s, s.input("y", (3,))))
    # a finished trace takes no more ops or arguments
    with pytest.raises(RuntimeError, match="already built"):
        cap["s"].input("late", (3,))
    with pytest.raises(RuntimeError, match="already built"):
        cap["t"].exp()
    assert [a.name for a in f.signature()] == ["x", "i"] and "late" not in f.mlir()
    # the callee is inlined as it is when called, whatever later happens to it
    m = Func("g", lambda s: s.input("x", (3,)) * 2.0).module.clone()
    k = Func("k", lambda s: s.call(m, {"x": s.input("x", (3,))})[0])
    M.get_func(m).body.block.ops.first.detach()   # no longer a valid function
    np.testing.assert_allclose(k.run(x=np.ones(3, np.float32))[0], [2.0, 2.0, 2.0])


def test_op_parameters_and_constants_are_exact_at_trace_time():
    with pytest.raises(ValueError, match="64 bits"):
        Func("bad", lambda s: s.input("x", (3,)).fake_quant((2 ** 70, 2, 1.0)))
    # [0, -0] is not a splat: the sign of each zero survives into the constant
    f = Func("z", lambda s: 1.0 / (s.input("x", (2,)) * s.constant(np.array([0.0, -0.0]))))
    for dev in ("interp", "cpu"):
        assert list(f.run_on(dev, x=np.ones(2, np.float32))[0]) == [np.inf, -np.inf]


SCRIPT_TRACE = textwrap.dedent("""
    import json, sys
    import numpy as np
    import rlxc
    f = rlxc.Func("t", lambda s: (s.input("x", (3,)) * 2.0).exp().sum() + s.param("w", ()))
    f = f.with_param("w", 1.0)
    before = {"hash": f.trace_hash(), "sig": [a.name for a in f.signature()],
              "outs": f.output_shapes(), "xdsl": "xdsl" in sys.modules}
    text = f.mlir()
    print(json.dumps({**before, "after": "xdsl" in sys.modules, "text": "rlx.exp" in text}))
""")


def test_tracing_imports_no_xdsl():
    p = subprocess.run([sys.executable, "-c", SCRIPT_TRACE], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert not r["xdsl"] and r["sig"] == ["x", "w"] and r["outs"] == [[]]
    assert r["after"] and r["text"]  # the module is built on first use


# -- the step cache (the warm process itself: tests/test_trainer_cache.py) -----------


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("RLXC_CACHE_DIR", str(d))
    B.clear_memory_cache()
    yield d
    B.clear_memory_cache()


def _data():
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
    return {"x": x, "y": np.array([0, 1, 1, 0], np.int32)}


def _losses(f, make_opt, device, **kw):
    tr = f.init_randn(1, 0.3).trainer(make_opt(), device=device, **kw)
    return [tr.step(_data()) for _ in range(3)], tr


@pytest.mark.parametrize("change, compiles", [
    ("same", 0),
    ("lr", 0),
    ("schedule", 0),
    ("width", 1),
    ("momentum", 1),
    ("adam", 1),
    ("clip", 1),
    ("quant", 1),
    ("wrt", 1),
])
def test_step_cache_hits_and_misses(cache, monkeypatch, change, compiles):
    base = dict(make_opt=lambda: SGD(0.1), f=_mlp())
    _losses(base["f"], base["make_opt"], "cpu")  # fills the cache
    kw, f, make_opt = {}, base["f"], base["make_opt"]
    if change == "lr":
        make_opt = lambda: SGD(0.05)  # noqa: E731
    elif change == "schedule":
        kw["schedule"] = LrSchedule.step(0.1, step_size=1, gamma=0.5)
    elif change == "width":
        f = _mlp(width=6)
    elif change == "momentum":
        make_opt = lambda: SGD(0.1, momentum=0.9)  # noqa: E731
    elif change == "adam":
        make_opt = lambda: Adam(0.01)  # noqa: E731
    elif change == "clip":
        kw["max_grad_norm"] = 0.5
    elif change == "quant":
        kw["quant"] = "f8e4m3"
    elif change == "wrt":
        kw["wrt"] = ["w", "v"]
    B.clear_memory_cache()
    monkeypatch.setattr(T, "_CACHE", {})  # as in a new process: no step program in memory
    before = B.STATS["compiles"]
    got, tr = _losses(f, make_opt, "cpu", **kw)
    assert B.STATS["compiles"] - before == compiles
    assert (tr._prog._func is not None) == bool(compiles)  # a hit builds no step graph
    want, _ = _losses(f, make_opt, "interp", **kw)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)

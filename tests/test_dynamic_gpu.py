"""One GPU program for every size of a dynamic Func (issue 14): lowering/gpu/dynplan.py,
runtime/dyncuda.py, rlxc/dyncuda.py.

No GPU is needed: the `emu_cuda` fixture makes the process's CUDA driver the emulator
(lowering/gpu/emu.EmuDriver), so `run_on("cuda")` / `jit_on("cuda")` take the real path
(the hook in rlxc/dynone.py, the size-generic build, the per-call launch plan) with the
kernels compiled for the host.  The graphs of test_dynamic_native.py run against the
interpreter at sizes 1, 2, 7, 64 (and 200 for one); a new size compiles nothing and
writes no cache entry; grids are computed per call; the size-generic PTX assembles
with ptxas for sm_90 when one is found."""
import os

import numpy as np
import pytest

import rlxc
from rlxc.runtime.errors import ShapeError

from test_dynamic_native import GRAPHS, TRANSFORMS, _close, _func, _inputs

GPU_SIZES = (1, 2, 7, 64)
FAST = {"plain", "grad"}
CASES = [pytest.param(g, t, marks=() if t in FAST else pytest.mark.slow)
         for g in GRAPHS for t in TRANSFORMS]


@pytest.fixture
def emu_cuda(monkeypatch):
    """The emulator as this process's CUDA driver (restored afterwards)."""
    import rlxc.dyncuda as dyncuda
    from rlxc.lowering.gpu.emu import EmuDriver
    from rlxc.runtime import cuda as rt

    drv = EmuDriver()
    monkeypatch.setattr(rt, "_state", {"probed": True, "driver": drv})
    monkeypatch.setattr(rt, "_contexts", {})
    monkeypatch.setattr(dyncuda, "_progs", {})
    return drv


@pytest.mark.parametrize("graph, transform", CASES)
def test_gpu_one_program_serves_every_size(emu_cuda, graph, transform):
    from rlxc.dynone import fallback_reason

    f = _func(graph, transform)
    for B in GPU_SIZES if transform != "vmap" else (1, 7, 64):
        x = _inputs(f, B)
        _close(f.run_on("cuda", **x), f.run_on("interp", **x), f"{graph}/{transform} B={B}")
    assert fallback_reason(f) is None
    assert {c[0] for c in emu_cuda.calls}, "no kernel ran on the (emulated) GPU"


def _files(d):
    return sorted(os.path.join(r, n) for r, _, ns in os.walk(d) for n in ns) \
        if os.path.isdir(d) else []


def test_gpu_new_size_compiles_nothing_and_grids_follow_the_size(emu_cuda):
    import rlxc.backends as backends
    import rlxc.dyncuda as dyncuda

    f = _func("mlp", "grad")
    before_static = backends.STATS["compiles"]
    built = dyncuda.STATS["compiles"] + dyncuda.STATS["disk_hits"]
    j = f.jit_on("cuda")
    x = _inputs(f, 8)
    _close(j.run(**x), f.run_on("interp", **x), "B=8")
    assert dyncuda.STATS["compiles"] + dyncuda.STATS["disk_hits"] == built + 1
    n = dyncuda.STATS["compiles"]
    prog = j._one.program
    cache = os.environ.get("RLXC_CACHE_DIR", "")
    files = _files(cache)
    grids = {}
    for B in (3, 200, 9, 5):
        emu_cuda.calls.clear()
        allocs = prog.allocations
        x = _inputs(f, B)
        _close(j.run(**x), f.run_on("interp", **x), f"B={B}")
        grids[B] = [c[1] for c in emu_cuda.calls]
        if B != 200:   # no larger than a size seen before: the regions are reused
            assert prog.allocations == allocs, f"B={B} reallocated device memory"
    assert dyncuda.STATS["compiles"] == n, "a new size compiled a GPU program"
    assert backends.STATS["compiles"] == before_static, "a per-size program was compiled"
    assert _files(cache) == files, "a new size wrote to the compile cache"
    assert grids[200] != grids[3], "launch grids must follow the sizes"
    # the first matmul's row tiles: ceil(B / 64) blocks along y
    assert grids[200][0][1] == 4 and grids[3][0][1] == 1
    # another process (a fresh memory cache): the disk entry serves, at a new size too
    dyncuda._progs.clear()
    hits = dyncuda.STATS["disk_hits"]
    x = _inputs(f, 11)
    _close(f.run_on("cuda", **x), f.run_on("interp", **x), "B=11 from the disk cache")
    assert dyncuda.STATS["disk_hits"] == hits + 1 and dyncuda.STATS["compiles"] == n
    assert _files(cache) == files


def test_gpu_reduction_strategy_is_chosen_once(emu_cuda):
    """A sum over 2*B elements crosses the warp/block threshold between the samples:
    the strategy of the first sample serves every size (no fallback)."""
    from rlxc.dynone import fallback_reason

    f = rlxc.Func("wide", lambda s: (s.input("x", ("B", 2)) * 2.0).sum())
    for B in (1, 3, 1500):
        x = {"x": np.random.default_rng(B).normal(size=(B, 2)).astype(np.float32)}
        _close(f.run_on("cuda", **x), f.run_on("interp", **x), f"B={B}")
    assert fallback_reason(f) is None


def test_gpu_size_checks(emu_cuda):
    f = rlxc.Func("two", lambda s: s.input("x", ("B", 3)) + s.input("y", ("B", 3)))
    a, b = np.ones((4, 3), np.float32), np.ones((2, 3), np.float32)
    with pytest.raises(ShapeError, match="dimension 'B' is 4 from input 'x' but 2"):
        f.run_on("cuda", x=a, y=b)
    with pytest.raises(ValueError, match="'B'"):
        f.run_on("cuda", x=a[:0], y=a[:0])
    np.testing.assert_allclose(f.run_on("cuda", x=a, y=a)[0], 2 * a)


def test_gpu_not_size_generic_records_why(emu_cuda):
    from rlxc.dynamic import SizedExecutor, executor_for
    from rlxc.dynone import fallback_reason
    from rlxc.registry import backend

    two = rlxc.Func("two_symbols", lambda s: (s.input("x", ("B", "S", 4)) *
                                              s.param("w", (4,))).tanh().sum(1))
    two = two.init_randn(seed=1, stddev=0.5)
    assert isinstance(executor_for(backend("cuda"), two), SizedExecutor)
    assert "DynamicSizeError" in fallback_reason(two)

    def loop(s):
        x = s.input("x", ("B", 4))
        c, _ = rlxc.scan(lambda c, r: (c + r, None), x.sum(0) * 0, x)
        return c
    g = rlxc.Func("loop", loop)
    assert isinstance(executor_for(backend("cuda"), g), SizedExecutor)
    assert "control flow" in fallback_reason(g)


def test_gpu_dynamic_ptx_assembles():
    from rlxc.lowering.gpu import nvptx
    from rlxc.lowering.gpu.dynplan import compile_dynamic_cuda

    ptxas = nvptx.find_ptxas()
    f = _func("softmax_ce", "grad")
    meta, blobs = compile_dynamic_cuda(f.module, "softmax_ce_grad", ptxas=ptxas or False)
    ptx = blobs["ptx"].decode()
    assert ".target sm_90" in ptx and meta["dims"] == ["B"]
    launches = [s for s in meta["steps"] if s["op"] == "launch"]
    # every kernel takes the size B as its last (i64) parameter
    for s in launches:
        head = ptx[ptx.index(f".entry {s['kernel']}("):]
        head = head[:head.index(")")]
        assert head.rstrip().splitlines()[-1].strip().startswith(".param .u64 ") and \
            ".ptr" not in head.rstrip().splitlines()[-1]
    if ptxas is None:
        pytest.skip("no ptxas found: PTX emitted, not assembled")
    assert blobs.get("cubin"), "ptxas did not produce a cubin"
    assert all(meta["kernels"][s["kernel"]].get("spill_stores", 0) == 0 for s in launches)


def test_gpu_buffer_plan_is_a_size_function():
    """Offsets, sizes and region ends are evaluated per call: at every size each buffer
    lies inside its region and starts 16-byte aligned (the widest vector access)."""
    from rlxc.lowering.gpu.dynplan import compile_dynamic_cuda
    from rlxc.runtime.dyncpu import size_of

    meta, _ = compile_dynamic_cuda(_func("softmax_ce", "hvp").module, "ce", target="host")
    assert any(not isinstance(b["nbytes"], int) for b in meta["buffers"])
    for B in (1, 2, 7, 64, 1000):
        env = {"B": B}
        for b in meta["buffers"]:
            off, n = size_of(b["offset"], env), size_of(b["nbytes"], env)
            end = max(size_of(e, env) for e in meta["regions"][b["region"]])
            assert off % 16 == 0 and 0 <= off and off + n <= end, (B, b)


def test_gpu_batched_matmul_dynamic_batch_and_label_check(emu_cuda):
    def bmm(s):
        a, b = s.input("a", ("B", 5, 6)), s.input("b", ("B", 6, 3))
        y = s.input("y", ("B",), "i32")
        z = a.matmul(b).sum(1)
        return z.cross_entropy(y), z
    f = rlxc.Func("bmm", bmm)
    r = np.random.default_rng(0)
    for B in (1, 7, 70):
        x = {"a": r.normal(size=(B, 5, 6)).astype(np.float32),
             "b": r.normal(size=(B, 6, 3)).astype(np.float32),
             "y": (np.arange(B) % 3).astype(np.int32)}
        _close(f.run_on("cuda", **x), f.run_on("interp", **x), f"B={B}")
    from rlxc.dynone import fallback_reason

    assert fallback_reason(f) is None
    x["y"][3] = 3
    with pytest.raises(IndexError, match="out of range"):
        f.run_on("cuda", **x)


def test_gpu_trainer_steps_any_batch_on_one_program(emu_cuda, monkeypatch):
    """Trainer(device="cuda") with a dynamic batch: the last partial batch compiles
    nothing (the step's executor is the one size-generic program)."""
    import rlxc.dyncuda as dyncuda
    import rlxc.lowering.gpu.driver as gpu_driver

    from test_dynamic_dims import _data, _mlp

    f = _mlp("B")
    tr = f.trainer(rlxc.optim.SGD(0.1), device="cuda")
    ref, opt = f, rlxc.optim.SGD(0.1)
    for i, B in enumerate((8, 3, 8, 5)):
        x, y = _data(B)
        lt = tr.step({"x": x, "y": y})
        if i == 0:
            assert isinstance(tr._engine.ex, dyncuda.DynCudaExecutor)
            monkeypatch.setattr(gpu_driver, "compile_cuda",
                                lambda *a, **k: pytest.fail("compiled"))
            monkeypatch.setattr(dyncuda, "cached_build", lambda *a, **k: pytest.fail("built"))
        s, want = ref.specialize(B=B).train_step(opt, {"x": x, "y": y}, device="interp")
        ref = f.with_params(s.params())
        np.testing.assert_allclose(lt, want, rtol=1e-4)   # each loss reflects every update

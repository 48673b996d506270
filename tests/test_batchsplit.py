"""Batch split of dynamic CPU programs (lowering/cpu/batchsplit.py, batchsplit_entry.py).

The decision: graphs that are row-local along their batch symbol are split (an MLP, a
layer_norm/softmax/argmax/cumsum-over-features model, the ONNX digits CNN, an embedding
lookup); graphs that mix rows are not, each with its reason (a mean over the batch,
softmax over axis 0, a cross-entropy mean loss, a transpose or reshape moving the batch
axis, a gather along it, random draws, a value_and_grad program).  Then the compiled
library run split (one region, 3 threads, forced with set_batch_split(0)) against the
same library unsplit (set_batch_split(-1)) at N = 1, 2, 3, 7, 64, 65, with the thread
count the split used; the workspace bound for every team and chunk; RLXC_BATCH_SPLIT=0;
the ONNX CNN through the one-library path; an AOT library through its C ABI.
"""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import rlxc
from rlxc.lowering.cpu import batchsplit

HERE = os.path.dirname(os.path.abspath(__file__))
CNN = os.path.join(HERE, "fixtures", "onnx", "cnn.onnx")
SIZES = (1, 2, 3, 7, 64, 65)
THREADS = 3


# ---------------------------------------------------------------- graphs

def _mlp(s):
    x = s.input("x", ("N", 12))
    h = x.linear(s.param("w1", (12, 16)), s.param("b1", (16,))).gelu()
    return h.linear(s.param("w2", (16, 4)), s.param("b2", (4,))).softmax(-1)


def _norms(s):
    x = s.input("x", ("N", 5, 12))
    y = x.layer_norm(weight=s.param("g", (12,)), bias=s.param("b", (12,))).softmax(-1)
    z = (y @ s.param("w", (12, 8))).transpose(0, 2, 1).reshape("N", 40)
    return z.cumsum(1), y.argmax(2), y.max((1, 2))


def _embed(s):
    ids = s.input("ids", ("N", 3), "i32")
    e = s.param("table", (10, 6)).gather(ids, axis=0)      # (N, 3, 6)
    return (e.sum(1) * s.input("scale", (6,))).tanh()


def _mean_batch(s):
    x = s.input("x", ("N", 4))
    return x - x.mean(0)


def _softmax_axis0(s):
    return s.input("x", ("N", 4)).softmax(0)


def _ce_loss(s):
    z = s.input("x", ("N", 4)) @ s.param("w", (4, 3))
    return z.cross_entropy(s.input("y", ("N",), "i32"))


def _transpose_n(s):
    return s.input("x", ("N", 4)).transpose(1, 0) * 2.0


def _reshape_n(s):
    return s.input("x", ("N", 4)).reshape(2, "N", 2) + 1.0


def _gather_rows(s):
    x = s.input("x", ("N", 4))
    return x.gather(np.array([0, 0, 1], np.int32), axis=0)


SEPARABLE = {"mlp": _mlp, "norms": _norms, "embed": _embed}
MIXING = {"mean over the batch": (_mean_batch, "reduces the batch axis"),
          "softmax over axis 0": (_softmax_axis0, "reduces the batch axis"),
          "cross-entropy loss": (_ce_loss, "reduces the batch axis"),
          "transpose moving N": (_transpose_n, "off axis 0"),
          "reshape moving N": (_reshape_n, "does not keep the batch axis whole"),
          "gather along axis 0": (_gather_rows, "gathers along the batch axis")}


def _func(fn, name):
    return rlxc.Func(name, fn).init_randn(seed=3, stddev=0.4)


def _inputs(f, n, seed=0):
    r = np.random.default_rng(seed + n)
    out = {}
    for a in f.signature():
        if a.kind != "input":
            continue
        shape = tuple(n if isinstance(d, str) else d for d in a.shape)
        out[a.name] = r.integers(0, 4 if a.name == "y" else 10, size=shape).astype(np.int32) \
            if a.dtype == "i32" else r.normal(size=shape).astype(np.float32)
    return out


# ---------------------------------------------------------------- the decision

@pytest.mark.parametrize("name", list(SEPARABLE))
def test_row_local_graphs_are_separable(name):
    d = batchsplit.decide(_func(SEPARABLE[name], name).module)
    assert d.symbol == "N", d.reason


def test_onnx_cnn_is_separable():
    pytest.importorskip("onnx")
    d = batchsplit.decide(rlxc.from_onnx(CNN).module)
    assert d.symbol == "batch" and d.inputs == [(1, 8, 8)] and d.outputs == [(10,)], d


@pytest.mark.parametrize("kind", list(MIXING))
def test_graphs_mixing_rows_are_not_split(kind):
    fn, why = MIXING[kind]
    d = batchsplit.decide(_func(fn, "mix").module)
    assert d.symbol is None and why in d.reason, d.reason


def test_random_draws_and_grad_programs_are_not_split():
    def noisy(s):
        x = s.input("x", ("N", 4))
        return x + rlxc.random.uniform(s.input("key", (2,), "u32"), x.shape)

    d = batchsplit.decide(_func(noisy, "noisy").module)
    assert d.symbol is None and ("rlx.philox" in d.reason or "rlx.iota" in d.reason), d
    g = _func(_mlp, "mlp").value_and_grad_all()
    d = batchsplit.decide(g.module)
    assert d.symbol is None and "batch axis N away" in d.reason, d.reason


def test_workspace_bound_covers_every_team_and_chunk():
    """T slices of the body's workspace at ceil(N / T) rows fit in split_ends at N, for
    every team T <= tcap (the entry's per-thread layout)."""
    from rlxc.lowering.cpu.dynsizes import lower_dynamic, module_symbols
    from rlxc.lowering.cpu.symint import evaluate

    f = _func(_norms, "norms")
    p = lower_dynamic(f.module, module_symbols(f.module), "norms", max_threads=4)
    assert p.batch_split.symbol == "N" and p.split_threads == 4
    body = p.body_workspace_ends
    assert len(p.workspace_ends) == 2 * len(body)
    for n in list(range(1, 70)) + [1000, 4097]:
        total = max(evaluate(e, {"N": n}) for e in p.workspace_ends)
        for t in range(2, 5):
            c = -(-n // t)
            slice_ = max(evaluate(e, {"N": c}) for e in body)
            assert t * ((slice_ + 63) // 64 * 64) <= total, (n, t)


# ---------------------------------------------------------------- compiled: split vs unsplit

@pytest.fixture
def threads3(monkeypatch, tmp_path):
    import rlxc.dynone as dynone

    monkeypatch.setattr(dynone, "_libs", {})
    monkeypatch.setenv("RLXC_MAX_THREADS", str(THREADS))   # libraries compiled for 3 threads
    monkeypatch.setenv("RLXC_ADAPTIVE_THREADS", "0")        # every call uses all 3
    monkeypatch.delenv("RLXC_BATCH_SPLIT", raising=False)


def _split_vs_unsplit(f, exact: bool):
    j = f.jit()
    j.set_num_threads(THREADS)
    lib = j._one.lib
    assert lib.meta["batch_split"]["symbol"] is not None, lib.meta["batch_split"]
    for n in SIZES:
        x = _inputs(f, n)
        assert lib.set_batch_split(-1)
        want = j.run(**x)
        assert lib.last_split() == 0
        lib.set_batch_split(0)
        got = j.run(**x)
        assert lib.last_split() == min(THREADS, n // 2 if n >= 4 else 0), n
        for g, w in zip(got, want):
            if exact:
                np.testing.assert_array_equal(g, w, err_msg=f"N={n}")
            else:
                # a chunk's matmul has fewer rows than the whole batch's, so it may take
                # another sgemm path (AVX2: another row remainder) with another summation
                # order: ~1 ulp of the terms, which a cumsum over 40 of them adds up
                np.testing.assert_allclose(g, w, rtol=1e-6, atol=2e-6, err_msg=f"N={n}")
    return j


@pytest.mark.parametrize("name", ["mlp", "norms", "embed"])
def test_split_matches_unsplit(threads3, name):
    f = _func(SEPARABLE[name], name)
    j = _split_vs_unsplit(f, exact=False)
    x = _inputs(f, 65)
    for g, w in zip(j.run(**x), f.run_on("interp", **x)):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5)


def test_onnx_cnn_split_is_bitwise_unsplit(threads3):
    pytest.importorskip("onnx")
    from rlxc.dynone import fallback_reason

    f = rlxc.from_onnx(CNN)
    _split_vs_unsplit(f, exact=True)
    assert fallback_reason(f) is None   # the one-library path (it fell back per size)
    ref = np.load(os.path.join(HERE, "fixtures", "onnx", "cnn_ref.npz"))
    for b in ("b2", "b5"):   # torch's outputs, exported beside the model
        out = f.jit().run(x=ref[f"{b}/x"].astype(np.float32))[0]
        np.testing.assert_allclose(out, ref[f"{b}/y"], rtol=1e-4, atol=1e-5)


def test_default_threshold_and_env_switch(threads3, monkeypatch):
    f = _func(_mlp, "mlp_env")
    j = f.jit()
    j.set_num_threads(THREADS)
    lib = j._one.lib
    j.run(**_inputs(f, 4))
    assert lib.last_split() == 0          # far below the default work threshold
    j.run(**_inputs(f, 4096))
    assert lib.last_split() == THREADS    # 4096 rows of an MLP: one region, 3 chunks
    monkeypatch.setenv("RLXC_BATCH_SPLIT", "0")
    from rlxc.runtime.dyncpu import DynLibrary

    off = DynLibrary(lib.path, lib.meta)
    from rlxc.runtime.dyncpu import DynExecutor

    ex = DynExecutor(off)
    off.set_num_threads(THREADS)
    x = _inputs(f, 4096)
    args = f.bind_call((), x, "t")
    got = ex.run(args)
    assert off.last_split() == 0
    np.testing.assert_allclose(got[0], j.run(**x)[0], rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------- AOT: the C ABI

SHIM_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
int omp_in_parallel(void);
static long calls, nested;
typedef void (*par_fn)(void (*)(void *), void *, unsigned, unsigned);
void GOMP_parallel(void (*fn)(void *), void *data, unsigned n, unsigned flags)
{
    static par_fn real;
    if (!real)
        real = (par_fn)dlsym(RTLD_NEXT, "GOMP_parallel");
    if (omp_in_parallel())
        __atomic_add_fetch(&nested, 1, __ATOMIC_RELAXED);
    else
        __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    real(fn, data, n, flags);
}
long shim_calls(void) { return calls; }
long shim_nested(void) { return nested; }
void shim_reset(void) { calls = nested = 0; }
"""

AOT_PY = """
import ctypes, sys
import numpy as np
shim = ctypes.CDLL(sys.argv[2])
lib = ctypes.CDLL(sys.argv[1])
lib.cnnsplit_create.restype = ctypes.c_void_p
lib.cnnsplit_set_dims.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
lib.cnnsplit_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
lib.cnnsplit_set_num_threads.argtypes = [ctypes.c_int]
ctx = lib.cnnsplit_create()
for n in (64, 65, 7, 1):
    x = np.random.default_rng(n).normal(size=(n, 1, 8, 8)).astype(np.float32)
    ys = []
    for t in (3, 1):
        lib.cnnsplit_set_num_threads(t)
        assert lib.cnnsplit_set_dims(ctx, (ctypes.c_int64 * 1)(n)) == 0
        y = np.zeros((n, 10), np.float32)
        ins, o = (ctypes.c_void_p * 1)(x.ctypes.data), (ctypes.c_void_p * 1)(y.ctypes.data)
        assert lib.cnnsplit_run(ctx, ins, o) == 0      # warm: pins the team once
        shim.shim_reset()
        assert lib.cnnsplit_run(ctx, ins, o) == 0
        print(n, t, shim.shim_calls(), shim.shim_nested())
        ys.append(y)
    assert np.array_equal(ys[0], ys[1]), n
"""


def shim_env(tmp_path, threads: int):
    """(path of the compiled SHIM_C, the environment that preloads it) for a child process
    whose GOMP_parallel calls are counted, nested teams allowed, at most `threads` threads.
    No pinning: a re-pin (when the scheduler moves the caller onto a worker's CPU between two
    calls, pinning.py) is one more GOMP_parallel, so the count would depend on the scheduler
    (seen once in a full run: 2 regions instead of 1)."""
    (tmp_path / "shim.c").write_text(SHIM_C)
    shim = str(tmp_path / "shim.so")
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", str(tmp_path / "shim.c"), "-o", shim,
                    "-ldl", "-lgomp"], check=True)
    return shim, {**os.environ, "LD_PRELOAD": shim, "OMP_MAX_ACTIVE_LEVELS": "4",
                  "RLXC_MAX_THREADS": str(threads), "RLXC_PIN_THREADS": "0"}


def test_aot_library_splits_through_the_c_abi(tmp_path):
    """`rlxc compile`'s library of the dynamic ONNX CNN through its C ABI, in a fresh
    process with GOMP_parallel counted by an LD_PRELOAD shim and nested teams allowed
    (OMP_MAX_ACTIVE_LEVELS=4): at 64 and 65 rows on 3 threads a call is ONE region
    (one GOMP_parallel, none nested inside it: the body's loops run inline), on one
    thread none; the glue sized the workspace from the metadata's split bound; the
    outputs of both agree bitwise, and with the unsplit calls at 7 and 1 rows."""
    pytest.importorskip("onnx")
    from rlxc import export as aot

    f = rlxc.from_onnx(CNN, name="cnnsplit")
    aot.build_artifact(aot.spec_from_func(f, "cnnsplit", cpu="x86-64-v3"), str(tmp_path))
    shim, env = shim_env(tmp_path, 3)
    p = subprocess.run([sys.executable, "-c", AOT_PY, str(tmp_path / "libcnnsplit.so"), shim],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = {tuple(int(v) for v in line.split()[:2]): tuple(int(v) for v in line.split()[2:])
            for line in p.stdout.split("\n") if line}
    assert all(nested == 0 for _, nested in rows.values()), rows
    assert all(rows[n, 1] == (0, 0) for n in (64, 65, 7, 1)), rows
    if (os.cpu_count() or 1) >= 2:   # the library's team cap is the build machine's cores
        assert rows[64, 3] == (1, 0) and rows[65, 3] == (1, 0), rows


def test_executor_params_table_follows_the_arrays():
    """DynExecutor reuses the last call's params table while the same param arrays come
    back (bound params): a new array, a new dtype or an in-place change is still seen."""
    f = _func(_mlp, "mlp_params")
    ex = f.jit()._one
    sig = f.signature()
    x = _inputs(f, 5)["x"]
    params = {a.name: np.asarray(f.param_binding(a.name)) for a in sig if a.kind == "param"}

    def call(ps):
        return ex.run([x if a.kind == "input" else ps[a.name] for a in sig])[0]

    def call_interp(ps):
        g = rlxc.Func("mlp_params_ref", _mlp)
        return g.run_on("interp", x=x, **ps)[0]

    y0 = call(params)
    np.testing.assert_allclose(y0, call_interp(params), rtol=2e-4, atol=2e-5)
    assert ex._pcache is not None and ex._pcache[0][0] is params["w1"]
    params2 = dict(params, w1=params["w1"] * 2.0)          # a new array
    np.testing.assert_allclose(call(params2), call_interp(params2), rtol=2e-4, atol=2e-5)
    params2["w1"][:] = 0.5                                  # in place: same address
    np.testing.assert_allclose(call(params2), call_interp(params2), rtol=2e-4, atol=2e-5)
    params3 = dict(params2, b1=params2["b1"].astype(np.float64))   # converted per call
    np.testing.assert_allclose(call(params3), call_interp(params2), rtol=2e-4, atol=2e-5)

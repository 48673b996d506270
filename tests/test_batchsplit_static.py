"""Batch split of STATIC programs (lowering/cpu/batchsplit_static.py).

A static program whose leading input axis is row-local (batchsplit.decide_static: the
same rule table walked with the batch size) is compiled as the size-generic body with
the split entry, wrapped in the static ABI, plus the plain static program for unsplit
calls.  Checked: the decision (an MLP with bias broadcasts splits; a shared value that
spans the batch axis, a mean over the batch, a batch-1 or small program do not, each
with its reason in meta["batch_split"]); split vs unsplit (the plain program) at
several batch sizes, with the team the split used; the ONNX CNN with its batch fixed
by input_shapes= against onnxruntime; RLXC_BATCH_SPLIT=0; an AOT library through its
C ABI (one GOMP_parallel per call on 3 threads, none nested).
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import rlxc
from rlxc.lowering.cpu import batchsplit

from test_batchsplit import shim_env

HERE = os.path.dirname(os.path.abspath(__file__))
CNN = os.path.join(HERE, "fixtures", "onnx", "cnn.onnx")
THREADS = 3


def _mlp(n):
    def fn(s):
        x = s.input("x", (n, 96))
        h = x.linear(s.param("w1", (96, 384)), s.param("b1", (384,))).gelu()
        return h.linear(s.param("w2", (384, 16)), s.param("b2", (16,))).softmax(-1)
    return fn


def _func(fn, name):
    return rlxc.Func(name, fn).init_randn(seed=5, stddev=0.3)


@pytest.fixture
def threads3(monkeypatch):
    import rlxc.backends as backends

    monkeypatch.setattr(backends, "_libs", {})   # loaded afresh: governor off (below)
    monkeypatch.setenv("RLXC_MAX_THREADS", str(THREADS))   # libraries compiled for 3 threads
    monkeypatch.setenv("RLXC_ADAPTIVE_THREADS", "0")        # every call uses all 3
    monkeypatch.delenv("RLXC_BATCH_SPLIT", raising=False)


# ---------------------------------------------------------------- the decision

def test_static_mlp_is_separable_with_its_bias_broadcasts():
    d = batchsplit.decide_static(_func(_mlp(64), "mlp").module)
    assert d.reason == "" and d.rows == 64 and d.inputs == [(96,)] and d.outputs == [(16,)]


def _shared_spans(s):
    return s.input("x", (8, 8)) + s.param("p", (8, 8))     # p varies along the rows


def _mean_rows(s):
    x = s.input("x", (8, 4))
    return x - x.mean(0)


def _bias_also_shared(s):
    """A broadcast lined up with the rows (x + b), so b @ w is per row: its sum mixes."""
    x = s.input("x", (8, 4))
    b = s.param("b", (4,)).broadcast_to((8, 4))
    return x + b, (b @ s.param("w", (4, 8))).sum(0)


def _bias_shared_first(s):
    """A broadcast first used as a shared (8, 4) value, then lined up with the rows."""
    x = s.input("x", (8, 4))
    b = s.param("b", (4,)).broadcast_to((8, 4))
    e = b.exp()
    return (x + b) * e


@pytest.mark.parametrize("fn,why", [
    (_shared_spans, "shared but spans the batch axis"),
    (_mean_rows, "reduces the batch axis 8 away"),
    (_bias_also_shared, "reduces the batch axis 8 away"),
    (_bias_shared_first, "shared but spans the batch axis"),
])
def test_static_graphs_mixing_rows_are_refused(fn, why):
    d = batchsplit.decide_static(_func(fn, "mix").module)
    assert d.reason and why in d.reason, d.reason


def test_batch_1_and_small_programs_stay_plain(threads3):
    for n, why in ((1, "split threshold"), (64, "under the split threshold")):
        fn = _mlp(n) if n == 1 else (lambda s: s.input("x", (64, 4)).tanh())
        j = _func(fn, f"plain{n}").jit()
        assert j.lib.meta["batch_split"]["symbol"] is None
        assert why in j.lib.meta["batch_split"]["reason"], j.lib.meta["batch_split"]
        assert not j.lib.set_batch_split(0)


# ---------------------------------------------------------------- compiled

def _check_split(j, x: dict, team: int):
    lib = j.lib
    assert lib.meta["batch_split"]["symbol"] == "rows", lib.meta["batch_split"]
    assert lib.set_batch_split(-1)
    want = j.run(**x)
    assert lib.last_split() == 0
    lib.set_batch_split(0)
    got = j.run(**x)
    assert lib.last_split() == team
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    return got


@pytest.mark.parametrize("n", [16, 65])
def test_static_split_matches_plain_program(threads3, n):
    f = _func(_mlp(n), f"smlp{n}")
    j = f.jit()
    j.set_num_threads(THREADS)
    x = {"x": np.random.default_rng(n).normal(size=(n, 96)).astype(np.float32)}
    got = _check_split(j, x, min(THREADS, n // 2))
    for g, w in zip(got, f.run_on("interp", **x)):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5)
    j.set_num_threads(1)                     # one thread: the plain program, unsplit
    j.run(**x)
    assert j.lib.last_split() == 0


def test_static_onnx_cnn_splits_and_matches_onnxruntime(threads3, monkeypatch):
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    x = np.random.default_rng(3).normal(size=(64, 1, 8, 8)).astype(np.float32)
    j = rlxc.from_onnx(CNN, input_shapes={"x": x.shape}).jit()
    j.set_num_threads(THREADS)
    got = _check_split(j, {"x": x}, THREADS)[0]
    sess = ort.InferenceSession(CNN, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got, sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
    from rlxc.runtime.cpu import CpuLibrary

    monkeypatch.setenv("RLXC_BATCH_SPLIT", "0")
    off = CpuLibrary(j.lib.path, j.lib.meta)
    from rlxc.runtime.cpu import CpuExecutor

    ex = CpuExecutor(off)
    off.set_num_threads(THREADS)
    out = ex.run([x] + [np.asarray(j.func.param_binding(a.name)) for a in j.func.signature()
                        if a.kind == "param"])
    assert off.last_split() == 0
    np.testing.assert_allclose(out[0], got, rtol=1e-5, atol=1e-6)


AOT_PY = """
import ctypes, sys
import numpy as np
shim = ctypes.CDLL(sys.argv[2])
lib = ctypes.CDLL(sys.argv[1])
lib.cnnstatic_create.restype = ctypes.c_void_p
lib.cnnstatic_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
lib.cnnstatic_set_num_threads.argtypes = [ctypes.c_int]
ctx = lib.cnnstatic_create()
x = np.random.default_rng(1).normal(size=(64, 1, 8, 8)).astype(np.float32)
ys = []
for t in (3, 1):
    lib.cnnstatic_set_num_threads(t)
    y = np.zeros((64, 10), np.float32)
    ins, o = (ctypes.c_void_p * 1)(x.ctypes.data), (ctypes.c_void_p * 1)(y.ctypes.data)
    assert lib.cnnstatic_run(ctx, ins, o) == 0      # warm: pins the team once
    shim.shim_reset()
    assert lib.cnnstatic_run(ctx, ins, o) == 0
    print(t, shim.shim_calls(), shim.shim_nested())
    ys.append(y)
np.save(sys.argv[3], np.stack(ys))
"""


def test_static_aot_library_splits_through_the_c_abi(tmp_path, monkeypatch):
    """`rlxc compile`'s library of the static ONNX CNN (batch 64) in a fresh process with
    GOMP_parallel counted by an LD_PRELOAD shim: on 3 threads a call is ONE region and
    nothing nested in it; on one thread the plain program; the outputs agree (and with
    onnxruntime when present)."""
    pytest.importorskip("onnx")
    from rlxc import export as aot

    monkeypatch.setenv("RLXC_MAX_THREADS", str(THREADS))
    f = rlxc.from_onnx(CNN, name="cnnstatic", input_shapes={"x": (64, 1, 8, 8)})
    aot.build_artifact(aot.spec_from_func(f, "cnnstatic", cpu="x86-64-v3"), str(tmp_path))
    shim, env = shim_env(tmp_path, THREADS)
    out = str(tmp_path / "y.npy")
    p = subprocess.run([sys.executable, "-c", AOT_PY, str(tmp_path / "libcnnstatic.so"), shim,
                        out], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = {int(line.split()[0]): tuple(int(v) for v in line.split()[1:])
            for line in p.stdout.split("\n") if line}
    assert rows[3] == (1, 0), rows          # one region, the body's loops inline
    assert rows[1][1] == 0, rows
    ys = np.load(out)
    np.testing.assert_allclose(ys[0], ys[1], rtol=1e-5, atol=1e-6)
    ort = pytest.importorskip("onnxruntime")
    x = np.random.default_rng(1).normal(size=(64, 1, 8, 8)).astype(np.float32)
    sess = ort.InferenceSession(CNN, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(ys[0], sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("n", [64, 256])
def test_small_batch_mlp_keeps_its_matmul_chain(threads3, n):
    """An MLP forward whose work is its matmul chain: at <= CHAIN_ROWS rows the chain is
    kept (one team per GEMM step, the bound weights prepacked; faster than the split at
    batch 32-128), above it the split decides as before.  Both agree with NumPy."""
    from rlxc.lowering.cpu.batchsplit_static import CHAIN_ROWS

    sizes = (256, 320, 256, 10)

    def fn(s):
        h = s.input("x", (n, sizes[0]))
        for i in range(3):
            h = h.linear(s.param(f"w{i}", sizes[i:i + 2]), s.param(f"b{i}", (sizes[i + 1],)))
            if i < 2:
                h = h.relu()
        return h
    f = _func(fn, f"chainmlp{n}")
    j = f.jit()
    split = j.lib.meta["batch_split"]
    if n <= CHAIN_ROWS:
        assert split["symbol"] is None and "matmul chains" in split["reason"], split
        assert j.lib.prepack and j._caller._packed is not None
    else:   # not kept for its chain (this one also has no size-generic body to split)
        assert "matmul chains" not in split["reason"], split
    x = np.random.default_rng(n).normal(size=(n, sizes[0])).astype(np.float32)
    p = f.params()
    h = x.astype(np.float64)
    for i in range(3):
        h = h @ p[f"w{i}"] + p[f"b{i}"]
        h = np.maximum(h, 0) if i < 2 else h
    np.testing.assert_allclose(j.run(x=x)[0], h, rtol=2e-4, atol=2e-3)

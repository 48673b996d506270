"""rlxc.distributed and the split train step in one process (no mpiexec).

A communicator of size 1 must train exactly like the fused single-process
Trainer; shard() splits unevenly like numpy.array_split; the grads program's
scale gives the batch-size-weighted average of uneven shards."""
import numpy as np
import pytest

import rlxc
from rlxc import optim
from rlxc.distributed import Comm, init, shard, shard_bounds

mpi4py = pytest.importorskip("mpi4py")


def mlp(batch, seed=1):
    def build(s):
        x = s.input("x", (batch, 6))
        y = s.input("y", (batch, 3))
        h = x.linear(s.param("w1", (6, 8)), s.param("b1", (8,))).relu()
        return h.linear(s.param("w2", (8, 3)), s.param("b2", (3,))).mse(y)

    return rlxc.Func("dmlp", build).init_randn(seed=seed, stddev=0.4)


def batches(n, steps=4, seed=0):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((n, 6)).astype(np.float32),
             "y": rng.standard_normal((n, 3)).astype(np.float32)} for _ in range(steps)]


class FakeComm:
    def __init__(self, rank, size):
        self.rank, self.size = rank, size


def test_init_gives_a_size_one_comm():
    c = init()
    assert isinstance(c, Comm) and (c.rank, c.size) == (0, 1)
    c.barrier()
    buf = np.arange(5, dtype=np.float32)
    assert c.allreduce_sum_(buf) is buf and np.array_equal(buf, np.arange(5))
    assert init(c) is c
    with pytest.raises(TypeError, match="mpi4py communicator"):
        init("world")
    with pytest.raises(TypeError, match="float32"):
        c.allreduce_sum_(np.zeros(3))


def test_shard_splits_unevenly_and_covers_the_batch():
    a = np.arange(10 * 2).reshape(10, 2)
    parts = [shard(a, FakeComm(r, 3)) for r in range(3)]
    assert [p.shape[0] for p in parts] == [4, 3, 3]
    assert np.array_equal(np.concatenate(parts), a)
    assert all(p.flags.c_contiguous for p in parts)
    cols = [shard(a.T, FakeComm(r, 3), axis=1) for r in range(3)]
    assert np.array_equal(np.concatenate(cols, axis=1), a.T)
    assert [shard_bounds(7, 2, r) for r in range(2)] == [(0, 4), (4, 7)]
    with pytest.raises(ValueError, match="at least one"):
        shard(np.zeros(2), FakeComm(0, 3))
    with pytest.raises(ValueError, match="axis 2"):
        shard(a, FakeComm(0, 2), axis=2)


@pytest.mark.parametrize("device", ["cpu", "interp"])
@pytest.mark.parametrize("make,clip,quant", [
    (lambda: optim.SGD(0.1), 0.0, None),
    (lambda: optim.Adam(0.01), 0.3, None),
    (lambda: optim.AdamW(0.01, weight_decay=0.1), 0.0, "fp8_e4m3"),
    (lambda: optim.SGD(0.05), 0.0, lambda name, a: np.round(a * 8) / 8),
])
def test_size_one_comm_trains_like_the_fused_trainer(device, make, clip, quant):
    """Split step (grads, allreduce of size 1, apply) == fused step: clipping, QAT."""
    comm = init()
    a = mlp(16).trainer(make(), max_grad_norm=clip, quant=quant, device=device)
    b = mlp(16).trainer(make(), max_grad_norm=clip, quant=quant, device=device, comm=comm)
    for inp in batches(16):
        la, lb = a.step(inp), b.step(inp)
        assert abs(la - lb) <= 1e-6 * max(1.0, abs(la))
    pa, pb = a.func.params(), b.func.params()
    for k in pa:
        np.testing.assert_allclose(pb[k], pa[k], rtol=0, atol=1e-6, err_msg=k)
    assert b.step_count == a.step_count == 4
    sa, sb = a.state_dict(), b.state_dict()
    assert sorted(sa) == sorted(sb)


def test_uneven_shards_weighted_average_equals_whole_batch():
    """grads(shard of 5, scale 5/12) + grads(shard of 7, scale 7/12) == grads(12)."""
    from rlxc.train_split import split_programs

    opt = optim.SGD(0.1)
    whole = mlp(12)
    data = batches(12, 1)[0]
    params = whole.params()
    names = whole.param_names()

    def run(n, lo, scale):
        f = mlp(n)
        g, _ = split_programs(f, opt, device="cpu")
        ex = g.executor("cpu")
        ins = [data["x"][lo:lo + n], data["y"][lo:lo + n], np.array([scale], np.float32)]
        loss, flat = ex.run(ins + [params[k] for k in names])
        return float(np.asarray(loss).reshape(())), np.asarray(flat)

    l_all, g_all = run(12, 0, 1.0)
    l_a, g_a = run(5, 0, 5 / 12)
    l_b, g_b = run(7, 5, 7 / 12)
    np.testing.assert_allclose(g_a + g_b, g_all, rtol=1e-5, atol=1e-6)
    assert abs((l_a + l_b) - l_all) < 1e-5
    # the unweighted mean of the two shards' means is not the whole batch's
    assert not np.allclose((g_a / (5 / 12) + g_b / (7 / 12)) / 2, g_all, rtol=1e-5, atol=1e-6)


def test_distributed_trainer_checks_and_saves(tmp_path):
    comm = init()
    with pytest.raises(TypeError, match="rlxc.distributed.Comm"):
        mlp(8).trainer(optim.SGD(0.1), comm=object())
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        mlp(8).trainer(optim.SGD(0.1), comm=comm, batch_size=0)
    tr = mlp(8).trainer(optim.Adam(0.01), comm=comm)
    assert tr.batch_sizes == [8]
    for inp in batches(8, 2):
        tr.step(inp)
    path = tmp_path / "p.safetensors"
    tr.save_params(path)
    back = mlp(8).load_params(path)
    for k, v in tr.func.params().items():
        assert np.array_equal(back.params()[k], v)
    ck = tmp_path / "t.safetensors"
    tr.save(ck)
    tr2 = mlp(8, seed=9).trainer(optim.Adam(0.01), comm=comm)
    tr2.load(ck)
    assert tr2.step_count == 2
    inp = batches(8, 1, seed=5)[0]
    assert tr2.step(inp) == tr.step(inp)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.safetensors", "t.safetensors"]


def test_one_in_place_allreduce_per_step_on_the_engine_buffer():
    """Each step reduces exactly once, in place, on the buffer the compiled grads call
    writes and the compiled apply call reads (no copy in between)."""
    from rlxc.runtime.call import data_address

    comm = init()
    seen = []
    real = comm.allreduce_sum_

    def spy(buf):
        seen.append((data_address(buf), buf.size, buf.dtype))
        return real(buf)

    tr = mlp(8).trainer(optim.SGD(0.1), comm=comm, device="cpu")
    eng = tr._engine
    comm.allreduce_sum_ = spy
    try:
        for inp in batches(8, 3):
            tr.step(inp)
    finally:
        del comm.allreduce_sum_
    n = sum(v.size for v in tr.func.params().values())
    assert seen == [(data_address(eng.flat), n + 1, np.float32)] * 3
    g0 = eng._gf[0]
    assert g0.outs[1] == data_address(eng.flat) and g0.outs[0] == data_address(eng.flat) + 4 * n
    assert all(fa.ins[len(eng.aprog.slot_args) + 1] == data_address(eng.flat)
               for fa in eng._af)


class MpiCallLog:
    """Stands in for Comm.mpi (an mpi4py communicator): forwards every method and logs
    (name, args, kwargs), so a test sees each MPI call a step makes, pickle-based
    lowercase ones (allreduce, bcast, allgather) and barriers included."""

    def __init__(self, real):
        self._real, self.calls = real, []

    def __getattr__(self, name):
        attr = getattr(self._real, name)
        if not callable(attr):
            return attr

        def logged(*args, **kw):
            self.calls.append((name, args, kw))
            return attr(*args, **kw)
        return logged


@pytest.mark.parametrize("opt_name", ["sgd", "adamclip"])
def test_a_step_makes_one_mpi_call_an_in_place_sum_allreduce(opt_name):
    """Issue 18: the whole MPI traffic of a distributed step is ONE in-place
    MPI_Allreduce(SUM) of the engine's flat buffer: no barrier, no broadcast, no
    pickled lowercase collective (e.g. to reduce the loss or the clip norm)."""
    from mpi4py import MPI

    from rlxc.runtime.call import data_address

    comm = init()
    opt = optim.SGD(0.1) if opt_name == "sgd" else optim.Adam(0.01)
    tr = mlp(8).trainer(opt, max_grad_norm=0.0 if opt_name == "sgd" else 0.05, comm=comm,
                        device="cpu")
    log = MpiCallLog(comm.mpi)
    comm.mpi = log
    try:
        losses = [tr.step(inp) for inp in batches(8, 3)]
    finally:
        comm.mpi = log._real
    assert [c[0] for c in log.calls] == ["Allreduce"] * 3, [c[0] for c in log.calls]
    for name, args, kw in log.calls:
        assert args[0] is MPI.IN_PLACE and data_address(args[1]) == data_address(
            tr._engine.flat) and args[1].size == tr._engine.flat.size
        assert kw.get("op", args[2] if len(args) > 2 else None) == MPI.SUM
    assert all(np.isfinite(losses))


def test_distributed_is_reachable_from_the_package():
    """`import rlxc; rlxc.distributed.init` works without importing the submodule first."""
    import subprocess
    import sys

    code = "import rlxc; print(callable(rlxc.distributed.init), callable(rlxc.distributed.shard))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.split() == ["True", "True"], out.stderr


_YIELD_PROBE = """
import os, sys
{pre}
from rlxc.distributed import init
c = init()
print("yield=" + os.environ.get("OMPI_MCA_mpi_yield_when_idle", "unset"))
"""


@pytest.mark.parametrize("pre,env,want", [
    ("", None, "1"),                       # init() asks Open MPI to yield while idle
    ("", "0", "0"),                        # mpiexec --mca mpi_yield_when_idle 0 / the user
    ("from mpi4py import MPI", None, "unset"),  # MPI already initialized: too late, untouched
])
def test_init_makes_waiting_ranks_yield_their_core(pre, env, want):
    """A rank waiting in the Allreduce yields (OMPI_MCA_mpi_yield_when_idle=1, set
    before MPI_Init) instead of spinning on a core other processes want (issue 18:
    the 2-rank step under load; rlxc/distributed.py docstring); a setting of the
    user or mpiexec is kept."""
    import os
    import subprocess
    import sys

    e = dict(os.environ)
    e.pop("OMPI_MCA_mpi_yield_when_idle", None)
    if env is not None:
        e["OMPI_MCA_mpi_yield_when_idle"] = env
    p = subprocess.run([sys.executable, "-c", _YIELD_PROBE.format(pre=pre)], env=e,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split()[-1] == f"yield={want}", p.stdout + p.stderr


def _mapping_of(addr: int) -> tuple[int, int, str]:
    """(start, end, VmFlags) of the mapping of this process that holds addr."""
    start = end = None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                start, end = (lo, hi) if lo <= addr < hi else (None, None)
            elif head == "VmFlags:" and start is not None:
                return start, end, line
    raise AssertionError(f"no mapping holds {addr:#x}")


def test_large_allreduce_buffer_is_on_huge_pages():
    """Issue 18: the Allreduce's CMA copies pin the peer's buffer page by page; a
    buffer of 2 MB or more is its own 2 MB-aligned mapping of whole huge pages,
    marked MADV_HUGEPAGE (VmFlags "hg"), zeroed after the advice; a small one is an
    ordinary 64-byte aligned array."""
    import mmap
    import sys

    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"):
        pytest.skip("transparent huge pages are a Linux feature")
    from rlxc.reduce_buffer import HUGE, AllreduceBuffer

    comm = init()
    n = 669_707  # the W4 MLP's [grads | loss]
    buf = comm.grad_buffer(n)
    assert isinstance(buf, AllreduceBuffer) and buf.local is buf.result
    a = buf.local
    assert a.dtype == np.float32 and a.shape == (n,) and a.flags.c_contiguous
    assert a.flags.writeable and not a.any()
    addr = a.ctypes.data
    assert addr % HUGE == 0
    lo, hi, flags = _mapping_of(addr)
    assert " hg" in flags, flags
    assert hi - addr >= -(-4 * n // HUGE) * HUGE  # whole huge pages under the buffer
    small = comm.grad_buffer(1000).local

    def owner(x):
        while getattr(x, "base", None) is not None:
            x = x.base
        return x
    # an ordinary array that owns its memory, not a mapping of its own (its heap pages
    # may still carry "hg": NumPy advises huge pages on its own large allocations,
    # which glibc can later serve from the heap that small arrays share)
    assert not isinstance(owner(a), np.ndarray)     # the large one: a view of its mapping
    assert small.ctypes.data % 64 == 0 and isinstance(owner(small), np.ndarray)
    comm.allreduce_sum_(a)   # MPI takes it like any float32 array


class _TwoBufferComm(Comm):
    """Size-1 comm whose grad_buffer has separate local and result arrays (like the
    shared-memory window): reduce() copies local into result, counting calls."""

    def grad_buffer(self, n):
        from rlxc.runtime.call import aligned_empty

        comm = self

        class Buf:
            kind = "test"
            local = aligned_empty((n,), np.float32)
            result = aligned_empty((n,), np.float32)

            def reduce(self):
                comm.allreduce_calls += 1
                self.result[...] = self.local
                return self.result

        b = Buf()
        b.local[:] = 0
        b.result[:] = np.nan  # apply must never read it before a reduce
        return b


@pytest.mark.parametrize("device", ["cpu", "interp"])
def test_engine_applies_the_reduced_buffer_not_the_local_one(device):
    """With separate local/result buffers (reduce="shm"), the grads call writes local,
    reduce() is called once per step, and the apply call and the returned loss read
    result: training equals the fused Trainer."""
    from mpi4py import MPI

    from rlxc.runtime.call import data_address

    comm = _TwoBufferComm(MPI.COMM_WORLD)
    a = mlp(16).trainer(optim.Adam(0.01), max_grad_norm=0.3, device=device)
    b = mlp(16).trainer(optim.Adam(0.01), max_grad_norm=0.3, device=device, comm=comm)
    for inp in batches(16):
        la, lb = a.step(inp), b.step(inp)
        assert abs(la - lb) <= 1e-6 * max(1.0, abs(la))
    assert comm.allreduce_calls == 4
    pa, pb = a.func.params(), b.func.params()
    for k in pa:
        np.testing.assert_allclose(pb[k], pa[k], rtol=0, atol=1e-6, err_msg=k)
    eng, buf = b._engine, b._gbuf
    assert eng.flat is buf.local and eng.reduced is buf.result
    if device == "cpu":
        assert eng._gf[0].outs[1] == data_address(buf.local)
        assert all(fa.ins[len(eng.aprog.slot_args) + 1] == data_address(buf.result)
                   for fa in eng._af)


def test_reduce_mode_is_checked():
    """init(reduce=...) and $RLXC_DDP_REDUCE accept auto|shm|allreduce; a size-1 comm
    reduces with the (trivial) Allreduce; SplitEngine checks the buffers it is given."""
    from rlxc.reduce_buffer import AllreduceBuffer
    from rlxc.split_engine import SplitEngine

    with pytest.raises(ValueError, match="reduce must be one of auto, shm, allreduce, got 'nccl'"):
        init(reduce="nccl")
    import os

    os.environ["RLXC_DDP_REDUCE"] = "bogus"
    try:
        with pytest.raises(ValueError, match="got 'bogus'"):
            init()
    finally:
        del os.environ["RLXC_DDP_REDUCE"]
    from mpi4py import MPI

    for mode in ("auto", "shm", "allreduce"):
        c = Comm(MPI.COMM_WORLD, mode)
        assert c.reduce_mode == "allreduce" and isinstance(c.grad_buffer(7), AllreduceBuffer)
    tr = mlp(4).trainer(optim.SGD(0.1), device="interp", comm=init())
    e = tr._engine
    with pytest.raises(ValueError, match=r"reduced must be a C-contiguous float32 array of shape \(84,\)"):
        SplitEngine("interp", e.gprog, e.aprog, tr.func.params(), {}, [], 1.0,
                    reduced=np.zeros(83, np.float32))


def test_shm_room_checks_the_backing_directory(tmp_path, monkeypatch):
    """reduce="auto" falls back to the Allreduce when the shared window would not fit."""
    from rlxc.reduce_buffer import shm_room

    assert shm_room(1, str(tmp_path)) and not shm_room(1 << 62, str(tmp_path))
    assert not shm_room(1, str(tmp_path / "missing"))
    monkeypatch.setenv("OMPI_MCA_osc_sm_backing_directory", str(tmp_path / "missing"))
    assert not shm_room(1)

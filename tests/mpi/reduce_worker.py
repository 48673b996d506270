"""Worker of tests/test_distributed_mpi.py for the gradient buffer (rlxc/reduce_buffer.py),
run under `mpiexec -n N`.

    python reduce_worker.py buffer     SharedBuffer sums == MPI_Allreduce sums, for sizes
                                       smaller and larger than N, twice per buffer
    python reduce_worker.py trainers   10 SGD / clipped-Adam steps with reduce="shm" and
                                       with reduce="allreduce": the params are equal
                                       (bitwise for 2 ranks: a sum of 2 floats has no
                                       order), and bitwise equal across ranks
    python reduce_worker.py default    init() without reduce= (and RLXC_DDP_REDUCE unset)
                                       reduces with MPI_Allreduce, not the shared
                                       window; RLXC_DDP_REDUCE=auto opts in to it
Any failed check raises, which aborts the job (non-zero exit).
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def same_on_all_ranks(comm, arrays) -> bool:
    blob = b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)
    return len(set(comm.allgather(blob))) == 1


def check_buffer():
    from rlxc.distributed import init
    from rlxc.reduce_buffer import AllreduceBuffer, SharedBuffer

    shm, ar = init(reduce="shm"), init(reduce="allreduce")
    assert shm.reduce_mode == "shm" and ar.reduce_mode == "allreduce"
    rng = np.random.default_rng(10 + shm.rank)
    for n in (1, shm.size - 1 or 1, 5, 17, 1000, 100_003):
        sb, ab = shm.grad_buffer(n), ar.grad_buffer(n)
        assert isinstance(sb, SharedBuffer) and isinstance(ab, AllreduceBuffer), (sb, ab)
        assert shm.grad_buffer(n) is sb  # one window per size, reused
        assert sb.local.ctypes.data % 64 == 0 and sb.result.ctypes.data % 64 == 0
        for trial in range(2):
            # integers: exact sums whatever the order; then fractions
            v = (rng.integers(-1000, 1000, n) if trial == 0
                 else rng.standard_normal(n)).astype(np.float32)
            sb.local[:] = v
            ab.local[:] = v
            got, want = sb.reduce().copy(), ab.reduce().copy()
            if trial == 0 or shm.size == 2:
                assert np.array_equal(got, want), (n, trial, got[:4], want[:4])
            else:
                np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
            assert same_on_all_ranks(shm, [got]), (n, trial)
            assert np.array_equal(sb.local, v)  # the reduction reads, never writes, local
    assert shm.allreduce_calls == 12


def check_trainers():
    import ddp_worker
    from rlxc.distributed import init, shard

    comms = {m: init(reduce=m) for m in ("allreduce", "shm")}
    world = comms["shm"]
    assert world.reduce_mode == "shm"
    data = ddp_worker.data(64, 10)
    n = shard(data[0][0], world).shape[0]
    for opt_name in ("sgd", "adamclip"):
        final = {}
        for mode, comm in comms.items():
            f = ddp_worker.mlp(n).init_randn(seed=0, stddev=0.3)
            opt, clip = ddp_worker.make_opt(opt_name)
            tr = f.trainer(opt, max_grad_norm=clip, comm=comm)
            assert tr._gbuf.kind == mode
            for x, y in data:
                tr.step({"x": shard(x, comm), "y": shard(y, comm)})
                ps = [v for _, v in sorted(tr.func.params().items())]
                assert same_on_all_ranks(comm, ps), (mode, opt_name)
            final[mode] = ps
        for a, b in zip(final["allreduce"], final["shm"]):
            if world.size == 2:
                assert np.array_equal(a, b), (opt_name, np.abs(a - b).max())
            else:
                np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)

def check_default():
    import ddp_worker
    from rlxc import optim
    from rlxc.distributed import init
    from rlxc.reduce_buffer import AllreduceBuffer

    assert "RLXC_DDP_REDUCE" not in os.environ
    comm = init()
    assert comm.reduce_mode == "allreduce", comm.reduce_mode
    tr = ddp_worker.mlp(4).init_randn(seed=0, stddev=0.3).trainer(optim.SGD(0.1), comm=comm)
    assert isinstance(tr._gbuf, AllreduceBuffer) and tr._gbuf.kind == "allreduce"
    calls = comm.allreduce_calls
    x, y = ddp_worker.data(4, 1)[0]
    tr.step({"x": x, "y": y})
    assert comm.allreduce_calls == calls + 1   # ONE Allreduce per step
    # ... and no other MPI call: every method of the mpi4py communicator is logged
    real, names = comm.mpi, []

    class Log:
        def __getattr__(self, name):
            attr = getattr(real, name)
            if not callable(attr):
                return attr
            return lambda *a, **k: (names.append(name), attr(*a, **k))[1]

    comm.mpi = Log()
    for x, y in ddp_worker.data(4, 3):
        tr.step({"x": x, "y": y})
    comm.mpi = real
    assert names == ["Allreduce"] * 3, names
    os.environ["RLXC_DDP_REDUCE"] = "auto"   # the opt-in, on one node: the window
    assert init().reduce_mode == "shm"


if __name__ == "__main__":
    {"buffer": check_buffer, "trainers": check_trainers,
     "default": check_default}[sys.argv[1]]()
    from mpi4py import MPI

    print(f"rank {MPI.COMM_WORLD.Get_rank()}: ok", flush=True)

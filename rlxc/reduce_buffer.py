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

Huge pages (AllreduceBuffer): on one node Open MPI moves the halves of the
buffer with CMA (process_vm_readv), and the kernel pins the peer's buffer page
by page for every copy.  A buffer of at least HUGE_MIN bytes is therefore its
own 2 MB-aligned private mapping, rounded up to whole 2 MB pages and marked
MADV_HUGEPAGE before its first touch, so that transparent huge pages back it
where the system allows them (THP "always" or "madvise"): the raw 2-rank
Allreduce of the W4 buffer on the development VM took 0.35-0.40 ms with it
against 0.44-0.51 ms on 4 KB pages (benchmarks/RESULTS.md, issue 18).  The
cost is the rounding (< 2 MB per buffer); elsewhere (no THP, not Linux, a
smaller buffer) the buffer is an ordinary 64-byte aligned array.

Memory: the window holds P + 1 buffers on the node (P private buffers for the
Allreduce path), in /dev/shm; `reduce_mode` "auto" (rlxc/distributed.py)
picks it only when every rank of the comm is on one node and /dev/shm has
room, else the Allreduce.  Windows are freed by MPI_Finalize (freeing is
collective, so it is never left to the garbage collector).
"""
from __future__ import annotations

import mmap
import os
import time

import numpy as np

__all__ = ["AllreduceBuffer", "SharedBuffer", "huge_page_empty", "shm_room"]

_ALIGN = 16  # floats: 64 bytes, segment and slice boundaries (no shared cache lines)
HUGE = 2 << 20      # bytes of a transparent huge page (x86-64, AArch64 with 4 KB pages)
HUGE_MIN = HUGE     # buffers from this size on get huge pages (the rounding wastes < 50%)


def huge_page_empty(n: int) -> np.ndarray | None:
    """An uninitialized float32[n] at the start of its own HUGE-aligned private
    mapping of whole HUGE pages, marked MADV_HUGEPAGE (module docstring); None
    where that cannot be had (no MADV_HUGEPAGE, or the kernel refuses it).  Touch
    it only after this returns: the first write allocates the pages."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is None or not hasattr(mmap, "MAP_PRIVATE"):
        return None
    length = -(-4 * n // HUGE) * HUGE
    try:
        m = mmap.mmap(-1, length + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (OSError, ValueError):
        return None
    raw = np.frombuffer(m, np.uint8)  # keeps the mapping alive as long as any view
    off = -raw.ctypes.data % HUGE
    try:
        m.madvise(advice, off, length)
    except OSError:  # a kernel without transparent huge pages
        return None
    return raw[off:off + 4 * n].view(np.float32)


class AllreduceBuffer:
    """local is result: one float32[n] summed by comm.allreduce_sum_; 64-byte aligned,
    and on transparent huge pages from HUGE_MIN bytes on (module docstring)."""

    kind = "allreduce"

    def __init__(self, comm, n: int):
        from rlxc.runtime.call import aligned_empty

        self.comm = comm
        buf = huge_page_empty(n) if 4 * n >= HUGE_MIN else None
        self.local = aligned_empty((n,), np.float32) if buf is None else buf
        self.local[:] = 0   # first touch, by this rank, after the advice
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

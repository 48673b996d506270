"""Buffer planning: every temporary lives at a fixed offset of one workspace.

    loops.Program (temps without offsets, kernels in execution order)
          │ liveness: temp t is live over [first kernel touching t, last kernel touching t]
          │ offsets:  greedy by size (largest first), lowest 64-byte-aligned offset that
          │           overlaps no already placed temp with an intersecting live range
          ▼
    Buffer.offset for each temp, Program.workspace_size (bytes, multiple of 64)

The workspace is allocated once by the runtime (64-byte aligned) and passed to
every call, so the hot path allocates nothing: fused intermediates, split
reduction partials and sgemm packing buffers are all temps here, and a temp
whose live range has ended is reused by later ones.  A kernel never gets an
output overlapping one of its inputs: both are live at that kernel, so their
ranges intersect.  Temps no kernel touches (e.g. the result of a matmul whose
epilogue was fused into its consumer) get no space.
"""
from __future__ import annotations

from rlxc.lowering.cpu.loops import Program

ALIGN = 64


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def liveness(program: Program) -> None:
    for b in program.buffers:
        b.first = b.last = -1
    for i, k in enumerate(program.kernels):
        for b in k.buffers():
            if b.first < 0:
                b.first = i
            b.last = i


def plan(program: Program) -> int:
    """Assign workspace offsets to the program's temps; returns the workspace size."""
    liveness(program)
    temps = [b for b in program.buffers if b.kind == "temp" and b.first >= 0]
    temps.sort(key=lambda b: (-b.nbytes, b.first))
    placed = []
    size = 0
    for b in temps:
        need = _align(max(b.nbytes, 1))
        clash = sorted((p.offset, p.offset + _align(max(p.nbytes, 1))) for p in placed
                       if not (p.last < b.first or b.last < p.first))
        off = 0
        for lo, hi in clash:
            if off + need <= lo:
                break
            off = max(off, hi)
        b.offset = off
        placed.append(b)
        size = max(size, off + need)
    for b in program.buffers:
        if b.kind == "temp" and b.first < 0:
            b.offset = -1
    program.workspace_size = _align(size)
    return program.workspace_size


def peak_without_reuse(program: Program) -> int:
    """Workspace bytes if no temp were reused (for reports and tests)."""
    return sum(_align(max(b.nbytes, 1)) for b in program.buffers
               if b.kind == "temp" and b.first >= 0)

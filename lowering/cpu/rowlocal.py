"""The `row-local-temps` pass: a temp that lives inside one row block becomes a per-thread buffer.

    k1_k2_k3_k4  parallel for o in [0, R):                 (rowfuse.py's fused softmax)
                   m[o] = max_c x[o, c]
                   for c: e[o*C + c] = exp(x[o, c] - m[o])   e: a workspace temp of R*C
                   s[o] = sum_c e[o*C + c]
                   for c: y[o, c] = e[o*C + c] / s[o]
          │ localize (driver.lower after fuse_rows; dynsizes: what every sample agrees on)
          ▼
    k1_k2_k3_k4  parallel for o in [lo, hi):   e: C floats on this thread's stack
                   ... e[c] ...                (offsets rebased: o*C + c -> c)

Why: after row fusion each later pass over a row finds it in L1, but a temp the kernel
writes whole rows of (a softmax's exponentials, a layer norm's centered rows) is still
a buffer of the whole tensor: every row goes to the workspace and, once the cache
evicts it, to memory, and the workspace holds R*C floats.  When no other kernel touches
the temp, only the current row block of it is ever live, so one block per thread
suffices: it stays in L1, and the workspace shrinks by the temp.

When it is sound.  A temp T qualifies when (1) the kernel is one loop over the row blocks
O (rowfuse.outer_loop), (2) every access to T has offset c*O + rest with 0 <= rest < c,
one c for all of them (rowfuse.row_stride: the block of iteration O), (3) T is never
read through an index (no indirection), and (4) no other kernel of the program touches
T.  Then iteration O reads only what iteration O wrote, in the same order, so a buffer
of c elements per thread, reused by the next iteration, holds the same values at every
read.  Its stores never stream (non-temporal stores to a buffer read back at once).

Size: the temps one kernel localizes take at most LOCAL_MAX_BYTES together (a thread's
stack; larger row blocks keep their workspace temp).  A size-generic (dynamic) program
localizes only what every sampled program localizes alike (`common`), so the merged
program has one layout at every size.
"""
from __future__ import annotations

from rlxc.lowering.cpu import indexing as ix
from rlxc.lowering.cpu.buffers import liveness
from rlxc.lowering.cpu.loops import DTYPE_BYTES
from rlxc.lowering.cpu.rowfuse import accesses, no_stream, outer_loop, row_stride, subst_stmts

NAME = "row-local-temps"
LOCAL_MAX_BYTES = 64 * 1024   # the per-thread blocks of one kernel together


def local_plan(prog) -> dict:
    """{(kernel name, temp name): c} of the temps `localize` would make per-thread blocks."""
    liveness(prog)   # first == last: one kernel touches the buffer
    plan: dict = {}
    for k in prog.kernels:
        f = outer_loop(k)
        if f is None:
            continue
        acc, indirect = accesses(f.body)
        cands = {id(b): b for b, _, st in acc if st and b.kind == "temp"
                 and b.first == b.last and b not in indirect}
        strides: dict = {}
        for b, off, _ in acc:
            if id(b) in cands:
                c = row_stride(off, f.var)
                if c is None or strides.setdefault(id(b), c) != c:
                    cands.pop(id(b))
        budget = LOCAL_MAX_BYTES
        for i, b in sorted(cands.items(), key=lambda t: t[1].name):
            size = strides[i] * DTYPE_BYTES[b.dtype]
            if size <= budget:
                plan[(k.name, b.name)] = strides[i]
                budget -= size
    return plan


def common(plans: list) -> dict:
    """The entries every plan has, with the same block size."""
    first, *rest = plans
    return {key: c for key, c in first.items() if all(p.get(key) == c for p in rest)}


def localize(prog, plan: dict | None = None):
    """Make the planned temps per-thread row blocks (in place; default: local_plan)."""
    plan = local_plan(prog) if plan is None else plan
    if not plan:
        return prog
    for k in prog.kernels:
        f = outer_loop(k)
        mine = {}
        if f is not None:
            mine = {id(b): (b, plan[(k.name, b.name)]) for b in k.buffers()
                    if (k.name, b.name) in plan}
        if not mine:
            continue
        O = ix.var(f.var)

        def rebase(buf, off, mine=mine, O=O):
            hit = mine.get(id(buf))
            return off if hit is None else ix.add(off, ix.scale(O, -hit[1]))
        f.body = subst_stmts(f.body, {}, rebase)
        no_stream(f.body, {b for b, _ in mine.values()})
        for b, c in mine.values():
            b.kind, b.numel, b.offset = "local", c, -1
        k.outputs = [b for b in k.outputs if id(b) not in mine]
    return prog


__all__ = ["NAME", "LOCAL_MAX_BYTES", "local_plan", "common", "localize"]

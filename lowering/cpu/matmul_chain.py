"""Matmul chains: consecutive dependent GEMMs of a small batch in ONE thread team.

    kernels  k1 = sgemm(x, W1) -> h1 (+ bias, relu epilogue)      each one its own
             k2 = sgemm(h1, W2) -> h2 (...)                       fork/join (sgemm
             k3 = sgemm(h2, W3) -> h3 (...)                       splits its own C)
          │ form_chains (a static program, before buffers.plan)
          ▼
    MatmulChain(steps k1, k2, k3; scratch: `parts` one-thread sgemm slices + a claim
          │ counter per step)
          │ emit: zero the counters, ONE fork (emit_parallel_ranges, at most `parts`
          ▼ threads); every thread, for each step:
    while (u = atomic_add(&counter[step], 1)) < units:
        cols (ceil(N/NR) >= parts): unit u = C[:, u*NR : (u+1)*NR]   (one NR panel)
                                    (a last panel of <= VL columns joins unit 0)
        (the last `parts` column units: TAIL_PIECES row blocks each, claimed one by one)
        rows (the N=10 logits):     unit u = C[u*R : (u+1)*R, :]     (R = the tallest
                                    tall tile when N <= VL and B is small: sgemm_tall's
                                    tiles read B in place; else 4 MR tiles)
        sgemm(unit's sub-block, one thread, workspace slice tid) with the step's epilogue
        (bias row / epilogue slots moved to the sub-block's first row and column)
    GOMP_barrier between steps (the next step reads all of this one's C)

Why: an MLP forward at batch 128 (784-512-512-10, issue 19's W3) is three GEMMs of
~0.3 ms each on two cores: every one forked and joined the team, and the 128x10
logits GEMM (below SGEMM_PAR_MIN) ran on one thread while the other waited.  A
chain is one fork, a barrier between steps, and every step split.  Column units read
(and pack) only their panel of a weight matrix, as the sgemm's own column split does;
rows serve a product too narrow to split by columns.  Units are claimed, not assigned:
on a shared VM the two vCPUs run at different speeds (steal time; measured 148 vs 95
GFLOP/s on one FMA loop), and a thread that wakes late or runs slow takes fewer units
instead of holding the other at the barrier (a static half per thread: 1-4% slower by
the median, same process, A/B).

Prepacked weights: a column-split step whose B is a whole param takes a nullable
pointer to that param packed once in the sgemm's micro-panel layout, panels in unit
order (prepack_spec; runtime/prepack.py packs it for a Jitted's bound params, codegen's
rlx_NAME_prepacked passes it); each unit then calls the sgemm with PREPACKED_B on its
panels and nothing is packed per call (W3: 3.4-5.1% faster back to back, Zen 4).

When the team is one thread (RLXC_NUM_THREADS=1, the thread governor, work below the
threshold, or a call from inside another OpenMP region) the one thread claims every
unit, in order, and skips the barriers (emit_barrier with a team of 1).

Formed only for a static program (sizes are ints; a size-generic program keeps its
kernels: dynsizes merges sampled programs kernel by kernel), for >= 2 consecutive
MatmulKernels without a batch loop where each step's A is the previous step's output
(a chain: anything else in between ends it), each step big enough to split
(M*N*K >= BATCH_PAR_MIN), at least one of them threaded on its own, and every epilogue
load at fixed row and column coefficients per ctx slot (so a sub-block moves each
slot's base).  The buffers of the whole chain are live over the whole chain.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import llvmlite.ir as ir

from rlxc.lowering.cpu import indexing as ix
from rlxc.lowering.cpu.loops import Buffer, Load, MatmulKernel, format_kernel, walk_expr

COUNTER_FLOATS = 16  # one 64-byte line per step: its claim counter (i64)
TAIL_PIECES = 4      # a column-split step's last `parts` units are each claimed as this
#                      many row blocks (1: not split; see _tail)
CHAIN_MAX_M = 1024   # rows: a tall product gains nothing from sharing one team (sgemm's
#                      own split already keeps both threads busy for long)


@dataclass(eq=False)
class MatmulChain:
    name: str
    what: str
    steps: list            # MatmulKernel, in order; each step's A is the previous out
    scratch: Buffer        # `parts` slices of `slice_floats` floats (64-byte aligned)
    slice_floats: int
    parts: int             # static parts of every step (the compile-time thread cap)
    work: int = 0
    parallel: bool = False  # codegen calls fn(bufs..., 0, 1); fn forks the team itself
    forks: bool = True      # ... so the library has threads to pin and govern (driver.py)
    items: int = 1
    splits: list = field(default_factory=list)   # per step: "cols" | "rows"

    @property
    def outputs(self):
        return [s.out for s in self.steps]

    def buffers(self) -> list:
        seen: dict = {}
        for s in self.steps:
            for b in s.buffers():
                if b is not s.scratch:
                    seen.setdefault(id(b), b)
        seen.setdefault(id(self.scratch), self.scratch)
        return list(seen.values())

    def format(self) -> str:
        lines = [f"kernel {self.name}  // {self.what}  (work {self.work}; one team, "
                 f"{self.parts} parts per step, workspace={self.scratch!r})"]
        for s, how in zip(self.steps, self.splits):
            lines.append(f"  step split by {how}:")
            lines += ["    " + x for x in format_kernel(s).splitlines()]
        return "\n".join(lines)

    def emit(self, g):
        return emit_chain(g, self)

    def prepacks(self, cpu: str) -> list:
        """[(step index, runtime/prepack.py layout)] of the steps whose B may come
        prepacked (see prepack_spec), in step order."""
        from rlxc.lowering.cpu.sgemm_kernels import sgemm_config

        cfg = sgemm_config(cpu)
        out = []
        for n, (k, how) in enumerate(zip(self.steps, self.splits)):
            spec = prepack_spec(cfg, k, how, self.parts)
            if spec is not None:
                out.append((n, spec))
        return out


# ------------------------------------------------------------------ formation

def _slot_coeffs(k: MatmulKernel):
    """{slot index: (row coeff, col coeff)} of k's epilogue loads, or None when two loads
    of one slot disagree (then a sub-block cannot move the slot's base)."""
    from rlxc.lowering.cpu.matmul_codegen import epilogue_slots

    if k.epilogue is None:
        return {}
    slots = epilogue_slots(k)
    index = {(id(b), base): i for i, (b, base) in enumerate(slots)}
    out: dict = {}
    for e in walk_expr(k.epilogue):
        if isinstance(e, Load):
            co = e.off.coeffs()
            rc, cc = co.get(k.row, 0), co.get(k.col, 0)
            s = index[(id(e.buf), ix.subst(e.off, {k.row: ix.ZERO, k.col: ix.ZERO}))]
            if out.setdefault(s, (rc, cc)) != (rc, cc):
                return None
    return out


def _chainable(k) -> bool:
    from rlxc.lowering.cpu.matmul_schedule import BATCH_PAR_MIN

    return (isinstance(k, MatmulKernel) and k.par_batch == 1 and
            all(v.extent == 1 for v in k.batch) and
            all(isinstance(d, int) for d in (k.m, k.n, k.k)) and
            0 < k.m <= CHAIN_MAX_M and k.n > 0 and
            k.m * k.n * max(k.k, 1) >= BATCH_PAR_MIN and _slot_coeffs(k) is not None)


def _aligned(floats: int) -> int:
    return -(-floats // 16) * 16


def form_chains(prog, cpu: str = "native"):
    """Replace every run of >= 2 chained GEMMs of the static program `prog` by one
    MatmulChain (see the header); returns prog (changed in place).  Call before
    buffers.plan: the chain's scratch is a new temp."""
    from rlxc.lowering.cpu.sgemm_kernels import sgemm_config, sgemm_workspace_floats

    parts = int(getattr(prog, "sgemm_threads", 1) or 1)
    if parts < 2 or getattr(prog, "dims", None):
        return prog
    cfg = sgemm_config(cpu)
    out, run = [], []

    def flush():
        one = [sgemm_workspace_floats(s.m, s.n, s.k, 1, cpu=cpu) for s in run]
        if len(run) >= 2 and any(s.scratch.numel > w for s, w in zip(run, one)):
            per = max(_aligned(w) for w in one)
            scratch = Buffer(f"chainws{len(prog.buffers)}", "temp", "f32",
                             parts * per + COUNTER_FLOATS * len(run))
            prog.buffers.append(scratch)
            splits = ["cols" if -(-s.n // cfg.nr) >= parts else "rows" for s in run]
            out.append(MatmulChain(
                f"{run[0].name}_chain", " -> ".join(s.name for s in run), list(run), scratch,
                per, parts, work=sum(s.work for s in run), splits=splits))
        else:
            out.extend(run)
        run.clear()

    for k in prog.kernels:
        if _chainable(k) and (not run or k.a.buf is run[-1].out):
            run.append(k)
            continue
        flush()
        if _chainable(k):
            run.append(k)
        else:
            out.append(k)
    flush()
    prog.kernels = out
    return prog


# ------------------------------------------------------------------ codegen

def _row_block(cfg, k, how):
    """Rows per sgemm call of a row-split step, or None (its whole share in one call).

    The tallest tall tile (B read in place, no packing) when B is narrow: one vector, or
    two with 16 registers (AVX2: the logits' N = 10 is 8 + 2 columns; the tall tile then
    walks K twice, which still beats 4*MR-row blocks through the packed nest, each of
    which packs all of B: 30 -> 25 us per thread for W3's 128x10x512 on SPR, portable)."""
    from rlxc.lowering.cpu.sgemm_tall import ONE_VECTOR_B_FLOATS, tall_rows

    talls = tall_rows(cfg)
    vectors = 2 if cfg.vl < 16 else 1
    if how != "rows" or not talls or k.n > vectors * cfg.vl or k.b.cs != 1 or \
            k.n * k.k > ONE_VECTOR_B_FLOATS:
        return None
    return talls[-1]


def _units(cfg, k, how, parts: int):
    """(units, unit size) of a step: NR-column panels, or blocks of rows.

    A thin last column panel (at most VL columns: W3's 512 = 21 x 24 + 8 on AVX2) is
    folded into unit 0 when `parts` units remain for the team; unit 0 is claimed first,
    so the dynamic claims absorb its extra columns.  As a unit of its own it was an
    N <= VL sgemm call (the narrow kernel, Bt packed again) claimed last: W3 on the
    AVX2 builds, 2 threads, back to back, ran 1.5-6% slower that way (Zen 4).  Folded
    into the last unit instead, the team waited for it at the barrier (5% slower)."""
    if how == "cols":
        units = -(-k.n // cfg.nr)
        if units > parts and 0 < k.n % cfg.nr <= cfg.vl:
            units -= 1
        return units, cfg.nr
    blk = _row_block(cfg, k, how) or 4 * cfg.mr
    return -(-k.m // blk), blk


def _tail(cfg, k, how, parts: int, pieces: int | None = None):
    """(tail units, row pieces per tail unit, rows per piece) of a step: its last `parts`
    column units are each claimed as `pieces` blocks of rows, so that the team's last
    claims are small and its threads reach the barrier together.  Equal column units
    leave the team one unit apart at worst (W3's 512 columns: 21 units of 24 for two
    threads, one of which waits for the other's eleventh); half units halve that.
    (0, 1, M) when the step is not split so: a row-split step, or too few rows (each
    piece keeps at least 4 MR tiles)."""
    pieces = TAIL_PIECES if pieces is None else pieces
    units, _ = _units(cfg, k, how, parts)
    if how != "cols" or pieces < 2 or units < parts:
        return 0, 1, k.m
    rows = -(-(-(-k.m // pieces)) // cfg.mr) * cfg.mr
    if rows < 4 * cfg.mr:
        return 0, 1, k.m
    return parts, -(-k.m // rows), rows


def _unit_panels(cfg, k, how, parts: int) -> list:
    """The column micro-panels of a column-split step, in unit order: [(first, last)],
    each at most NR wide (unit 0 holds two when a thin last panel is folded into it)."""
    units, size = _units(cfg, k, how, parts)
    rem = k.n - units * size
    out = []
    for u in range(units):
        first = 0 if u == 0 else u * size + max(rem, 0)
        last = min(k.n, (u + 1) * size + max(rem, 0))
        out += [(c, min(c + cfg.nr, last)) for c in range(first, last, cfg.nr)]
    return out


def prepack_spec(cfg, k, how, parts: int):
    """The prepacked layout (runtime/prepack.py) of step k's B, or None when its B cannot
    come prepacked: only a column-split step whose B is a whole float32 param with
    contiguous rows (a bound weight; the Jitted packs it once), and more rows than the
    skinny and tall kernels take (they read B in place, packing nothing: a batch-1
    matvec stays one).  With the layout's panels in unit order (_unit_panels), unit u's
    first panel is u, or u + 1 after a unit 0 that holds a folded thin panel."""
    from rlxc.lowering.cpu.sgemm_tall import tall_rows

    bb = k.b
    if how != "cols" or bb.buf.kind != "param" or bb.buf.dtype != "f32" or bb.cs != 1 or \
            bb.rs != k.n or bb.buf.numel != k.k * k.n or k.k < 1 or \
            k.m <= max([cfg.mr, *tall_rows(cfg)]):
        return None
    off = ix.subst(bb.off, {v: ix.ZERO for v in k.batch})
    if not (off.is_const() and off.const == 0):
        return None
    panels = _unit_panels(cfg, k, how, parts)
    return {"param": bb.buf.index, "k": k.k, "n": k.n, "nr": cfg.nr,
            "cols": [p[0] for p in panels] + [k.n]}


def emit_chain(g, ch: MatmulChain):
    """fn(bufs..., i64, i64): zero the steps' claim counters, then fork (emit_parallel_ranges
    over ch.parts, capped at ch.parts threads); each thread, for each step: claim units
    (atomic add on the step's counter) until none is left, one one-thread sgemm call per
    unit in its workspace slice (tid); a team barrier between steps."""
    from rlxc.lowering.cpu import openmp as parallel
    from rlxc.lowering.cpu import sgemm_object as sgemmlib
    from rlxc.lowering.cpu.codegen import VOID, Body, c64, ptr_type
    from rlxc.lowering.cpu.matmul_codegen import (F32P, I8P, builtin_epilogue, declare,
                                                  epilogue_fn, epilogue_slots)
    from rlxc.lowering.cpu.sgemm_kernels import PREPACKED_B, sgemm_config, sgemm_signature
    from rlxc.lowering.cpu.tuning import PAR_MIN_WORK
    from rlxc.lowering.shared.scalar import I32, I64

    cfg = sgemm_config(g.cpu)
    bufs = ch.buffers()
    # the steps whose B may come prepacked: one nullable pointer argument each, after
    # the buffers (codegen passes the prepacked entry's panels, or NULL)
    pre = dict(ch.prepacks(g.cpu)) if getattr(g, "prepack", False) else {}
    pre_at = {n: len(bufs) + i for i, n in enumerate(pre)}
    fn = g._fn(ch.name, VOID, [ptr_type(x.dtype) for x in bufs] +
               [F32P] * len(pre) + [I64, I64])
    b = ir.IRBuilder(fn.entry_basic_block)
    plain, cb = sgemmlib.symbols(g.cpu)
    g.uses_sgemm = True
    sc = bufs.index(ch.scratch)
    counters = b.bitcast(b.gep(fn.args[sc], [c64(ch.parts * ch.slice_floats)], inbounds=True),
                         I64.as_pointer())
    for n in range(len(ch.steps)):
        b.store(c64(0), b.gep(counters, [c64(n * COUNTER_FLOATS // 2)], inbounds=True))
    epis = {}
    for k in ch.steps:   # emitted once, outside the outlined worker
        if k.epilogue is not None and builtin_epilogue(k) is None:
            epis[id(k)] = epilogue_fn(g, k, epilogue_slots(k))
    nslots = max([1] + [len(epilogue_slots(s)) for s in ch.steps])

    def team(wb, lo, hi, tid, nt, args):
        ptrs = {id(x): a for x, a in zip(bufs, args)}
        packed = {n: args[i] for n, i in pre_at.items()}
        body = Body(wb.function, ptrs)
        ctx = wb.alloca(ir.ArrayType(F32P, nslots), name="epi.ctx")
        ws = wb.gep(ptrs[id(ch.scratch)], [wb.mul(wb.sext(tid, I64), c64(ch.slice_floats))],
                    inbounds=True)
        ctrs = wb.bitcast(wb.gep(ptrs[id(ch.scratch)], [c64(ch.parts * ch.slice_floats)],
                                 inbounds=True), I64.as_pointer())
        for n, (k, how) in enumerate(zip(ch.steps, ch.splits)):
            zero = {v: c64(0) for v in k.batch}
            units, size = _units(cfg, k, how, ch.parts)

            def at(b, buf, off, extra, zero=zero):
                base = body.index(b, off, zero)
                return b.gep(ptrs[id(buf)], [b.add(base, extra)], inbounds=True)

            def call(b, r0, r1, n0, n1, panel=None, k=k, at=at, n=n):
                bp, rsb, csb = (at(b, k.b.buf, k.b.off, b.mul(n0, c64(k.b.cs))), c64(k.b.rs),
                                c64(k.b.cs))
                flag = ir.Constant(I32, 0)
                if n in packed:   # B prepacked (a bound weight): its panels, when given
                    got = b.icmp_unsigned("!=", b.ptrtoint(packed[n], I64), c64(0))
                    stride = c64(k.k * cfg.nr)
                    bp = b.select(got, b.gep(packed[n], [b.mul(panel, stride)], inbounds=True),
                                  bp)
                    rsb, csb = b.select(got, stride, rsb), b.select(got, c64(0), csb)
                    flag = b.select(got, ir.Constant(I32, PREPACKED_B), flag)
                args_ = [b.sub(r1, r0), b.sub(n1, n0), c64(k.k),
                         at(b, k.a.buf, k.a.off, b.mul(r0, c64(k.a.rs))), c64(k.a.rs),
                         c64(k.a.cs), bp, rsb, csb,
                         at(b, k.out, ix.ZERO, b.add(b.mul(r0, c64(k.n)), n0)), c64(k.n),
                         flag, ws, c64(ch.slice_floats)]
                if k.epilogue is None:
                    b.call(declare(g.m, plain, sgemm_signature()), args_)
                    return
                code = builtin_epilogue(k)
                epi = epis[id(k)] if code is None else ir.Constant(I64, code).inttoptr(I8P)
                coeffs = _slot_coeffs(k)
                for s_, (buf, base) in enumerate(epilogue_slots(k)):
                    rc, cc = coeffs.get(s_, (0, 0))
                    shift = b.add(b.mul(r0, c64(rc)), b.mul(n0, c64(cc)))
                    b.store(at(b, buf, base, shift),
                            b.gep(ctx, [ir.Constant(I32, 0), ir.Constant(I32, s_)],
                                  inbounds=True))
                b.call(declare(g.m, cb, sgemm_signature([I8P, I8P])),
                       args_ + [epi if epi.type == I8P else b.bitcast(epi, I8P),
                                b.bitcast(ctx, I8P)])

            tail, pieces, prow = _tail(cfg, k, how, ch.parts)

            def unit(wb, u, _hi, k=k, how=how, size=size, call=call, units=units, tail=tail,
                     pieces=pieces, prow=prow):
                r0, r1 = c64(0), c64(k.m)
                if tail:   # item u >= units - tail: a row block of a tail column unit
                    v = wb.sub(u, c64(units - tail))
                    in_tail = wb.icmp_signed(">=", v, c64(0))
                    vp = wb.select(in_tail, v, c64(0))
                    u = wb.select(in_tail, wb.add(c64(units - tail), wb.sdiv(vp, c64(pieces))), u)
                    first_r = wb.mul(wb.srem(vp, c64(pieces)), c64(prow))
                    last_r = wb.add(first_r, c64(prow))
                    last_r = wb.select(wb.icmp_signed("<", last_r, c64(k.m)), last_r, c64(k.m))
                    r0 = wb.select(in_tail, first_r, r0)
                    r1 = wb.select(in_tail, last_r, r1)
                first = wb.mul(u, c64(size))
                total = k.n if how == "cols" else k.m
                last = wb.add(first, c64(size))
                last = wb.select(wb.icmp_signed("<", last, c64(total)), last, c64(total))
                rem = total - units * size
                if how == "cols" and rem > 0:   # unit 0 takes the thin last panel's columns
                    first = wb.select(wb.icmp_signed("==", u, c64(0)), c64(0),
                                      wb.add(first, c64(rem)))
                    last = wb.add(wb.mul(u, c64(size)), c64(size + rem))
                if how == "cols":
                    # unit u's first prepacked panel (unit 0 holds two when folded)
                    panel = u if rem <= 0 else wb.add(u, wb.zext(
                        wb.icmp_signed(">", u, c64(0)), I64))
                    call(wb, r0, r1, first, last, panel)
                else:
                    call(wb, first, last, c64(0), c64(k.n))
            parallel.emit_claim_loop(wb, wb.gep(ctrs, [c64(n * COUNTER_FLOATS // 2)],
                                                inbounds=True), units + tail * (pieces - 1),
                                     unit, name=f"chain{n}")
            if n + 1 < len(ch.steps):   # the next step reads all of this one's C
                parallel.emit_barrier(wb, nt)

    parallel.emit_parallel_ranges(g.m, b, c64(ch.parts), team,
                                  list(fn.args[:len(bufs) + len(pre)]),
                                  name=f"{g.sym}.{ch.name}.team", work=c64(ch.work),
                                  min_work=PAR_MIN_WORK, max_threads=c64(ch.parts))
    b.ret_void()
    return fn, bufs, None


__all__ = ["MatmulChain", "form_chains", "emit_chain", "prepack_spec", "CHAIN_MAX_M"]

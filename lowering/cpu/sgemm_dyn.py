"""Dynamic splits of the sgemm: threads claim row chunks (or column items) from a counter.

    NAME (sgemm_kernels.emit_sgemm), row split over a team of nt >= 2 threads
      │ sync[] = 0; every thread runs dyn(..., sync, R, Bs = thread 0's B part, nt)
      ▼
    dyn   shared B (N <= NC: one column block, at most SYNC_KB K blocks):
                loop: t = atomic sync[1]++ ; if t >= n_kb * nt: break
                    pack K block t / nt, panel group t % nt (of nt) into Bs
                    atomic sync[2 + t / nt] += 1 (release)
          loop: it = atomic sync[0]++          (items in jc-major order)
                if it >= n_items: return
                jc block = it / n_ic; rows: R-row chunks, then the last ~nt * R rows
                    in chunks of r = R / dyn_tail
                not shared, first item of this jc block for this thread:
                    pack all of B[:, jc block] (every K block, kc x ceil(nc/NR)*NR
                    each, one after the other) into this thread's B part
                for pc in K by kcb:                  (the same balanced K blocks as seq)
                  shared: spin until sync[2 + pc / kcb] == nt (acquire)
                  pack_a A[ic:ic+R, pc:pc+kc]  (read in place only with cfg.dyn_direct_a:
                                                 packing was 2.4-8% faster on Zen 3)
                  for jr in nc by NR: for ir in R by MR: micro tile (beta: acc or pc > 0,
                                                          epilogue on the last K block)

    col items (emit_col_items, SgemmConfig.dyn_cols): the column split's twin for M >=
          DYN_COLS_MIN_M and unit-stride A rows: items of NR panels, big ones then small
          ones, each run by seq on its columns (its own B panels, A read in place)

Why: with a static split (one range of rows per thread) the call ends when the slower
thread ends; on a shared machine the OS deschedules one of two threads for whole
slices, and the other then idles at the join.  Here a thread that runs takes the next
chunk, so the call ends about when the team's total work is done; the small tail chunks
bound the idle time at the end by one small chunk.  One thread owns all K blocks of an
item, so no two threads ever write the same C rows (no barrier, no race, the first K
block may overwrite C).  B: a chunk that packed B itself would pay one B pack per chunk
(128-row chunks of 1024^3 ran 28% slower), so B is packed once per call and shared when
N fits one column block (the team splits the packing; a thread waits only for the K
block it is about to use, whose packing started before any item: no team barrier, and
a late thread finds B packed), else once per column block per thread.  The cost: the B
part of the workspace holds all of K (sgemm_kernels.dyn_ok bounds it by
cfg.dyn_b_floats), and B streams from L2/L3 once per chunk instead of once per MC rows.
"""
from __future__ import annotations

import llvmlite.ir as ir

from rlxc.lowering.cpu import openmp as parallel
from rlxc.lowering.cpu.sgemm_kernels import (
    F32P, I1, I64, SgemmConfig, balanced_k_blocks, c64, counted_loop, dispatch_width, gep,
    gep_any, internal_fn, prefetch, rup_ir, smax, smin)

I64P = I64.as_pointer()


SYNC_KB = 64                  # K blocks at most for the shared B (one counter each)
SYNC_CELLS = 2 + SYNC_KB      # i64 cells of the team's sync array


def shared_ok(b, N, n_kb, cfg: SgemmConfig):
    """Whether the team shares one packed B (i1): one column block (N <= NC) of at most
    SYNC_KB K blocks; else every thread packs its own B per column block."""
    return b.and_(b.icmp_signed("<=", N, c64(cfg.nc)), b.icmp_signed("<=", n_kb, c64(SYNC_KB)))


def _pause(b, cfg: SgemmConfig) -> None:
    """A spin-wait hint: x86 `pause` (nothing elsewhere)."""
    if cfg.isa in ("avx512", "avx2", "avx", "sse"):
        m = b.module
        f = m.globals.get("llvm.x86.sse2.pause") or ir.Function(
            m, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse2.pause")
        b.call(f, [])


def _emit_shared_pack(b, cfg: SgemmConfig, pack_b, B, rsb, csb, K, N, kcb, n_kb, Bs, sync,
                      nt):
    """Pack phase of the shared B (header): claim pack tasks (K block kb, group g of nt
    groups of its NR panels) from sync[1]; pack each into Bs; count it done in sync[2 + kb]
    (release, so a thread that sees the count also sees the packed floats)."""
    NR = cfg.nr
    ncp = rup_ir(b, N, NR)
    n_pan = b.sdiv(ncp, c64(NR))

    def task(b, t, _hi):
        kb = b.sdiv(t, nt)
        g = b.sub(t, b.mul(kb, nt))
        pc = b.mul(kb, kcb)
        kc = smax(b, smin(b, kcb, b.sub(K, pc)), c64(0))
        j0 = b.mul(b.sdiv(b.mul(n_pan, g), nt), c64(NR))
        j1 = smin(b, b.mul(b.sdiv(b.mul(n_pan, b.add(g, c64(1))), nt), c64(NR)), N)
        with b.if_then(b.icmp_signed("<", j0, j1)):
            b.call(pack_b, [gep(b, B, b.add(b.mul(pc, rsb), b.mul(j0, csb))), rsb, csb, kc,
                            b.sub(j1, j0), gep(b, Bs, b.add(b.mul(pc, ncp), b.mul(j0, kc)))])
        b.atomic_rmw("add", gep(b, sync, b.add(kb, c64(2))), c64(1), "release")

    parallel.emit_claim_loop(b, gep(b, sync, c64(1)), b.mul(n_kb, nt), task, name="spack")


def _emit_wait(b, cfg: SgemmConfig, cell, want):
    """Spin until the atomic *cell >= want (acquire)."""
    fn = b.function
    head, body, done = (fn.append_basic_block(f"wait.{s}") for s in ("head", "body", "done"))
    b.branch(head)
    b.position_at_end(head)
    v = b.load_atomic(cell, "acquire", 8)
    b.cbranch(b.icmp_signed("<", v, want), body, done)
    b.position_at_end(body)
    _pause(b, cfg)
    b.branch(head)
    b.position_at_end(done)


def emit_dyn(module, name, cfg: SgemmConfig, micros, micro_da, pack_a, pack_b,
             epi_types) -> ir.Function:
    """dyn(M, N, K, A, rsa, csa, B, rsb, csb, C, ldc, acc i1, Ap, Bp, sync i64*, R, Bs, nt,
    epi...): this thread's share of C (=|+=) A @ B, claimed R rows at a time (header).
    sync: SYNC_CELLS zeroed i64 shared by the team (item counter, pack-task counter, packed
    count per K block); Bs: the team's shared B part; nt: the team size."""
    MR, NR, NC, VL = cfg.mr, cfg.nr, cfg.nc, cfg.vl
    fn = internal_fn(module, name, [I64, I64, I64, F32P, I64, I64, F32P, I64, I64, F32P, I64,
                                    I1, F32P, F32P, I64P, I64, F32P, I64, *epi_types],
                     # not Bp (13): with the shared B, thread 0's Bp is Bs, which the
                     # other threads write while this runs
                     [3, 6, 9, 12], inline="noinline")
    M, N, K, A, rsa, csa, B, rsb, csb, C, ldc, acc, Ap, Bp, counter, R, Bs, nt = fn.args[:18]
    epi_args = list(fn.args[18:])
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    cur = b.alloca(I64, name="cur.jc")
    b.store(c64(-1), cur)
    k_end, n_kb, kcb = balanced_k_blocks(b, K, cfg, M)   # the K blocks of seq
    shared = shared_ok(b, N, n_kb, cfg)
    with b.if_then(shared):
        _emit_shared_pack(b, cfg, pack_b, B, rsb, csb, K, N, kcb, n_kb, Bs, counter, nt)
        b.store(c64(0), cur)              # the one column block is (being) packed in Bs
    Bp = b.select(shared, Bs, Bp)
    # items of a column block: R-row chunks, then the last rows (about nt x R) in chunks of
    # r = R / dyn_tail, so that the threads end within a small chunk of each other
    r = R
    if cfg.dyn_tail > 1:
        r = smax(b, rup_ir(b, b.sdiv(R, c64(cfg.dyn_tail)), MR), c64(MR))
    n_big = b.sdiv(smax(b, b.sub(M, b.mul(nt, R)), c64(0)), R)
    m_big = b.mul(n_big, R)
    n_ic = b.add(n_big, b.sdiv(b.add(b.sub(M, m_big), b.sub(r, c64(1))), r))
    n_items = b.mul(n_ic, b.sdiv(b.add(N, c64(NC - 1)), c64(NC)))

    def item(b, it, _hi):
        jcb = b.sdiv(it, n_ic)
        li = b.sub(it, b.mul(jcb, n_ic))
        big = b.icmp_signed("<", li, n_big)
        ic = b.select(big, b.mul(li, R), b.add(m_big, b.mul(b.sub(li, n_big), r)))
        jc = b.mul(jcb, c64(NC))
        nc = smin(b, c64(NC), b.sub(N, jc))
        ncp = rup_ir(b, nc, NR)
        mi = smin(b, b.select(big, R, r), b.sub(M, ic))

        with b.if_then(b.icmp_signed("!=", b.load(cur), jcb)):
            def pack(b, pc):
                kc = smax(b, smin(b, kcb, b.sub(K, pc)), c64(0))
                b.call(pack_b, [gep(b, B, b.add(b.mul(pc, rsb), b.mul(jc, csb))), rsb, csb, kc,
                                nc, gep(b, Bp, b.mul(pc, ncp))])
            counted_loop(b, c64(0), k_end, kcb, pack, "dpb")
            b.store(jcb, cur)

        direct = None
        if micro_da is not None and cfg.dyn_direct_a:
            full = b.icmp_signed("==", b.srem(nc, c64(NR)), c64(0))
            if cfg.direct_a_edge:
                full = ir.Constant(I1, 1)
            direct = b.and_(b.icmp_signed("==", csa, c64(1)), full)

        def pc_body(b, pc):
            with b.if_then(shared):
                _emit_wait(b, cfg, gep(b, counter, b.add(b.sdiv(pc, kcb), c64(2))), nt)
            kc = smax(b, smin(b, kcb, b.sub(K, pc)), c64(0))
            beta = b.or_(acc, b.icmp_signed(">", pc, c64(0)))
            last = b.icmp_signed(">=", b.add(pc, kcb), K)
            ablk = gep(b, A, b.add(b.mul(ic, rsa), b.mul(pc, csa)))
            bblk = gep(b, Bp, b.mul(pc, ncp))
            pf_lines = pf_per = None
            if cfg.dyn_prefetch_b:
                pf_lines = b.sdiv(b.add(b.mul(c64(NR), kc), c64(15)), c64(16))
                tiles_n = b.sdiv(b.add(mi, c64(MR - 1)), c64(MR))
                pf_per = b.sdiv(b.add(pf_lines, b.sub(tiles_n, c64(1))), tiles_n)

            def tiles(b, da):
                def jr_body(b, jr):
                    n_rem = smin(b, c64(NR), b.sub(nc, jr))
                    bp = gep(b, bblk, b.mul(jr, kc))

                    def ir_body(b, i_r):
                        if pf_lines is not None:
                            # the next packed panel (this block's next, or the next K block's
                            # first: Bp is one stream) into L2, a slice of its lines per tile
                            lo = b.mul(b.sdiv(i_r, c64(MR)), pf_per)
                            nxt = gep_any(b, bp, b.mul(c64(NR), kc))

                            def pf(b, ln):
                                prefetch(b, gep_any(b, nxt, b.mul(ln, c64(16))), 0,
                                         cfg.dyn_prefetch_b)
                            counted_loop(b, lo, smin(b, b.add(lo, pf_per), pf_lines), 1, pf, "dpf")
                        m_rem = smin(b, c64(MR), b.sub(mi, i_r))
                        ap = gep(b, ablk, b.mul(i_r, rsa)) if da else gep(b, Ap, b.mul(i_r, kc))
                        cp = gep(b, C, b.add(b.mul(b.add(ic, i_r), ldc), b.add(jc, jr)))
                        margs = [kc, ap, bp, cp, ldc, m_rem, n_rem, beta, last, b.add(ic, i_r),
                                 b.add(jc, jr)]
                        if da:
                            dispatch_width(b, n_rem, [*margs, rsa, *epi_args], micro_da, VL)
                        else:
                            dispatch_width(b, n_rem, [*margs, *epi_args], micros, VL)
                    counted_loop(b, c64(0), mi, MR, ir_body, "dir")
                counted_loop(b, c64(0), nc, NR, jr_body, "djr")

            if direct is None:
                b.call(pack_a, [ablk, rsa, csa, mi, kc, Ap])
                tiles(b, False)
                return
            with b.if_else(direct) as (t, o):
                with t:
                    tiles(b, True)
                with o:
                    b.call(pack_a, [ablk, rsa, csa, mi, kc, Ap])
                    tiles(b, False)
        counted_loop(b, c64(0), k_end, kcb, pc_body, "dpc")
    parallel.emit_claim_loop(b, counter, n_items, item, name="item")
    b.ret_void()
    return fn


def emit_col_items(b, counter, N, nt, cfg: SgemmConfig, body) -> None:
    """The dynamic column split (SgemmConfig.dyn_cols): claim column items from the i64
    *counter (zeroed before the fork) until none are left, calling body(b, n0, n1) on each
    item's columns [n0, n1).  Items are ranges of NR panels: about dyn_cols per thread of
    g panels, then the last 2 * nt items of t = ceil(g / 4) panels, so that the threads
    end within a small item of each other (a thread holding up the join holds up at most
    t panels)."""
    NR = cfg.nr
    nb = b.sdiv(b.add(N, c64(NR - 1)), c64(NR))
    per = b.mul(c64(cfg.dyn_cols), nt)
    g = smax(b, b.sdiv(b.add(nb, b.sub(per, c64(1))), per), c64(1))
    t = b.sdiv(b.add(g, c64(3)), c64(4))
    big = smax(b, b.sub(nb, b.mul(b.mul(c64(2), nt), t)), c64(0))
    n_big = b.sdiv(b.add(big, b.sub(g, c64(1))), g)
    n_items = b.add(n_big, b.sdiv(b.add(b.sub(nb, big), b.sub(t, c64(1))), t))

    def item(b, it, _hi):
        is_big = b.icmp_signed("<", it, n_big)
        p0 = b.select(is_big, b.mul(it, g), b.add(big, b.mul(b.sub(it, n_big), t)))
        p1 = smin(b, b.add(p0, b.select(is_big, g, t)), b.select(is_big, big, nb))
        body(b, b.mul(p0, c64(NR)), smin(b, b.mul(p1, c64(NR)), N))
    parallel.emit_claim_loop(b, counter, n_items, item, name="citem")

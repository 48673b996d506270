"""Tall register tiles of the sgemm: MR < M <= 24 rows with unit-stride B rows, nothing packed.

    seq(M, N, K, A, rsa, csa, B, rsb, 1, C, ldc, ...), MR < M <= R_max, one thread's C
          │ tall_R, R the smallest variant >= M (AVX-512: 8, 12, 16, 24; 16 registers:
          │ 8, 12): column tiles of W = NV*VL columns (NV = the skinny width at R rows,
          │ R*NV <= 24 accumulators), each accumulating all of K in registers:
          │     acc[r][v] = fma(splat(A[r*rsa + k*csa]), B[k*rsb + j0 + v*VL : +VL], acc)
          │ A broadcast from its rows in place (rows r >= M re-read row M-1 and are not
          │ stored), B rows read in place; the columns past the last W tile run as
          │ single-vector tiles, the last partial vector masked
          │ R_max < M <= 2 * (the tallest multi-vector variant), B too big for a one-vector
          │ tile: two halves of ceil(M/2) and the rest rows (HALVES_B_FLOATS)
          ▼
    C[0:M, 0:N] (=|+=) A @ B, the epilogue on each stored vector (sgemm_kernels.py)

Why: a convolution's per-image GEMM is short and has few rows: the ONNX CNN's second
conv is 16 output channels x 16 pixels x K=72, 64 of them per call at batch 64.  The
6-row skinny kernels stop at M = MR; above that the product went to the narrow kernel
(N <= VL: B packed transposed, a transpose-and-add tree per row of C) or to the packed
loop nest (A and B packed, 6-row tiles), and packing such a product costs about as much
as computing it: 19 GMAC/s for 16x16x72 on Sapphire Rapids, against ~50 for one 16x16
tile reading both operands in place (B: one row vector per k, shared by all 16 rows;
A: 16 broadcasts per k, its 16 x K block stays in L1).  Each element of B is read once
per call, so the kernel is bound by the FMAs, not by streaming B.
"""
from __future__ import annotations

import llvmlite.ir as ir

from rlxc.lowering.cpu.sgemm_kernels import (
    F32, F32P, I1, I64, ISAS, SgemmConfig, c64, counted_loop, fma_fn, gep, gep_any, internal_fn,
    lane_mask, masked_load, masked_store, prefetch, skinny_width, smin, splat)

TALL_ROWS = (8, 12, 16, 24)   # candidate variants; a CPU keeps those in (MR, budget]
# A variant one vector wide (NV = 1: 16 and 24 rows on AVX-512, all on AVX2) walks all K
# rows of B once per VL columns; when B is wider than a few vectors those rows sit on
# N*4-byte strides (one L1 set, one page per row for N >= 1024) and the packed loop nest
# wins (16x2048x256: 0.58x): such a variant runs only while B (K*N floats) fits in L1.
ONE_VECTOR_B_FLOATS = 8192
# Above the tallest multi-vector variant (12 rows on AVX-512) with a B too big for a
# one-vector one, M <= 2 * 12 rows run as two halves on a multi-vector variant, each
# reading all of B, while B (K*N floats) stays in L2 for the second pass: LeNet's conv2
# (16 x 100 x 150 per image) went to the packed loop nest, packing B for every image.
HALVES_B_FLOATS = 32768


def tall_rows(cfg: SgemmConfig) -> list[int]:
    """Row counts of the tall variants for `cfg`: above the skinny kernels' MR, at most the
    skinny accumulator budget (24 registers of 32, 12 of 16)."""
    if not cfg.tall:
        return []
    budget = 24 if cfg.vl >= 16 else 12
    return [r for r in TALL_ROWS if cfg.mr < r <= budget]


def emit_tall(module, name, cfg: SgemmConfig, R: int, epilogue, epi_types) -> ir.Function:
    """tall(M, N, K, A, rsa, csa, B, rsb, C, ldc, beta i1, row0, col0, epi...): C[0:M, 0:N]
    (=|+=) A[0:M, :] @ B for 1 <= M <= R, B rows unit-stride (see the header)."""
    VL = cfg.vl
    NV = skinny_width(cfg, R)
    W = NV * VL
    vt = ir.VectorType(F32, VL)
    fn = internal_fn(module, name, [I64, I64, I64, F32P, I64, I64, F32P, I64, F32P, I64, I1,
                                     I64, I64, *epi_types], [3, 6, 8], inline="noinline")
    M, N, K, A, rsa, csa, B, rsb, C, ldc, beta, row0, col0 = fn.args[:13]
    epi_args = list(fn.args[13:])
    fma = fma_fn(module, VL, ISAS[cfg.isa].fma)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    last_row = b.sub(M, c64(1))
    arows = [gep(b, A, b.mul(smin(b, c64(r), last_row), rsa)) for r in range(R)]

    def tile(b, j0, nv, masks):
        b0 = gep(b, B, j0)
        pre = b.block
        head = fn.append_basic_block("tl.head")
        body = fn.append_basic_block("tl.body")
        done = fn.append_basic_block("tl.done")
        b.branch(head)
        b.position_at_end(head)
        k = b.phi(I64, name="k")
        brow = b.phi(F32P, name="brow")
        acc = [[b.phi(vt) for _ in range(nv)] for _ in range(R)]
        k.add_incoming(c64(0), pre)
        brow.add_incoming(b0, pre)
        for r in range(R):
            for v in range(nv):
                acc[r][v].add_incoming(ir.Constant(vt, None), pre)
        b.cbranch(b.icmp_signed("<", k, K), body, done)
        b.position_at_end(body)
        if masks is None and cfg.skinny_prefetch:
            ahead = gep_any(b, brow, b.mul(rsb, c64(cfg.skinny_prefetch)))
            for off in range(0, nv * VL, 16):
                prefetch(b, gep_any(b, ahead, c64(off)), 0)
        bv = [masked_load(b, gep(b, brow, c64(v * VL)), VL, None if masks is None else masks[v])
              for v in range(nv)]
        kcs = b.mul(k, csa)
        for r in range(R):
            a = splat(b, b.load(gep(b, arows[r], kcs)), VL)
            for v in range(nv):
                acc[r][v].add_incoming(b.call(fma, [a, bv[v], acc[r][v]]), body)
        k.add_incoming(b.add(k, c64(1)), body)
        brow.add_incoming(gep(b, brow, rsb), body)
        b.branch(head)
        b.position_at_end(done)

        def store(b, r):
            crow = gep(b, C, b.add(b.mul(c64(r), ldc), j0))
            for v in range(nv):
                m = None if masks is None else masks[v]
                p = gep(b, crow, c64(v * VL))
                x = acc[r][v]
                x = b.select(beta, b.fadd(x, masked_load(b, p, VL, m)), x)
                if epilogue is not None:
                    x = epilogue(b, b.add(row0, c64(r)), b.add(col0, b.add(j0, c64(v * VL))),
                                 x, VL, m, epi_args)
                masked_store(b, x, p, m)
        for r in range(R):
            if r == 0:
                store(b, r)
            else:
                with b.if_then(b.icmp_signed("<", c64(r), M)):
                    store(b, r)

    n_wide = b.mul(b.sdiv(N, c64(W)), c64(W))
    counted_loop(b, c64(0), n_wide, W, lambda b, j0: tile(b, j0, NV, None), "tlj")
    n_vec = b.mul(b.sdiv(N, c64(VL)), c64(VL))
    if NV > 1:
        counted_loop(b, n_wide, n_vec, VL, lambda b, j0: tile(b, j0, 1, None), "tlv")
    with b.if_then(b.icmp_signed("<", n_vec, N)):
        tile(b, n_vec, 1, [lane_mask(b, 0, b.sub(N, n_vec), VL)])
    b.ret_void()
    return fn


def emit_tall_dispatch(b, cfg: SgemmConfig, talls, M, args, coop, csb) -> None:
    """In seq: when MR < M <= the tallest variant, B rows unit-stride and this thread owns
    its C (not coop), call the smallest variant >= M (one vector wide: only for a B of at
    most ONE_VECTOR_B_FLOATS) and return; else fall through.
    `args`: (N, K, A, rsa, csa, B, rsb, C, ldc, beta, row0, col0, epi...)."""
    if not talls:
        return
    use = b.and_(b.and_(b.icmp_signed(">", M, c64(cfg.mr)),
                        b.icmp_signed("<=", M, c64(talls[-1][0]))),
                 b.and_(b.icmp_signed("==", csb, c64(1)), b.not_(coop)))
    small_b = b.icmp_signed("<=", b.mul(args[0], args[1]), c64(ONE_VECTOR_B_FLOATS))
    with b.if_then(use, likely=False):
        for rows, fn in talls:
            fits = b.icmp_signed("<=", M, c64(rows))
            if skinny_width(cfg, rows) == 1:
                fits = b.and_(fits, small_b)
            with b.if_then(fits):
                b.call(fn, [M, *args])
                b.ret_void()
        multi = [(r, fn) for r, fn in talls if skinny_width(cfg, r) > 1]
        if multi:   # too many rows for a multi-vector tile, B too big for a one-vector one
            top = multi[-1][0]
            halves = b.and_(b.and_(b.icmp_signed(">", M, c64(top)),
                                   b.icmp_signed("<=", M, c64(2 * top))),
                            b.icmp_signed("<=", b.mul(args[0], args[1]), c64(HALVES_B_FLOATS)))
            with b.if_then(halves):
                h = b.sdiv(b.add(M, c64(1)), c64(2))
                N, K, A, rsa, csa, B, rsb, C, ldc, beta, row0, col0, *epi = args
                second = [N, K, gep(b, A, b.mul(h, rsa)), rsa, csa, B, rsb,
                          gep(b, C, b.mul(h, ldc)), ldc, beta, b.add(row0, h), col0, *epi]
                for rows, fn in multi:
                    with b.if_then(b.icmp_signed("<=", h, c64(rows))):
                        b.call(fn, [h, *args])
                        b.call(fn, [b.sub(M, h), *second])
                        b.ret_void()


def takes_tall(cfg: SgemmConfig, M: int, N: int, K: int, csb: int) -> int | None:
    """The rows of the tall variant seq runs for one thread's whole (M, N, K) product with
    B's column stride `csb` (for two halves: the variant of the first), or None: the
    Python twin of emit_tall_dispatch."""
    rows_all = tall_rows(cfg)
    if M <= cfg.mr or csb != 1 or not rows_all or M > rows_all[-1]:
        return None
    for rows in rows_all:
        if M <= rows and (skinny_width(cfg, rows) > 1 or N * K <= ONE_VECTOR_B_FLOATS):
            return rows
    multi = [r for r in rows_all if skinny_width(cfg, r) > 1]
    if multi and multi[-1] < M <= 2 * multi[-1] and N * K <= HALVES_B_FLOATS:
        h = (M + 1) // 2
        return next(r for r in multi if h <= r)
    return None


__all__ = ["HALVES_B_FLOATS", "ONE_VECTOR_B_FLOATS", "TALL_ROWS", "tall_rows", "emit_tall", "emit_tall_dispatch",
           "takes_tall"]

"""Tiled shared-memory GEMM kernel with register blocking and a fused epilogue (float32;
float64 and integers with scalar loads).

    C[z, m, n] = epilogue( sum_k A[z, m, k] * B[z, k, n] )     (NumPy matmul, batched)
      grid  = (ceil(N/BN), ceil(M/BM), batch)      block = (BM/TM)·(BN/TN) threads
      A, B: any strides (transposes are read in place), batch dims broadcast
          │
          │ prologue: tile 0 of A, B  global → registers → shared stage 0;  acc = 0
          │ for t in range(ceil(K/BK)):                     (uniform loop)
          │     registers ← tile t+1 of A, B (global, clamped + zero-filled edges)
          │     for kk in range(BK):                      (unrolled)
          │         a[TM] ← As[t%2][kk][rows]   b[TN] ← Bs[t%2][kk][cols]   (16-byte
          │         acc[TM][TN] += a ⊗ b                                    loads)
          │     shared stage (t+1)%2 ← registers;  barrier
          │ epilogue: per 4 columns (or per element): root tree at (z, m, n) with the
          │ matmul leaf = acc, one 16-byte store; edges masked
          ▼
    shared: As[2][BK][BM+pad] (A transposed: k-major), Bs[2][BK][BN+pad]

A thread owns TM×TN outputs in 4×4 sub-blocks spread BM/(TM/4) rows and
BN/(TN/4) columns apart, so its shared-memory reads are 16-byte vectors and a
warp's reads hit distinct banks.  Global tile loads are 16-byte vectors along
the operand's contiguous dim when its extent and the other strides are
multiples of 4 (buffers are 256-byte aligned), else scalar; a tile that is
transposed on its way to shared memory gets a 4-float row pad (no bank
conflicts).  Double buffering needs one barrier per K tile: the stage written
in step t was last read in step t-1, before that step's barrier.

Configs (BM, BN, BK, TM, TN): 128×128×8 with 8×8 per thread (256 threads) when
the grid has at least 128 such tiles, else 64×64×8 / 4×4 (256 threads), else
32×32×8 / 4×4 (64 threads).
"""
from __future__ import annotations

import llvmlite.ir as ir

from rlxc.dialect.types import broadcast_shapes, dtype_of, numel, shape_of

from rlxc.lowering.gpu import expr as E
from rlxc.lowering.gpu import mathlib as gpu_math
from rlxc.lowering.gpu.plan import op_of
from rlxc.lowering.gpu.simt import c32

F32 = ir.FloatType()
V4 = ir.VectorType(F32, 4)
# element types: float32 takes 16-byte vector loads; float64 and the integers (8 and 4
# bytes, e.g. an f64 attention's expansion, an i32 index product) scalar ones, and
# multiply-adds instead of FMAs for the integers
ELEM = {"f32": F32, "f64": ir.DoubleType(), "i32": ir.IntType(32), "i64": ir.IntType(64)}

CONFIGS = {"L": (128, 128, 8, 8, 8), "M": (64, 64, 8, 4, 4), "S": (32, 32, 8, 4, 4)}


def _cdiv(a, b):
    return -(-a // b)


def choose_config(M: int, N: int, batch: int) -> str:
    if _cdiv(M, 128) * _cdiv(N, 128) * batch >= 128:
        return "L"
    if _cdiv(M, 64) * _cdiv(N, 64) * batch >= 64:
        return "M"
    return "S"


def operand_layout(v):
    """(base value, strides of v's dims in elements of the base's contiguous buffer):
    a chain of transposes over a materialized value is read in place."""
    perm = list(range(len(shape_of(v.type))))
    while op_of(v) is not None and op_of(v).name in ("rlx.transpose", "rlx.stop_gradient"):
        op = op_of(v)
        if op.name == "rlx.transpose":
            p = op.params()["perm"]
            perm = [p[i] for i in perm]
        v = op.operands[0]
    base_strides = E.strides(shape_of(v.type))
    return v, [base_strides[p] for p in perm]


class _Operand:
    """One matmul operand as a tile source: element (x, k) of batch z at
    off(z) + x*sx + k*sk, with x = m (A) or n (B)."""

    def __init__(self, v, is_a: bool, out_batch):
        self.base, st = operand_layout(v)
        shp = shape_of(v.type)
        self.X = shp[-2] if is_a else shp[-1]
        self.K = shp[-1] if is_a else shp[-2]
        self.sx = st[-2] if is_a else st[-1]
        self.sk = st[-1] if is_a else st[-2]
        nb, rb = len(out_batch), len(shp) - 2
        # per output batch dim: this operand's stride (0 when broadcast)
        self.batch_strides = [0] * nb
        for j in range(rb):
            if shp[j] != 1:
                self.batch_strides[j + nb - rb] = st[j]

    def vector_mode(self, BX, BK, vectors=True):
        """'k' or 'x' (the dim threads/vectors run along) and the vector width (1 without
        `vectors`: not float32)."""
        others = [s for s in self.batch_strides if s]
        if self.sk == 1 and self.K > 1:
            ok = vectors and self.K % 4 == 0 and self.sx % 4 == 0 and BK % 4 == 0
            return "k", 4 if ok and all(s % 4 == 0 for s in others) else 1
        if self.sx == 1:
            ok = vectors and self.X % 4 == 0 and self.sk % 4 == 0 and BX % 4 == 0
            return "x", 4 if ok and all(s % 4 == 0 for s in others) else 1
        return "x", 1


def gen_matmul(mod, plan, k, target, setup, make_launch):
    op = k.heavy
    a_v, b_v = op.operands
    out = op.results[0]
    dt = dtype_of(out.type)
    if dt not in ELEM:
        raise NotImplementedError(f"GPU lowering: rlx.matmul on {dt} (f32, f64, i32, i64)")
    ET, f32 = ELEM[dt], dt == "f32"
    zero = ir.Constant(ET, 0.0 if dt[0] == "f" else 0)
    sa, sb = shape_of(a_v.type), shape_of(b_v.type)
    M, K, N = sa[-2], sa[-1], sb[-1]
    bs = broadcast_shapes(sa[:-2], sb[:-2])
    batch = numel(bs)
    if batch > 65535:
        raise NotImplementedError(f"GPU lowering: rlx.matmul with {batch} batch entries "
                                  "(grid.z is at most 65535)")
    dyn = getattr(plan, "dims", None) is not None   # size-generic (dynplan.py): M, N,
    # K and batch may be sizes; the tile config must not depend on them
    cfg = "M" if dyn else choose_config(M, N, batch)
    if not f32 and cfg == "L":
        cfg = "M"    # 8x8 accumulators of 8 bytes would spill
    BM, BN, BK, TM, TN = CONFIGS[cfg]
    threads = (BM // TM) * (BN // TN)
    A, B = _Operand(a_v, True, bs), _Operand(b_v, False, bs)
    if dyn:
        from rlxc.lowering.gpu.kernels import GridDim

        grid = (GridDim(N, BN, 2 ** 31 - 1, True), GridDim(M, BM, 65535, True),
                GridDim(batch, 1, 65535, True))
    else:
        grid = (_cdiv(N, BN), _cdiv(M, BM), batch)
    sm, ctx, ids = setup(mod, plan, k, target, threads, grid,
                         [k.root, A.base, B.base] + k.reads,
                         min_blocks_per_sm=0)   # 2 would cap at 128 registers: spills
    it = ctx.itype
    c = ctx.const
    root = k.root

    modeA, vwA = A.vector_mode(BM, BK, f32)
    modeB, vwB = B.vector_mode(BN, BK, f32)
    LDA = BM + (4 if modeA == "k" else 0)
    LDB = BN + (4 if modeB == "k" else 0)
    As = sm.shared(ET, 2 * BK * LDA, "As")
    Bs = sm.shared(ET, 2 * BK * LDB, "Bs")

    def ext(v):
        return sm.b.zext(v, it) if it.width > 32 else v

    def batch_offset(opnd):
        """Uniform: element offset of batch entry ctaid.z in this operand."""
        b = sm.b
        if batch == 1 or not any(opnd.batch_strides):
            return c(0)
        z = ext(sm.ctaid(2))
        zi = E.Index(ctx, bs, linear=z)
        acc = c(0)
        for j, s in enumerate(opnd.batch_strides):
            if s:
                acc = b.add(acc, b.mul(zi.dim(j), c(s)))
        return acc

    def loads_per_thread(BX, vw):
        nvec = BX * BK // vw
        return nvec, _cdiv(nvec, threads)

    nA, cntA = loads_per_thread(BM, vwA)
    nB, cntB = loads_per_thread(BN, vwB)
    regA = [sm.reg(V4 if vwA == 4 else ET, f"pa{j}") for j in range(cntA)]
    regB = [sm.reg(V4 if vwB == 4 else ET, f"pb{j}") for j in range(cntB)]
    acc = [[sm.reg(ET, f"acc{i}_{j}") for j in range(TN)] for i in range(TM)]

    def tile_coords(j, nvec, BX, mode, vw):
        """(x_local, k_local, valid-thread predicate or None) of this thread's j-th vector."""
        b = sm.b
        v = b.add(sm.tid(), c32(j * threads))
        pred = b.icmp_unsigned("<", v, c32(nvec)) if nvec % threads and \
            (j + 1) * threads > nvec else None
        if mode == "k":
            per = BK // vw
            return b.udiv(v, c32(per)), b.mul(b.urem(v, c32(per)), c32(vw)), pred
        per = BX // vw
        return b.mul(b.urem(v, c32(per)), c32(vw)), b.udiv(v, c32(per)), pred

    def global_load(opnd, regs, cnt, nvec, BX, mode, vw, x0, t):
        """regs ← tile t of the operand (zero outside the matrix)."""
        b = sm.b
        boff = batch_offset(opnd)
        ptr = ctx.pointer(opnd.base)
        for j in range(cnt):
            xl, kl, pred = tile_coords(j, nvec, BX, mode, vw)
            gx = b.add(x0, ext(xl))
            gk = b.add(b.mul(ext(t), c(BK)), ext(kl))
            ok = b.and_(b.icmp_unsigned("<", gx, c(opnd.X)), b.icmp_unsigned("<", gk, c(opnd.K)))
            if pred is not None:
                ok = b.and_(ok, pred)
            off = b.add(boff, b.add(b.mul(gx, c(opnd.sx)), b.mul(gk, c(opnd.sk))))
            off = b.select(ok, off, c(0))
            p = b.gep(ptr, [E.gep_index(ctx, off)], source_etype=ET)
            if vw == 4:
                val = b.load(p, typ=V4, align=16)
                val = b.select(ok, val, ir.Constant(V4, [0.0] * 4))
            else:
                val = b.load(p, typ=ET)
                val = b.select(ok, val, zero)
            sm.set(regs[j], val)

    def shared_store(S, LD, regs, cnt, nvec, BX, mode, vw, stage):
        b = sm.b
        base = b.mul(stage, c32(BK * LD))
        for j in range(cnt):
            xl, kl, pred = tile_coords(j, nvec, BX, mode, vw)
            val = sm.get(regs[j])

            def put():
                if vw == 4 and mode == "x":
                    p = b.gep(S, [b.add(base, b.add(b.mul(kl, c32(LD)), xl))], source_etype=ET)
                    b.store(val, p, align=16)
                    return
                for e in range(vw):
                    x = val if vw == 1 else b.extract_element(val, c32(e))
                    xe, ke = (xl, b.add(kl, c32(e))) if mode == "k" else (b.add(xl, c32(e)), kl)
                    if vw == 1:
                        xe, ke = xl, kl
                    p = b.gep(S, [b.add(base, b.add(b.mul(ke, c32(LD)), xe))], source_etype=ET)
                    b.store(x, p)
            if pred is not None:
                with b.if_then(pred):
                    put()
            else:
                put()

    def block_x0(axis, BX):
        return b_mul_ext(sm.ctaid(axis), BX)

    def b_mul_ext(v, s):
        return sm.b.mul(ext(v), c(s))

    nt = nk = _cdiv(K, BK)
    if dyn and nt > 0:   # K tiles of this call: ceil(K / BK) from K (a size)
        from rlxc.lowering.gpu.kernels import at_entry

        nt = at_entry(sm, lambda b: b.udiv(b.add(c32(K), c32(BK - 1)), c32(BK)))
    tx_n = BN // TN
    gm, gn = TM // 4, TN // 4

    def rows_cols():
        b = sm.b
        tid = sm.tid()
        tx = b.urem(tid, c32(tx_n))
        ty = b.udiv(tid, c32(tx_n))
        rows = [b.add(c32(g * (BM // gm)), b.mul(ty, c32(4))) for g in range(gm)]
        cols = [b.add(c32(g * (BN // gn)), b.mul(tx, c32(4))) for g in range(gn)]
        return rows, cols

    # ---- prologue
    for row in acc:
        for r in row:
            sm.set(r, zero)
    if nk > 0:
        global_load(A, regA, cntA, nA, BM, modeA, vwA, block_x0(1, BM), c32(0))
        global_load(B, regB, cntB, nB, BN, modeB, vwB, block_x0(0, BN), c32(0))
        shared_store(As, LDA, regA, cntA, nA, BM, modeA, vwA, c32(0))
        shared_store(Bs, LDB, regB, cntB, nB, BN, modeB, vwB, c32(0))
    sm.barrier()

    # ---- main loop
    if nk > 0:
        with sm.uniform_loop(nt, "kt") as t:
            b = sm.b
            nxt = b.add(t, c32(1))
            more = b.icmp_signed("<", nxt, c32(nt) if isinstance(nt, int) else nt)
            with b.if_then(more):
                global_load(A, regA, cntA, nA, BM, modeA, vwA, block_x0(1, BM), nxt)
                global_load(B, regB, cntB, nB, BN, modeB, vwB, block_x0(0, BN), nxt)
            stage = b.and_(t, c32(1))
            abase = b.mul(stage, c32(BK * LDA))
            bbase = b.mul(stage, c32(BK * LDB))
            rows, cols = rows_cols()
            accv = [[sm.get(r) for r in row] for row in acc]
            def four(S, i):
                """Elements i..i+3 of shared array S: one 16-byte load for float32."""
                p = b.gep(S, [i], source_etype=ET)
                if f32:
                    vec = b.load(p, typ=V4, align=16)
                    return [b.extract_element(vec, c32(e)) for e in range(4)]
                return [b.load(b.gep(S, [b.add(i, c32(e))], source_etype=ET), typ=ET)
                        for e in range(4)]

            for kk in range(BK):
                av, bv = [], []
                for g in range(gm):
                    av += four(As, b.add(abase, b.add(c32(kk * LDA), rows[g])))
                for g in range(gn):
                    bv += four(Bs, b.add(bbase, b.add(c32(kk * LDB), cols[g])))
                for i in range(TM):
                    for j in range(TN):
                        if dt[0] == "f":
                            accv[i][j] = gpu_math.intrinsic(b, f"llvm.fma.{dt}", ET,
                                                              [av[i], bv[j], accv[i][j]])
                        else:   # integers wrap, as the CPU's and the interpreter's
                            accv[i][j] = b.add(b.mul(av[i], bv[j]), accv[i][j])
            for i in range(TM):
                for j in range(TN):
                    sm.set(acc[i][j], accv[i][j])
            nstage = b.xor(stage, c32(1))
            with b.if_then(more):
                shared_store(As, LDA, regA, cntA, nA, BM, modeA, vwA, nstage)
                shared_store(Bs, LDB, regB, cntB, nB, BN, modeB, vwB, nstage)
            sm.barrier()

    # ---- epilogue
    b = sm.b
    rows, cols = rows_cols()
    y0 = block_x0(1, BM)
    x0 = block_x0(0, BN)
    oshape = shape_of(root.type)
    zdims = []
    if bs:
        zi = E.Index(ctx, bs, linear=ext(sm.ctaid(2)))
        zdims = [zi.dim(j) for j in range(len(bs))]
    lanes = 4 if (f32 and N % 4 == 0 and E.vectorizable(plan, root, hooks={out})) else 1
    for g in range(gm):
        for i in range(4):
            ri = g * 4 + i
            row = b.add(y0, ext(b.add(rows[g], c32(i))))
            rok = b.icmp_unsigned("<", row, c(M))
            for h in range(gn):
                for j0 in range(0, 4, lanes):
                    cj = h * 4 + j0
                    col = b.add(x0, ext(b.add(cols[h], c32(j0))))
                    ok = b.and_(rok, b.icmp_unsigned("<", col, c(N)))
                    with b.if_then(ok):
                        vals = [sm.get(acc[ri][cj + e]) for e in range(lanes)]
                        ctx.memo = {}
                        ctx.hooks = {out: (lambda vs: (lambda idx: vs))(vals)}
                        idx = E.Index(ctx, oshape, dims=zdims + [row, col], lanes=lanes)
                        E.store(ctx, root, idx, E.value(ctx, root, idx, root=True))
    sm.finish()
    launch = make_launch(k, sm, ids)
    launch["config"] = [BM, BN, BK, TM, TN]
    return [launch]

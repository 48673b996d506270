"""Fused GPU attention forward (flash-style): rlx.attention -> one kernel, online softmax.

    rlx.attention(q, k, v [, mask]) {scale, softcap, kind, window}   f32|f64, 1 <= D <= 256
          │ kernels.build_kernels keeps the op (expand_module(keep=covers)); plan.py gives
          │ it a kernel of kind "attention" and buffers to its operands' bases (the kernel
          │ reads q, k, v, mask through views: a head transpose costs no copy)
          ▼
    grid = B*H*ceil(Sq/BQ) CTAs (one per (b, h, block of BQ query rows); late query
    blocks first: causal rows differ in cost), block = BQ/RPT*TPR threads: TPR threads
    share RPT query rows (BQ/RPT apart); thread t: keys t, t+TPR, ... of a tile and
    W-column chunks t, t+TPR, ... of O (W = 16 bytes of elements when D allows, else 1),
    for each of its rows, so one K or V element read from shared memory feeds RPT FMAs
        Qs ← q[b, h, q0:q0+BQ, :]                     (rows clamped to Sq - 1)
        m = -inf, l = 0, O[D/TPR] = 0                   (registers)
        for tile in [lo, hi):    only the key tiles the causal/sliding rule lets the
                                 block's rows see (uniform: the bounds come from ctaid)
            Ks, Vs ← k, v[b, h, tile*BK : +BK, :]       (keys >= Sk: zeros)   barrier
            s[u] = scale * Qs[r] . Ks[t + TPR*u]        (BK/TPR scores per thread)
            s = softcap * tanh(s / softcap);  s = allowed ? s : -inf
            mt = max over the row's TPR lanes (shfl.bfly);  mnew = max(m, mt)
            mref = mnew == -inf ? 0 : mnew;  p = exp(s - mref);  alpha = exp(m - mref)
            Ps[r][j] = p;  l = l*alpha + (sum of p over the row's lanes);  O *= alpha
            barrier;  O[chunk] += sum_j Ps[r][j] * Vs[j][chunk];  barrier
        out[b, h, q0 + r, chunk] = O[chunk] / (l == 0 ? 1 : l)  (fully masked row: zeros)

Scores exist only as BQ x BK tiles (registers and Ps); no (Sq, Sk) buffer exists.
Shared memory: Qs[BQ][D+W], Ks[BK][D+W] (the pads spread a warp's rows over the
banks and keep rows 16-byte aligned), Vs[BK][D], Ps[BQ][BK+W]; the dot products and
P V read W elements per 16-byte load.  (BQ, BK) is the first of CONFIGS that fits
SMEM_LIMIT (static shared memory).  NaN: a NaN score is skipped by the max but
reaches p, l and O, so its row is NaN (as the reference); a masked NaN score is
-inf; a NaN in v reaches the rows of the tiles that load it (0 * NaN), never those
of skipped tiles.  The butterfly shuffles give every lane of a row the same m and l
(fadd is commutative), so the TPR lanes agree without a broadcast.  f64 runs the
same code in double (64-bit shuffles as two 32-bit ones).  Shapes outside `covers`
(D = 0 or > 256, Sk = 0, symbolic sizes) keep dialect/attention.py's expansion
(matmul, softmax, matmul), as on the CPU.
"""
from __future__ import annotations

import math

import llvmlite.ir as ir

from rlxc.dialect.types import dtype_of, numel, shape_of
from rlxc.lowering.gpu import expr as E
from rlxc.lowering.gpu import mathlib as gpu_math
from rlxc.lowering.gpu.simt import c32

F32 = ir.FloatType()
TYPES = {"f32": (F32, 4), "f64": (ir.DoubleType(), 8)}     # register type, bytes

ENABLED = True        # tests switch the kernel off to compare with the expansion
TPR = 8               # threads per query row
MAX_D = 256
SMEM_LIMIT = 46 * 1024          # static shared memory of one CTA (48 KiB is the cap)
CONFIGS = ((64, 32), (32, 32), (32, 16), (16, 16), (8, 16), (8, 8))   # (BQ, BK): first fit


def _cdiv(a, b):
    return -(-a // b)


def width(D: int, esz: int = 4) -> int:
    """Shared-memory vector width: 16-byte loads along D when D is a multiple of it."""
    w = 16 // esz
    return w if D % w == 0 else 1


def smem_bytes(BQ: int, BK: int, D: int, esz: int = 4) -> int:
    pad = width(D, esz)
    return esz * (BQ * (D + pad) + BK * (D + pad) + BK * D + BQ * (BK + pad))


def config(Sq: int, D: int, esz: int = 4):
    """(BQ, BK, RPT) for q rows Sq and head dim D, or None when no tile fits shared
    memory.  A short sequence gets fewer rows per CTA (at least 4: one warp); a CTA of
    16 rows or more gives each thread RPT = 2 rows (each K/V element read from shared
    memory feeds two rows' FMAs)."""
    for BQ, BK in CONFIGS:
        if smem_bytes(BQ, BK, D, esz) <= SMEM_LIMIT:
            while BQ > 4 and BQ // 2 >= Sq:
                BQ //= 2
            return BQ, BK, (2 if BQ >= 16 else 1)
    return None


def covers(op) -> bool:
    """Does the fused GPU kernel compute this rlx.attention (else: the expansion)?  The
    fused backward's ops (rlx.attention_lse, rlx.attention_bwd) are always expanded here."""
    if op.name != "rlx.attention":
        return False
    q, k = (shape_of(o.type) for o in op.operands[:2])
    if any(isinstance(d, str) for d in q + k):     # symbolic: the GPU runs specialized sizes
        return False
    dt = dtype_of(op.operands[0].type)
    cfg = config(q[2], q[3], TYPES[dt][1]) if dt in TYPES and q[3] >= 1 else None
    return (ENABLED and cfg is not None and q[3] <= MAX_D and k[2] >= 1 and q[2] >= 1
            and numel(q) > 0 and q[0] * q[1] * -(-q[2] // cfg[0]) < 2 ** 31)   # grid.x


def _fmax(b, x, y):
    """x > y ? x : y (a NaN x yields y: NaN scores reach the output through p instead)."""
    return b.select(b.fcmp_ordered(">", x, y), x, y)


def gen_attention(mod, plan, k, target, setup, make_launch):
    op = k.heavy
    p = op.params()
    q, kv, vv = op.operands[:3]
    mask = op.operands[3] if p["kind"] == "tensor" else None
    B, H, Sq, D = shape_of(q.type)
    Sk = shape_of(kv.type)[2]
    kind, window = p["kind"], int(p["window"])
    scale, softcap = float(p["scale"]), float(p["softcap"] or 0.0)
    T, esz = TYPES[dtype_of(q.type)]
    fma = f"llvm.fma.{'f32' if esz == 4 else 'f64'}"
    BQ, BK, RPT = config(Sq, D, esz)
    G = BQ // RPT                             # thread rows: thread row g has rows g + G*k
    nqb, nt = _cdiv(Sq, BQ), _cdiv(Sk, BK)
    threads = G * TPR
    W = width(D, esz)
    SPT, NCH = BK // TPR, _cdiv(D, W * TPR)   # scores / W-column chunks of O per thread
    root = k.root
    values = [root, q, kv, vv] + ([mask] if mask is not None else []) + k.reads
    sm, ctx, ids = setup(mod, plan, k, target, threads, (B * H * nqb,), values)
    it = ctx.itype
    c = ctx.const
    LDQ, LDK, LDV, LDP = D + W, D + W, D, BK + W      # pads: rows on distinct banks
    Qs = sm.shared(T, BQ * LDQ, "Qs")
    Ks = sm.shared(T, BK * LDK, "Ks")
    Vs = sm.shared(T, BK * LDV, "Vs")
    Ps = sm.shared(T, BQ * LDP, "Ps")
    NEG = ir.Constant(T, -math.inf)
    ZERO = ir.Constant(T, 0.0)
    qshape, kshape = shape_of(q.type), shape_of(kv.type)

    def ext(x):
        return sm.b.zext(x, it) if it.width > 32 else x

    def block(b):
        """(b index, h index) as itype, q0 as i32: this CTA's (batch, head, first row)."""
        x = sm.ctaid(0)
        qb = b.sub(c32(nqb - 1), b.urem(x, c32(nqb)))
        bh = b.udiv(x, c32(nqb))
        return ext(b.udiv(bh, c32(H))), ext(b.urem(bh, c32(H))), b.mul(qb, c32(BQ))

    def imin(b, x, y):
        return b.select(b.icmp_signed("<", x, y), x, y)

    def thread_rows(b):
        """(t, local rows, clamped global rows) of this thread (i32): RPT rows, G apart."""
        tid = sm.tid()
        g, t = b.udiv(tid, c32(TPR)), b.urem(tid, c32(TPR))
        _, _, q0 = block(b)
        rs = [b.add(g, c32(G * kk)) for kk in range(RPT)]
        return t, rs, [imin(b, b.add(q0, r), c32(Sq - 1)) for r in rs]

    def sld(base, off):
        return sm.b.load(sm.b.gep(base, [off], source_etype=T), typ=T)

    def vld(base, off, w):
        """w elements at base[off:off+w] (one 16-byte load when w > 1)."""
        b = sm.b
        if w == 1:
            return [sld(base, off)]
        vec = b.load(b.gep(base, [off], source_etype=T), typ=ir.VectorType(T, w), align=16)
        return [b.extract_element(vec, c32(e)) for e in range(w)]

    def sst(base, off, x):
        sm.b.store(x, sm.b.gep(base, [off], source_etype=T))

    def coop(n, body):
        """Every element e < n of a tile, spread over the block's threads: body(e)."""
        b = sm.b
        for u in range(_cdiv(n, threads)):
            e = b.add(sm.tid(), c32(u * threads))
            if (u + 1) * threads > n:
                with b.if_then(b.icmp_unsigned("<", e, c32(n))):
                    body(e)
            else:
                body(e)

    def vst(base, off, xs):
        """xs to base[off:off+len(xs)] (one 16-byte store when several)."""
        b = sm.b
        if len(xs) == 1:
            return sst(base, off, xs[0])
        vec = ir.Constant(ir.VectorType(T, len(xs)), ir.Undefined)
        for e, x in enumerate(xs):
            vec = b.insert_element(vec, x, c32(e))
        b.store(vec, b.gep(base, [off], source_etype=T), align=16)

    def load(v, shp, dims, lanes=1):
        ctx.memo = {}
        return E.value(ctx, v, E.Index(ctx, shp, dims=dims, lanes=lanes))

    def lanes_of(*vs):
        """Global loads of W consecutive d per thread when every operand is a buffer of
        its own (row-major: its rows are 16-byte aligned); through a view, one."""
        return W if all(v in plan.materialized for v in vs) else 1

    # ---- the query tile
    GQ = lanes_of(q)

    def put_q(e):
        b = sm.b
        bi, hi, q0 = block(b)
        r, d = b.udiv(e, c32(D // GQ)), b.mul(b.urem(e, c32(D // GQ)), c32(GQ))
        row = imin(b, b.add(q0, r), c32(Sq - 1))
        vst(Qs, b.add(b.mul(r, c32(LDQ)), d), load(q, qshape, [bi, hi, ext(row), ext(d)], GQ))
    coop(BQ * D // GQ, put_q)

    R = range(RPT)
    tmp = sm.reg(T, "tmp")
    m_r = [sm.reg(T, f"m{kk}", NEG) for kk in R]
    l_r = [sm.reg(T, f"l{kk}", ZERO) for kk in R]
    alpha_r = [sm.reg(T, f"alpha{kk}") for kk in R]
    s_r = [[sm.reg(T, f"s{kk}_{u}") for u in range(SPT)] for kk in R]
    o_r = [[[sm.reg(T, f"o{kk}_{i}_{e}", ZERO) for e in range(W)] for i in range(NCH)]
           for kk in R]

    def bounds(b):
        """[lo, hi) key tiles any row of this CTA may attend (uniform)."""
        _, _, q0 = block(b)
        lo, hi = c32(0), c32(nt)
        if kind in ("causal", "sliding"):
            last = imin(b, b.add(q0, c32(BQ - 1)), c32(Sq - 1))        # keys <= last row
            hi = imin(b, b.udiv(b.add(last, c32(BK)), c32(BK)), c32(nt))
        if kind == "sliding":                                          # keys > q0 - window
            first = b.sub(q0, c32(window - 1))
            first = b.select(b.icmp_signed("<", first, c32(0)), c32(0), first)
            lo = imin(b, b.udiv(first, c32(BK)), hi)
        return lo, hi

    def shuffle(reg, fn):
        for off in [TPR >> i for i in range(1, TPR.bit_length())]:
            sm.shfl_xor(reg, off, tmp)
            sm.set(reg, fn(sm.b, sm.get(reg), sm.get(tmp)))

    GKV = lanes_of(kv, vv)
    with sm.uniform_range(bounds, "kt") as kt:
        # ---- K, V tiles (keys past Sk read as zeros)
        def put_kv(e):
            b = sm.b
            bi, hi, _ = block(b)
            j, d = b.udiv(e, c32(D // GKV)), b.mul(b.urem(e, c32(D // GKV)), c32(GKV))
            key = b.add(b.mul(kt, c32(BK)), j)
            ok = b.icmp_signed("<", key, c32(Sk))
            dims = [bi, hi, ext(imin(b, key, c32(Sk - 1))), ext(d)]
            kx, vx = load(kv, kshape, dims, GKV), load(vv, kshape, dims, GKV)
            vst(Ks, b.add(b.mul(j, c32(LDK)), d), [b.select(ok, x, ZERO) for x in kx])
            vst(Vs, b.add(b.mul(j, c32(LDV)), d), [b.select(ok, x, ZERO) for x in vx])
        coop(BK * D // GKV, put_kv)
        sm.barrier()

        # ---- scores of this thread's keys for its rows, masked; each row's tile max
        b = sm.b
        t, rs, rows = thread_rows(b)
        qbase = [b.mul(r, c32(LDQ)) for r in rs]
        js = [b.add(t, c32(TPR * u)) for u in range(SPT)]
        acc = [[ZERO] * SPT for kk in R]
        kbase = [b.mul(j, c32(LDK)) for j in js]
        for d0 in range(0, D, W):
            qd = [vld(Qs, b.add(qb, c32(d0)), W) for qb in qbase]
            for u in range(SPT):
                kd = vld(Ks, b.add(kbase[u], c32(d0)), W)
                for kk in R:
                    for e in range(W):
                        acc[kk][u] = gpu_math.intrinsic(b, fma, T, [qd[kk][e], kd[e], acc[kk][u]])
        bi, hi, _ = block(b)
        for kk in R:
            mx = NEG
            for u in range(SPT):
                s = b.fmul(acc[kk][u], ir.Constant(T, scale))
                if softcap:
                    s = b.fmul(gpu_math.emit(b, "tanh", b.fmul(s, ir.Constant(T, 1.0 / softcap))),
                               ir.Constant(T, softcap))
                key = b.add(b.mul(kt, c32(BK)), js[u])
                ok = b.icmp_signed("<", key, c32(Sk))
                if kind in ("causal", "sliding"):
                    dlt = b.sub(rows[kk], key)
                    ok = b.and_(ok, b.icmp_signed(">=", dlt, c32(0)))
                    if kind == "sliding":
                        ok = b.and_(ok, b.icmp_signed("<", dlt, c32(window)))
                elif kind == "tensor":
                    ms = shape_of(mask.type)
                    (mv,) = load(mask, ms, [bi, hi, ext(rows[kk]),
                                            ext(imin(b, key, c32(Sk - 1)))])
                    ok = b.and_(ok, mv)
                s = b.select(ok, s, NEG)
                sm.set(s_r[kk][u], s)
                mx = _fmax(b, s, mx)
            sm.set(alpha_r[kk], mx)    # the tile max, reduced over the row's lanes
        for kk in R:
            shuffle(alpha_r[kk], _fmax)

        # ---- online softmax update; p to Ps
        b = sm.b
        t, rs, _ = thread_rows(b)
        for kk in R:
            mold = sm.get(m_r[kk])
            mnew = _fmax(b, sm.get(alpha_r[kk]), mold)
            mref = b.select(b.fcmp_ordered("==", mnew, NEG), ZERO, mnew)
            alpha = gpu_math.emit(b, "exp", b.fsub(mold, mref))
            psum = ZERO
            for u in range(SPT):
                pu = gpu_math.emit(b, "exp", b.fsub(sm.get(s_r[kk][u]), mref))
                sst(Ps, b.add(b.mul(rs[kk], c32(LDP)), b.add(t, c32(TPR * u))), pu)
                psum = b.fadd(psum, pu)
            sm.set(m_r[kk], mnew)
            sm.set(alpha_r[kk], alpha)
            sm.set(s_r[kk][0], psum)   # (the scores are spent: s0 carries the row sum)
        for kk in R:
            shuffle(s_r[kk][0], lambda b, x, y: b.fadd(x, y))
        b = sm.b
        for kk in R:
            sm.set(l_r[kk], b.fadd(b.fmul(sm.get(l_r[kk]), sm.get(alpha_r[kk])),
                                   sm.get(s_r[kk][0])))
        sm.barrier()

        # ---- O = O * alpha + P V over this thread's columns, for each of its rows
        b = sm.b
        t, rs, _ = thread_rows(b)
        o = [[[b.fmul(sm.get(x), sm.get(alpha_r[kk])) for x in ch] for ch in o_r[kk]]
             for kk in R]
        cols = [b.mul(imin(b, b.add(t, c32(TPR * i)), c32(D // W - 1)), c32(W))
                for i in range(NCH)]
        pbase = [b.mul(r, c32(LDP)) for r in rs]
        for j0 in range(0, BK, W):
            pj = [vld(Ps, b.add(pb, c32(j0)), W) for pb in pbase]
            for e in range(W):
                for i in range(NCH):
                    vj = vld(Vs, b.add(c32((j0 + e) * LDV), cols[i]), W)
                    for kk in R:
                        for x in range(W):
                            o[kk][i][x] = gpu_math.intrinsic(b, fma, T,
                                                             [pj[kk][e], vj[x], o[kk][i][x]])
        for kk in R:
            for i in range(NCH):
                for x in range(W):
                    sm.set(o_r[kk][i][x], o[kk][i][x])
        sm.barrier()                   # the next tile rewrites Ks, Vs, Ps

    # ---- out = O / l (l == 0: a fully masked row, zeros)
    b = sm.b
    t, rs, _ = thread_rows(b)
    bi, hi, q0 = block(b)
    oshape = shape_of(root.type)
    for kk in R:
        row = b.add(q0, rs[kk])
        lv = sm.get(l_r[kk])
        den = b.select(b.fcmp_ordered("==", lv, ZERO), ir.Constant(T, 1.0), lv)
        for i in range(NCH):
            chunk = b.add(t, c32(TPR * i))
            ok = b.icmp_signed("<", row, c32(Sq))
            if (i + 1) * TPR > D // W:
                ok = b.and_(ok, b.icmp_signed("<", chunk, c32(D // W)))
            with b.if_then(ok):
                idx = E.Index(ctx, oshape, dims=[bi, hi, ext(row), ext(b.mul(chunk, c32(W)))],
                              lanes=W)
                E.store(ctx, root, idx, [b.fdiv(sm.get(x), den) for x in o_r[kk][i]])
    sm.finish()
    launch = make_launch(k, sm, ids)
    launch["config"] = [BQ, BK, TPR, RPT]
    return [launch]


__all__ = ["covers", "config", "gen_attention", "smem_bytes"]

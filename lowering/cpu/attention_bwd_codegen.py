"""LLVM IR of the fused CPU attention backward (attention_bwd.py's two kernels).

    AttentionDqKernel                                 AttentionDkvKernel
    void NAME.kN(q, kt, vt, k, o, dO, L, Lp, Dp,      void NAME.kN(kt, qt, dOt, v, q, dO, Lp, Dp,
                 [mask], out, i64 lo, i64 hi)                      [mask], out, i64 lo, i64 hi)
      item: bh, block of QB query rows                  item: bh, block of QB keys
        tile of R rows (clamped to Sq - 1):               tile of R keys (clamped to Sk - 1):
          Delta = dO . o, L -> Lp, Dp                       for query tile i0 (KT lanes):
          for key tile j0 (KT lanes):                         S^T = kt[key] * qt[:, i0..]
            S = q . kt, dP = dO . vt                          dP^T = v[key] * dOt[:, i0..]
            P = exp(S - L), G = P (dP - Delta)                P^T = exp(S^T - Lp), G^T likewise
            dQ += G k[j0 + c]                                 dV += P^T dO[i], dK += G^T q[i]
          dq = scale dQ                                     dk = scale dK, dv = dV

Shared with the forward (attention_codegen.py, imported): the vector helpers, the exp
for arguments <= 0 and the FMA order of the scores (so P is exactly the forward's).
Masked, padded and skipped lanes give exactly 0 (selects after the exp and after G).
"""
from __future__ import annotations

import llvmlite.ir as ir

from rlxc.lowering.cpu.attention_bwd import bwd_geometry
from rlxc.lowering.cpu.attention_codegen import (F32, I8, I32, NEG_INF, allowed, c64,
                                                 exp_nonpos, fconst, fma, fma_rows, hreduce,
                                                 kernel_function, mask_lanes, smax, smin, splat, unary,
                                                 row_block, vload, vstore, vt)
from rlxc.lowering.cpu.attention_kernel import NV, QB, geometry
from rlxc.lowering.cpu.sgemm_kernels import counted_loop


def _function(g, k, nf32):
    """The kernel function: nf32 f32 pointers, [i8 mask], f32 out, i64 lo, i64 hi."""
    return kernel_function(g, k, [F32.as_pointer()] * nf32 + ([I8.as_pointer()] if k.mask else [])
                           + [F32.as_pointer()])


def _items(b, k, lo, hi, n, body):
    """for item in [lo, hi): bh and a block of QB rows of n (early and late blocks
    alternate, as the forward's: causal blocks differ in cost); body(b, bh, r0, r1)."""
    nb = -(-n // QB)

    def item(b, c):
        body(b, *row_block(b, c, nb, n))
    counted_loop(b, lo, hi, 1, item, "item")


def _ivec(b, x, w):
    return splat(b, b.trunc(x, I32), w)


def _and(b, x, y):
    return y if x is None else (x if y is None else b.and_(x, y))


def _unless(b, skip, body):
    """body() where the i1 `skip` is false (None: always): a register tile's work, skipped
    when the causal / sliding rule masks the whole tile."""
    if skip is None:
        body()
    else:
        with b.if_then(b.not_(skip)):
            body()


def _iota(vl):
    """The lane offsets of a key / query tile: one i32 vector per score vector j."""
    return [ir.Constant(ir.VectorType(I32, vl), [j * vl + t for t in range(vl)])
            for j in range(NV)]


def _lane_ok(b, k, mask, bh, rows, lane0, iota, lanes_are_queries):
    """ok_fn(b, r, j): the live lanes of score vector j of register row rows[r] (the
    tile's lanes from lane0 + iota[j]) as an i1 vector, or None (all live): the lane in
    range, the causal / sliding rule and the tensor mask's bit.  dq's rows are query rows
    and its lanes keys; the dk/dv kernel's are the transpose (lanes_are_queries)."""
    vl = k.vl
    n = k.Sq if lanes_are_queries else k.Sk          # the lane axis's length
    lv = [b.add(_ivec(b, lane0, vl), iota[j]) for j in range(NV)]
    rv = [_ivec(b, x, vl) for x in rows]
    mbase = rstride = lstride = None
    if mask is not None:
        sb, sh, si, sj = k.mstrides
        mbase = b.add(b.mul(b.sdiv(bh, c64(k.H)), c64(sb)),
                      b.mul(b.srem(bh, c64(k.H)), c64(sh)))
        rstride, lstride = (sj, si) if lanes_are_queries else (si, sj)

    def ok_fn(b, r, j):
        ok = None
        if n % (NV * vl):
            ok = b.icmp_signed("<", lv[j], splat(b, ir.Constant(I32, n), vl))
        iv, jv = (lv[j], rv[r]) if lanes_are_queries else (rv[r], lv[j])
        ok = _and(b, ok, allowed(b, k, iv, jv))
        if mask is not None:
            ok = _and(b, ok, mask_lanes(b, k, mask, b.add(mbase, b.mul(rows[r], c64(rstride))),
                                         b.add(lane0, c64(j * vl)), lstride, n))
        return ok
    return ok_fn


def _accumulate(b, k, bh, acc, stack, local, w, src, t0, n, cn):
    """acc[r] += sum_{c < cn} w[r, c] src[bh, t0 + c] (src rows of D floats, n per bh): the
    block's accumulators of the tile's R rows, loaded from and stored back to `stack`, D in
    chunks of DC vectors (bwd_geometry; acc holds R x DC allocas)."""
    D, DW, DV = k.D, *geometry(k.D, k.vl)[:2]
    DC = len(acc[0])
    for d0 in range(0, DV, DC):
        part = [row[:min(DC, DV - d0)] for row in acc]
        _load_acc(b, part, stack, local, D, DW, d0)
        fma_rows(b, part, w, src, lambda b, c, d0=d0: b.add(
            b.add(b.mul(bh, c64(n * D)), b.mul(b.add(t0, c), c64(D))), c64(d0 * DW)),
            cn, NV * k.vl, DW)
        _store_acc(b, part, stack, local, D, DW, d0)


def _grad_tile(b, k, S, DP, lse, delta, ok_fn, P_out, G_out, masked):
    """P = exp(softcap(S) masked - L) and G = P (dP - Delta) [(1 - tanh^2)] of one R x NV
    tile; lse/delta(r, j) give the L and Delta vectors; ok_fn(r, j) the lane mask."""
    vl = k.vl
    for r in range(len(S)):
        for j in range(NV):
            s = b.load(S[r][j])
            t = None
            if k.softcap:
                t = unary(b, "tanh", b.fmul(s, fconst(vl, 1.0 / k.softcap)))
                s = b.fmul(t, fconst(vl, k.softcap))
            ok = ok_fn(b, r, j) if masked else None
            if ok is not None:
                s = b.select(ok, s, fconst(vl, NEG_INF))
            p = exp_nonpos(b, b.fsub(s, lse(r, j)), vl)
            gr = b.fmul(p, b.fsub(b.load(DP[r][j]), delta(r, j)))
            if t is not None:
                gr = b.fmul(gr, b.fsub(fconst(vl, 1.0), b.fmul(t, t)))
            if ok is not None:
                p = b.select(ok, p, fconst(vl, 0.0))
                gr = b.select(ok, gr, fconst(vl, 0.0))
            off = c64(r * NV * vl + j * vl)
            if P_out is not None:
                vstore(b, P_out, off, p, vl)
            vstore(b, G_out, off, gr, vl)


def _state(b, R, DW, DC, vl, names):
    """Register-tile allocas (SROA turns them into phis): per name R x DC accumulators of
    DW lanes ("acc": one D chunk, bwd_geometry) or R x NV score vectors."""
    out = {}
    for n in names:
        w, cnt = (DW, DC) if n.startswith("acc") else (vl, NV)
        out[n] = [[b.alloca(vt(w), name=f"{n}{r}_{d}") for d in range(cnt)] for r in range(R)]
    return out


def _dot_tiles(b, D, vl, acc, vecs, scalar):
    """acc[r][j] = sum_d scalar(b, r, d) * vecs(b, d)[j] (d ascending, one FMA each: the
    forward's order).  One loop per score tile keeps R x NV accumulators in registers."""
    _zero(b, acc, vl)

    def body(b, d):
        vs = vecs(b, d)
        for r in range(len(acc)):
            x = splat(b, scalar(b, r, d), vl)
            for j in range(NV):
                b.store(fma(b, x, vs[j], b.load(acc[r][j])), acc[r][j])
    counted_loop(b, c64(0), c64(D), 1, body, "d")


def _zero(b, tiles, w):
    for row in tiles:
        for a in row:
            b.store(fconst(w, 0.0), a)


def _stack(b, R, KT, name):
    return b.bitcast(b.alloca(ir.ArrayType(F32, R * KT), name=name), F32.as_pointer())


# ---------------------------------------------------------------- dq

def _load_acc(b, acc, base, local, D, DW, d0=0):
    """acc[r][d] = base[local[r] * D + (d0 + d) * DW] (the block's accumulators on the
    stack, vectors d0... of each row)."""
    for r, row in enumerate(acc):
        for d, a in enumerate(row):
            b.store(vload(b, base, b.add(b.mul(local[r], c64(D)), c64((d0 + d) * DW)), DW), a)


def _store_acc(b, acc, base, local, D, DW, d0=0):
    for r, row in enumerate(acc):
        for d, a in enumerate(row):
            vstore(b, base, b.add(b.mul(local[r], c64(D)), c64((d0 + d) * DW)), b.load(a), DW)


def emit_dq(g, k):
    vl, D, Sq, Sk, Skp, Sqp = k.vl, k.D, k.Sq, k.Sk, k.Skp, k.Sqp
    KT = NV * vl
    DW, DV, _ = geometry(D, vl)
    R, DC = bwd_geometry(D, vl)
    fn, b = _function(g, k, 9)
    q, kt, vt, kk, o, do, L, lp, dp = fn.args[:9]
    mask = fn.args[9] if k.mask else None
    out, lo, hi = fn.args[-3:]
    st = _state(b, R, DW, DC, vl, ["acc_dq", "s", "dp"])
    DQ, S, DPt = st["acc_dq"], st["s"], st["dp"]
    Gf = _stack(b, R, KT, "g")
    accs = _stack(b, QB, D, "dq")            # the block's dQ rows (L1-resident)
    rowL, rowD = _stack(b, 1, QB, "l"), _stack(b, 1, QB, "delta")
    iota = _iota(vl)

    def block(b, bh, r0, r1):
        def prep(b, i):   # Delta = dO . o and L of each row; padded copies; dQ = 0
            off = b.add(b.mul(bh, c64(Sq * D)), b.mul(i, c64(D)))
            acc = fconst(DW, 0.0)
            for d in range(DV):
                x = b.add(off, c64(d * DW))
                acc = fma(b, vload(b, do, x, DW), vload(b, o, x, DW), acc)
            delta = hreduce(b, acc, DW, lambda b, x, y: b.fadd(x, y))
            lv = b.load(b.gep(L, [b.add(b.mul(bh, c64(Sq)), i)], inbounds=True))
            pad = b.add(b.mul(bh, c64(Sqp)), i)
            b.store(lv, b.gep(lp, [pad], inbounds=True))
            b.store(delta, b.gep(dp, [pad], inbounds=True))
            loc = b.sub(i, r0)
            b.store(lv, b.gep(rowL, [loc], inbounds=True))
            b.store(delta, b.gep(rowD, [loc], inbounds=True))
            for d in range(DV):
                vstore(b, accs, b.add(b.mul(loc, c64(D)), c64(d * DW)), fconst(DW, 0.0), DW)
        counted_loop(b, r0, r1, 1, prep, "prep")
        kstart, kend = c64(0), c64(Sk)
        if k.kind in ("causal", "sliding"):
            kend = smin(b, r1, c64(Sk))
        if k.kind == "sliding":
            s0 = smax(b, b.sub(r0, c64(k.window - 1)), c64(0))
            kstart = b.mul(b.sdiv(s0, c64(KT)), c64(KT))
        # key tile outer, register tiles inner: a key tile's kt, vt and k rows are read
        # from L1 by every register tile of the block
        counted_loop(b, kstart, kend, KT, lambda b, j0: counted_loop(
            b, r0, r1, R, lambda b, i0: tile(b, bh, j0, i0, r0, r1), "rt"), "kt")
        obase = b.mul(bh, c64((Sq + 2 * Sk) * D))
        sc = fconst(DW, k.scale)

        def fin(b, i):
            loc = b.mul(b.sub(i, r0), c64(D))
            ob = b.add(obase, b.mul(i, c64(D)))
            for d in range(DV):
                x = vload(b, accs, b.add(loc, c64(d * DW)), DW)
                vstore(b, out, b.add(ob, c64(d * DW)), b.fmul(x, sc), DW)
        counted_loop(b, r0, r1, 1, fin, "fin")

    def tile(b, bh, j0, i0, r0, r1):
        skip = None      # the whole R x KT tile masked by the causal / sliding rule
        if k.kind in ("causal", "sliding"):
            skip = b.icmp_signed(">", j0, b.add(i0, c64(R - 1)))
        if k.kind == "sliding":
            skip = b.or_(skip, b.icmp_signed("<=", b.add(j0, c64(KT - 1)),
                                             b.sub(i0, c64(k.window))))
        _unless(b, skip, lambda: keys(b, bh, j0, i0, r0, r1))

    def keys(b, bh, j0, i0, r0, r1):
        # rows past the block (R need not divide QB) repeat its last row: same values
        rows = [smin(b, b.add(i0, c64(r)), b.sub(r1, c64(1))) for r in range(R)]
        local = [b.sub(x, r0) for x in rows]
        qrow = [b.add(b.mul(bh, c64(Sq * D)), b.mul(rows[r], c64(D))) for r in range(R)]
        Ls = [splat(b, b.load(b.gep(rowL, [x], inbounds=True)), vl) for x in local]
        Ds = [splat(b, b.load(b.gep(rowD, [x], inbounds=True)), vl) for x in local]

        def tvecs(src):
            def vecs(b, d):
                kb = b.add(b.add(b.mul(bh, c64(D * Skp)), b.mul(d, c64(Skp))), j0)
                return [vload(b, src, b.add(kb, c64(j * vl)), vl) for j in range(NV)]
            return vecs

        def rowval(src):
            return lambda b, r, d: b.load(b.gep(src, [b.add(qrow[r], d)], inbounds=True),
                                          align=4)
        _dot_tiles(b, D, vl, S, tvecs(kt), rowval(q))        # S = q . (k^T scale)
        _dot_tiles(b, D, vl, DPt, tvecs(vt), rowval(do))     # dP = dO . v^T
        ok_fn = _lane_ok(b, k, mask, bh, rows, j0, iota, False)

        def grads(masked):
            return lambda: _grad_tile(b, k, S, DPt, lambda r, j: Ls[r], lambda r, j: Ds[r],
                                      ok_fn, None, Gf, masked)
        _branch(b, k, _dq_needs_mask(b, k, j0, i0, KT), grads)
        cn = smin(b, c64(KT), b.sub(c64(Sk), j0))
        _accumulate(b, k, bh, DQ, accs, local, Gf, kk, j0, Sk, cn)   # dQ += G k[j0 + c]

    _items(b, k, lo, hi, Sq, block)
    b.ret_void()
    return fn


def _dq_needs_mask(b, k, j0, i0, KT):
    """None: always masked; False: never; an i1: per key tile (diagonal / past Sk)."""
    if k.kind in ("sliding", "tensor"):
        return None
    need = b.icmp_signed(">", b.add(j0, c64(KT)), c64(k.Sk)) if k.Sk % KT else None
    if k.kind == "causal":
        need = _or(b, need, b.icmp_signed(">", b.add(j0, c64(KT - 1)), i0))
    return False if need is None else need


def _or(b, x, y):
    return y if x is None else b.or_(x, y)


def _branch(b, k, need, emit):
    """emit(masked)() under `need` (None: always masked, False: never, else a branch)."""
    if need is None or need is False:
        emit(need is None)()
        return
    with b.if_else(need, likely=False) as (masked, plain):
        with masked:
            emit(True)()
        with plain:
            emit(False)()


# ---------------------------------------------------------------- dk, dv

def emit_dkv(g, k):
    vl, D, Sq, Sk, Skp, Sqp = k.vl, k.D, k.Sq, k.Sk, k.Skp, k.Sqp
    KT = NV * vl
    DW, DV, _ = geometry(D, vl)
    R, DC = bwd_geometry(D, vl)
    fn, b = _function(g, k, 8)
    kt, qt, dot, vv, q, do, lp, dp = fn.args[:8]
    mask = fn.args[8] if k.mask else None
    out, lo, hi = fn.args[-3:]
    st = _state(b, R, DW, DC, vl, ["acc_dk", "acc_dv", "s", "dp"])
    DK, DVa, S, DPt = st["acc_dk"], st["acc_dv"], st["s"], st["dp"]
    Pf, Gf = _stack(b, R, KT, "p"), _stack(b, R, KT, "g")
    dks, dvs = _stack(b, QB, D, "dk"), _stack(b, QB, D, "dv")   # the block's keys
    iota = _iota(vl)

    def block(b, bh, r0, r1):
        def zero(b, j):
            loc = b.mul(b.sub(j, r0), c64(D))
            for d in range(DV):
                vstore(b, dks, b.add(loc, c64(d * DW)), fconst(DW, 0.0), DW)
                vstore(b, dvs, b.add(loc, c64(d * DW)), fconst(DW, 0.0), DW)
        counted_loop(b, r0, r1, 1, zero, "zero")
        istart, iend = c64(0), c64(Sq)
        if k.kind in ("causal", "sliding"):
            istart = b.mul(b.sdiv(r0, c64(KT)), c64(KT))
        if k.kind == "sliding":
            iend = smin(b, b.add(r1, c64(k.window - 1)), c64(Sq))
        # query tile outer, register tiles of keys inner (qt, dOt, q and dO rows from L1)
        counted_loop(b, istart, iend, KT, lambda b, i0: counted_loop(
            b, r0, r1, R, lambda b, j0: tile(b, bh, i0, j0, r0, r1), "rt"), "qt")
        obase = b.mul(bh, c64((Sq + 2 * Sk) * D))
        sc = fconst(DW, k.scale)

        def fin(b, j):
            loc = b.mul(b.sub(j, r0), c64(D))
            kb = b.add(obase, b.mul(b.add(j, c64(Sq)), c64(D)))
            vb = b.add(obase, b.mul(b.add(j, c64(Sq + Sk)), c64(D)))
            for d in range(DV):
                x = vload(b, dks, b.add(loc, c64(d * DW)), DW)
                vstore(b, out, b.add(kb, c64(d * DW)), b.fmul(x, sc), DW)
                vstore(b, out, b.add(vb, c64(d * DW)),
                        vload(b, dvs, b.add(loc, c64(d * DW)), DW), DW)
        counted_loop(b, r0, r1, 1, fin, "fin")

    def tile(b, bh, i0, j0, r0, r1):
        skip = None      # every query lane of the tile sees none of its R keys
        if k.kind in ("causal", "sliding"):
            skip = b.icmp_signed("<", b.add(i0, c64(KT - 1)), j0)
        if k.kind == "sliding":
            skip = b.or_(skip, b.icmp_signed(">=", i0, b.add(j0, c64(R - 1 + k.window))))
        _unless(b, skip, lambda: queries(b, bh, i0, j0, r0, r1))

    def queries(b, bh, i0, j0, r0, r1):
        keys_ = [smin(b, b.add(j0, c64(r)), b.sub(r1, c64(1))) for r in range(R)]
        local = [b.sub(x, r0) for x in keys_]
        ktk = [b.add(b.mul(bh, c64(D * Skp)), keys_[r]) for r in range(R)]
        vrow = [b.add(b.mul(bh, c64(Sk * D)), b.mul(keys_[r], c64(D))) for r in range(R)]

        def tvecs(src):
            def vecs(b, d):
                base = b.add(b.add(b.mul(bh, c64(D * Sqp)), b.mul(d, c64(Sqp))), i0)
                return [vload(b, src, b.add(base, c64(j * vl)), vl) for j in range(NV)]
            return vecs
        # S^T = (k^T scale)[key] . q^T (the forward's products), dP^T = v[key] . dO^T
        _dot_tiles(b, D, vl, S, tvecs(qt), lambda b, r, d: b.load(
            b.gep(kt, [b.add(ktk[r], b.mul(d, c64(Skp)))], inbounds=True), align=4))
        _dot_tiles(b, D, vl, DPt, tvecs(dot), lambda b, r, d: b.load(
            b.gep(vv, [b.add(vrow[r], d)], inbounds=True), align=4))
        pb = b.add(b.mul(bh, c64(Sqp)), i0)
        Lv = [vload(b, lp, b.add(pb, c64(j * vl)), vl) for j in range(NV)]
        Dv = [vload(b, dp, b.add(pb, c64(j * vl)), vl) for j in range(NV)]
        ok_fn = _lane_ok(b, k, mask, bh, keys_, i0, iota, True)

        def grads(masked):
            return lambda: _grad_tile(b, k, S, DPt, lambda r, j: Lv[j], lambda r, j: Dv[j],
                                      ok_fn, Pf, Gf, masked)
        if k.kind in ("sliding", "tensor"):
            need = None
        else:
            need = b.icmp_signed(">", b.add(i0, c64(KT)), c64(Sq)) if Sq % KT else None
            if k.kind == "causal":   # some query lane < the tile's last key
                need = _or(b, need, b.icmp_signed("<", i0, b.add(j0, c64(R - 1))))
            need = False if need is None else need
        _branch(b, k, need, grads)
        cn = smin(b, c64(KT), b.sub(c64(Sq), i0))
        _accumulate(b, k, bh, DVa, dvs, local, Pf, do, i0, Sq, cn)   # dV += P^T dO[i0 + c]
        _accumulate(b, k, bh, DK, dks, local, Gf, q, i0, Sq, cn)     # dK += G^T q[i0 + c]

    _items(b, k, lo, hi, Sk, block)
    b.ret_void()
    return fn


__all__ = ["emit_dq", "emit_dkv"]

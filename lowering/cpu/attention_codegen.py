"""LLVM IR of the fused CPU attention kernel (attention_kernel.AttentionKernel).

    AttentionKernel (shapes, buffers, mask kind)
          │ emit_attention
          ▼
    void NAME.kN(f32* q, f32* kt, f32* v, f32* out, [i8* mask], [f32* lse], i64 lo, i64 hi)
        for item in [lo, hi):  bh, query block r0..r1 of QBF rows (early/late alternately)
          m[], l[][VL], out[r0:r1] = -inf, 0, 0            (m, l: stack arrays)
          for j0 in [kstart, kend) step KT:                 one key tile, from L1
            for register tile i0 (R rows, clamped to r1 - 1) that sees j0:
              S = q[rows] . kt[tile j0]                    FMA over d, R x NV vectors
              masked? (diagonal / last tile / sliding / tensor): S = allowed ? S : -inf
              online softmax: P (stack), alpha = exp(m - m') as one R-lane vector
              out[rows] = out[rows] * alpha + P . v[j0 : j0 + min(KT, Sk - j0)]
                                                           (_pv_rows: D in chunks of DC)
          out[r0:r1] /= (l == 0 ? 1 : l);  [lse = m + log l]

The exp here is Cephes expf's (as lowering/shared/mathlib.py) specialised to
arguments <= 0: no overflow path, 2^n built directly from the rounding constant,
and x < -87 flushed to exactly 0 (so masked scores contribute nothing).
"""
from __future__ import annotations

import math

import llvmlite.ir as ir

from rlxc.lowering.cpu import openmp as parallel
from rlxc.lowering.cpu.attention_kernel import NV, QB, fwd_geometry
from rlxc.lowering.cpu.sgemm_kernels import counted_loop


F32 = ir.FloatType()
I1 = ir.IntType(1)
I8 = ir.IntType(8)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
NEG_INF = -math.inf


def c64(n):
    return ir.Constant(I64, int(n))


def _vt(w):
    return F32 if w == 1 else ir.VectorType(F32, w)


def _splat(b, x, w):
    if w == 1:
        return x
    vt = ir.VectorType(x.type, w)
    u = b.insert_element(ir.Constant(vt, ir.Undefined), x, ir.Constant(I32, 0))
    return b.shuffle_vector(u, ir.Constant(vt, ir.Undefined),
                            ir.Constant(ir.VectorType(I32, w), [0] * w))


def _fconst(w, x):
    return ir.Constant(_vt(w), float(x)) if w == 1 else ir.Constant(_vt(w), [float(x)] * w)


def _max(b, x, y):
    """x > y ? x : y (a NaN x yields y; NaN scores still reach the output through P)."""
    return b.select(b.fcmp_ordered(">", x, y), x, y)


def _hreduce(b, x, w, fn):
    while w > 1:
        h = w // 2
        lo = b.shuffle_vector(x, x, ir.Constant(ir.VectorType(I32, h), list(range(h))))
        hi = b.shuffle_vector(x, x, ir.Constant(ir.VectorType(I32, h), list(range(h, w))))
        x, w = fn(b, lo, hi), h
    return b.extract_element(x, ir.Constant(I32, 0)) if isinstance(x.type, ir.VectorType) else x


def _fma(b, x, y, z):
    from rlxc.lowering.shared.scalar import intrinsic

    return b.call(intrinsic(b, "llvm.fma", x.type, 3), [x, y, z])


def _unary(b, name, x):
    from rlxc.lowering.shared.scalar import emit

    return emit(b, f"rlx.{name}", [x], "f32")


def _exp_nonpos(b, x, w):
    """e^x for x <= 0 (or NaN): mathlib's variant without the overflow path."""
    from rlxc.lowering.shared.mathlib import exp_nonpos

    return exp_nonpos(b, x)


def _row_block(b, c, nb, n):
    """Work item c of (batch*head, block of QB rows of n) -> (bh, r0, r1); nb blocks per
    head, early and late blocks alternate (causal blocks differ in cost)."""
    bh = b.sdiv(c, c64(nb))
    t = b.srem(c, c64(nb))
    half = b.sdiv(t, c64(2))
    even = b.icmp_signed("==", b.srem(t, c64(2)), c64(0))
    blk = b.select(even, half, b.sub(c64(nb - 1), half))
    r0 = b.mul(blk, c64(QB))
    return bh, r0, _smin(b, b.add(r0, c64(QB)), c64(n))


def _row_block_of(b, c, nb, n, qb):
    """_row_block with blocks of qb rows (the forward's QBF)."""
    bh = b.sdiv(c, c64(nb))
    t = b.srem(c, c64(nb))
    half = b.sdiv(t, c64(2))
    even = b.icmp_signed("==", b.srem(t, c64(2)), c64(0))
    blk = b.select(even, half, b.sub(c64(nb - 1), half))
    r0 = b.mul(blk, c64(qb))
    return bh, r0, _smin(b, b.add(r0, c64(qb)), c64(n))


def _vload(b, base, off, w):
    p = b.gep(base, [off], inbounds=True)
    if w == 1:
        return b.load(p, align=4)
    return b.load(b.bitcast(p, ir.VectorType(F32, w).as_pointer()), align=4)


def _vstore(b, base, off, x, w):
    p = b.gep(base, [off], inbounds=True)
    if w == 1:
        b.store(x, p, align=4)
    else:
        b.store(x, b.bitcast(p, ir.VectorType(F32, w).as_pointer()), align=4)


def _smin(b, x, y):
    return b.select(b.icmp_signed("<", x, y), x, y)


def _smax(b, x, y):
    return b.select(b.icmp_signed(">", x, y), x, y)


def _allowed(b, k, iv, jv):
    """The causal / sliding rule on i32 vectors of query rows iv and keys jv (or None)."""
    if k.kind not in ("causal", "sliding"):
        return None
    c = b.icmp_signed("<=", jv, iv)
    if k.kind == "sliding":
        c = b.and_(c, b.icmp_signed("<", b.sub(iv, jv),
                                    _splat(b, ir.Constant(I32, k.window), k.vl)))
    return c


def _mask_lanes(b, k, mask, base, first, stride, count):
    """The tensor mask's bits at offsets base + (first + t) * stride, t < vl (indices
    clamped to count - 1; stride 0: one byte splat) as an i1 vector."""
    vl = k.vl
    vt8 = ir.VectorType(I8, vl)
    if stride == 0:
        x = b.load(b.gep(mask, [base], inbounds=True), align=1)
        return _splat(b, b.icmp_unsigned("!=", x, ir.Constant(I8, 0)), vl)
    if stride == 1 and count % (NV * vl) == 0:
        p = b.gep(mask, [b.add(base, first)], inbounds=True)
        x = b.load(b.bitcast(p, vt8.as_pointer()), align=1)
    else:
        x = ir.Constant(vt8, ir.Undefined)
        for t in range(vl):
            jj = _smin(b, b.add(first, c64(t)), c64(count - 1))
            e = b.load(b.gep(mask, [b.add(base, b.mul(jj, c64(stride)))], inbounds=True),
                       align=1)
            x = b.insert_element(x, e, ir.Constant(I32, t))
    return b.icmp_unsigned("!=", x, ir.Constant(vt8, [0] * vl))


def _fma_rows(b, acc, w, src, row, cn, KT, DW):
    """acc[r][d] += w[r * KT + c] * src[row(b, c) + d * DW : + DW] for c in [0, cn): a row
    block of weights (P or G, R x KT on the stack) times cn rows of D floats (v, k, q or
    dO), one FMA per (r, d) vector and c ascending (the forward's P V, the backward's)."""
    def body(b, c):
        base = row(b, c)
        xs = [_vload(b, src, b.add(base, c64(d * DW)), DW) for d in range(len(acc[0]))]
        for r in range(len(acc)):
            ws = _splat(b, b.load(b.gep(w, [b.add(c, c64(r * KT))], inbounds=True), align=4),
                        DW)
            for d, a in enumerate(acc[r]):
                b.store(_fma(b, ws, xs[d], b.load(a)), a)
    counted_loop(b, c64(0), cn, 1, body, "c")


def _pv_rows(b, out, obase, alphas, P, v, vrow, cn, KT, DW, DV, ACC):
    """out[obase[r] + d] = out[...] * alpha[r] + sum_{c < cn} P[r * KT + c] v[vrow(c) + d]
    for the R rows, D in chunks of DC vectors: ACC, R x DC entry-block allocas (SROA
    turns them into registers), c ascending."""
    R, DC = len(obase), len(ACC[0])
    for d0 in range(0, DV, DC):
        ds = range(d0, min(DV, d0 + DC))
        acc = [ACC[r][:len(ds)] for r in range(R)]
        for r in range(R):
            av = _splat(b, alphas[r], DW)
            for a, d in zip(acc[r], ds):
                b.store(b.fmul(_vload(b, out, b.add(obase[r], c64(d * DW)), DW), av), a)

        def body(b, c, acc=acc, ds=ds):
            base = vrow(b, c)
            xs = [_vload(b, v, b.add(base, c64(d * DW)), DW) for d in ds]
            for r in range(R):
                ws = _splat(b, b.load(b.gep(P, [b.add(c, c64(r * KT))], inbounds=True),
                                      align=4), DW)
                for d, a in enumerate(acc[r]):
                    b.store(_fma(b, ws, xs[d], b.load(a)), a)
        counted_loop(b, c64(0), cn, 1, body, "c")
        for r in range(R):
            for a, d in zip(acc[r], ds):
                _vstore(b, out, b.add(obase[r], c64(d * DW)), b.load(a), DW)


def kernel_function(g, k, pointers):
    """(fn, builder at its entry) of an attention kernel: internal nounwind
    `{g.sym}.{k.name}(pointers..., i64 lo, i64 hi)` with every pointer noalias."""
    fn = ir.Function(g.m, ir.FunctionType(ir.VoidType(), list(pointers) + [I64, I64]),
                     f"{g.sym}.{k.name}")
    fn.linkage = "internal"
    fn.attributes.add("nounwind")
    for a in fn.args:
        if isinstance(a.type, ir.PointerType):
            a.add_attribute("noalias")
    return fn, ir.IRBuilder(fn.append_basic_block("entry"))


def emit_attention(g, k):
    vl, D, Sq, Sk = k.vl, k.D, k.Sq, k.Sk
    KT = NV * vl
    DW, DV, R, DC, QBF = fwd_geometry(D, vl)
    nqb = -(-Sq // QBF)
    fn, b = kernel_function(g, k, [F32.as_pointer()] * 4 + ([I8.as_pointer()] if k.mask else [])
                            + ([F32.as_pointer()] if k.lse else [])
                            + ([F32.as_pointer()] if k.ctr else []))
    q, kt, v, out = fn.args[:4]
    mask = fn.args[4] if k.mask else None
    lse = fn.args[4 + bool(k.mask)] if k.lse else None
    ctr = fn.args[-3] if k.ctr else None
    lo, hi = fn.args[-2], fn.args[-1]
    # register-tile state: one alloca per vector (SROA turns them into phis); the
    # block's m (QBF rows) and l (QBF rows of VL partial sums) on the stack, its O
    # accumulators in `out` itself
    S = [[b.alloca(_vt(vl), name=f"s{r}_{j}") for j in range(NV)] for r in range(R)]
    ACC = [[b.alloca(_vt(DW), name=f"o{r}_{d}") for d in range(DC)] for r in range(R)]
    P = b.alloca(ir.ArrayType(F32, R * KT), name="p")
    Pf = b.bitcast(P, F32.as_pointer())
    Mb = b.bitcast(b.alloca(ir.ArrayType(F32, QBF), name="m"), F32.as_pointer())
    Lb = b.bitcast(b.alloca(ir.ArrayType(F32, QBF * vl), name="l"), F32.as_pointer())

    def lrow(b, i, r0):
        return b.mul(b.sub(i, r0), c64(vl))
    iota = [ir.Constant(ir.VectorType(I32, vl), [j * vl + t for t in range(vl)])
            for j in range(NV)]

    def key_range(b, i0, last):
        """[kstart, kend) of the keys rows i0..last may see (kstart a multiple of KT)."""
        kstart, kend = c64(0), c64(Sk)
        if k.kind in ("causal", "sliding"):
            kend = _smin(b, b.add(last, c64(1)), c64(Sk))
        if k.kind == "sliding":
            s0 = _smax(b, b.sub(i0, c64(k.window - 1)), c64(0))
            kstart = b.mul(b.sdiv(s0, c64(KT)), c64(KT))
        return kstart, kend

    def item(b, c):
        bh, r0, r1 = _row_block_of(b, c, nqb, Sq, QBF)
        qbase = b.mul(bh, c64(Sq * D))
        ktbase = b.mul(bh, c64(D * k.Skp))
        vbase = b.mul(bh, c64(Sk * D))
        mbase = None
        if mask is not None:
            sb, sh, _, _ = k.mstrides
            mbase = b.add(b.mul(b.sdiv(bh, c64(k.H)), c64(sb)),
                          b.mul(b.srem(bh, c64(k.H)), c64(sh)))

        def init(b, i):
            b.store(ir.Constant(F32, NEG_INF), b.gep(Mb, [b.sub(i, r0)], inbounds=True))
            _vstore(b, Lb, lrow(b, i, r0), _fconst(vl, 0.0), vl)
            ob = b.add(qbase, b.mul(i, c64(D)))
            for d in range(DV):
                _vstore(b, out, b.add(ob, c64(d * DW)), _fconst(DW, 0.0), DW)
        counted_loop(b, r0, r1, 1, init, "ri")
        last = b.sub(r1, c64(1))
        kstart, kend = key_range(b, r0, last)

        def ktile(b, j0):      # one key tile (L1-resident) for every register tile of the block
            def rtile(b, i0):
                rows = [_smin(b, b.add(i0, c64(r)), last) for r in range(R)]
                ks, ke = key_range(b, i0, rows[-1])
                go = b.and_(b.icmp_signed("<", j0, ke), b.icmp_signed(">=", j0, ks))
                with b.if_then(go):
                    tile(b, j0, rows, r0, qbase, ktbase, vbase, mbase)
            counted_loop(b, r0, r1, R, rtile, "rt")
        counted_loop(b, kstart, kend, KT, ktile, "kt")

        def fin(b, i):
            den = _hreduce(b, _vload(b, Lb, lrow(b, i, r0), vl), vl,
                           lambda b, x, y: b.fadd(x, y))
            den = b.select(b.fcmp_ordered("==", den, ir.Constant(F32, 0.0)),
                           ir.Constant(F32, 1.0), den)
            inv = _splat(b, b.fdiv(ir.Constant(F32, 1.0), den), DW)
            ob = b.add(qbase, b.mul(i, c64(D)))
            if lse is not None:   # L = m + log(l): a fully masked row (m -inf, l 0) gives 0
                m = b.load(b.gep(Mb, [b.sub(i, r0)], inbounds=True))
                m = b.select(b.fcmp_ordered("==", m, ir.Constant(F32, NEG_INF)),
                             ir.Constant(F32, 0.0), m)
                b.store(b.fadd(m, _unary(b, "log", den)),
                        b.gep(lse, [b.add(b.sdiv(qbase, c64(D)), i)], inbounds=True))
            for d in range(DV):
                o = b.add(ob, c64(d * DW))
                _vstore(b, out, o, b.fmul(_vload(b, out, o, DW), inv), DW)
        counted_loop(b, r0, r1, 1, fin, "rf")

    def softmax(b, j0, rows, r0, mbase, masked):
        """Online softmax of the R x KT score tile in S: P to the stack, m and l updated;
        returns the R rows' rescale factors alpha."""
        ninf = _fconst(vl, NEG_INF)
        jv = [b.add(_splat(b, b.trunc(j0, I32), vl), iota[j]) for j in range(NV)] \
            if masked else None
        tiles, bms = [], []
        for r in range(R):
            iv = _splat(b, b.trunc(rows[r], I32), vl) if masked else None
            ps = []
            for j in range(NV):
                s = b.load(S[r][j])
                if k.softcap:
                    s = b.fmul(_unary(b, "tanh", b.fmul(s, _fconst(vl, 1.0 / k.softcap))),
                               _fconst(vl, k.softcap))
                ok = None
                if masked and Sk % KT:
                    ok = b.icmp_signed("<", jv[j], _splat(b, ir.Constant(I32, Sk), vl))
                if masked and k.kind in ("causal", "sliding"):
                    c = _allowed(b, k, iv, jv[j])
                    ok = c if ok is None else b.and_(ok, c)
                if masked and k.kind == "tensor":
                    _, _, si, sj = k.mstrides
                    c = _mask_lanes(b, k, mask, b.add(mbase, b.mul(rows[r], c64(si))),
                                    b.add(j0, c64(j * vl)), sj, Sk)
                    ok = c if ok is None else b.and_(ok, c)
                if ok is not None:
                    s = b.select(ok, s, ninf)
                ps.append(s)
            mx = ps[0]
            for x in ps[1:]:
                mx = _max(b, mx, x)
            tiles.append(ps)
            bms.append(_hreduce(b, mx, vl, _max))
        mp = [b.gep(Mb, [b.sub(rows[r], r0)], inbounds=True) for r in range(R)]
        lp = [lrow(b, rows[r], r0) for r in range(R)]
        molds = [b.load(x) for x in mp]
        mnews = [_max(b, bm, mo) for bm, mo in zip(bms, molds)]
        mrefs = [b.select(b.fcmp_ordered("==", mn, ir.Constant(F32, NEG_INF)),
                          ir.Constant(F32, 0.0), mn) for mn in mnews]
        # alpha = exp(m_old - m_ref) of the R rows as one vector
        diff = ir.Constant(_vt(R), ir.Undefined) if R > 1 else None
        for r in range(R):
            x = b.fsub(molds[r], mrefs[r])
            diff = x if R == 1 else b.insert_element(diff, x, ir.Constant(I32, r))
        alphas = _exp_nonpos(b, diff, R)
        l_olds = [_vload(b, Lb, x, vl) for x in lp]   # before any store: clamped rows repeat
        out_alpha = []
        for r in range(R):
            alpha = alphas if R == 1 else b.extract_element(alphas, ir.Constant(I32, r))
            mv = _splat(b, mrefs[r], vl)
            es = [_exp_nonpos(b, b.fsub(x, mv), vl) for x in tiles[r]]
            tot = es[0]
            for e in es[1:]:
                tot = b.fadd(tot, e)
            b.store(mnews[r], mp[r])
            _vstore(b, Lb, lp[r], b.fadd(b.fmul(l_olds[r], _splat(b, alpha, vl)), tot), vl)
            out_alpha.append(alpha)
            for j in range(NV):
                _vstore(b, Pf, c64(r * KT + j * vl), es[j], vl)
        return out_alpha

    def tile(b, j0, rows, r0, qbase, ktbase, vbase, mbase):
        # scores: S[r][j] = sum_d q[row r, d] * kt[tile j0][d, j*VL : +VL]
        zero = _fconst(vl, 0.0)
        for r in range(R):
            for j in range(NV):
                b.store(zero, S[r][j])
        qrow = [b.add(qbase, b.mul(rows[r], c64(D))) for r in range(R)]
        kt0 = b.add(ktbase, b.mul(j0, c64(D)))      # K^T is packed tile by tile

        def dot(b, d):
            kb = b.add(kt0, b.mul(d, c64(KT)))
            kv = [_vload(b, kt, b.add(kb, c64(j * vl)), vl) for j in range(NV)]
            for r in range(R):
                qs = _splat(b, b.load(b.gep(q, [b.add(qrow[r], d)], inbounds=True), align=4), vl)
                for j in range(NV):
                    b.store(_fma(b, qs, kv[j], b.load(S[r][j])), S[r][j])
        counted_loop(b, c64(0), c64(D), 1, dot, "d")
        i0 = rows[0]
        if k.kind == "causal" or (k.kind == "" and Sk % KT):
            # only the tiles on the diagonal (or past Sk) need the mask
            need = b.icmp_signed(">", b.add(j0, c64(KT)), c64(Sk))
            if k.kind == "causal":
                need = b.or_(need, b.icmp_signed(">", b.add(j0, c64(KT - 1)), i0))
            with b.if_else(need, likely=False) as (masked, plain):
                with masked:
                    am = softmax(b, j0, rows, r0, mbase, True)
                    bm = b.block
                with plain:
                    ap = softmax(b, j0, rows, r0, mbase, False)
                    bp = b.block
            alphas = []
            for x, y in zip(am, ap):
                ph = b.phi(F32)
                ph.add_incoming(x, bm)
                ph.add_incoming(y, bp)
                alphas.append(ph)
        else:
            alphas = softmax(b, j0, rows, r0, mbase, k.kind != "")
        cn = _smin(b, c64(KT), b.sub(c64(Sk), j0))     # O = O * alpha + P v[j0 + c]
        _pv_rows(b, out, [b.add(qbase, b.mul(rows[r], c64(D))) for r in range(R)], alphas, Pf,
                 v, lambda b, c: b.add(vbase, b.mul(b.add(j0, c), c64(D))), cn, KT, DW, DV, ACC)

    if ctr is None:
        counted_loop(b, lo, hi, 1, item, "item")
    else:
        parallel.emit_claim_loop(b, b.bitcast(ctr, I64.as_pointer()), k.items,
                                 lambda b, c, _hi: item(b, c))
    b.ret_void()
    return fn


# the vector helpers attention_bwd_codegen.py shares, under public names
vt, splat, fconst, hreduce, fma, unary, exp_nonpos, vload, vstore, smin, smax, row_block = (
    _vt, _splat, _fconst, _hreduce, _fma, _unary, _exp_nonpos, _vload, _vstore, _smin, _smax,
    _row_block)
fma_rows, allowed, mask_lanes = _fma_rows, _allowed, _mask_lanes

__all__ = ["emit_attention", "vt", "splat", "fconst", "hreduce", "fma", "unary", "exp_nonpos",
           "vload", "vstore", "smin", "smax", "row_block", "fma_rows", "allowed", "mask_lanes",
           "kernel_function"]

"""Fused CPU attention (flash-style): rlx.attention -> K^T pack + one tiled kernel.

    rlx.attention(q, k, v [, mask]) {scale, softcap, kind, window}      f32, D >= 1, Sk >= 1
          │ attention_kernels (hook of schedule.Builder.build)
          ▼
    LoopKernel  kt[bh, t, d, c] = j < Sk ? k[bh, j, d] * scale : 0,  j = t*KT + c
                                  (B*H, Skp/KT, D, KT): K^T tile by tile, each contiguous
    AttentionKernel  parallel over items (bh, query block of QBF rows):
        m[i] = -inf, l[i][:] = 0 (VL partial sums), out[i, :] = 0     for the block's rows
        for j0 in [kstart, kend) step KT:                 key tiles the block's mask allows
          for each register tile of R query rows i0..i0+R that sees tile j0:
            S[r][:] = sum_d q[i0+r, d] * kt[j0 tile][d, :]   (R x NV vectors of VL lanes, FMA)
            S = softcap * tanh(S / softcap);  S = allowed ? S : -inf   (edge tiles only)
            mnew = max(m, rowmax S); mref = mnew == -inf ? 0 : mnew
            P = exp(S - mref); alpha = exp(m - mref)
            l = l * alpha + (sum of P's NV vectors);  m = mnew
            out[i0+r, :] = out * alpha + sum_{c < min(KT, Sk - j0)} P[r][c] * v[j0 + c, :]
                                              (D in DV vectors of DW lanes, chunks of DC)
        out[i, :] /= (L == 0 ? 1 : L), L = sum of l[i]'s lanes     (fully masked row: zeros)

The key-tile loop is outside the register tiles so that one tile of K^T and of v
(2 x D x KT floats, 32 KiB at D = 64 on AVX-512) is read from L1 by the block's
QBF / R register tiles instead of from L2 by each; a (D, Skp) K^T would put a tile's
D rows Skp floats apart, on a few L1 sets.  The scores (R x NV accumulators) and the
P v accumulators (R x DC) are live in different phases, so each phase has the whole
register file (fwd_geometry: 6 rows x 4 zmm on AVX-512, 2 rows on AVX2); the block's
O lives in `out` (loaded and stored once per register tile and key tile: R x DV
vectors against R x KT x D multiply-adds each way).
The scores live only as one R x KT tile in registers and a KT-float row of P
per query row on the stack; nothing of size Sq x Sk exists.  Key tiles that
the causal or sliding rule masks entirely are never visited (kstart/kend per
register tile).  The last register tile of a block clamps its rows to the block's
last row (it recomputes and rewrites that row with the same value: every row's
state is loaded before any is stored), the last key tile
masks keys >= Sk (kt is zero-padded, v rows past Sk are never read).  NaN
scores propagate through P to the row's output.  A NaN in v under a key that a
row may not see reaches that row only through a visited key tile: a skipped tile's
v rows are never read, while in a visited (diagonal or edge) tile the masked key's
P = 0 still meets its v row in P v (0 * NaN = NaN), as in the expansion's P @ V.
Work items are ordered so that early and late query blocks alternate (causal
rows differ in cost); above PAR_MIN_WORK the team claims them one at a time from
a counter in the workspace (zeroed by a loop kernel before each call), so a
thread the OS preempts on a busy machine does not hold up the call.  Shapes and dtypes the kernel
does not cover (f64, D = 0, Sk = 0) keep dialect/attention.py's expansion;
the GPU always uses the expansion.  This file plans the kernel (the schedule
hook and AttentionKernel); attention_codegen.py emits its LLVM IR.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from rlxc.dialect.types import dtype_of, numel, shape_of
from rlxc.lowering.cpu import indexing as ix
from rlxc.lowering.cpu.loops import Buffer, Const, InRange, Op

ENABLED = True        # tests switch the kernel off to compare with the expansion
NV = 4                # score vectors per register-tile row: KT = NV * VL keys per key tile
QB = 32               # query rows per parallel work item
REG_BUDGET = {16: 16, 8: 8, 4: 8}   # vector registers for the O accumulators, by lane count
FWD_R_MAX = 6         # most query rows per forward register tile
FUSED_OPS = ("rlx.attention", "rlx.attention_lse", "rlx.attention_bwd")


def covers(op) -> bool:
    """Does the fused kernel compute this rlx.attention (else: the expansion)?  The same
    test serves rlx.attention_lse and rlx.attention_bwd (attention_bwd.py)."""
    q, k = (shape_of(o.type) for o in op.operands[:2])
    return (ENABLED and op.name in FUSED_OPS and dtype_of(op.operands[0].type) == "f32"
            and q[3] >= 1 and k[2] >= 1 and q[2] >= 1 and numel(q) > 0)


def geometry(D: int, vl: int):
    """(DW, DV, R): D as DV vectors of DW lanes (DW the largest power of two <= VL
    dividing D), and R query rows per register tile (O needs R * DV registers)."""
    dw = 1
    while dw * 2 <= vl and D % (dw * 2) == 0:
        dw *= 2
    dv = D // dw
    regs = REG_BUDGET.get(vl, 8) * (vl // dw if dw < vl else 1)   # narrow vectors: more fit
    r = max(1, min(4, regs // max(dv, 1)))
    return dw, dv, r


def fwd_geometry(D: int, vl: int):
    """The forward kernel's tiles: (DW, DV, R, DC, QBF).  The scores (R x NV vectors)
    and the P V accumulators (R x DC vectors, D in chunks of DC) are live in different
    phases, so each phase gets the whole register file: R x NV + NV + 1 and
    R x DC + DC + 1 vectors fit (32 zmm: R = 6, DC = 4; 16 ymm: R = 2, DC = 5); QBF
    query rows per work item, a multiple of R near QB."""
    dw, dv, _ = geometry(D, vl)
    r = max(1, min(FWD_R_MAX, (_regs(vl) - NV - 1) // NV))
    return dw, dv, r, d_chunk(dv, r, vl), r * -(-QB // r)


def _regs(vl: int) -> int:
    return 32 if vl == 16 else 16


def d_chunk(dv: int, r: int, vl: int) -> int:
    """Vectors of D per chunk of an accumulate loop over r rows: R x DC accumulators, DC
    loaded vectors and one broadcast fit the register file (R x DC + DC + 1)."""
    return max(1, min(dv, (_regs(vl) - 1) // (r + 1)))


@dataclass(eq=False)
class AttentionKernel:
    name: str
    what: str
    q: Buffer
    kt: Buffer
    v: Buffer
    out: Buffer
    mask: Buffer | None
    mstrides: tuple        # element strides of the mask operand over (B, H, Sq, Sk), 0 = broadcast
    B: int
    H: int
    Sq: int
    Sk: int
    D: int
    Skp: int
    softcap: float
    kind: str
    window: int
    vl: int
    work: int = 0
    parallel: bool = True
    extra: list = field(default_factory=list)
    lse: Buffer | None = None   # also write L = rowmax + log(rowsum) (rlx.attention_lse)
    ctr: Buffer | None = None   # the team's work counter (8 bytes, zeroed before the kernel)

    @property
    def outputs(self):
        return [self.out] + ([self.lse] if self.lse else [])

    def buffers(self) -> list:
        return [self.q, self.kt, self.v, self.out] + ([self.mask] if self.mask else []) + \
            ([self.lse] if self.lse else []) + ([self.ctr] if self.ctr else [])

    @property
    def items(self) -> int:
        return self.B * self.H * (-(-self.Sq // fwd_geometry(self.D, self.vl)[4]))

    def format(self) -> str:
        dw, dv, r, dc, qbf = fwd_geometry(self.D, self.vl)
        kt = NV * self.vl
        m = {"": "none", "causal": "causal", "sliding": f"sliding({self.window})",
             "tensor": f"tensor {self.mask!r} strides {self.mstrides}"}[self.kind]
        return "\n".join([
            f"kernel {self.name}  // {self.what}  (work {self.work})",
            f"  parallel for item in [0, {self.items}){' claimed one by one' if self.ctr else ''}"
            f":  // (bh, block of {qbf} query rows)",
            f"    flash attention tile {r} rows x {kt} keys, D={self.D} as {dv}x{dw} lanes"
            f" (P v in chunks of {dc}),",
            f"      q={self.q!r} kt={self.kt!r} (Skp={self.Skp}) v={self.v!r} -> {self.out!r},",
            f"      mask {m}, softcap {self.softcap}, Sq={self.Sq} Sk={self.Sk}"
            + (f", row logsumexp -> {self.lse!r}" if self.lse else "")])

    def emit(self, g):
        """The kernel function (g: codegen.ModuleGen); returns (function, buffers, True)."""
        from rlxc.lowering.cpu.attention_codegen import emit_attention

        return emit_attention(g, self), self.buffers(), True


# ---------------------------------------------------------------- schedule hook

def operand_buffer(bl, o, what, tag):
    """The buffer of operand `o`, or a copy into a new temp when it has none (fused)."""
    b = bl.bufs.get(o)
    if b is not None and o in bl.plan.materialized:
        return b
    shp = shape_of(o.type)
    b = bl._buf(f"t{len(bl.buffers)}", "temp", dtype_of(o.type), numel(shp))
    bl.map_kernel(f"{what}: {tag} operand", shp, b, lambda g, idx, o=o: g.value(o, idx),
                  tag="copy")
    return b


def mask_strides(shape) -> tuple:
    """Element strides of a (B, H, Sq, Sk)-broadcasting mask; 0 on its size-1 dims."""
    st, acc = [], 1
    for n in reversed(shape):
        st.append(acc if n != 1 else 0)
        acc *= n
    return tuple(reversed(st))


def pack_transposed(bl, x, what, n_pad, scale=None, label="x^T"):
    """(B, H, S, D) operand x -> a new (B*H, D, n_pad) temp: x^T [* scale], rows past S 0."""
    B, H, S, D = shape_of(x.type)
    out = bl._buf(f"t{len(bl.buffers)}", "temp", "f32", B * H * D * n_pad)

    def pack(g, idx):
        b_, h_, d_, j_ = idx
        src = g.value(x, (b_, h_, ix.clamp(j_, 0, S - 1), d_))
        if scale is not None:
            src = Op("mul", (src, Const(scale)), "f32")
        return Op("select", (InRange(j_, 0, S), src, Const(0.0)), "f32")
    bl.map_kernel(f"{what}: {label}, rows padded to {n_pad}", (B, H, D, n_pad), out, pack,
                  tag="pack_kt")
    return out


def pack_key_tiles(bl, x, what, kt_n, scale):
    """(B, H, S, D) keys -> a new (B*H, Skp/kt_n, D, kt_n) temp: each tile of kt_n keys
    transposed and contiguous (D x kt_n floats, read from L1 by every register tile of a
    query block; a plain (D, Skp) K^T puts a tile's rows Skp floats apart, which maps
    them onto a few L1 sets), times `scale`, keys past S zero."""
    B, H, S, D = shape_of(x.type)
    nt = -(-S // kt_n)
    out = bl._buf(f"t{len(bl.buffers)}", "temp", "f32", B * H * nt * D * kt_n)

    def pack(g, idx):
        b_, h_, t_, d_, c_ = idx
        j_ = ix.add(ix.scale(t_, kt_n), c_)
        src = Op("mul", (g.value(x, (b_, h_, ix.clamp(j_, 0, S - 1), d_)), Const(scale)),
                 "f32")
        return Op("select", (InRange(j_, 0, S), src, Const(0.0)), "f32")
    bl.map_kernel(f"{what}: k^T * scale in tiles of {kt_n} keys", (B, H, nt, D, kt_n), out,
                  pack, tag="pack_kt")
    return out


def attention_kernels(bl, v, op, what, lse=None):
    """Append the K^T pack and the fused kernel of `v = rlx.attention(...)` to the
    schedule.Builder `bl` (operands that have no buffer are copied into one); with `lse`
    (a buffer) the kernel also writes the rows' logsumexp (rlx.attention_lse)."""
    from rlxc.lowering.cpu.sgemm_kernels import sgemm_config
    from rlxc.lowering.cpu.schedule import PAR_MIN_WORK

    p = op.params()
    B, H, Sq, D = shape_of(op.operands[0].type)
    Sk = shape_of(op.operands[1].type)[2]
    vl = sgemm_config(bl.cpu).vl   # f32 lanes of one vector register
    kt_n = NV * vl
    Skp = -(-Sk // kt_n) * kt_n
    q, k, vv = op.operands[:3]
    qb, vb = operand_buffer(bl, q, what, "q"), operand_buffer(bl, vv, what, "v")
    mb, mstr = None, (0, 0, 0, 0)
    if p["kind"] == "tensor":
        mo = op.operands[3]
        mb = operand_buffer(bl, mo, what, "mask")
        mstr = mask_strides(shape_of(mo.type))
    kt = pack_key_tiles(bl, k, what, kt_n, float(p["scale"]))
    eff = Sk if p["kind"] in ("", "tensor") else (
        min(Sk, p["window"]) if p["kind"] == "sliding" else max(1, min(Sk, Sq) // 2))
    work = 4 * B * H * Sq * eff * D
    out = bl.bufs[v] if v is not None else \
        bl._buf(f"t{len(bl.buffers)}", "temp", "f32", B * H * Sq * D)   # L alone: O is scratch
    ctr = None
    if work >= PAR_MIN_WORK:   # the team claims items from a shared counter (dynamic)
        ctr = bl._buf(f"t{len(bl.buffers)}", "temp", "f32", 2)
        bl.map_kernel(f"{what}: work counter = 0", (2,), ctr, lambda g, idx: Const(0.0),
                      parallel_ok=False, tag="copy")
    bl._add(AttentionKernel(bl._kname("attention"), what, qb, kt, vb, out, mb, mstr, B, H, Sq,
                            Sk, D, Skp, float(p["softcap"] or 0.0), p["kind"], int(p["window"]),
                            vl, work, work >= PAR_MIN_WORK, lse=lse, ctr=ctr))


__all__ = ["AttentionKernel", "attention_kernels", "covers", "geometry", "fwd_geometry",
           "operand_buffer",
           "mask_strides", "pack_transposed", "pack_key_tiles"]

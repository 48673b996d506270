"""Fused CPU attention (flash-style): rlx.attention -> K^T pack + one tiled kernel.

    rlx.attention(q, k, v [, mask]) {scale, softcap, kind, window}      f32, D >= 1, Sk >= 1
          │ attention_kernels (hook of schedule.Builder.build)
          ▼
    LoopKernel  kt[bh, d, j] = j < Sk ? k[bh, j, d] * scale : 0     (B*H, D, Skp), Skp = Sk
                                                                    rounded up to KT keys
    AttentionKernel  parallel over items (bh, query block of QB rows):
        for each register tile of R query rows i0..i0+R:
            m[r] = -inf, l[r] = 0, O[r][:] = 0                (registers: SROA'd allocas)
            for j0 in [kstart, kend) step KT:                 only key tiles the mask allows
                S[r][:] = sum_d q[i0+r, d] * kt[d, j0:j0+KT]  (R x NV vectors of VL lanes, FMA)
                S = softcap * tanh(S / softcap);  S = allowed ? S : -inf
                mnew = max(m, rowmax S); mref = mnew == -inf ? 0 : mnew
                P = exp(S - mref); alpha = exp(m - mref)
                l = l * alpha + rowsum P;  O *= alpha;  m = mnew
                O[r][:] += sum_{c < min(KT, Sk - j0)} P[r][c] * v[j0 + c, :]   (D in DV
                                                                      vectors of DW lanes)
            out[i0+r, :] = O[r] / (l == 0 ? 1 : l)            (fully masked row: zeros)

The scores live only as one R x KT tile in registers and a KT-float row of P
per query row on the stack; nothing of size Sq x Sk exists.  Key tiles that
the causal or sliding rule masks entirely are never visited (kstart/kend per
register tile).  The last register tile of a block clamps its rows to Sq - 1
(it recomputes and rewrites that row with the same value), the last key tile
masks keys >= Sk (kt is zero-padded, v rows past Sk are never read).  NaN
scores propagate through P to the row's output; a NaN in v under a masked-out
or skipped key does not reach the output (torch's flash kernel does the same).
Work items are ordered so that each thread's static range mixes early and
late query blocks (causal rows differ in cost).  Shapes and dtypes the kernel
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


def covers(op) -> bool:
    """Does the fused kernel compute this rlx.attention (else: the expansion)?"""
    q, k = (shape_of(o.type) for o in op.operands[:2])
    return (ENABLED and op.name == "rlx.attention" and dtype_of(op.operands[0].type) == "f32" and q[3] >= 1 and k[2] >= 1
            and q[2] >= 1 and numel(q) > 0)


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

    @property
    def outputs(self):
        return [self.out]

    def buffers(self) -> list:
        return [self.q, self.kt, self.v, self.out] + ([self.mask] if self.mask else [])

    @property
    def items(self) -> int:
        return self.B * self.H * (-(-self.Sq // QB))

    def format(self) -> str:
        dw, dv, r = geometry(self.D, self.vl)
        kt = NV * self.vl
        m = {"": "none", "causal": "causal", "sliding": f"sliding({self.window})",
             "tensor": f"tensor {self.mask!r} strides {self.mstrides}"}[self.kind]
        return "\n".join([
            f"kernel {self.name}  // {self.what}  (work {self.work})",
            f"  parallel for item in [0, {self.items}):  // (bh, block of {QB} query rows)",
            f"    flash attention tile {r} rows x {kt} keys, D={self.D} as {dv}x{dw} lanes,",
            f"      q={self.q!r} kt={self.kt!r} (Skp={self.Skp}) v={self.v!r} -> {self.out!r},",
            f"      mask {m}, softcap {self.softcap}, Sq={self.Sq} Sk={self.Sk}"])

    def emit(self, g):
        """The kernel function (g: codegen.ModuleGen); returns (function, buffers, True)."""
        from rlxc.lowering.cpu.attention_codegen import emit_attention

        return emit_attention(g, self), self.buffers(), True


# ---------------------------------------------------------------- schedule hook

def attention_kernels(bl, v, op, what):
    """Append the K^T pack and the fused kernel of `v = rlx.attention(...)` to the
    schedule.Builder `bl` (operands that have no buffer are copied into one)."""
    from rlxc.lowering.cpu.sgemm_kernels import sgemm_config
    from rlxc.lowering.cpu.schedule import PAR_MIN_WORK

    p = op.params()
    B, H, Sq, D = shape_of(op.operands[0].type)
    Sk = shape_of(op.operands[1].type)[2]
    vl = sgemm_config(bl.cpu).vl   # f32 lanes of one vector register
    kt_n = NV * vl
    Skp = -(-Sk // kt_n) * kt_n
    q, k, vv = op.operands[:3]

    def buf_of(o, tag):
        b = bl.bufs.get(o)
        if b is not None and o in bl.plan.materialized:
            return b
        shp = shape_of(o.type)
        b = bl._buf(f"t{len(bl.buffers)}", "temp", dtype_of(o.type), numel(shp))
        bl.map_kernel(f"{what}: {tag} operand", shp, b, lambda g, idx, o=o: g.value(o, idx),
                      tag="copy")
        return b

    qb, vb = buf_of(q, "q"), buf_of(vv, "v")
    mb, mstr = None, (0, 0, 0, 0)
    if p["kind"] == "tensor":
        mo = op.operands[3]
        mb = buf_of(mo, "mask")
        ms = shape_of(mo.type)
        st, acc = [], 1
        for n in reversed(ms):
            st.append(acc if n != 1 else 0)
            acc *= n
        mstr = tuple(reversed(st))
    kt = bl._buf(f"t{len(bl.buffers)}", "temp", "f32", B * H * D * Skp)
    scale = float(p["scale"])
    Skc = Sk

    def pack(g, idx):
        b_, h_, d_, j_ = idx
        src = g.value(k, (b_, h_, ix.clamp(j_, 0, Skc - 1), d_))
        return Op("select", (InRange(j_, 0, Skc), Op("mul", (src, Const(scale)), "f32"),
                             Const(0.0)), "f32")
    bl.map_kernel(f"{what}: k^T * scale, keys padded to {Skp}", (B, H, D, Skp), kt, pack,
                  tag="pack_kt")
    eff = Sk if p["kind"] in ("", "tensor") else (
        min(Sk, p["window"]) if p["kind"] == "sliding" else max(1, min(Sk, Sq) // 2))
    work = 4 * B * H * Sq * eff * D
    out = bl.bufs[v]
    bl._add(AttentionKernel(bl._kname("attention"), what, qb, kt, vb, out, mb, mstr, B, H, Sq,
                            Sk, D, Skp, float(p["softcap"] or 0.0), p["kind"], int(p["window"]),
                            vl, work, work >= PAR_MIN_WORK))


__all__ = ["AttentionKernel", "attention_kernels", "covers", "geometry"]

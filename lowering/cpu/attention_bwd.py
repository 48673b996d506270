"""Fused CPU attention backward (FlashAttention-2 style): rlx.attention_bwd -> packs + 2 kernels.

    rlx.attention_bwd(q, k, v, o, dO, L [, mask]) -> [dq; dk; dv]   f32, static sizes
          │ attention_bwd_kernels (hook of schedule.Builder.build)
          ▼
    LoopKernels  kt = k^T * scale, vt = v^T          (B*H, D, Skp)  keys padded to KT
                 qt = q^T, dot = dO^T                (B*H, D, Sqp)  queries padded to KT
    AttentionDqKernel  parallel over (bh, block of QB query rows):
        Delta[i] = dO[i] . o[i];  L, Delta -> Sqp-padded rows (for the next kernel)
        for each key tile j0 the block may see (the forward's ranges):
          for each register tile of R rows (skipped when the rule masks it all):
            S = q . kt,  dP = dO . vt                  (R x KT, FMA over d)
            P = exp(softcap(S) masked - L),  G = P * (dP - Delta) [* (1 - tanh^2)]
            dQ[r] += sum_c G[r, c] k[j0 + c]           (the block's dQ on the stack)
        dq = scale * dQ
    AttentionDkvKernel  parallel over (bh, block of QB keys):
        for each query tile i0 that may see the block (causal: i >= j; sliding: i < j + w):
          for each register tile of R keys (skipped when masked entirely):
            S^T = k-scalars(kt) . qt,  dP^T = v . dot  (R x KT, lanes over queries)
            P^T = exp(S^T masked - L[i]),  G^T = P^T * (dP^T - Delta[i]) [* (1 - tanh^2)]
            dV[r] += sum_c P^T[r, c] dO[i0 + c],  dK[r] += sum_c G^T[r, c] q[i0 + c]
        dk = scale * dK,  dv = dV

The tile loop is outside the register-tile loop so that one tile of packed operands
(kt and vt, or qt and dOt: 2 x D x KT floats) and its rows are read from L1 by the
whole block; the block's accumulators (QB x D floats each) live on the stack.

Nothing of size Sq x Sk exists: scores live as R x KT register tiles and one R x KT
row block on the stack.  The scores are the forward kernel's bit for bit (the same
FMA order over d on the same packed k^T * scale), so S - L <= 0 and exp needs no
overflow path.  Masked lanes, padded lanes and fully masked rows (L = 0, all P = 0)
contribute exactly 0 (a select, so a NaN in a masked-out key stays out); a NaN score
that the forward saw reaches the same rows' and keys' gradients.

rlx.attention_lse is the forward kernel writing L too (attention_kernel.py): when an
rlx.attention with the same operands is in the program, one kernel writes O and L
(`attention_pair_kernels`).  attention_bwd_codegen.py emits the two kernels' IR.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from rlxc.dialect.types import shape_of
from rlxc.lowering.cpu.attention_kernel import (NV, QB, attention_kernels, d_chunk,
                                                fwd_geometry, geometry, mask_strides,
                                                operand_buffer, pack_transposed)
from rlxc.lowering.cpu.loops import Buffer

ATTENTION_OPS = ("rlx.attention", "rlx.attention_lse")


BWD_R_MAX = 4   # most rows per backward register tile


def bwd_geometry(D: int, vl: int) -> tuple[int, int]:
    """(R, DC): register-tile rows of both kernels and the D chunk (in vectors) of their
    accumulate loops.  Each loop keeps at most R x NV score vectors (S, dP) or R x DC
    accumulators live: the forward's R (score phase: R x NV + NV + 1 registers), at most
    BWD_R_MAX, and DC with R x DC + DC + 1 registers (32 zmm, D = 64: R 4, DC 4 = all of
    D; 16 ymm: R 2, DC 4 of D's 8 vectors, where one row per tile (R 1, every k / q / dO
    row loaded for one row's FMAs) ran load-bound)."""
    _, dv, r, _, _ = fwd_geometry(D, vl)
    r = min(r, BWD_R_MAX)
    dc = d_chunk(dv, r, vl)
    even = max(x for x in range(1, dc + 1) if dv % x == 0)
    return r, (even if 2 * even >= dc else dc)   # equal chunks where they stay wide


def bwd_rows(D: int, vl: int) -> int:
    """Register-tile rows of both kernels (bwd_geometry)."""
    return bwd_geometry(D, vl)[0]


@dataclass(eq=False)
class _BwdKernel:
    name: str
    what: str
    bufs: list             # the kernel function's pointer arguments, in order
    mask: Buffer | None
    mstrides: tuple
    B: int
    H: int
    Sq: int
    Sk: int
    D: int
    Sqp: int
    Skp: int
    softcap: float
    kind: str
    window: int
    vl: int
    scale: float = 1.0
    work: int = 0
    parallel: bool = True
    extra: list = field(default_factory=list)

    TITLE = ""

    @property
    def outputs(self):
        return [self.bufs[-1]]

    def buffers(self) -> list:
        return list(self.bufs)

    @property
    def items(self) -> int:
        n = self.Sq if isinstance(self, AttentionDqKernel) else self.Sk
        return self.B * self.H * (-(-n // QB))

    def format(self) -> str:
        m = {"": "none", "causal": "causal", "sliding": f"sliding({self.window})",
             "tensor": f"tensor {self.mask!r} strides {self.mstrides}"}[self.kind]
        r = bwd_rows(self.D, self.vl)
        return "\n".join([
            f"kernel {self.name}  // {self.what}  (work {self.work})",
            f"  parallel for item in [0, {self.items}):  // (bh, block of {QB} rows)",
            f"    flash attention backward ({self.TITLE}) tile {r} rows x {NV * self.vl} "
            f"lanes, D={self.D},",
            f"      {' '.join(repr(b) for b in self.bufs)},",
            f"      mask {m}, softcap {self.softcap}, Sq={self.Sq} Sk={self.Sk}"])

    def emit(self, g):
        from rlxc.lowering.cpu import attention_bwd_codegen as cg

        fn = cg.emit_dq(g, self) if isinstance(self, AttentionDqKernel) else cg.emit_dkv(g, self)
        return fn, self.buffers(), True


@dataclass(eq=False)
class AttentionDqKernel(_BwdKernel):
    """bufs: q, kt, vt, k, o, dO, L, Lpad, Dpad, [mask], out (dq rows of the result)."""
    TITLE = "dq"


@dataclass(eq=False)
class AttentionDkvKernel(_BwdKernel):
    """bufs: kt, qt, dOt, v, q, dO, Lpad, Dpad, [mask], out (dk and dv rows)."""
    TITLE = "dk, dv"


# ---------------------------------------------------------------- schedule hooks

def _pair(bl, op):
    """The rlx.attention / rlx.attention_lse with op's operands and params, if computed."""
    other = ATTENTION_OPS[1 - ATTENTION_OPS.index(op.name)]
    ops = list(op.operands)
    for o in bl.plan.ops:
        if o.name == other and list(o.operands) == ops and o.params() == op.params() and \
                o.results[0] in bl.plan.materialized:
            return o
    return None


def attention_pair_kernels(bl, v, op, what):
    """rlx.attention or rlx.attention_lse: the forward kernel, writing O and L at once when
    both ops of the same operands are in the program (the first one met emits it)."""
    done = bl.__dict__.setdefault("_attention_done", set())
    if op in done:
        return
    other = _pair(bl, op)
    if other is not None:
        done.add(other)
    att, lse = (op, other) if op.name == "rlx.attention" else (other, op)
    attention_kernels(bl, att.results[0] if att is not None else None, att or op, what,
                      lse=bl.bufs[lse.results[0]] if lse is not None else None)


def attention_bwd_kernels(bl, v, op, what):
    """Append the packs and the two backward kernels of `v = rlx.attention_bwd(...)`."""
    from rlxc.lowering.cpu.sgemm_kernels import sgemm_config
    from rlxc.lowering.cpu.schedule import PAR_MIN_WORK

    p = op.params()
    q, k, vv, o, do, lse = op.operands[:6]
    B, H, Sq, D = shape_of(q.type)
    Sk = shape_of(k.type)[2]
    vl = sgemm_config(bl.cpu).vl
    kt_n = NV * vl
    Skp, Sqp = -(-Sk // kt_n) * kt_n, -(-Sq // kt_n) * kt_n
    buf = {n: operand_buffer(bl, x, what, n) for n, x in
           (("q", q), ("k", k), ("v", vv), ("o", o), ("dO", do), ("L", lse))}
    mb, mstr = None, (0, 0, 0, 0)
    if p["kind"] == "tensor":
        mb = operand_buffer(bl, op.operands[6], what, "mask")
        mstr = mask_strides(shape_of(op.operands[6].type))
    kt = pack_transposed(bl, k, what, Skp, float(p["scale"]), "k^T * scale")
    vt = pack_transposed(bl, vv, what, Skp, None, "v^T")
    qt = pack_transposed(bl, q, what, Sqp, None, "q^T")
    dot = pack_transposed(bl, do, what, Sqp, None, "dO^T")
    lp = bl._buf(f"t{len(bl.buffers)}", "temp", "f32", B * H * Sqp)
    dp = bl._buf(f"t{len(bl.buffers)}", "temp", "f32", B * H * Sqp)
    out = bl.bufs[v]
    eff = Sk if p["kind"] in ("", "tensor") else (
        min(Sk, p["window"]) if p["kind"] == "sliding" else max(1, min(Sk, Sq) // 2))
    common = dict(mask=mb, mstrides=mstr, B=B, H=H, Sq=Sq, Sk=Sk, D=D, Sqp=Sqp, Skp=Skp,
                  softcap=float(p["softcap"] or 0.0), kind=p["kind"], window=int(p["window"]),
                  vl=vl, scale=float(p["scale"]))
    m = [mb] if mb is not None else []
    work = 6 * B * H * Sq * eff * D
    bl._add(AttentionDqKernel(bl._kname("attention_dq"), what + " (dq)",
                              [buf["q"], kt, vt, buf["k"], buf["o"], buf["dO"], buf["L"], lp, dp]
                              + m + [out], work=work, parallel=work >= PAR_MIN_WORK, **common))
    work = 8 * B * H * Sq * eff * D
    bl._add(AttentionDkvKernel(bl._kname("attention_dkv"), what + " (dk, dv)",
                               [kt, qt, dot, buf["v"], buf["q"], buf["dO"], lp, dp] + m + [out],
                               work=work, parallel=work >= PAR_MIN_WORK, **common))


__all__ = ["AttentionDqKernel", "AttentionDkvKernel", "attention_pair_kernels",
           "attention_bwd_kernels", "bwd_geometry", "bwd_rows"]

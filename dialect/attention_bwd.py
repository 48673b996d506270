"""rlx.attention_lse and rlx.attention_bwd: attention's backward as two fused ops.

    rlx.attention_lse(q, k, v [, mask]) {scale, softcap, kind, window}   -> L (B, H, Sq, 1)
        L[i] = log sum_j exp(S[i, j]) over the allowed keys j (S: rlx.attention's scores,
        softcap included); a fully masked row gives L = 0 (the forward's convention:
        row max -inf -> 0, row sum 0 -> 1), so exp(S - L) is 0 on all of it
    rlx.attention_bwd(q, k, v, o, dO, L [, mask]) {same params}         -> (B, H, Sq+2Sk, D)
        [dq ; dk ; dv] along axis 2 (one result; the VJP slices it):
        P = exp(S - L) (0 where masked), Delta_i = rowsum(dO * O)_i
        dv = P^T dO,  dS = P * (dO v^T - Delta) [* (1 - tanh^2(s / c)) with softcap c]
        dq = scale * dS k,  dk = scale * dS^T q

FlashAttention-2's backward: the forward keeps only O and L; the backward recomputes
P tile by tile from q, k and L, so nothing of size (Sq, Sk) is stored.  The VJP of
rlx.attention (dialect/attention.py) emits these two ops when `use_fused(op)` (f32,
static sizes, the CPU's fused forward covers it); the CPU computes L in the forward's
kernel (one kernel writes O and L) and the backward in lowering/cpu/attention_bwd.py.

- `lse_ref`, `bwd_ref`: the NumPy references (the interpreter's rules).
- `expand`: the ops as plain rlx ops (query-blocked, dialect/attention.py's Expander);
  the GPU and any backend without a fused kernel start from it.
- `vjp_by_expansion`, `jvp_by_expansion`: the derivatives of both ops are those of their
  expansion, emitted inline and differentiated op by op with the ordinary rule tables;
  so grad of grad (hvp, jvp of grad) through attention works.
- vmap folds the batch into B (attention.attention_vmap serves all three ops).
"""
from __future__ import annotations

import numpy as np

from rlxc.runtime.errors import ShapeError

FUSED = True            # tests switch the fused backward off to compare with the expansion
ATTN_PARAMS = {"scale": "float", "softcap": "float", "kind": "str", "window": "int"}


# ---------------------------------------------------------------- when

def use_fused(op) -> bool:
    """Does rlx.attention's VJP use rlx.attention_lse + rlx.attention_bwd?  Where the
    CPU's fused forward covers the op: f32, static and non-empty sizes."""
    from .types import dtype_of, shape_of

    if not FUSED or dtype_of(op.operands[0].type) != "f32":
        return False
    q, k = (shape_of(o.type) for o in op.operands[:2])
    dims = tuple(q) + (k[2],)
    return all(isinstance(d, int) and d >= 1 for d in dims)


# ---------------------------------------------------------------- shapes

def _check_attention(types, what, scale, softcap, kind, window):
    from .shapes import SHAPES

    try:   # rlx.attention's shape function (its checks of q, k, v and the mask)
        return SHAPES["rlx.attention"].infer(types, scale, softcap, kind, window)
    except ShapeError as e:
        raise ShapeError(f"{what}: {str(e).removeprefix('attention: ')}") from None


def infer_lse(types, scale, softcap, kind="", window=0):
    """Operands as rlx.attention's; result (B, H, Sq, 1) in q's dtype."""
    shape, dt = _check_attention(types, "attention_lse", scale, softcap, kind, window)
    return tuple(shape[:3]) + (1,), dt


def infer_bwd(types, scale, softcap, kind="", window=0):
    """q, k, v, o, dO, L [, mask]; result (B, H, Sq + 2 Sk, D) = [dq; dk; dv]."""
    if len(types) < 6:
        raise ShapeError(f"attention_bwd: takes q, k, v, o, dO, L [, mask], got "
                         f"{len(types)} operands")
    q, k, v, o, do, lse = types[:6]
    shape, dt = _check_attention([q, k, v] + list(types[6:]), "attention_bwd", scale, softcap,
                                 kind, window)
    B, H, Sq, D = shape
    Sk = k.shape[2]
    for n, t, want in (("o", o, shape), ("dO", do, shape), ("L", lse, (B, H, Sq, 1))):
        if tuple(t.shape) != tuple(want) or t.dtype != dt:
            raise ShapeError(f"attention_bwd: {n} must be {dt} of shape {tuple(want)}, got "
                             f"{t.dtype} {tuple(t.shape)}")
    if isinstance(Sq, str) or isinstance(Sk, str):
        raise ShapeError(f"attention_bwd: static sequence lengths only, got Sq={Sq} Sk={Sk}")
    return (B, H, Sq + 2 * Sk, D), dt


BWD_SHAPES = {"attention_lse": infer_lse, "attention_bwd": infer_bwd}


# ---------------------------------------------------------------- semantics

def _scores(q, k, mask, scale, softcap, kind, window):
    """(S masked to -inf, tanh term or None, allowed or None) in q's dtype."""
    from .attention import allowed_mask

    dt = q.dtype
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * dt.type(scale)
    t = None
    if softcap:
        t = np.tanh(s / dt.type(softcap))
        s = dt.type(softcap) * t
    m = None
    if kind in ("causal", "sliding"):
        m = allowed_mask(kind, window, q.shape[2], k.shape[2])
    elif kind == "tensor":
        m = np.broadcast_to(mask[0].astype(bool), s.shape)
    if m is not None:
        s = np.where(m, s, dt.type(-np.inf))
    return s, t, m


def lse_ref(q, k, v, *mask, scale, softcap, kind="", window=0):
    dt = q.dtype
    s, _, _ = _scores(q, k, mask, scale, softcap, kind, window)
    mx = s.max(axis=-1, keepdims=True)
    mx = np.where(np.isneginf(mx), dt.type(0), mx)
    den = np.exp(s - mx).sum(axis=-1, keepdims=True)
    return (mx + np.log(np.where(den == 0, dt.type(1), den))).astype(dt)


def bwd_ref(q, k, v, o, do, lse, *mask, scale, softcap, kind="", window=0):
    dt = q.dtype
    s, t, m = _scores(q, k, mask, scale, softcap, kind, window)
    p = np.exp(s - lse)
    if m is not None:
        p = np.where(m, p, dt.type(0))
    dv = np.matmul(np.swapaxes(p, -1, -2), do)
    delta = (do * o).sum(axis=-1, keepdims=True)
    ds = p * (np.matmul(do, np.swapaxes(v, -1, -2)) - delta)
    if t is not None:
        ds = ds * (1 - t * t)
    if m is not None:
        ds = np.where(m, ds, dt.type(0))
    ds = ds * dt.type(scale)
    return np.concatenate([np.matmul(ds, k), np.matmul(np.swapaxes(ds, -1, -2), q), dv],
                          axis=2).astype(dt)


# ---------------------------------------------------------------- expansion

class _Attn:
    """rlx.attention's view of a derived op (its q, k, v and mask operands)."""

    def __init__(self, op):
        ops = list(op.operands)
        self.operands = ops[:3] + (ops[6:] if op.name == "rlx.attention_bwd" else ops[3:])
        self._params = op.params()

    def params(self):
        return self._params


def _lse_expand(x):
    """L block by block: max + log(sum exp(S - max)) (max a stop_gradient, as softmax's)."""
    import math

    b = x.b
    outs = []
    for q0, q1, k0, k1 in x.blocks:
        if k1 == k0:
            outs.append(b.full(0, (x.B, x.H, q1 - q0, 1), x.dtype))
            continue
        qb = x.rows(x.q, q0, q1)
        kt = x.scaled_kt()
        if (k0, k1) != (0, x.sk):
            kt = b.op("slice", kt, starts=(0, 0, 0, k0), limits=kt.shape[:3] + (k1,),
                      strides=(1, 1, 1, 1))
        s = b.op("matmul", qb, kt)
        if x.p["softcap"]:
            s = (s * (1.0 / x.p["softcap"])).tanh() * x.p["softcap"]
        m = x.block_mask(q0, q1, k0, k1)
        if m is not None:
            s = b.select(m, s, b.full(-math.inf, s.shape, x.dtype))
        mx = x.row_reduce("max", s)
        if m is not None:
            mx = b.select(mx.eq(b.full(-math.inf, mx.shape, x.dtype)),
                          b.full(0, mx.shape, x.dtype), mx)
        mx = b.op("stop_gradient", mx)
        den = x.row_reduce("sum", (s - b.broadcast_to(mx, s.shape)).exp())
        if m is not None:
            den = b.select(den.eq(b.full(0, den.shape, x.dtype)),
                           b.full(1, den.shape, x.dtype), den)
        outs.append(mx + den.log())
    return x.concat_rows(outs)


def expand(b, op, rows: int | None = None):
    """Emit `op` (rlx.attention_lse or rlx.attention_bwd) as rlx ops through the
    autodiff Builder `b`; returns the V of its result."""
    from .attention import Expander

    x = Expander(b, _Attn(op), rows)
    if op.name == "rlx.attention_lse":
        if not x.blocks or not x.d:
            return b.full(0, (x.B, x.H, x.sq, 1), x.dtype)
        return _lse_expand(x)
    o, do = (b.wrap(v) for v in op.operands[3:5])
    dq, dk, dv = x.backward(o, do, (True, True, True))[:3]
    return b.op("concat", dq, dk, dv, axis=2)


# ---------------------------------------------------------------- derivatives

def _emitted(b, mark):
    """The ops the builder emitted since `mark` (the op before its anchor then)."""
    out, op = [], (mark.next_op if mark is not None else b.block.first_op)
    while op is not None and op is not b.anchor:
        out.append(op)
        op = op.next_op
    return out


def vjp_by_expansion(b, op, g, need):
    """The op's expansion, then reverse mode through it with autodiff.VJP_RULES."""
    from .autodiff import VJP_RULES, ZERO_DERIVATIVE, differentiable

    mark = b.anchor.prev_op
    r = expand(b, op)
    new = _emitted(b, mark)
    active = {o for o, n in zip(op.operands, need) if n}
    for e in new:
        if e.name not in ZERO_DERIVATIVE and e.results and differentiable(e.results[0]) \
                and any(o in active for o in e.operands):
            active.add(e.results[0])
    ct = {r.v: g}
    for e in reversed(new):
        c = ct.pop(e.results[0], None) if e.results else None
        if c is None:
            continue
        en = tuple(o in active for o in e.operands)
        if not any(en):
            continue
        for o, n, d in zip(e.operands, en, VJP_RULES[e.name](b, e, c, en)):
            if n and d is not None:
                ct[o] = b.add_opt(ct.get(o), d)
    return [ct.get(o) if n else None for o, n in zip(op.operands, need)]


def jvp_by_expansion(b, op, ts):
    """The op's expansion, then forward mode through it with jvp.JVP_RULES."""
    from .autodiff import ZERO_DERIVATIVE, differentiable
    from .jvp import JVP_RULES

    mark = b.anchor.prev_op
    r = expand(b, op)
    tan = {o: t for o, t in zip(op.operands, ts) if t is not None}
    for e in _emitted(b, mark):
        if not e.results or e.name in ZERO_DERIVATIVE or not differentiable(e.results[0]):
            continue
        ets = [tan.get(o) for o in e.operands]
        if all(t is None for t in ets):
            continue
        t = JVP_RULES[e.name](b, e, ets)
        if t is not None:
            tan[e.results[0]] = t
    return tan.get(r.v)


# ---------------------------------------------------------------- rlx.attention's VJP

def fused_vjp(b, op, g, need):
    """dq, dk, dv of rlx.attention through rlx.attention_lse + rlx.attention_bwd."""
    ins = [b.wrap(o) for o in op.operands]
    q, k = ins[0], ins[1]
    mask = ins[3:]
    p = op.params()
    lse = b.op("attention_lse", *ins[:3], *mask, **p)
    r = b.op("attention_bwd", *ins[:3], b.wrap(op.results[0]), g, lse, *mask, **p)
    B, H, Sq, D = q.shape
    Sk = k.shape[2]
    out = []
    for j, (a, z) in enumerate(((0, Sq), (Sq, Sq + Sk), (Sq + Sk, Sq + 2 * Sk))):
        out.append(b.op("slice", r, starts=(0, 0, a, 0), limits=(B, H, z, D),
                        strides=(1, 1, 1, 1)) if need[j] else None)
    return out + [None] * (len(need) - 3)


__all__ = ["use_fused", "lse_ref", "bwd_ref", "expand", "vjp_by_expansion",
           "jvp_by_expansion", "fused_vjp", "BWD_SHAPES", "FUSED"]

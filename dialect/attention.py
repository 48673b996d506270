"""rlx.attention: its reference semantics, its expansion and its transform rules.

    rlx.attention(q, k, v [, mask]) {scale, softcap, kind, window}
        q (B, H, Sq, D), k and v (B, H, Sk, D), result (B, H, Sq, D)

    S = scale * q k^T                       (B, H, Sq, Sk)
    S = softcap * tanh(S / softcap)         (softcap > 0 only)
    allowed[i, j]:  kind ""       always
                    "causal"      j <= i              (top-left aligned, as torch's is_causal)
                    "sliding"     i - window < j <= i (the last `window` keys, self included)
                    "tensor"      the i1 mask operand (dims 1 or full), True = attend
    P = softmax over j of S where allowed; a row with nothing allowed is all zeros
    O = P v

One op, so that backends can tile it; the rules here are the only place that
knows the math:

- `attention_ref`: the NumPy reference (the interpreter's rule).
- `Expander`: emits the op as existing rlx ops, query block by query block.
  Block i reads only the keys its rows may attend (causal: [0, q1); sliding:
  [q0 - window + 1, q1)), so its scores are (B, H, bq, <= Sk) and the full
  (Sq, Sk) matrix never exists when Sq * Sk is large: the buffer planner reuses
  one block's scratch for the next.  Tiny sizes are one block (plain
  matmul-softmax-matmul).  The max is a stop_gradient (softmax does not
  depend on it), and masked scores are -inf before the exp, so no inf * 0
  appears in any derivative.
- `attention_vjp`: the backward recomputes P block by block from q and k
  (flash-style: nothing but O is kept from the forward) and uses
  dS = P * (dP - rowsum(dO * O)); dK and dV accumulate over the blocks.
  It emits rlx ops only, so grad of grad, jvp of grad and vmap of grad work.
- `attention_jvp`: tO = dP v + P tv with dP = P * (tS - rowsum(P * tS)),
  query block by query block like the backward.
- `attention_vmap`: the vmapped axis folds into B (one op, no loop).
- `expand_module` (lowering): every rlx.attention of a module as its expansion;
  the CPU and GPU backends start from it.
"""
from __future__ import annotations

import math

import numpy as np

from .types import dense_attr, shape_of, tensor_type

# one block (no tiling) while the scores have at most this many elements;
# otherwise query blocks of ~BLOCK_ELEMS scores each, at least MIN_ROWS rows
SINGLE_ELEMS = 1 << 21
BLOCK_ELEMS = 1 << 22
MIN_ROWS = 32


# ---------------------------------------------------------------- semantics

def allowed_mask(kind: str, window: int, sq: int, sk: int, q0: int = 0, k0: int = 0,
                 rows: int | None = None, cols: int | None = None):
    """(rows, cols) bool array of the causal/sliding rule for rows q0.. and cols k0.."""
    rows = sq - q0 if rows is None else rows
    cols = sk - k0 if cols is None else cols
    d = np.arange(q0, q0 + rows)[:, None] - np.arange(k0, k0 + cols)[None, :]
    m = d >= 0
    if kind == "sliding":
        m &= d < window
    return m


def attention_ref(q, k, v, *mask, scale, softcap, kind="", window=0):
    """The interpreter's rule (NumPy, in the operands' float dtype)."""
    dt = q.dtype
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * dt.type(scale)
    if softcap:
        s = dt.type(softcap) * np.tanh(s / dt.type(softcap))
    if kind in ("causal", "sliding"):
        m = allowed_mask(kind, window, q.shape[2], k.shape[2])
    elif kind == "tensor":
        m = mask[0].astype(bool)
    else:
        m = None
    if m is not None:
        s = np.where(m, s, dt.type(-np.inf))
    mx = s.max(axis=-1, keepdims=True) if s.shape[-1] else np.zeros(s.shape[:-1] + (1,), dt)
    mx = np.where(np.isneginf(mx), dt.type(0), mx)
    e = np.exp(s - mx)
    den = e.sum(axis=-1, keepdims=True)
    p = e / np.where(den == 0, dt.type(1), den)
    return np.matmul(p, v).astype(dt)


def _span(a, z):
    """z - a for a block's bounds; a symbolic bound only spans a whole axis (a == 0)."""
    return z if isinstance(z, str) and a == 0 else z - a


def blocks(sq: int, sk: int, bh: int, kind: str, window: int, rows: int | None = None):
    """[(q0, q1, k0, k1)]: query blocks and the key range their rows may attend.
    With a dynamic (symbolic) size: one block of every row and key (the mask does the
    rest; the block sizes are not known at trace time)."""
    if any(isinstance(d, str) for d in (sq, sk, bh)):
        return [(0, sq, 0, sk)]
    if rows is None:
        if sq * sk * bh <= SINGLE_ELEMS or sq <= MIN_ROWS:
            rows = sq
        else:   # at least two blocks
            rows = max(MIN_ROWS, min((sq + 1) // 2, BLOCK_ELEMS // max(1, sk * bh)))
    out = []
    for q0 in range(0, sq, max(rows, 1)):
        q1 = min(sq, q0 + rows)
        k0, k1 = 0, sk
        if kind in ("causal", "sliding"):
            k1 = min(sk, q1)
            if kind == "sliding":
                k0 = min(k1, max(0, q0 - window + 1))
        out.append((q0, q1, k0, k1))
    return out


# ---------------------------------------------------------------- expansion

class Expander:
    """Emits one rlx.attention's math as rlx ops through an autodiff Builder."""

    def __init__(self, b, op, rows: int | None = None):
        from .autodiff import V

        self.b = b
        self.p = op.params()
        ins = [b.wrap(o) for o in op.operands]
        self.q, self.k, self.v = ins[:3]
        self.mask = ins[3] if len(ins) > 3 else None
        B, H, self.sq, self.d = self.q.shape
        self.B, self.H, self.sk = B, H, self.k.shape[2]
        self.dtype = self.q.dtype
        bh = B if isinstance(B, str) else B * H
        self.blocks = blocks(self.sq, self.sk, bh, self.p["kind"], self.p["window"], rows)
        self._V = V
        self._qs = None

    # -- small emitters
    def rows(self, x, a, z):
        """x[:, :, a:z] (no op when it is all of x)."""
        s = x.shape
        if (a, z) == (0, s[2]):
            return x
        return self.b.op("slice", x, starts=(0, 0, a, 0), limits=(s[0], s[1], z, s[3]),
                         strides=(1, 1, 1, 1))

    def const(self, array, dtype):
        from .ops import ConstantOp

        arr = np.asarray(array)
        op = ConstantOp.create(result_types=[tensor_type(arr.shape, dtype)],
                               properties={"value": dense_attr(arr, dtype)})
        self.b.block.insert_op_before(op, self.b.anchor)
        return self.b.wrap(op.results[0])

    def iota(self, n):
        """0..n-1 (i32) for a dynamic size n: rlx.iota (dialect/iota.py), or a constant."""
        if not isinstance(n, str):
            return self.const(np.arange(n, dtype=np.int32), "i32")
        from .iota import IotaOp
        from .ops import create_op

        op = create_op(IotaOp, [], tensor_type((n,), "i32"), size=n)
        self.b.block.insert_op_before(op, self.b.anchor)
        return self.b.wrap(op.results[0])

    def block_mask(self, q0, q1, k0, k1):
        """The i1 mask of a block broadcast to (B, H, bq, kn), or None when all allowed."""
        b, kind, w = self.b, self.p["kind"], self.p["window"]
        full = (self.B, self.H, _span(q0, q1), _span(k0, k1))
        if kind == "tensor":
            m = self.mask
            ms = m.shape
            if ms[2] != 1 or ms[3] != 1:
                m = b.op("slice", m, starts=(0, 0, q0 if ms[2] != 1 else 0, k0 if ms[3] != 1 else 0),
                         limits=(ms[0], ms[1], q1 if ms[2] != 1 else 1, k1 if ms[3] != 1 else 1),
                         strides=(1, 1, 1, 1))
            return b.broadcast_to(m, full)
        if kind not in ("causal", "sliding"):
            return None
        if isinstance(self.sq, str) or isinstance(self.sk, str):   # one block, symbolic
            full = (self.B, self.H, self.sq, self.sk)
            r = b.broadcast_to(b.reshape(self.iota(self.sq), (self.sq, 1)), full[2:])
            c = b.broadcast_to(b.reshape(self.iota(self.sk), (1, self.sk)), full[2:])
        elif allowed_mask(kind, w, self.sq, self.sk, q0, k0, q1 - q0, k1 - k0).all():
            return None
        else:
            r = b.broadcast_to(self.const(np.arange(q0, q1, dtype=np.int32).reshape(-1, 1),
                                          "i32"), full[2:])
            c = b.broadcast_to(self.const(np.arange(k0, k1, dtype=np.int32).reshape(1, -1),
                                          "i32"), full[2:])
        d = r - c
        m = d.ge(b.full(0, full[2:], "i32"))
        if kind == "sliding":
            m = b.op("mul", m, d.lt(b.full(w, full[2:], "i32")))
        return b.broadcast_to(b.reshape(m, (1, 1) + full[2:]), full)

    def scaled_kt(self):
        """k^T * scale (B, H, D, Sk), once per expansion: the scores' matmul then reads
        a row-major right operand (no strided packing) and has no epilogue."""
        if self._qs is None:
            self._qs = self.b.mT(self.k) * self.p["scale"]
        return self._qs

    def probs(self, q0, q1, k0, k1, normalize=True):
        """(P, tanh term or None, q block, k block, v block) of one block; with
        normalize=False (the forward's lowering only: not for differentiation),
        (exp(S - max), row sums (1 where 0), ...) instead of P."""
        b, p = self.b, self.p
        qb, kb, vb = self.rows(self.q, q0, q1), self.rows(self.k, k0, k1), \
            self.rows(self.v, k0, k1)
        kt = self.scaled_kt()
        if (k0, k1) != (0, self.sk):
            kt = b.op("slice", kt, starts=(0, 0, 0, k0), limits=kt.shape[:3] + (k1,),
                      strides=(1, 1, 1, 1))
        s = b.op("matmul", qb, kt)
        t = None
        if p["softcap"]:
            t = (s * (1.0 / p["softcap"])).tanh()
            s = t * p["softcap"]
        m = self.block_mask(q0, q1, k0, k1)
        raw = s
        if m is not None:
            s = b.select(m, s, b.full(-math.inf, s.shape, self.dtype))
        mx = self.row_reduce("max", s)
        if m is not None:
            mx = b.select(mx.eq(b.full(-math.inf, mx.shape, self.dtype)),
                          b.full(0, mx.shape, self.dtype), mx)
        mx = b.op("stop_gradient", mx)
        if m is not None and not normalize:
            # lowering only (never differentiated): the select sits after the exp, so the
            # masked scores are not a buffer of their own (an exp that overflows where
            # masked is dropped by the select)
            e = b.select(m, (raw - b.broadcast_to(mx, s.shape)).exp(),
                         b.full(0, s.shape, self.dtype))
        else:
            e = (s - b.broadcast_to(mx, s.shape)).exp()
        den = self.row_reduce("sum", e)
        if m is not None:
            den = b.select(den.eq(b.full(0, den.shape, self.dtype)),
                           b.full(1, den.shape, self.dtype), den)
        if not normalize:
            return e, den, qb, kb, vb
        return e / b.broadcast_to(den, s.shape), t, qb, kb, vb

    def row_reduce(self, name, x):
        """Reduce the last dim keeping it (size 1).  A row of a multiple of 16 is reduced
        as (n/16, 16) -> 16 -> 1: the first step runs across 16 contiguous lanes (vector
        code), where one scalar accumulator per row would be a serial chain."""
        b = self.b
        n = x.shape[3]
        if isinstance(n, str) or n % 16 or n < 64:
            return b.reduce(name, x, (3,), keepdims=True)
        part = b.reduce(name, b.reshape(x, x.shape[:3] + (n // 16, 16)), (3,))
        return b.reduce(name, part, (3,), keepdims=True)

    def zeros(self, rows, cols=None):
        return self.b.full(0, (self.B, self.H, rows, self.d if cols is None else cols), self.dtype)

    def pad_keys(self, x, k0, k1):
        if (k0, k1) == (0, self.sk):
            return x
        return self.b.op("pad", x, low=(0, 0, k0, 0), high=(0, 0, self.sk - k1, 0))

    def concat_rows(self, parts):
        return parts[0] if len(parts) == 1 else self.b.op("concat", *parts, axis=2)

    # -- the op and its derivatives
    def forward(self):
        if not self.blocks or not self.d:
            return self.zeros(self.sq)
        outs = []
        for q0, q1, k0, k1 in self.blocks:
            if k1 == k0:
                outs.append(self.zeros(q1 - q0))
                continue
            # (e v) / rowsum(e): the division touches D columns, not Sk
            e, den, _, _, vb = self.probs(q0, q1, k0, k1, normalize=False)
            o = self.b.op("matmul", e, vb)
            outs.append(o / self.b.broadcast_to(den, o.shape))
        return self.concat_rows(outs)

    def backward(self, out, g, need):
        b, p = self.b, self.p
        if not self.blocks or not self.d:
            z = [self.zeros(self.sq), self.zeros(self.sk), self.zeros(self.sk)]
            return [zz if n else None for zz, n in zip(z, need)] + [None] * (len(need) - 3)
        dq, dk, dv = [], None, None
        for q0, q1, k0, k1 in self.blocks:
            if k1 == k0:
                dq.append(self.zeros(q1 - q0))
                continue
            pr, t, qb, kb, vb = self.probs(q0, q1, k0, k1)
            gb, ob = self.rows(g, q0, q1), self.rows(out, q0, q1)
            if need[2]:
                dv = b.add_opt(dv, self.pad_keys(b.op("matmul", b.mT(pr), gb), k0, k1))
            if not (need[0] or need[1]):
                continue
            dp = b.op("matmul", gb, b.mT(vb))
            delta = b.reduce("sum", gb * ob, (3,), keepdims=True)
            ds = pr * (dp - b.broadcast_to(delta, dp.shape))
            if t is not None:
                ds = ds * (1.0 - t * t)
            ds = ds * p["scale"]
            if need[0]:
                dq.append(b.op("matmul", ds, kb))
            if need[1]:
                dk = b.add_opt(dk, self.pad_keys(b.op("matmul", b.mT(ds), qb), k0, k1))
        dq = self.concat_rows(dq) if need[0] else None
        if need[1] and dk is None:
            dk = self.zeros(self.sk)
        if need[2] and dv is None:
            dv = self.zeros(self.sk)
        return [dq, dk, dv] + ([None] if self.mask is not None else [])

    def tangent(self, tq, tk, tv):
        """Forward mode, block by block like the backward (tangent scores per block)."""
        b, p = self.b, self.p
        if not self.blocks or not self.d:
            return None
        outs = []
        for q0, q1, k0, k1 in self.blocks:
            if k1 == k0:
                outs.append(self.zeros(q1 - q0))
                continue
            pr, t, qb, kb, vb = self.probs(q0, q1, k0, k1)
            out = None
            if tq is not None or tk is not None:
                ts = b.add_opt(
                    b.op("matmul", self.rows(tq, q0, q1), b.mT(kb)) if tq is not None else None,
                    b.op("matmul", qb, b.mT(self.rows(tk, k0, k1))) if tk is not None else None)
                ts = ts * p["scale"]
                if t is not None:
                    ts = ts * (1.0 - t * t)
                w = pr * ts
                tp = w - pr * b.broadcast_to(self.row_reduce("sum", w), w.shape)
                out = b.op("matmul", tp, vb)
            if tv is not None:
                out = b.add_opt(out, b.op("matmul", pr, self.rows(tv, k0, k1)))
            outs.append(out)
        return self.concat_rows(outs)


# ---------------------------------------------------------------- transform rules

def attention_vjp(b, op, g, need):
    """rlx.attention_lse + rlx.attention_bwd where the fused forward is used (f32, static
    sizes: dialect/attention_bwd.py), else the expansion's backward."""
    from .attention_bwd import fused_vjp, use_fused

    if use_fused(op):
        return fused_vjp(b, op, g, need)
    return Expander(b, op).backward(b.wrap(op.results[0]), g, need)


def attention_jvp(b, op, ts):
    return Expander(b, op).tangent(*ts[:3])


def attention_vmap(bt, op, xs, bs):
    """Fold the vmapped axis N into B: (N, B, H, S, D) -> (N*B, H, S, D), one op.  The same
    rule batches rlx.attention_lse and rlx.attention_bwd (operands (B, H, ...), a mask last)."""
    from .ops import OPS

    xs = [x if bb else bt.bcast(x) for x, bb in zip(xs, bs)]
    n = bt.B
    q = xs[0]
    B = shape_of(q)[1]
    nm = len(xs) - (op.params()["kind"] == "tensor")
    if isinstance(B, str):
        return _vmap_into_heads(bt, op, xs, n)
    new = [bt.reshape(x, (n * B,) + shape_of(x)[2:]) for x in xs[:nm]]
    if len(xs) > nm:
        m = xs[nm]
        ms = shape_of(m)
        m = bt.emit(OPS["rlx.broadcast_to"], [m], shape=(n, B) + ms[2:]) if ms[1] != B else m
        new.append(bt.reshape(m, (n * B,) + ms[2:]))
    r = bt.emit(OPS[op.name], new, **op.params())
    return bt.reshape(r, (n, B) + shape_of(r)[1:])


def _vmap_into_heads(bt, op, xs, n):
    """A dynamic B cannot merge with N: (N, B, H, S, D) -> (B, N*H, S, D) instead (N and
    H are static), one op, and back.  A mask's head dim 1 is broadcast to H first."""
    from .ops import OPS

    q = xs[0]
    H = shape_of(q)[2]

    def fold(x, heads):
        s = shape_of(x)
        x = bt.transpose(x, (1, 0) + tuple(range(2, len(s))))       # (B, N, h, S, D)
        if s[2] != heads:
            x = bt.emit(OPS["rlx.broadcast_to"], [x], shape=(s[1], n, heads) + s[3:])
        return bt.reshape(x, (s[1], n * heads) + s[3:])
    nm = len(xs) - (op.params()["kind"] == "tensor")
    new = [fold(x, H) for x in xs[:nm]]
    if len(xs) > nm:
        new.append(fold(xs[nm], H))
    r = bt.emit(OPS[op.name], new, **op.params())
    s = (None,) + tuple(shape_of(q)[1:3]) + tuple(shape_of(r)[2:])
    r = bt.reshape(r, (s[1], n) + s[2:])
    return bt.transpose(r, (1, 0, 2, 3, 4))


# ---------------------------------------------------------------- lowering

def expand_module(module, rows: int | None = None, keep=None):
    """`module`, or a clone with every rlx.attention replaced by its expansion (except
    those for which `keep(op)` is true: a backend's fused kernel computes them)."""
    from .autodiff import Builder
    from .module import get_func

    from .attention_bwd import expand as expand_derived

    names = ("rlx.attention", "rlx.attention_lse", "rlx.attention_bwd")
    if not any(op.name in names and not (keep and keep(op))
               for op in get_func(module).body.block.ops):
        return module
    module = module.clone()
    block = get_func(module).body.block
    for op in list(block.ops):
        if op.name not in names or (keep and keep(op)):
            continue
        if op.name != "rlx.attention":   # the fused backward's ops (dialect/attention_bwd.py)
            new = expand_derived(Builder(block, op), op, rows)
        else:
            new = Expander(Builder(block, op), op, rows).forward()
        op.results[0].replace_all_uses_with(new.v)
        block.erase_op(op)
    return module


__all__ = ["attention_ref", "attention_vjp", "attention_jvp", "attention_vmap", "expand_module",
           "blocks", "allowed_mask", "Expander"]

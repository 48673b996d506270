"""rlxc.nn: model building blocks as plain functions of a scope (no module system).

Each helper declares its params on the scope `s` under a name prefix and
returns a Tensor; calling it twice with two prefixes gives two layers.

    linear(s, "fc", x, 64)                 params fc.w (din, 64), fc.b (64,)
    layer_norm(s, "ln", x)                 params ln.g, ln.b (last dim)
    embedding(s, "tok", ids, vocab, dim)   param tok.table (vocab, dim); ids i32/i64
    mlp(s, "mlp", x, hidden)               linear -> gelu -> linear
    attention_block(s, "attn", x, heads, mask="causal", rope=False, softcap=None)
        x (B, S, d) -> qkv projection (d, 3d) -> heads (B, H, S, d/H) -> optional
        rotary embedding of q and k -> rlxc.attention -> merge heads -> out projection
    transformer_block(s, "blk0", x, heads, ...)   pre-LN: x + attn(ln(x)); x + mlp(ln(x))
    rope(x, base=10000.0)                  rotary position embedding of (B, H, S, D)
    init(func, seed, std)                  binds every param by its suffix: .g ones,
                                           .b zeros, others normal(0, std) (NumPy)

Convolution helpers (conv2d with its params) live in their own file
(rlxc/nn_conv.py) and are re-exported here when present.  `dropout`, where
the Tensor has it, is applied by callers through the `dropout` argument:
a function h -> h (identity by default).
"""
from __future__ import annotations

import numpy as np


def linear(s, name: str, x, dout: int, bias: bool = True):
    """x @ w + b over the last dim of x; params NAME.w (din, dout), NAME.b (dout,)."""
    w = s.param(f"{name}.w", (x.shape[-1], dout))
    return x.linear(w, s.param(f"{name}.b", (dout,)) if bias else None)


def layer_norm(s, name: str, x, eps: float = 1e-5):
    """Layer norm over the last dim with a gain NAME.g and a shift NAME.b."""
    d = x.shape[-1]
    return x.layer_norm(-1, eps, weight=s.param(f"{name}.g", (d,)),
                        bias=s.param(f"{name}.b", (d,)))


def embedding(s, name: str, ids, vocab: int, dim: int):
    """Rows of the table NAME.table (vocab, dim) at integer `ids`: shape ids.shape + (dim,).
    Ids outside [0, vocab) raise IndexError at run time (cpu, interp)."""
    return s.param(f"{name}.table", (vocab, dim)).gather(ids, axis=0)


def mlp(s, name: str, x, hidden: int, act: str = "gelu"):
    """linear(hidden) -> activation (a Tensor method name) -> linear(back to d)."""
    h = getattr(linear(s, f"{name}.fc1", x, hidden), act)()
    return linear(s, f"{name}.fc2", h, x.shape[-1])


def rope(x, base: float = 10000.0):
    """Rotary position embedding (GPT-NeoX layout: the two halves of the last dim
    rotate as pairs) of x (B, H, S, D), D even; positions 0..S-1."""
    B, H, S, D = x.shape
    if D % 2:
        raise ValueError(f"rope: the head dim must be even, got {D}")
    half = D // 2
    inv = base ** (-np.arange(half, dtype=np.float64) / half)
    ang = np.arange(S, dtype=np.float64)[:, None] * inv[None, :]
    s = x.scope
    cos = s.constant(np.cos(ang).astype(np.float32))
    sin = s.constant(np.sin(ang).astype(np.float32))
    a, b = x.narrow(3, 0, half), x.narrow(3, half, half)
    from rlxc.tensor import concat

    return concat([a * cos - b * sin, a * sin + b * cos], axis=3)


def split_heads(x, heads: int):
    """(B, S, d) -> (B, heads, S, d / heads)."""
    B, S, d = x.shape
    if d % heads:
        raise ValueError(f"split_heads: width {d} is not a multiple of {heads} heads")
    return x.reshape(B, S, heads, d // heads).transpose(0, 2, 1, 3)


def merge_heads(x):
    """(B, H, S, Dh) -> (B, S, H * Dh)."""
    B, H, S, Dh = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, S, H * Dh)


def attention_block(s, name: str, x, heads: int, mask="causal", rope_base=None,
                    softcap=None, dropout=None):
    """Multi-head self-attention of x (B, S, d): params NAME.qkv.{w,b}, NAME.out.{w,b}.
    `rope_base` (e.g. 10000.0) rotates q and k; `dropout` (h -> h) acts on the output."""
    from rlxc.attention_op import attention

    B, S, d = x.shape
    qkv = linear(s, f"{name}.qkv", x, 3 * d)
    q, k, v = (split_heads(qkv.narrow(2, i * d, d), heads) for i in range(3))
    if rope_base is not None:
        q, k = rope(q, rope_base), rope(k, rope_base)
    o = linear(s, f"{name}.out", merge_heads(attention(q, k, v, mask=mask, softcap=softcap)), d)
    return dropout(o) if dropout is not None else o


def transformer_block(s, name: str, x, heads: int, mlp_ratio: int = 4, mask="causal",
                      rope_base=None, softcap=None, dropout=None):
    """Pre-LN block: x + attn(ln1(x)), then + mlp(ln2(x)); `dropout` on both branches."""
    x = x + attention_block(s, f"{name}.attn", layer_norm(s, f"{name}.ln1", x), heads, mask,
                            rope_base, softcap, dropout)
    h = mlp(s, f"{name}.mlp", layer_norm(s, f"{name}.ln2", x), mlp_ratio * x.shape[-1])
    return x + (dropout(h) if dropout is not None else h)


def init(func, seed: int = 0, std: float = 0.02):
    """`func` with every param bound: NAME.g ones, NAME.b zeros, others normal(0, std)."""
    rng = np.random.default_rng(seed)
    vals = {}
    for n in func.param_names():
        shp = func.param_shape_of(n)
        if n.endswith(".g"):
            vals[n] = np.ones(shp, np.float32)
        elif n.endswith(".b"):
            vals[n] = np.zeros(shp, np.float32)
        else:
            vals[n] = (rng.normal(size=shp) * std).astype(np.float32)
    return func.with_params(vals)


try:    # conv helpers, where that branch has landed (rlxc/nn_conv.py)
    from rlxc.nn_conv import *  # noqa: F401,F403
except ImportError:
    pass


__all__ = ["linear", "layer_norm", "embedding", "mlp", "rope", "split_heads", "merge_heads",
           "attention_block", "transformer_block", "init"]

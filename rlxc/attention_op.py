"""`rlxc.attention`: scaled dot-product attention as one traced op (rlx.attention).

    attention(q, k, v, mask=None, scale=None, softcap=None)
        q (B, H, Sq, D), k and v (B, H, Sk, D)  (BHSD, PyTorch's layout)
        mask: None | "causal" | ("sliding", window) | bool Tensor or array that
              broadcasts to (B, H, Sq, Sk), True = attend
        scale: default 1/sqrt(D); softcap c: c * tanh(scores / c) before masking

The semantics, expansion and transform rules are in dialect/attention.py. This
file only validates the user's arguments and records the op; a mask tensor is
brought to rank 4 (leading 1s) so that every rule sees four dims.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from rlxc.dialect.shapes import ShapeError, as_int, broadcast_shapes


def attention(q, k, v, mask=None, scale=None, softcap=None):
    """softmax(mask(softcap(scale * q k^T))) v; a fully masked row gives zeros."""
    from rlxc.tensor import Tensor

    for n, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"attention: {n} must be a traced Tensor, got {type(t).__name__}")
    if q.ndim != 4:
        raise ShapeError(f"attention: q must be (B, H, Sq, D), got shape {q.shape}")
    d = q.shape[3]
    if scale is None:
        scale = 1.0 / math.sqrt(d) if d else 1.0
    if not isinstance(scale, numbers.Real) or not math.isfinite(scale):
        raise TypeError(f"attention: scale must be a finite number, got {scale!r}")
    if softcap is None:
        softcap = 0.0
    if not isinstance(softcap, numbers.Real) or not (softcap > 0 and math.isfinite(softcap)) \
            and softcap != 0:
        raise ValueError(f"attention: softcap must be a positive finite number, got {softcap!r}")
    operands = [q, k, v]
    kind, window = "", 0
    if mask is None:
        pass
    elif isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"attention: mask {mask!r} is not None, 'causal', ('sliding', "
                             f"window) or a boolean tensor")
        kind = "causal"
    elif isinstance(mask, tuple):
        if len(mask) != 2 or mask[0] != "sliding":
            raise ValueError(f"attention: mask {mask!r} is not None, 'causal', ('sliding', "
                             f"window) or a boolean tensor")
        window = as_int(mask[1], "attention: sliding window", "value")
        if window < 1:
            raise ValueError(f"attention: sliding window must be >= 1, got {window}")
        kind = "sliding"
    else:
        if not isinstance(mask, Tensor):
            arr = np.asarray(mask)
            if arr.dtype != np.bool_:
                raise TypeError(f"attention: a mask array must be boolean, got {arr.dtype}")
            mask = q.scope.constant(arr, "i1")
        if mask.dtype != "i1":
            raise TypeError(f"attention: a mask tensor must be boolean (i1), got {mask.dtype}")
        full = q.shape[:3] + (k.shape[2] if k.ndim == 4 else -1,)
        try:
            ok = mask.ndim <= 4 and broadcast_shapes(mask.shape, full) == full
        except ShapeError:
            ok = False
        if not ok:
            raise ShapeError(f"attention: mask {mask.shape} does not broadcast to (B, H, Sq, Sk) "
                             f"= {full}")
        if mask.ndim < 4:
            mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
        operands.append(mask)
        kind = "tensor"
    return q.scope.emit("rlx.attention", operands, scale=float(scale), softcap=float(softcap),
                         kind=kind, window=window)


__all__ = ["attention"]

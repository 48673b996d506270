"""Prepacked weights: a bound matmul weight packed once, in the sgemm's micro-panel layout.

A MatmulChain step (lowering/cpu/matmul_chain.py) that multiplies by a whole param B
(K x N, rows contiguous) packs B's column panels on every call (pack_b_panel: about 4%
of an MLP forward at batch 128).  A Jitted's bound params are frozen (Func owns them,
read-only), so it packs them once instead and calls the library's prepacked entry
(`rlx_NAME_prepacked`, codegen.py) with the packed copies; the sgemm then reads its
micro-panels in place (sgemm_kernels.PREPACKED_B).

Layout (one entry of the library's `prepack` metadata: param, k, n, nr, cols):
panels in the order of `cols`, the column boundaries the step's sgemm calls see
(NR columns each, except a thin last panel the chain folds into its first unit);
panel p is K rows of NR floats, columns cols[p]..cols[p+1] of B, zero padded to NR;
panel p starts at float p * K * NR; the buffer is 64-byte aligned (the micro-kernels
load B with aligned vector loads)."""
from __future__ import annotations

import numpy as np

from .call import aligned_empty

__all__ = ["pack_weight", "check_spec"]


def check_spec(spec: dict) -> None:
    """Validate one `prepack` metadata entry (a clear error, not a bad pointer)."""
    try:
        k, n, nr, cols = int(spec["k"]), int(spec["n"]), int(spec["nr"]), list(spec["cols"])
        int(spec["param"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"prepack metadata entry {spec!r}: {e}") from None
    if k < 1 or n < 1 or nr < 1 or len(cols) < 2 or cols[0] != 0 or cols[-1] != n or \
            any(not 0 < b - a <= nr for a, b in zip(cols, cols[1:])):
        raise ValueError(f"prepack metadata entry {spec!r}: panels must cover 0..{n} "
                         f"in steps of 1..{nr} columns")


def pack_weight(w: np.ndarray, spec: dict) -> np.ndarray:
    """B (K x N float32) packed per `spec` (see the module docstring): a new, read-only,
    64-byte aligned array of len(cols) - 1 panels."""
    check_spec(spec)
    k, n, nr, cols = int(spec["k"]), int(spec["n"]), int(spec["nr"]), list(spec["cols"])
    w = np.asarray(w)
    if w.dtype != np.float32 or w.size != k * n:
        raise ValueError(f"prepack: param {spec['param']} is {w.dtype} with {w.size} "
                         f"elements, expected float32 with {k} x {n}")
    w = w.reshape(k, n)
    out = aligned_empty((len(cols) - 1, k, nr), np.float32, 64)
    out[...] = 0.0
    for p, (a, b) in enumerate(zip(cols, cols[1:])):
        out[p, :, :b - a] = w[:, a:b]
    out.flags.writeable = False
    return out

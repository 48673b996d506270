"""Philox-4x32-10 in NumPy: the interpreter's rule for rlx.philox (no xDSL, no LLVM).

    philox4x32(key=(k0, k1), ctr=(c0, c1, c2, c3)) -> 4 words    (Salmon et al., SC'11,
          │ 10 rounds; round: (hi0, lo0) = mulhilo(0xD2511F53, c0)  "Parallel random
          │                   (hi1, lo1) = mulhilo(0xCD9E8D57, c2)   numbers: as easy
          │                   c = (hi1^c1^k0, lo1, hi0^c3^k1, lo0)   as 1, 2, 3")
          │ key bump between rounds: k0 += 0x9E3779B9, k1 += 0xBB67AE85
          ▼
    rlx.philox element = word `word` of the block (ctr, stream, 0, 0), as
    (bits >> 8) * 2**-24: a uniform f32 in [0, 1) on a grid of 2**-24

Bit-exact with the LLVM rule of lowering/shared/philox.py (CPU and GPU): all
arithmetic is on unsigned 32-bit words, done here in uint64 and masked.
"""
from __future__ import annotations

import numpy as np

M0, M1 = 0xD2511F53, 0xCD9E8D57        # round multipliers
W0, W1 = 0x9E3779B9, 0xBB67AE85        # key schedule (golden ratio, sqrt(3) - 1)
ROUNDS = 10
MASK = 0xFFFFFFFF


def philox4x32(k0, k1, c0, c1, c2, c3, rounds: int = ROUNDS):
    """The four output words (uint32 arrays) for broadcastable key and counter words."""
    u = np.uint64
    k0, k1 = np.asarray(k0, u), np.asarray(k1, u)
    c0, c1, c2, c3 = (np.asarray(c, u) for c in (c0, c1, c2, c3))
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + u(W0)) & u(MASK), (k1 + u(W1)) & u(MASK)
        p0, p1 = u(M0) * c0, u(M1) * c2
        hi0, lo0 = p0 >> u(32), p0 & u(MASK)
        hi1, lo1 = p1 >> u(32), p1 & u(MASK)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return tuple(np.asarray(c, np.uint32) for c in (c0, c1, c2, c3))


def to_unit(bits):
    """uint32 bits -> f32 in [0, 1): the top 24 bits times 2**-24 (exact in f32)."""
    return (np.asarray(bits, np.uint32) >> np.uint32(8)).astype(np.float32) * np.float32(2.0 ** -24)


def philox_uniform(k0, k1, ctr, word: int, stream: int):
    """rlx.philox: element-wise uniform draws (the interpreter rule)."""
    ctr = np.asarray(ctr).astype(np.int64) & MASK
    words = philox4x32(k0, k1, ctr, stream, 0, 0)
    return to_unit(words[word])

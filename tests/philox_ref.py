"""An independent Philox-4x32-10 in pure Python integers (tests only).

Written from the paper's description (Salmon, Moraes, Dror, Shaw, "Parallel random
numbers: as easy as 1, 2, 3", SC'11, and Random123's philox.h): multipliers
0xD2511F53 and 0xCD9E8D57, Weyl key increments 0x9E3779B9 and 0xBB67AE85, 10
rounds.  Shares no code with dialect/philox.py (NumPy) or lowering/shared/philox.py
(LLVM), so agreement of the three is a real check.
"""
from __future__ import annotations

import numpy as np


def philox4x32_10(ctr, key):
    c = list(ctr)
    k = list(key)
    for r in range(10):
        if r > 0:
            k = [(k[0] + 0x9E3779B9) % 2 ** 32, (k[1] + 0xBB67AE85) % 2 ** 32]
        p0 = 0xD2511F53 * c[0]
        p1 = 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k[0], p1 % 2 ** 32, (p0 >> 32) ^ c[3] ^ k[1], p0 % 2 ** 32]
    return c


# Random123 known-answer vectors (kat_vectors, philox4x32 10 rounds): counter, key -> output
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def uniform(key, shape, word=0, stream=0):
    """rlxc.random's documented stream: element i (row-major) is word `word` of the block
    with counter (i, stream, 0, 0), as (bits >> 8) * 2**-24."""
    n = int(np.prod(shape, dtype=np.int64))
    bits = [philox4x32_10((i, stream, 0, 0), tuple(int(k) for k in key))[word] for i in range(n)]
    return ((np.array(bits, np.uint64) >> 8).astype(np.float64) * 2.0 ** -24).astype(
        np.float32).reshape(shape)

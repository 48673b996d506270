"""RLX's parameter initializer, reproduced bit for bit and vectorized.

SplitMix64 with `state = seed ^ 0x9E3779B97F4A7C15`; draw k adds the golden
constant k times, then mixes (x ^= x>>30; x *= 0xBF58476D1CE4E5B9; x ^= x>>27;
x *= 0x94D049BB133111EB; x ^= x>>31) and maps to u = (x >> 11) / 2**53.
Each element takes two draws: u1 = max(draw, 1e-12), u2 = draw, and
g = sqrt(-2 ln u1) * cos(2 pi u2) (Box-Muller, float64), value float32(g)*stddev.
The state after draw k is state0 + k*golden, so a whole block of draws is one
NumPy expression over uint64 (which wraps mod 2**64 like the Rust code).
"""
from __future__ import annotations

import numpy as np

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_CHUNK = 1 << 22  # elements per block: bounded memory for huge models


def _mix(x: np.ndarray) -> np.ndarray:
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def _uniform(state0: np.uint64, first_draw: int, n: int) -> np.ndarray:
    k = np.arange(first_draw, first_draw + n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = _mix(state0 + k * GOLDEN)
    return (x >> np.uint64(11)).astype(np.float64) / float(2 ** 53)


def randn_stream(seed: int, shapes: list[tuple], stddev: float) -> list[np.ndarray]:
    """One normal stream across `shapes` in order (a dim of 0 counts as 1)."""
    state0 = np.uint64(int(seed) & 0xFFFFFFFFFFFFFFFF) ^ GOLDEN
    std = np.float32(stddev)
    out, draw = [], 1
    for shape in shapes:
        n = 1
        for d in shape:
            n *= max(int(d), 1)
        vals = np.empty(n, dtype=np.float32)
        for s in range(0, n, _CHUNK):
            m = min(_CHUNK, n - s)
            u = _uniform(state0, draw + 2 * s, 2 * m)
            u1 = np.maximum(u[0::2], 1e-12)
            u2 = u[1::2]
            g = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
            vals[s:s + m] = g.astype(np.float32) * std
        draw += 2 * n
        size = 1
        for d in shape:
            size *= int(d)
        out.append(vals[:size].reshape(shape) if size == n else np.zeros(shape, np.float32))
    return out

"""The dynamic row split's shared B and tail chunks (sgemm_dyn.py, issue 19 W2) on both ISAs.

    shared B: with one column block (N <= nc) of at most SYNC_KB K blocks, the team packs
        one B into thread 0's B part (pack tasks claimed from a counter, a packed count per
        K block that the tiles wait on), so thread 1 never writes its own B part
    fallbacks: several column blocks, or more than SYNC_KB K blocks: a B per thread
    tail: the last ~nt chunks are split dyn_tail ways

Checked against a float64 NumPy reference (accumulating into C0, so a chunk run twice or
skipped shows) for odd M, N, K, at 1 and 2 threads, for the AVX2 build (znver3) and, on an
AVX-512 host, the native one.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlxc.lowering.cpu import sgemm_dyn
from rlxc.lowering.cpu import sgemm_kernels as sgemm

from test_sgemm import _run_case
from test_sgemm_smallm import CPUS, build_gemm

SENTINEL = np.uint32(0x7FC0DEAD)   # a NaN no kernel writes


def _lib(tmp_path_factory, cpu, tag, **overrides):
    g, text = build_gemm(tmp_path_factory, cpu, tag, **overrides)
    g.lib.rlxc_set_num_threads(2)
    return g, text


def _aligned_ws(n):
    """n float32 workspace floats starting on a 64-byte boundary, all SENTINEL."""
    raw = np.empty(n + 16, np.float32)
    off = (-raw.ctypes.data % 64) // 4
    ws = raw[off:off + n]
    ws.view(np.uint32)[:] = SENTINEL
    return ws


@pytest.mark.parametrize("cpu", CPUS)
def test_team_shares_one_packed_b(tmp_path_factory, cpu):
    """2 threads, 2048 x 200 x 700 (one column block, several K blocks, 16+ row chunks, so
    both threads take chunks): the product is right and thread 1's B part of the workspace
    is never written (38bf39f: every thread packed all of B into its own part)."""
    g, ir_text = _lib(tmp_path_factory, cpu, f"shb_{cpu}")
    assert "spack.head" in ir_text and "wait.head" in ir_text
    cfg = g.cfg
    M, N, K = 2048, 200, 700
    assert sgemm.dyn_ok(M, N, K, cfg) and N <= cfg.nc
    per = sgemm.sgemm_workspace_floats(M, N, K, 1, config=cfg)
    a_part = -(-min(cfg.mc, M) * min(cfg.kc_for(M), K) // 16) * 16 + 16
    rng = np.random.default_rng(3)
    for _ in range(3):
        A, B = rng.standard_normal((M, K), np.float32), rng.standard_normal((K, N), np.float32)
        C0 = rng.standard_normal((M, N), np.float32)
        C = C0.copy()
        ws = _aligned_ws(2 * per)
        g(A, B, C, accumulate=1, ws=ws)
        ref = C0.astype(np.float64) + A.astype(np.float64) @ B
        assert np.abs(C - ref).max() <= 1e-4 * np.abs(ref).max()
        slot1_b = ws[per + a_part + 16:].view(np.uint32)
        assert (slot1_b == SENTINEL).all(), "thread 1 packed a B of its own"
        assert (ws[a_part + 16:per].view(np.uint32) != SENTINEL).any()   # thread 0's: B


@pytest.mark.parametrize("cpu", CPUS)
def test_shared_b_fallbacks_and_tail(tmp_path_factory, cpu):
    """Tiny blocks (kc 16, nc 2 x nr, mc 24 x mr) for the shared B (N <= nc), a B per thread
    (N > nc; K > SYNC_KB x kc) and the tail chunks, M around the chunk sizes, odd N and K,
    transposed operands, accumulate or not, at 2 and 1 threads."""
    base = sgemm.sgemm_config(cpu)
    g, _ = _lib(tmp_path_factory, cpu, f"shbt_{cpu}", kc=16, nc=2 * base.nr,
                mc=24 * base.mr, min_work=0, dyn_chunks=3, dyn_tail=4)
    cfg, nr, vl = g.cfg, base.nr, base.vl
    k_many = sgemm_dyn.SYNC_KB * cfg.kc + 5       # more K blocks than the shared B counts
    rng = np.random.default_rng(7)
    cases = [(2 * nr - 1, 37, False, False, 1), (nr + 3, 1, True, False, 1),
             (vl + 1, 0, False, True, 1), (5 * nr + 3, 53, False, False, 1),
             (3 * vl, k_many, False, False, 1), (2 * nr, 33, True, True, 0)]
    for M in (256, 263, 64 * 6 + 5, 24 * cfg.mr * 6 + cfg.mr + 3):
        for N, K, ta, tb, acc in cases:
            assert sgemm.dyn_ok(M, N, K, cfg)
            _run_case(g, rng, M, N, K, ta, tb, acc)
    g.lib.rlxc_set_num_threads(1)
    for N, K, ta, tb, acc in cases[:3]:
        _run_case(g, rng, 263, N, K, ta, tb, acc, threads=1)

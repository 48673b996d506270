"""Deep K blocks for calls of many rows (SgemmConfig.kc_deep, sgemm_kernels.KC_DEEP_MIN_M).

A call (or a seq block) of at least KC_DEEP_MIN_M rows takes K blocks of up to kc_deep
instead of kc; the workspace formula (Python and its IR twin) sizes the A and B parts for
the K block the call will take.  Checked with tiny blocks (kc 16, kc_deep 48) so that both
depths run several K blocks, around the row threshold, through the static, dynamic and
column splits and the shared (coop) B, on both ISAs, against a float64 NumPy reference,
in a workspace of exactly the size the formula gives, followed by sentinels.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from rlxc.lowering.cpu import sgemm_kernels as sgemm

from test_sgemm import _check, _rand
from test_sgemm_smallm import CPUS, build_gemm

SENTINEL = np.uint32(0x7FC0DEAD)   # a NaN no kernel writes
DEEP = sgemm.KC_DEEP_MIN_M


def _run(g, rng, M, N, K, ta, tb, acc, threads):
    g.lib.rlxc_set_num_threads(threads)
    A, B, C0 = _rand(rng, M, K), _rand(rng, K, N), _rand(rng, M, N)
    C = C0.copy()
    n = sgemm.sgemm_workspace_floats(M, N, K, threads, config=g.cfg)
    raw = np.empty(n + 16 + 64, np.float32)
    off = (-raw.ctypes.data % 64) // 4
    raw.view(np.uint32)[:] = SENTINEL
    g(A, B, C, ta=ta, tb=tb, accumulate=acc, threads=threads, ws=raw[off:off + n])
    _check(C, A, B, C0, acc)
    assert (raw[off + n:].view(np.uint32) == SENTINEL).all(), (M, N, K, threads)


def test_kc_for_the_rows():
    cfg = sgemm.sgemm_config("x86-64-v3", kc=16, kc_deep=48)
    assert [cfg.kc_for(m) for m in (1, DEEP - 1, DEEP, 4096)] == [16, 16, 48, 48]
    assert sgemm.sgemm_config("x86-64-v3", kc=16).kc_for(4096) == 16
    with pytest.raises(ValueError, match="kc_deep=8 is neither 0 nor >= kc=16"):
        sgemm.sgemm_config("x86-64-v3", kc=16, kc_deep=8)
    small = sgemm.sgemm_workspace_floats(DEEP - 1, 64, 1000, 1, config=cfg)
    big = sgemm.sgemm_workspace_floats(DEEP, 64, 1000, 1, config=cfg)
    assert big > small   # the A part of a deep call holds mc x 48


@pytest.mark.parametrize("cpu", CPUS)
@pytest.mark.parametrize("split", ["dynamic", "static", "coop"])
def test_deep_k_blocks(tmp_path_factory, cpu, split):
    base = sgemm.sgemm_config(cpu)
    over = dict(kc=16, kc_deep=48, mc=8 * base.mr, nc=2 * base.nr, min_work=0)
    if split == "static":
        over["dyn_chunks"] = 0
    elif split == "coop":
        over["share_b"] = True
    g, _ = build_gemm(tmp_path_factory, cpu, f"deepk_{split}_{cpu}", **over)
    assert g.cfg.kc_for(DEEP) == 48
    rng = np.random.default_rng(5)
    nr = base.nr
    combos = itertools.cycle(itertools.product((False, True), (False, True), (0, 1)))
    # rows around the threshold (2 threads: 2 x 130 rows put each thread below it), N of
    # one and of several column blocks, K within one deep block, on its edge and across
    # several (several shallow blocks in every case but the first)
    for M in (DEEP - 1, DEEP, 2 * 130, 301, 2 * DEEP + 3):
        for N, K in ((nr + 3, 40), (2 * nr + 5, 48), (3 * nr - 1, 49), (nr, 150)):
            ta, tb, acc = next(combos)
            for threads in (1, 2):
                _run(g, rng, M, N, K, ta, tb, acc, threads)

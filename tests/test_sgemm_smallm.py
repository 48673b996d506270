"""Small-M sgemm paths (issue 19, W3: MLP 784-512-512-10 at batch 128) on both ISAs.

    panel-at-a-time B packing (pack_b_panel): one L1 slot when M <= mc, Bp's blocks
        otherwise; the next panel's rows prefetched; strided B packed per panel too
    direct-A tiles for every panel width (the N edge no longer forces pack_a)
    built-in bias / bias+relu epilogue of the cb sgemm (no call per vector)

Each is checked against a float64 NumPy reference for the AVX2 build (znver3: 4x24
ymm tile) and, on an AVX-512 host, the native one, with 1 and 2 threads.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlxc.lowering.cpu import openmp as parallel
from rlxc.lowering.cpu import sgemm_kernels as sgemm
from rlxc.lowering.cpu import target

from test_sgemm import Gemm, _check, _rand


def _has(*feats):
    have = set(target.host_cpu_features().split(","))
    return all(f"+{f}" in have for f in feats)


CPUS = [pytest.param("znver3", marks=pytest.mark.skipif(
            not _has("avx2", "fma"), reason="host cannot run AVX2/FMA code")),
        pytest.param("native", marks=pytest.mark.skipif(
            not target.host_has_avx512(), reason="native is the AVX2 build without AVX-512"))]


def build_gemm(tmp_path_factory, cpu, tag, **overrides):
    """(Gemm, its LLVM IR text): the sgemm alone in a shared library for `cpu`, with the
    default blocking of that CPU but for `overrides`."""
    cfg = sgemm.sgemm_config(cpu, **overrides)
    m = target.ir_module(tag, cpu)
    sgemm.emit_sgemm(m, "sg", config=cfg)
    parallel.thread_control(m)
    path = str(tmp_path_factory.mktemp(tag) / f"lib{tag}.so")
    target.build_shared(m, path, cpu=cpu)
    return Gemm(path, cfg), str(m)


def _lib(tmp_path_factory, cpu, tag, **overrides):
    return build_gemm(tmp_path_factory, cpu, tag, **overrides)[0]


def _case(g, rng, M, N, K, ta=False, tb=False, acc=0, threads=1):
    g.lib.rlxc_set_num_threads(threads)
    A, B, C0 = _rand(rng, M, K), _rand(rng, K, N), _rand(rng, M, N)
    C = C0.copy()
    g(A, B, C, ta=ta, tb=tb, accumulate=acc, threads=threads)
    _check(C, A, B, C0, acc)


@pytest.mark.parametrize("cpu", CPUS)
def test_w3_shapes_and_edges(tmp_path_factory, cpu):
    """The W3 layer shapes and odd neighbours (M, N off the tile, several K blocks) with
    the default blocking: one M block, so every B panel goes through one L1 slot and
    the row-major A is read in place on every panel (with AVX2's 24-column tile, whose
    width divides no power of two, the narrower edge panel too: direct_a_edge)."""
    g = _lib(tmp_path_factory, cpu, f"w3_{cpu}")
    assert g.cfg.pack_b_panel and g.cfg.direct_a
    assert g.cfg.direct_a_edge == (g.cfg.nr == 24)
    rng = np.random.default_rng(19)
    mr, nr = g.cfg.mr, g.cfg.nr
    shapes = [(128, 512, 784), (128, 512, 512), (128, 10, 512), (mr + 1, nr + 3, 3),
              (2 * mr + 3, 3 * nr - 1, g.cfg.kc + 7), (127, 515, 97), (64, 2 * nr + 1, 1)]
    for i, (M, N, K) in enumerate(shapes):
        for t in (1, 2):
            _case(g, rng, M, N, K, acc=i % 2, threads=t)
    # transposed operands: per-panel packing of a strided B, packed A
    for ta, tb in ((True, False), (False, True), (True, True)):
        _case(g, rng, 37, 2 * nr + 5, 70, ta=ta, tb=tb, threads=2)


@pytest.mark.parametrize("cpu", CPUS)
def test_panel_packing_across_blocks(tmp_path_factory, cpu):
    """Tiny blocks: one M block (panel by panel through the one slot) and several (the
    block packed whole, row by row), several N and K blocks (the prefetch of 'the next
    panel' crosses into the next K block and past K's end), each thread's own panels
    on a column split, and the old packing (pack_b_panel/pack_b_rows off) alike, and B
    packed three rows a step (SgemmConfig.pack_b_rows; AVX2's default is two)."""
    base = sgemm.sgemm_config(cpu)
    tiny = dict(kc=19, mc=2 * base.mr, nc=3 * base.nr, min_work=0)
    rng = np.random.default_rng(20)
    for tag, ov in (("new", {}), ("old", dict(pack_b_panel=False, pack_b_rows=False)),
                    ("rows3", dict(pack_b_rows=3))):   # 3 rows a step: kc 19 leaves a tail
        g = _lib(tmp_path_factory, cpu, f"tiny_{tag}_{cpu}", **tiny, **ov)
        for i, (M, N, K) in enumerate([(5 * base.mr + 1, 7 * base.nr + 5, 45),
                                       (2 * base.mr, 3 * base.nr, 38),
                                       (base.mr + 2, base.nr - 1, 19)]):
            for t in (1, 2):
                _case(g, rng, M, N, K, ta=i == 2, tb=(i + t) % 2 == 1, acc=t - 1, threads=t)


def _dense(n, k, m, relu, cpu, name):
    from rlxc import Func

    def build(s):
        h = s.input("x", (n, k)) @ s.param("w", (k, m)) + s.param("b", (m,))
        return h.relu() if relu else h
    return Func(name, build)


@pytest.mark.parametrize("cpu", CPUS)
def test_builtin_bias_relu_epilogue(cpu):
    """x @ w + b and relu(x @ w + b) run the sgemm's built-in epilogue (the module has
    no epilogue function to call), with rlx.relu's semantics: NaN passes, negatives
    (and -0) give +0; a batched product's bias row follows the batch element."""
    from rlxc import Func
    from rlxc.backends import jit
    from rlxc.lowering.cpu import driver
    from rlxc.lowering.cpu.loops import MatmulKernel
    from rlxc.lowering.cpu.matmul_codegen import builtin_epilogue
    from rlxc.lowering.cpu.sgemm_object import BUILTIN_BIAS, BUILTIN_BIAS_RELU

    rng = np.random.default_rng(21)
    k = 70
    # tiled path; batch 1 (matvec, no sgemm); few rows (skinny); N <= VL (narrow)
    cases = [(37, 45, True), (37, 45, False), (1, 45, True), (3, 45, False), (9, 5, True)]
    for n, m, relu in cases:
        code = BUILTIN_BIAS_RELU if relu else BUILTIN_BIAS
        x = _rand(rng, n, k)
        x[min(3, n - 1), 5] = np.nan
        nanrow = min(3, n - 1)
        f = _dense(n, k, m, relu, cpu, f"dense_{n}_{m}_{int(relu)}_{cpu}")
        w, b = _rand(rng, k, m), _rand(rng, m)
        b[min(7, m - 1)] = -1e6     # this column: all negative before the relu
        f = f.with_params({"w": w, "b": b})
        mm = [kk for kk in driver.lower(f.module, cpu=cpu).kernels
              if isinstance(kk, MatmulKernel)]
        # (batch 1 is a matrix-vector product, lowered without the sgemm)
        assert [builtin_epilogue(kk) for kk in mm] == ([code] if n > 1 else []), (n, m)
        ir_text = str(driver.llvm_module(f.module, cpu=cpu)[0])
        assert ".epi\"" not in ir_text and ".epi(" not in ir_text
        got = jit(f, "cpu", cpu=cpu).run(x)[0]
        pre = x.astype(np.float64) @ w + b
        ref = np.where(np.isnan(pre) | (pre > 0), pre, 0.0) if relu else pre
        assert np.isnan(got[nanrow]).all() and np.isnan(ref[nanrow]).all()
        ok = ~np.isnan(ref)
        assert np.allclose(got[ok], ref[ok], rtol=1e-4, atol=1e-3), (n, m, relu)
        if relu and n > 1:
            col = np.delete(got[:, min(7, m - 1)], nanrow)
            assert not np.signbit(col).any() and (col == 0).all()

    def batched(s):   # (3, 5, 16) @ (3, 16, 20) + (3, 1, 20): a bias row per batch element
        h = s.input("a", (3, 5, 16)) @ s.input("c", (3, 16, 20)) + s.input("d", (3, 1, 20))
        return h.relu()
    fb = Func(f"bdense_{cpu}", batched)
    a, c, d = _rand(rng, 3, 5, 16), _rand(rng, 3, 16, 20), _rand(rng, 3, 1, 20)
    got = jit(fb, "cpu", cpu=cpu).run(a, c, d)[0]
    ref = np.maximum(a.astype(np.float64) @ c + d, 0)
    assert np.allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_bench_chain_ab(capsys):
    """benchmarks/bench_sgemm.py --chain/--ab: every build (A, and one per --ab) is checked
    against NumPy on every shape, then they run round robin; it prints each one's times
    and its ratio to A."""
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
    try:
        import bench_sgemm
    finally:
        sys.path.pop(0)
    bench_sgemm.main(["--chain", "13x40x70,13x10x40", "--ab", "pack_b_panel=0,direct_a=0",
                      "--ab", "kc=64", "--runs", "1", "--threads", "1"])
    out = capsys.readouterr().out
    assert "B {'pack_b_panel': 0, 'direct_a': 0}" in out and "B/A: median" in out
    assert "C {'kc': 64}" in out and "C/A: median" in out

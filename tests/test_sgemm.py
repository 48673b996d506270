"""sgemm emitted by rlxc.lowering.cpu.sgemm_kernels against a float64 NumPy reference.

Each build compiles one small shared library (target.py + link_shared) and
calls it through ctypes.  Error bound: |C - ref| <= 1e-5 * sqrt(K) * (|A|@|B| +
|C0|) elementwise, the natural scale of a length-K float32 dot product.
"""

from __future__ import annotations

import ctypes
import itertools
import os

import numpy as np
import pytest

import llvmlite.ir as ir

from rlxc.lowering.cpu import openmp as parallel
from rlxc.lowering.cpu import sgemm_kernels as sgemm
from rlxc.lowering.cpu import target

SIZES = (1, 3, 7, 17, 33, 65, 129)
P, L = ctypes.c_void_p, ctypes.c_int64


class Gemm:
    """ctypes wrapper around one emitted sgemm (optionally with a bias+relu epilogue)."""

    def __init__(self, path, cfg, name="sg", epilogue=False):
        self.lib = ctypes.CDLL(path)
        self.cfg = cfg
        self.f = getattr(self.lib, name)
        self.f.argtypes = [L, L, L, P, L, L, P, L, L, P, L, ctypes.c_int32, P, L] + (
            [P] if epilogue else [])
        self.f.restype = None

    def __call__(self, A, B, C, *, ta=False, tb=False, accumulate=0, threads=2, ws="auto",
                 extra=()):
        """A is the logical M×K operand; with ta it is stored K×M (A = stored.T) and
        passed through strides; same for B with tb.  C may be a strided view."""
        As = np.ascontiguousarray(A.T) if ta else A
        Bs = np.ascontiguousarray(B.T) if tb else B
        M, K = A.shape
        N = B.shape[1]
        rsa, csa = (As.strides[1] // 4, As.strides[0] // 4) if ta else (
            As.strides[0] // 4, As.strides[1] // 4)
        rsb, csb = (Bs.strides[1] // 4, Bs.strides[0] // 4) if tb else (
            Bs.strides[0] // 4, Bs.strides[1] // 4)
        assert C.size == 0 or C.strides[1] == 4
        if isinstance(ws, str):
            ws = np.empty(sgemm.sgemm_workspace_floats(M, N, K, threads, config=self.cfg),
                          np.float32)
        wp, wn = (None, 0) if ws is None else (ws.ctypes.data, ws.size)
        self.f(M, N, K, As.ctypes.data, rsa, csa, Bs.ctypes.data, rsb, csb, C.ctypes.data,
               max(C.strides[0] // 4, N), accumulate, wp, wn, *extra)


def _build(tmp_path_factory, tag, cpu="native", epilogue=None, epi_types=(), threads=True):
    cfg = sgemm.sgemm_config(cpu)
    m = target.ir_module(tag)
    sgemm.emit_sgemm(m, "sg", config=cfg, epilogue=epilogue, epilogue_arg_types=epi_types,
                     threads=threads)
    parallel.thread_control(m)
    path = str(tmp_path_factory.mktemp(tag) / f"lib{tag}.so")
    target.build_shared(m, path, cpu=cpu)
    return path, cfg


@pytest.fixture(scope="module")
def gemm(tmp_path_factory):
    path, cfg = _build(tmp_path_factory, "sgemm_native")
    g = Gemm(path, cfg)
    g.lib.rlxc_set_num_threads(2)
    return g


def _gemm_of(tmp_path_factory, tag, cfg, cpu="native"):
    """(Gemm of the sgemm built with `cfg` for `cpu`, set to 2 threads; its IR text)."""
    m = target.ir_module(tag)
    sgemm.emit_sgemm(m, "sg", config=cfg)
    parallel.thread_control(m)
    path = str(tmp_path_factory.mktemp(tag) / f"lib{tag}.so")
    target.build_shared(m, path, cpu=cpu)
    g = Gemm(path, cfg)
    g.lib.rlxc_set_num_threads(2)
    return g, str(m)


def _tiny_gemm(tmp_path_factory, tag, **overrides):
    """Tiny cache blocks (odd kc, several mc/nc blocks), threads for any size, 2 threads."""
    base = sgemm.sgemm_config()
    cfg = sgemm.sgemm_config(kc=19, mc=2 * base.mr, nc=2 * base.nr, min_work=0, **overrides)
    return _gemm_of(tmp_path_factory, tag, cfg)[0]


@pytest.fixture(scope="module")
def gemm_tiny(tmp_path_factory):
    """Every blocking loop, the k-unroll remainder and the shared, double-buffered B packing
    (share_b; the default build packs per thread) run on small problems."""
    return _tiny_gemm(tmp_path_factory, "tiny", share_b=True)


@pytest.fixture(scope="module")
def gemm_coop(tmp_path_factory):
    """Tiny blocks with the default per-thread B packing, but coop_min_rows = 2 * MR: a row
    split of 2 * MR rows a thread or more packs B once for the team (the share_b path,
    chosen at run time); fewer rows take the dynamic or static split."""
    return _tiny_gemm(tmp_path_factory, "coop", share_b=False,
                      coop_min_rows=2 * sgemm.sgemm_config().mr)


def _bias_relu(b, row, col, vec, lanes, mask, args):
    bias = sgemm.masked_load(b, b.gep(args[0], [col], inbounds=True), lanes, mask)
    x = b.fadd(vec, bias)
    return b.select(b.fcmp_ordered(">", x, ir.Constant(x.type, None)), x,
                    ir.Constant(x.type, None))


@pytest.fixture(scope="module")
def gemm_epi(tmp_path_factory):
    path, cfg = _build(tmp_path_factory, "sgemm_epi", epilogue=_bias_relu,
                       epi_types=[ir.FloatType().as_pointer()])
    g = Gemm(path, cfg, epilogue=True)
    g.lib.rlxc_set_num_threads(2)
    return g


def _rand(rng, *shape):
    return rng.standard_normal(shape, dtype=np.float32)


def _check(C, A, B, C0=None, accumulate=0):
    A64, B64 = A.astype(np.float64), B.astype(np.float64)
    ref = A64 @ B64
    scale = np.abs(A64) @ np.abs(B64)
    if accumulate:
        ref = ref + C0
        scale = scale + np.abs(C0)
    K = A.shape[1]
    tol = 1e-5 * np.sqrt(max(K, 1)) * (scale + 1e-30)
    err = np.abs(C.astype(np.float64) - ref)
    bad = err > tol
    assert not bad.any(), (
        f"{bad.sum()} wrong elements, worst rel err "
        f"{(err / (scale + 1e-30)).max():.3g} (bound {1e-5 * np.sqrt(max(K, 1)):.3g})")


def _run_case(g, rng, M, N, K, ta, tb, acc, threads=2):
    A, B = _rand(rng, M, K), _rand(rng, K, N)
    C0 = _rand(rng, M, N)
    C = C0.copy()
    g(A, B, C, ta=ta, tb=tb, accumulate=acc, threads=threads)
    _check(C, A, B, C0, acc)


def test_all_small_shapes(gemm):
    """Every (M, N, K) in SIZES^3; layouts and accumulate cycle through all 8 combinations."""
    rng = np.random.default_rng(0)
    combos = list(itertools.product((False, True), (False, True), (0, 1)))
    for i, (M, N, K) in enumerate(itertools.product(SIZES, SIZES, SIZES)):
        ta, tb, acc = combos[i % len(combos)]
        _run_case(gemm, rng, M, N, K, ta, tb, acc)


@pytest.mark.parametrize("ta,tb,acc", list(itertools.product((False, True), (False, True), (0, 1))))
def test_layouts_edge_shapes(gemm, ta, tb, acc):
    rng = np.random.default_rng(1)
    for M, N, K in [(129, 65, 33), (7, 129, 17), (65, 3, 129), (1, 129, 65), (33, 1, 7),
                    (300, 260, 257), (6, 64, 1), (12, 128, 300)]:
        _run_case(gemm, rng, M, N, K, ta, tb, acc)


def test_tiny_blocks(gemm_tiny):
    rng = np.random.default_rng(11)
    combos = list(itertools.product((False, True), (False, True), (0, 1)))
    shapes = [(M, N, K) for M in (1, 7, 33, 129) for N in (3, 65, 129, 300) for K in (1, 17, 65, 129)]
    shapes += [(300, 260, 257), (129, 2, 40), (2, 129, 40)]
    for i, (M, N, K) in enumerate(shapes):
        ta, tb, acc = combos[i % len(combos)]
        for t in (1, 2):
            gemm_tiny.lib.rlxc_set_num_threads(t)
            _run_case(gemm_tiny, rng, M, N, K, ta, tb, acc)
    gemm_tiny.lib.rlxc_set_num_threads(2)


def test_coop_rows_chosen_at_run_time(gemm_coop):
    rng = np.random.default_rng(12)
    combos = list(itertools.product((False, True), (False, True), (0, 1)))
    shapes = [(M, N, K) for M in (5, 16, 33, 300) for N in (65, 129) for K in (17, 65)]
    shapes += [(1000, 40, 60), (257, 300, 100)]
    for i, (M, N, K) in enumerate(shapes):
        ta, tb, acc = combos[i % len(combos)]
        for t in (1, 2, 3):
            gemm_coop.lib.rlxc_set_num_threads(t)
            _run_case(gemm_coop, rng, M, N, K, ta, tb, acc)
    gemm_coop.lib.rlxc_set_num_threads(2)


@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_1024(gemm, ta, tb):
    rng = np.random.default_rng(2)
    _run_case(gemm, rng, 1024, 1024, 1024, ta, tb, 0)


@pytest.mark.parametrize("M,N,K", [(1024, 17, 65), (3, 1024, 1024), (1024, 1024, 1), (65, 1024, 129),
                                   (1024, 129, 7)])
def test_1024_mixed(gemm, M, N, K):
    """Split over M or over N, depending on which has more register-tile blocks."""
    _run_case(gemm, np.random.default_rng(3), M, N, K, False, False, 1)


def test_skinny_rows(gemm):
    """M <= MR with unit-stride B takes the unpacked skinny kernels (M == 1: the
    row-streaming GEMV); M = MR + 1 and transposed B take the packed path."""
    rng = np.random.default_rng(12)
    i = 0
    for M in range(1, gemm.cfg.mr + 2):
        for N in (1, 15, 16, 17, 127, 128, 129, 300):
            for K in (0, 1, 9, 300):
                _run_case(gemm, rng, M, N, K, bool(i % 3 == 0), bool(i % 5 == 0), i % 2)
                i += 1
    _run_case(gemm, rng, 1, 4096, 1024, False, False, 1)
    _run_case(gemm, rng, 3, 4096, 1024, True, False, 0)


def test_strided_views(gemm):
    """Row strides larger than the row length (sub-matrices of bigger arrays)."""
    rng = np.random.default_rng(4)
    M, N, K = 70, 90, 110
    Abig, Bbig, Cbig = _rand(rng, M + 3, K + 9), _rand(rng, K + 2, N + 7), _rand(rng, M, N + 13)
    A, B = Abig[1:M + 1, 5:K + 5], Bbig[2:, 3:N + 3]
    before = Cbig.copy()
    C0 = Cbig[:, 4:N + 4].copy()
    C = Cbig[:, 4:N + 4]
    gemm(A, B, C, accumulate=1)
    _check(C, A, B, C0, 1)
    # columns outside the view untouched
    assert np.array_equal(Cbig[:, :4], before[:, :4])
    assert np.array_equal(Cbig[:, N + 4:], before[:, N + 4:])


def test_k_zero_and_empty(gemm):
    rng = np.random.default_rng(5)
    A, B = np.zeros((5, 0), np.float32), np.zeros((0, 9), np.float32)
    C = _rand(rng, 5, 9)
    gemm(A, B, C, accumulate=0)
    assert np.array_equal(C, np.zeros_like(C))
    C = _rand(rng, 5, 9)
    C0 = C.copy()
    gemm(A, B, C, accumulate=1)
    assert np.array_equal(C, C0)
    C = _rand(rng, 0, 9)
    gemm(np.zeros((0, 4), np.float32), _rand(rng, 4, 9), C)  # M = 0: nothing to do


def test_thread_counts_agree(gemm):
    """1 and 2 threads compute the same thing; a short workspace caps the threads."""
    rng = np.random.default_rng(6)
    A, B = _rand(rng, 257, 300), _rand(rng, 300, 190)
    outs = []
    for t in (1, 2, 0):
        gemm.lib.rlxc_set_num_threads(t)
        assert gemm.lib.rlxc_get_num_threads() == t
        C = np.zeros((257, 190), np.float32)
        gemm(A, B, C, threads=2)
        outs.append(C)
    gemm.lib.rlxc_set_num_threads(2)
    one = sgemm.sgemm_workspace_floats(257, 190, 300, 1, config=gemm.cfg)
    C = np.zeros((257, 190), np.float32)
    gemm(A, B, C, ws=np.empty(one, np.float32))
    outs.append(C)
    _check(outs[0], A, B)
    for o in outs[1:]:
        np.testing.assert_allclose(o, outs[0], rtol=1e-5, atol=1e-4)


def test_no_workspace_falls_back(gemm):
    rng = np.random.default_rng(7)
    for ws in (None, np.empty(3, np.float32)):
        A, B = _rand(rng, 40, 50), _rand(rng, 50, 70)
        C = np.zeros((40, 70), np.float32)
        gemm(A, B, C, ws=ws)
        _check(C, A, B)


def test_config_validation():
    with pytest.raises(ValueError, match="mc=.*multiple of mr"):
        sgemm.sgemm_config("x86-64-v3", mc=101)
    with pytest.raises(ValueError, match="nr=.*multiple of vl"):
        sgemm.sgemm_config("x86-64-v3", nr=12)


def test_workspace_formula():
    cfg = sgemm.sgemm_config()
    w1 = sgemm.sgemm_workspace_floats(1024, 1024, 1024, 1, config=cfg)
    assert sgemm.sgemm_workspace_floats(1024, 1024, 1024, 2, config=cfg) == 2 * w1
    kc = cfg.kc_for(1024)
    assert w1 >= cfg.mc * kc + kc * min(cfg.nc, 1024)
    assert sgemm.sgemm_workspace_floats(1, 1, 1, 1, config=cfg) < w1


@pytest.mark.parametrize("acc", [0, 1])
def test_epilogue_bias_relu(gemm_epi, acc):
    """C = relu((acc ? C : 0) + A@B + bias): the hook runs once, on the final K block."""
    rng = np.random.default_rng(8)
    for M, N, K in [(17, 33, 65), (129, 65, 300), (1, 1, 1), (64, 128, 600), (5, 70, 0),
                    (1, 300, 40), (1, 129, 0), (3, 200, 17)]:
        A, B = _rand(rng, M, K), _rand(rng, K, N)
        bias = _rand(rng, N)
        C0 = _rand(rng, M, N)
        C = C0.copy()
        gemm_epi(A, B, C, accumulate=acc, extra=(bias.ctypes.data,))
        pre = A.astype(np.float64) @ B + bias + (C0 if acc else 0)
        ref = np.maximum(pre, 0)
        tol = 1e-5 * np.sqrt(max(K, 1)) * (np.abs(A) @ np.abs(B) + np.abs(bias) + np.abs(C0) + 1e-6)
        assert (np.abs(C - ref) <= tol).all(), (M, N, K)


def test_narrow_kernel(gemm, gemm_epi):
    """N <= VL with contiguous rows of A runs the narrow (K-vectorized) kernel: every
    variant width, the row remainder of its tile, the K tail and several K blocks, any B
    layout, 1 and 2 threads, accumulate, and the epilogue on the last K block only."""
    rng = np.random.default_rng(12)
    vl = gemm.cfg.vl
    shapes = [(M, N, K) for N in sorted({1, 2, 3, 5, 6, 7, 8, 10, vl - 1, vl})
              for M, K in ((7, vl), (128, 512), (33, 3 * gemm.cfg.kc + 5))] + [(75, 6, 784)]
    for i, (M, N, K) in enumerate(shapes):
        for t in (1, 2):
            gemm.lib.rlxc_set_num_threads(t)
            _run_case(gemm, rng, M, N, K, False, i % 2 == 1, i % 3 == 0, threads=t)
    gemm.lib.rlxc_set_num_threads(2)
    for M, N, K in [(128, 10, 512), (9, 3, 600), (64, vl, 17)]:
        A, B, bias, C0 = _rand(rng, M, K), _rand(rng, K, N), _rand(rng, N), _rand(rng, M, N)
        for acc in (0, 1):
            C = C0.copy()
            gemm_epi(A, B, C, accumulate=acc, extra=(bias.ctypes.data,))
            ref = np.maximum(A.astype(np.float64) @ B + bias + (C0 if acc else 0), 0)
            tol = 1e-5 * np.sqrt(K) * (np.abs(A) @ np.abs(B) + np.abs(bias) + np.abs(C0))
            assert (np.abs(C - ref) <= tol).all(), (M, N, K, acc)


def test_avx2_build(tmp_path_factory):
    """The AVX2 fallback (cpu="x86-64-v3": 4x24 ymm tile) on the same shapes."""
    path, cfg = _build(tmp_path_factory, "sgemm_avx2", cpu="x86-64-v3")
    assert cfg.isa == "avx2" and cfg.vl == 8
    g = Gemm(path, cfg)
    g.lib.rlxc_set_num_threads(2)
    rng = np.random.default_rng(9)
    for i, (M, N, K) in enumerate([(1, 1, 1), (7, 17, 33), (65, 129, 3), (129, 33, 300),
                                   (300, 7, 65), (1, 1, 1), (64, 3, 40)]):   # last: narrow, nj=4
        _run_case(g, rng, M, N, K, bool(i & 1), bool(i & 2), i % 2)


def test_avx2_one_vector_edge_panel(tmp_path_factory):
    """AVX2 with A in place: a last panel of at most 8 columns (N = 8 mod 24, and N <= 8
    beside wider panels) runs EDGE_ROWS-row tiles (micro_edge), row remainders, several M
    blocks (mc = 128), accumulate, and A transposed (packed: the MR-row tiles)."""
    path, cfg = _build(tmp_path_factory, "sgemm_avx2_edge", cpu="x86-64-v3")
    assert cfg.nr == 24 and sgemm.EDGE_ROWS > cfg.mr
    g = Gemm(path, cfg)
    g.lib.rlxc_set_num_threads(2)
    rng = np.random.default_rng(13)
    for i, (M, N, K) in enumerate([(37, 32, 50), (130, 512, 300), (300, 56, 70), (13, 8 + 24, 33),
                                   (25, 29, 19), (128, 32, 784)]):
        _run_case(g, rng, M, N, K, i == 2, False, i % 2)
    for cpu, has in (("x86-64-v3", True), ("native", not target.host_has_avx512())):
        m = target.ir_module("edge")
        sgemm.emit_sgemm(m, "sg", cpu=cpu)
        assert ('"sg.micro_edge"' in str(m)) == has, cpu


def test_single_thread_variant(tmp_path_factory):
    """threads=False emits no libgomp reference."""
    path, cfg = _build(tmp_path_factory, "sgemm_seq", threads=False)
    g = Gemm(path, cfg)
    _run_case(g, np.random.default_rng(10), 100, 70, 130, True, False, 1)
    m = target.ir_module("seq")
    sgemm.emit_sgemm(m, "sg", threads=False)
    assert "GOMP_parallel" not in str(m)


def test_kernel_is_vectorized():
    """The microkernel is made of vector FMAs on the widest registers of the target."""
    m = target.ir_module("asm")
    sgemm.emit_sgemm(m, "sg", cpu="x86-64-v3")
    asm = target.emit_asm(m, cpu="x86-64-v3")
    assert asm.count("vfmadd231ps\t%ymm") + asm.count("vfmadd231ps\t(") >= 12
    if target.host_has_avx512():
        m = target.ir_module("asm512")
        sgemm.emit_sgemm(m, "sg")
        assert "%zmm" in target.emit_asm(m)


@pytest.mark.parametrize("cpu,direct_a", [("native", False), ("native", True),
                                          ("x86-64-v3", False)])
def test_dynamic_row_chunks(tmp_path_factory, cpu, direct_a):
    """The dynamic row split (threads claim chunks of rows from a shared counter) covers
    every row exactly once: accumulating into C0 would show a chunk run twice (C0 + 2AB)
    or skipped (C0); M values around the chunk size, the MR tile and MC, at 2 threads;
    items pack A (the default) or read it in place (dyn_direct_a)."""
    base = sgemm.sgemm_config(cpu)
    # small kc (several K blocks, an odd last one) and nc (several column blocks: an item
    # repacks B for a new one), rows per item: max(M / 6, 64 rounded to MR) <= mc
    cfg = sgemm.sgemm_config(cpu, kc=16, nc=2 * base.nr, mc=24 * base.mr, min_work=0,
                             dyn_chunks=3, dyn_direct_a=direct_a)
    g, text = _gemm_of(tmp_path_factory, "dyn", cfg, cpu)
    assert "atomicrmw add" in text and "sg.dyn" in text
    rng = np.random.default_rng(12)
    mr, nr = cfg.mr, cfg.nr
    for M in (255, 256, 257, 300, 64 * 6 + 1, 24 * mr * 6 + mr + 1):
        for N, K, ta, tb, acc in ((5 * nr + 3, 37, False, False, 1),
                                  (3 * cfg.vl, 20, True, False, 0),
                                  (nr + 1, 1, False, True, 1), (2 * nr, 0, False, False, 1)):
            assert sgemm.dyn_ok(M, N, K, cfg) == (M >= sgemm.DYN_MIN_M)
            _run_case(g, rng, M, N, K, ta, tb, acc)
    off = sgemm.sgemm_config(cpu, dyn_chunks=0, dyn_cols=0)
    m = target.ir_module("static")
    sgemm.emit_sgemm(m, "sg", config=off)
    assert "atomicrmw" not in str(m)


@pytest.mark.parametrize("cpu", ["native", "x86-64-v3"])
def test_dynamic_column_items(tmp_path_factory, cpu):
    """The dynamic column split (threads claim column items: big ones, then 2 per thread of
    a quarter of the size) covers every column exactly once: accumulating into C0 shows an
    item run twice or skipped.  N around the item sizes (several column blocks and K blocks
    per item), M from DYN_COLS_MIN_M (the packed path) up, at 2 and 3 threads; M below it,
    or A with transposed rows (ta), keeps the static split."""
    base = sgemm.sgemm_config(cpu)
    cfg = sgemm.sgemm_config(cpu, kc=16, nc=2 * base.nr, min_work=0, dyn_cols=3)
    g, text = _gemm_of(tmp_path_factory, "dcols", cfg, cpu)
    assert "sg.par_ndyn" in text and "sg.par_n." in text
    rng = np.random.default_rng(21)
    nr = cfg.nr
    for t in (2, 3):
        g.lib.rlxc_set_num_threads(t)
        for M in (sgemm.DYN_COLS_MIN_M - 1, sgemm.DYN_COLS_MIN_M, 45, 100):
            for N, K, ta, tb, acc in ((nr + 3, 37, False, False, 1),
                                      (13 * nr + 5, 33, True, False, 1),
                                      (40 * nr - 1, 17, False, True, 1),
                                      (7 * nr, 0, False, False, 1),
                                      (19 * nr + 1, 50, False, False, 0)):
                _run_case(g, rng, M, N, K, ta, tb, acc, threads=t)
    off = sgemm.sgemm_config(cpu, dyn_cols=0)
    m = target.ir_module("static_cols")
    sgemm.emit_sgemm(m, "sg", config=off)
    assert "par_ndyn" not in str(m)


@pytest.mark.parametrize("cpu", ["native", "znver3", "x86-64-v3"])
def test_workspace_ir_twin_matches(tmp_path_factory, cpu):
    """The kernel's own per-thread workspace size (IR) equals sgemm_workspace_floats for
    shapes on both sides of the dynamic split's limits (M = DYN_MIN_M, K x nc =
    dyn_b_floats): a larger IR size would cap the team or fall back to malloc."""
    cfg = sgemm.sgemm_config(cpu)
    i64 = ir.IntType(64)
    m = target.ir_module("wstwin", cpu)
    fn = ir.Function(m, ir.FunctionType(i64, [i64, i64, i64]), "ws_per_thread")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    a_part, b_part = sgemm._emit_ws_per_thread(b, *fn.args, cfg)
    b.ret(b.add(a_part, b_part))
    path = str(tmp_path_factory.mktemp("wstwin") / "libwstwin.so")
    target.build_shared(m, path, cpu=cpu)
    f = ctypes.CDLL(path).ws_per_thread
    f.argtypes, f.restype = [L, L, L], L
    lim = sgemm.DYN_MIN_M
    kmax = cfg.dyn_b_floats // cfg.nc
    shapes = [(M, N, K) for M in (1, lim - 1, lim, 1024)
              for N in (1, cfg.vl, cfg.vl + 1, 1000, 5000)
              for K in (0, 1, 300, kmax, kmax + 1, 4096)]
    got = {s: f(*s) for s in shapes}
    want = {s: sgemm.sgemm_workspace_floats(*s, 1, config=cfg) for s in shapes}
    assert got == want
    dyn = [sgemm.dyn_ok(*s, cfg) for s in shapes]
    assert any(dyn) and not all(dyn)


def _prepacked_case(g, rng, M, N, K, acc, ws="auto", extra=(), ta=False):
    """C (+)= A @ B with B given prepacked (runtime/prepack.py, NR-column panels from 0):
    the sgemm reads the panels in place (accumulate | PREPACKED_B)."""
    from rlxc.runtime.prepack import pack_weight

    nr = g.cfg.nr
    A, B = _rand(rng, M, K), _rand(rng, K, N)
    cols = [*range(0, N, nr), N]
    Bp = pack_weight(B, {"param": 0, "k": K, "n": N, "nr": nr, "cols": cols})
    assert Bp.ctypes.data % 64 == 0
    C0 = _rand(rng, M, N)
    C = C0.copy()
    As = np.ascontiguousarray(A.T) if ta else A
    rsa, csa = (1, M) if ta else (K, 1)
    if isinstance(ws, str):
        ws = np.empty(sgemm.sgemm_workspace_floats(M, N, K, 1, config=g.cfg), np.float32)
    wp, wn = (None, 0) if ws is None else (ws.ctypes.data, ws.size)
    g.f(M, N, K, As.ctypes.data, rsa, csa, Bp.ctypes.data, K * nr, 0, C.ctypes.data, N,
        acc | sgemm.PREPACKED_B, wp, wn, *extra)
    return A, B, C0, C


PREPACKED_SHAPES = [(128, 24, 784), (128, 32, 784), (128, 512, 784), (1, 5, 3), (3, 70, 17),
                    (17, 64, 1), (300, 100, 65), (9, 10, 600), (40, 200, 257)]


@pytest.mark.parametrize("fixture", ["gemm", "gemm_tiny"])
def test_prepacked_b(fixture, request):
    """Every shape class (one M block with its panel-by-panel loop, several M/K/N blocks
    with gemm_tiny's blocking, row counts the skinny and tall kernels would take, N below
    a vector) gives A @ B from the prepacked panels, accumulating or not, A strided too;
    with no workspace (the malloc'd slice) as well."""
    g = request.getfixturevalue(fixture)
    rng = np.random.default_rng(11)
    for i, (M, N, K) in enumerate(PREPACKED_SHAPES):
        A, B, C0, C = _prepacked_case(g, rng, M, N, K, i % 2, ta=i % 3 == 2)
        _check(C, A, B, C0, i % 2)
    A, B, C0, C = _prepacked_case(g, rng, 50, 70, 90, 0, ws=None)
    _check(C, A, B)


def test_prepacked_b_epilogue_and_avx2(gemm_epi, tmp_path_factory):
    """The epilogue (bias + relu) on the last K block reads the right columns, and the
    AVX2 build (4x24 tile: a 32-column call is a full panel and an 8-column one)."""
    rng = np.random.default_rng(12)
    for M, N, K in [(128, 80, 300), (5, 33, 19)]:
        bias = _rand(rng, N)
        A, B, C0, C = _prepacked_case(gemm_epi, rng, M, N, K, 0, extra=(bias.ctypes.data,))
        ref = np.maximum(A.astype(np.float64) @ B + bias, 0)
        tol = 1e-5 * np.sqrt(K) * (np.abs(A) @ np.abs(B) + np.abs(bias) + 1e-6)
        assert (np.abs(C - ref) <= tol).all(), (M, N, K)
    path, cfg = _build(tmp_path_factory, "sgemm_avx2_pre", cpu="x86-64-v3")
    g = Gemm(path, cfg)
    for M, N, K in [(128, 32, 784), (128, 24, 196), (130, 512, 100), (7, 9, 40)]:
        A, B, C0, C = _prepacked_case(g, rng, M, N, K, 1)
        _check(C, A, B, C0, 1)

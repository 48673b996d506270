"""The tall sgemm tiles (lowering/cpu/sgemm_tall.py) and the ONNX CNN that runs on them.

    numerics   every M of every tall variant (and its neighbours), N around the tile and
               vector widths, K 1..72, A row-major or transposed, accumulate, 1 and 2
               threads, the bias+relu epilogue: AVX-512 (native) and AVX2 (znver3) builds
    dispatch   with the variants replaced by marker kernels: exactly the products
               takes_tall names run a tall variant, and the one it names
    the CNN    the exported digits CNN (tests/fixtures/onnx/cnn.onnx) with its batch kept
               symbolic (one size-generic library) and fixed (input_shapes=): its conv
               GEMMs take the tall path, and both agree with a NumPy float64 reference at
               batch 1, 3, 64 and 65 on 1 and 2 threads
"""
from __future__ import annotations

import os

import llvmlite.ir as ir
import numpy as np
import pytest

import rlxc
from rlxc.lowering.cpu import openmp as parallel
from rlxc.lowering.cpu import sgemm_kernels as sgemm
from rlxc.lowering.cpu import sgemm_tall
from rlxc.lowering.cpu import target

from test_sgemm import Gemm, _bias_relu, _check, _rand
from test_sgemm_smallm import CPUS   # znver3 and native, each skipped where the host cannot run it

HERE = os.path.dirname(os.path.abspath(__file__))
CNN = os.path.join(HERE, "fixtures", "onnx", "cnn.onnx")


def _lib(tmp_path_factory, cpu, tag, epilogue=None, epi_types=()):
    cfg = sgemm.sgemm_config(cpu)
    m = target.ir_module(tag, cpu)
    sgemm.emit_sgemm(m, "sg", config=cfg, epilogue=epilogue, epilogue_arg_types=epi_types)
    parallel.thread_control(m)
    path = str(tmp_path_factory.mktemp(tag) / f"lib{tag}.so")
    target.build_shared(m, path, cpu=cpu)
    return Gemm(path, cfg, epilogue=epilogue is not None)


def _shapes(cfg):
    rows = sgemm_tall.tall_rows(cfg)
    vl = cfg.vl
    ms = sorted({m for r in rows for m in (r - 1, r, r + 1)} | {cfg.mr + 1})
    ns = sorted({1, vl - 1, vl, vl + 1, 2 * vl + 3, 3 * vl, 3 * vl + 5, 64})
    return [(m, n, k) for m in ms for n in ns for k in (1, 9, 72)]


@pytest.mark.parametrize("cpu", CPUS)
def test_tall_numerics(tmp_path_factory, cpu):
    g = _lib(tmp_path_factory, cpu, f"tall_{cpu}")
    assert sgemm_tall.tall_rows(g.cfg), "this ISA has tall variants"
    rng = np.random.default_rng(17)
    for i, (M, N, K) in enumerate(_shapes(g.cfg)):
        threads = 1 + i % 2
        g.lib.rlxc_set_num_threads(threads)
        A, B, C0 = _rand(rng, M, K), _rand(rng, K, N), _rand(rng, M, N)
        C = C0.copy()
        g(A, B, C, ta=i % 3 == 0, accumulate=i % 2, threads=threads)
        _check(C, A, B, C0, i % 2)


@pytest.mark.parametrize("cpu", CPUS)
def test_tall_epilogue(tmp_path_factory, cpu):
    """C = relu((acc ? C : 0) + A@B + bias) through the tall tiles, the masked column tail
    and the single-vector tiles past the last wide tile included."""
    g = _lib(tmp_path_factory, cpu, f"tallepi_{cpu}", _bias_relu, [ir.FloatType().as_pointer()])
    g.lib.rlxc_set_num_threads(1)
    rng = np.random.default_rng(18)
    vl = g.cfg.vl
    for M in sgemm_tall.tall_rows(g.cfg):
        for N, K in ((vl, 72), (3 * vl + 5, 9), (5, 30)):
            A, B, bias, C0 = _rand(rng, M - 1, K), _rand(rng, K, N), _rand(rng, N), \
                _rand(rng, M - 1, N)
            for acc in (0, 1):
                C = C0.copy()
                g(A, B, C, accumulate=acc, threads=1, extra=(bias.ctypes.data,))
                ref = np.maximum(A.astype(np.float64) @ B + bias + (C0 if acc else 0), 0)
                tol = 1e-5 * np.sqrt(K) * (np.abs(A) @ np.abs(B) + np.abs(bias) +
                                           np.abs(C0) + 1e-6)
                assert (np.abs(C - ref) <= tol).all(), (M, N, K, acc)


def _row_bias_relu(b, row, col, vec, lanes, mask, args):
    """relu(C + bias[row]): checks the row index a tall half passes on (row0 + h)."""
    x = b.load(b.gep(args[0], [row], inbounds=True))
    v = b.insert_element(ir.Constant(vec.type, ir.Undefined), x, ir.Constant(ir.IntType(32), 0))
    v = b.shuffle_vector(v, ir.Constant(vec.type, ir.Undefined),
                         ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes))
    y = b.fadd(vec, v)
    return b.select(b.fcmp_ordered(">", y, ir.Constant(y.type, None)), y,
                    ir.Constant(y.type, None))


@pytest.mark.parametrize("cpu", CPUS)
def test_tall_halves(tmp_path_factory, cpu):
    """Above the tallest multi-vector variant with a B too big for a one-vector tile (LeNet
    conv2: 16 x 100 x 150): two halves, the second at row h, its epilogue at row0 + h."""
    g = _lib(tmp_path_factory, cpu, f"tallhalf_{cpu}", _row_bias_relu,
             [ir.FloatType().as_pointer()])
    g.lib.rlxc_set_num_threads(1)
    cfg, rng = g.cfg, np.random.default_rng(21)
    multi = [r for r in sgemm_tall.tall_rows(cfg) if sgemm_tall.skinny_width(cfg, r) > 1]
    if not multi:
        pytest.skip("no multi-vector tall variant on this ISA (no halves)")
    top = multi[-1]
    named = 0
    for M in (top + 1, 16, top + 5, 2 * top, 2 * top + 1):
        for N, K in ((100, 150), (37, 300), (2 * cfg.vl + 3, 1000)):
            want = sgemm_tall.takes_tall(cfg, M, N, K, 1)
            named += want is not None and M > top
            A, B, bias, C0 = _rand(rng, M, K), _rand(rng, K, N), _rand(rng, M), _rand(rng, M, N)
            for acc in (0, 1):
                C = C0.copy()
                g(A, B, C, accumulate=acc, threads=1, extra=(bias.ctypes.data,))
                ref = np.maximum(A.astype(np.float64) @ B + bias[:, None] + (C0 if acc else 0), 0)
                tol = 1e-5 * np.sqrt(K) * (np.abs(A) @ np.abs(B) + np.abs(bias)[:, None] +
                                           np.abs(C0) + 1e-6)
                assert (np.abs(C - ref) <= tol).all(), (M, N, K, acc)
    assert named >= 6
    assert sgemm_tall.takes_tall(cfg, 16, 100, 150, 1) == next(r for r in multi if 8 <= r)


def _marker_tall(module, name, cfg, R, epilogue, epi_types):
    """A tall variant that only writes R into C[0] (which variant ran, if any)."""
    from rlxc.lowering.cpu.sgemm_kernels import F32P, I1, I64, internal_fn

    fn = internal_fn(module, name, [I64, I64, I64, F32P, I64, I64, F32P, I64, F32P, I64, I1,
                                     I64, I64, *epi_types])
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    b.store(ir.Constant(ir.FloatType(), float(R)), fn.args[8])
    b.ret_void()
    return fn


@pytest.mark.parametrize("cpu", CPUS)
def test_tall_dispatch(tmp_path_factory, monkeypatch, cpu):
    """seq runs a tall variant exactly for the products takes_tall names, and that one:
    more rows than MR and at most the tallest variant, unit-stride B, and a one-vector-wide
    variant only for a B of at most ONE_VECTOR_B_FLOATS (the conv shapes of the CNN, not a
    16 x 2048 x 256 product); everything else computes the product."""
    monkeypatch.setattr(sgemm_tall, "emit_tall", _marker_tall)
    g = _lib(tmp_path_factory, cpu, f"tallmark_{cpu}")
    g.lib.rlxc_set_num_threads(1)
    cfg, rng = g.cfg, np.random.default_rng(19)
    rows = sgemm_tall.tall_rows(cfg)
    cases = [(16, 16, 72, False), (8, 64, 9, False), (cfg.mr, 64, 9, False),
             (cfg.mr + 1, 40, 50, False), (rows[-1], 16, 72, False), (rows[-1] + 1, 16, 72, False),
             (16, 16, 72, True), (16, 2048, 256, False), (12, 128, 1024, False),
             (16, 16, 1024, False), (1, 64, 64, False), (16, 100, 150, False),
             (rows[-1], 100, 150, False), (rows[-1], 100, 400, False)]
    named = 0
    for M, N, K, tb in cases:
        want = sgemm_tall.takes_tall(cfg, M, N, K, N if tb else 1)
        A, B = _rand(rng, M, K), _rand(rng, K, N)
        C = np.full((M, N), -7.0, np.float32)
        g(A, B, C, tb=tb, threads=1)
        if want is None:
            _check(C, A, B)
        else:
            named += 1
            assert C[0, 0] == want, (M, N, K, tb, C[0, 0], want)
    assert named >= 3
    if cfg.vl >= 16:   # AVX-512: the CNN's second conv (16 x 16 x 72) on the 16-row tile
        assert sgemm_tall.takes_tall(cfg, 16, 16, 72, 1) == 16
        assert sgemm_tall.takes_tall(cfg, 16, 2048, 256, 1) is None


# ------------------------------------------------------------------ the ONNX CNN

def _cnn_reference(x):
    """The exported CNN in float64 NumPy: conv-bn-relu-maxpool, conv-bn-relu, mean, linear."""
    onnx = pytest.importorskip("onnx")
    from onnx import numpy_helper

    P = {i.name: numpy_helper.to_array(i).astype(np.float64)
         for i in onnx.load(CNN).graph.initializer}

    def conv(x, w, b):
        n, c, h, wd = x.shape
        xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
        cols = np.stack([xp[:, :, i:i + h, j:j + wd] for i in range(3) for j in range(3)], 2)
        return np.einsum("ock,nckhw->nohw", w.reshape(w.shape[0], c, 9), cols) + \
            b[None, :, None, None]

    def bn(x, p):
        s = P[p + ".weight"] / np.sqrt(P[p + ".running_var"] + 1e-5)
        return (x - P[p + ".running_mean"][None, :, None, None]) * s[None, :, None, None] + \
            P[p + ".bias"][None, :, None, None]

    y = np.maximum(bn(conv(x.astype(np.float64), P["0.weight"], P["0.bias"]), "1"), 0)
    n, c, h, w = y.shape
    y = y.reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))
    y = np.maximum(bn(conv(y, P["4.weight"], P["4.bias"]), "5"), 0).mean(axis=(2, 3))
    return y @ P["9.weight"].T + P["9.bias"]


def test_cnn_conv_gemms_take_the_tall_path():
    """Both conv GEMMs of the size-generic CNN (per image: 8 x 64 x 9 and 16 x 16 x 72,
    B the image's im2col rows) are products the tall tiles run on AVX-512."""
    pytest.importorskip("onnx")
    from rlxc.lowering.cpu.dynsizes import lower_dynamic, module_symbols
    from rlxc.lowering.cpu.loops import MatmulKernel

    if not target.host_has_avx512():
        pytest.skip("the 16-row variant needs 32 vector registers")
    mod = rlxc.from_onnx(CNN).module
    prog = lower_dynamic(mod, module_symbols(mod), "cnn")
    cfg = sgemm.sgemm_config("native")
    convs = [k for k in prog.kernels if isinstance(k, MatmulKernel) and k.batch]
    assert [(k.m, k.n, k.k) for k in convs] == [(8, 64, 9), (16, 16, 72)]
    for k in convs:
        assert sgemm_tall.takes_tall(cfg, k.m, k.n, k.k, k.b.cs) is not None, (k.m, k.n, k.k)


@pytest.mark.parametrize("threads", [1, 2])
def test_cnn_dynamic_and_static_match_numpy(threads):
    pytest.importorskip("onnx")
    rng = np.random.default_rng(20)
    dyn = rlxc.from_onnx(CNN).jit()
    dyn.set_num_threads(threads)
    for batch in (1, 3, 64, 65):
        x = rng.standard_normal((batch, 1, 8, 8)).astype(np.float32)
        np.testing.assert_allclose(dyn.run(x=x)[0], _cnn_reference(x), rtol=1e-4, atol=1e-5)
    x = rng.standard_normal((64, 1, 8, 8)).astype(np.float32)
    st = rlxc.from_onnx(CNN, input_shapes={"x": x.shape}).jit()
    st.set_num_threads(threads)
    np.testing.assert_allclose(st.run(x=x)[0], _cnn_reference(x), rtol=1e-4, atol=1e-5)


def test_small_product_entry(tmp_path_factory):
    """Below min_work the threaded entry runs seq at once when the caller's workspace holds a
    slice; a workspace too small for one slice or none still takes the malloc'd slice, and
    a product at min_work still splits over the team: all give the product."""
    g = _lib(tmp_path_factory, "native", "smallentry")
    rng = np.random.default_rng(21)
    cfg = g.cfg
    for M, N, K in ((16, 16, 72), (3, 5, 7), (40, 33, 17), (60, 64, 64)):
        assert M * N * K < cfg.min_work
        need = sgemm.sgemm_workspace_floats(M, N, K, 1, config=cfg)
        for ws in ("auto", np.empty(need, np.float32), np.empty(need - 1, np.float32), None):
            g.lib.rlxc_set_num_threads(2)
            A, B, C0 = _rand(rng, M, K), _rand(rng, K, N), _rand(rng, M, N)
            C = C0.copy()
            g(A, B, C, accumulate=1, threads=2, ws=ws)
            _check(C, A, B, C0, 1)
    M = N = K = 80
    assert M * N * K >= cfg.min_work
    A, B = _rand(rng, M, K), _rand(rng, K, N)
    C = np.zeros((M, N), np.float32)
    g(A, B, C, threads=2)
    _check(C, A, B)

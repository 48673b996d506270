"""The table-driven tanh(u) * sigmoid(v) of lowering/shared/mathlib_ratio.py (the `lut` path
that lowering/cpu/vsum.py takes on AVX2 targets: vpermps lookups of 2^(j/8), and for tanh of
its rounding's logarithm), and the explicit vector sum loop around it.

Accuracy against float64 NumPy on wide random pairs, the pairs the previous form found
hardest, dense sweeps over each table interval of both arguments, and the IEEE edge values
(NaN in either factor, +-inf, +-0, subnormal results), on code built for --cpu znver3 (runs
on any AVX2 host); the W1 sum built for znver3 against NumPy; the loop shape (one vpermps
per table per register, no gathers, the FMA count per vector).
"""
from __future__ import annotations

import re

import llvmlite.binding as llvm
import numpy as np
import pytest

import rlxc
from rlxc.lowering.cpu import vsum
from rlxc.lowering.shared import mathlib_ratio
from test_mathlib import _IS_X86, _sigmoid64, ulp_error
from test_mathlib_ratio import _jit, _product_module, fused_combine, ref_product, run_product

BOUND = mathlib_ratio.FUSED_ULP
CPU = "znver3"
WIDTH = 16          # what ratio_sum_loop emits on AVX2: <16 x float>, two registers

_HOST_AVX2 = "+avx2" in llvm.get_host_cpu_features().flatten().split(",")
needs_avx2 = pytest.mark.skipif(not _HOST_AVX2, reason="host CPU has no AVX2 (znver3 code)")


_ENGINES: dict = {}


def _compiled(swap: bool):
    """(engine, p, assembly) of y = tanh(u) * sigmoid(v), WIDTH lanes at a time, for CPU."""
    if swap not in _ENGINES:
        product = _product_module("tanh", "sigmoid", WIDTH,
                                  fused_combine(vsum.Avx2Lut(), WIDTH, swap))
        eng, cf, tm, mod = _jit(product, CPU)
        _ENGINES[swap] = (eng, cf, tm.emit_assembly(mod))
    return _ENGINES[swap]


def _run(u, v, swap=False):
    return run_product(_compiled(swap)[1], u, v, WIDTH)


_ref = ref_product


def _inputs(seed: int, n: int):
    """Wide random pairs (magnitudes 2^-40..2^7, the clamps' ranges), dense sweeps over
    every table interval of tanh's 2|u| and sigmoid's -v (steps of ln2/8, where the
    lookup index changes), the hard pairs of test_mathlib_ratio."""
    from test_mathlib_ratio import HARD, _wide

    rng = np.random.default_rng(seed)
    u, v = _wide(rng, n)
    su = np.linspace(0.0, 10.5, n // 4).astype(np.float32)      # tanh: every 2u/(ln2/8) step
    sv = np.linspace(-112.0, 45.0, n // 4).astype(np.float32)   # sigmoid: every -v step
    hu, hv = np.array(HARD, np.float32).T
    uu = np.concatenate([u, su, -su, rng.uniform(-3, 3, n // 4).astype(np.float32), hu, -hu])
    vv = np.concatenate([v, rng.uniform(-20, 20, n // 4).astype(np.float32), sv, sv, hv, hv])
    m = min(len(uu), len(vv))
    return uu[:m], vv[:m]


@needs_avx2
@pytest.mark.parametrize("swap", [False, True])
def test_lut_product_within_bound(swap):
    """Max error of the table-driven fused product within FUSED_ULP (either factor order)."""
    u, v = _inputs(7 + swap, 1 << 18)
    err = ulp_error(_run(u, v, swap), _ref(u, v))
    k = int(np.argmax(err))
    assert err[k] <= BOUND, f"{err[k]:.3f} ulp at u={u[k]!r}, v={v[k]!r}"


@needs_avx2
def test_lut_product_edges():
    """NaN in either factor gives NaN; +-inf, +-0 and subnormals give the IEEE products
    (signed zeros included), as the table-free form."""
    inf, nan = np.inf, np.nan
    cases = [  # u, v, tanh(u) * sigmoid(v)
        (inf, inf, 1.0), (-inf, inf, -1.0), (inf, -inf, 0.0), (-inf, -inf, -0.0),
        (0.0, 3.0, 0.0), (-0.0, 3.0, -0.0), (-0.0, -inf, -0.0), (1e-45, 0.0, 0.0),
        (-1e-45, 40.0, -1e-45), (2.0 ** -100, 0.0, 2.0 ** -101), (20.0, 0.0, 0.5),
        (-3e38, 1e30, -1.0), (10.0, 1e4, 1.0), (-1e4, 40.0, -1.0),
    ]
    u = np.array([c[0] for c in cases], np.float32)
    v = np.array([c[1] for c in cases], np.float32)
    want = np.array([c[2] for c in cases], np.float32)
    y = _run(u, v)
    assert (y.view(np.uint32) == want.view(np.uint32)).all(), (u, v, y, want)
    # tiny products: into the subnormals, rounded once
    u2 = np.array([1.0, -2.0, 0.5, 1e-20, 3.0], np.float32)
    v2 = np.array([-100.0, -103.0, -95.5, -60.0, -88.0], np.float32)
    assert ulp_error(_run(u2, v2), _ref(u2, v2)).max() <= BOUND
    nans = np.array([nan, 1.0, nan, -inf, 0.0, nan, nan, 2.0], np.float32)
    other = np.array([1.0, nan, nan, nan, -nan, inf, -inf, -nan], np.float32)
    assert np.isnan(_run(nans, other)).all()
    assert np.isnan(_run(other, nans)).all()


@needs_avx2
def test_lut_loop_shape():
    """Per <8 x float> register: one vpermps per table (tanh: exponent and delta; sigmoid:
    exponent), no gather, one division, and 24 FMA/multiplies or fewer (the table-free
    form: 28 with the reduction's scale multiply)."""
    asm = _compiled(False)[2]
    ops = re.findall(r"^\s+(v\w+)\s", asm, re.M)
    regs = WIDTH // 8
    assert not [o for o in ops if "gather" in o]
    assert ops.count("vdivps") == regs
    assert sum(o.startswith("vperm") for o in ops) == 3 * regs
    fmas = sum(o.startswith(("vfmadd", "vfmsub", "vfnmadd", "vfnmsub", "vmulps")) for o in ops)
    assert fmas <= 24 * regs, fmas


def _w1(n):
    def build(s):
        x, a, b = s.input("x", (n,)), s.input("a", ()), s.input("b", ())
        return ((x * a + b).tanh() * x.sigmoid()).sum()
    return rlxc.Func(f"w1_lut_{n}", build)


@pytest.mark.parametrize("cpu", [pytest.param(CPU, marks=needs_avx2), "native",
                                 pytest.param("x86-64", marks=pytest.mark.skipif(
                                     not _IS_X86, reason="x86-64 host only"))])
def test_w1_sum_explicit_loop(cpu, monkeypatch):
    """W1's sum through ratio_sum_loop (znver3: table-driven; native and baseline x86-64:
    the table-free form, no FMA on the latter), with a length that leaves a scalar rest,
    against float64 NumPy; NaN propagates from the vector loop and from the rest."""
    n = 10000 + 13
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(n) * 4).astype(np.float32)
    x[:4] = [0.0, -0.0, 30.0, -120.0]
    a, b = np.float32(0.7), np.float32(-0.1)
    from rlxc.registry import backend

    monkeypatch.setattr(backend("cpu"), "default_cpu", cpu)
    f = _w1(n)
    (got,) = f.jit().run(x, a, b)
    xd = x.astype(np.float64)
    ref = np.sum(np.tanh(np.float64(np.float32(xd * a) + b)) * _sigmoid64(xd))
    assert abs(float(got) - ref) <= 1e-5 * np.abs(xd).sum()
    x[n - 3] = np.nan                         # in the scalar rest
    assert np.isnan(f.jit().run(x, a, b)[0])
    x[n - 3], x[17] = 1.0, np.nan             # in the vector loop
    assert np.isnan(f.jit().run(x, a, b)[0])


def test_lut_tables():
    """T_j * 2^n from the exponent table plus the shifted rounding sum, and the delta table
    (ln T_j - j*ln2/8), for every j and a range of n (pure Python, any host)."""
    import math
    import struct

    tab = mathlib_ratio.lut_tables(8)
    magic = struct.unpack("<i", struct.pack("<f", 12582912.0))[0]
    for n8 in range(-470, 1280, 7):
        j, n = n8 % 8, n8 // 8
        bits = (tab["exp"][j] + (((magic + n8) << tab["shift"]) & 0xFFFFFFFF)) & 0xFFFFFFFF
        t = struct.unpack("<f", struct.pack("<I", bits))[0]
        if -126 <= n <= 127:
            assert t == np.float32(2.0 ** (j / 8)) * 2.0 ** n, (n8, t)
    for j in range(8):
        tj = float(np.float32(2.0 ** (j / 8)))
        d = struct.unpack("<f", struct.pack("<i", tab["delta"][j]))[0]
        exact = math.log(tj) - j * math.log(2.0) / 8
        assert abs(d - exact) <= abs(exact) * 2.0 ** -24
        assert abs(d) < 2.0 ** -24


@pytest.mark.parametrize("cpu,lanes,isa", [(CPU, 8, "avx2"), ("x86-64-v3", 8, "avx2"),
                                           ("skylake-avx512", 16, "avx512")])
def test_w1_kernel_takes_explicit_loop(cpu, lanes, isa):
    """The W1 reduction is emitted by vsum.ratio_sum_loop: one <U*L x float> fdiv (U
    registers, interleaved) in the optimized IR, the 2^-64 scale once per sum rather than
    per element, the vpermps tables of 2^(j/8) on AVX2 targets and on AVX-512 sigmoid's
    16-entry table with vscalefps (any host: IR text only)."""
    from rlxc.lowering.cpu.driver import emit_llvm

    text = emit_llvm(_w1(4096).module, "w1", optimized=True, cpu=cpu)
    w = vsum.unroll_for(cpu) * lanes
    assert len(re.findall(rf"= fdiv <{w} x float>", text)) == 1
    assert ("llvm.x86.avx2.permps" in text) == (isa == "avx2")
    assert ("llvm.x86.avx512.permvar.sf.512" in text) == (isa == "avx512")
    assert ("llvm.x86.avx512.mask.scalef.ps.512" in text) == (isa == "avx512")
    # no vector multiply by 2^-64 (0x3BF0000000000000): the vector loop and the vectorized
    # rest add q itself, the sum's read scales once
    assert not re.search(r"fmul [^\n]*<\d+ x float> [^\n]*0x3bf0000000000000", text, re.I)
    assert re.search(r"fmul [^\n]*float [^\n]*0x3bf0000000000000", text, re.I)

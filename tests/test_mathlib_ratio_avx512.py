"""The AVX-512 form of tanh(u) * sigmoid(v) with one division (lowering/shared/mathlib_ratio.py,
"AVX-512"; the instructions lowering/cpu/vsum.py's Avx512Ops gives the W1 sum loop):
sigmoid's e^-v from a 16-entry vpermps table of 2^(j/16) * 2^-64 scaled by vscalefps, with a
degree-3 polynomial.

Accuracy against float64 NumPy on wide random pairs, dense sweeps over every table interval
of sigmoid's -v and over tanh's range, the hard pairs of the table-free form, and the IEEE
edge values (NaN in either factor, +-inf, +-0, subnormal and underflowing results), on the
host (skipped without AVX-512); the loop shape (one vpermps and one vscalefps per register,
fewer FMA-port instructions than the table-free form); the tables (any host).
"""
from __future__ import annotations

import re
import struct

import numpy as np
import pytest

from rlxc.lowering.cpu import vsum
from rlxc.lowering.shared import mathlib_ratio
from test_mathlib import TARGETS, ulp_error
from test_mathlib_ratio import _jit, _product_module, fused_combine, ref_product, run_product

BOUND = mathlib_ratio.FUSED_ULP
WIDTH = 32          # two <16 x float> registers per iteration

_HOST = TARGETS["host"]
needs_avx512 = pytest.mark.skipif("+avx512f" not in _HOST[1].split(","),
                                  reason="host CPU has no AVX-512F")


_ENGINES: dict = {}


def _compiled(swap: bool = False, lut="avx512"):
    """(engine, p, assembly) of y = tanh(u) * sigmoid(v), WIDTH lanes at a time, for the
    host, with the AVX-512 instructions (lut="avx512") or the table-free form (None)."""
    key = (swap, lut)
    if key not in _ENGINES:
        ops = vsum.Avx512Ops() if lut == "avx512" else None
        product = _product_module("tanh", "sigmoid", WIDTH, fused_combine(ops, WIDTH, swap))
        eng, cf, tm, mod = _jit(product, *_HOST)
        _ENGINES[key] = (eng, cf, tm.emit_assembly(mod))
    return _ENGINES[key]


def _run(u, v, swap=False):
    return run_product(_compiled(swap)[1], u, v, WIDTH)


_ref = ref_product


@needs_avx512
@pytest.mark.parametrize("swap", [False, True])
def test_avx512_product_within_bound(swap):
    """Max error of the AVX-512 fused product within FUSED_ULP (either factor order) on wide
    random pairs, sweeps over every ln2/16 step of sigmoid's argument from -112 to 115 (the
    clamp at -110 and beyond) and over tanh's, subnormal and huge (up to 2^127) arguments of
    either factor, and the hard pairs."""
    from test_mathlib_ratio_lut import _inputs

    u, v = _inputs(11 + swap, 1 << 18)
    rng = np.random.default_rng(5 + swap)
    sv = np.linspace(-112.0, 115.0, 1 << 17).astype(np.float32)
    sub = (rng.choice([-1.0, 1.0], 4096) * rng.uniform(0, 2.0 ** -126, 4096)).astype(np.float32)
    big = (rng.choice([-1.0, 1.0], 4096) * 2.0 ** rng.uniform(7, 127, 4096)).astype(np.float32)
    u = np.concatenate([u, rng.uniform(-12, 12, len(sv)).astype(np.float32), sub, big, sub,
                        rng.uniform(-3, 3, 4096).astype(np.float32)])
    v = np.concatenate([v, sv, rng.uniform(-120, 50, 4096).astype(np.float32),
                        rng.uniform(-120, 50, 4096).astype(np.float32), big, sub])
    err = ulp_error(_run(u, v, swap), _ref(u, v))
    k = int(np.argmax(err))
    assert err[k] <= BOUND, f"{err[k]:.3f} ulp at u={u[k]!r}, v={v[k]!r}"


@needs_avx512
def test_avx512_product_edges():
    """NaN in either factor gives NaN (the clamps keep it, vscalefps passes it); +-inf, +-0
    and subnormals give the IEEE products, signed zeros included; sigmoid's large arguments
    (beyond the clamp at 110, where vscalefps underflows T_j * 2^n to 0) give tanh(u)."""
    inf, nan = np.inf, np.nan
    cases = [  # u, v, tanh(u) * sigmoid(v)
        (inf, inf, 1.0), (-inf, inf, -1.0), (inf, -inf, 0.0), (-inf, -inf, -0.0),
        (0.0, 3.0, 0.0), (-0.0, 3.0, -0.0), (-0.0, -inf, -0.0), (1e-45, 0.0, 0.0),
        (-1e-45, 40.0, -1e-45), (2.0 ** -100, 0.0, 2.0 ** -101), (20.0, 0.0, 0.5),
        (-3e38, 1e30, -1.0), (10.0, 1e4, 1.0), (-1e4, 40.0, -1.0), (1.0, -3e38, 0.0),
    ]
    u = np.array([c[0] for c in cases], np.float32)
    v = np.array([c[1] for c in cases], np.float32)
    want = np.array([c[2] for c in cases], np.float32)
    y = _run(u, v)
    assert (y.view(np.uint32) == want.view(np.uint32)).all(), (u, v, y, want)
    # tiny products: into the subnormals, rounded once; and underflow to zero below -104
    # sigmoid beyond the clamp at 110: tanh(u) itself
    u2 = np.array([1.0, -2.0, 0.5, 1e-20, 3.0, 1.0, -1.0, -2.0, 0.5], np.float32)
    v2 = np.array([-100.0, -103.0, -95.5, -60.0, -88.0, -105.0, -109.9, 111.0, 1e38],
                  np.float32)
    assert ulp_error(_run(u2, v2), _ref(u2, v2)).max() <= BOUND
    nans = np.array([nan, 1.0, nan, -inf, 0.0, nan, nan, 2.0, nan, 1e-40], np.float32)
    other = np.array([1.0, nan, nan, nan, -nan, inf, -inf, -nan, 200.0, nan], np.float32)
    assert np.isnan(_run(nans, other)).all()
    assert np.isnan(_run(other, nans)).all()


def _ops(asm):
    return re.findall(r"^\s+(v\w+)\s", asm, re.M)


def _fma_port(ops):
    """Vector ALU instructions (what AVX-512's two 512-bit ports run), moves, loads,
    broadcasts and zeroing idioms (vpxor: LLVM's dependency break before vpermps) aside."""
    skip = ("vmov", "vbroadcast", "vpbroadcast", "vextract", "vinsert", "vzeroupper", "vpxor")
    return [o for o in ops if not o.startswith(skip)]


@needs_avx512
def test_avx512_loop_shape():
    """Per <16 x float> register: one vpermps (sigmoid's table; tanh stays table-free), one
    vscalefps, one division, no gather, and at least two vector ALU instructions fewer than
    the table-free form of the same product (was: no table, no vscalefps)."""
    regs = WIDTH // 16
    ops = _ops(_compiled()[2])
    assert not [o for o in ops if "gather" in o]
    assert ops.count("vdivps") == regs
    assert sum(o.startswith("vperm") for o in ops) == regs
    assert ops.count("vscalefps") == regs
    plain = _fma_port(_ops(_compiled(lut=None)[2]))
    assert len(_fma_port(ops)) <= len(plain) - 2 * regs, (len(_fma_port(ops)), len(plain))


def test_scalef_table():
    """'t' of lut_tables(16, -64): T_j * 2^-64 = float32(2^(j/16)) * 2^-64 exactly, and the
    index the loop uses (the low 4 bits of the rounding sum to multiples of 1/16) is j for
    any n, negative too (pure Python, any host)."""
    tab = mathlib_ratio.lut_tables(16, -64)
    for j, bits in enumerate(tab["t"]):
        t = struct.unpack("<f", struct.pack("<i", bits))[0]
        assert t == float(np.float32(2.0 ** (j / 16))) * 2.0 ** -64, j
    magic = np.float32(12582912.0 / 16)
    for n16 in range(-2560, 2560, 3):
        t = np.float32(magic + np.float32(n16 / 16))
        assert int(t.view(np.int32)) & 15 == n16 % 16
        assert float(t - magic) == n16 / 16

"""The forward attention kernel's blocking (attention_kernel.fwd_geometry) against a
float64 NumPy loop (tests/test_attention.py's `naive`) and its own expansion's gradients.

The kernel walks the key tiles of a block of QBF query rows outermost (K^T packed tile
by tile, so a tile is contiguous) and the register tiles of R rows inside, with the
block's O accumulators in the output and m, l (VL partial sums) on the stack; P v runs
over D in chunks of DC vectors.  The sizes here are derived from that geometry so that
they leave: a last block shorter than QBF, a last register tile whose rows are clamped
(repeated: its m, l and O must still be written once, not accumulated twice), a last key
tile past Sk, D split into several P v chunks with a short last one, and D narrower than
a vector (DW < VL) -- on the native build (AVX-512 here: 16 lanes, R = 6, QBF = 36) and
on x86-64-v3 (AVX2: 8 lanes, R = 2, D = 64 as chunks of 5 + 3 vectors).
"""
from __future__ import annotations

import numpy as np
import pytest

import rlxc
from rlxc.lowering.cpu import attention_kernel as AK
from rlxc.lowering.cpu.driver import compile_cpu, emit_loops
from rlxc.lowering.cpu.sgemm_kernels import sgemm_config
from rlxc.runtime.cpu import CpuExecutor, CpuLibrary

from test_attention import allowed_of, naive, qkv

RNG = np.random.default_rng(1517)


def _lanes(cpu):
    return sgemm_config(cpu).vl


def _sizes(cpu, D):
    """(Sq, Sk): 2 full blocks + a short one ending in a clamped register tile, and keys
    over 2 full tiles + a partial one."""
    vl = _lanes(cpu)
    _, _, r, _, qbf = AK.fwd_geometry(D, vl)
    sq = 2 * qbf + (r + 1 if r > 1 else 3)
    if r > 1 and sq % r == 0:
        sq += 1
    return sq, 2 * AK.NV * vl + 5


def test_geometry_fills_the_register_file():
    # scores R x NV + NV + 1 and P v accumulators R x DC + DC + 1 vectors fit
    for vl, regs in ((16, 32), (8, 16)):
        for D in (1, 3, 20, 64, 80, 128, 256):
            dw, dv, r, dc, qbf = AK.fwd_geometry(D, vl)
            assert dw * dv == D and 1 <= dc <= dv and qbf % r == 0 and qbf >= AK.QB
            assert r * AK.NV + AK.NV + 1 <= regs and r * dc + dc + 1 <= regs
    assert AK.fwd_geometry(64, 16)[2:] == (6, 4, 36)
    assert AK.fwd_geometry(64, 8)[2:] == (2, 5, 32)


def test_keys_are_packed_tile_by_tile():
    f = rlxc.Func("fa_pack", lambda s: rlxc.attention(
        s.input("q", (1, 2, 100, 64)), s.input("k", (1, 2, 100, 64)),
        s.input("v", (1, 2, 100, 64)), mask="causal"))
    text = emit_loops(f.module)
    kt = AK.NV * _lanes("native")
    assert f"k^T * scale in tiles of {kt} keys" in text
    assert "P v in chunks of" in text


def _check(cpu, D, softcap=None):
    Sq, Sk = _sizes(cpu, D)
    B, H = 1, 2
    q, k, v = qkv(B, H, Sq, Sk, D, seed=D + Sq)
    full = RNG.uniform(size=(B, H, Sq, Sk)) < 0.5
    full[:, :, Sq - 1] = False                       # the clamped tile's row: fully masked
    full[:, :, 1] = False
    masks = [None, "causal", ("sliding", AK.NV * _lanes(cpu) + 3), full]

    def build(s):
        qq, kk, vv = s.input("q", q.shape), s.input("k", k.shape), s.input("v", v.shape)
        mm = s.input("m", full.shape, "i1")
        return [rlxc.attention(qq, kk, vv, softcap=softcap,
                               mask=mm if isinstance(m, np.ndarray) else m) for m in masks]
    f = rlxc.Func(f"fat{D}", build)
    if cpu == "native":
        got = f.run_on("cpu", q=q, k=k, v=v, m=full)
    else:
        art = compile_cpu(f.module, f"fat{D}_{cpu.replace('-', '_')}", cpu=cpu)
        got = CpuExecutor(CpuLibrary(art.so_path, art.metadata())).run([q, k, v, full])
    for m, g in zip(masks, got):
        want = naive(q, k, v, allowed_of(m, Sq, Sk), softcap=softcap)
        what = m.shape if isinstance(m, np.ndarray) else m
        np.testing.assert_allclose(g, want, rtol=2e-5, atol=2e-5,
                                   err_msg=f"cpu={cpu} D={D} Sq={Sq} Sk={Sk} mask={what}")
    np.testing.assert_array_equal(got[3][:, :, [1, Sq - 1]], 0)


@pytest.mark.parametrize("D", [64, 80, 20])
def test_blocks_tiles_and_chunks_native(D):
    _check("native", D, softcap=2.0 if D == 80 else None)


@pytest.mark.parametrize("D", [64, 40])
def test_blocks_tiles_and_chunks_avx2(D):
    _check("x86-64-v3", D)


def test_nan_reaches_only_the_rows_that_see_it_across_blocks():
    """A NaN score in the first key tile of a later block, and a NaN query row inside a
    clamped last register tile."""
    Sq, Sk = _sizes("native", 64)
    q, k, v = qkv(1, 1, Sq, Sq, 64, seed=9)
    kt = AK.NV * _lanes("native")
    k[0, 0, kt + 1, 3] = np.nan
    q[0, 0, Sq - 1, 0] = np.nan
    f = rlxc.Func("fat_nan", lambda s: rlxc.attention(
        s.input("q", q.shape), s.input("k", k.shape), s.input("v", v.shape), mask="causal"))
    got = f.run_on("cpu", q=q, k=k, v=v)[0]
    bad = np.isnan(got[0, 0]).any(axis=1)
    want = np.zeros(Sq, bool)
    want[kt + 1:] = True
    np.testing.assert_array_equal(bad, want)
    ok = ~want
    np.testing.assert_allclose(got[0, 0][ok], naive(q, k, v, allowed_of("causal", Sq, Sq))
                               [0, 0][ok], rtol=2e-5, atol=2e-5)


def test_row_logsumexp_through_the_gradient(monkeypatch):
    """value_and_grad uses the kernel's L = m + log(sum of the VL partial sums): the fused
    gradients match the expansion's (float64, interpreter) over several blocks."""
    from test_attention_bwd import _expansion_grads

    Sq, Sk = _sizes("native", 64)
    q, k, v = qkv(1, 1, Sq, Sk, 64, seed=5)
    w = RNG.normal(size=q.shape).astype(np.float32)
    full = RNG.uniform(size=(1, 1, Sq, Sk)) < 0.6
    full[0, 0, 4] = False

    def build(s):
        o1 = rlxc.attention(s.input("q", q.shape), s.input("k", k.shape),
                            s.input("v", v.shape), mask="causal")
        o2 = rlxc.attention(s.input("q2", q.shape), s.input("k2", k.shape),
                            s.input("v2", v.shape), mask=s.input("m", full.shape, "i1"))
        ww = s.input("w", w.shape)
        return (o1 * ww).sum() + (o2 * ww).sum()
    f = rlxc.Func("fat_lse", build)
    wrt = ["q", "k", "v", "q2", "k2", "v2"]
    g = f.grad(wrt)
    assert emit_loops(g.module).count("row logsumexp") == 2
    arrays = {"q": q, "k": k, "v": v, "q2": q[:, :, ::-1].copy(), "k2": k[:, :, ::-1].copy(),
              "v2": v, "m": full, "w": w}
    got = g.run_on("cpu", **arrays)
    want = _expansion_grads(f, wrt, arrays, monkeypatch)
    for n, a, x in zip(wrt, got, want):
        scale = max(1.0, float(np.abs(x).max()))
        np.testing.assert_allclose(a, x, rtol=1e-4, atol=2e-5 * scale, err_msg=n)


def test_repeated_calls_reset_the_work_counter():
    """The team claims (bh, block) items from a counter in the workspace, zeroed before
    every call: each call of one library computes every row again."""
    shape = (1, 2, 80, 64)
    f = rlxc.Func("fat_rep", lambda s: rlxc.attention(
        s.input("q", shape), s.input("k", shape), s.input("v", shape), mask="causal"))
    assert "claimed one by one" in emit_loops(f.module)
    j = f.jit()
    for seed in range(3):
        q, k, v = qkv(*shape[:3], 80, 64, seed=seed)
        got = j.run(q, k, v)[0]
        np.testing.assert_allclose(got, naive(q, k, v, allowed_of("causal", 80, 80)),
                                   rtol=2e-5, atol=2e-5, err_msg=f"call {seed}")

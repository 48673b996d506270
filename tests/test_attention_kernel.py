"""The fused CPU attention kernel (lowering/cpu/attention_kernel.py) against a float64
NumPy loop (tests/test_attention.py's `naive`).

Swept: every mask kind (none, causal, sliding 3 and 40, boolean tensors full and
broadcast over (B, H), (Sq) and (Sk)), softcap, fully masked rows (tensor mask rows
and sliding rows past Sk), NaN in q and k, and (B, H, Sq, Sk, D) with Sq != Sk, sizes
that are not multiples of the 4-row / 64-key tiles, D in {1, 3, 64, 80, 128}; native
(AVX-512 here) and an x86-64-v3 (AVX2: 8 lanes, another tile geometry) build.
"""
from __future__ import annotations

import numpy as np
import pytest

import rlxc
from rlxc.lowering.cpu import attention_kernel as AK
from rlxc.lowering.cpu.driver import compile_cpu, emit_loops
from rlxc.runtime.cpu import CpuExecutor, CpuLibrary

from test_attention import allowed_of, naive, qkv

SIZES = [(1, 2, 37, 45, 64), (2, 1, 70, 33, 80), (1, 1, 9, 70, 1), (2, 2, 5, 7, 3),
         (1, 1, 67, 130, 128)]
RNG = np.random.default_rng(1515)


def _func(shapes, mask, softcap=None, scale=None, name="fa"):
    qs, ks, vs = shapes
    if isinstance(mask, np.ndarray):
        return rlxc.Func(name, lambda s: rlxc.attention(
            s.input("q", qs), s.input("k", ks), s.input("v", vs),
            mask=s.input("m", mask.shape, "i1"), softcap=softcap, scale=scale))
    return rlxc.Func(name, lambda s: rlxc.attention(s.input("q", qs), s.input("k", ks),
                                                     s.input("v", vs), mask=mask,
                                                     softcap=softcap, scale=scale))


def _run(f, arrays, cpu="native"):
    if cpu == "native":
        return f.run_on("cpu", **dict(zip("qkvm", arrays)))[0]
    art = compile_cpu(f.module, f"fa_{abs(hash(cpu)) % 1000}", cpu=cpu)
    return CpuExecutor(CpuLibrary(art.so_path, art.metadata())).run(list(arrays))[0]


def _masks(B, H, Sq, Sk):
    full = RNG.uniform(size=(B, H, Sq, Sk)) < 0.5
    full[:, :, min(2, Sq - 1)] = False              # fully masked rows
    keys = RNG.uniform(size=(B, 1, 1, Sk)) < 0.7    # key padding, broadcast over H and Sq
    rows = RNG.uniform(size=(1, 1, Sq, 1)) < 0.8    # whole rows on/off, broadcast over keys
    return [None, "causal", ("sliding", 3), ("sliding", 40), full, keys, rows]


def test_the_kernel_is_what_runs():
    f = _func([(1, 8, 2048, 64)] * 3, "causal")
    text = emit_loops(f.module)
    assert "flash attention tile" in text and "exp(" not in text and "sgemm" not in text
    ws = int(text.split("workspace ")[1].split()[0])
    assert ws <= 8 * 2048 * 64 * 4 + 64     # K^T and the work counter; the scores: 128 MiB
    assert "claimed one by one" in text     # the team shares its items dynamically


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("softcap", [None, 2.0])
def test_every_mask_against_naive(size, softcap):
    B, H, Sq, Sk, D = size
    q, k, v = qkv(*size, seed=Sq)
    masks = _masks(B, H, Sq, Sk)
    arrays = [m for m in masks if isinstance(m, np.ndarray)]

    def build(s):
        qq, kk, vv = s.input("q", q.shape), s.input("k", k.shape), s.input("v", v.shape)
        tensors = iter([s.input(f"m{j}", m.shape, "i1") for j, m in enumerate(arrays)])
        return [rlxc.attention(qq, kk, vv, softcap=softcap,
                               mask=next(tensors) if isinstance(m, np.ndarray) else m)
                for m in masks]
    f = rlxc.Func("fam", build)
    assert emit_loops(f.module).count("flash attention tile") == len(masks)
    got = f.run_on("cpu", q=q, k=k, v=v, **{f"m{j}": m for j, m in enumerate(arrays)})
    for m, g in zip(masks, got):
        want = naive(q, k, v, allowed_of(m, Sq, Sk), softcap=softcap)
        what = m.shape if isinstance(m, np.ndarray) else m
        np.testing.assert_allclose(g, want, rtol=2e-5, atol=2e-5,
                                   err_msg=f"size={size} mask={what}")
        assert np.isfinite(g).all()


def test_fully_masked_rows_are_zero():
    q, k, v = qkv(1, 2, 10, 4, 16, seed=1)
    got = _run(_func([q.shape, k.shape, v.shape], ("sliding", 2)), [q, k, v])
    np.testing.assert_array_equal(got[:, :, 5:], 0)   # rows 5.. see no key < 4
    np.testing.assert_allclose(got, naive(q, k, v, allowed_of(("sliding", 2), 10, 4)),
                               rtol=2e-5, atol=2e-5)
    m = np.zeros((1, 1, 10, 4), bool)
    got = _run(_func([q.shape, k.shape, v.shape], m), [q, k, v, m])
    np.testing.assert_array_equal(got, 0)


def test_nan_propagates_to_the_rows_that_see_it():
    q, k, v = qkv(1, 1, 40, 40, 8, seed=2)
    q[0, 0, 3, 1] = np.nan
    k[0, 0, 20, 0] = np.nan
    got = _run(_func([q.shape, k.shape, v.shape], "causal"), [q, k, v])
    bad = np.isnan(got[0, 0]).any(axis=1)
    want = np.zeros(40, bool)
    want[3] = True
    want[20:] = True            # rows that attend key 20
    np.testing.assert_array_equal(bad, want)
    ok = ~want
    np.testing.assert_allclose(got[0, 0][ok], naive(q, k, v, allowed_of("causal", 40, 40))
                               [0, 0][ok], rtol=2e-5, atol=2e-5)


def test_matches_the_expansion_it_replaces(monkeypatch):
    q, k, v = qkv(2, 2, 50, 50, 32, seed=4)
    f = _func([q.shape, k.shape, v.shape], "causal", softcap=3.0, scale=0.2)
    fused = _run(f, [q, k, v])
    monkeypatch.setattr(AK, "ENABLED", False)
    assert "flash attention" not in emit_loops(f.module)
    g = _func([q.shape, k.shape, v.shape], "causal", softcap=3.0, scale=0.2, name="fb")
    np.testing.assert_allclose(fused, _run(g, [q, k, v]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("size", [(1, 2, 37, 45, 64), (1, 1, 21, 19, 3)])
def test_avx2_build(size):
    """x86-64-v3: 8 lanes, so other key tiles (16 keys) and D splits (64 = 8 x 8)."""
    B, H, Sq, Sk, D = size
    q, k, v = qkv(*size, seed=7)
    m = RNG.uniform(size=(B, 1, Sq, Sk)) < 0.6
    for mask in ("causal", ("sliding", 5), m):
        f = _func([q.shape, k.shape, v.shape], mask, softcap=1.5)
        args = [q, k, v] + ([mask] if isinstance(mask, np.ndarray) else [])
        got = _run(f, args, cpu="x86-64-v3")
        np.testing.assert_allclose(got, naive(q, k, v, allowed_of(mask, Sq, Sk), softcap=1.5),
                                   rtol=2e-5, atol=2e-5)


def test_f64_keeps_the_expansion():
    f = rlxc.Func("f64", lambda s: rlxc.attention(
        s.input("q", (1, 1, 5, 4), "f64"), s.input("k", (1, 1, 6, 4), "f64"),
        s.input("v", (1, 1, 6, 4), "f64"), mask="causal"))
    from rlxc.dialect.module import get_func
    op = next(o for o in get_func(f.module).body.block.ops if o.name == "rlx.attention")
    assert not AK.covers(op)

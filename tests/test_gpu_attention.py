"""The fused GPU attention kernel (lowering/gpu/attention.py), on the emulator and ptxas.

Oracle: a float64 NumPy softmax written here (row-wise, fully masked rows are zeros),
not dialect/attention.py.  The emulator (lowering/gpu/emu.py) runs the kernel's
threads one by one, so a missing barrier or a lane that reads another row's data
shows up as a wrong number.  Shapes swept (B, H, Sq, Sk, D): Sq != Sk, sizes that
are not multiples of the query/key tiles, D not a multiple of the 8 threads per row,
every mask kind, softcap, custom scale, NaN inputs, fully masked rows.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import rlxc
from rlxc.dialect.types import numel
from rlxc.lowering.gpu import attention as GA
from rlxc.lowering.gpu import driver as gpu_driver
from rlxc.lowering.gpu import emu as gpu_emu
from rlxc.lowering.gpu import kernels as gpu_kernels
from rlxc.lowering.gpu import nvptx

PTXAS = nvptx.find_ptxas()


def reference(q, k, v, allowed, scale=None, softcap=None):
    """float64 softmax(mask(softcap(scale q k^T))) v; a row with no allowed key is 0."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    if softcap:
        s = softcap * np.tanh(s / softcap)
    allowed = np.broadcast_to(allowed, s.shape)
    s = np.where(allowed, s, -np.inf)
    mx = s.max(-1, keepdims=True)
    mx = np.where(np.isneginf(mx), 0.0, mx)
    e = np.where(allowed, np.exp(s - mx), 0.0)
    den = e.sum(-1, keepdims=True)
    return (e / np.where(den == 0, 1.0, den)) @ v


def allowed_of(mask, sq, sk):
    i, j = np.arange(sq)[:, None], np.arange(sk)[None, :]
    if mask is None:
        return np.ones((sq, sk), bool)
    if isinstance(mask, str):
        return j <= i
    if isinstance(mask, tuple):
        return (j <= i) & (j > i - mask[1])
    return np.asarray(mask)


def func(shapes, mask=None, scale=None, softcap=None, name="gattn"):
    qs, ks, vs = shapes
    return rlxc.Func(name, lambda s: rlxc.attention(s.input("q", qs), s.input("k", ks),
                                                     s.input("v", vs), mask=mask, scale=scale,
                                                     softcap=softcap))


def qkv(B, H, Sq, Sk, D, seed=0):
    r = np.random.default_rng(seed)
    return [r.normal(size=s).astype(np.float32) for s in ((B, H, Sq, D), (B, H, Sk, D),
                                                          (B, H, Sk, D))]


def kinds(plan):
    return [k.kind for k in plan.kernels]


def check(shape, mask=None, scale=None, softcap=None, seed=0, edit=None):
    B, H, Sq, Sk, D = shape
    q, k, v = qkv(B, H, Sq, Sk, D, seed)
    if edit is not None:
        edit(q, k, v)
    f = func([q.shape, k.shape, v.shape], mask, scale, softcap)
    _, plan, _ = gpu_kernels.build_kernels(f.module, "host")
    assert kinds(plan) == ["attention"], kinds(plan)     # the fused kernel, nothing else
    got = gpu_emu.emulate(f.module, [q, k, v])[0]
    want = reference(q, k, v, allowed_of(mask, Sq, Sk), scale, softcap)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    return got


RNG = np.random.default_rng(15)
CASES = [
    ((2, 3, 5, 7, 4), None, None, None),
    ((1, 2, 37, 45, 5), "causal", None, None),          # Sq, Sk not multiples of the tiles
    ((1, 1, 45, 37, 8), "causal", None, 2.0),          # Sq > Sk, softcap
    ((1, 2, 40, 40, 9), ("sliding", 5), None, None),    # tiles skipped on both sides
    ((2, 1, 9, 70, 16), None, 0.3, 1.5),               # custom scale, five key tiles
    ((1, 2, 33, 19, 3), RNG.random((1, 2, 33, 19)) < 0.6, None, None),   # full mask
    ((2, 2, 6, 11, 4), RNG.random((1, 1, 6, 11)) < 0.5, None, 3.0),      # broadcast (Sq, Sk)
    ((2, 3, 7, 10, 4), RNG.random((2, 1, 1, 10)) < 0.5, None, None),     # per-batch key mask
]


@pytest.mark.parametrize("shape,mask,scale,softcap", CASES)
def test_fused_kernel_matches_float64(shape, mask, scale, softcap):
    if isinstance(mask, np.ndarray):
        mask = mask.copy()
    check(shape, mask, scale, softcap)


def test_fully_masked_rows_are_zeros_not_nan():
    m = RNG.random((1, 2, 12, 9)) < 0.5
    m[0, 0, 3] = False
    m[0, 1, 10] = False
    got = check((1, 2, 12, 9, 4), m)
    assert not np.isnan(got).any()
    assert np.all(got[0, 0, 3] == 0) and np.all(got[0, 1, 10] == 0)
    # sliding window with more keys than rows: late rows past the last key see nothing
    got = check((1, 1, 20, 6, 4), ("sliding", 2))
    assert np.all(got[0, 0, 7:] == 0) and not np.isnan(got).any()


def test_nan_propagates_like_the_reference():
    def edit(q, k, v):
        q[0, 0, 2, 1] = np.nan        # row 2 of head 0: every score NaN
        k[0, 1, 4, 0] = np.nan        # key 4 of head 1: NaN for the rows that attend it
    got = check((1, 2, 9, 11, 4), "causal", edit=edit)
    assert np.isnan(got[0, 0, 2]).all() and not np.isnan(got[0, 0, [0, 1, 3]]).any()
    assert not np.isnan(got[0, 1, :4]).any() and np.isnan(got[0, 1, 4:]).all()


def test_operands_read_through_a_head_transpose():
    """q/k/v as (B, S, H, D) -> (B, H, S, D) transposes: read in place, no copy kernel."""
    B, S, H, D = 1, 13, 2, 8
    xs = [RNG.normal(size=(B, S, H, D)).astype(np.float32) for _ in range(3)]
    f = rlxc.Func("tattn", lambda s: rlxc.attention(
        *[s.input(n, (B, S, H, D)).transpose((0, 2, 1, 3)) for n in "qkv"], mask="causal"))
    _, plan, _ = gpu_kernels.build_kernels(f.module, "host")
    assert kinds(plan) == ["attention"]
    got = gpu_emu.emulate(f.module, xs)[0]
    q, k, v = (x.transpose(0, 2, 1, 3) for x in xs)
    np.testing.assert_allclose(got, reference(q, k, v, allowed_of("causal", S, S)),
                               rtol=2e-5, atol=2e-6)


def test_shared_kv_heads_read_through_a_broadcast():
    """Grouped keys/values: k, v (B, 1, S, D) broadcast to H heads are read in place."""
    B, H, S, D = 2, 3, 11, 4
    q = RNG.normal(size=(B, H, S, D)).astype(np.float32)
    k, v = (RNG.normal(size=(B, 1, S, D)).astype(np.float32) for _ in range(2))
    f = rlxc.Func("gqa", lambda s: rlxc.attention(
        s.input("q", q.shape), *[s.input(n, (B, 1, S, D)).broadcast_to((B, H, S, D))
                                 for n in "kv"], mask=("sliding", 4)))
    _, plan, _ = gpu_kernels.build_kernels(f.module, "host")
    assert kinds(plan) == ["attention"]
    got = gpu_emu.emulate(f.module, [q, k, v])[0]
    kb, vb = (np.broadcast_to(x, q.shape) for x in (k, v))
    np.testing.assert_allclose(got, reference(q, kb, vb, allowed_of(("sliding", 4), S, S)),
                               rtol=2e-5, atol=2e-6)


def test_long_sequence_plan_has_no_score_buffer(monkeypatch):
    """(1, 4, 2048, 64) causal: every buffer of the fused plan is at most q's size; the
    expansion it replaces needs (query block x Sk) score buffers (regression)."""
    shape = (1, 4, 2048, 64)
    f = func([shape] * 3, "causal", name="glong")
    scores = 4 * 2048 * 2048 * 4

    def biggest():
        _, plan, _ = gpu_kernels.build_kernels(f.module, "gpu")
        return plan, max(b.nbytes for b in plan.buffers)
    plan, big = biggest()
    assert kinds(plan) == ["attention"]
    assert big <= numel(shape) * 4 and plan.regions["work"] <= numel(shape) * 4
    monkeypatch.setattr(GA, "ENABLED", False)
    _, unfused = biggest()
    assert unfused >= scores // 8                  # the expansion's score blocks


def test_covers_falls_back_to_the_expansion():
    f = func([(1, 1, 4, 300)] * 3, name="bigd")   # D > 256: expansion
    _, plan, _ = gpu_kernels.build_kernels(f.module, "host")
    assert "attention" not in kinds(plan) and "matmul" in kinds(plan)
    assert GA.config(4096, 64) == (64, 32, 2) and GA.config(3, 64) == (4, 32, 1)
    BQ, BK, _ = GA.config(1, 256)
    assert GA.smem_bytes(BQ, BK, 256) <= GA.SMEM_LIMIT


def test_grad_through_fused_forward():
    """The forward stays one fused kernel inside the grad program (the VJP is the
    expansion); q, k, v gradients match the interpreter."""
    q, k, v = qkv(1, 2, 10, 13, 4, seed=3)
    f = func([q.shape, k.shape, v.shape], "causal", softcap=2.0, name="ggrad")
    g = f.grad(["q", "k", "v"])
    _, plan, _ = gpu_kernels.build_kernels(g.module, "host")
    assert kinds(plan).count("attention") == 1
    got = gpu_emu.emulate(g.module, [q, k, v])
    want = g.run_on("interp", q=q, k=k, v=v)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(PTXAS is None, reason="no ptxas found: PTX only")
@pytest.mark.parametrize("shape,mask,softcap", [
    ((2, 8, 512, 512, 64), "causal", None),
    ((1, 4, 300, 200, 128), "tensor", 5.0),
    ((1, 2, 100, 100, 256), ("sliding", 16), None),
    ((1, 1, 7, 5, 3), None, None),
    ((16, 16, 65536, 1, 128), "causal", None),      # 2^31 elements: 64-bit indices
])
def test_ptx_assembles(shape, mask, softcap):
    B, H, Sq, Sk, D = shape
    if mask == "tensor":
        mask = RNG.random((1, H, Sq, Sk)) < 0.5
    f = func([(B, H, Sq, D), (B, H, Sk, D), (B, H, Sk, D)], mask, softcap=softcap,
             name="gptx")
    art = gpu_driver.compile_cuda(f.module, ptxas=PTXAS)
    assert art.cubin[:4] == b"\x7fELF"
    launches = [s for s in art.meta["steps"] if s["op"] == "launch"]
    assert len(launches) == 1 and launches[0]["kernel"].endswith("_attention")
    for name, info in art.kernels.items():
        print(f"{shape} {name}: {info}")
        assert info["spill_stores"] == 0 or D >= 256, info


def test_key_tiles_outside_the_window_are_not_visited():
    """Causal and sliding CTAs loop only over the key tiles their rows may see
    (Simt.uniform_range): a NaN in v of a tile no row of a block sees never reaches it
    (a visited tile's masked NaN would: 0 * NaN), so these rows stay finite."""
    assert GA.config(128, 4) == (64, 32, 2)    # query blocks of 64 rows, key tiles of 32
    q, k, v = qkv(1, 1, 128, 128, 4, seed=5)
    v[0, 0, 80] = np.nan                       # key tile 2: rows 0..63 never load it
    f = func([q.shape] * 3, "causal", name="gskip")
    got = gpu_emu.emulate(f.module, [q, k, v])[0]
    assert np.isfinite(got[0, 0, :64]).all() and np.isnan(got[0, 0, 80:]).all()
    q, k, v = qkv(1, 1, 160, 160, 4, seed=6)
    v[0, 0, 0] = np.nan                        # key tile 0: rows 64.. start at tile 1
    f = func([q.shape] * 3, ("sliding", 4), name="gskip2")
    got = gpu_emu.emulate(f.module, [q, k, v])[0]
    assert np.isnan(got[0, 0, :4]).all() and np.isfinite(got[0, 0, 64:]).all()


@pytest.mark.parametrize("shape,mask,softcap", [
    ((1, 2, 11, 13, 4), "causal", 2.0),            # 16-byte (2 x f64) shared loads
    ((2, 1, 9, 40, 3), ("sliding", 6), None),      # scalar path, two key tiles
])
def test_float64_kernel(shape, mask, softcap):
    """f64 attention is the same kernel in double (64-bit shuffles as two 32-bit ones);
    it matches the float64 reference to ~1e-12, and its PTX assembles."""
    B, H, Sq, Sk, D = shape
    r = np.random.default_rng(7)
    q, k, v = (r.normal(size=s) for s in ((B, H, Sq, D), (B, H, Sk, D), (B, H, Sk, D)))
    f = rlxc.Func("g64", lambda s: rlxc.attention(
        s.input("q", q.shape, "f64"), s.input("k", k.shape, "f64"), s.input("v", v.shape, "f64"),
        mask=mask, softcap=softcap))
    _, plan, _ = gpu_kernels.build_kernels(f.module, "host")
    assert kinds(plan) == ["attention"]
    got = gpu_emu.emulate(f.module, [q, k, v])[0]
    np.testing.assert_allclose(got, reference(q, k, v, allowed_of(mask, Sq, Sk), None, softcap),
                               rtol=1e-12, atol=1e-13)
    if PTXAS:
        art = gpu_driver.compile_cuda(f.module, ptxas=PTXAS)
        assert art.cubin[:4] == b"\x7fELF" and "shfl.sync.bfly.b32" in art.ptx

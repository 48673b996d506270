"""Attention's fused backward (dialect/attention_bwd.py, lowering/cpu/attention_bwd*.py).

rlx.attention's VJP emits rlx.attention_lse + rlx.attention_bwd for static f32 sizes;
the CPU computes L in the forward's kernel and the gradients in two flash-style
kernels.  Oracles: the expansion's backward (the same VJP with the fused ops off) in
float64 through the interpreter, float64 central finite differences of the forward,
and torch autograd where torch is installed.

Swept: every mask kind (none, causal, sliding 3 and 40, boolean tensors full with a
fully masked row, broadcast key padding (B, 1, 1, Sk) and rows (1, 1, Sq, 1)), softcap
none / 2.0, scale 0.3, (B, H, Sq, Sk, D) in {(2, 2, 5, 7, 3), (1, 2, 37, 45, 64),
(1, 1, 70, 33, 80), (1, 1, 9, 70, 1)} (Sq != Sk, sizes off the 4-row and 64-key tiles),
native (AVX-512 here) and x86-64-v3 (AVX2) builds.
"""
from __future__ import annotations

import numpy as np
import pytest

import rlxc
from rlxc.dialect import attention_bwd as AB
from rlxc.dialect.autodiff import grad_module
from rlxc.dialect.interpreter import interpret
from rlxc.dialect.module import get_func
from rlxc.lowering.cpu.attention_bwd import bwd_geometry
from rlxc.lowering.cpu.driver import compile_cpu, emit_loops
from rlxc.lowering.cpu.target import host_has_avx512
from rlxc.runtime.cpu import CpuExecutor, CpuLibrary

from test_attention import qkv

RNG = np.random.default_rng(1516)


def _masks(B, H, Sq, Sk):
    full = RNG.uniform(size=(B, H, Sq, Sk)) < 0.5
    full[:, :, min(2, Sq - 1)] = False              # a fully masked row
    keys = RNG.uniform(size=(B, 1, 1, Sk)) < 0.7
    rows = RNG.uniform(size=(1, 1, Sq, 1)) < 0.8
    return [None, "causal", ("sliding", 3), ("sliding", 40), full, keys, rows]


def _multi(size, masks, softcap, name="bwd"):
    """One Func: per mask its own q, k, v (and mask input); loss sum_m sum(o_m * w_m)."""
    B, H, Sq, Sk, D = size

    def build(s):
        loss = None
        for j, m in enumerate(masks):
            q = s.input(f"q{j}", (B, H, Sq, D))
            k, v = s.input(f"k{j}", (B, H, Sk, D)), s.input(f"v{j}", (B, H, Sk, D))
            mm = s.input(f"m{j}", m.shape, "i1") if isinstance(m, np.ndarray) else m
            o = rlxc.attention(q, k, v, mask=mm, softcap=softcap, scale=0.3)
            t = (o * s.input(f"w{j}", (B, H, Sq, D))).sum()
            loss = t if loss is None else loss + t
        return loss
    return rlxc.Func(name, build)


def _arrays(size, masks):
    B, H, Sq, Sk, D = size
    out = {}
    for j, m in enumerate(masks):
        q, k, v = qkv(*size, seed=j + Sq)
        out.update({f"q{j}": q, f"k{j}": k, f"v{j}": v})
        if isinstance(m, np.ndarray):
            out[f"m{j}"] = m
        out[f"w{j}"] = RNG.normal(size=(B, H, Sq, D)).astype(np.float32)
    return out


def _wrt(masks):
    return [f"{x}{j}" for j in range(len(masks)) for x in "qkv"]


def _expansion_grads(f, wrt, arrays, monkeypatch):
    """The expansion's backward in float64 (the reference the fused ops replace)."""
    monkeypatch.setattr(AB, "FUSED", False)
    gm = grad_module(f.module, wrt)
    monkeypatch.setattr(AB, "FUSED", True)
    names = f.input_names()
    return interpret(gm, [arrays[n] for n in names], float_dtype=np.float64)


def _ops(module):
    return {op.name for op in get_func(module).body.block.ops}


@pytest.mark.parametrize("size,softcap", [
    ((2, 2, 5, 7, 3), None), ((1, 1, 70, 33, 80), None),
    pytest.param((1, 2, 37, 45, 64), 2.0, marks=pytest.mark.slow),   # ~30 s of compile each
    pytest.param((1, 1, 9, 70, 1), 2.0, marks=pytest.mark.slow)])
def test_fused_grad_matches_the_expansion(size, softcap, monkeypatch):
    masks = _masks(*size[:4])
    f = _multi(size, masks, softcap)
    wrt = _wrt(masks)
    g = f.grad(wrt)
    assert "rlx.attention_bwd" in _ops(g.module)
    text = emit_loops(g.module)
    assert text.count("flash attention backward (dq)") == len(masks)
    assert text.count("flash attention backward (dk, dv)") == len(masks)
    assert text.count("row logsumexp") == len(masks)     # L from the forward's kernel
    arrays = _arrays(size, masks)
    got = g.run_on("cpu", **arrays)
    want = _expansion_grads(f, wrt, arrays, monkeypatch)
    for n, a, w in zip(wrt, got, want):
        scale = max(1.0, float(np.abs(w).max()))
        np.testing.assert_allclose(a, w, rtol=1e-4, atol=2e-5 * scale,
                                   err_msg=f"size={size} {n} mask={masks[int(n[1:])]!r}")
        assert np.isfinite(a).all()


@pytest.mark.parametrize("mask", [None, "causal", ("sliding", 2), "tensor"])
@pytest.mark.parametrize("softcap", [None, 1.5])
def test_fused_ops_against_finite_differences(mask, softcap):
    """The fused ops' interpreter rules (what the kernels are tested against) give the
    forward's derivative: float64 central differences, Sq != Sk, a fully masked row."""
    size = (1, 2, 4, 6, 3)
    q, k, v = (x.astype(np.float64) for x in qkv(*size, seed=3))
    m = RNG.uniform(size=(1, 1, 4, 6)) < 0.6
    m[0, 0, 1] = False
    w = RNG.normal(size=q.shape)

    def build(s):
        qq, kk, vv = s.input("q", q.shape), s.input("k", k.shape), s.input("v", v.shape)
        mm = s.input("m", m.shape, "i1") if mask == "tensor" else mask
        o = rlxc.attention(qq, kk, vv, mask=mm, softcap=softcap, scale=0.6)
        return (o * s.input("w", w.shape)).sum()
    f = rlxc.Func("fd", build)
    args = [q, k, v] + ([m] if mask == "tensor" else []) + [w]
    gm = grad_module(f.module, ["q", "k", "v"])
    assert {"rlx.attention_lse", "rlx.attention_bwd"} <= _ops(gm)
    grads = interpret(gm, args, float_dtype=np.float64)
    eps = 1e-6
    for x, g in zip(args[:3], grads):
        fd = np.zeros_like(x)
        for i in np.ndindex(x.shape):
            old = x[i]
            x[i] = old + eps
            hi = interpret(f.module, args, float_dtype=np.float64)[0]
            x[i] = old - eps
            lo = interpret(f.module, args, float_dtype=np.float64)[0]
            x[i] = old
            fd[i] = (hi - lo) / (2 * eps)
        np.testing.assert_allclose(g, fd, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("cpu,D", [("x86-64-v3", 24), ("x86-64-v3", 56), ("x86-64-v3", 64),
                                   pytest.param("native", 128, marks=pytest.mark.skipif(
                                       not host_has_avx512(), reason="no AVX-512 here"))])
def test_avx2_build(cpu, D):
    """x86-64-v3: 8 lanes (32-lane tiles of keys and queries, other D splits), 2-row tiles
    whose accumulate loops take D in chunks (bwd_geometry: D 24 one chunk of 3 vectors, 56
    chunks of 5 and 2, 64 two of 4); AVX-512 D 128: 4-row tiles, two chunks of 4."""
    assert bwd_geometry(D, 8 if cpu != "native" else 16) == {
        24: (2, 3), 56: (2, 5), 64: (2, 4), 128: (4, 4)}[D]
    size = (1, 2, 21, 19, D)
    masks = ["causal", ("sliding", 5), RNG.uniform(size=(1, 1, 21, 19)) < 0.6]
    f = _multi(size, masks, 1.5, name=f"bwd_{D}")
    wrt = _wrt(masks)
    g = f.grad(wrt)
    arrays = _arrays(size, masks)
    art = compile_cpu(g.module, f"attn_bwd_{D}", cpu=cpu)
    got = CpuExecutor(CpuLibrary(art.so_path, art.metadata())).run(
        [arrays[n] for n in f.input_names()])
    want = g.run_on("interp", **arrays)
    for n, a, w in zip(wrt, got, want):
        np.testing.assert_allclose(a, w, rtol=1e-4, atol=2e-5, err_msg=n)


def test_long_grad_has_no_scores_buffer():
    """grad of a (1, 8, 2048, 64) causal attention: no buffer of the CPU plan holds
    (B, H, Sq, Sk) = 32 M floats (128 MiB); the whole workspace is a fraction of it."""
    from rlxc.lowering.cpu.schedule import build_program

    shape = (1, 8, 2048, 64)
    f = rlxc.Func("long_bwd", lambda s: (rlxc.attention(
        s.input("q", shape), s.input("k", shape), s.input("v", shape), mask="causal")
        * s.input("w", shape)).sum())
    g = f.value_and_grad(["q", "k", "v"])
    prog = build_program(g.module, "long_bwd")
    scores = 8 * 2048 * 2048
    big = max(b.numel for b in prog.buffers)
    assert big < scores // 8, big
    ws = int(emit_loops(g.module).split("workspace ")[1].split()[0])
    assert ws < scores * 4 // 3, ws                     # 38 MiB here vs 128 MiB of scores


def test_fully_masked_rows_and_nan(monkeypatch):
    q, k, v = qkv(1, 1, 40, 40, 8, seed=2)
    m = RNG.uniform(size=(1, 1, 40, 40)) < 0.5
    m[0, 0, 7] = False
    f = rlxc.Func("fm", lambda s: (rlxc.attention(
        s.input("q", q.shape), s.input("k", k.shape), s.input("v", v.shape),
        mask=s.input("m", m.shape, "i1")) ** 2).sum())
    dq, dk, dv = f.grad(["q", "k", "v"]).run_on("cpu", q=q, k=k, v=v, m=m)
    np.testing.assert_array_equal(dq[0, 0, 7], 0)
    assert all(np.isfinite(x).all() for x in (dq, dk, dv))
    # NaN in a key: the rows that see it (causal: rows >= 20) and, through them, every
    # key's dk and dv; the rows before it keep finite dq (as the expansion's backward)
    k[0, 0, 20, 0] = np.nan
    c = rlxc.Func("nan", lambda s: (rlxc.attention(
        s.input("q", q.shape), s.input("k", k.shape), s.input("v", v.shape),
        mask="causal") ** 2).sum())
    fused = c.grad(["q", "k", "v"]).run_on("cpu", q=q, k=k, v=v)
    assert "rlx.attention_bwd" in _ops(c.grad(["q"]).module)
    monkeypatch.setattr(AB, "FUSED", False)
    ref = rlxc.Func("nan_ref", lambda s: (rlxc.attention(
        s.input("q", q.shape), s.input("k", k.shape), s.input("v", v.shape),
        mask="causal") ** 2).sum()).grad(["q", "k", "v"]).run_on("cpu", q=q, k=k, v=v)
    for a, b in zip(fused, ref):
        np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
        ok = ~np.isnan(b)
        np.testing.assert_allclose(a[ok], b[ok], rtol=1e-4, atol=1e-5)
    # dq = dS k: rows >= 20 all NaN; rows < 20 only in the NaN's column (0 * NaN)
    assert np.isnan(fused[0][0, 0, 20:]).all() and np.isfinite(fused[0][0, 0, :20, 1:]).all()


def test_hvp_and_vmap_through_the_fused_backward():
    """hvp (jvp of grad: the fused ops' JVP by expansion) and vmap of grad (the batch
    folds into B of the fused ops) on the CPU, against the interpreter."""
    q, k, v = qkv(1, 2, 6, 9, 4, seed=5)
    t = qkv(1, 2, 6, 9, 4, seed=6)[0]

    def build(s):
        o = rlxc.attention(s.input("q", q.shape), s.input("k", k.shape),
                           s.input("v", v.shape), mask=("sliding", 3), softcap=2.0)
        return (o * o).sum()
    f = rlxc.Func("hv", build)
    h = f.hvp(["q"])
    got = h.run_on("cpu", q=q, k=k, v=v, tangent_q=t)
    want = h.run_on("interp", q=q, k=k, v=v, tangent_q=t)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    qb = np.stack([q[0] * (i + 1) for i in range(3)])[:, None]
    vg = f.grad(["q", "k"]).vmap(["q"], 3)
    assert "rlx.attention_bwd" in _ops(vg.module)
    got = vg.run_on("cpu", q=qb, k=k, v=v)
    for i in range(3):
        want = f.grad(["q", "k"]).run_on("interp", q=qb[i], k=k, v=v)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a[i], b, rtol=1e-4, atol=1e-5)


def test_the_op_verifier_names_the_operand():
    from rlxc.dialect.shapes import ShapeError

    def bad(lse_shape):
        return rlxc.Func("bad", lambda s: s.emit("rlx.attention_bwd", [
            s.input("q", (1, 1, 4, 2)), s.input("k", (1, 1, 6, 2)), s.input("v", (1, 1, 6, 2)),
            s.input("o", (1, 1, 4, 2)), s.input("do", (1, 1, 4, 2)),
            s.input("l", lse_shape)], scale=1.0, softcap=0.0, kind="", window=0))
    with pytest.raises(ShapeError, match="attention_bwd: L must be f32 of shape"):
        bad((1, 1, 4))
    assert bad((1, 1, 4, 1)).output_shapes() == [(1, 1, 16, 2)]


@pytest.mark.parametrize("mask", ["causal", ("sliding", 7), "tensor"])
def test_against_torch_autograd(mask):
    torch = pytest.importorskip("torch")
    B, H, Sq, Sk, D = 2, 3, 37, 45, 16
    q, k, v = qkv(B, H, Sq, Sk, D, seed=19)
    do = RNG.normal(size=(B, H, Sq, D)).astype(np.float32)
    i, j = np.arange(Sq)[:, None], np.arange(Sk)[None, :]
    allowed = {"causal": j <= i, "tensor": RNG.uniform(size=(B, 1, Sq, Sk)) < 0.7}.get(
        mask if isinstance(mask, str) else "", (j <= i) & (j > i - 7))
    mk = allowed if mask == "tensor" else mask

    def build(s):
        o = rlxc.attention(s.input("q", q.shape), s.input("k", k.shape), s.input("v", v.shape),
                           mask=mk, scale=0.3)
        return (o * s.input("do", do.shape)).sum()
    got = rlxc.Func("vs_torch_bwd", build).grad(["q", "k", "v"]).run_on("cpu", q=q, k=k, v=v,
                                                                        do=do)
    tq, tk, tv = (torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (q, k, v))
    o = torch.nn.functional.scaled_dot_product_attention(
        tq, tk, tv, attn_mask=torch.tensor(np.broadcast_to(allowed, (B, 1, Sq, Sk)).copy()),
        scale=0.3)
    (o * torch.tensor(do, dtype=torch.float64)).sum().backward()
    for a, t, n in zip(got, (tq, tk, tv), "qkv"):
        w = t.grad.numpy()
        np.testing.assert_allclose(a, w, rtol=1e-4, atol=1e-4 * np.abs(w).max(), err_msg=n)

"""rlxc.attention (rlx.attention) end to end: semantics, blocking, transforms, backends.

Oracles: a naive NumPy loop (one softmax per query row, written apart from
dialect/attention.py), PyTorch's scaled_dot_product_attention where torch is
installed (forward and gradients within 1e-4 relative), and finite differences
(tests/test_autodiff.py and test_jvp.py run the op-table cases of every mask kind).
Shapes swept: (B, H, Sq, Sk, D) in {(2, 3, 5, 7, 4), (1, 2, 6, 6, 8), (2, 1, 9, 4, 3)}
for every mask kind with and without softcap; (1, 2, 1100, 1100, 16) causal for the
query-blocked CPU path.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import rlxc
from rlxc.dialect import attention as A
from rlxc.dialect import attention_bwd as AB
from rlxc.dialect.autodiff import grad_module
from rlxc.dialect.interpreter import interpret
from rlxc.dialect.module import get_func
from rlxc.dialect.types import numel, shape_of

RNG = np.random.default_rng(2015)
SHAPES = [(2, 3, 5, 7, 4), (1, 2, 6, 6, 8), (2, 1, 9, 4, 3)]


def naive(q, k, v, allowed, scale=None, softcap=None):
    """Row by row in float64: softmax over the allowed keys, zeros when none is."""
    B, H, Sq, D = q.shape
    scale = 1 / math.sqrt(D) if scale is None else scale
    out = np.zeros((B, H, Sq, D))
    for b in range(B):
        for h in range(H):
            for i in range(Sq):
                s = k[b, h].astype(np.float64) @ q[b, h, i].astype(np.float64) * scale
                if softcap:
                    s = softcap * np.tanh(s / softcap)
                keep = np.broadcast_to(allowed, (B, H, Sq, k.shape[2]))[b, h, i]
                if not keep.any():
                    continue
                w = np.exp(s[keep] - s[keep].max())
                out[b, h, i] = (w / w.sum()) @ v[b, h][keep]
    return out


def allowed_of(mask, sq, sk):
    if mask is None:
        return np.ones((sq, sk), bool)
    i, j = np.arange(sq)[:, None], np.arange(sk)[None, :]
    if isinstance(mask, str) and mask == "causal":
        return j <= i
    if isinstance(mask, tuple):
        return (j <= i) & (j > i - mask[1])
    return np.asarray(mask)


def qkv(B, H, Sq, Sk, D, seed=0):
    r = np.random.default_rng(seed)
    return [r.normal(size=s).astype(np.float32) for s in ((B, H, Sq, D), (B, H, Sk, D),
                                                          (B, H, Sk, D))]


def attn_func(shapes, mask=None, scale=None, softcap=None, name="attn"):
    (qs, ks, vs) = shapes
    return rlxc.Func(name, lambda s: rlxc.attention(s.input("q", qs), s.input("k", ks),
                                                     s.input("v", vs), mask=mask, scale=scale,
                                                     softcap=softcap))


def _masks(Sq, Sk):
    m = RNG.uniform(size=(Sq, Sk)) < 0.5
    m[min(1, Sq - 1)] = False                        # a fully masked row
    return [None, "causal", ("sliding", 2), m]


# ---------------------------------------------------------------- forward

@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("softcap", [None, 1.5])
def test_every_mask_against_naive_on_cpu_and_interp(shape, softcap):
    B, H, Sq, Sk, D = shape
    q, k, v = qkv(*shape)
    masks = _masks(Sq, Sk)

    def build(s):
        qq, kk, vv = s.input("q", q.shape), s.input("k", k.shape), s.input("v", v.shape)
        return [rlxc.attention(qq, kk, vv, mask=m, softcap=softcap) for m in masks]
    f = rlxc.Func("attn_masks", build)
    for backend in ("interp", "cpu"):
        got = f.run_on(backend, q=q, k=k, v=v)
        for m, g in zip(masks, got):
            want = naive(q, k, v, allowed_of(m, Sq, Sk), softcap=softcap)
            np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-5,
                                       err_msg=f"{backend} mask={m!r}")
            assert np.isfinite(g).all()


def test_fully_masked_rows_give_zeros_and_finite_grads():
    q, k, v = qkv(1, 1, 3, 4, 2)
    m = np.array([[True, False, True, False], [False] * 4, [True] * 4])
    f = attn_func([q.shape, k.shape, v.shape], mask=m)
    for backend in ("interp", "cpu"):
        (o,) = f.run_on(backend, q=q, k=k, v=v)
        np.testing.assert_array_equal(o[0, 0, 1], 0)
        grads = f.grad(["q", "k", "v"]).run_on(backend, q=q, k=k, v=v)
        assert all(np.isfinite(g).all() for g in grads)
        np.testing.assert_array_equal(grads[0][0, 0, 1], 0)


def test_mask_tensor_broadcasts_and_scale():
    q, k, v = qkv(2, 2, 3, 5, 4, seed=3)
    m = RNG.uniform(size=(2, 1, 1, 5)) < 0.7     # per-batch key padding
    f = rlxc.Func("pad", lambda s: rlxc.attention(s.input("q", q.shape), s.input("k", k.shape),
                                                   s.input("v", v.shape),
                                                   mask=s.input("m", m.shape, "i1"), scale=0.25))
    got = f.run_on("cpu", q=q, k=k, v=v, m=m)[0]
    np.testing.assert_allclose(got, naive(q, k, v, m, scale=0.25), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- query blocks

@pytest.mark.parametrize("mask", [None, "causal", ("sliding", 3), "tensor"])
def test_blocked_expansion_and_backward_match_the_reference(mask, monkeypatch):
    """Query blocks of 2 rows (and the keys each may see): forward and VJP equal the
    one-block forms, in float64."""
    q, k, v = qkv(1, 2, 7, 7, 3, seed=5)
    m = RNG.uniform(size=(1, 1, 7, 7)) < 0.6 if mask == "tensor" else mask
    f = attn_func([q.shape, k.shape, v.shape], mask=m)
    ref = interpret(f.module, [q, k, v], float_dtype=np.float64)[0]
    blocked = A.expand_module(f.module, rows=2)
    assert not [op for op in get_func(blocked).body.block.ops if op.name == "rlx.attention"]
    got = interpret(blocked, [q, k, v], float_dtype=np.float64)[0]
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7)   # scale: an f32 constant
    monkeypatch.setattr(AB, "FUSED", False)     # the expansion's backward (not the fused op)
    one = interpret(grad_module(f.module, ["q", "k", "v"]), [q, k, v], float_dtype=np.float64)
    monkeypatch.setattr(A, "SINGLE_ELEMS", 0)
    monkeypatch.setattr(A, "MIN_ROWS", 2)
    monkeypatch.setattr(A, "BLOCK_ELEMS", 2 * 7 * 2)     # 2 rows per block
    gm = grad_module(f.module, ["q", "k", "v"])
    assert len([op for op in get_func(gm).body.block.ops if op.name == "rlx.matmul"]) >= 8
    many = interpret(gm, [q, k, v], float_dtype=np.float64)
    for a, b in zip(one, many):
        np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-12)


def test_long_causal_never_holds_the_full_scores():
    """(1, 2, 1100, 1100, 16) causal: the lowered graph has no tensor as large as the
    scores, and the CPU result matches NumPy."""
    shape = (1, 2, 1100, 1100, 16)
    q, k, v = qkv(*shape, seed=7)
    f = attn_func([q.shape, k.shape, v.shape], mask="causal", name="long")
    scores = 2 * 1100 * 1100
    ex = A.expand_module(f.module)
    big = max(numel(shape_of(op.results[0].type)) for op in get_func(ex).body.block.ops
              if op.results)
    assert big <= scores // 2, big
    (got,) = f.run_on("cpu", q=q, k=k, v=v)
    qq, kk, vv = (x.astype(np.float64) for x in (q, k, v))
    s = qq @ np.swapaxes(kk, -1, -2) / 4.0
    s = np.where(np.tril(np.ones((1100, 1100), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ vv
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5)


# ---------------------------------------------------------------- transforms and backends

def test_vmap_of_grad_on_cpu_matches_a_loop():
    q, k, v = qkv(1, 2, 4, 4, 3, seed=9)
    qb = np.stack([q[0] * (i + 1) for i in range(3)])          # (3, 2, 4, 3): B folded by vmap

    def build(s):
        o = rlxc.attention(s.input("q", (1, 2, 4, 3)), s.input("k", k.shape),
                           s.input("v", v.shape), mask="causal", softcap=2.0)
        return (o * o).sum()
    f = rlxc.Func("vg", build)
    vg = f.grad(["q", "k"]).vmap(["q"], 3)
    got = vg.run_on("cpu", q=qb[:, None], k=k, v=v)
    for i in range(3):
        want = f.grad(["q", "k"]).run_on("interp", q=qb[i][None], k=k, v=v)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g[i], w, rtol=2e-5, atol=1e-5)


def test_gpu_emulator_matches_interp():
    from rlxc.lowering.gpu import emu as gpu_emu

    q, k, v = qkv(1, 2, 5, 6, 4, seed=11)
    f = attn_func([q.shape, k.shape, v.shape], mask=("sliding", 3), softcap=1.0, name="emu")
    got = gpu_emu.emulate(f.module, [q, k, v])
    want = f.run_on("interp", q=q, k=k, v=v)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- errors

@pytest.mark.parametrize("kw,exc,match", [
    ({"mask": "banded"}, ValueError, "mask 'banded'"),
    ({"mask": ("sliding", 0)}, ValueError, "window must be >= 1"),
    ({"mask": np.ones((3, 5), bool)}, rlxc.ShapeError, "does not broadcast"),
    ({"mask": np.ones((4, 6))}, TypeError, "must be boolean"),
    ({"softcap": -1.0}, ValueError, "softcap"),
])
def test_bad_arguments_name_the_problem(kw, exc, match):
    with pytest.raises(exc, match=match):
        rlxc.Func("bad", lambda s: rlxc.attention(s.input("q", (1, 1, 4, 2)),
                                                   s.input("k", (1, 1, 6, 2)),
                                                   s.input("v", (1, 1, 6, 2)), **kw))


def test_kv_shape_mismatch():
    with pytest.raises(rlxc.ShapeError, match="attention: q"):
        rlxc.Func("bad", lambda s: rlxc.attention(s.input("q", (1, 2, 4, 2)),
                                                   s.input("k", (1, 2, 6, 3)),
                                                   s.input("v", (1, 2, 6, 3))))


# ---------------------------------------------------------------- PyTorch

@pytest.mark.parametrize("mask", [None, "causal", "tensor"])
@pytest.mark.parametrize("softcap", [None, 3.0])
def test_against_torch_sdpa(mask, softcap):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    B, H, Sq, Sk, D = 2, 3, 6, 9, 5
    q, k, v = qkv(B, H, Sq, Sk, D, seed=13)
    m = RNG.uniform(size=(B, 1, Sq, Sk)) < 0.7 if mask == "tensor" else None
    mk = m if mask == "tensor" else mask
    do = RNG.normal(size=(B, H, Sq, D)).astype(np.float32)

    def build(s):
        o = rlxc.attention(s.input("q", q.shape), s.input("k", k.shape), s.input("v", v.shape),
                           mask=mk, scale=0.3, softcap=softcap)
        return (o * s.input("do", do.shape)).sum(), o
    f = rlxc.Func("vs_torch", build)
    loss, gq, gk, gv = f.value_and_grad(["q", "k", "v"]).run_on("cpu", q=q, k=k, v=v, do=do)
    (o,) = rlxc.Func("fwd", lambda s: build(s)[1]).run_on("cpu", q=q, k=k, v=v, do=do)

    tq, tk, tv = (torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (q, k, v))
    if softcap is None:
        to = F.scaled_dot_product_attention(
            tq, tk, tv, attn_mask=None if m is None else torch.tensor(m),
            is_causal=mask == "causal", scale=0.3)
    else:   # torch's SDPA has no softcap: the same math by hand
        s = tq @ tk.transpose(-1, -2) * 0.3
        s = softcap * torch.tanh(s / softcap)
        if mask == "causal":
            s = s.masked_fill(~torch.ones(Sq, Sk, dtype=torch.bool).tril(), -math.inf)
        elif m is not None:
            s = s.masked_fill(~torch.tensor(m), -math.inf)
        to = torch.softmax(s, -1) @ tv
    (to * torch.tensor(do, dtype=torch.float64)).sum().backward()
    for got, want, what in ((o, to, "out"), (gq, tq.grad, "dq"), (gk, tk.grad, "dk"),
                            (gv, tv.grad, "dv")):
        want = want.detach().numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max(),
                                   err_msg=what)


def test_rlxc_attention_and_einsum_are_functions_after_importing_nn():
    """Regression: a submodule named rlxc.attention would shadow the function once imported."""
    import importlib

    import rlxc.nn  # noqa: F401  (imports the attention implementation)

    importlib.import_module("rlxc.attention_op")
    importlib.import_module("rlxc.einsum_op")
    assert callable(rlxc.attention) and rlxc.attention.__name__ == "attention"
    assert callable(rlxc.einsum) and rlxc.einsum.__name__ == "einsum"


def test_blocked_jvp_matches_one_block(monkeypatch):
    """Forward mode in query blocks of 2 rows equals the one-block tangent (float64)."""
    from rlxc.dialect.jvp import jvp_module

    q, k, v = qkv(1, 2, 7, 7, 3, seed=17)
    t = qkv(1, 2, 7, 7, 3, seed=18)
    f = attn_func([q.shape, k.shape, v.shape], mask=("sliding", 3), softcap=2.0)
    one = interpret(jvp_module(f.module, ["q", "k", "v"]), [q, k, v] + t, float_dtype=np.float64)
    monkeypatch.setattr(A, "SINGLE_ELEMS", 0)
    monkeypatch.setattr(A, "MIN_ROWS", 2)
    monkeypatch.setattr(A, "BLOCK_ELEMS", 2 * 7 * 2)
    jm = jvp_module(f.module, ["q", "k", "v"])
    assert sum(op.name == "rlx.concat" for op in get_func(jm).body.block.ops) >= 1
    many = interpret(jm, [q, k, v] + t, float_dtype=np.float64)
    for a, b in zip(one, many):
        np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-12)


def test_gpu_ptx_of_a_long_causal_attention_and_its_grad_assembles():
    """The GPU lowering of a sequence long enough for several query blocks: the forward
    is the fused flash kernel (lowering/gpu/attention.py), the grad's rlx.attention_lse
    and rlx.attention_bwd take the query-blocked expansion (unfused kernels, lane-split
    row reductions).  PTX for sm_90, and a cubin where ptxas is installed; the emulator
    runs a mid-size causal softcapped forward against the interpreter."""
    from rlxc.lowering.gpu import driver as gpu_driver
    from rlxc.lowering.gpu import emu as gpu_emu
    from rlxc.lowering.gpu import nvptx

    ptxas = nvptx.find_ptxas()
    f = attn_func([(1, 4, 768, 32)] * 3, mask="causal", name="gpu_long")
    for g in (f, f.grad(["q", "k", "v"])):
        art = gpu_driver.compile_cuda(g.module, ptxas=ptxas or False)
        assert ".target sm_90" in art.ptx
        if ptxas:
            assert art.cubin[:4] == b"\x7fELF"
    q, k, v = qkv(1, 1, 80, 80, 8, seed=21)
    m = attn_func([q.shape, k.shape, v.shape], mask="causal", softcap=3.0, name="gpu_mid")
    got = gpu_emu.emulate(m.module, [q, k, v])
    np.testing.assert_allclose(got[0], m.run_on("interp", q=q, k=k, v=v)[0], rtol=1e-5,
                               atol=1e-6)


def test_gpu_splat_constant_as_a_matmul_operand():
    """Regression (lowering/gpu/plan.py): a splat constant read in place by a matmul (the
    ones cotangent of a non-scalar output, sliced per query block) had no buffer: KeyError."""
    from rlxc.lowering.gpu import emu as gpu_emu

    f = rlxc.Func("splat_mm", lambda s: s.constant(np.full((16, 8), 2.0, np.float32))
                  @ s.input("x", (8, 4)))
    x = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    np.testing.assert_allclose(gpu_emu.emulate(f.module, [x])[0], 2 * np.ones((16, 8)) @ x,
                               rtol=1e-5, atol=1e-5)

"""rlxc.nn helpers against NumPy: embedding, rope, attention_block, transformer_block,
init; and a gradient of a whole block on the CPU against the interpreter."""
from __future__ import annotations

import numpy as np

import rlxc
from rlxc import nn


def _ln(x, g, b, eps=1e-5):
    m = x.mean(-1, keepdims=True)
    return (x - m) / np.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + eps) * g + b


def _rope(x, base=10000.0):
    S, D = x.shape[-2:]
    half = D // 2
    ang = np.arange(S)[:, None] * base ** (-np.arange(half) / half)[None, :]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * np.cos(ang) - b * np.sin(ang), a * np.sin(ang) + b * np.cos(ang)],
                          -1)


def _attn_block(P, x, heads, name, rope=False):
    B, S, d = x.shape
    qkv = x @ P[f"{name}.qkv.w"] + P[f"{name}.qkv.b"]
    q, k, v = (qkv[..., i * d:(i + 1) * d].reshape(B, S, heads, -1).transpose(0, 2, 1, 3)
               for i in range(3))
    if rope:
        q, k = _rope(q), _rope(k)
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d // heads)
    s = np.where(np.tril(np.ones((S, S), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    o = (p / p.sum(-1, keepdims=True)) @ v
    return o.transpose(0, 2, 1, 3).reshape(B, S, d) @ P[f"{name}.out.w"] + P[f"{name}.out.b"]


def test_embedding_gathers_rows():
    ids = np.array([[3, 0, 3], [1, 2, 4]], np.int32)
    f = nn.init(rlxc.Func("emb", lambda s: nn.embedding(s, "tok", s.input("ids", (2, 3), "i32"),
                                                        5, 4)), std=1.0)
    (got,) = f.run(ids=ids)
    np.testing.assert_array_equal(got, f.params()["tok.table"][ids])


def test_init_by_suffix():
    f = nn.init(rlxc.Func("ln", lambda s: nn.layer_norm(s, "ln", nn.linear(s, "fc", s.input(
        "x", (2, 3)), 4))), seed=1, std=0.5)
    p = f.params()
    assert (p["ln.g"] == 1).all() and (p["ln.b"] == 0).all() and (p["fc.b"] == 0).all()
    assert p["fc.w"].std() > 0.1


def test_attention_block_and_transformer_block_against_numpy():
    B, S, d, H = 2, 5, 8, 2
    x = np.random.default_rng(0).normal(size=(B, S, d)).astype(np.float32)

    def build(s):
        xi = s.input("x", (B, S, d))
        return (nn.attention_block(s, "a", xi, H, rope_base=10000.0),
                nn.transformer_block(s, "t", xi, H))
    f = nn.init(rlxc.Func("blocks", build), seed=2, std=0.3)
    P = {k: v.astype(np.float64) for k, v in f.params().items()}
    a, t = f.run_on("cpu", x=x)
    np.testing.assert_allclose(a, _attn_block(P, x, H, "a", rope=True), rtol=1e-4, atol=1e-5)
    h = x + _attn_block({k.replace("t.attn", "t"): v for k, v in P.items()},
                        _ln(x, P["t.ln1.g"], P["t.ln1.b"]), H, "t")
    m = _ln(h, P["t.ln2.g"], P["t.ln2.b"]) @ P["t.mlp.fc1.w"] + P["t.mlp.fc1.b"]
    from math import erf
    m = 0.5 * m * (1 + np.vectorize(erf)(m / np.sqrt(2)))
    want = h + m @ P["t.mlp.fc2.w"] + P["t.mlp.fc2.b"]
    np.testing.assert_allclose(t, want, rtol=1e-4, atol=1e-5)


def test_block_gradients_cpu_match_interp():
    B, S, d, H = 2, 6, 8, 2
    x = np.random.default_rng(3).normal(size=(B, S, d)).astype(np.float32)
    f = nn.init(rlxc.Func("tb", lambda s: (nn.transformer_block(
        s, "t", s.input("x", (B, S, d)), H, rope_base=100.0) ** 2).mean()), seed=4, std=0.3)
    g = f.value_and_grad_all()
    for c, i in zip(g.run_on("cpu", x=x), g.run_on("interp", x=x)):
        np.testing.assert_allclose(c, i, rtol=2e-4, atol=1e-5)

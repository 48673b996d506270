"""Transformer workloads of benchmarks/compare.py (issue 15), kept in their own file.

  W10  one pre-LN transformer block (d=256, 4 heads, seq 256, batch 8, causal
       attention, MLP 4x with exact GELU), value_and_grad of mean(y^2) over
       every param: rlxc (rlxc.nn.transformer_block + value_and_grad_all, jit),
       JAX (jax.value_and_grad, jit, jax.nn.dot_product_attention), PyTorch eager
       and torch.compile (autograd.grad, F.scaled_dot_product_attention)
  W11  causal attention forward alone, (1, 8, 2048, 64): rlxc.attention against
       torch's F.scaled_dot_product_attention (and JAX's dot_product_attention);
       rlxc's workspace (all its scratch memory) is printed next to the size of
       the full scores matrix

Each maker follows compare.py's protocol: a zero-argument function returning
the call to time; peers return the same outputs (checked against rlxc's).
"""
from __future__ import annotations

import math

W10_B, W10_S, W10_D, W10_H = 8, 256, 256, 4
W11_SHAPE = (1, 8, 2048, 64)


def w10(args, C):
    np = C.np_mod()
    B, S, D, H = W10_B, W10_S, W10_D, W10_H
    x = np.random.default_rng(10).normal(size=(B, S, D)).astype(np.float32)
    impls = {}
    state = {}

    def rlxc_func():
        if "f" not in state:
            from rlxc import Func, nn

            def build(s):
                y = nn.transformer_block(s, "blk", s.input("x", (B, S, D)), H, mask="causal")
                return (y * y).mean()
            state["f"] = nn.init(Func("w10_block", build), seed=10, std=0.05)
        return state["f"]

    def params():
        f = rlxc_func()
        return f.param_names(), {k: np.asarray(v) for k, v in f.params().items()}

    def rl():
        j = rlxc_func().value_and_grad_all().jit()
        return lambda: j.run(x)
    impls["rlxc"] = rl

    impls["numpy"] = C.skipped("no NumPy implementation of W10")

    def jx():
        jax = C.peer("jax")
        jnp = jax.numpy
        names, P = params()

        def ln(v, g, b):
            m = v.mean(-1, keepdims=True)
            return (v - m) / jnp.sqrt(((v - m) ** 2).mean(-1, keepdims=True) + 1e-5) * g + b

        def loss(p, xx):
            h = ln(xx, p["blk.ln1.g"], p["blk.ln1.b"])
            qkv = h @ p["blk.attn.qkv.w"] + p["blk.attn.qkv.b"]
            q, k, v = (qkv[..., i * D:(i + 1) * D].reshape(B, S, H, D // H) for i in range(3))
            o = jax.nn.dot_product_attention(q, k, v, is_causal=True).reshape(B, S, D)
            y = xx + o @ p["blk.attn.out.w"] + p["blk.attn.out.b"]
            m = ln(y, p["blk.ln2.g"], p["blk.ln2.b"]) @ p["blk.mlp.fc1.w"] + p["blk.mlp.fc1.b"]
            m = jax.nn.gelu(m, approximate=False) @ p["blk.mlp.fc2.w"] + p["blk.mlp.fc2.b"]
            y = y + m
            return (y * y).mean()
        f = jax.jit(jax.value_and_grad(loss))
        pd = {k: jnp.asarray(v) for k, v in P.items()}
        xd = jnp.asarray(x)

        def call():
            val, g = f(pd, xd)
            val.block_until_ready()
            return [val] + [g[n] for n in names]
        return call
    impls["jax"] = jx

    def tch(compiled):
        def make():
            torch = C.peer("torch")
            F = torch.nn.functional
            names, P = params()
            pt = {k: torch.from_numpy(v.copy()).requires_grad_(True) for k, v in P.items()}
            xt = torch.from_numpy(x)

            def loss(p, xx):
                h = F.layer_norm(xx, (D,), p["blk.ln1.g"], p["blk.ln1.b"], 1e-5)
                qkv = h @ p["blk.attn.qkv.w"] + p["blk.attn.qkv.b"]
                q, k, v = (qkv[..., i * D:(i + 1) * D].reshape(B, S, H, D // H).transpose(1, 2)
                           for i in range(3))
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                y = xx + o.transpose(1, 2).reshape(B, S, D) @ p["blk.attn.out.w"] \
                    + p["blk.attn.out.b"]
                m = F.layer_norm(y, (D,), p["blk.ln2.g"], p["blk.ln2.b"], 1e-5)
                m = F.gelu(m @ p["blk.mlp.fc1.w"] + p["blk.mlp.fc1.b"])
                y = y + m @ p["blk.mlp.fc2.w"] + p["blk.mlp.fc2.b"]
                return (y * y).mean()
            g = C.compile_torch(torch, loss) if compiled else loss
            plist = [pt[n] for n in names]

            def call():
                val = g(pt, xt)
                return [val] + list(torch.autograd.grad(val, plist))
            return call
        return make
    impls["torch"] = tch(False)
    impls["torch.compile"] = tch(True)
    flops = 3 * (2 * B * S * D * 3 * D + 2 * B * S * D * D + 2 * 2 * B * S * D * 4 * D
                 + 2 * B * H * S * S * (D // H))   # fwd + 2x backward, full (unmasked) scores
    return impls, dict(rtol=2e-3, atol=2e-5), {"flops": flops}


def w11(args, C):
    np = C.np_mod()
    B, H, S, Dh = W11_SHAPE
    rng = np.random.default_rng(11)
    q, k, v = (rng.normal(size=W11_SHAPE).astype(np.float32) for _ in range(3))
    impls = {}

    def rl():
        import rlxc

        f = rlxc.Func("w11_attn", lambda s: rlxc.attention(
            s.input("q", q.shape), s.input("k", k.shape), s.input("v", v.shape), mask="causal"))
        j = f.jit()
        ws = j.lib.workspace_size
        scores = B * H * S * S * 4
        print(f"  W11 rlxc workspace {ws / 2 ** 20:.1f} MiB (all scratch memory); the full "
              f"scores matrix is {scores / 2 ** 20:.0f} MiB: "
              f"{'below' if ws < scores else 'NOT below'}", flush=True)
        return lambda: j.run(q, k, v)[0]
    impls["rlxc"] = rl

    impls["numpy"] = C.skipped("no NumPy implementation of W11")

    def jx():
        jax = C.peer("jax")
        jnp = jax.numpy
        f = jax.jit(lambda a, b, c: jax.nn.dot_product_attention(
            a.transpose(0, 2, 1, 3), b.transpose(0, 2, 1, 3), c.transpose(0, 2, 1, 3),
            is_causal=True).transpose(0, 2, 1, 3))
        qd, kd, vd = (jnp.asarray(a) for a in (q, k, v))
        return lambda: f(qd, kd, vd).block_until_ready()
    impls["jax"] = jx

    def tch(compiled):
        def make():
            torch = C.peer("torch")
            F = torch.nn.functional
            qt, kt, vt = (torch.from_numpy(a) for a in (q, k, v))

            def f(a, b, c):
                return F.scaled_dot_product_attention(a, b, c, is_causal=True)
            return C.torch_no_grad(torch, f, (qt, kt, vt), compiled)
        return make
    impls["torch"] = tch(False)
    impls["torch.compile"] = tch(True)
    flops = 2 * 2 * B * H * S * S * Dh // 2     # causal: half of the two products
    return impls, dict(rtol=1e-4, atol=1e-5), {"flops": flops, "scores_bytes": B * H * S * S * 4,
                                               "peak_note": "see the W11 rlxc workspace line"}


__all__ = ["w10", "w11", "math"]

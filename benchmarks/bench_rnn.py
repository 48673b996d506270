"""W12: a GRU training step (issue 16) - rlxc.scan next to PyTorch eager nn.GRU and JAX lax.scan.

Run:  .venv/bin/python benchmarks/bench_rnn.py [--runs 20] [--threads 2] [--quick]
      (peers: any Python with torch / jax next to rlxc; a missing peer is reported)

Workload (float32): a one-layer GRU, input 64, hidden 256, sequence 128, batch 32;
the last hidden state through a linear readout to 10 classes, mean softmax
cross-entropy on integer labels.  One training step = forward + backward + an
SGD(lr 0.01) update of every param, loss back on the host.
  rlxc   the cell inside rlxc.scan, Func.trainer (the fused native step: the forward
         scan, the reverse scan of the backward, the update, one call)
  torch  nn.GRU + nn.Linear + F.cross_entropy, loss.backward(), optimizer.step()
  jax    the same cell in lax.scan, jit(value_and_grad) and the update in one jit
Each implementation is checked first (losses at the same params agree), then timed
round-robin (median of --runs samples, one untimed call before each).

Compile time vs sequence length: rlxc's value_and_grad module traced, lowered and
compiled (no cache) for seq 16 .. 1024: it must not grow with the length (the loop
is a region, not unrolled); JAX's jit of the same step beside it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

D, H, T, B, C = 64, 256, 128, 32, 10
LR = 0.01


def init(seed=0, d=D, h=H):
    rng = np.random.default_rng(seed)
    s = 1 / np.sqrt(h)
    u = lambda *shape: rng.uniform(-s, s, shape).astype(np.float32)  # noqa: E731
    return {"wx": u(d, 3 * h), "bx": u(3 * h), "wh": u(h, 3 * h), "bh": u(3 * h),
            "wo": u(h, C), "bo": u(C)}


def data(seed=1, t=T):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((t, B, D)).astype(np.float32),
            rng.integers(0, C, B).astype(np.int32))


# ---------------------------------------------------------------- rlxc

def rlxc_model(t=T, name="gru"):
    import rlxc

    def build(s):
        x = s.input("x", (t, B, D))
        y = s.input("y", (B,), "i32")
        wx, bx = s.param("wx", (D, 3 * H)), s.param("bx", (3 * H,))
        wh, bh = s.param("wh", (H, 3 * H)), s.param("bh", (3 * H,))
        wo, bo = s.param("wo", (H, C)), s.param("bo", (C,))
        gxs = (x.reshape(t * B, D) @ wx + bx).reshape(t, B, 3 * H)   # input gates, batched

        def cell(h, gx):
            gh = h @ wh + bh
            z = (gx[:, :H] + gh[:, :H]).sigmoid()
            r = (gx[:, H:2 * H] + gh[:, H:2 * H]).sigmoid()
            n = (gx[:, 2 * H:] + r * gh[:, 2 * H:]).tanh()
            return (1.0 - z) * n + z * h, None
        h, _ = rlxc.scan(cell, s.constant(np.zeros((B, H), np.float32)), gxs)
        return h.linear(wo, bo).cross_entropy(y)
    return rlxc.Func(name, build)


def rlxc_step(params):
    from rlxc.optim import SGD

    tr = rlxc_model().with_params(params).trainer(SGD(LR))
    return lambda x, y: float(tr.step({"x": x, "y": y}))


# ---------------------------------------------------------------- torch

def torch_step(params, threads):
    import torch

    torch.set_num_threads(threads)
    gru = torch.nn.GRU(D, H)
    lin = torch.nn.Linear(H, C)
    with torch.no_grad():   # torch's gate order is (r, z, n); ours (z, r, n)
        perm = lambda w: np.concatenate([w[H:2 * H], w[:H], w[2 * H:]])  # noqa: E731
        gru.weight_ih_l0.copy_(torch.tensor(perm(params["wx"].T)))
        gru.weight_hh_l0.copy_(torch.tensor(perm(params["wh"].T)))
        gru.bias_ih_l0.copy_(torch.tensor(perm(params["bx"])))
        gru.bias_hh_l0.copy_(torch.tensor(perm(params["bh"])))
        lin.weight.copy_(torch.tensor(params["wo"].T))
        lin.bias.copy_(torch.tensor(params["bo"]))
    opt = torch.optim.SGD(list(gru.parameters()) + list(lin.parameters()), lr=LR)

    def step(x, y):
        opt.zero_grad()
        _, h = gru(torch.from_numpy(x))
        loss = torch.nn.functional.cross_entropy(lin(h[0]), torch.from_numpy(y).long())
        loss.backward()
        opt.step()
        return loss.item()
    return step


# ---------------------------------------------------------------- jax

def jax_loss(jax, jnp):
    def loss(p, x, y):
        gxs = (x.reshape(-1, D) @ p["wx"] + p["bx"]).reshape(x.shape[0], B, 3 * H)

        def cell(h, gx):
            gh = h @ p["wh"] + p["bh"]
            z = jax.nn.sigmoid(gx[:, :H] + gh[:, :H])
            r = jax.nn.sigmoid(gx[:, H:2 * H] + gh[:, H:2 * H])
            n = jnp.tanh(gx[:, 2 * H:] + r * gh[:, 2 * H:])
            return (1 - z) * n + z * h, None
        h, _ = jax.lax.scan(cell, jnp.zeros((B, H), jnp.float32), gxs)
        logits = h @ p["wo"] + p["bo"]
        return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(B), y])
    return loss


def jax_step(params):
    import jax
    import jax.numpy as jnp

    loss = jax_loss(jax, jnp)

    @jax.jit
    def update(p, x, y):
        v, g = jax.value_and_grad(loss)(p, x, y)
        return v, jax.tree_util.tree_map(lambda a, b: a - LR * b, p, g)
    state = {"p": {k: jnp.asarray(v) for k, v in params.items()}}

    def step(x, y):
        v, state["p"] = update(state["p"], x, y)
        return float(v)
    return step


# ---------------------------------------------------------------- harness

def peers(params, threads):
    impls = {"rlxc": lambda: rlxc_step(params)}
    impls["torch"] = lambda: torch_step(params, threads)
    impls["jax"] = lambda: jax_step(params)
    out = {}
    for name, make in impls.items():
        try:
            out[name] = make()
        except ImportError as e:
            print(f"{name}: missing ({e})")
    return out


def time_steps(steps, x, y, runs):
    """Round-robin medians; the params move with every step, identically for all."""
    samples = {k: [] for k in steps}
    names = list(steps)
    for r in range(runs):
        for k in names[r % len(names):] + names[:r % len(names)]:
            steps[k](x, y)
            t0 = time.perf_counter()
            steps[k](x, y)
            samples[k].append(time.perf_counter() - t0)
            time.sleep(0.02)
    return {k: (statistics.median(v), min(v)) for k, v in samples.items()}


def compile_times(lengths, with_jax):
    from rlxc.lowering.cpu.driver import compile_cpu

    rows = []
    for t in lengths:
        t0 = time.perf_counter()
        f = rlxc_model(t, f"gru{t}").value_and_grad(["wx", "bx", "wh", "bh", "wo", "bo"])
        compile_cpu(f.module, link=True)
        rc = time.perf_counter() - t0
        jc = float("nan")
        if with_jax:
            import jax
            import jax.numpy as jnp
            x, y = data(t=t)
            p = {k: jnp.asarray(v) for k, v in init().items()}
            t0 = time.perf_counter()
            jax.jit(jax.value_and_grad(jax_loss(jax, jnp))).lower(p, x, y).compile()
            jc = time.perf_counter() - t0
        rows.append((t, rc, jc))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="W12: GRU training step")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="5 runs, compile lengths 16/256")
    args = ap.parse_args(argv)
    os.environ.setdefault("RLXC_NUM_THREADS", str(args.threads))
    os.environ.setdefault("RLXC_CACHE_DIR", tempfile.mkdtemp(prefix="rlxc-w12-"))
    runs = 5 if args.quick else args.runs
    params = init()
    x, y = data()
    steps = peers(params, args.threads)
    first = {k: s(x, y) for k, s in steps.items()}   # the same params: the same loss
    for k, v in first.items():
        assert abs(v - first["rlxc"]) < 1e-3 * max(1.0, abs(v)), (k, v, first["rlxc"])
    res = time_steps(steps, x, y, runs)
    print(f"W12 GRU train step (D={D} H={H} T={T} B={B}, {args.threads} threads, "
          f"{runs} runs): median (min) ms")
    best = min((v[0] for k, v in res.items() if k != "rlxc"), default=float("nan"))
    for k, (med, lo) in res.items():
        print(f"  {k:6s} {med * 1e3:9.2f} ({lo * 1e3:.2f})   peer/rlxc {med / res['rlxc'][0]:.2f}x")
    print(f"  best peer / rlxc: {best / res['rlxc'][0]:.2f}x (target >= 1.0x)")
    lengths = (16, 256) if args.quick else (16, 128, 1024)
    print("compile time (trace + value_and_grad + lower + LLVM + link) vs sequence length:")
    for t, rc, jc in compile_times(lengths, "jax" in steps):
        print(f"  seq {t:5d}: rlxc {rc:6.2f} s   jax.jit {jc:6.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One training step of an MLP, rlxc's Trainer vs JAX vs PyTorch, side by side.

Run:  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/bench_train.py

Workload: MLP 784-512-512-10 (ReLU), softmax cross-entropy on integer
labels, batch 128, Adam(1e-3); one step = forward + backward + Adam update
of every param, loss returned to the host.

* rlxc: `f.trainer(Adam)` on the native device (and the interpreter with
  --interp, for scale): one fused compiled call per step, params resident.
* JAX (when installed): one `jax.jit` step: value_and_grad + the Adam update
  written out, params/state donated; `block_until_ready` on the loss.
* PyTorch (when installed): eager `zero_grad / loss.backward / optim.step`
  with torch.optim.Adam (foreach), `loss.item()` per step.

All three start from the same float32 initial params and see the same
batches (a few fixed random batches, cycled).  Each runs `--warmup` steps,
then `--runs` (>= 20) timed steps; the report gives median and min
milliseconds per step, and the ratio of each framework's median to rlxc's.
A framework that is not installed is reported as skipped.  --threads N pins
rlxc (RLXC_NUM_THREADS) and PyTorch to N threads (and JAX too when N is 1); on a loaded machine the
medians of multi-threaded runs are noisy, so compare the minimums too.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

SIZES = (784, 512, 512, 10)
BATCH = 128


def init_params(seed: int = 0) -> dict:
    f = model_func()
    return {k: np.array(v) for k, v in f.init_randn(seed, 0.05).params().items()}


def model_func():
    from rlxc import Func

    def build(s):
        h = s.input("x", (BATCH, SIZES[0]))
        for i in range(len(SIZES) - 1):
            h = h.linear(s.param(f"w{i}", (SIZES[i], SIZES[i + 1])),
                         s.param(f"b{i}", (SIZES[i + 1],)))
            if i < len(SIZES) - 2:
                h = h.relu()
        return h.cross_entropy(s.input("y", (BATCH,), "i32"))
    return Func("mlp_bench", build)


def batches(n: int = 4, seed: int = 1) -> list:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((BATCH, SIZES[0])).astype(np.float32),
             rng.integers(0, SIZES[-1], BATCH).astype(np.int32)) for _ in range(n)]


def timeit(step, data, warmup: int, runs: int) -> list[float]:
    for i in range(warmup):
        step(*data[i % len(data)])
    out = []
    for i in range(runs):
        x, y = data[i % len(data)]
        t0 = time.perf_counter()
        step(x, y)
        out.append(time.perf_counter() - t0)
    return out


def bench_rlxc(params, data, warmup, runs, device):
    from rlxc.optim import Adam

    t0 = time.perf_counter()
    tr = model_func().with_params(params).trainer(Adam(1e-3), device=device)
    tr.step({"x": data[0][0], "y": data[0][1]})
    build = time.perf_counter() - t0
    times = timeit(lambda x, y: tr.step({"x": x, "y": y}), data, warmup, runs)
    return times, f"build+first step {build:.2f} s"


def bench_jax(params, data, warmup, runs):
    import jax
    import jax.numpy as jnp

    n_layers = len(SIZES) - 1
    b1, b2, eps, lr = 0.9, 0.999, 1e-8, 1e-3

    def loss_fn(p, x, y):
        h = x
        for i in range(n_layers):
            h = h @ p[f"w{i}"] + p[f"b{i}"]
            if i < n_layers - 1:
                h = jax.nn.relu(h)
        logp = jax.nn.log_softmax(h, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))

    @jax.jit
    def step(p, m, v, t, x, y):
        loss, g = jax.value_and_grad(loss_fn)(p, x, y)
        t = t + 1
        m = jax.tree_util.tree_map(lambda m_, g_: b1 * m_ + (1 - b1) * g_, m, g)
        v = jax.tree_util.tree_map(lambda v_, g_: b2 * v_ + (1 - b2) * g_ * g_, v, g)
        bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
        p = jax.tree_util.tree_map(
            lambda p_, m_, v_: p_ - lr * (m_ / bc1) / (jnp.sqrt(v_ / bc2) + eps), p, m, v)
        return p, m, v, t, loss

    state = {"p": {k: jnp.asarray(a) for k, a in params.items()}}
    state["m"] = jax.tree_util.tree_map(jnp.zeros_like, state["p"])
    state["v"] = jax.tree_util.tree_map(jnp.zeros_like, state["p"])
    state["t"] = jnp.asarray(0.0, jnp.float32)
    dev = [(jnp.asarray(x), jnp.asarray(y)) for x, y in data]

    def one(x, y):
        p, m, v, t, loss = step(state["p"], state["m"], state["v"], state["t"], x, y)
        state.update(p=p, m=m, v=v, t=t)
        return float(loss)

    t0 = time.perf_counter()
    one(*dev[0])
    build = time.perf_counter() - t0
    return timeit(one, dev, warmup, runs), f"jax {jax.__version__}, jit {build:.2f} s"


def bench_torch(params, data, warmup, runs):
    import torch

    if os.environ.get("RLXC_NUM_THREADS"):
        torch.set_num_threads(int(os.environ["RLXC_NUM_THREADS"]))
    p = {k: torch.tensor(a, requires_grad=True) for k, a in params.items()}
    opt = torch.optim.Adam(list(p.values()), lr=1e-3)
    n_layers = len(SIZES) - 1
    tdata = [(torch.from_numpy(x), torch.from_numpy(y).long()) for x, y in data]

    def one(x, y):
        opt.zero_grad(set_to_none=True)
        h = x
        for i in range(n_layers):
            h = h @ p[f"w{i}"] + p[f"b{i}"]
            if i < n_layers - 1:
                h = torch.relu(h)
        loss = torch.nn.functional.cross_entropy(h, y)
        loss.backward()
        opt.step()
        return loss.item()

    return timeit(one, tdata, warmup, runs), (f"torch {torch.__version__}, "
                                               f"{torch.get_num_threads()} threads")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--device", default=None, help="rlxc device (default: best available)")
    ap.add_argument("--interp", action="store_true", help="also time rlxc's interpreter")
    ap.add_argument("--threads", type=int, default=0,
                    help="threads for rlxc (RLXC_NUM_THREADS) and PyTorch; 0 = all cores")
    args = ap.parse_args(argv)
    if args.threads:
        os.environ["RLXC_NUM_THREADS"] = str(args.threads)
        os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
        if args.threads == 1:  # XLA's CPU client: no Eigen thread pool (set before import)
            os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false "
                                               "intra_op_parallelism_threads=1")
    if args.runs < 20:
        ap.error("--runs must be >= 20")
    from rlxc.func import default_device

    device = args.device or default_device()
    params, data = init_params(), batches()
    n_params = sum(a.size for a in params.values())
    print(f"MLP {'-'.join(map(str, SIZES))} ({n_params / 1e6:.2f} M params), batch {BATCH}, "
          f"Adam; {os.cpu_count()} CPUs; median/min of {args.runs} steps after "
          f"{args.warmup} warm-up")

    rows = []
    cases = [(f"rlxc Trainer ({device})", lambda: bench_rlxc(params, data, args.warmup,
                                                             args.runs, device))]
    if args.interp and device != "interp":
        cases.append(("rlxc Trainer (interp)",
                      lambda: bench_rlxc(params, data, args.warmup, args.runs, "interp")))
    cases += [("JAX jit", lambda: bench_jax(params, data, args.warmup, args.runs)),
              ("PyTorch eager", lambda: bench_torch(params, data, args.warmup, args.runs))]
    for name, fn in cases:
        try:
            times, note = fn()
        except ImportError as e:
            print(f"  {name:24s} skipped: {e.name or e} is not installed "
                  "(pip install '.[bench]')")
            continue
        med, best = statistics.median(times), min(times)
        rows.append((name, med, best))
        print(f"  {name:24s} median {1e3 * med:8.3f} ms   min {1e3 * best:8.3f} ms   ({note})")
    base = rows[0][1] if rows else None
    if base and len(rows) > 1:
        print("ratios (median time / rlxc median; > 1 means rlxc is faster):")
        for name, med, _ in rows[1:]:
            print(f"  {name:24s} {med / base:6.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

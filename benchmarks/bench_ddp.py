"""Data-parallel step of the W4 MLP over MPI: 2 ranks against 1, and the allreduce share.

Run:  .venv/bin/python benchmarks/bench_ddp.py [--ranks 2] [--steps 50] [--threads 1]

Workload: MLP 784-512-512-10 (ReLU), softmax cross-entropy, global batch 128,
SGD(0.01) (the MLP of issue W4; 669,706 params, a 2.6 MB gradient buffer).

* 1 rank: the fused single-process Trainer (one compiled call per step), in
  this process.
* N ranks (launched here with `mpiexec -n N`): `f.trainer(opt, comm=comm)` on
  128/N rows each: compiled grads, ONE in-place Allreduce of the flat float32
  buffer [grads | loss], compiled update.  Each rank times its steps and the
  allreduce calls (Comm.allreduce_seconds); the first fraction reported is
  the allreduce time over the step time on rank 0.  In a step the allreduce
  also absorbs the wait for the slowest rank (on a shared machine most of
  it), so the phases are timed one by one too, and a pure Allreduce of the
  same buffer after a barrier: the second fraction is that transport cost
  over the uncontended step (fastest grads + fastest apply + allreduce).

Every process uses --threads threads (RLXC_NUM_THREADS); on a machine with
few cores, N ranks x threads should not exceed them.  The step times are
medians of --steps timed steps after --warmup.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

SIZES = (784, 512, 512, 10)
GLOBAL_BATCH = 128


def model(batch: int):
    from rlxc import Func

    def build(s):
        h = s.input("x", (batch, SIZES[0]))
        for i in range(len(SIZES) - 1):
            h = h.linear(s.param(f"w{i}", (SIZES[i], SIZES[i + 1])),
                         s.param(f"b{i}", (SIZES[i + 1],)))
            if i < len(SIZES) - 2:
                h = h.relu()
        return h.cross_entropy(s.input("y", (batch,), "i32"))
    return Func("mlp_ddp_bench", build).init_randn(0, 0.05)


def batches(n: int = 4, seed: int = 1) -> list:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((GLOBAL_BATCH, SIZES[0])).astype(np.float32),
             rng.integers(0, SIZES[-1], GLOBAL_BATCH).astype(np.int32)) for _ in range(n)]


def timed_steps(tr, feeds, warmup, steps, comm=None):
    for i in range(warmup):
        tr.step(feeds[i % len(feeds)])
    if comm is not None:
        comm.barrier()
        comm.allreduce_seconds, comm.allreduce_calls = 0.0, 0
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        tr.step(feeds[i % len(feeds)])
        times.append(time.perf_counter() - t0)
    return times


def phases(tr, feeds, steps, comm) -> dict:
    """Per phase of the distributed step (grads, allreduce, apply): median and min ms."""
    from rlxc.train import coerce_data

    eng = tr._engine
    out = {"grads": [], "allreduce": [], "apply": []}
    for i in range(steps):
        for j, a in enumerate(coerce_data(tr._gprog, tr._f, feeds[i % len(feeds)])):
            eng.set_data(j, a)
        t0 = time.perf_counter()
        eng.run_grads()
        t1 = time.perf_counter()
        comm.allreduce_sum_(eng.flat)
        t2 = time.perf_counter()
        eng.run_apply()
        t3 = time.perf_counter()
        for k, v in zip(out, (t1 - t0, t2 - t1, t3 - t2)):
            out[k].append(v)
    return {k: (1e3 * statistics.median(v), 1e3 * min(v)) for k, v in out.items()}


def worker(args) -> None:
    """One rank of the N-rank run; rank 0 prints one JSON line."""
    from rlxc.distributed import init, shard
    from rlxc.optim import SGD

    comm = init()
    local = [(shard(x, comm), shard(y, comm)) for x, y in batches()]
    n = local[0][0].shape[0]
    tr = model(n).trainer(SGD(0.01), device="cpu", comm=comm)
    feeds = [{"x": x, "y": y} for x, y in local]
    times = timed_steps(tr, feeds, args.warmup, args.steps, comm)
    ar = comm.allreduce_seconds / comm.allreduce_calls
    ph = phases(tr, feeds, args.steps, comm)
    buf = tr._engine.flat.copy()
    pure = []
    for _ in range(args.steps):
        comm.barrier()
        t0 = time.perf_counter()
        comm.allreduce_sum_(buf)
        pure.append(time.perf_counter() - t0)
    if comm.rank == 0:
        step = statistics.median(times)
        pure_ms = 1e3 * statistics.median(pure)
        ideal = ph["grads"][1] + ph["apply"][1] + pure_ms  # compute at its best + transport
        print(json.dumps({"ranks": comm.size, "rows_per_rank": n, "step_ms": 1e3 * step,
                          "step_min_ms": 1e3 * min(times), "allreduce_ms": 1e3 * ar,
                          "fraction": ar / statistics.mean(times), "phases": ph,
                          "pure_allreduce_ms": pure_ms, "ideal_step_ms": ideal,
                          "pure_fraction": pure_ms / ideal,
                          "buffer_floats": int(buf.size)}), flush=True)


def one_rank(args) -> dict:
    from rlxc.optim import SGD

    tr = model(GLOBAL_BATCH).trainer(SGD(0.01), device="cpu")
    feeds = [{"x": x, "y": y} for x, y in batches()]
    return {"step_ms": 1e3 * statistics.median(timed_steps(tr, feeds, args.warmup, args.steps))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    os.environ["RLXC_NUM_THREADS"] = str(args.threads)
    if args.worker:
        worker(args)
        return 0
    single = one_rank(args)
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    p = subprocess.run([mpiexec, "-n", str(args.ranks), "--oversubscribe", sys.executable,
                        os.path.abspath(__file__), "--worker", "--steps", str(args.steps),
                        "--warmup", str(args.warmup), "--threads", str(args.threads)],
                       env=env, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        print(p.stdout + p.stderr, file=sys.stderr)
        return 1
    multi = json.loads([ln for ln in p.stdout.splitlines() if ln.startswith("{")][-1])
    print(f"MLP {'-'.join(map(str, SIZES))}, global batch {GLOBAL_BATCH}, SGD, "
          f"{args.threads} thread(s) per process, median of {args.steps} steps")
    print(f"  1 rank  (fused Trainer, batch {GLOBAL_BATCH}):       "
          f"{single['step_ms']:8.3f} ms/step")
    print(f"  {multi['ranks']} ranks (comm Trainer, {multi['rows_per_rank']} rows each):  "
          f"{multi['step_ms']:8.3f} ms/step")
    ph = multi["phases"]
    print("  rank 0 phases, median / min ms: " + ", ".join(
        f"{k} {v[0]:.3f} / {v[1]:.3f}" for k, v in ph.items()))
    print(f"  allreduce in the step ({multi['buffer_floats']} floats): "
          f"{multi['allreduce_ms']:.3f} ms = {100 * multi['fraction']:.1f}% of the step "
          f"(includes waiting for the slower rank)")
    print(f"  pure allreduce after a barrier: {multi['pure_allreduce_ms']:.3f} ms = "
          f"{100 * multi['pure_fraction']:.1f}% of the uncontended step "
          f"({multi['ideal_step_ms']:.3f} ms = min grads + min apply + allreduce; "
          f"target < 10%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

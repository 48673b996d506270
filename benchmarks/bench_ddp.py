"""Data-parallel step of the W4 MLP over MPI: 2 ranks against 1, and the reduction share.

Run:  .venv/bin/python benchmarks/bench_ddp.py [--ranks 2] [--steps 50] [--threads 1]
                                               [--repeat 3] [--modes default,shm]

Workload: MLP 784-512-512-10 (ReLU), softmax cross-entropy, global batch 128,
SGD(0.01) (the MLP of issue W4; 669,706 params, a 2.6 MB gradient buffer).

* 1 rank: the fused single-process Trainer (one compiled call per step), in
  this process.
* N ranks (launched here with `mpiexec -n N`, once per reduce mode of
  rlxc.distributed.init: "default" = what init() picks with RLXC_DDP_REDUCE
  unset, ONE in-place MPI_Allreduce of the flat float32 buffer [grads | loss]
  (the worker reports the mode it got; "allreduce" forces it); "shm" = the
  opt-in MPI-3 shared-memory window, each rank summing its slice,
  rlxc/reduce_buffer.py):
  `f.trainer(opt, comm=comm)` on 128/N rows each.  Each rank times its steps
  and the reductions (Comm.allreduce_seconds).  Two fractions:
    in-step  = mean reduction time / mean step time on rank 0; the reduction
               also absorbs the wait for the slower rank (on a shared machine
               much of it);
    pure     = the reduction alone, right after a barrier, over the uncontended
               step (fastest grads + fastest apply + that reduction): with the
               median reduction, and with the fastest one (what is left of the
               transport when no other process takes the CPU: the robust number
               on a loaded machine).
* --repeat R runs all of it R times, interleaved; the table shows the medians
  over the repeats (each repeat's numbers are themselves medians or means over
  --steps steps) and the load average before and after.

Every process uses --threads threads (RLXC_NUM_THREADS); on a machine with
few cores, N ranks x threads should not exceed them.
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
    """Per phase of the distributed step (grads, reduce, apply): median and min ms."""
    from rlxc.train import coerce_data

    eng, buf = tr._engine, tr._gbuf
    out = {"grads": [], "reduce": [], "apply": []}
    for i in range(steps):
        for j, a in enumerate(coerce_data(tr._gprog, tr._f, feeds[i % len(feeds)])):
            eng.set_data(j, a)
        t0 = time.perf_counter()
        eng.run_grads()
        t1 = time.perf_counter()
        buf.reduce()
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
    pure = []
    for _ in range(args.steps):
        comm.barrier()
        t0 = time.perf_counter()
        tr._gbuf.reduce()
        pure.append(time.perf_counter() - t0)
    if comm.rank == 0:
        pure_ms = 1e3 * statistics.median(pure)
        ideal = ph["grads"][1] + ph["apply"][1] + pure_ms  # compute at its best + transport
        print(json.dumps({"ranks": comm.size, "mode": tr._gbuf.kind, "rows_per_rank": n,
                          "step_ms": 1e3 * statistics.median(times),
                          "reduce_ms": 1e3 * ar, "fraction": ar / statistics.mean(times),
                          "phases": ph, "pure_ms": pure_ms, "ideal_step_ms": ideal,
                          "pure_min_ms": 1e3 * min(pure),
                          "best_fraction": 1e3 * min(pure) / (ph["grads"][1] + ph["apply"][1]
                                                              + 1e3 * min(pure)),
                          "pure_fraction": pure_ms / ideal,
                          "buffer_floats": int(tr._gbuf.local.size)}), flush=True)


def one_rank(args) -> dict:
    from rlxc.optim import SGD

    tr = model(GLOBAL_BATCH).trainer(SGD(0.01), device="cpu")
    feeds = [{"x": x, "y": y} for x, y in batches()]
    return {"step_ms": 1e3 * statistics.median(timed_steps(tr, feeds, args.warmup, args.steps))}


def run_ranks(args, mode: str) -> dict:
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", RLXC_DDP_REDUCE=mode)
    if mode == "default":
        del env["RLXC_DDP_REDUCE"]
    p = subprocess.run([mpiexec, "-n", str(args.ranks), "--oversubscribe", sys.executable,
                        os.path.abspath(__file__), "--worker", "--steps", str(args.steps),
                        "--warmup", str(args.warmup), "--threads", str(args.threads)],
                       env=env, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise RuntimeError(f"mpiexec ({mode}) failed:\n{p.stdout}{p.stderr}")
    return json.loads([ln for ln in p.stdout.splitlines() if ln.startswith("{")][-1])


def pct(rs, key) -> str:
    return ", ".join(f"{100 * r[key]:.1f}%" for r in rs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--modes", default="default,shm")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    os.environ["RLXC_NUM_THREADS"] = str(args.threads)
    if args.worker:
        worker(args)
        return 0
    modes = [m for m in args.modes.split(",") if m]
    load0 = os.getloadavg()
    single, multi = [], {m: [] for m in modes}
    for _ in range(args.repeat):
        single.append(one_rank(args)["step_ms"])
        for m in modes:
            multi[m].append(run_ranks(args, m))
    load1 = os.getloadavg()
    med = statistics.median
    one = med(single)
    print(f"MLP {'-'.join(map(str, SIZES))}, global batch {GLOBAL_BATCH}, SGD, "
          f"{args.threads} thread(s) per process; medians over {args.repeat} repeat(s) "
          f"of {args.steps} steps")
    print(f"load average (1/5/15 min) before {'/'.join(f'{x:.2f}' for x in load0)}, after "
          f"{'/'.join(f'{x:.2f}' for x in load1)} on {os.cpu_count()} CPUs")
    print(f"  1 rank  (fused Trainer, batch {GLOBAL_BATCH}): {one:8.3f} ms/step  "
          f"(repeats: {', '.join(f'{x:.3f}' for x in single)})")
    for m in modes:
        rs = multi[m]
        step = med([r["step_ms"] for r in rs])
        ph = {k: med([r["phases"][k][0] for r in rs]) for k in rs[0]["phases"]}
        label = f"{m} = {rs[0]['mode']}" if m == "default" else m
        print(f"  {rs[0]['ranks']} ranks, reduce={label} ({rs[0]['rows_per_rank']} rows each, "
              f"{rs[0]['buffer_floats']} floats): {step:8.3f} ms/step = "
              f"{one / step:.2f}x the 1-rank speed")
        print("      rank 0 phases (median ms): " + ", ".join(f"{k} {v:.3f}"
                                                          for k, v in ph.items()))
        print(f"      reduction in the step: {med([r['reduce_ms'] for r in rs]):.3f} ms = "
              f"{100 * med([r['fraction'] for r in rs]):.1f}% of the step, incl. waiting for "
              f"the slower rank (repeats: "
              f"{pct(rs, 'fraction')})")
        print(f"      pure reduction after a barrier: median {med([r['pure_ms'] for r in rs]):.3f}"
              f" ms = {100 * med([r['pure_fraction'] for r in rs]):.1f}% of the uncontended "
              f"step (repeats: {pct(rs, 'pure_fraction')})")
        print(f"      fastest pure reduction: {med([r['pure_min_ms'] for r in rs]):.3f} ms = "
              f"{100 * med([r['best_fraction'] for r in rs]):.1f}% of the fastest step "
              f"(repeats: {pct(rs, 'best_fraction')})")
    print("  target (issue 18): reduction < 10% of the step")
    return 0


if __name__ == "__main__":
    sys.exit(main())

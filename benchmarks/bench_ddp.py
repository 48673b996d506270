"""Data-parallel step of the W4 MLP over MPI: 2 ranks against 1, and the reduction share.

Run:  .venv/bin/python benchmarks/bench_ddp.py [--ranks 2] [--steps 200] [--repeat 3]
          [--threads auto|N] [--bind core|none] [--mca KEY=VALUE ...] [--modes default,shm]
      .venv/bin/python benchmarks/bench_ddp.py --sweep [--steps 400]   (Open MPI settings)

Workload: MLP 784-512-512-10 (ReLU), softmax cross-entropy, global batch 128,
SGD(0.01) (the MLP of issue W4; 669,706 params, a 2.6 MB gradient buffer).

* 1 rank: the fused single-process Trainer (one compiled call per step), in a
  fresh process, on 1 thread and on all cores.
* N ranks: `mpiexec -n N --bind-to core` (or `--bind-to none --oversubscribe`,
  --bind none), once per reduce mode of rlxc.distributed.init: "default" = what
  init() picks with RLXC_DDP_REDUCE unset (ONE in-place MPI_Allreduce of the
  flat float32 buffer [grads | loss]; the worker reports the mode it got), "shm"
  = the opt-in MPI-3 shared-memory window (rlxc/reduce_buffer.py).  Threads
  per rank: --threads auto leaves RLXC_NUM_THREADS / OMP_NUM_THREADS unset, so
  init() caps them (1 per rank for 2 ranks on 2 cores); N forces N.  Each rank
  runs `f.trainer(opt, comm=comm)` on 128/N rows: first --steps whole steps
  (Trainer.step; Comm.allreduce_seconds gives the reduction inside them), then
  --steps steps split by a barrier into phases:
      grads | wait (barrier: the wait for the slower rank) | reduce | apply
  so that the transport (reduce, every rank present) is apart from the imbalance.
  Printed per mode: the step, both ranks' phases (median / 20th percentile /
  fastest), the reduction's share of the step with the wait, the transport's
  share without it (per step, then the median), and the uncontended share:
  the fastest reduce over the fastest grads + it + the fastest apply.
* --repeat R runs all of it R times, interleaved; the tables show medians over
  the repeats and the load average before and after.
* --fifo runs every measured process (the 1-rank runs and each rank) under
  `chrt -f 1` (SCHED_FIFO, root on Linux): the other processes of a shared
  machine then wait while the benchmark runs (the kernel's RT throttling still
  leaves them 5%), which measures the step as on quiet cores.  Keep such runs
  short on a machine others use.

On a shared machine the medians mostly measure the other processes: the
reduction is a collective, so a rank preempted anywhere in it stalls both,
and a loaded 2-core VM inflates the reduction far more than the compute.  The
fastest phases (the uncontended share) are the numbers to compare with the
issue's target.  (The fastest whole steps are no better: when the compute is
slowed in every step, its fastest steps still carry that and shrink the share.)

Where the step's time goes (Linux): every whole step and every split step
also records its rank's run-queue delay, the time the rank was runnable but
another process held its core (/proc/thread-self/schedstat), and its
involuntary context switches.  A step is "undisturbed" when no rank waited on
the run queue in it (under 50 us, one timer tick is 4 ms); the table prints
the step and the reduction over the undisturbed steps apart from all steps,
and the median per-step sum of the phases beside the whole step, so that a
whole-step median far above the phases is seen to be, or not to be, time the
ranks spent off their cores.  (The per-phase medians hide it: a preemption
lands in one phase of a step, a different one each step.)
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


QUIET_MS = 0.05  # a step whose ranks waited less than this on the run queue is undisturbed


def run_delay_ms() -> float:
    """Time this thread has spent runnable but waiting for a CPU (Linux schedstat), in ms;
    0.0 where the kernel does not say (then every step counts as undisturbed)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e6
    except (OSError, IndexError, ValueError):
        return 0.0


def timed_steps(tr, feeds, warmup, steps, comm=None, record=None):
    """Wall seconds per Trainer.step; with `record` (a dict) also, per step, the
    reduction's ms (comm.allreduce_seconds), the run-queue delay's ms and the
    involuntary context switches of this rank."""
    import resource

    for i in range(warmup):
        tr.step(feeds[i % len(feeds)])
    if comm is not None:
        comm.barrier()
        comm.allreduce_seconds, comm.allreduce_calls = 0.0, 0
    times = []
    who = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)
    for i in range(steps):
        a0, q0 = (comm.allreduce_seconds if comm else 0.0), run_delay_ms()
        c0 = resource.getrusage(who).ru_nivcsw
        t0 = time.perf_counter()
        tr.step(feeds[i % len(feeds)])
        times.append(time.perf_counter() - t0)
        if record is not None:
            record.setdefault("reduce", []).append(
                1e3 * ((comm.allreduce_seconds if comm else 0.0) - a0))
            record.setdefault("runq", []).append(run_delay_ms() - q0)
            record.setdefault("preempted", []).append(resource.getrusage(who).ru_nivcsw - c0)
    return times


def phases(tr, feeds, steps, comm) -> dict:
    """The distributed step split by barriers: grads, wait (barrier: the wait for the
    slower rank), reduce (the transport alone: every rank has arrived), apply.
    Per phase: every sample in ms."""
    from rlxc.train import coerce_data

    eng, buf = tr._engine, tr._gbuf
    out = {"grads": [], "wait": [], "reduce": [], "apply": []}
    runq = []
    for i in range(steps):
        for j, a in enumerate(coerce_data(tr._gprog, tr._f, feeds[i % len(feeds)])):
            eng.set_data(j, a)
        q0 = run_delay_ms()
        t0 = time.perf_counter()
        eng.run_grads()
        t1 = time.perf_counter()
        comm.barrier()
        t2 = time.perf_counter()
        buf.reduce()
        t3 = time.perf_counter()
        eng.run_apply()
        t4 = time.perf_counter()
        runq.append(run_delay_ms() - q0)
        for k, v in zip(out, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            out[k].append(1e3 * v)
    return out, runq


def worker(args) -> None:
    """One rank of the N-rank run; rank 0 prints one JSON line (both ranks' numbers)."""
    from rlxc.distributed import cpu_set, init, shard
    from rlxc.optim import SGD

    comm = init()
    local = [(shard(x, comm), shard(y, comm)) for x, y in batches()]
    n = local[0][0].shape[0]
    tr = model(n).trainer(SGD(0.01), device="cpu", comm=comm)
    feeds = [{"x": x, "y": y} for x, y in local]
    per_step: dict = {}
    times = timed_steps(tr, feeds, args.warmup, args.steps, comm, per_step)
    ar = comm.allreduce_seconds / comm.allreduce_calls
    ph, ph_runq = phases(tr, feeds, args.steps, comm)
    med = statistics.median
    # steps in which no rank waited on the run queue (another process held its core)
    runqs = comm.allgather((per_step["runq"], ph_runq))
    calm = [all(r[0][i] < QUIET_MS for r in runqs) for i in range(len(times))]
    calm_ph = [all(r[1][i] < QUIET_MS for r in runqs) for i in range(len(ph_runq))]
    sums = [sum(v) for v in zip(*ph.values())]
    calm_t = [1e3 * t for t, c in zip(times, calm) if c]
    calm_r = [r for r, c in zip(per_step["reduce"], calm) if c]
    calm_s = [x for x, c in zip(sums, calm_ph) if c]
    mine = {"step_ms": 1e3 * med(times), "step_mean_ms": 1e3 * statistics.mean(times),
            "reduce_in_step_ms": 1e3 * ar,
            "phases_med": {k: med(v) for k, v in ph.items()},
            "phases_min": {k: min(v) for k, v in ph.items()},
            "phases_p20": {k: sorted(v)[len(v) // 5] for k, v in ph.items()},
            "cpus": sorted(cpu_set()), "threads": os.environ.get("RLXC_NUM_THREADS", ""),
            "phase_sum_ms": med(sums),
            "runq_ms": med(per_step["runq"]), "runq_mean_ms": statistics.mean(per_step["runq"]),
            "preempted_per_step": statistics.mean(per_step["preempted"]),
            "calm_steps": len(calm_t), "calm_phase_steps": len(calm_s),
            "calm_step_ms": med(calm_t) if calm_t else None,
            "calm_reduce_ms": med(calm_r) if calm_r else None,
            "calm_phase_sum_ms": med(calm_s) if calm_s else None,
            "calm_fraction": med([r / t for r, t in zip(calm_r, calm_t)]) if calm_t else None}
    # transport share, step by step: reduce / (grads + reduce + apply), the wait left out
    mine["transport_fraction"] = med([r / (g + r + a) for g, r, a in
                                      zip(ph["grads"], ph["reduce"], ph["apply"])])
    mine["fraction"] = ar / statistics.mean(times)
    # the same from the quiet samples (the 20th percentile of each phase): on a shared
    # machine the median carries other processes' time slices, the quiet samples do not
    q = mine["phases_p20"]
    mine["quiet_fraction"] = q["reduce"] / (q["grads"] + q["reduce"] + q["apply"])
    every = comm.allgather(mine)
    if comm.rank == 0:
        print(json.dumps({"ranks": comm.size, "mode": tr._gbuf.kind, "rows_per_rank": n,
                          "buffer_floats": int(tr._gbuf.local.size), "per_rank": every}),
              flush=True)


def one_rank(args, threads: str) -> dict:
    """The fused single-process Trainer on the whole batch, in a fresh process
    (threads are read when the library loads)."""
    env = dict(os.environ, RLXC_NUM_THREADS=threads)
    cmd = [sys.executable, os.path.abspath(__file__), "--one", "--steps", str(args.steps),
           "--warmup", str(args.warmup)]
    p = subprocess.run(fifo(args) + cmd, env=env, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise RuntimeError(f"1-rank run failed:\n{p.stdout}{p.stderr}")
    return json.loads([ln for ln in p.stdout.splitlines() if ln.startswith("{")][-1])


def one_rank_here(args) -> None:
    from rlxc.optim import SGD

    tr = model(GLOBAL_BATCH).trainer(SGD(0.01), device="cpu")
    feeds = [{"x": x, "y": y} for x, y in batches()]
    t = timed_steps(tr, feeds, args.warmup, args.steps)
    print(json.dumps({"step_ms": 1e3 * statistics.median(t), "min_ms": 1e3 * min(t)}))


# Open MPI settings tried for the raw Allreduce of the step's buffer (--sweep)
SWEEP = {
    "default": [],
    "tuned ring": ["coll_tuned_use_dynamic_rules=1", "coll_tuned_allreduce_algorithm=4"],
    "tuned recursive doubling": ["coll_tuned_use_dynamic_rules=1",
                                 "coll_tuned_allreduce_algorithm=3"],
    "tuned rabenseifner": ["coll_tuned_use_dynamic_rules=1",
                           "coll_tuned_allreduce_algorithm=6"],
    "tuned segmented ring": ["coll_tuned_use_dynamic_rules=1",
                             "coll_tuned_allreduce_algorithm=5"],
    "han": ["coll_han_priority=100"],
    "coll/sm": ["coll_sm_priority=100"],
    "btl/sm without CMA": ["smsc=^cma"],
}


def raw_allreduce(args) -> None:
    """One rank: in-place MPI_Allreduce of a buffer the size of the step's, after a
    barrier, --steps times, in the memory AllreduceBuffer gives the step; rank 0
    prints median / p20 / min ms."""
    from mpi4py import MPI

    c = MPI.COMM_WORLD
    n = sum(SIZES[i] * SIZES[i + 1] + SIZES[i + 1] for i in range(len(SIZES) - 1)) + 1
    try:  # the memory of the step's buffer (huge pages where they are offered)
        from rlxc.reduce_buffer import huge_page_empty
        buf = huge_page_empty(n)
    except ImportError:
        buf = None
    if buf is None:
        buf = np.empty(n, np.float32)
    ts = []
    for i in range(args.steps + args.warmup):
        buf[:] = 1  # written just before, as the grads call writes it
        c.Barrier()
        t0 = time.perf_counter()
        c.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        if i >= args.warmup:
            ts.append(1e3 * (time.perf_counter() - t0))
    ts = sorted(ts)
    if c.rank == 0:
        print(json.dumps({"median": statistics.median(ts), "p20": ts[len(ts) // 5],
                          "min": ts[0]}), flush=True)


def sweep(args) -> int:
    print(f"raw in-place MPI_Allreduce of the W4 buffer, {args.ranks} ranks, "
          f"{args.steps} calls; load before {os.getloadavg()[0]:.2f}")
    for name, mca in SWEEP.items():
        args.mca = mca
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        p = subprocess.run(mpiexec_line(args) + [sys.executable, os.path.abspath(__file__),
                                                 "--raw", "--steps", str(args.steps)],
                           env=env, capture_output=True, text=True, timeout=600)
        line = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        if p.returncode or not line:
            print(f"  {name:26s} failed (exit {p.returncode})")
            continue
        r = json.loads(line[-1])
        print(f"  {name:26s} median {r['median']:.3f}  p20 {r['p20']:.3f}  "
              f"min {r['min']:.3f} ms   ({' '.join(mca) or 'no MCA parameters'})")
    print(f"load after {os.getloadavg()[0]:.2f}")
    return 0


def fifo(args) -> list:
    """The command prefix of a measured process: `chrt -f 1` with --fifo."""
    return ["chrt", "-f", "1"] if getattr(args, "fifo", False) else []


def mpiexec_line(args) -> list:
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    cmd = [mpiexec, "-n", str(args.ranks)]
    cmd += ["--bind-to", "core"] if args.bind == "core" else ["--bind-to", "none",
                                                                "--oversubscribe"]
    for kv in args.mca:
        k, _, v = kv.partition("=")
        cmd += ["--mca", k, v]
    return cmd


def run_ranks(args, mode: str) -> dict:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               RLXC_DDP_REDUCE=mode)
    if mode == "default":
        del env["RLXC_DDP_REDUCE"]
    if args.threads == "auto":  # rlxc.distributed.init() chooses
        env.pop("RLXC_NUM_THREADS", None)
        env.pop("OMP_NUM_THREADS", None)
    else:
        env["RLXC_NUM_THREADS"] = args.threads
    worker = [sys.executable, os.path.abspath(__file__), "--worker", "--steps",
              str(args.steps), "--warmup", str(args.warmup)]
    p = subprocess.run(mpiexec_line(args) + fifo(args) + worker,
                       env=env, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise RuntimeError(f"mpiexec ({mode}) failed:\n{p.stdout}{p.stderr}")
    return json.loads([ln for ln in p.stdout.splitlines() if ln.startswith("{")][-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", default="auto",
                    help="threads per rank: auto (rlxc.distributed.init decides) or N")
    ap.add_argument("--fifo", action="store_true",
                    help="run the measured processes under chrt -f 1 (as on quiet cores)")
    ap.add_argument("--bind", choices=("core", "none"), default="core",
                    help="mpiexec --bind-to core (one rank per core) or none")
    ap.add_argument("--mca", action="append", default=[], metavar="KEY=VALUE",
                    help="an Open MPI MCA parameter for the N-rank runs (repeatable)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--modes", default="default,shm")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--raw", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--sweep", action="store_true",
                    help="time the raw Allreduce under each Open MPI setting of SWEEP")
    args = ap.parse_args(argv)
    if args.raw:
        raw_allreduce(args)
        return 0
    if args.sweep:
        return sweep(args)
    if args.worker:
        worker(args)
        return 0
    if args.one:
        one_rank_here(args)
        return 0
    modes = [m for m in args.modes.split(",") if m]
    load0 = os.getloadavg()
    ones = {"1": [], "0": []}
    multi = {m: [] for m in modes}
    for _ in range(args.repeat):  # interleaved, so that load changes hit every variant
        for t in ones:
            ones[t].append(one_rank(args, t))
        for m in modes:
            multi[m].append(run_ranks(args, m))
    load1 = os.getloadavg()
    med = statistics.median
    print(f"MLP {'-'.join(map(str, SIZES))}, global batch {GLOBAL_BATCH}, SGD; medians over "
          f"{args.repeat} repeat(s) of {args.steps} steps")
    print(f"load average (1/5/15 min) before {'/'.join(f'{x:.2f}' for x in load0)}, after "
          f"{'/'.join(f'{x:.2f}' for x in load1)} on {os.cpu_count()} CPUs")
    print("N ranks: " + " ".join(mpiexec_line(args)[1:] + fifo(args)) + " python ... ; "
          "threads per rank: "
          + (args.threads if args.threads != "auto" else "auto (rlxc.distributed.init)"))
    for t, label in (("1", "1 thread"), ("0", "all cores")):
        rs = ones[t]
        print(f"  1 rank, {label:9s} (fused Trainer, batch {GLOBAL_BATCH}): "
              f"{med([r['step_ms'] for r in rs]):8.3f} ms/step  (fastest "
              f"{min(r['min_ms'] for r in rs):.3f})")
    one = med([r["step_ms"] for r in ones["0"]])
    for m in modes:
        rs = multi[m]
        r0 = rs[-1]
        step = med([r["per_rank"][0]["step_ms"] for r in rs])
        label = f"{m} = {r0['mode']}" if m == "default" else m
        print(f"  {r0['ranks']} ranks, reduce={label} ({r0['rows_per_rank']} rows each, "
              f"{r0['buffer_floats']} floats): {step:8.3f} ms/step = {one / step:.2f}x "
              f"the 1-rank all-cores speed")
        for k, pr in enumerate(r0["per_rank"]):
            print(f"      rank {k}: cpus {pr['cpus']}, RLXC_NUM_THREADS={pr['threads'] or '-'}")
        for k in range(r0["ranks"]):
            pm = {p: med([r["per_rank"][k]["phases_med"][p] for r in rs]) for p in
                  r0["per_rank"][k]["phases_med"]}
            pq = {p: med([r["per_rank"][k]["phases_p20"][p] for r in rs]) for p in pm}
            pn = {p: min(r["per_rank"][k]["phases_min"][p] for r in rs) for p in pm}
            print(f"      rank {k} phases, median / 20th percentile / fastest ms: " + ", ".join(
                f"{p} {pm[p]:.3f} / {pq[p]:.3f} / {pn[p]:.3f}" for p in pm))
        fr = [r["per_rank"][0] for r in rs]

        def med_of(key, prs):  # the median over the repeats that have the value
            vals = [p[key] for p in prs if p[key] is not None]
            return med(vals) if vals else None

        def fmt(v, spec=".3f"):
            return "-" if v is None else format(v, spec)

        for k in range(r0["ranks"]):
            pr = [r["per_rank"][k] for r in rs]
            print(f"      rank {k} where the step goes: whole step {med_of('step_ms', pr):.3f}"
                  f" ms, per-step sum of the split phases {med_of('phase_sum_ms', pr):.3f} ms;"
                  f" run-queue delay (runnable, its core held by another process) "
                  f"{med_of('runq_ms', pr):.3f} ms median, {med_of('runq_mean_ms', pr):.3f} ms "
                  f"mean per step, {med_of('preempted_per_step', pr):.2f} preemptions per step")
        calm = [r["per_rank"][0] for r in rs]
        frac = med_of("calm_fraction", calm)
        print("      undisturbed steps (no rank waited on the run queue): "
              + ", ".join(f"{c['calm_steps']}/{args.steps}" for c in calm)
              + f" whole, {', '.join(str(c['calm_phase_steps']) for c in calm)} split; "
              f"their whole step {fmt(med_of('calm_step_ms', calm))} ms, the reduction in it "
              f"{fmt(med_of('calm_reduce_ms', calm))} ms = "
              f"{fmt(None if frac is None else 100 * frac, '.1f')}% of the step; split "
              f"phases summed {fmt(med_of('calm_phase_sum_ms', calm))} ms")
        print(f"      reduction in the step (incl. the wait for the slower rank): "
              f"{med([f['reduce_in_step_ms'] for f in fr]):.3f} ms = "
              f"{100 * med([f['fraction'] for f in fr]):.1f}% of the step")
        print(f"      transport alone (reduce after a barrier / (grads + reduce + apply)), "
              f"median per step: rank 0 {100 * med([f['transport_fraction'] for f in fr]):.1f}%"
              f", rank 1 "
              f"{100 * med([r['per_rank'][1]['transport_fraction'] for r in rs]):.1f}% "
              "(repeats: " + ", ".join("%.1f%%" % (100 * f["transport_fraction"]) for f in fr) + ")")
        print(f"      transport alone, quiet samples (20th percentiles): "
              f"{100 * med([f['quiet_fraction'] for f in fr]):.1f}% (repeats: "
              + ", ".join("%.1f%%" % (100 * f["quiet_fraction"]) for f in fr) + ")")
        best = []  # per repeat: the fastest reduce over the fastest whole compute
        for r in rs:
            f = r["per_rank"][0]["phases_min"]
            best.append(f["reduce"] / (f["grads"] + f["reduce"] + f["apply"]))
        print(f"      => uncontended share (fastest reduce / (fastest grads + it + fastest "
              f"apply)), rank 0: {100 * med(best):.1f}% (repeats: "
              + ", ".join("%.1f%%" % (100 * b) for b in best) + ")")
    print("  target (issue 18): reduction < 10% of the step")
    return 0


if __name__ == "__main__":
    sys.exit(main())

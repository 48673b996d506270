"""The "slow process" mode of one-thread timings: a reproducer with the evidence for its cause.

Run:  .venv/bin/python benchmarks/bench_slowmode.py [--procs 20] [--calls 2000]
      [--workloads cnn_dyn,cnn_static,w3] [--cpu 0]
      .venv/bin/python benchmarks/bench_slowmode.py --other-cpu-test 1   (spinner on CPU 1
      vs none, in alternating 0.5 s windows: is the busy sibling the guest's own vCPU?)

Symptom: the same compiled library, in fresh processes on one thread, took ~100 us per call
(the ONNX CNN at batch 64) in most processes and 150-185 us in some, for all the calls of
that process.  This script starts `--procs` fresh processes per workload (interleaved), each
pinned to `--cpu`, and in each one:
  - builds the workload (the compile is cached in RLXC_CACHE_DIR after the first),
    1 thread: cnn_dyn = from_onnx(cnn.onnx).jit() (dynamic batch, as bench_onnx.py),
    cnn_static = the same with input_shapes={"x": (64, 1, 8, 8)}, w3 = compare.py's W3
    (784-512-512-10 forward + loss, batch 128);
  - times `--calls` calls with time.thread_time in segments, with a core-state probe
    (benchmarks/corestate.py: issue bandwidth in adds/cycle, the clock from a multiply
    chain) before and after each segment: a segment counts as "unshared" or "shared" when
    both probes agree;
  - reports the facts an address-dependent cause would show: the workspace, input and
    output addresses mod 4096 and mod 2 MiB, whether the workspace lies on huge pages
    (/proc/self/smaps AnonHugePages), and MXCSR (FTZ/DAZ bits, and the sticky denormal flag
    after clearing the flags before the timed calls).
Per process it prints the median of all calls ("raw"), the medians in the unshared and the
shared state, and the shared fraction; the summary gives the spread of each.

Finding (2026-12-02, 2-vCPU KVM Sapphire Rapids, AVX-512; no HW perf counters in the VM):
the raw per-process medians are bimodal, the unshared-state medians are not (every process
runs at ~100 us while its core is unshared, whatever its addresses), and the mode flips
inside one process in time, not with where its buffers lie (moving the workspace or the
input over 12 offsets mod 4096 in one process selects nothing).  No denormal flag is raised
during the calls and DAZ/FTZ do not remove the slow mode.  In the slow stretches the
probe's independent adds drop from ~5.2 to ~2.5-2.9 per cycle at an unchanged ~3 GHz: a
busy SMT sibling on the host core.  It is not the guest's own other vCPU: with a spinner
pinned there the core is shared 42% of the time, without it 39% (--other-cpu-test), and a
one-thread rlxc process has no other running thread.  So the cause is outside the guest.  Every workload and peer slows there (CNN rlxc ~1.5x, onnxruntime ~1.4x, W3 rlxc
and NumPy ~1.3x), so compare peers only inside one state: interleave, and print the
core state (corestate.describe) with the numbers.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, HERE)

import corestate  # noqa: E402

WORKLOADS = ("cnn_dyn", "cnn_static", "w3")


def _build(name: str):
    """(call, input array, jitted) of workload `name`, one thread."""
    import numpy as np
    import rlxc

    if name in ("cnn_dyn", "cnn_static"):
        path = os.path.join(ROOT, "tests", "fixtures", "onnx", "cnn.onnx")
        x = np.random.default_rng(0).normal(size=(64, 1, 8, 8)).astype(np.float32)
        opts = {"input_shapes": {"x": x.shape}} if name == "cnn_static" else {}
        j = rlxc.from_onnx(path, **opts).jit()
        j.set_num_threads(1)
        return (lambda: j.run(x=x)), x, j
    if name == "w3":
        import compare

        P = compare.init_params()
        xb, yb = compare.batch()
        j = compare.rlxc_mlp("w3_mlp_loss", compare.BATCH).with_params(P).jit()
        j.set_num_threads(1)
        return (lambda: j.run(xb, yb)), xb, j
    raise ValueError(f"workload {name!r} is not one of {WORKLOADS}")


def _workspace(j):
    """The ndarray of this thread's workspace of Jitted/SizedJitted `j`, or None."""
    one = getattr(j, "_one", None)
    if one is not None:   # size-generic library: runtime/dyncpu.py DynExecutor
        return getattr(one._local, "ws", None)
    caller = getattr(j, "_caller", None)   # static library: runtime/cpu.py CpuCaller
    st = getattr(getattr(caller, "_local", None), "st", None)
    return getattr(st, "ws", None)


def _smaps(addr: int) -> dict:
    """The /proc/self/smaps entry holding `addr`: its name, AnonHugePages, THPeligible."""
    found, cur = {}, None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and not head[0].endswith(":"):   # a mapping's header: lo-hi perms ...
                lo, hi = (int(v, 16) for v in head[0].split("-"))
                cur = None
                if lo <= addr < hi:
                    cur = found = {"name": head[5] if len(head) > 5 else "[anon]"}
            elif cur is not None and head[0] in ("AnonHugePages:", "THPeligible:"):
                cur[head[0][:-1]] = int(head[1])
    return found


def worker(name: str, calls: int, full: float | None, cpu: int) -> dict:
    os.sched_setaffinity(0, {cpu})
    call, x, j = _build(name)
    for _ in range(50):
        outs = call()
    seg = 100 if name.startswith("cnn") else 25
    states = {"unshared": [], "shared": []}
    raw = []
    corestate.clear_flags()
    for _ in range(max(1, calls // seg)):
        a = corestate.sample(10000, 3)
        ts = []
        for _ in range(seg):
            t = time.thread_time_ns()
            outs = call()
            ts.append(time.thread_time_ns() - t)
        b = corestate.sample(10000, 3)
        raw += ts
        sa, sb = (corestate.classify(s.adds_per_cycle, full) for s in (a, b))
        if sa == sb:
            states[sa] += ts
    mx = corestate.mxcsr()
    ws = _workspace(j)
    wsa = ws.__array_interface__["data"][0] if ws is not None else 0
    xa = x.__array_interface__["data"][0]
    oa = outs[0].__array_interface__["data"][0]
    med = {k: (statistics.median(v) / 1e3 if v else None) for k, v in states.items()}
    return {"workload": name, "pid": os.getpid(), "raw_us": statistics.median(raw) / 1e3,
            "unshared_us": med["unshared"], "shared_us": med["shared"],
            "shared_frac": len(states["shared"]) / len(raw),
            "ws_mod4k": wsa % 4096, "ws_mod2m": wsa % (1 << 21), "ws_bytes": ws.size if ws is not None else 0,
            "ws_map": _smaps(wsa) if wsa else {}, "x_mod4k": xa % 4096, "out_mod4k": oa % 4096,
            "mxcsr": mx, "denormal_flag": bool(mx & 0x2), "ftz_daz": bool(mx & 0x8040)}


def other_cpu_test(cpu: int, other: int, rounds: int, full: float | None) -> None:
    """Is the sibling the guest's own other vCPU?  Alternate 0.5 s windows with a spinner
    (the probe's add loop) pinned on `other`, and none; in each, the fraction of probes on
    `cpu` (this process) that are shared, and `other`'s busy fraction from /proc/stat."""
    def busy():
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith(f"cpu{other} "):
                    v = [int(t) for t in line.split()[1:]]
                    return sum(v) - v[3] - v[4], sum(v)
        raise ValueError(f"no cpu{other} in /proc/stat")
    spin = (f"import os,sys,time; sys.path.insert(0, {HERE!r}); import corestate as c; "
            f"os.sched_setaffinity(0, {{{other}}}); lib = c._load(); e = time.monotonic() + 0.6\n"
            "while time.monotonic() < e: lib.corestate_adds(100000)")
    res = {"spinner": [], "none": []}
    for _ in range(rounds):
        for kind in res:
            p = subprocess.Popen([sys.executable, "-c", spin]) if kind == "spinner" else None
            time.sleep(0.08)
            a, n, sh, end = busy(), 0, 0, time.monotonic() + 0.5
            while time.monotonic() < end:
                n += 1
                sh += corestate.classify(corestate.sample(5000, 3).adds_per_cycle, full) == "shared"
            b = busy()
            if p is not None:
                p.wait()
            res[kind].append((sh / n, (b[0] - a[0]) / max(1, b[1] - a[1])))
    for kind, v in res.items():
        fr = [f for f, _ in v]
        print(f"cpu{other} {kind:8}: cpu{cpu} shared fraction mean {statistics.mean(fr):.2f}; "
              f"windows mostly unshared (< 0.2) {sum(f < 0.2 for f in fr)}/{len(fr)}, mostly "
              f"shared (> 0.8) {sum(f > 0.8 for f in fr)}/{len(fr)}; cpu{other} busy "
              f"{statistics.mean([b for _, b in v]):.2f}")


def _uptime() -> str:
    with open("/proc/loadavg") as f:
        return "load " + " ".join(f.read().split()[:3])


def _spread(v: list) -> str:
    v = sorted(x for x in v if x is not None)
    if not v:
        return "-"
    q = statistics.quantiles(v, n=4, method="inclusive") if len(v) > 1 else [v[0]] * 3
    return f"min {v[0]:7.1f}  q1 {q[0]:7.1f}  med {q[1]:7.1f}  q3 {q[2]:7.1f}  max {v[-1]:7.1f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=20)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--workloads", default="cnn_dyn")
    ap.add_argument("--cpu", type=int, default=0)
    ap.add_argument("--other-cpu-test", type=int, metavar="CPU", default=None,
                    help="instead: spinner on CPU vs none, 20 rounds (is it our own vCPU?)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--full", type=float, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(worker(args.worker, args.calls, args.full, args.cpu)),
              flush=True)
        return 0
    why = corestate.unavailable()
    if why:
        print(f"bench_slowmode: {why}")
        return 1
    names = args.workloads.split(",")
    for n in names:
        if n not in WORKLOADS:
            ap.error(f"--workloads: {n!r} is not one of {WORKLOADS}")
    os.sched_setaffinity(0, {args.cpu})
    _, best, ghz = corestate.survey(1.0)
    full = best if corestate.classify(best) == "unshared" else None
    print(f"{_uptime()}; cpu {args.cpu}; reference {best:.2f} adds/cycle at {ghz:.2f} GHz "
          f"(shared below {corestate.SHARED_RATIO * full if full else corestate.SHARED_APC:.2f})",
          flush=True)
    if args.other_cpu_test is not None:
        other_cpu_test(args.cpu, args.other_cpu_test, 20, full)
        print(_uptime())
        return 0
    env = dict(os.environ, RLXC_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    res = {n: [] for n in names}
    print(f"{'workload':<11}{'raw us':>8}{'unshared':>9}{'shared':>8}{'sh%':>5}"
          f"{'ws%4k':>7}{'ws%2M':>9}{'x%4k':>6}{'out%4k':>7}{'ws THP kB':>10}{'DE':>4}")
    for _ in range(args.procs):
        for n in names:
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", n, "--calls",
                   str(args.calls), "--cpu", str(args.cpu)] + \
                  (["--full", str(full)] if full else [])
            out = subprocess.run(cmd, env=env, capture_output=True, text=True)
            line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if line is None:
                print(f"{n}: worker failed:\n{out.stderr[-2000:]}")
                return 1
            d = json.loads(line[7:])
            res[n].append(d)
            f = lambda v: f"{v:8.1f}" if v is not None else "       -"  # noqa: E731
            print(f"{n:<11}{d['raw_us']:8.1f}{f(d['unshared_us']):>9}{f(d['shared_us'])}"
                  f"{100 * d['shared_frac']:5.0f}{d['ws_mod4k']:7d}{d['ws_mod2m']:9d}"
                  f"{d['x_mod4k']:6d}{d['out_mod4k']:7d}"
                  f"{d['ws_map'].get('AnonHugePages', 0):10d}{'y' if d['denormal_flag'] else 'n':>4}",
                  flush=True)
    print(_uptime())
    for n, rs in res.items():
        print(f"{n}: per-process medians over {len(rs)} processes (us per call)")
        print(f"  raw       {_spread([d['raw_us'] for d in rs])}")
        print(f"  unshared  {_spread([d['unshared_us'] for d in rs])}")
        print(f"  shared    {_spread([d['shared_us'] for d in rs])}")
        lo = min(d["raw_us"] for d in rs)
        slow = [d for d in rs if d["raw_us"] > 1.25 * lo]
        print(f"  {len(slow)} slow processes (raw > 1.25 x the fastest); their mean shared "
              f"fraction {statistics.mean([d['shared_frac'] for d in slow]) if slow else 0:.2f}, "
              f"the others' {statistics.mean([d['shared_frac'] for d in rs if d not in slow]) if len(slow) < len(rs) else 0:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""rlxc sgemm vs NumPy's BLAS, side by side, at 1 and 2 threads.

Run:  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/bench_sgemm.py

Each thread count runs in its own subprocess with OPENBLAS_NUM_THREADS /
OMP_NUM_THREADS set (plus threadpoolctl when installed) and
rlxc_set_num_threads(t).  Inside it, the two implementations alternate in
blocks of a few calls, with a pause between blocks so that the other
library's spinning worker threads (OpenBLAS spins ~0.1 s after a call,
libgomp a little) have gone to sleep; so machine noise hits both alike.
Prints median and best time as GFLOP/s over >= 20 timed calls after
warm-up, and the ratio rlxc/NumPy; for one thread also the median by the
calling thread's CPU time, which other processes on a shared machine
disturb much less than wall time.

Options: --n 1024 (or --mnk M,N,K), --threads 1,2, --runs 20, --cpu native,
--set kc=384 --set mc=280 (SgemmConfig overrides, for tuning), --ta/--tb
(transposed operands through the strides), --reps R (R calls per timed run;
rlxc loops in native code, NumPy in Python, so that small sizes measure the
kernel rather than ctypes' conversion of 14 arguments).

A/B of two configurations on a chain of shapes (--chain, e.g. W3's layers
128x512x784,128x512x512,128x10x512, each with its own operands, so the
weights are not all in L2 as in a repeated single call): --ab kc=192 builds
a second sgemm with those overrides (on top of --set), each further --ab one
more (C, D, ...), and they run round robin in one process (the order rotating
every run); prints each one's median and best time per chain (thread CPU time
at 1 thread, wall time otherwise) and its ratio to A.
On a shared machine this in-process alternation is what resolves a few
percent.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def _blas_info() -> str:
    try:
        from threadpoolctl import threadpool_info
        infos = [i for i in threadpool_info() if i.get("user_api") == "blas"]
        if infos:
            i = infos[0]
            return (f"{i.get('internal_api')} {i.get('version')} "
                    f"({i.get('architecture')}, {i.get('threading_layer')})")
    except Exception:
        pass
    import numpy as np
    try:
        cfg = np.show_config(mode="dicts")
        blas = cfg["Build Dependencies"]["blas"]
        return f"{blas.get('name')} {blas.get('version')}"
    except Exception:
        return "unknown"


def _parse_overrides(items):
    out = {}
    for it in items or ():
        k, v = it.split("=", 1)
        out[k] = v.lower() in ("1", "true", "yes") if v.lower() in (
            "true", "false", "yes", "no") else int(v)
    return out


def _build(cfg, cpu, workdir):
    import llvmlite.ir as ir
    from rlxc.lowering.cpu import target
    from rlxc.lowering.cpu import sgemm_kernels as sgemm
    from rlxc.lowering.cpu import openmp as parallel
    m = target.ir_module("bench_sgemm")
    fn = sgemm.emit_sgemm(m, "rlxc_sgemm", config=cfg)
    parallel.thread_control(m)
    # rlxc_sgemm_rep(reps, <sgemm args>): call it reps times from native code,
    # so tiny sizes are not timed as ctypes' argument conversion
    i64 = ir.IntType(64)
    rep = ir.Function(m, ir.FunctionType(ir.VoidType(), [i64, *fn.function_type.args]),
                      "rlxc_sgemm_rep")
    b = ir.IRBuilder(rep.append_basic_block("entry"))
    head, body, done = (rep.append_basic_block(n) for n in ("head", "body", "done"))
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(i64)
    i.add_incoming(ir.Constant(i64, 0), rep.entry_basic_block)
    b.cbranch(b.icmp_signed("<", i, rep.args[0]), body, done)
    b.position_at_end(body)
    b.call(fn, list(rep.args[1:]))
    i.add_incoming(b.add(i, ir.Constant(i64, 1)), body)
    b.branch(head)
    b.position_at_end(done)
    b.ret_void()
    t0 = time.perf_counter()
    obj = target.emit_object(target.compile_ir(m, cpu=cpu), cpu=cpu)
    t_compile = time.perf_counter() - t0
    path = target.link_shared([obj], os.path.join(workdir, "libbench_sgemm.so"))
    return ctypes.CDLL(path), t_compile


def worker(args) -> dict:
    import numpy as np
    from rlxc.lowering.cpu import sgemm_kernels as sgemm
    M, N, K = args.mnk
    t = args.threads_one
    try:
        from threadpoolctl import threadpool_limits
        limiter = threadpool_limits(t)
    except ImportError:  # env vars set by the parent already apply
        limiter = None
    cfg = sgemm.sgemm_config(args.cpu, **_parse_overrides(args.set))
    with tempfile.TemporaryDirectory(prefix="rlxc-bench-") as wd:
        lib, t_compile = _build(cfg, args.cpu, wd)
        lib.rlxc_set_num_threads(t)
        f = lib.rlxc_sgemm_rep
        P, L = ctypes.c_void_p, ctypes.c_int64
        f.argtypes = [L, L, L, L, P, L, L, P, L, L, P, L, ctypes.c_int32, P, L]
        f.restype = None
        reps = args.reps
        rng = np.random.default_rng(0)
        A = rng.standard_normal((K, M) if args.ta else (M, K), dtype=np.float32)
        B = rng.standard_normal((N, K) if args.tb else (K, N), dtype=np.float32)
        An = A.T if args.ta else A
        Bn = B.T if args.tb else B
        rsa, csa = (1, M) if args.ta else (K, 1)
        rsb, csb = (1, K) if args.tb else (N, 1)
        C = np.zeros((M, N), np.float32)
        Cn = np.zeros((M, N), np.float32)
        ws = np.empty(sgemm.sgemm_workspace_floats(M, N, K, t, config=cfg), np.float32)
        argv = (reps, M, N, K, A.ctypes.data, rsa, csa, B.ctypes.data, rsb, csb, C.ctypes.data, N, 0,
                ws.ctypes.data, ws.size)

        def run_rlxc():
            f(*argv)

        def run_np():
            for _ in range(reps):
                np.matmul(An, Bn, out=Cn)

        for _ in range(3):
            run_rlxc()
            run_np()
        ref = An.astype(np.float64) @ Bn.astype(np.float64)
        err = float(np.abs(C - ref).max() / np.abs(ref).max())
        times = {"rlxc": [], "numpy": []}
        cpu_times = {"rlxc": [], "numpy": []}
        block = 5
        while len(times["rlxc"]) < args.runs:
            for name, fn in (("rlxc", run_rlxc), ("numpy", run_np)):
                time.sleep(args.pause)
                fn()  # one untimed call after the pause wakes the thread team
                for _ in range(block):
                    c0 = time.thread_time()
                    t0 = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - t0)
                    cpu_times[name].append(time.thread_time() - c0)
        if limiter is not None:
            limiter.restore_original_limits()
    flop = 2.0 * M * N * K * reps
    res = {"reps": reps, "threads": t, "mnk": [M, N, K], "compile_s": t_compile, "max_rel_err": err,
           "config": dataclasses.asdict(cfg), "blas": _blas_info()}
    for name, ts in times.items():
        res[name] = {"median_gflops": flop / statistics.median(ts) / 1e9,
                     "best_gflops": flop / min(ts) / 1e9, "runs": len(ts)}
        if t == 1:  # CPU time of the calling thread: what it cost, even on a busy machine
            res[name]["cpu_median_gflops"] = flop / statistics.median(cpu_times[name]) / 1e9
    return res


def chain_ab(args, threads: int) -> None:
    """--chain/--ab: A (--set) and B, C, ... (--set + each --ab) on the chain, round robin
    (the order rotates every run, so that no build always follows the same one)."""
    import numpy as np
    from rlxc.lowering.cpu import sgemm_kernels as sgemm
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.chain.split(",")]
    over_a = _parse_overrides(args.set)
    tags = "BCDEFGHIJ"
    others = [(tags[i], {**over_a, **_parse_overrides(ab.split(","))})
              for i, ab in enumerate((args.ab or [])[:len(tags)])] or [("B", dict(over_a))]
    rng = np.random.default_rng(0)
    runs = []
    with tempfile.TemporaryDirectory(prefix="rlxc-bench-") as wd:
        for tag, ov in (("A", over_a), *others):
            cfg = sgemm.sgemm_config(args.cpu, **ov)
            os.makedirs(os.path.join(wd, tag))
            lib, _ = _build(cfg, args.cpu, os.path.join(wd, tag))
            lib.rlxc_set_num_threads(threads)
            f = lib.rlxc_sgemm_rep
            P, L = ctypes.c_void_p, ctypes.c_int64
            f.argtypes = [L, L, L, L, P, L, L, P, L, L, P, L, ctypes.c_int32, P, L]
            f.restype = None
            calls = []
            for M, N, K in shapes:
                A = rng.standard_normal((M, K), dtype=np.float32)
                B = rng.standard_normal((K, N), dtype=np.float32)
                C = np.zeros((M, N), np.float32)
                ws = np.empty(sgemm.sgemm_workspace_floats(M, N, K, threads, config=cfg),
                              np.float32)
                calls.append(((1, M, N, K, A.ctypes.data, K, 1, B.ctypes.data, N, 1,
                               C.ctypes.data, N, 0, ws.ctypes.data, ws.size), (A, B, C, ws)))
            for argv, (A, B, C, _) in calls:   # check every shape once
                f(*argv)
                ref = A.astype(np.float64) @ B
                err = float(np.abs(C - ref).max() / max(np.abs(ref).max(), 1e-30))
                if err > 1e-4:
                    sys.exit(f"chain {tag}: {argv[1:4]} max rel err {err:.1e}")
            runs.append((tag, ov, f, calls, []))
        for r in range(args.runs):
            for tag, ov, f, calls, ts in runs[r % len(runs):] + runs[:r % len(runs)]:
                t0, c0 = time.perf_counter(), time.thread_time()
                for argv, _ in calls:
                    f(*argv)
                ts.append(time.thread_time() - c0 if threads == 1 else time.perf_counter() - t0)
    flop = sum(2.0 * M * N * K for M, N, K in shapes)
    print(f"chain {args.chain} on {threads} thread(s), {args.cpu}, {args.runs} runs "
          f"({'thread CPU' if threads == 1 else 'wall'} time)")
    for tag, ov, _, _, ts in runs:
        print(f"  {tag} {ov or 'defaults'}: median {statistics.median(ts) * 1e6:.0f} us, best "
              f"{min(ts) * 1e6:.0f} us ({flop / min(ts) / 1e9:.1f} GFLOP/s)")
    a = runs[0][4]
    for tag, _, _, _, b in runs[1:]:
        print(f"  {tag}/A: median {statistics.median(b) / statistics.median(a):.3f}, best "
              f"{min(b) / min(a):.3f}   (load {os.getloadavg()[0]:.1f})")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--mnk", type=lambda s: [int(x) for x in s.split(",")], default=None)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--pause", type=float, default=0.25)
    ap.add_argument("--cpu", default="native")
    ap.add_argument("--set", action="append", help="SgemmConfig override, e.g. kc=384")
    ap.add_argument("--reps", type=int, default=1,
                    help="calls per timed run (rlxc loops in native code, NumPy in Python)")
    ap.add_argument("--ta", action="store_true")
    ap.add_argument("--tb", action="store_true")
    ap.add_argument("--chain", default=None,
                    help="MxNxK,... shapes run back to back (A/B mode with --ab)")
    ap.add_argument("--ab", action="append",
                    help="B's overrides, e.g. kc=192,direct_a=0; again for C, D, ...")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--threads-one", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.mnk = args.mnk or [args.n] * 3
    args.runs = max(args.runs, 20) if not args.worker else args.runs
    if args.chain:
        for t in [int(x) for x in args.threads.split(",")]:
            chain_ab(args, t)
        return
    if args.worker:
        print(json.dumps(worker(args)))
        return
    rows = []
    for t in [int(x) for x in args.threads.split(",")]:
        env = dict(os.environ, OPENBLAS_NUM_THREADS=str(t), OMP_NUM_THREADS=str(t),
                   MKL_NUM_THREADS=str(t))
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--threads-one", str(t),
               "--mnk", ",".join(map(str, args.mnk)), "--runs", str(args.runs),
               "--pause", str(args.pause), "--cpu", args.cpu, "--reps", str(args.reps)]
        for s in args.set or ():
            cmd += ["--set", s]
        cmd += (["--ta"] if args.ta else []) + (["--tb"] if args.tb else [])
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"worker failed:\n{out.stderr}")
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    r0 = rows[0]
    cfg = r0["config"]
    M, N, K = r0["mnk"]
    print(f"sgemm {M}x{N}x{K}{' A^T' if args.ta else ''}{' B^T' if args.tb else ''}"
          f"  NumPy BLAS: {r0['blas']}")
    print(f"rlxc config: {cfg['isa']} {cfg['mr']}x{cfg['nr']} kc={cfg['kc']} mc={cfg['mc']} "
          f"nc={cfg['nc']} unroll={cfg['unroll']}  compile {r0['compile_s']:.2f}s  "
          f"max rel err {r0['max_rel_err']:.1e}")
    print(f"{'threads':>7} | {'rlxc median':>11} {'best':>7} | {'numpy median':>12} {'best':>7} |"
          f" {'ratio med':>9} {'best':>6}   (GFLOP/s, {r0['rlxc']['runs']} runs each"
          f"{f' of {args.reps} calls' if args.reps > 1 else ''})")
    for r in rows:
        a, n = r["rlxc"], r["numpy"]
        print(f"{r['threads']:>7} | {a['median_gflops']:>11.1f} {a['best_gflops']:>7.1f} |"
              f" {n['median_gflops']:>12.1f} {n['best_gflops']:>7.1f} |"
              f" {a['median_gflops'] / n['median_gflops']:>9.3f}"
              f" {a['best_gflops'] / n['best_gflops']:>6.3f}")
    for r in rows:
        a, n = r["rlxc"], r["numpy"]
        if "cpu_median_gflops" in a:
            print(f"{r['threads']} thread, by thread CPU time (robust to other load): rlxc "
                  f"{a['cpu_median_gflops']:.1f}  numpy {n['cpu_median_gflops']:.1f}  ratio "
                  f"{a['cpu_median_gflops'] / n['cpu_median_gflops']:.3f}")
    try:   # the ceiling of these figures (benchmarks/fma_peak.py), in this process
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import fma_peak
        peaks = {t: fma_peak.measure(args.cpu, t)[0] for t in sorted({r["threads"] for r in rows})}
        cells = []
        for r in rows:
            p = peaks[r["threads"]]
            cells.append(f"{r['threads']} thread(s) {p:.0f} GFLOP/s (rlxc median "
                         f"{r['rlxc']['median_gflops'] / p:.0%}, numpy "
                         f"{r['numpy']['median_gflops'] / p:.0%})")
        print("FMA peak at rlxc's width (median of 5): " + ", ".join(cells))
    except Exception as e:  # noqa: BLE001  (no cc: the ratios stand without it)
        print(f"FMA peak: not measured ({type(e).__name__}: {e})")
    load = os.getloadavg()[0]
    if load > 0.5:
        print(f"note: 1-min load average {load:.1f} on {os.cpu_count()} cores while measuring "
              "(other work running; wall times are noisy)")


if __name__ == "__main__":
    main()

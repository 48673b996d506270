"""Native CPU backend vs NumPy, side by side in one process.

Run:  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/bench_cpu.py

Benchmarks (each prints median and min over >= --runs timed calls after
warm-up, and the ratio NumPy time / rlxc time, > 1 meaning rlxc is faster):
  fused      sum(tanh(x*a+b) * sigmoid(x)) over 1M floats     (target >= 3x)
  sgemm      1024^3 at 1 and 2 threads vs NumPy's BLAS         (target >= 0.8x)
  mlp        784-512-512-10 forward, batch 128                 (target: faster)
  tiny       x + 1 on 3 floats through Jitted.run              (target <= 15 us/call)

The two sides alternate in blocks with a short pause in between, so that the
other library's spinning worker threads (OpenBLAS, libgomp) have gone to
sleep and machine noise hits both alike.  Thread counts: rlxc through
Jitted.set_num_threads, NumPy's BLAS through threadpoolctl when installed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from rlxc import Func  # noqa: E402


def blas_info() -> str:
    try:
        from threadpoolctl import threadpool_info

        for i in threadpool_info():
            if i.get("user_api") == "blas":
                return (f"{i.get('internal_api')} {i.get('version')} "
                        f"({i.get('architecture')}, {i.get('num_threads')} threads)")
    except Exception:  # noqa: BLE001
        pass
    try:
        cfg = np.show_config(mode="dicts")
        b = cfg["Build Dependencies"]["blas"]
        return f"{b.get('name')} {b.get('version')}"
    except Exception:  # noqa: BLE001
        return "unknown"


class BlasThreads:
    def __init__(self, n):
        self.n = n
        self.ctl = None

    def __enter__(self):
        try:
            from threadpoolctl import threadpool_limits

            self.ctl = threadpool_limits(limits=self.n, user_api="blas")
        except Exception:  # noqa: BLE001
            self.ctl = None
        return self

    def __exit__(self, *a):
        if self.ctl is not None:
            self.ctl.restore_original_limits()


def timeit(fn, runs, warm=3):
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return ts


def side_by_side(ours, theirs, runs, blocks=4):
    a, b = [], []
    per = max(5, -(-runs // blocks))
    for _ in range(blocks):
        a += timeit(ours, per)
        time.sleep(0.15)
        b += timeit(theirs, per)
        time.sleep(0.15)
    return a, b


def report(name, a, b, unit="ms", scale=1e3, extra=""):
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"{name:<28} rlxc median {ma * scale:9.3f} {unit} (min {min(a) * scale:9.3f})   "
          f"numpy median {mb * scale:9.3f} {unit} (min {min(b) * scale:9.3f})   "
          f"ratio numpy/rlxc {mb / ma:5.2f}x (min-based {min(b) / min(a):5.2f}x){extra}",
          flush=True)


def bench_fused(runs, threads):
    n = 1 << 20

    def build(s):
        x, a, b = s.input("x", (n,)), s.input("a", ()), s.input("b", ())
        return ((x * a + b).tanh() * x.sigmoid()).sum()

    j = Func("bench_fused", build).jit()
    j.set_num_threads(threads)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n).astype(np.float32)
    a, b = np.float32(0.7), np.float32(0.1)

    def ours():
        return j.run(x=x, a=a, b=b)

    def theirs():
        return np.sum(np.tanh(x * a + b) * (1 / (1 + np.exp(-x))))

    got, ref = float(ours()[0]), float(theirs())
    assert abs(got - ref) <= 1e-4 * np.abs(x).sum(), (got, ref)
    ra, rb = side_by_side(ours, theirs, runs)
    report(f"fused 1M ({threads} thr)", ra, rb)


def bench_sgemm(runs, threads, n=1024):
    j = Func("bench_sgemm", lambda s: s.input("a", (n, n)) @ s.input("b", (n, n))).jit()
    j.set_num_threads(threads)
    rng = np.random.default_rng(1)
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    with BlasThreads(threads):
        np.testing.assert_allclose(j.run(a=a, b=b)[0], a @ b, rtol=1e-3, atol=1e-3)
        ra, rb = side_by_side(lambda: j.run(a=a, b=b), lambda: a @ b, runs)
    gf = 2 * n ** 3 / 1e9
    report(f"sgemm {n}^3 ({threads} thr)", ra, rb,
           extra=f"   [{gf / statistics.median(ra):.0f} vs {gf / statistics.median(rb):.0f} "
                 "GFLOP/s]")


def bench_mlp(runs, threads, batch=128):
    sizes = [784, 512, 512, 10]

    def build(s):
        h = s.input("x", (batch, sizes[0]))
        for i, (p, q) in enumerate(zip(sizes[:-1], sizes[1:])):
            h = h @ s.param(f"w{i}", (p, q)) + s.param(f"b{i}", (q,))
            if i < len(sizes) - 2:
                h = h.relu()
        return h

    f = Func("bench_mlp", build).init_randn(0, 0.05)
    j = f.jit()
    j.set_num_threads(threads)
    ws = [f.param_binding(f"w{i}") for i in range(3)]
    bs = [f.param_binding(f"b{i}") for i in range(3)]
    x = np.random.default_rng(2).standard_normal((batch, 784)).astype(np.float32)

    def theirs():
        h = x
        for i in range(3):
            h = h @ ws[i] + bs[i]
            if i < 2:
                h = np.maximum(h, 0)
        return h

    with BlasThreads(threads):
        np.testing.assert_allclose(j.run(x=x)[0], theirs(), rtol=1e-3, atol=1e-4)
        ra, rb = side_by_side(lambda: j.run(x=x), theirs, runs)
    report(f"mlp 784-512-512-10 b{batch} ({threads} thr)", ra, rb)


def bench_tiny(runs):
    j = Func("bench_tiny", lambda s: s.input("x", (3,)) + 1.0).jit()
    x = np.ones(3, np.float32)
    inner = 2000

    def ours():
        for _ in range(inner):
            j.run(x=x)

    def theirs():
        for _ in range(inner):
            x + 1.0

    ra, rb = side_by_side(ours, theirs, runs)
    report("tiny x+1 (3 floats)", [t / inner for t in ra], [t / inner for t in rb],
           unit="us", scale=1e6,
           extra=f"   [target <= 15 us: {'ok' if statistics.median(ra) / inner <= 15e-6 else 'MISSED'}]")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=24)
    ap.add_argument("--only", default="fused,sgemm,mlp,tiny")
    args = ap.parse_args()
    if args.runs < 20:
        ap.error("--runs must be >= 20")
    cores = os.cpu_count()
    print(f"numpy {np.__version__}, BLAS: {blas_info()}; {cores} cores; "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE')}")
    only = set(args.only.split(","))
    if "fused" in only:
        for t in (1, 2):
            bench_fused(args.runs, t)
    if "sgemm" in only:
        for t in (1, 2):
            bench_sgemm(args.runs, t)
    if "mlp" in only:
        for t in (1, 2):
            bench_mlp(args.runs, t)
    if "tiny" in only:
        bench_tiny(args.runs)


if __name__ == "__main__":
    main()

"""Row ops (softmax, log_softmax, layer norm, argmax, centering) against NumPy, and the
row-fusion and row-local-temps passes against themselves off, in one process.

Run:  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/bench_rows.py
      [--rows 1024] [--cols 1024] [--threads 1,2] [--runs 30] [--only softmax,argmax]
      [--cpu native|x86-64-v3|znver3|...]  (the rlxc build's target; it must run here)

Each op is compiled three times from the same Func: with lowering/cpu/rowfuse.py and
rowlocal.py (the default), with row-local-temps off (the fused kernel's row temps in the
workspace: "no-local"), and with both off (the kernels as the schedule built them, one pass
over the tensor each: "unfused").  The builds and NumPy are timed round-robin, in an order
that alternates per repetition, each sample the mean of 2 calls after an untimed one.
Printed: medians (min), NumPy / rlxc (> 1: rlxc faster), rlxc / no-local and rlxc /
unfused (< 1: the passes help).  The rlxc builds must agree to a few ulps, and with NumPy
in float64 to 1e-4.  NumPy runs these ops on one thread whatever --threads says (no BLAS in
them).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def cases(R, C):
    def ln_np(a, g, b):
        mu = a.mean(1, keepdims=True)
        d = a - mu
        return d / np.sqrt((d * d).mean(1, keepdims=True) + 1e-5) * g + b

    def sm_np(a):
        e = np.exp(a - a.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)

    def lsm_np(a):
        z = a - a.max(1, keepdims=True)
        return z - np.log(np.exp(z).sum(1, keepdims=True))
    return {
        "softmax": (lambda s: s.input("a", (R, C)).softmax(1), sm_np, False),
        "log_softmax": (lambda s: s.input("a", (R, C)).log_softmax(1), lsm_np, False),
        "layer_norm": (lambda s: s.input("a", (R, C)).layer_norm(
            -1, 1e-5, weight=s.param("g", (C,)), bias=s.param("b", (C,))), ln_np, True),
        "argmax": (lambda s: s.input("a", (R, C)).argmax(1), lambda a: a.argmax(1), False),
        "center": (lambda s: (lambda x: x - x.mean(1, keepdims=True))(s.input("a", (R, C))),
                   lambda a: a - a.mean(1, keepdims=True), False),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--cols", type=int, default=1024)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--only", default="")
    ap.add_argument("--cpu", default="native")
    args = ap.parse_args(argv)
    os.environ.setdefault("RLXC_CACHE_DIR", tempfile.mkdtemp(prefix="rlxc-rows-"))
    import rlxc
    from rlxc.lowering.cpu import rowfuse, rowlocal
    from rlxc.registry import backend

    if args.cpu not in ("native", "host"):
        backend("cpu").default_cpu = args.cpu   # Func.jit compiles for the default

    R, C = args.rows, args.cols
    rng = np.random.default_rng(0)
    a = rng.standard_normal((R, C)).astype(np.float32)
    g = rng.standard_normal(C).astype(np.float32)
    b = rng.standard_normal(C).astype(np.float32)
    print(f"{R} x {C} float32, rlxc --cpu {args.cpu}, {time.strftime('%Y-%m-%d %H:%M')}, load "
          f"{os.getloadavg()[0]:.2f}; median (min) per call")
    print(f"{'op':12s} {'thr':>3s} {'rlxc':>18s} {'no-local':>18s} {'unfused':>18s} "
          f"{'numpy':>18s} {'numpy/rlxc':>10s} {'/no-local':>9s} {'/unfused':>8s}")
    only = [x for x in args.only.split(",") if x]
    orig, orig_local = rowfuse.fuse_rows, rowlocal.localize
    for name, (build, ref, params) in cases(R, C).items():
        if only and name not in only:
            continue
        js = []
        for fuse, local in ((True, True), (True, False), (False, False)):
            rowfuse.fuse_rows = orig if fuse else (lambda prog: prog)
            rowlocal.localize = orig_local if local else (lambda prog, plan=None: prog)
            try:
                f = rlxc.Func(f"rows_{name}_{int(fuse)}{int(local)}", build)
                js.append((f.with_params({"g": g, "b": b}) if params else f).jit())
            finally:
                rowfuse.fuse_rows, rowlocal.localize = orig, orig_local
        got = js[0].run(a=a)[0]
        # a few ulps apart at most: a per-row op in a short loop may take its scalar rule
        # where the unfused map took the vector one (rsqrt: both within its ulp bound)
        for j in js[1:]:
            np.testing.assert_allclose(got, j.run(a=a)[0], rtol=1e-6, atol=1e-6)
        a64 = a.astype(np.float64)   # the check in float64 (NumPy's float32 layer norm of
        want = ref(a64, g, b) if params else ref(a64)   # a near-constant row is off by 1e-3)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        for t in [int(x) for x in args.threads.split(",")]:
            for j in js:
                j.set_num_threads(t)
            calls = {"rlxc": lambda: js[0].run(a=a), "no-local": lambda: js[1].run(a=a),
                     "unfused": lambda: js[2].run(a=a),
                     "numpy": (lambda: ref(a, g, b)) if params else (lambda: ref(a))}
            ts = {k: [] for k in calls}
            for r in range(args.runs):
                order = list(calls) if r % 2 else list(calls)[::-1]
                for k in order:
                    calls[k]()
                    t0 = time.perf_counter()
                    calls[k]()
                    calls[k]()
                    ts[k].append((time.perf_counter() - t0) / 2)
            med = {k: statistics.median(v) for k, v in ts.items()}
            cell = {k: f"{med[k] * 1e6:8.1f} ({min(ts[k]) * 1e6:6.1f})" for k in ts}
            print(f"{name:12s} {t:3d} {cell['rlxc']:>18s} {cell['no-local']:>18s} "
                  f"{cell['unfused']:>18s} {cell['numpy']:>18s} "
                  f"{med['numpy'] / med['rlxc']:10.2f} {med['rlxc'] / med['no-local']:9.2f} "
                  f"{med['rlxc'] / med['unfused']:8.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

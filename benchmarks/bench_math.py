"""Elementwise math (lowering/shared/mathlib.py) through Jitted.run against PyTorch eager.

Run:  .venv/bin/python benchmarks/bench_math.py [--n 1048576] [--threads 1,2] [--runs 40]
      [--only gelu,gelu_grad,erf,exp,tanh,sigmoid,silu,sin,log] [--cpu native|x86-64-v3|...]

Cases (float32, n elements, standard normal times 2):
  gelu       exact GELU, 0.5 x (1 + erf(x / sqrt 2))     torch.nn.functional.gelu
  gelu_grad  d/dx sum(gelu(x)) (rlxc: Func.grad)          torch.autograd.grad
  erf        erf(x)                                       torch.erf
  exp, tanh, sigmoid, silu, sin, log (of |x| + 1e-3)      PyTorch's own
  (default: gelu, gelu_grad, erf)
rlxc's functions hold their error bounds over every float32 (mathlib's header: gelu 4 ulp,
erf 1.5); PyTorch's vectorized erf is an approximation with an absolute error bound.  Each
thread count runs in its own process (OMP_NUM_THREADS, torch.set_num_threads,
RLXC_NUM_THREADS); the two sides alternate per sample, each sample the median of 5 calls
after an untimed one.  Prints medians (min) and torch / rlxc (> 1: rlxc faster).  Without
PyTorch only rlxc's times are printed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

UNARY = ("gelu", "erf", "exp", "tanh", "sigmoid", "silu", "log", "sin")   # rlxc Tensor methods
CASES = UNARY[:1] + ("gelu_grad",) + UNARY[1:]
DEFAULT = "gelu,gelu_grad,erf"


def _rlxc(case: str, n: int):
    from rlxc import Func

    if case in UNARY:
        j = Func(f"bm_{case}", lambda s: getattr(s.input("x", (n,)), case)()).jit()
    else:
        j = Func("bm_gelu_sum", lambda s: s.input("x", (n,)).gelu().sum()).grad(["x"]).jit()
    return lambda x: j.run(x)[0]


def _torch(case: str):
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(int(os.environ["RLXC_NUM_THREADS"]))
    if case in UNARY:
        fn = {"gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu}.get(
            case) or getattr(torch, case)
        return lambda x: fn(torch.from_numpy(x)).numpy()

    def grad(x):
        t = torch.from_numpy(x).requires_grad_(True)
        (g,) = torch.autograd.grad(torch.nn.functional.gelu(t).sum(), t)
        return g.numpy()
    return grad


def _sample(fn, x) -> float:
    fn(x)
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        fn(x)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def child(args) -> None:
    x0 = (np.random.default_rng(0).standard_normal(args.n) * 2).astype(np.float32)
    for case in args.only.split(","):
        x = np.abs(x0) + np.float32(1e-3) if case == "log" else x0
        impls = {"rlxc": _rlxc(case, args.n)}
        peer = _torch(case)
        if peer is not None:
            impls["torch"] = peer
            got, want = impls["rlxc"](x), peer(x)
            # PyTorch's erf is good to ~1e-7 absolute: 1e-3 relative at gelu(-3.4)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        times = {k: [] for k in impls}
        for r in range(args.runs):
            for k in (list(impls) if r % 2 == 0 else list(impls)[::-1]):
                times[k].append(_sample(impls[k], x))
        med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
        line = f"  {case:10s} rlxc {med['rlxc']:9.1f} us ({min(times['rlxc']) * 1e6:.1f})"
        if "torch" in med:
            line += (f"   torch {med['torch']:9.1f} us ({min(times['torch']) * 1e6:.1f})"
                     f"   torch/rlxc {med['torch'] / med['rlxc']:.2f}")
        print(line, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1 << 20)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--only", default=DEFAULT, help=f"of {','.join(CASES)}")
    ap.add_argument("--cpu", default="native")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    bad = set(args.only.split(",")) - set(CASES)
    if bad:
        ap.error(f"unknown case(s) {sorted(bad)}; known: {', '.join(CASES)}")
    if args.child:
        if args.cpu != "native":
            from rlxc.registry import backend

            backend("cpu").default_cpu = args.cpu
        child(args)
        return
    print(f"n = {args.n}, float32, rlxc --cpu {args.cpu}, {args.runs} samples; "
          f"load {os.getloadavg()[0]:.1f}")
    for t in args.threads.split(","):
        print(f"{t} thread(s):", flush=True)
        env = {**os.environ, "RLXC_NUM_THREADS": t, "OMP_NUM_THREADS": t}
        subprocess.run([sys.executable, __file__, "--child", "--n", str(args.n), "--runs",
                        str(args.runs), "--only", args.only, "--cpu", args.cpu],
                       env=env, check=True)


if __name__ == "__main__":
    main()

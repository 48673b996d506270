"""Dynamic batch vs static batch: W3 and W4 of compare.py at batch 128, same run.

Run:  .venv/bin/python benchmarks/bench_dynamic.py [--runs 30] [--warmup 5]

Workloads (compare.py's MLP 784-512-512-10, ReLU, softmax cross-entropy):
  W3  forward + mean cross-entropy, `Func.jit().run`
  W4  training step with SGD(0.01), `Func.trainer(...).step`
each traced twice: with a static batch (128) and with a dynamic one ("B"),
then run at 128.  Timed runs alternate static and dynamic calls so that
machine load hits both alike; the report gives median and min ms and the
ratio static/dynamic (>= 0.9 is the target of issue 14).

It also times the first call at a new size (batch 96 and 200) of the dynamic
build.  On the host CPU the dynamic build is ONE library for every size
(lowering/cpu/dynsizes.py, rlxc/dynone.py): a new size compiles nothing, and the
report checks that no compile of either kind ran.  RLXC_ONE_LIBRARY=0 measures the
older path (one program per set of sizes, compiled or read from the disk cache).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import compare as C  # noqa: E402  (the workloads' definitions)


def _pair(run_static, run_dynamic, runs: int, warmup: int):
    for _ in range(warmup):
        run_static(), run_dynamic()
    ts, td = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        run_static()
        t1 = time.perf_counter()
        run_dynamic()
        t2 = time.perf_counter()
        ts.append(t1 - t0)
        td.append(t2 - t1)
    return ts, td


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    a = ap.parse_args(argv)
    from rlxc.backends import STATS
    from rlxc.optim import SGD

    P = C.init_params()
    x, y = C.batch()
    rows = []

    j_s = C.rlxc_mlp("w3_mlp_loss", C.BATCH).with_params(P).jit()
    f_d = C.rlxc_mlp("w3_mlp_loss_dyn", "B").with_params(P)
    j_d = f_d.jit()
    assert abs(float(j_s.run(x=x, y=y)[0]) - float(j_d.run(x=x, y=y)[0])) < 1e-5
    rows.append(("W3 MLP fwd + loss, b128",) + _pair(lambda: j_s.run(x=x, y=y),
                                                      lambda: j_d.run(x=x, y=y),
                                                      a.runs, a.warmup))
    data = {"x": x, "y": y}
    t_s = C.rlxc_mlp("w4_mlp", C.BATCH).with_params(P).trainer(SGD(C.LR))
    t_d = C.rlxc_mlp("w4_mlp_dyn", "B").with_params(P).trainer(SGD(C.LR))
    rows.append(("W4 MLP train step (SGD), b128",) + _pair(lambda: t_s.step(data),
                                                            lambda: t_d.step(data),
                                                            a.runs, a.warmup))
    print(f"{'workload':34s} {'static ms (med/min)':>22s} {'dynamic ms (med/min)':>22s} "
          f"{'static/dynamic':>15s}")
    for name, ts, td in rows:
        ms, md = statistics.median(ts) * 1e3, statistics.median(td) * 1e3
        print(f"{name:34s} {ms:10.3f} / {min(ts) * 1e3:8.3f} {md:10.3f} / "
              f"{min(td) * 1e3:8.3f} {ms / md:14.2f}x")
    from rlxc.dynone import FALLBACKS, one_library
    from rlxc.registry import backend
    import rlxc.lowering.cpu.dynsizes as dynsizes

    one = one_library(f_d, backend("cpu")) is not None
    print(f"dynamic build: {'one library for every size' if one else 'one program per size'}"
          + ("" if one else f" ({FALLBACKS.get(f_d.ir_hash(), 'RLXC_ONE_LIBRARY=0')})"))
    n_dyn = [0]
    real = dynsizes.compile_dynamic
    dynsizes.compile_dynamic = lambda *a, **k: n_dyn.__setitem__(0, n_dyn[0] + 1) or real(*a, **k)
    for n in (96, 200):
        xn, yn = C.batch(n, seed=n)
        before = STATS["compiles"] + n_dyn[0]
        t0 = time.perf_counter()
        j_d.run(x=xn, y=yn)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        j_d.run(x=xn, y=yn)
        second = time.perf_counter() - t0
        how = "compiled" if STATS["compiles"] + n_dyn[0] > before else \
            ("no compile: the one library" if one else "from the disk cache")
        print(f"first call at batch {n}: {first * 1e3:.1f} ms ({how}); "
              f"second call {second * 1e3:.3f} ms")


if __name__ == "__main__":
    main()

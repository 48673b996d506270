"""Measure mathlib's max error in ulps for every (function, dtype), on the host CPU and on
baseline x86-64 (no FMA), with the samples of tests/test_mathlib*.py drawn from several seeds,
and optionally an exhaustive float32 sweep of one-argument functions.

    .venv/bin/python scripts/mathlib_measure.py [--seeds N] [--exhaustive f32-op ...]

Prints one line per (function, dtype): the worst error and where, next to the bound in
mathlib.BOUNDS.  The exhaustive sweep runs every float32 bit pattern (2^32) in chunks.
"""
from __future__ import annotations

import argparse
import os
import sys
import zlib

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import test_mathlib as t32          # noqa: E402
import test_mathlib_f64 as t64      # noqa: E402
import test_mathlib_more as tmore   # noqa: E402
from mathlib_kernels import Kernels, ulp_error   # noqa: E402
from rlxc.lowering.shared import mathlib   # noqa: E402


def sample(op, dt, seed):
    rng = np.random.default_rng(zlib.crc32(f"{op}{dt}{seed}".encode()))
    if op in tmore.NEW:
        return tmore.inputs(op, dt, rng)
    return (t32.inputs(op, rng),) if dt == "f32" else (t64.inputs(op, rng),)


def reference(op, dt, xs):
    with np.errstate(all="ignore"):
        if op in tmore.NEW:
            return tmore.REF[op](*[x.astype(tmore.WIDE[dt]) for x in xs])
        if dt == "f32":
            return t32.REF[op](xs[0].astype(np.float64))
        return t64.REF[op](xs[0].astype(np.longdouble))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--exhaustive", nargs="*", default=[])
    ap.add_argument("--targets", nargs="*", default=list(t32.TARGETS))
    a = ap.parse_args()
    pairs = [(n, dt) for dt in ("f32", "f64") for n in mathlib.names(dt)]
    for target in a.targets:
        k = Kernels(target, pairs)
        for op, dt in pairs:
            worst, where = -1.0, None
            for seed in range(a.seeds):
                xs = sample(op, dt, seed)
                y = k.run(op, dt, *xs)
                err = ulp_error(y, reference(op, dt, xs), dt)
                if op == "gelu_tanh":
                    err = np.where(xs[0] >= mathlib.GELU_TANH_EXACT_FROM, err, 0.0)
                i = int(np.argmax(err))
                if err[i] > worst:
                    worst, where = float(err[i]), [float(x[i]) for x in xs]
            bound = mathlib.FUNCTIONS[op].ulp(dt)
            flag = "" if worst <= bound else "  EXCEEDS"
            print(f"{target:7s} {dt} {op:10s} {worst:7.3f} ulp (bound {bound}) at {where}{flag}",
                  flush=True)
        for op in a.exhaustive:
            worst, where = -1.0, None
            for hi in range(0, 1 << 32, 1 << 26):
                x = np.arange(hi, hi + (1 << 26), dtype=np.uint64).astype(np.uint32).view(np.float32)
                x = x[np.isfinite(x)]
                err = ulp_error(k.run(op, "f32", x), reference(op, "f32", (x,)), "f32")
                if op == "gelu_tanh":
                    err = np.where(x >= mathlib.GELU_TANH_EXACT_FROM, err, 0.0)
                i = int(np.argmax(err))
                if err[i] > worst:
                    worst, where = float(err[i]), float(x[i])
            print(f"{target:7s} f32 {op:10s} {worst:7.3f} ulp over all float32 at {where!r}",
                  flush=True)


if __name__ == "__main__":
    main()

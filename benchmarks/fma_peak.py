"""The CPU's float32 FMA peak at a vector width, measured: the ceiling of every GEMM number.

Run:  .venv/bin/python benchmarks/fma_peak.py [--cpu portable] [--threads 1,2]

Builds (through rlxc's own LLVM pipeline, for the --cpu rlxc compiles for) one function

    double rlxc_fma_peak(i64 iters, float a, float c):
                            CHAINS independent accumulators of VL floats (distinct lanes),
                            each acc = fma(acc, a, c) once per iteration

with enough chains to cover the FMA latency on every port (12 ymm accumulators of the
16 registers AVX2 has, 24 zmm of AVX-512's 32), and times it on 1..N threads at once
(Python threads; the foreign call releases the GIL), as the median and the best of 5
runs of ~0.1 s (a VM's clock moves: 117-128 GFLOP/s per core at ymm within minutes on
the Sapphire Rapids VM).  GFLOP/s = threads x iters x CHAINS x VL x 2 / wall time.

Why: compare.py's W2 and W3 figures (and bench_sgemm's) are ratios between libraries; the
fraction of this peak says how much any library could still gain on this machine.  On an
AVX-512 host an AVX2 build (--cpu portable / znver3) is measured at the ymm width, which is
what its code (and the peers under --peer-isa avx2) can reach.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

A, C = 0.75, 0.25   # acc -> a * acc + c converges to 1 (exactly): no overflow, no denormal
_LIBS: dict = {}


def start(chain: int, lane: int) -> float:
    """The first value of one lane of one accumulator."""
    return 1.0 + chain / 64 + lane / 4096


def chains_for(vl: int) -> int:
    """Independent accumulators: 12 ymm (AVX2 has 16 registers: 12 + the two constants),
    24 zmm (of 32); either covers a 4-cycle FMA on two ports (8 in flight) with room."""
    return 24 if vl >= 16 else 12


def build(cpu: str = "native", vl: int | None = None):
    """ctypes function rlxc_fma_peak(iters) -> sum of the accumulators' lanes, built for
    `cpu` at `vl` floats per vector (default: the width rlxc's sgemm uses on that cpu)."""
    import llvmlite.ir as ir

    from rlxc.lowering.cpu import sgemm_object, target
    from rlxc.lowering.shared.scalar import intrinsic

    if vl is None:
        vl = sgemm_object.vector_width(cpu)
    key = (cpu, vl)
    if key in _LIBS:
        return _LIBS[key]
    n = chains_for(vl)
    f32, f64, i64 = ir.FloatType(), ir.DoubleType(), ir.IntType(64)
    vt = ir.VectorType(f32, vl)
    m = target.ir_module("fma_peak", cpu)
    # a and c are arguments: with constants LLVM folds the loop away
    fn = ir.Function(m, ir.FunctionType(f64, [i64, f32, f32]), "rlxc_fma_peak")
    iters, av, cv = fn.args
    entry = fn.append_basic_block("entry")
    loop = fn.append_basic_block("loop")
    done = fn.append_basic_block("done")
    b = ir.IRBuilder(entry)
    fma = intrinsic(b, "llvm.fmuladd", vt, 3)   # an fma where the CPU has one, else mul + add
    zero = ir.Constant(vt, [0.0] * vl)
    mask = ir.Constant(ir.VectorType(ir.IntType(32), vl), [0] * vl)
    a = b.shuffle_vector(b.insert_element(zero, av, ir.Constant(ir.IntType(32), 0)), zero, mask)
    c = b.shuffle_vector(b.insert_element(zero, cv, ir.Constant(ir.IntType(32), 0)), zero, mask)
    # every lane of every chain starts apart, so no two compute the same values
    init = [ir.Constant(vt, [start(j, lane) for lane in range(vl)]) for j in range(n)]
    go = b.icmp_signed(">", iters, ir.Constant(i64, 0))
    b.cbranch(go, loop, done)
    b.position_at_end(loop)
    i = b.phi(i64, "i")
    accs = [b.phi(vt, f"acc{j}") for j in range(n)]
    nxt = [b.call(fma, [x, a, c]) for x in accs]
    i2 = b.add(i, ir.Constant(i64, 1))
    i.add_incoming(ir.Constant(i64, 0), entry)
    i.add_incoming(i2, loop)
    for x, v0, v1 in zip(accs, init, nxt):
        x.add_incoming(v0, entry)
        x.add_incoming(v1, loop)
    b.cbranch(b.icmp_signed("<", i2, iters), loop, done)
    b.position_at_end(done)
    outs = [b.phi(vt, f"out{j}") for j in range(n)]
    for o, v0, v1 in zip(outs, init, nxt):
        o.add_incoming(v0, entry)
        o.add_incoming(v1, loop)
    total = ir.Constant(f64, 0.0)
    for o in outs:
        for lane in range(vl):
            total = b.fadd(total, b.fpext(b.extract_element(o, ir.Constant(ir.IntType(32), lane)),
                                          f64))
    b.ret(total)
    with tempfile.TemporaryDirectory(prefix="rlxc-fma-peak-") as folder:
        # loaded, the library outlives its file (the mapping stays)
        lib = ctypes.CDLL(target.build_shared([m], os.path.join(folder, "fma_peak.so"), cpu,
                                              3, extra_libs=()))
    f = lib.rlxc_fma_peak
    f.argtypes, f.restype = [ctypes.c_int64, ctypes.c_float, ctypes.c_float], ctypes.c_double
    _LIBS[key] = (f, n, vl)
    return _LIBS[key]


def reference(iters: int, vl: int) -> float:
    """What rlxc_fma_peak(iters) returns, in float32 NumPy arithmetic (fma rounds once; the
    two agree to float32 precision for the few iterations a test runs)."""
    import numpy as np

    n = chains_for(vl)
    acc = np.array([[start(j, k) for k in range(vl)] for j in range(n)], np.float32)
    a, c = np.float64(np.float32(A)), np.float64(np.float32(C))
    for _ in range(iters):   # in float64, rounded once to float32: an fma
        acc = (acc.astype(np.float64) * a + c).astype(np.float32)
    return float(acc.astype(np.float64).sum())


def measure(cpu: str = "native", threads: int = 1, vl: int | None = None, reps: int = 5,
            seconds: float = 0.1) -> tuple[float, float]:
    """(median, best) GFLOP/s (all threads together) of `reps` timed runs of rlxc_fma_peak
    of about `seconds` each, on `threads` threads at once.  The median is the rate a
    workload timed by its median could reach; the best, the clock's highest moments."""
    f, n, vl = build(cpu, vl)
    iters = 1 << 16
    while True:                              # calibrate: one run of about `seconds`
        t0 = time.perf_counter()
        f(iters, A, C)
        dt = time.perf_counter() - t0
        if dt >= seconds / 4 or iters >= 1 << 40:
            break
        iters *= 4
    iters = max(1, int(iters * seconds / max(dt, 1e-9)))
    rates = []
    for _ in range(reps):
        start = threading.Barrier(threads + 1)
        ws = [threading.Thread(target=lambda: (start.wait(), f(iters, A, C)))
              for _ in range(threads)]
        for w in ws:
            w.start()
        start.wait()
        t0 = time.perf_counter()
        for w in ws:
            w.join()
        rates.append(threads * iters * n * vl * 2 / (time.perf_counter() - t0) / 1e9)
    rates.sort()
    return rates[len(rates) // 2], rates[-1]


def summary(cpu: str = "native", threads: int = 2) -> tuple[int, dict]:
    """(floats per vector, {thread count: (median, best) GFLOP/s}) for 1 and `threads`
    threads."""
    _, _, vl = build(cpu)
    counts = sorted({1, max(1, threads)})
    return vl, {t: measure(cpu, t) for t in counts}


def width_name(vl: int) -> str:
    return {4: "xmm", 8: "ymm", 16: "zmm"}.get(vl, f"{vl} floats")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", default="native", help="an --cpu of rlxc compile, or portable")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--vl", type=int, default=None, help="floats per vector (default: the "
                    "width of rlxc's sgemm for --cpu)")
    args = ap.parse_args(argv)
    from rlxc.lowering.artifact.isa import PORTABLE_CPU

    cpu = PORTABLE_CPU if args.cpu == "portable" else args.cpu
    _, _, vl = build(cpu, args.vl)
    for t in [int(x) for x in args.threads.split(",") if x.strip()]:
        med, best = measure(cpu, t, vl)
        print(f"--cpu {args.cpu}, {width_name(vl)} ({chains_for(vl)} chains), {t} thread(s): "
              f"{med:.1f} GFLOP/s, best {best:.1f} ({med / t:.1f} per thread)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Is this CPU core shared right now?  A probe for single-thread timings on shared VMs.

Why: on the 2-vCPU KVM Sapphire Rapids VM of 2026-12-02, one-thread timings were bimodal
(the ONNX CNN at batch 64: ~100 us or ~150-170 us per call), in stretches of a fraction
of a second to many seconds, in any process.  Fixed register-only C loops slow down in the
same stretches: independent adds drop from ~5.2 to ~2.5-2.9 per cycle while the clock
(a dependent multiply chain) stays at ~3 GHz.  That is the signature of a busy SMT sibling
on the host core under the vCPU, which the guest cannot see (no steal time, no HW
counters).  benchmarks/bench_slowmode.py holds the evidence; this module lets a benchmark
say which state its numbers were taken in.

Use:
    s = sample()             CoreSample(adds_per_cycle, ghz): one ~1 ms probe
    classify(apc, full=None) "shared" | "unshared": apc < SHARED_RATIO * full (full: the
                             best adds/cycle seen on this machine), or below
                             SHARED_APC when no reference is given
    survey(seconds)          probes spread over `seconds`: (fraction shared, best apc, GHz)
    describe(seconds)        one line for a benchmark header
    mxcsr(), clear_flags()   this thread's MXCSR; clear its sticky exception flags

Algorithm: corestate.c (built with the system C compiler into a private per-user cache
directory, keyed by the hash of its source, as benchmarks/isacap.py does).  Each probe
times, with time.thread_time (CPU time of this thread: preemption does not count),
n x 16 independent register adds (issue-bandwidth bound) and n x 8 dependent 64-bit
multiplies (3 cycles each: the clock); adds per cycle = adds/ns / GHz.  x86-64 Linux only;
`unavailable()` says why not elsewhere.  Stdlib only.
"""
from __future__ import annotations

import ctypes
import os
import platform
import shutil
import sys
import statistics
import time
from collections import namedtuple

__all__ = ["CoreSample", "unavailable", "build", "sample", "classify", "survey", "describe",
           "mxcsr", "clear_flags", "SHARED_RATIO", "SHARED_APC"]

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "corestate.c")
if HERE not in sys.path:   # cshim.py beside this file (also when loaded by path)
    sys.path.insert(0, HERE)
from cshim import build_shared  # noqa: E402
SHARED_RATIO = 0.7   # a sibling halves the rate; below 70% of the machine's best: shared
SHARED_APC = 3.3     # without a reference: unshared x86-64 cores reach >= 4 adds/cycle
MUL_LATENCY = 3      # cycles of a dependent 64-bit imul (Intel since Nehalem, AMD Zen)

CoreSample = namedtuple("CoreSample", "adds_per_cycle ghz")
_lib = None


class CoreStateError(RuntimeError):
    """The probe cannot run here (the message says why)."""


def unavailable() -> str | None:
    """Why the probe cannot run on this machine, or None when it can."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"needs Linux on x86-64 (this is {platform.system()} {platform.machine()})"
    if shutil.which(os.environ.get("CC", "cc")) is None:
        return "no C compiler (cc) to build benchmarks/corestate.c"
    return None


def build() -> str:
    """The path of the probe's shared library, built from corestate.c once per source."""
    why = unavailable()
    if why:
        raise CoreStateError(why)
    return build_shared(SOURCE, 'corestate', CoreStateError)


def _load():
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(build())
        for name in ("corestate_adds", "corestate_muls"):
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = [ctypes.c_uint64], ctypes.c_uint64
        lib.corestate_mxcsr.restype = ctypes.c_uint
        lib.corestate_clear_flags.restype = None
        _lib = lib
    return _lib


def _rate(fn, n: int, ops: int, reps: int) -> float:
    """Operations per ns of fn(n): the median of `reps` timings in this thread's CPU time."""
    ts = []
    for _ in range(reps):
        t = time.thread_time_ns()
        fn(n)
        ts.append(time.thread_time_ns() - t)
    return ops * n / max(1, statistics.median(ts))


def sample(n: int = 20000, reps: int = 5) -> CoreSample:
    """One probe (about 2 x reps x n x 5 ns): adds per cycle and the clock in GHz."""
    lib = _load()
    ghz = _rate(lib.corestate_muls, n, 8, reps) * MUL_LATENCY
    adds = _rate(lib.corestate_adds, n, 16, reps)
    return CoreSample(adds / ghz, ghz)


def classify(apc: float, full: float | None = None) -> str:
    """"shared" when `apc` (adds per cycle) is below SHARED_RATIO x `full` (the best seen
    on this machine), or below SHARED_APC without a reference; else "unshared"."""
    if apc <= 0:
        raise ValueError(f"adds per cycle must be > 0, got {apc}")
    limit = SHARED_APC if full is None else SHARED_RATIO * full
    return "shared" if apc < limit else "unshared"


def survey(seconds: float = 0.3, gap: float = 0.01):
    """Probes spread over `seconds`: (fraction of probes in the shared state, best adds per
    cycle, median GHz)."""
    samples, end = [], time.monotonic() + seconds
    while True:
        samples.append(sample())
        if time.monotonic() >= end:
            break
        time.sleep(gap)
    best = max(s.adds_per_cycle for s in samples)
    full = best if classify(best) == "unshared" else None
    shared = sum(classify(s.adds_per_cycle, full) == "shared" for s in samples)
    return shared / len(samples), best, statistics.median(s.ghz for s in samples)


def describe(seconds: float = 0.3) -> str:
    """One line for a benchmark header: how much of `seconds` this core was shared."""
    why = unavailable()
    if why:
        return f"core state: not probed ({why})"
    frac, best, ghz = survey(seconds)
    return (f"core state: shared {100 * frac:.0f}% of {seconds:g} s (a busy SMT sibling "
            f"halves one-thread speed; best {best:.1f} adds/cycle at {ghz:.2f} GHz)")


def mxcsr() -> int:
    """This thread's MXCSR (bit 15 FTZ, bit 6 DAZ, bits 0-5 the sticky exception flags)."""
    return int(_load().corestate_mxcsr())


def clear_flags() -> None:
    """Clear this thread's sticky MXCSR exception flags (the modes stay as they are)."""
    _load().corestate_clear_flags()


if __name__ == "__main__":
    print(describe(1.0))

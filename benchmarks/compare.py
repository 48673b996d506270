"""rlxc next to NumPy, JAX and PyTorch on the CPU: one process, interleaved, checked.

Run:  make bench     (env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python
                      benchmarks/compare.py)
      or any Python that has jax / torch next to rlxc (`pip install '.[bench]'`);
      a peer that is not installed is reported as missing, the rest still runs.
Options: --only W1,W3   --runs 30 (>= 20)   --warmup 5   --threads 2   --w7-runs 3
         --no-compile (skip torch.compile)   --gap 0.15 (s of sleep after each sample)
         --cpu znver3 (rlxc compiles for that CPU instead of the host: any --cpu of
         `rlxc compile`; "portable" is the x86-64-v3 baseline; the code must run here)
         --blas-coretype Haswell (OPENBLAS_CORETYPE for this process: the kernels
         OpenBLAS picks on an AVX2 CPU; default: unset, OpenBLAS picks for the host)
         --peer-isa avx2 (every peer restricted to AVX2 for this process, set before
         the libraries load, for comparing an AVX2 rlxc build (--cpu znver3 / portable)
         on an AVX-512 host; see "Peer ISA" below)

Peer ISA (--peer-isa avx2).  OpenBLAS: OPENBLAS_CORETYPE=Haswell (unless
--blas-coretype says otherwise); PyTorch: ATEN_CPU_CAPABILITY=avx2 (ATen's own
kernels); MKL: MKL_ENABLE_INSTRUCTIONS=AVX2 (torch's sgemm); oneDNN (torch and
XLA): ONEDNN_MAX_CPU_ISA=AVX2; XLA: --xla_cpu_max_isa=AVX2 (the code XLA generates
with LLVM).  XLA runs its dots through YNNPACK, which picks its kernels from cpuid
and ignores that flag, so on top of the variables the process's cpuid itself is
capped: benchmarks/isacap.c traps every cpuid (Linux CPUID faulting, the CPU flag
cpuid_fault) and answers with the AVX-512/AMX/AVX-VNNI bits cleared, from before
NumPy loads, in this process and in the children that measure (XLA probe, W7).
Where the CPU has no cpuid_fault the variables alone apply and the header says that
XLA's dots are NOT capped.  The header verifies each: that cpuid is trapped, OpenBLAS's
kernel (threadpoolctl), torch's capability, the instruction set MKL reports (its
verbose line), and every peer's sgemm 1024^3 in GFLOP per CPU-second on one thread
(an AVX2 core peaks at 16 FMA lanes per cycle: half what AVX-512 code reaches).

Workloads (float32; MLP = 784-512-512-10, ReLU, softmax cross-entropy on
integer labels, batch 128):
  W1  sum(tanh(x*a + b) * sigmoid(x)), x of 2^20 floats; a, b are rank-0
      inputs (scalars passed at call time, not constants folded in)
  W2  sgemm 1024x1024x1024 (also as GFLOP/s)
  W3  MLP forward + mean cross-entropy (the loss)
  W4  MLP training step: value_and_grad over all params + SGD(lr 0.01) update,
      loss returned to the host; rlxc: Func.trainer (the fused native step)
  W5  per-example gradients: vmap(grad(loss)) over the 128 examples, each one
      a batch-1 model (rlxc: f.grad_all().vmap(["x", "y"], 128)); 343 MB of
      gradients per call
  W6  HVP of f(x) = sum(tanh(W @ x)), W 256x256, w.r.t. x (rlxc: f.hvp)
  W7  time to the first W4 loss in a fresh process (python start, import,
      trace, transform, compile, run), cold (empty function caches: an empty
      RLXC_CACHE_DIR; JAX with its compilation cache off) and warm (the disk
      cache a first run filled; JAX's persistent compilation cache).  rlxc's
      shared sgemm objects are toolchain, built once per machine into
      RLXC_RUNTIME_DIR; "first use" also empties that, so the sgemm objects come
      from what `make` built at install (lowering/cpu/prebuilt), and "no prebuilt"
      hides those too (RLXC_PREBUILT_DIR=""): the sgemm is built on the first run
  W8  MLP forward (logits) at batch 1, rlxc through Jitted.run
  W9  LeNet-style CNN training step, input (64, 3, 32, 32): conv 5x5 (6) + relu +
      max_pool 2, conv 5x5 (16) + relu + max_pool 2, linear 400-120 + relu,
      linear 120-10, softmax cross-entropy, SGD(lr 0.01); rlxc: Func.trainer
  W10 one transformer block, value_and_grad; W11 causal attention forward
      (benchmarks/compare_models.py)

Method.  Every implementation of a workload lives in this one process.  Each
is built, run once, and its result checked against rlxc's (assert close:
nobody is timed doing something else), then warmed up.  Timing is
round-robin: every repetition times each implementation once, in an order
that changes per repetition (balanced_orders: each implementation follows
each other one equally often), so load spikes on this shared machine and the
previous implementation's still-spinning threads hit all of them alike.  A
sample is one untimed call (its data back in the caches), then one timed
call, or the mean of k back-to-back calls when one call is shorter than
~2 ms (k is reported); after it the harness sleeps --gap seconds (default
0.15), so that the worker threads an implementation leaves spinning
(OpenBLAS keeps a core busy for ~0.11 s after each threaded call, libgomp
and Eigen a few ms) do not steal the next one's cores.  The table shows the
median over >= 20 samples and the min beside it, and peer/rlxc ratios of
medians (> 1: rlxc is faster); W2 and W3 also as GFLOP/s and as a percentage of the
float32 FMA peak at the width of rlxc's build (benchmarks/fma_peak.py, measured in the
header: how much any of them could still gain on this machine).  Thread counts are set to the same N
(--threads, default 2) for every library: rlxc (RLXC_NUM_THREADS, OpenMP),
NumPy's BLAS (threadpoolctl), PyTorch (torch.set_num_threads), XLA (its pool
is sized by the CPU affinity mask; with N = 1 the Eigen pool is switched off
by flag).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SIZES = (784, 512, 512, 10)
BATCH = 128
IMPLS = ("rlxc", "numpy", "jax", "torch", "torch.compile")
WORKLOADS = ("W1", "W2", "W3", "W4", "W5", "W6", "W7", "W8", "W9", "W10", "W11")
TARGETS = {  # workload -> [(peer, minimum peer/rlxc ratio, text)]  (issues 8 and 19)
    "W1": [("jax", 2.0, ">= 2x JAX")],
    "W2": [("numpy", 1.0, ">= 1.0x OpenBLAS"), ("jax", 1.0, "> JAX")],
    "W3": [("best", 1.2, ">= 1.2x best peer")],
    "W4": [("jax", 1.2, ">= 1.2x JAX")],
    "W5": [("jax", 5.0, ">= 5x JAX"), ("numpy", 1.0, ">= NumPy")],
    "W6": [("jax", 2.0, ">= 2x JAX"), ("numpy", 1.0, ">= NumPy")],
    "W8": [("jax", 2.0, ">= 2x JAX"), ("numpy", 1.0, ">= NumPy")],
    "W9": [("best", 1.2, ">= 1.2x best peer")],
    "W10": [("jax", 1.2, ">= 1.2x JAX"), ("torch", 1.0, ">= 1.0x PyTorch eager")],
    "W11": [("torch", 1.0, ">= 1.0x torch SDPA")],
}
PORTABLE = "x86-64-v3"   # what --cpu portable builds (the shipped-artifact baseline)


def use_cpu(cpu: str) -> str:
    """Make every rlxc compile of this process target `cpu`: Func.jit, Func.run and the
    Trainer pass no cpu option, so the cpu backend's default (the host) applies; this sets
    that default.  Returns the cpu string the backend gets."""
    if cpu in ("native", "host", ""):
        return "native"
    if cpu == "portable":
        cpu = PORTABLE
    from rlxc.registry import backend

    backend("cpu").default_cpu = cpu
    return cpu


def _setup_threads(n: int) -> None:
    """Before any numeric library is imported: every pool gets n threads."""
    for k in ("OMP_NUM_THREADS", "RLXC_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[k] = str(n)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if n == 1:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   " --xla_cpu_multi_thread_eigen=false "
                                   "intra_op_parallelism_threads=1").strip()


PEER_ISA_ENV = {  # --peer-isa avx2: set before any peer library loads
    "OPENBLAS_CORETYPE": "Haswell",
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
}
XLA_AVX2_FLAG = "--xla_cpu_max_isa=AVX2"


def _setup_peer_isa(isa: str, blas_coretype=None) -> None:
    """Before NumPy, torch or jax is imported: restrict their kernels to `isa`
    ("native": leave them to the host; "avx2": PEER_ISA_ENV and XLA's max ISA).
    An explicit --blas-coretype wins over the ISA's OpenBLAS kernel."""
    for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):   # before NumPy loads OpenBLAS
        os.environ.pop(k, None)
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        # torch.compile's kernels, one cache per peer ISA: a capped run that reused the
        # AVX-512 kernels of a native run before it computed W3/W4/W8 wrong (checked, so
        # it failed loudly; with a cache of its own it is right)
        import getpass
        import tempfile

        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(
            tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}_peer_{isa}")
    if isa == "avx2":
        os.environ.update(PEER_ISA_ENV)
        flags = os.environ.get("XLA_FLAGS", "")
        if XLA_AVX2_FLAG not in flags:
            os.environ["XLA_FLAGS"] = (flags + " " + XLA_AVX2_FLAG).strip()
    elif isa != "native":
        raise ValueError(f"--peer-isa must be native or avx2, got {isa!r}")
    if blas_coretype:
        os.environ["OPENBLAS_CORETYPE"] = blas_coretype


_CPUID_CAP = {"on": False, "why": "not asked (--peer-isa native)"}


def _setup_cpuid_cap(isa: str) -> dict:
    """--peer-isa avx2: trap cpuid in this process (benchmarks/isacap.c) before any peer
    library loads or any thread starts, so that libraries which read cpuid themselves
    (YNNPACK under XLA) pick AVX2 kernels too.  Where that cannot work the environment
    variables of _setup_peer_isa are all there is, and the reason is kept for the header."""
    if isa != "avx2":
        return _CPUID_CAP
    sys.path.insert(0, HERE)
    try:
        import isacap

        isacap.enable()
        _CPUID_CAP.update(on=True, why="")
    except Exception as e:  # noqa: BLE001  (IsacapError, or cc failing)
        _CPUID_CAP.update(on=False, why=str(e))
        print(f"WARNING: --peer-isa avx2 cannot cap cpuid here ({e}); only the environment "
              "variables apply, and XLA's dots (YNNPACK) are NOT capped", file=sys.stderr)
    finally:
        sys.path.remove(HERE)
    return _CPUID_CAP


def _cpuid_cap_prelude() -> str:
    """Python source that caps cpuid at the start of a child process (exec drops CPUID
    faulting), when this process runs capped; empty otherwise."""
    if not _CPUID_CAP["on"]:
        return ""
    return f"import sys as _s; _s.path.insert(0, {HERE!r}); import isacap as _i; " \
           "_i.enable(); _s.path.pop(0)\n"


def _cpuid_cap_line() -> str:
    """The header line on the cpuid cap: trapped, our SIGSEGV handler in place (put back
    if a library replaced it) and what leaf 7 says now; or why there is none."""
    if not _CPUID_CAP["on"]:
        return (f"  cpuid: NOT capped ({_CPUID_CAP['why']}): XLA's dots (YNNPACK) and any "
                "library that reads cpuid itself may still run AVX-512")
    import isacap

    again = isacap.reinstall()
    st = isacap.state()
    ok = st["faulting"] and st["handler"] and not isacap.avx512f()
    return (f"  cpuid: {'capped at AVX2' if ok else 'CAP FAILED'} by CPUID faulting "
            f"(benchmarks/isacap.c): leaf 7 AVX512F={int(isacap.avx512f())}, "
            f"{st['emulated']} cpuid answered so far, SIGSEGV handler "
            f"{'put back (a library had replaced it)' if again else 'in place'}")


def _cpu_gflops(fn, reps=5, clock=time.thread_time) -> float:
    """sgemm 1024^3 GFLOP per CPU-second of `clock` (median of reps, one warm call)."""
    fn()
    ts = []
    for _ in range(reps):
        t = clock()
        fn()
        ts.append(clock() - t)
    return 2 * 1024 ** 3 / max(statistics.median(ts), 1e-9) / 1e9


def _mkl_isa_line(torch) -> str:
    """The instruction set MKL reports on its verbose line for one small sgemm (its C
    stdout captured through the file descriptor), or why it cannot tell."""
    import ctypes
    import re

    try:
        verbose = torch.backends.mkl.verbose
        on = torch.backends.mkl.VERBOSE_ON
    except AttributeError:
        return "MKL verbose not available"
    a = torch.ones(64, 64)
    sys.stdout.flush()
    fd = os.dup(1)
    with tempfile.TemporaryFile() as tf:
        os.dup2(tf.fileno(), 1)
        try:
            with verbose(on):
                a @ a
            ctypes.CDLL(None).fflush(None)
        finally:
            os.dup2(fd, 1)
            os.close(fd)
        tf.seek(0)
        text = tf.read().decode(errors="replace")
    m = re.search(r"architecture .*?\(Intel\(R\) ([^)]*)\)", text)
    if m:
        return m.group(1)
    return "no MKL verbose line (torch's sgemm did not go through MKL?)"


def peer_isa_report(args) -> list:
    """Header lines that check what --peer-isa asked for actually took effect, with a
    one-thread sgemm rate per peer (GFLOP per CPU-second: AVX2 code cannot pass half of
    what AVX-512 code reaches)."""
    out = [f"peer ISA: {args.peer_isa}" + (
        f" ({', '.join(f'{k}={os.environ.get(k)}' for k in PEER_ISA_ENV)}, XLA_FLAGS="
        f"{os.environ.get('XLA_FLAGS', '')!r})" if args.peer_isa != "native" else
        " (every peer picks kernels for the host)")]
    if args.peer_isa != "native":
        out.append(_cpuid_cap_line())
    np = np_mod()
    a = np.ones((1024, 1024), np.float32)
    try:
        from threadpoolctl import threadpool_limits

        with threadpool_limits(limits=1, user_api="blas"):
            g = _cpu_gflops(lambda: a @ a)
        out.append(f"  NumPy BLAS on one thread: {g:.0f} GFLOP/s (kernel: "
                   f"{', '.join(str(i.get('architecture')) for i in _blas_pools())})")
    except Exception as e:  # noqa: BLE001
        out.append(f"  NumPy: cannot check ({e})")
    try:
        torch = peer("torch")
        n = torch.get_num_threads()
        t = torch.from_numpy(a)
        torch.set_num_threads(1)
        try:
            g = _cpu_gflops(lambda: t @ t)
        finally:
            torch.set_num_threads(n)
        out.append(f"  torch on one thread: {g:.0f} GFLOP/s; ATen capability "
                   f"{torch.backends.cpu.get_cpu_capability()}; MKL: {_mkl_isa_line(torch)}")
    except Skip:
        pass
    except Exception as e:  # noqa: BLE001
        out.append(f"  torch: cannot check ({e})")
    try:
        peer("jax")
        capped = ("cpuid capped: YNNPACK sees AVX2" if _CPUID_CAP["on"] else
                  "YNNPACK dots pick their kernels from cpuid: --xla_cpu_max_isa does not "
                  "cap them" if args.peer_isa != "native" else "YNNPACK dots, host cpuid")
        out.append(f"  XLA dot on one thread: {_xla_one_thread_gflops()} ({capped})")
    except Skip:
        pass
    return out


_XLA_PROBE = '''
import time, statistics, numpy as np, jax
x = jax.numpy.asarray(np.ones((1024, 1024), np.float32))
f = jax.jit(lambda a: a @ a)
f(x).block_until_ready()
ts = []
for _ in range(5):
    t = time.process_time(); f(x).block_until_ready(); ts.append(time.process_time() - t)
print("GFLOPS", 2 * 1024 ** 3 / statistics.median(ts) / 1e9)
'''


def _xla_one_thread_gflops() -> str:
    """XLA's sgemm 1024^3 on one thread (its pool cannot shrink in a running process, so
    a child with this process's environment and XLA's single-thread flags measures it)."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false "
                        "intra_op_parallelism_threads=1").strip()
    try:
        r = subprocess.run([sys.executable, "-c", _cpuid_cap_prelude() + _XLA_PROBE], env=env,
                           capture_output=True,
                           text=True, timeout=120)
        return f"{float(r.stdout.split('GFLOPS')[1]):.0f} GFLOP/s"
    except Exception as e:  # noqa: BLE001
        return f"cannot measure ({type(e).__name__})"


def _blas_pools():
    from threadpoolctl import threadpool_info

    return [i for i in threadpool_info() if i.get("user_api") == "blas"]


class Skip(Exception):
    """A peer that cannot run this workload (the reason goes into the table notes)."""


# ------------------------------------------------------------------ peers, imported lazily

_MODS: dict = {}


def peer(name):
    """The module of a peer, or raise Skip with why it is missing."""
    if name in _MODS:
        m = _MODS[name]
        if isinstance(m, Exception):
            raise Skip(str(m))
        return m
    try:
        if name == "jax":
            import jax

            jax.config.update("jax_platforms", "cpu")
            m = jax
        elif name == "torch":
            import torch

            torch.set_num_threads(int(os.environ["RLXC_NUM_THREADS"]))
            m = torch
        else:
            raise ImportError(name)
    except ImportError as e:
        _MODS[name] = Skip(f"{name} is not installed (pip install '.[bench]')")
        raise _MODS[name] from e
    _MODS[name] = m
    return m


def np_mod():
    import numpy as np

    return np


def blas_info() -> str:
    np = np_mod()
    try:
        from threadpoolctl import threadpool_info

        out = [f"{i.get('internal_api')} {i.get('version')} ({i.get('architecture')}, "
               f"{i.get('num_threads')} threads, {os.path.basename(i.get('filepath', ''))})"
               for i in threadpool_info() if i.get("user_api") == "blas"]
        if out:
            return "; ".join(out)
    except Exception:  # noqa: BLE001
        pass
    try:
        b = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{b.get('name')} {b.get('version')} (from numpy.show_config)"
    except Exception:  # noqa: BLE001
        return "unknown"


class BlasLimit:
    def __init__(self, n):
        self.n = n

    def __enter__(self):
        try:
            from threadpoolctl import threadpool_limits

            self.ctl = threadpool_limits(limits=self.n, user_api="blas")
        except Exception:  # noqa: BLE001
            self.ctl = None

    def __exit__(self, *a):
        if self.ctl is not None:
            self.ctl.restore_original_limits()


# ------------------------------------------------------------------ shared model pieces

def init_params(seed=0):
    np = np_mod()
    rng = np.random.default_rng(seed)
    p = {}
    for i in range(len(SIZES) - 1):
        fan_in = SIZES[i]
        p[f"w{i}"] = (rng.standard_normal((SIZES[i], SIZES[i + 1])) /
                      np.sqrt(fan_in)).astype(np.float32)
        p[f"b{i}"] = (0.01 * rng.standard_normal(SIZES[i + 1])).astype(np.float32)
    return p


PNAMES = [f"{k}{i}" for i in range(len(SIZES) - 1) for k in ("w", "b")]


def batch(n=BATCH, seed=1):
    np = np_mod()
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, SIZES[0])).astype(np.float32),
            rng.integers(0, SIZES[-1], n).astype(np.int32))


def rlxc_mlp(name, n, loss=True):
    from rlxc import Func

    def build(s):
        h = s.input("x", (n, SIZES[0]))
        for i in range(len(SIZES) - 1):
            h = h.linear(s.param(f"w{i}", (SIZES[i], SIZES[i + 1])),
                         s.param(f"b{i}", (SIZES[i + 1],)))
            if i < len(SIZES) - 2:
                h = h.relu()
        return h.cross_entropy(s.input("y", (n,), "i32")) if loss else h
    return Func(name, build)


def np_forward(p, x):
    np = np_mod()
    hs = [x]
    h = x
    for i in range(len(SIZES) - 1):
        h = h @ p[f"w{i}"] + p[f"b{i}"]
        if i < len(SIZES) - 2:
            h = np.maximum(h, 0.0)
        hs.append(h)
    return hs


def np_loss_grad_logits(logits, y, mean=True):
    """(loss, d loss / d logits) of mean softmax cross-entropy."""
    np = np_mod()
    m = logits.max(axis=-1, keepdims=True)
    z = logits - m
    e = np.exp(z)
    s = e.sum(axis=-1, keepdims=True)
    logp = z - np.log(s)
    n = logits.shape[0]
    loss = -logp[np.arange(n), y].mean()
    d = e / s
    d[np.arange(n), y] -= 1.0
    return loss, (d / n if mean else d)


def jax_mlp(jax):
    jnp = jax.numpy

    def logits(p, x):
        h = x
        for i in range(len(SIZES) - 1):
            h = h @ p[f"w{i}"] + p[f"b{i}"]
            if i < len(SIZES) - 2:
                h = jax.nn.relu(h)
        return h

    def loss(p, x, y):
        logp = jax.nn.log_softmax(logits(p, x), axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))
    return logits, loss


def torch_mlp(torch):
    F = torch.nn.functional

    def logits(p, x):
        h = x
        for i in range(len(SIZES) - 1):
            h = torch.addmm(p[f"b{i}"], h, p[f"w{i}"])
            if i < len(SIZES) - 2:
                h = torch.relu(h)
        return h

    def loss(p, x, y):
        return F.cross_entropy(logits(p, x), y)
    return logits, loss


def compile_torch(torch, fn):
    """torch.compile(fn); raises Skip with the reason when inductor cannot build it."""
    try:
        return torch.compile(fn)
    except Exception as e:  # noqa: BLE001
        raise Skip(f"torch.compile failed: {type(e).__name__}: {str(e).splitlines()[0]}")


def torch_no_grad(torch, fn, args, compiled):
    """The timed call fn(*args) under torch.no_grad(), through torch.compile when
    `compiled` (the inference peers of W3, W8, W11)."""
    g = compile_torch(torch, fn) if compiled else fn

    def f():
        with torch.no_grad():
            return g(*args)
    return f


def skipped(reason):
    """An impl maker for a peer that has no implementation of the workload."""
    def make():
        raise Skip(reason)
    return make


def first_call(fn, what):
    try:
        return fn()
    except Skip:
        raise
    except Exception as e:  # noqa: BLE001
        msg = str(e).strip().splitlines()
        raise Skip(f"{what} failed: {type(e).__name__}: {msg[0] if msg else ''}"[:200])


# ------------------------------------------------------------------ training-step peers
# W4 (MLP) and W9 (LeNet) time one SGD step per call; the first call returns the loss and
# every parameter after the step so the check can compare them, later calls just the loss.


def rlxc_train_step(tr, data, names):
    """One rlxc Trainer step per call (see the block comment above)."""
    np = np_mod()
    first = [True]

    def f():
        loss = tr.step(data)
        if first[0]:
            first[0] = False
            return [np.float32(loss)] + [tr.func.param_binding(k) for k in names]
        return loss
    return f


def jax_train_step(jax, loss, P, x, y, lr, names):
    """One jitted JAX SGD step on loss(p, x, y) per call, params donated between calls."""
    np = np_mod()
    jnp = jax.numpy

    def step(p, x, y):
        value, g = jax.value_and_grad(loss)(p, x, y)
        return jax.tree_util.tree_map(lambda a, b: a - lr * b, p, g), value
    stepj = jax.jit(step, donate_argnums=0)
    st = {"p": {k: jnp.array(v) for k, v in P.items()}}
    xd, yd = jnp.asarray(x), jnp.asarray(y)
    first = [True]

    def f():
        st["p"], value = stepj(st["p"], xd, yd)
        v = float(value)
        if first[0]:
            first[0] = False
            return [np.float32(v)] + [np.asarray(st["p"][k]) for k in names]
        return v
    return f


def torch_train_step(torch, loss, P, x, y, lr, names, compiled):
    """One torch.optim.SGD step on loss(p, x, y) per call; torch.compile'd when compiled."""
    np = np_mod()
    pt = {k: torch.tensor(v, requires_grad=True) for k, v in P.items()}
    opt = torch.optim.SGD(list(pt.values()), lr=lr)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y).long()
    g = compile_torch(torch, loss) if compiled else loss
    first = [True]

    def f():
        opt.zero_grad(set_to_none=True)
        value = g(pt, xt, yt)
        value.backward()
        opt.step()
        v = value.item()
        if first[0]:
            first[0] = False
            return [np.float32(v)] + [pt[k].detach().numpy().copy() for k in names]
        return v
    return f


# ------------------------------------------------------------------ workloads
# Each returns {impl: (callable, result_fn)} where callable() does one timed call and
# result_fn(value) turns its return value into NumPy arrays for the check; plus the
# check tolerance.  Peers raise Skip.


def w1(args):
    np = np_mod()
    n = 1 << 20
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n).astype(np.float32)
    a, b = np.float32(0.7), np.float32(0.1)
    impls = {}

    def rl():
        from rlxc import Func

        def build(s):
            xx, aa, bb = s.input("x", (n,)), s.input("a", ()), s.input("b", ())
            return ((xx * aa + bb).tanh() * xx.sigmoid()).sum()
        j = Func("w1_fused", build).jit()
        return lambda: j.run(x, a, b)[0]
    impls["rlxc"] = rl

    def nmp():
        return lambda: np.sum(np.tanh(x * a + b) * (1.0 / (1.0 + np.exp(-x))))
    impls["numpy"] = nmp

    def jx():
        jax = peer("jax")
        jnp = jax.numpy
        f = jax.jit(lambda x, a, b: jnp.sum(jnp.tanh(x * a + b) * jax.nn.sigmoid(x)))
        xd, ad, bd = jnp.asarray(x), jnp.asarray(a), jnp.asarray(b)
        return lambda: f(xd, ad, bd).block_until_ready()
    impls["jax"] = jx

    def tch(compiled):
        def make():
            torch = peer("torch")

            def f(x, a, b):
                return torch.sum(torch.tanh(x * a + b) * torch.sigmoid(x))
            g = compile_torch(torch, f) if compiled else f
            xt, at, bt = torch.from_numpy(x), torch.tensor(a), torch.tensor(b)
            return lambda: g(xt, at, bt)
        return make
    impls["torch"] = tch(False)
    impls["torch.compile"] = tch(True)
    tol = dict(rtol=2e-4, atol=1e-5 * float(np.abs(x).sum()))
    return impls, tol, {}


def w2(args):
    np = np_mod()
    n = 1024
    rng = np.random.default_rng(1)
    A = rng.standard_normal((n, n)).astype(np.float32)
    B = rng.standard_normal((n, n)).astype(np.float32)
    impls = {}

    def rl():
        from rlxc import Func

        j = Func("w2_sgemm", lambda s: s.input("a", (n, n)) @ s.input("b", (n, n))).jit()
        return lambda: j.run(A, B)[0]
    impls["rlxc"] = rl
    impls["numpy"] = lambda: (lambda: A @ B)

    def jx():
        jax = peer("jax")
        jnp = jax.numpy
        f = jax.jit(lambda a, b: a @ b)
        ad, bd = jnp.asarray(A), jnp.asarray(B)
        return lambda: f(ad, bd).block_until_ready()
    impls["jax"] = jx

    def tch(compiled):
        def make():
            torch = peer("torch")
            f = (lambda a, b: torch.mm(a, b))
            g = compile_torch(torch, f) if compiled else f
            at, bt = torch.from_numpy(A), torch.from_numpy(B)
            return lambda: g(at, bt)
        return make
    impls["torch"] = tch(False)
    impls["torch.compile"] = tch(True)
    return impls, dict(rtol=1e-3, atol=2e-3), {"flops": 2 * n ** 3}


def w3(args):
    np = np_mod()
    P = init_params()
    x, y = batch()
    impls = {}

    def rl():
        j = rlxc_mlp("w3_mlp_loss", BATCH).with_params(P).jit()
        return lambda: j.run(x, y)[0]
    impls["rlxc"] = rl

    def nmp():
        def f():
            logits = np_forward(P, x)[-1]
            m = logits.max(axis=-1, keepdims=True)
            z = logits - m
            logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
            return -logp[np.arange(BATCH), y].mean()
        return f
    impls["numpy"] = nmp

    def jx():
        jax = peer("jax")
        _, loss = jax_mlp(jax)
        f = jax.jit(loss)
        pd = {k: jax.numpy.asarray(v) for k, v in P.items()}
        xd, yd = jax.numpy.asarray(x), jax.numpy.asarray(y)
        return lambda: f(pd, xd, yd).block_until_ready()
    impls["jax"] = jx

    def tch(compiled):
        def make():
            torch = peer("torch")
            _, loss = torch_mlp(torch)
            pt = {k: torch.from_numpy(v) for k, v in P.items()}
            xt, yt = torch.from_numpy(x), torch.from_numpy(y).long()
            return torch_no_grad(torch, loss, (pt, xt, yt), compiled)
        return make
    impls["torch"] = tch(False)
    impls["torch.compile"] = tch(True)
    return impls, dict(rtol=1e-4, atol=1e-5), {"flops": mlp_flops()}


def mlp_flops() -> int:
    """The MLP forward's GEMM flops (2 x batch x in x out per layer; the bias, ReLU and
    loss add about 0.1% more)."""
    return sum(2 * BATCH * a * b for a, b in zip(SIZES, SIZES[1:]))


LR = 0.01


def w4(args):
    """Training step; the check compares the loss and the params after the first step."""
    np = np_mod()
    P = init_params()
    x, y = batch()
    impls = {}

    def rl():
        from rlxc.optim import SGD

        tr = rlxc_mlp("w4_mlp", BATCH).with_params(P).trainer(SGD(LR))
        return rlxc_train_step(tr, {"x": x, "y": y}, PNAMES)
    impls["rlxc"] = rl

    def nmp():
        p = {k: v.copy() for k, v in P.items()}
        first = [True]

        def f():
            hs = np_forward(p, x)
            loss, d = np_loss_grad_logits(hs[-1], y)
            for i in reversed(range(len(SIZES) - 1)):
                gw = hs[i].T @ d
                gb = d.sum(axis=0)
                if i:
                    d = (d @ p[f"w{i}"].T) * (hs[i] > 0)
                p[f"w{i}"] -= LR * gw
                p[f"b{i}"] -= LR * gb
            if first[0]:
                first[0] = False
                return [np.float32(loss)] + [p[k].copy() for k in PNAMES]
            return loss
        return f
    impls["numpy"] = nmp

    def jx():
        jax = peer("jax")
        _, loss = jax_mlp(jax)
        return jax_train_step(jax, loss, P, x, y, LR, PNAMES)
    impls["jax"] = jx

    def tch(compiled):
        def make():
            torch = peer("torch")
            _, loss = torch_mlp(torch)
            return torch_train_step(torch, loss, P, x, y, LR, PNAMES, compiled)
        return make
    impls["torch"] = tch(False)
    impls["torch.compile"] = tch(True)
    return impls, dict(rtol=1e-4, atol=2e-5), {"stateful": True}


def w5(args):
    np = np_mod()
    P = init_params()
    x, y = batch()
    impls = {}

    def rl():
        g = rlxc_mlp("w5_mlp1", 1).grad_all().vmap(["x", "y"], BATCH).with_params(P)
        j = g.jit()
        xb, yb = x.reshape(BATCH, 1, SIZES[0]), y.reshape(BATCH, 1)
        return lambda: j.run(xb, yb)
    impls["rlxc"] = rl

    def nmp():
        def f():
            hs = np_forward(P, x)
            _, d = np_loss_grad_logits(hs[-1], y, mean=False)
            out = {}
            for i in reversed(range(len(SIZES) - 1)):
                out[f"w{i}"] = hs[i][:, :, None] * d[:, None, :]
                out[f"b{i}"] = d
                if i:
                    d = (d @ P[f"w{i}"].T) * (hs[i] > 0)
            return [out[k] for k in PNAMES]
        return f
    impls["numpy"] = nmp

    def jx():
        jax = peer("jax")
        jnp = jax.numpy
        _, loss = jax_mlp(jax)

        def one(p, x, y):
            return loss(p, x[None], y[None])
        f = jax.jit(jax.vmap(jax.grad(one), in_axes=(None, 0, 0)))
        pd = {k: jnp.asarray(v) for k, v in P.items()}
        xd, yd = jnp.asarray(x), jnp.asarray(y)

        def run():
            r = f(pd, xd, yd)
            jax.block_until_ready(r)
            return [r[k] for k in PNAMES]
        return run
    impls["jax"] = jx

    def tch(compiled):
        def make():
            torch = peer("torch")
            from torch.func import grad, vmap

            _, loss = torch_mlp(torch)

            def one(p, x, y):
                return loss(p, x[None], y[None])
            f = vmap(grad(one), in_dims=(None, 0, 0))
            g = compile_torch(torch, f) if compiled else f
            pt = {k: torch.from_numpy(v) for k, v in P.items()}
            xt, yt = torch.from_numpy(x), torch.from_numpy(y).long()

            def run():
                r = g(pt, xt, yt)
                return [r[k] for k in PNAMES]
            return run
        return make
    impls["torch"] = tch(False)
    impls["torch.compile"] = tch(True)
    return impls, dict(rtol=1e-3, atol=1e-6), {}


def w6(args):
    np = np_mod()
    n = 256
    rng = np.random.default_rng(3)
    W = (rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32)
    x = rng.standard_normal(n).astype(np.float32)
    v = rng.standard_normal(n).astype(np.float32)
    impls = {}

    def rl():
        from rlxc import Func

        def build(s):
            return (s.param("W", (n, n)) @ s.input("x", (n,))).tanh().sum()
        h = Func("w6_f", build).with_param("W", W).hvp(["x"])
        names = h.input_names()
        j = h.jit()
        assert names == ["x", "tangent_x"], names
        return lambda: j.run(x, v)[-1]
    impls["rlxc"] = rl

    def nmp():
        def f():
            t = np.tanh(W @ x)
            s = 1.0 - t * t
            return W.T @ ((-2.0 * t * s) * (W @ v))
        return f
    impls["numpy"] = nmp

    def jx():
        jax = peer("jax")
        jnp = jax.numpy

        def fx(W, x):
            return jnp.sum(jnp.tanh(W @ x))

        def hvp(W, x, v):
            return jax.jvp(lambda x_: jax.grad(fx, argnums=1)(W, x_), (x,), (v,))[1]
        f = jax.jit(hvp)
        Wd, xd, vd = jnp.asarray(W), jnp.asarray(x), jnp.asarray(v)
        return lambda: f(Wd, xd, vd).block_until_ready()
    impls["jax"] = jx

    def tch(compiled):
        def make():
            torch = peer("torch")
            from torch.func import grad, jvp

            Wt, xt, vt = (torch.from_numpy(a) for a in (W, x, v))

            def fx(x_):
                return torch.sum(torch.tanh(Wt @ x_))

            def hvp(x_, v_):
                return jvp(grad(fx), (x_,), (v_,))[1]
            g = compile_torch(torch, hvp) if compiled else hvp
            return lambda: g(xt, vt)
        return make
    impls["torch"] = tch(False)
    impls["torch.compile"] = tch(True)
    return impls, dict(rtol=1e-4, atol=1e-5), {}


def w8(args):
    np = np_mod()
    P = init_params()
    x = batch(1)[0]
    impls = {}

    def rl():
        j = rlxc_mlp("w8_mlp1", 1, loss=False).with_params(P).jit()
        return lambda: j.run(x)[0]
    impls["rlxc"] = rl
    impls["numpy"] = lambda: (lambda: np_forward(P, x)[-1])

    def jx():
        jax = peer("jax")
        logits, _ = jax_mlp(jax)
        f = jax.jit(logits)
        pd = {k: jax.numpy.asarray(v) for k, v in P.items()}
        xd = jax.numpy.asarray(x)
        return lambda: f(pd, xd).block_until_ready()
    impls["jax"] = jx

    def tch(compiled):
        def make():
            torch = peer("torch")
            logits, _ = torch_mlp(torch)
            pt = {k: torch.from_numpy(v) for k, v in P.items()}
            return torch_no_grad(torch, logits, (pt, torch.from_numpy(x)), compiled)
        return make
    impls["torch"] = tch(False)
    impls["torch.compile"] = tch(True)
    return impls, dict(rtol=1e-4, atol=1e-5), {}


WORKLOAD_FNS = {"W1": (w1, "sum(tanh(x*a+b)*sigmoid(x)), 1M"),
                "W2": (w2, "sgemm 1024^3"),
                "W3": (w3, "MLP fwd + loss, b128"),
                "W4": (w4, "MLP train step (SGD), b128"),
                "W5": (w5, "per-example grads, vmap(grad), b128"),
                "W6": (w6, "HVP sum(tanh(W@x)), 256"),
                "W8": (w8, "MLP fwd, batch 1"),
                # issue 15: transformer workloads (benchmarks/compare_models.py)
                "W10": (lambda a: _models().w10(a, sys.modules[__name__]),
                        "transformer block value_and_grad"),
                "W11": (lambda a: _models().w11(a, sys.modules[__name__]),
                        "causal attention fwd 1x8x2048x64")}


WORKLOAD_FNS["W9"] = (lambda args: w9(args), "LeNet train step (SGD), b64")


# ------------------------------------------------------------------ W9: a LeNet training step

CNN_BATCH, CNN_LR = 64, 0.01
CNN_SHAPES = {"c1w": (6, 3, 5, 5), "c1b": (6,), "c2w": (16, 6, 5, 5), "c2b": (16,),
              "f1w": (400, 120), "f1b": (120,), "f2w": (120, 10), "f2b": (10,)}


def cnn_params(seed=0):
    np = np_mod()
    rng = np.random.default_rng(seed)
    p = {}
    for k, shp in CNN_SHAPES.items():
        fan_in = int(np.prod(shp[1:])) if k.startswith("c") and k.endswith("w") else shp[0]
        scale = 1 / np.sqrt(fan_in) if k.endswith("w") else 0.01
        p[k] = (rng.standard_normal(shp) * scale).astype(np.float32)
    return p


def w9(args):
    """LeNet training step; the check compares the loss and the params after step one."""
    np = np_mod()
    P = cnn_params()
    rng = np.random.default_rng(9)
    x = rng.standard_normal((CNN_BATCH, 3, 32, 32)).astype(np.float32)
    y = rng.integers(0, 10, CNN_BATCH).astype(np.int32)
    names = list(CNN_SHAPES)
    impls = {}

    def rl():
        from rlxc import Func
        from rlxc.optim import SGD

        def build(s):
            p = {k: s.param(k, shp) for k, shp in CNN_SHAPES.items()}
            h = s.input("x", x.shape).conv2d(p["c1w"], p["c1b"]).relu().max_pool2d(2)
            h = h.conv2d(p["c2w"], p["c2b"]).relu().max_pool2d(2)
            h = h.reshape(CNN_BATCH, 400).linear(p["f1w"], p["f1b"]).relu()
            return h.linear(p["f2w"], p["f2b"]).cross_entropy(s.input("y", (CNN_BATCH,), "i32"))
        tr = Func("w9_lenet", build).with_params(P).trainer(SGD(CNN_LR))
        return rlxc_train_step(tr, {"x": x, "y": y}, names)
    impls["rlxc"] = rl

    impls["numpy"] = skipped("no NumPy CNN (convolution is not a NumPy op)")

    def jx():
        jax = peer("jax")
        jnp = jax.numpy

        def conv(h, w, b):
            h = jax.lax.conv_general_dilated(h, w, (1, 1), "VALID",
                                             dimension_numbers=("NCHW", "OIHW", "NCHW"))
            return h + b[None, :, None, None]

        def pool(h):
            return jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2),
                                         "VALID")

        def loss(p, x, y):
            h = pool(jax.nn.relu(conv(x, p["c1w"], p["c1b"])))
            h = pool(jax.nn.relu(conv(h, p["c2w"], p["c2b"])))
            h = jax.nn.relu(h.reshape(x.shape[0], 400) @ p["f1w"] + p["f1b"])
            logp = jax.nn.log_softmax(h @ p["f2w"] + p["f2b"], axis=-1)
            return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))
        return jax_train_step(jax, loss, P, x, y, CNN_LR, names)
    impls["jax"] = jx

    def tch(compiled):
        def make():
            torch = peer("torch")
            F = torch.nn.functional

            def loss(p, x, y):
                h = F.max_pool2d(F.relu(F.conv2d(x, p["c1w"], p["c1b"])), 2)
                h = F.max_pool2d(F.relu(F.conv2d(h, p["c2w"], p["c2b"])), 2)
                h = F.relu(torch.addmm(p["f1b"], h.reshape(x.shape[0], 400), p["f1w"]))
                return F.cross_entropy(torch.addmm(p["f2b"], h, p["f2w"]), y)
            return torch_train_step(torch, loss, P, x, y, CNN_LR, names, compiled)
        return make
    impls["torch"] = tch(False)
    impls["torch.compile"] = tch(True)
    return impls, dict(rtol=1e-3, atol=1e-4), {"stateful": True}


def _models():
    sys.path.insert(0, HERE)
    try:
        import compare_models
    finally:
        sys.path.remove(HERE)
    return compare_models


# ------------------------------------------------------------------ running one workload

def to_numpy(v):
    np = np_mod()
    if isinstance(v, (list, tuple)):
        return [to_numpy(a) for a in v]
    if hasattr(v, "detach"):
        return v.detach().numpy()
    return np.asarray(v)


def check(name, impl, got, ref, tol):
    np = np_mod()
    got, ref = to_numpy(got), to_numpy(ref)
    if not isinstance(ref, list):
        got, ref = [got], [ref]
    if len(got) != len(ref):
        raise AssertionError(f"{name}/{impl}: {len(got)} results, rlxc has {len(ref)}")
    for k, (g, r) in enumerate(zip(got, ref)):
        g = np.asarray(g, np.float64).reshape(np.shape(r))
        np.testing.assert_allclose(g, np.asarray(r, np.float64), err_msg=f"{name}/{impl}[{k}]",
                                   **tol)


def calibrate(fn, target=2e-3):
    """Calls per sample: enough back-to-back calls to fill ~2 ms.  The fastest of 5
    calls is the estimate: one call stretched by a load spike once made k = 1 for a
    100 us workload, so every sample timed a cold thread team after the pause."""
    dts = []
    for _ in range(5):
        t0 = time.perf_counter()
        fn()
        dts.append(time.perf_counter() - t0)
    dt = min(dts)
    return 1 if dt >= target else min(1000, int(target / max(dt, 1e-7)) + 1)


def _rlxc_thread_share() -> str:
    """How rlxc's thread governor split this workload's calls (runtime/cpu.py)."""
    try:
        from rlxc.backends import _libs
    except ImportError:
        return ""
    parts = []
    for lib in list(_libs.values()):
        g = getattr(lib, "governor", None)
        if g is not None and g.calls:
            parts.append(f"{100 * g.ones / g.calls:.0f}% of {g.calls} calls on 1 thread")
        if g is not None:
            g.calls = g.ones = 0
    return ", ".join(parts)


def balanced_orders(items: list) -> list:
    """Orders of `items` (a Williams design) in which every item directly follows every
    other one equally often: what ran just before a sample matters (OpenBLAS's worker
    threads spin for ~0.1 s after a call and slow whatever runs next on a 2-core
    machine), and a plain rotation keeps each item's predecessor the same in every
    repetition (with rlxc, numpy, jax, torch: jax always ran right after NumPy)."""
    n = len(items)
    if n < 3:
        return [items[r:] + items[:r] for r in range(n)] or [items]
    seq, lo, hi = [0], 1, n - 1
    while lo <= hi:
        seq.append(lo)
        lo += 1
        if lo <= hi:
            seq.append(hi)
            hi -= 1
    rows = [[items[(s + r) % n] for s in seq] for r in range(n)]
    return rows if n % 2 == 0 else rows + [row[::-1] for row in rows]


def run_workload(key, args):
    fn, title = WORKLOAD_FNS[key]
    makers, tol, info = fn(args)
    calls, notes, reps = {}, {}, {}
    ref = None
    for impl in IMPLS:
        if impl == "torch.compile" and args.no_compile:
            notes[impl] = "skipped (--no-compile)"
            continue
        t0 = time.perf_counter()
        try:
            call = first_call(makers[impl], f"{impl} build")
            out = first_call(call, f"{impl} first call")
        except Skip as e:
            if impl == "rlxc":
                raise
            notes[impl] = str(e)
            continue
        build = time.perf_counter() - t0
        if impl == "rlxc":
            ref = out
        else:
            check(key, impl, out, ref, tol)  # a wrong answer is a harness bug: fail loudly
        calls[impl] = call
        notes[impl] = f"first call {build:.2f} s"
    for impl, call in calls.items():
        for _ in range(args.warmup):
            call()
        reps[impl] = calibrate(call)
    samples = {impl: [] for impl in calls}
    orders = balanced_orders(list(calls))
    for r in range(args.runs):
        for impl in orders[r % len(orders)]:
            call, k = calls[impl], reps[impl]
            call()  # untimed: brings this implementation's data back into the caches
            t0 = time.perf_counter()
            for _ in range(k):
                call()
            samples[impl].append((time.perf_counter() - t0) / k)
            if args.gap:
                time.sleep(args.gap)
    res = {"title": title, "impls": {}, "notes": notes, "info": info}
    share = _rlxc_thread_share()
    if share and "rlxc" in notes:
        notes["rlxc"] += f"; {share}"
    for impl, ts in samples.items():
        res["impls"][impl] = {"median": statistics.median(ts), "min": min(ts), "k": reps[impl],
                              "n": len(ts)}
    return res


# ------------------------------------------------------------------ W7: fresh processes

_W7_RLXC = r"""
import time, os, sys
t0 = time.perf_counter()
import numpy as np
sys.path.insert(0, {root!r})
sys.path.insert(0, {here!r})
import rlxc
from rlxc.optim import SGD
from compare import rlxc_mlp, init_params, batch, LR, use_cpu
use_cpu(os.environ.get("RLXC_BENCH_CPU", "native"))
t1 = time.perf_counter()
tr = rlxc_mlp("w4_mlp", 128).with_params(init_params()).trainer(SGD(LR))
t2 = time.perf_counter()
x, y = batch()
loss = tr.step({{"x": x, "y": y}})
t3 = time.perf_counter()
print("RESULT", {{"loss": loss, "import": t1 - t0, "build": t2 - t1, "step": t3 - t2}})
"""

_W7_JAX = r"""
import time, os, sys
t0 = time.perf_counter()
import numpy as np
import jax
sys.path.insert(0, {here!r})
jax.config.update("jax_platforms", "cpu")
if {cache!r}:
    jax.config.update("jax_compilation_cache_dir", {cache!r})
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
else:
    jax.config.update("jax_enable_compilation_cache", False)
from compare import jax_mlp, init_params, batch, LR
t1 = time.perf_counter()
_, loss = jax_mlp(jax)
def step(p, x, y):
    value, g = jax.value_and_grad(loss)(p, x, y)
    return jax.tree_util.tree_map(lambda a, b: a - LR * b, p, g), value
stepj = jax.jit(step, donate_argnums=0)
p = {{k: jax.numpy.array(v) for k, v in init_params().items()}}
x, y = batch()
t2 = time.perf_counter()
p, value = stepj(p, jax.numpy.asarray(x), jax.numpy.asarray(y))
v = float(value)
t3 = time.perf_counter()
print("RESULT", {{"loss": v, "import": t1 - t0, "build": t2 - t1, "step": t3 - t2}})
"""

_W7_TORCH = r"""
import time, os, sys
t0 = time.perf_counter()
import numpy as np
import torch
sys.path.insert(0, {here!r})
torch.set_num_threads(int(os.environ["RLXC_NUM_THREADS"]))
from compare import torch_mlp, init_params, batch, LR
t1 = time.perf_counter()
_, loss = torch_mlp(torch)
p = {{k: torch.tensor(v, requires_grad=True) for k, v in init_params().items()}}
opt = torch.optim.SGD(list(p.values()), lr=LR)
x, y = batch()
t2 = time.perf_counter()
value = loss(p, torch.from_numpy(x), torch.from_numpy(y).long())
value.backward(); opt.step()
v = value.item()
t3 = time.perf_counter()
print("RESULT", {{"loss": v, "import": t1 - t0, "build": t2 - t1, "step": t3 - t2}})
"""


def _fresh(script, env):
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", _cpuid_cap_prelude() + script],
                       capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise Skip(f"exit {p.returncode}: {(p.stderr.strip().splitlines() or [''])[-1][:160]}")
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    import ast

    d = ast.literal_eval(line[7:])
    d["wall"] = wall
    return d


def run_w7(args):
    runs = args.w7_runs
    res = {"title": "time to first W4 step, fresh process", "rows": {}, "notes": {}}
    base_env = dict(os.environ)
    tmp = tempfile.mkdtemp(prefix="rlxc-w7-")
    # rlxc starts as installed: its .pyc written (pip does that for a wheel, and jax's and
    # torch's are), else an editable checkout under PYTHONDONTWRITEBYTECODE recompiles its
    # sources in every fresh process (rlxc/bytecode.py)
    subprocess.run([sys.executable, "-m", "rlxc.bytecode"], cwd=ROOT, check=False,
                   capture_output=True)   # an older rlxc without it: as before
    losses = {}

    def rows(name, script_fn, cold_env, warm_env=None, prime=None):
        cold, warm = [], []
        try:
            for r in range(runs):
                env = cold_env(r)
                d = _fresh(script_fn(env), env)
                cold.append(d)
            if warm_env is not None:
                env = warm_env()
                if prime:
                    _fresh(script_fn(env), env)
                for r in range(runs):
                    warm.append(_fresh(script_fn(env), env))
        except Skip as e:
            res["notes"][name] = str(e)
            return
        losses[name] = cold[0]["loss"]
        for kind, ds in (("cold", cold), ("warm", warm)):
            if ds:
                walls = [d["wall"] for d in ds]
                med = sorted(ds, key=lambda d: d["wall"])[len(ds) // 2]
                res["rows"][f"{name} {kind}"] = {
                    "median": statistics.median(walls), "min": min(walls),
                    "split": {k: med[k] for k in ("import", "build", "step")}}

    # rlxc: cold = an empty RLXC_CACHE_DIR per run (the toolchain's sgemm objects,
    # RLXC_RUNTIME_DIR, built once per machine, present); warm = a cache filled by a
    # first run; "first use" = both empty (the sgemm object is built too)
    def rl_env(d, runtime=None, prebuilt=None):
        e = dict(base_env)
        e["RLXC_CACHE_DIR"] = d
        if runtime:
            e["RLXC_RUNTIME_DIR"] = runtime
        if prebuilt is not None:
            e["RLXC_PREBUILT_DIR"] = prebuilt
        return e
    rl_script = (lambda env: _W7_RLXC.format(root=ROOT, here=HERE))
    _fresh(rl_script(None), rl_env(os.path.join(tmp, "rlxc-prime")))  # runtime objects
    rows("rlxc", rl_script, lambda r: rl_env(os.path.join(tmp, f"rlxc-cold-{r}")),
         lambda: rl_env(os.path.join(tmp, "rlxc-warm")), prime=True)
    rows("rlxc first use", rl_script,
         lambda r: rl_env(os.path.join(tmp, f"rlxc-first-{r}"),
                          os.path.join(tmp, f"rlxc-runtime-{r}")))
    rows("rlxc first use, nothing prebuilt", rl_script,
         lambda r: rl_env(os.path.join(tmp, f"rlxc-first-np-{r}"),
                          os.path.join(tmp, f"rlxc-runtime-np-{r}"), prebuilt=""))
    try:
        peer("jax")
        jx_script = (lambda env: _W7_JAX.format(here=HERE, cache=env.get("_JAXCACHE", "")))

        def jx_env(d):
            e = dict(base_env)
            e["_JAXCACHE"] = d
            return e
        rows("jax", jx_script, lambda r: jx_env(""),
             lambda: jx_env(os.path.join(tmp, "jax-warm")), prime=True)
    except Skip as e:
        res["notes"]["jax"] = str(e)
    try:
        peer("torch")
        rows("torch", lambda env: _W7_TORCH.format(here=HERE), lambda r: dict(base_env))
    except Skip as e:
        res["notes"]["torch"] = str(e)
    res["rows"] = {k.replace("first use cold", "first use (prebuilt sgemm)")
                   .replace("nothing prebuilt cold", "no prebuilt (+sgemm build)"): v
                   for k, v in res["rows"].items()}
    ref = losses.get("rlxc")
    for k, v in losses.items():
        if ref is not None and abs(v - ref) > 1e-4 * max(1.0, abs(ref)):
            raise AssertionError(f"W7: {k} first loss {v} != rlxc {ref}")
    shutil.rmtree(tmp, ignore_errors=True)
    return res


# ------------------------------------------------------------------ report

def fmt_t(s):
    if s >= 1.0:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.1f} us"


def verdicts(key, res):
    out = []
    if key not in TARGETS:
        return out
    im = res["impls"]
    base = im["rlxc"]["median"]
    for who, need, text in TARGETS[key]:
        if who == "best":
            peers = [v["median"] for k, v in im.items() if k != "rlxc"]
            if not peers:
                continue
            ratio = min(peers) / base
        elif who in im:
            ratio = im[who]["median"] / base
        else:
            out.append(f"{text}: n/a ({who} missing)")
            continue
        out.append(f"{text}: {ratio:.2f}x {'MET' if ratio >= need else 'MISSED'}")
    return out


def print_table(results, w7, args, peak=None):
    """peak: the FMA peak in GFLOP/s at the run's thread count (fma_peak_line), which the
    GFLOP/s of a workload with a flop count are given as a percentage of."""
    cols = list(IMPLS)
    print()
    print(f"median (min) per call; ratio = peer median / rlxc median (> 1: rlxc faster); "
          f"{args.threads} threads each, {args.runs} samples" +
          (f"; GFLOP/s (% of the {peak:.0f} GFLOP/s FMA peak)" if peak else ""))
    head = f"{'':4} {'workload':36}" + "".join(f"{c:>24}" for c in cols)
    print(head)
    print("-" * len(head))
    for key, res in results.items():
        im = res["impls"]
        base = im["rlxc"]["median"]
        cells, ratios, gflops = [], [], []
        for c in cols:
            if c not in im:
                cells.append("-")
                ratios.append("")
                gflops.append("")
                continue
            med, mn = im[c]["median"], im[c]["min"]
            cells.append(f"{fmt_t(med)} ({fmt_t(mn)})")
            ratios.append("" if c == "rlxc" else f"{med / base:.2f}x")
            if "flops" in res["info"]:
                g = res['info']['flops'] / med / 1e9
                gflops.append(f"{g:.0f} GFLOP/s" + (f" ({100 * g / peak:.0f}%)" if peak else ""))
        print(f"{key:4} {res['title'][:36]:36}" + "".join(f"{x:>24}" for x in cells))
        print(f"{'':41}" + "".join(f"{x:>24}" for x in ratios))
        if "flops" in res["info"]:
            print(f"{'':41}" + "".join(f"{x:>24}" for x in gflops))
    if w7 is not None:
        for name, row in w7["rows"].items():
            sp = row["split"]
            print(f"{'W7':4} {name:36}{fmt_t(row['median']) + ' (' + fmt_t(row['min']) + ')':>24}"
                  f"   in-process: import {sp['import']:.2f} s, build {sp['build']:.2f} s, "
                  f"first step {sp['step']:.2f} s")
    print()
    print("targets:")
    for key, res in results.items():
        for v in verdicts(key, res):
            print(f"  {key} {v}")
    if w7 is not None:
        r = w7["rows"]
        if "rlxc cold" in r and "jax cold" in r:
            q = r["rlxc cold"]["median"] / r["jax cold"]["median"]
            print(f"  W7 cold <= JAX: rlxc/jax {q:.2f} {'MET' if q <= 1.0 else 'MISSED'}")
        if "rlxc warm" in r and "jax warm" in r:
            q = r["rlxc warm"]["median"] / r["jax warm"]["median"]
            print(f"  W7 warm <= 0.5x JAX: rlxc/jax {q:.2f} {'MET' if q <= 0.5 else 'MISSED'}")
        first = "rlxc first use (prebuilt sgemm)"
        if first in r and "jax cold" in r:
            q = r[first]["median"] / r["jax cold"]["median"]
            print(f"  W7 first use <= JAX cold: rlxc/jax {q:.2f} "
                  f"{'MET' if q <= 1.0 else 'MISSED'}")
        if "rlxc cold" in r:
            b = r["rlxc cold"]["split"]["build"]
            print(f"  W4 cold compile <= 1.0 s: {b:.2f} s {'MET' if b <= 1.0 else 'MISSED'}")
    print()
    print("notes:")
    for key, res in results.items():
        for impl, n in res["notes"].items():
            k = res["impls"].get(impl, {}).get("k", 1)
            print(f"  {key} {impl}: {n}" + (f"; {k} calls per sample" if k > 1 else ""))
    if w7 is not None:
        for impl, n in w7["notes"].items():
            print(f"  W7 {impl}: {n}")


FLOP_WORKLOADS = ("W2", "W3")   # the workloads whose info has a flop count (GFLOP/s)


def fma_peak_line(cpu: str, threads: int):
    """(peak GFLOP/s on `threads` threads, the median of fma_peak's runs, or None; header
    line): the float32 FMA peak at the vector width of rlxc's sgemm for `cpu`
    (benchmarks/fma_peak.py), which the AVX2 peers of --peer-isa avx2 share."""
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    try:
        import fma_peak
        vl, g = fma_peak.summary(cpu, threads)
    except Exception as e:  # noqa: BLE001  (a missing cc: the ratios stand without it)
        return None, f"FMA peak: not measured ({type(e).__name__}: {str(e).splitlines()[0]})"
    per = ", ".join(f"{t} thread{'s' if t > 1 else ''} {m:.0f} (best {b:.0f})"
                    for t, (m, b) in g.items())
    return g[max(g)][0], (f"FMA peak ({fma_peak.width_name(vl)}, the width of rlxc --cpu "
                          f"{cpu}): {per} GFLOP/s (benchmarks/fma_peak.py: median of 5)")


def torch_info(torch) -> str:
    par = [ln.strip() for ln in torch.__config__.parallel_info().splitlines()
           if ln.startswith(("ATen parallel backend", "ATen/Parallel"))]
    import re

    blas = re.findall(r"BLAS_INFO=(\w+)", torch.__config__.show())
    return (f"{torch.get_num_threads()} intra-op threads, "
            f"{par[-1] if par else 'parallel backend ?'}, BLAS {blas[0] if blas else '?'}")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def sgemm_line(cpu: str) -> str:
    try:
        from rlxc.lowering.cpu.sgemm_kernels import describe_params, sgemm_params
    except ImportError:
        return "?"
    return describe_params(sgemm_params(cpu))


def versions():
    out = [f"python {platform.python_version()}"]
    np = np_mod()
    out.append(f"numpy {np.__version__}")
    for name in ("jax", "torch"):
        try:
            out.append(f"{name} {peer(name).__version__}")
        except Skip:
            out.append(f"{name} MISSING")
    try:
        import llvmlite
        import xdsl  # noqa: F401
        from importlib.metadata import version

        out.append(f"llvmlite {llvmlite.__version__}, xdsl {version('xdsl')}")
    except Exception:  # noqa: BLE001
        pass
    return ", ".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(WORKLOADS))
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--w7-runs", type=int, default=3)
    ap.add_argument("--gap", type=float, default=0.15,
                    help="seconds of sleep after each sample, so that the spinning worker "
                    "threads a library leaves behind (OpenBLAS: a whole core for ~0.11 s "
                    "after each threaded call, measured on Zen 3; libgomp, Eigen) are "
                    "asleep before the next one is timed")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--cpu", default="native",
                    help="CPU rlxc compiles for (an --cpu of rlxc compile, or portable)")
    ap.add_argument("--blas-coretype", default=None,
                    help="OPENBLAS_CORETYPE for this run (e.g. Haswell: what OpenBLAS runs "
                    "on an AVX2 CPU); default: unset")
    ap.add_argument("--peer-isa", default="native", choices=("native", "avx2"),
                    help="restrict every peer (OpenBLAS, MKL, ATen, oneDNN, XLA) to this "
                    "ISA for the run, to compare AVX2 rlxc builds on an AVX-512 host")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)
    if args.runs < 20:
        ap.error("--runs must be >= 20 (each result is a median of at least 20 samples)")
    only = [w.strip().upper() for w in args.only.split(",") if w.strip()]
    bad = [w for w in only if w not in WORKLOADS]
    if bad:
        ap.error(f"unknown workloads {bad}; valid: {list(WORKLOADS)}")
    _setup_threads(args.threads)
    _setup_peer_isa(args.peer_isa, args.blas_coretype)
    _setup_cpuid_cap(args.peer_isa)     # before NumPy loads, before any thread starts
    sys.path.insert(0, ROOT)
    np = np_mod()
    import rlxc  # noqa: F401

    cpu = use_cpu(args.cpu)
    os.environ["RLXC_BENCH_CPU"] = cpu   # the W7 subprocesses
    print(f"{time.strftime('%Y-%m-%d %H:%M')}  {platform.machine()}, {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.2f}; {versions()}")
    print(f"CPU: {cpu_model()}; rlxc --cpu {args.cpu}"
          f"{f' (= {cpu})' if cpu != args.cpu else ''}: {sgemm_line(cpu)}")
    if _CPUID_CAP["on"] and cpu == "native":
        print("NOTE: --peer-isa avx2 with rlxc --cpu native: rlxc's LLVM reads the capped "
              "cpuid (AVX2) but its sgemm choice reads /proc/cpuinfo (AVX-512); pass "
              "--cpu znver3 (or portable) to compare AVX2 builds")
    print(f"threads: {args.threads} each (rlxc RLXC_NUM_THREADS, NumPy BLAS via threadpoolctl, "
          f"torch.set_num_threads, XLA pool = affinity {len(os.sched_getaffinity(0))} cores"
          f"{', Eigen pool off' if args.threads == 1 else ''})")
    for name in ("jax", "torch"):
        try:
            peer(name)
        except Skip as e:
            print(f"NOTE: {e}; its columns stay empty")
    results = {}
    with BlasLimit(args.threads):
        print(f"NumPy BLAS: {blas_info()}")
        if "torch" in _MODS and not isinstance(_MODS["torch"], Exception):
            print(f"torch: {torch_info(_MODS['torch'])}")
        for line in peer_isa_report(args):
            print(line, flush=True)
        peak = None
        if any(k in FLOP_WORKLOADS for k in only):
            peak, line = fma_peak_line(cpu, args.threads)
            print(line, flush=True)
        for key in only:
            if key == "W7":
                continue
            print(f"running {key} ...", flush=True)
            try:
                results[key] = run_workload(key, args)
            except Exception:  # noqa: BLE001
                traceback.print_exc()
                print(f"{key} FAILED (see above)")
    if _CPUID_CAP["on"]:
        print(_cpuid_cap_line().strip() + " (after the workloads)")
    w7 = None
    if "W7" in only:
        print("running W7 (fresh processes) ...", flush=True)
        w7 = run_w7(args)
    _ = np
    print_table(results, w7, args, peak)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "w7": w7, "args": vars(args)}, f, indent=1,
                      default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())

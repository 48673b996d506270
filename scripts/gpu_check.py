#!/usr/bin/env python3
"""One command that checks rlxc's CUDA backend on a machine with an NVIDIA GPU.

    prepare (any machine with the compiler; no GPU):  every op case (tests/opcases.py),
        larger fusion patterns, an MLP forward and train step (value_and_grad_all),
        sgemm 4096^3  →  DIR/*.rlxcuda (runtime/cuda.py containers: PTX + cubin)
                         DIR/*.npz     (arguments and the interpreter's outputs)
                         DIR/manifest.json
    run (the GPU machine; NumPy + ctypes, PyTorch or CuPy only for the baselines):
        (1) each artifact on the GPU vs the interpreter's outputs
        (2) MLP forward / train step and sgemm 4096^3 timed with CUDA events,
            next to cuBLAS through PyTorch (TF32 off) or CuPy when installed
        (3) a table; JSON to --json or $OUT/gpu_check.json

Command lines (repo root):
    python -m pip install -q -e . && python scripts/gpu_check.py      # both steps there
    python scripts/gpu_check.py --prepare gpu_check_data               # CPU machine
    python3 scripts/gpu_check.py --from gpu_check_data                 # GPU machine
The --from run imports only runtime/*.py (loaded by path: no xdsl, no llvmlite), so
the GPU machine needs nothing installed.  Every check runs in its own try/except;
a global alarm (--timeout, default 270 s) stops the run and still prints the table
(a watchdog thread exits 20 s later if a driver call hangs).
Exit status: 0 all checks correct, 1 a check failed, 2 no GPU or setup error,
3 global timeout.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import signal
import sys
import tempfile
import threading
import time
import traceback

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MLP_DIMS = (1024, 256, 512, 512, 10)     # batch, in, hidden, hidden, classes
SGEMM_N = 4096


class GlobalTimeout(BaseException):
    """Raised by the alarm; not an Exception, so per-check handlers let it through."""


def _alarm(signum, frame):
    raise GlobalTimeout()


# ------------------------------------------------------------------ prepare (compiler)

def mlp_func(batch, d_in, h1, h2, classes):
    import rlxc

    def build(s):
        x = s.input("x", (batch, d_in))
        y = s.input("y", (batch,), "i32")
        w1, b1 = s.param("w1", (d_in, h1)), s.param("b1", (h1,))
        w2, b2 = s.param("w2", (h1, h2)), s.param("b2", (h2,))
        w3, b3 = s.param("w3", (h2, classes)), s.param("b3", (classes,))
        h = (x @ w1 + b1).relu()
        h = (h @ w2 + b2).relu()
        return (h @ w3 + b3).cross_entropy(y)
    return rlxc.Func("mlp", build).init_randn(1, 0.05)


def _patterns():
    rng = np.random.default_rng(3)

    def R(*s):
        return rng.standard_normal(s).astype(np.float32)
    return {
        "elementwise_chain": (lambda s: (s.input("x", (256, 1024)) * 2.0 + 1.0).tanh().exp(),
                              {"x": R(256, 1024)}),
        "bias_relu": (lambda s: (s.input("x", (256, 1024)) + s.input("b", (1024,))).relu(),
                      {"x": R(256, 1024), "b": R(1024)}),
        "reduce_warp": (lambda s: (s.input("x", (277, 1000)) * 0.5).exp().sum(-1),
                        {"x": R(277, 1000)}),
        "reduce_block": (lambda s: s.input("x", (3, 90000)).max(-1), {"x": R(3, 90000)}),
        "reduce_cols": (lambda s: s.input("x", (1024, 300)).sum(0), {"x": R(1024, 300)}),
        "softmax_1000": (lambda s: s.input("x", (128, 1000)).softmax(), {"x": R(128, 1000)}),
        "layer_norm": (lambda s: s.input("x", (128, 768)).layer_norm(), {"x": R(128, 768)}),
        "matmul_bias_relu": (lambda s: (s.input("a", (300, 200)) @ s.input("w", (200, 500))
                                        + s.input("b", (500,))).relu(),
                             {"a": R(300, 200), "w": R(200, 500), "b": R(500)}),
        "matmul_tt": (lambda s: s.input("a", (257, 129)).T @ s.input("b", (300, 257)).T,
                      {"a": R(257, 129), "b": R(300, 257)}),
        "matmul_batched": (lambda s: s.input("a", (6, 1, 70, 90)) @ s.input("b", (5, 90, 33)),
                           {"a": R(6, 1, 70, 90), "b": R(5, 90, 33)}),
        "embedding_grad": (lambda s: s.input("E", (1000, 64)).gather(s.input("i", (4096,), "i32"))
                           .sum(), {"E": R(1000, 64),
                                    "i": rng.integers(0, 1000, 4096).astype(np.int32)}),
    }


def prepare(outdir: str, log=print) -> dict:
    """Compile every check into `outdir` (artifacts, arguments, interpreter outputs)."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from opcases import CASES, make_func

    import rlxc
    from rlxc.lowering.gpu import driver as gpu_driver
    from rlxc.lowering.gpu import nvptx

    os.makedirs(outdir, exist_ok=True)
    checks = []
    t0 = time.time()

    def add(name, group, func, inputs, rtol=1e-4, atol=1e-5, timing=None, ref=True,
            args_from=None, **extra):
        entry = {"name": name, "group": group, "rtol": rtol, "atol": atol, "timing": timing,
                 **extra}
        stem = name.replace(":", "_").replace("/", "_")
        try:
            art = gpu_driver.compile_cuda(func.module, func.name)
            with open(os.path.join(outdir, stem + ".rlxcuda"), "wb") as f:
                f.write(art.to_bytes())
            entry["artifact"] = stem + ".rlxcuda"
            entry["kernels"] = art.meta["kernels"]
            if inputs is not None:
                args = func.bind_call((), dict(inputs))
                outs = func.run_on("interp", **inputs) if ref else []
                saved = {} if args_from else {f"a{i}": a for i, a in enumerate(args)}
                np.savez(os.path.join(outdir, stem + ".npz"), **saved,
                         **{f"r{i}": r for i, r in enumerate(outs)})
                entry["data"] = stem + ".npz"
                entry["args_data"] = args_from or entry["data"]
        except Exception as e:  # noqa: BLE001 - reported by the device run
            entry["error"] = f"compile: {type(e).__name__}: {e}"
            log(f"  prepare {name}: {entry['error']}")
        checks.append(entry)

    for name in CASES:
        f, _, inputs, _ = make_func(name)
        add(f"op:{name}", "op", f, inputs)
    for name, (build, inputs) in _patterns().items():
        add(f"pattern:{name}", "pattern", rlxc.Func("p_" + name, build), inputs, rtol=2e-4,
            atol=2e-4)
    batch, d_in, h1, h2, classes = MLP_DIMS
    rng = np.random.default_rng(5)
    fwd = mlp_func(*MLP_DIMS)
    mlp_in = {"x": rng.standard_normal((batch, d_in)).astype(np.float32),
              "y": rng.integers(0, classes, batch).astype(np.int32)}
    add("mlp:forward", "mlp", fwd, mlp_in, rtol=1e-4, atol=1e-5, timing="mlp_forward",
        dims=MLP_DIMS)
    try:
        train = fwd.value_and_grad_all()
        add("mlp:train_step", "mlp", train, mlp_in, rtol=2e-4, atol=1e-5, timing="mlp_train",
            dims=MLP_DIMS, args_from="mlp_forward.npz")
    except Exception as e:  # noqa: BLE001
        checks.append({"name": "mlp:train_step", "group": "mlp",
                       "error": f"value_and_grad_all: {type(e).__name__}: {e}"})
    n = SGEMM_N
    sg = rlxc.Func("sgemm", lambda s: s.input("a", (n, n)) @ s.input("b", (n, n)))
    add("sgemm:4096", "sgemm", sg, None, timing="sgemm", n=n)
    ptxas = nvptx.find_ptxas()
    manifest = {"checks": checks, "ptxas": ptxas,
                "ptxas_version": nvptx.ptxas_version(ptxas) if ptxas else None,
                "prepare_s": round(time.time() - t0, 1)}
    with open(os.path.join(outdir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    log(f"prepared {len(checks)} checks in {manifest['prepare_s']} s into {outdir} "
        f"(ptxas: {ptxas or 'none: PTX only, the driver JITs it'})")
    return manifest


# ------------------------------------------------------------------ run (GPU, runtime only)

def load_runtime():
    """rlxc.runtime.cuda without importing the compiler (runtime/ loaded by path)."""
    try:
        import xdsl  # noqa: F401,I001  (the compiler is installed: import normally)

        return importlib.import_module("rlxc.runtime.cuda")
    except ImportError:
        pass
    spec = importlib.util.spec_from_file_location(
        "rlxrt", os.path.join(ROOT, "runtime", "__init__.py"),
        submodule_search_locations=[os.path.join(ROOT, "runtime")])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["rlxrt"] = mod
    spec.loader.exec_module(mod)
    return importlib.import_module("rlxrt.cuda")


class Baseline:
    """cuBLAS through PyTorch (TF32 off) or CuPy; None when neither is installed."""

    def __init__(self):
        self.kind, self.note = None, ""
        try:
            import torch

            if torch.cuda.is_available():
                torch.backends.cuda.matmul.allow_tf32 = False
                torch.backends.cudnn.allow_tf32 = False
                self.torch, self.kind = torch, "torch"
                self.note = f"torch {torch.__version__}"
                return
            self.note = "torch without CUDA"
        except Exception as e:  # noqa: BLE001
            self.note = f"no torch ({type(e).__name__})"
        try:
            import cupy

            cupy.cuda.runtime.getDeviceCount()
            self.cupy, self.kind = cupy, "cupy"
            self.note += f"; cupy {cupy.__version__}"
        except Exception as e:  # noqa: BLE001
            self.note += f"; no cupy ({type(e).__name__})"

    def _time_torch(self, fn, iters=20, warmup=3):
        torch = self.torch
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        torch.cuda.synchronize()
        return a.elapsed_time(b) / iters

    def sgemm(self, A, B, iters=10):
        """(ms, result as NumPy) of A @ B in float32."""
        if self.kind == "torch":
            t = self.torch
            a, b = t.from_numpy(A).cuda(), t.from_numpy(B).cuda()
            ms = self._time_torch(lambda: t.matmul(a, b), iters)
            return ms, t.matmul(a, b).cpu().numpy()
        if self.kind == "cupy":
            cp = self.cupy
            a, b = cp.asarray(A), cp.asarray(B)
            for _ in range(3):
                cp.matmul(a, b)
            s, e = cp.cuda.Event(), cp.cuda.Event()
            s.record()
            for _ in range(iters):
                cp.matmul(a, b)
            e.record()
            e.synchronize()
            return cp.cuda.get_elapsed_time(s, e) / iters, cp.asnumpy(cp.matmul(a, b))
        return None, None

    def mlp(self, args, train: bool, iters=20):
        """ms of the same MLP's forward (or loss + all parameter gradients) in PyTorch."""
        if self.kind != "torch":
            return None
        t = self.torch
        F = t.nn.functional
        x, y, *ps = [t.from_numpy(np.ascontiguousarray(a)).cuda() for a in args]
        y = y.long()
        ps = [p.clone().requires_grad_(train) for p in ps]
        w1, b1, w2, b2, w3, b3 = ps

        def fwd():
            h = F.relu(x @ w1 + b1)
            h = F.relu(h @ w2 + b2)
            return F.cross_entropy(h @ w3 + b3, y)

        if not train:
            with t.no_grad():
                return self._time_torch(fwd, iters)
        return self._time_torch(lambda: t.autograd.grad(fwd(), ps), iters)


def run_from(datadir: str, rt, results: list, log=print) -> None:
    with open(os.path.join(datadir, "manifest.json")) as f:
        manifest = json.load(f)
    base = Baseline()
    ctx = rt.context(0)
    drv = ctx.driver
    log(f"device: {ctx.name} ({ctx.arch}), driver {drv.driver_version()}, "
        f"{drv.total_memory(ctx.device) / 2**30:.0f} GiB; baseline: {base.kind or 'none'} "
        f"({base.note}); ptxas at prepare: {manifest.get('ptxas_version') or 'none'}")
    for entry in manifest["checks"]:
        row = {"name": entry["name"], "group": entry["group"], "ok": False, "err": None,
               "ms": None, "ref_ms": None, "note": ""}
        results.append(row)
        try:
            if "error" in entry:
                raise RuntimeError(entry["error"])
            _run_check(datadir, entry, rt, base, row)
        except GlobalTimeout:
            row["note"] = "global timeout"
            raise
        except Exception as e:  # noqa: BLE001 - one failure must not stop the rest
            row["ok"] = False
            row["note"] = f"{type(e).__name__}: {str(e).splitlines()[0][:150]}"
            row["trace"] = traceback.format_exc(limit=4)


def _run_check(datadir, entry, rt, base, row):
    with open(os.path.join(datadir, entry["artifact"]), "rb") as f:
        meta, blobs = rt.load_artifact(f.read())
    prog = rt.CudaProgram(meta, blobs)
    row["image"] = prog.image_kind
    try:
        if entry.get("data"):
            z = np.load(os.path.join(datadir, entry["data"]))
            za = np.load(os.path.join(datadir, entry.get("args_data", entry["data"])))
            args = [za[f"a{i}"] for i in range(len(meta["args"]))]
            refs = [z[f"r{i}"] for i in range(len(meta["outputs"])) if f"r{i}" in z]
            outs = prog.run(args)
            errs = []
            ok = True
            for o, r in zip(outs, refs):
                if o.shape != r.shape:
                    ok = False
                    errs.append(float("inf"))
                    continue
                d = np.abs(o.astype(np.float64) - r.astype(np.float64))
                d = np.where(np.isnan(o) & np.isnan(r), 0, d)
                errs.append(float(np.nanmax(d)) if d.size else 0.0)
                ok &= bool(np.allclose(o, r, rtol=entry["rtol"], atol=entry["atol"],
                                       equal_nan=True))
            row["ok"], row["err"] = ok, max(errs, default=0.0)
        else:
            args = None
        timing = entry.get("timing")
        if timing == "sgemm":
            n = entry["n"]
            rng = np.random.default_rng(11)
            A = rng.standard_normal((n, n), dtype=np.float32)
            B = rng.standard_normal((n, n), dtype=np.float32)
            t = prog.time([A, B], iters=10, warmup=2)
            row["ms"] = t["kernels_ms"]
            (ours,) = prog.run([A, B])
            ref_ms, ref = base.sgemm(A, B)
            row["ref_ms"] = ref_ms
            if ref is None:      # no baseline: 256 sampled entries in float64 on the CPU
                i = rng.integers(0, n, 256)
                j = rng.integers(0, n, 256)
                want = np.einsum("kn,nk->k", A[i].astype(np.float64), B[:, j].astype(np.float64))
                got = ours[i, j]
                rel = float(np.linalg.norm(got - want) / np.linalg.norm(want))
            else:
                rel = float(np.linalg.norm(ours - ref) / np.linalg.norm(ref))
            row["err"], row["ok"] = rel, rel < 1e-5
            gf = 2 * n ** 3 / (row["ms"] * 1e-3) / 1e9
            row["note"] = f"{gf:,.0f} GFLOP/s (rel err vs {'cuBLAS' if ref is not None else 'f64'})"
            if ref_ms:
                row["note"] += f"; cuBLAS {2 * n ** 3 / (ref_ms * 1e-3) / 1e9:,.0f} GFLOP/s"
        elif timing in ("mlp_forward", "mlp_train"):
            t = prog.time(args, iters=20, warmup=3)
            row["ms"], row["run_ms"] = t["kernels_ms"], t["run_ms"]
            row["ref_ms"] = base.mlp(args, timing == "mlp_train")
            prof = prog.profile(args, iters=5)
            top = sorted(prof, key=lambda p: -p[1])[:4]
            row["profile"] = prof
            row["note"] = f"{len(prof)} steps; run() with copies {t['run_ms']:.3f} ms; top: " + \
                ", ".join(f"{n.split('_k', 1)[-1]} {ms:.3f}" for n, ms in top)
        if entry.get("kernels"):
            row["kernels"] = entry["kernels"]
    finally:
        prog.close()


def print_table(results, log=print):
    log("")
    log(f"{'check':34s} {'result':6s} {'max err':>9s} {'rlxc ms':>9s} {'cuBLAS/torch':>12s}  note")
    log("-" * 110)
    for r in results:
        res = "ok" if r["ok"] else "FAIL"
        err = "" if r["err"] is None else f"{r['err']:.2e}"
        ms = "" if r["ms"] is None else f"{r['ms']:.3f}"
        ref = "" if not r.get("ref_ms") else f"{r['ref_ms']:.3f}"
        if r["group"] == "op" and r["ok"]:
            continue          # summarized below
        log(f"{r['name'][:34]:34s} {res:6s} {err:>9s} {ms:>9s} {ref:>12s}  {r['note'][:120]}")
    ops = [r for r in results if r["group"] == "op"]
    nok = sum(r["ok"] for r in ops)
    worst = max((r["err"] or 0.0 for r in ops if r["ok"]), default=0.0)
    log(f"{'op cases (all passing rows above omitted)':54s} {nok}/{len(ops)} ok, "
        f"worst max err {worst:.2e}")
    bad = [r for r in results if not r["ok"]]
    for r in bad:
        if r.get("trace"):
            log(f"--- {r['name']}\n{r['trace']}")
    log(f"TOTAL {len(results) - len(bad)}/{len(results)} ok")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prepare", metavar="DIR", help="compile the checks into DIR and stop")
    ap.add_argument("--from", dest="src", metavar="DIR", help="run prepared checks from DIR")
    ap.add_argument("--timeout", type=float, default=270.0, help="global limit, seconds")
    ap.add_argument("--json", help="write results here (default $OUT/gpu_check.json)")
    a = ap.parse_args(argv)
    t0 = time.time()
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, a.timeout)
    results: list = []

    def hard_stop():      # a hung driver call cannot see the alarm: leave anyway
        print(f"gpu_check: hard timeout after {a.timeout + 20:.0f} s (a call hung)",
              file=sys.stderr)
        try:
            print_table(list(results))
        finally:
            os._exit(3)
    watchdog = threading.Timer(a.timeout + 20, hard_stop)
    watchdog.daemon = True
    watchdog.start()
    status = 0
    try:
        if a.prepare:
            prepare(a.prepare)
            signal.setitimer(signal.ITIMER_REAL, 0)
            return 0
        rt = load_runtime()
        if not rt.available():
            print(f"gpu_check: no usable NVIDIA GPU here: {rt.unavailable_reason()}",
                  file=sys.stderr)
            return 2
        if a.src:
            run_from(a.src, rt, results)
        else:
            with tempfile.TemporaryDirectory(prefix="rlxc-gpu-check-") as d:
                prepare(d)
                run_from(d, rt, results)
        status = 0 if results and all(r["ok"] for r in results) else 1
    except GlobalTimeout:
        print(f"gpu_check: global timeout after {a.timeout:.0f} s; partial results below",
              file=sys.stderr)
        status = 3
    except Exception:  # noqa: BLE001 - setup failed
        traceback.print_exc()
        status = 2
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        watchdog.cancel()
    print_table(results)
    print(f"gpu_check: {time.time() - t0:.1f} s, exit {status}")
    out = a.json or (os.path.join(os.environ["OUT"], "gpu_check.json") if os.environ.get("OUT")
                     else None)
    if out:
        with open(out, "w") as f:
            json.dump({"status": status, "results": results}, f, indent=1, default=str)
    return status


if __name__ == "__main__":
    sys.exit(main())

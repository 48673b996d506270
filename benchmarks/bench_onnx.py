"""Exported ONNX models: rlxc (from_onnx, native CPU) vs onnxruntime, side by side.

Run:  .venv/bin/python benchmarks/bench_onnx.py [--threads 1] [--runs 50] [--models encoder,mlp,cnn]
      [--shapes static,dynamic]

Models: the torch.onnx.export outputs committed in tests/fixtures/onnx/ (a post-norm
transformer encoder layer d=32 seq=6, the digits MLP, the digits CNN: conv-bn-relu-maxpool x2, global average pool, linear), each at batch 1 and 64 (their batch axis is dynamic). onnxruntime
runs the same file with the CPUExecutionProvider, intra_op_num_threads = --threads,
graph optimizations on (ORT_ENABLE_ALL); rlxc runs `from_onnx(...).jit()` with
set_num_threads(--threads), in two forms (--shapes): "static" fixes the batch with
input_shapes= (one program per batch size), "dynamic" keeps the exported dim_param
(one Func and one size-generic library for every batch, whose batch-separable
programs run as one parallel region over row chunks: lowering/cpu/batchsplit.py; a
static program splits the same way: batchsplit_static.py). Both sides alternate in
blocks; each prints the median time per call, and ratio = onnxruntime / rlxc (> 1: rlxc
is faster; target >= 1.2); "split" names the library's split symbol ("-": none).
The outputs are compared first (1e-4 relative).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import rlxc  # noqa: E402
from onnx_torch_models import input_shape  # noqa: E402

FIX = os.path.join(HERE, "..", "tests", "fixtures", "onnx")


def block(fn, n):
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


_DYNAMIC: dict = {}   # model -> its one dynamic Jitted (compiled once, every batch)


def bench(name: str, batch: int, threads: int, runs: int, shapes: str = "static"):
    import onnxruntime as ort

    path = os.path.join(FIX, f"{name}.onnx")
    x = np.random.default_rng(0).normal(size=input_shape(name, batch)).astype(np.float32)
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    t0 = time.perf_counter()
    if shapes == "static":
        j = rlxc.from_onnx(path, input_shapes={"x": x.shape}).jit()
    else:
        j = _DYNAMIC.get(name)
        if j is None:
            j = _DYNAMIC[name] = rlxc.from_onnx(path).jit()
    t_compile = time.perf_counter() - t0
    if hasattr(j, "set_num_threads"):
        j.set_num_threads(threads)
    want = sess.run(None, {"x": x})[0]
    got = j.run(x=x)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    r_times, o_times = [], []
    for _ in range(10):   # warm-up (and the runtime thread governor's first choice)
        j.run(x=x)
        sess.run(None, {"x": x})
    per_block = max(runs // 5, 1)
    for _ in range(5):
        r_times += block(lambda: j.run(x=x), per_block)
        time.sleep(0.05)
        o_times += block(lambda: sess.run(None, {"x": x}), per_block)
        time.sleep(0.05)
    r, o = statistics.median(r_times), statistics.median(o_times)
    return r, o, t_compile, _split(j)


def _split(j) -> str:
    """The library's batch split (lowering/cpu/batchsplit*.py): its symbol, or "-"."""
    one = getattr(j, "_one", None)
    lib = one.lib if one is not None else getattr(j, "lib", None)
    meta = getattr(lib, "meta", None) or {}
    return (meta.get("batch_split") or {}).get("symbol") or "-"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--models", default="encoder,mlp,cnn")
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--shapes", default="static,dynamic",
                    help="static (batch fixed by input_shapes=), dynamic (as exported), or both")
    args = ap.parse_args(argv)
    import onnxruntime as ort

    print(f"onnxruntime {ort.__version__} CPUExecutionProvider, {args.threads} thread(s); "
          f"median of {args.runs} calls")
    print(f"{'model':<10}{'shapes':>9}{'batch':>6}{'rlxc us':>12}{'ort us':>12}{'ratio':>8}"
          f"{'compile s':>11}{'split':>7}")
    for name in args.models.split(","):
        for shapes in args.shapes.split(","):
            if shapes not in ("static", "dynamic"):
                ap.error(f"--shapes: {shapes!r} is not static or dynamic")
            for b in (int(v) for v in args.batches.split(",")):
                r, o, tc, split = bench(name, b, args.threads, args.runs, shapes)
                print(f"{name:<10}{shapes:>9}{b:>6}{r * 1e6:>12.1f}{o * 1e6:>12.1f}"
                      f"{o / r:>8.2f}{tc:>11.2f}{split:>7}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

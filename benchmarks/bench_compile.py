"""Compile time, rlxc next to JAX: each measured in a fresh process, cold caches.

Run:  make bench-compile   (or .venv/bin/python benchmarks/bench_compile.py --runs 3)

Cases (float32):
  W4     the MLP training step of compare.py (784-512-512-10, batch 128:
         value_and_grad over all params + SGD): rlxc Func.trainer, JAX
         jit(value_and_grad + update) lowered and compiled
  res20  a 20-layer residual MLP, h = h + relu(h @ W_i + b_i), width 256,
         batch 64, loss mean(h^2): value_and_grad over all 40 params
         (rlxc: Func.value_and_grad_all() compiled to a library; JAX:
         jit(value_and_grad(loss)).lower(...).compile())

What is timed, inside the fresh process, after imports (rlxc: xdsl, llvmlite
and its transform and lowering modules; JAX: jax and its CPU client): tracing, the
transforms, lowering, LLVM and linking (rlxc, with an empty RLXC_CACHE_DIR;
the shared sgemm objects are toolchain and already built, see
lowering/cpu/sgemm_object.py), or tracing, lowering and XLA compilation (JAX,
its persistent compilation cache off).  Nothing is run.  Medians of --runs
fresh processes; --cpu as in compare.py.
"""
from __future__ import annotations

import argparse
import ast
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WIDTH, BATCH, LAYERS = 256, 64, 20

_RLXC = r"""
import os, sys, time
sys.path.insert(0, {here!r})
import numpy as np
import rlxc
from rlxc import Func
from rlxc.optim import SGD
from compare import rlxc_mlp, init_params, LR, use_cpu
cpu = use_cpu({cpu!r})
from rlxc.backends import library
import xdsl.ir, llvmlite.binding  # the compiler's own imports, like jaxlib's below
import rlxc.dialect.autodiff, rlxc.lowering.cpu.driver
t0 = time.perf_counter()
if {case!r} == "W4":
    rlxc_mlp("w4_mlp", 128).with_params(init_params()).trainer(SGD(LR))
else:
    def build(s):
        h = s.input("x", ({batch}, {width}))
        for i in range({layers}):
            h = h + h.linear(s.param(f"w{{i}}", ({width}, {width})),
                             s.param(f"b{{i}}", ({width},))).relu()
        return (h * h).mean()
    f = Func("res{layers}", build).value_and_grad_all()
    library(f)
print("RESULT", time.perf_counter() - t0)
"""

_JAX = r"""
import os, sys, time
sys.path.insert(0, {here!r})
import numpy as np
import jax
jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_enable_compilation_cache", False)
jnp = jax.numpy
from compare import jax_mlp, init_params, batch, LR
jax.devices()   # the XLA CPU client exists before timing, as rlxc's modules are imported
t0 = time.perf_counter()
if {case!r} == "W4":
    _, loss = jax_mlp(jax)
    def step(p, x, y):
        value, g = jax.value_and_grad(loss)(p, x, y)
        return jax.tree_util.tree_map(lambda a, b: a - LR * b, p, g), value
    p = {{k: jnp.asarray(v) for k, v in init_params().items()}}
    x, y = batch()
    jax.jit(step, donate_argnums=0).lower(p, jnp.asarray(x), jnp.asarray(y)).compile()
else:
    def loss(p, x):
        h = x
        for i in range({layers}):
            h = h + jax.nn.relu(h @ p[f"w{{i}}"] + p[f"b{{i}}"])
        return jnp.mean(h * h)
    p = {{}}
    for i in range({layers}):
        p[f"w{{i}}"] = jnp.zeros(({width}, {width}), jnp.float32)
        p[f"b{{i}}"] = jnp.zeros(({width},), jnp.float32)
    x = jnp.zeros(({batch}, {width}), jnp.float32)
    jax.jit(jax.value_and_grad(loss)).lower(p, x).compile()
print("RESULT", time.perf_counter() - t0)
"""


def fresh(script: str, env: dict) -> float:
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                       cwd=ROOT)
    if p.returncode != 0:
        raise RuntimeError(p.stderr.strip().splitlines()[-1] if p.stderr.strip() else
                           f"exit {p.returncode}")
    return ast.literal_eval([ln for ln in p.stdout.splitlines()
                             if ln.startswith("RESULT ")][-1][7:])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cpu", default="native")
    ap.add_argument("--cases", default="W4,res20")
    args = ap.parse_args(argv)
    fmt = dict(here=HERE, cpu=args.cpu, batch=BATCH, width=WIDTH, layers=LAYERS)
    print(f"{time.strftime('%Y-%m-%d %H:%M')}  load {os.getloadavg()[0]:.2f}; compile time in "
          f"fresh processes, median of {args.runs}; rlxc --cpu {args.cpu}")
    try:
        import jax  # noqa: F401
        have_jax = True
    except ImportError:
        have_jax = False
        print("NOTE: jax is not installed; its column stays empty")
    print(f"{'case':8} {'rlxc':>10} {'jax':>10} {'rlxc/jax':>9}")
    for case in args.cases.split(","):
        rl, jx = [], []
        with tempfile.TemporaryDirectory(prefix="rlxc-bc-") as tmp:
            for r in range(args.runs):
                env = dict(os.environ, RLXC_CACHE_DIR=os.path.join(tmp, f"c{r}"),
                           JAX_PLATFORMS="cpu")
                rl.append(fresh(_RLXC.format(case=case, **fmt), env))
                if have_jax:
                    jx.append(fresh(_JAX.format(case=case, **fmt), env))
        r_med = statistics.median(rl)
        j_med = statistics.median(jx) if jx else float("nan")
        print(f"{case:8} {r_med:>9.3f}s {j_med:>9.3f}s {r_med / j_med:>8.2f}x   "
              f"(rlxc {', '.join(f'{t:.2f}' for t in rl)}; "
              f"jax {', '.join(f'{t:.2f}' for t in jx)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A called GEMM epilogue runs on whole register tiles (sgemm_object's callback ABI:
epi(ctx, row, col, c, ldc, rows, n) rewrites a rows x n block of C in place).

The packed path's tiles store C and call the epilogue once per tile; the skinny, tall
and narrow kernels call it per row-vector on a stack slot (rows = 1).  Checked: the cb
object's IR has both call forms; the epilogue function takes the NR-wide fast path and
the masked one; and results match NumPy on both ISAs, 1 and 2 threads, at shapes whose
edge tiles are partial in rows and columns, with loads at the row (a per-row scale), at
the column (a bias) and at both (a residual), through a nonlinear op (tanh), NaN kept.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

from test_sgemm_smallm import CPUS


def test_cb_object_calls_the_epilogue_per_tile_and_per_vector():
    import llvmlite.ir as ir

    from rlxc.lowering.cpu import sgemm_object
    from rlxc.lowering.cpu.sgemm_kernels import emit_sgemm, sgemm_config
    from rlxc.lowering.cpu.target import ir_module

    cfg = sgemm_config("x86-64-v3")
    m = ir_module("tile_epi", "x86-64-v3")
    sgemm_object._slots.clear()
    i8p = ir.IntType(8).as_pointer()
    emit_sgemm(m, "t_cb", cpu="x86-64-v3", epilogue=sgemm_object._callback_hook,
               epilogue_arg_types=(i8p, i8p))
    text = str(m)
    calls = re.findall(r'call void %"?[\w.]+"?\(i8\* [^,]+, i64 [^,]+, i64 [^,]+, '
                       r'float\* [^,]+, i64 ([^,]+), i64 ([^,]+), i64 ([^)]+)\)', text)
    per_vector = [c for c in calls if c[:2] == (str(cfg.vl), "1")]
    per_tile = [c for c in calls if c[1] != "1"]
    assert per_vector and per_tile, calls[:8]


def _func(name, m, k, n):
    from rlxc import Func

    def build(s):
        x = s.input("x", (m, k))
        r = s.input("r", (m, 1))
        res = s.input("res", (m, n))
        h = (x @ s.param("w", (k, n)) + s.param("b", (n,))).tanh()
        return h * r + res
    return Func(name, build)


@pytest.mark.parametrize("cpu", CPUS)
@pytest.mark.parametrize("threads", [1, 2])
def test_tile_epilogue_matches_numpy(cpu, threads):
    from rlxc.backends import jit
    from rlxc.lowering.cpu import driver
    from rlxc.lowering.cpu.sgemm_kernels import sgemm_config

    cfg = sgemm_config(cpu)
    rng = np.random.default_rng(7)
    # full tiles only in places; partial last rows (m % MR) and columns (n % NR, n % VL)
    for m, k, n in [(cfg.mr * 9 + 1, 40, cfg.nr * 3 + 5), (70, 33, cfg.nr * 2),
                    (300, 64, 2 * cfg.vl + 3)]:
        f = _func(f"tepi_{cpu.replace('-', '_')}_{threads}_{m}_{n}", m, k, n)
        w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32)
        f = f.with_params({"w": w, "b": b})
        ir_text = str(driver.llvm_module(f.module, cpu=cpu)[0])
        epi = re.search(r'define internal void @"[^"]*\.epi"\(.*?\n}', ir_text, re.S)
        assert epi, "the epilogue is not a called one"
        assert re.search(rf"icmp eq i64 %[\w.\"]+, {cfg.nr}\b", epi.group(0)), \
            "no NR-wide fast path"
        x = rng.standard_normal((m, k)).astype(np.float32)
        r = rng.standard_normal((m, 1)).astype(np.float32)
        res = rng.standard_normal((m, n)).astype(np.float32)
        x[3, 1] = np.nan
        j = jit(f, "cpu", cpu=cpu)
        j.set_num_threads(threads)
        got = j.run(x, r, res)[0]
        ref = np.tanh(x.astype(np.float64) @ w + b) * r + res
        assert np.isnan(got[3]).all() and np.isnan(ref[3]).all()
        ok = ~np.isnan(ref)
        np.testing.assert_allclose(got[ok], ref[ok], rtol=2e-5, atol=2e-5,
                                   err_msg=str((m, k, n)))

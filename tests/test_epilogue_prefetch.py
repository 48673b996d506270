"""A GEMM epilogue that loads a whole matrix (W4's SGD update fused into dW's GEMM:
W - lr * (X^T @ dY)) prefetches the next register tile's rows (matmul_codegen
`_prefetch_next_tile`): the IR of its epilogue function has the prefetch, MR rows
ahead, and the results still match NumPy at sizes whose last tile is partial (the
prefetches past the last row must be harmless) on both ISAs and thread counts.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from test_sgemm_smallm import CPUS


def _update(n, k, m, name):
    from rlxc import Func

    def build(s):
        x, g = s.input("x", (k, n)), s.input("g", (k, m))
        w = s.param("w", (n, m))
        return w - 0.01 * (x.T @ g)
    return Func(name, build)


@pytest.mark.parametrize("cpu", CPUS)
@pytest.mark.parametrize("threads", [1, 2])
def test_matrix_epilogue_prefetches_next_tile(cpu, threads):
    from rlxc.backends import jit
    from rlxc.lowering.cpu import driver
    from rlxc.lowering.cpu.sgemm_kernels import sgemm_config

    rng = np.random.default_rng(5)
    mr = sgemm_config(cpu).mr
    for n, k, m in [(37, 24, 45), (64, 128, 96), (5, 9, 200)]:
        f = _update(n, k, m, f"upd_{n}_{m}_{cpu}_{threads}")
        w = rng.standard_normal((n, m)).astype(np.float32)
        f = f.with_params({"w": w})
        ir_text = str(driver.llvm_module(f.module, cpu=cpu)[0])
        epi = re.search(r'define internal void @"[^"]*\.epi"\(.*?\n}', ir_text, re.S)
        assert epi, "the update is not fused into the GEMM's epilogue"
        body = epi.group(0)
        assert "llvm.prefetch" in body
        # the prefetched address is MR rows (MR * m floats) past the loaded one
        assert re.search(rf"getelementptr float, float\* %.*, i64 {mr * m}\b", body), body
        x = rng.standard_normal((k, n)).astype(np.float32)
        g = rng.standard_normal((k, m)).astype(np.float32)
        x[1, 2] = np.nan
        j = jit(f, "cpu", cpu=cpu)
        j.set_num_threads(threads)
        got = j.run(x, g)[0]
        ref = w.astype(np.float64) - 0.01 * (x.T.astype(np.float64) @ g)
        assert np.isnan(got[2]).all() and np.isnan(ref[2]).all()
        ok = ~np.isnan(ref)
        assert np.allclose(got[ok], ref[ok], rtol=1e-5, atol=1e-5), (n, k, m)

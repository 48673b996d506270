"""Tuning features per CPU family (lowering/cpu/target.py TUNING_FEATURES): on AMD Zen
the generated code is built with +prefer-no-gather,+prefer-no-scatter.

    features   znver3/znver4 (and native on a Zen host) get them, x86-64-v3 and Intel
               CPUs do not; the target machine's feature string carries them only when
               tuned (the shared sgemm object is built untuned)
    asm        a 2x2 max-pool and its backward (strided reads, the W9 kernels that LLVM
               vectorized with vgatherdps for znver4) compile without any gather or
               scatter instruction for znver3/znver4
    numerics   the same program on znver3 (runs on any AVX2 host) against the interpreter
"""
from __future__ import annotations

import re

import numpy as np
import pytest

import rlxc
from rlxc.lowering.cpu import target
from rlxc.lowering.cpu.driver import emit_asm

from test_sgemm_smallm import _has

GATHER = re.compile(r"\bv(p)?(gather|scatter)\w*", re.I)


def _pool_grad():
    def build(s):
        h = s.input("x", (8, 6, 28, 28)).relu().max_pool2d(2)
        return (h * h).sum()
    return rlxc.Func("poolg", build).grad("x")


@pytest.mark.parametrize("cpu,want", [("znver3", True), ("znver4", True),
                                      ("x86-64-v3", False), ("skylake-avx512", False),
                                      ("sapphirerapids", False)])
def test_features(cpu, want):
    f = target.tuning_features(cpu)
    assert bool(f) == want
    if want:
        assert f == "+prefer-no-gather,+prefer-no-scatter"


def test_native_follows_the_host_name():
    assert bool(target.tuning_features("native")) == target.host_cpu_name().startswith("znver")


def test_target_machine_untuned_for_the_sgemm_object():
    from rlxc.lowering.cpu import sgemm_object

    src = open(sgemm_object.__file__).read()
    assert "tuned=False" in src   # the shared GEMM kernels: the code they were tuned as
    assert target.target_machine("znver4", 3, True) is not target.target_machine("znver4", 3,
                                                                                  False)


@pytest.mark.parametrize("cpu", ["znver3", "znver4"])
def test_no_gather_in_zen_asm(cpu):
    asm = emit_asm(_pool_grad().module, "poolg", cpu=cpu)
    assert not GATHER.search(asm), GATHER.search(asm).group(0)


@pytest.mark.skipif(not _has("avx2", "fma"), reason="host cannot run AVX2/FMA code")
def test_znver3_numerics(monkeypatch):
    import rlxc.backends as backends
    from rlxc.registry import backend

    monkeypatch.setattr(backends, "_libs", {})
    monkeypatch.setattr(backend("cpu"), "default_cpu", "znver3")
    f = _pool_grad()
    x = np.random.default_rng(2).standard_normal((8, 6, 28, 28)).astype(np.float32)
    (got,) = f.run(x=x)
    (want,) = f.run_on("interp", x=x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

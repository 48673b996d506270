"""Regression tests of the conv / batched-matmul speed work (issue 15, speed part):
constant gather indices are range-checked at compile time (no check kernel per call), a
conv2d is one GEMM over the whole batch with bias + activation in the sgemm epilogue, and
a (B, T, K) @ (K, N) matmul is one (B*T, K) @ (K, N) GEMM."""
import numpy as np
import pytest

import rlxc
from rlxc.lowering.cpu.driver import lower
from rlxc.lowering.cpu.loops import CheckKernel, MatmulKernel

rng = np.random.default_rng(15)


def _kinds(prog, cls):
    return [k for k in prog.kernels if isinstance(k, cls)]


def test_constant_gather_indices_checked_at_compile_time():
    """In-range constant indices (im2col) need no per-call check kernel; an input index does."""
    def build(s):
        x = s.input("x", (4, 3, 12, 12))
        h = x.conv2d(s.param("w", (5, 3, 3, 3)), s.param("b", (5,)), padding=1).relu()
        return h.reshape(4, 5 * 144).gather(s.input("i", (3,), "i32"), axis=1)
    prog = lower(rlxc.Func("cc", build).module)
    checks = _kinds(prog, CheckKernel)
    assert len(checks) == 1 and checks[0].buf.kind == "input"


def test_constant_gather_out_of_range_still_raises():
    """A constant index that is out of range keeps its runtime check (an IndexError, no crash)."""
    x = np.arange(6, dtype=np.float32)
    f = rlxc.Func("oob", lambda s: s.input("x", (6,)).gather(np.array([1, 7], np.int32)))
    assert len(_kinds(lower(f.module), CheckKernel)) == 1
    with pytest.raises(IndexError, match="out of range"):
        f.run(x=x)

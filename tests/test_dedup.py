"""Identical kernels of repeated layers are compiled once (lowering/cpu/dedup.py)."""

from __future__ import annotations

import numpy as np

from rlxc import Func
from rlxc.lowering.cpu.dedup import merge_identical

IR = '''define internal void @"f.k1"(float* %a) nounwind
{
entry:
  call void @"f.leaf1"(float* %a)
  ret void
}

define internal void @"f.k2"(float* %a) nounwind
{
entry:
  call void @"f.leaf2"(float* %a)
  ret void
}

define internal void @"f.leaf1"(float* %a) nounwind
{
entry:
  store float 1.0, float* %a
  ret void
}

define internal void @"f.leaf2"(float* %a) nounwind
{
entry:
  store float 1.0, float* %a
  ret void
}

define internal void @"f.leaf3"(float* %a) nounwind
{
entry:
  store float 2.0, float* %a
  ret void
}

define void @f(float* %a) nounwind
{
entry:
  call void @"f.k1"(float* %a)
  call void @"f.k2"(float* %a)
  call void @"f.leaf3"(float* %a)
  ret void
}
'''


def test_merge_identical_text():
    """Equal leaves merge first, which makes their callers equal: 2 rounds, 2 removed;
    a different body and exported functions stay."""
    out, n = merge_identical(IR)
    assert n == 2
    assert '@"f.k2"' not in out and '@"f.leaf2"' not in out
    assert out.count('call void @"f.k1"') == 2 and '@"f.leaf3"' in out
    assert "define void @f(" in out
    # the kept copies of merged functions stay out of line (else the inliner re-copies them)
    assert 'define internal void @"f.k1"(float* %a) nounwind noinline' in out
    assert 'define internal void @"f.leaf3"(float* %a) nounwind\n' in out
    import llvmlite.binding as llvm  # the result is still valid IR
    llvm.parse_assembly(out).verify()


def test_repeated_layers_compile_once(tmp_path, monkeypatch):
    """A 6-layer residual MLP's gradient: one copy of each layer's kernels, same results
    as the NumPy reference interpreter."""
    monkeypatch.setenv("RLXC_CACHE_DIR", str(tmp_path))
    from rlxc.lowering.cpu import driver

    def build(s):
        h = s.input("x", (8, 32))
        for i in range(6):
            h = h + h.linear(s.param(f"w{i}", (32, 32)), s.param(f"b{i}", (32,))).relu()
        return (h * h).mean()
    rng = np.random.default_rng(0)
    params = {}
    for i in range(6):
        params[f"w{i}"] = (rng.standard_normal((32, 32)) * 0.1).astype(np.float32)
        params[f"b{i}"] = (rng.standard_normal(32) * 0.1).astype(np.float32)
    g = Func("res6", build).with_params(params).value_and_grad_all()
    m, _ = driver.llvm_module(g.module, "res6")
    text = str(m)
    merged, n = merge_identical(text)
    assert n >= 5 * 3   # at least the forward map, matmul and epilogue of 5 repeated layers
    assert merged.count("define internal") <= text.count("define internal") - n
    x = rng.standard_normal((8, 32)).astype(np.float32)
    got = g.run(x=x)
    want = g.run_on("interp", x=x)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-5)

"""Temps that live inside one row block become per-thread buffers (lowering/cpu/rowlocal.py).

Golden loop IR: a fused softmax's exponentials and row statistics are row blocks (offsets
rebased to the block, workspace 0 bytes); a layer norm's too.  Refusals: a temp another
kernel reads, a block over LOCAL_MAX_BYTES, a dynamic program whose block size changes
with the size (its samples disagree).  Numerics: the same results bit for bit as the
workspace temps, on 1 and 2 threads (a block shared between threads would mix rows),
with NaN and inf rows; NumPy references; a dynamic batch served by one library; a
finite-difference gradient through a layer norm whose backward has row temps too.
"""
import re

import numpy as np
import pytest

from rlxc import Func
from rlxc.lowering.cpu import driver, rowlocal
from rlxc.lowering.cpu.driver import emit_loops

from gradcheck import fd_grad

RNG = np.random.default_rng(5)


def _locals(text):
    return re.findall(r"^//   %(\w+): \w+\[(\d+)\] @ a row block per thread$", text, re.M)


def _workspace(text):
    return int(re.search(r"workspace (\d+) bytes", text).group(1))


def _softmax(x):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def test_golden_softmax_temps_are_row_blocks():
    text = emit_loops(Func("sm", lambda s: s.input("a", (64, 256)).softmax(1)).module, "sm")
    # the 4-row groups of the jammed reductions: max (4), exponentials (4 x 256), sums (4)
    assert sorted(_locals(text)) == [("t2", "4"), ("t3", "1024"), ("t4", "4")], text
    assert _workspace(text) == 0
    assert "%t3[i0_in_i0_jam*256 + i1] = exp(" in text      # rebased: no i0_jam term
    assert "div(%t3[i0_in_i0_jam*256 + i1], %t4[i0_in_i0_jam])" in text


def test_golden_layer_norm_has_no_workspace():
    ln = Func("ln", lambda s: s.input("a", (64, 256)).layer_norm(
        -1, 1e-5, weight=s.param("g", (256,)), bias=s.param("b", (256,))))
    text = emit_loops(ln.module, "ln")
    assert _locals(text) and _workspace(text) == 0, text


def test_a_temp_another_kernel_reads_stays_in_the_workspace():
    def build(s):
        e = s.input("a", (64, 256)).exp()
        return e / e.sum(1, keepdims=True), e.sum(0)   # the column sums read every row of e
    text = emit_loops(Func("shared", build).module, "shared")
    assert _workspace(text) >= 64 * 256 * 4, text
    assert not any(int(n) == 1024 for _, n in _locals(text))


def test_a_block_over_the_budget_stays_in_the_workspace():
    cols = rowlocal.LOCAL_MAX_BYTES // 4          # one row of the exponentials fills it;
    text = emit_loops(Func("wide", lambda s: s.input("a", (8, 2 * cols)).softmax(1)).module,
                      "wide")                      # two rows (the row max's block) do not fit
    assert _workspace(text) >= 8 * 2 * cols * 4
    assert all(int(n) * 4 <= rowlocal.LOCAL_MAX_BYTES for _, n in _locals(text))


def test_plan_unit_rules():
    prog = driver.lower(Func("sm2", lambda s: s.input("a", (16, 32)).softmax(1)).module)
    # lower() already localized them: a plan of the planned program finds nothing left
    assert rowlocal.local_plan(prog) == {}
    assert rowlocal.common([{("k", "t"): 4, ("k", "u"): 8}, {("k", "t"): 4, ("k", "u"): 16}]) \
        == {("k", "t"): 4}


def _ops(shape):
    def build(s):
        a = s.input("a", shape)
        return a.softmax(1), a.log_softmax(1), a.layer_norm(-1, 1e-5), a.argmax(1)
    return build


@pytest.mark.parametrize("shape", [(1, 1), (5, 7), (64, 256), (1023, 100)])
def test_same_bits_as_workspace_temps_on_one_and_two_threads(shape, monkeypatch):
    x = (RNG.standard_normal(shape) * 3).astype(np.float32)
    if shape[0] >= 5 and shape[1] >= 7:
        x[1, 3] = np.nan
        x[2, :] = -np.inf
        x[3, 6] = np.inf
    name = f"rl{shape[0]}x{shape[1]}"
    on = Func(name + "on", _ops(shape)).jit()
    monkeypatch.setattr(rowlocal, "localize", lambda prog, plan=None: prog)
    off = Func(name + "off", _ops(shape)).jit()
    monkeypatch.undo()
    for t in (1, 2):
        on.set_num_threads(t)
        off.set_num_threads(t)
        got, want = on.run(a=x), off.run(a=x)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    with np.errstate(invalid="ignore"):
        np.testing.assert_allclose(got[0], _softmax(x), rtol=2e-6, atol=1e-7)
    np.testing.assert_array_equal(got[3], x.argmax(1))


def test_dynamic_batch_one_library_with_row_blocks():
    from rlxc.dynone import FALLBACKS, one_library
    from rlxc.lowering.cpu.dynsizes import lower_dynamic, module_symbols
    from rlxc.registry import backend

    f = Func("rl_dyn", lambda s: s.input("a", ("B", 96)).layer_norm(-1, 1e-5).softmax(1))
    prog = lower_dynamic(f.module, module_symbols(f.module), "rl_dyn")
    assert any(b.kind == "local" for b in prog.buffers)
    assert one_library(f, backend("cpu")) is not None, FALLBACKS.get(f.ir_hash())
    for B in (1, 3, 64, 301):
        x = RNG.standard_normal((B, 96)).astype(np.float32)
        x64 = x.astype(np.float64)
        z = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-5)
        np.testing.assert_allclose(f.run(a=x)[0], _softmax(z), rtol=1e-5, atol=1e-6)


def test_dynamic_columns_keep_workspace_temps():
    """A block size that changes with the size (the exponentials: 4 rows of N) is not
    localized, since the samples disagree; the row maxima and sums (4 each at every size)
    are; the program still merges into one size-generic library."""
    from rlxc.lowering.cpu.dynsizes import lower_dynamic, module_symbols

    f = Func("rl_dyncols", lambda s: s.input("a", (8, "N")).softmax(1))
    prog = lower_dynamic(f.module, module_symbols(f.module), "rl_dyncols")
    kinds = sorted((b.kind, str(b.numel)) for b in prog.buffers if b.kind in ("temp", "local"))
    assert kinds == [("local", "4"), ("local", "4"), ("temp", "8*N")], kinds
    for n in (1, 5, 200):
        x = RNG.standard_normal((8, n)).astype(np.float32)
        np.testing.assert_allclose(f.run(a=x)[0], _softmax(x), rtol=2e-6, atol=1e-7)


def test_grad_through_layer_norm_row_blocks():
    shape = (10, 40)
    x = RNG.standard_normal(shape).astype(np.float32)
    w = RNG.standard_normal(shape).astype(np.float32)
    f = Func("rl_grad", lambda s: (s.input("a", shape).layer_norm(-1, 1e-5)
                                   * s.input("w", shape)).sum())
    assert _locals(emit_loops(f.grad(["a"]).module))
    g = f.grad(["a"]).jit().run(a=x, w=w)[0]

    def ref(a):
        mu = a.mean(1, keepdims=True)
        return ((a - mu) / np.sqrt(((a - mu) ** 2).mean(1, keepdims=True) + 1e-5) * w).sum()
    np.testing.assert_allclose(g, fd_grad(ref, x.astype(np.float64)), rtol=2e-3, atol=2e-4)

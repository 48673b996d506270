"""Maps that read across rows (transposes) run in 8 x 8 tiles (lowering/cpu/tiles.py).

Golden IR: a transpose's two loops become the four tile loops (`ti`/`tj` block loops, `tr`/
`tc` loops inside a tile); a map whose reads run along its rows keeps its plain loop.
Numerics: every element where NumPy puts it, for sizes that are and are not multiples of the
tile, batched (a 3-D swap of the last two axes), fused with elementwise ops and a second,
row-wise operand, for f32/f64/i32, on 1 and 2 threads.
"""
import re

import numpy as np
import pytest

from rlxc import Func
from rlxc.lowering.cpu import indexing as ix, loops, tiles
from rlxc.lowering.cpu.driver import emit_llvm

RNG = np.random.default_rng(5)
NP = {"f32": np.float32, "f64": np.float64, "i32": np.int32}


def _tiled(text):
    return re.search(r"\.tihead", text) is not None and re.search(r"\.tchead", text) is not None


def test_golden_transpose_is_tiled_and_row_maps_are_not():
    assert _tiled(emit_llvm(Func("t", lambda s: s.input("a", (300, 200)).T).module, "t"))
    rows = Func("r", lambda s: s.input("a", (300, 200)) * 2.0 + s.input("b", (200,)))
    assert not _tiled(emit_llvm(rows.module, "r"))


def test_applies_needs_a_read_across_rows_along_the_inner_loop():
    a, o = loops.Buffer("a", "input", "f32", 64 * 64), loops.Buffer("o", "output", "f32", 64 * 64)
    i, j = ix.Var("i", 64), ix.Var("j", 64)

    def nest(src_off):
        st = loops.Store(o, ix.var(i) * 64 + ix.var(j), loops.Load(a, src_off))
        return loops.For(i, ix.ZERO, ix.const(64), [loops.For(j, ix.ZERO, ix.const(64), [st])])
    assert tiles.applies(nest(ix.var(i) + ix.var(j) * 64))         # a transpose
    assert not tiles.applies(nest(ix.var(i) * 64 + ix.var(j)))     # a copy along rows
    assert not tiles.applies(nest(ix.var(i) * 2 + ix.var(j) * 64))  # not contiguous along i


@pytest.mark.parametrize("dt", ["f32", "f64", "i32"])
@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (8, 8), (9, 7), (17, 65), (100, 130),
                                   (256, 300)])
def test_transpose_matches_numpy(shape, dt):
    x = (RNG.standard_normal(shape) * 100).astype(NP[dt])
    got = Func(f"tr_{dt}", lambda s: s.input("a", shape, dt).T).jit().run(a=x)[0]
    np.testing.assert_array_equal(got, x.T)


def test_batched_fused_and_threads():
    B, R, C = 3, 130, 90
    x = RNG.standard_normal((B, R, C)).astype(np.float32)
    y = RNG.standard_normal((B, C, R)).astype(np.float32)

    def build(s):
        a = s.input("a", (B, R, C)).transpose((0, 2, 1))
        return (a * 2.0 + s.input("b", (B, C, R))).tanh()
    f = Func("trfused", build)
    assert _tiled(emit_llvm(f.module, "trfused"))
    want = np.tanh(np.swapaxes(x, 1, 2).astype(np.float64) * 2 + y)
    j = f.jit()
    for t in (1, 2):
        j.set_num_threads(t)
        np.testing.assert_allclose(j.run(a=x, b=y)[0], want, rtol=3e-6, atol=3e-7)
    big = RNG.standard_normal((1024, 1000)).astype(np.float32)
    jb = Func("trbig", lambda s: s.input("a", (1024, 1000)).T).jit()
    for t in (1, 2):
        jb.set_num_threads(t)
        np.testing.assert_array_equal(jb.run(a=big)[0], big.T)


@pytest.mark.parametrize("shape,perm", [(("N", 100, 90), (0, 2, 1)), ((70, "N"), (1, 0))])
def test_dynamic_sizes_keep_one_library(shape, perm):
    """A dynamic program compiles once for every size (a symbolic stride is not tiled: its
    abs() raised in the size-generic codegen, and the Func fell back to per-size programs)."""
    f = Func("trdyn" + str(len(shape)), lambda s: s.input("x", shape).transpose(perm))
    j = f.jit()
    assert j._one is not None
    for n in (3, 64):
        x = RNG.standard_normal(tuple(n if d == "N" else d for d in shape)).astype(np.float32)
        np.testing.assert_array_equal(j.run(x=x)[0], np.transpose(x, perm))

"""benchmarks/fma_peak.py: the FMA loop computes what it claims (so the timed loop is the
loop of FMAs, not something LLVM folded away), and compare.py's header reports its peak."""
import math

import pytest

from scripts import load_script


def _peak():
    return load_script("benchmarks/fma_peak.py", "fma_peak")


@pytest.mark.parametrize("cpu", ["native", "x86-64-v3"])
def test_loop_matches_the_fma_recurrence(cpu):
    fp = _peak()
    f, chains, vl = fp.build(cpu)
    assert chains == fp.chains_for(vl) and vl in (4, 8, 16)
    for iters in (0, 1, 2, 9, 40):
        got, want = f(iters, fp.A, fp.C), fp.reference(iters, vl)
        assert got == pytest.approx(want, rel=1e-6), iters
    # a different a and c change the result: the loop is not folded at compile time
    assert f(9, 0.5, 0.5) != pytest.approx(f(9, fp.A, fp.C), rel=1e-6)


def test_measure_is_a_rate():
    fp = _peak()
    med, best = fp.measure("x86-64-v3", threads=1, reps=3, seconds=0.01)
    assert 0 < med <= best and math.isfinite(best)
    vl, g = fp.summary("x86-64-v3", threads=2)
    assert vl == 8 and sorted(g) == [1, 2]


def test_compare_header_line():
    cmp = load_script("benchmarks/compare.py", "compare")
    peak, line = cmp.fma_peak_line("x86-64-v3", 1)
    assert peak > 0 and line.startswith("FMA peak (ymm")
    assert cmp.mlp_flops() == 2 * 128 * (784 * 512 + 512 * 512 + 512 * 10)

"""Float max/min reductions (lowering/cpu/fastminmax.py): a maxnum pass, and the exact
llvm.maximum pass only after a NaN or a zero result.  The results must be bit for bit
those of IEEE 754-2019 maximum/minimum (NaN propagates, -0 < +0) at every row length
and position: in the vector body, the interleaved part and the scalar remainder."""
from __future__ import annotations

import numpy as np
import pytest

import rlxc
from rlxc.lowering.cpu.driver import emit_llvm


def _ieee(x: np.ndarray, red: str) -> np.ndarray:
    """maximum/minimum along the last axis as IEEE 754-2019 says (NaN; -0 < +0)."""
    out = getattr(x, red)(-1)
    zero = out == 0
    if red == "max":
        pos = (x == 0) & ~np.signbit(x)
        out = np.where(zero, np.where(pos.any(-1), 0.0, -0.0), out)
    else:
        neg = (x == 0) & np.signbit(x)
        out = np.where(zero, np.where(neg.any(-1), -0.0, 0.0), out)
    return np.where(np.isnan(x).any(-1), np.nan, out).astype(x.dtype)


def _rows(n: int, dt) -> np.ndarray:
    r = np.random.default_rng(n)
    rows = [r.normal(size=n)]
    for pos in (0, n // 2, n - 1, max(n - 3, 0)):  # NaN in the body and in the remainder
        a = r.normal(size=n)
        a[pos] = np.nan
        rows.append(a)
    z = np.zeros(n)                                  # zero extremes of every sign mix
    rows += [z.copy(), -z, np.where(np.arange(n) % 2, 0.0, -0.0),
             np.where(np.arange(n) == n - 1, 0.0, -0.0), np.where(np.arange(n) == 0, -0.0, 0.0)]
    neg = -np.abs(r.normal(size=n)) - 1.0
    for pos in (0, n - 1):                           # the max is one zero among negatives
        a = neg.copy()
        a[pos] = -0.0
        rows.append(a)
        b = neg.copy()
        b[pos], b[(pos + 1) % n] = -0.0, 0.0
        rows.append(b)
    a = r.normal(size=n)                             # infinities: the exact pass decides
    a[n // 3] = np.inf
    rows += [a, -a, np.full(n, -np.inf), np.full(n, np.inf)]
    a = r.normal(size=n)
    a[min(1, n - 1)], a[max(n - 2, 0)] = np.inf, np.nan
    rows.append(a)
    return np.stack(rows).astype(dt)


def _same_bits(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan), (got, want)
    it = np.uint32 if got.dtype == np.float32 else np.uint64
    assert np.array_equal(got[~nan].view(it), want[~nan].view(it)), (got, want)


@pytest.mark.parametrize("dt", ["f32", "f64"])
@pytest.mark.parametrize("red", ["max", "min"])
@pytest.mark.parametrize("n", [1, 7, 64, 1000, 1031])
def test_rows_are_ieee_exact(dt, red, n):
    x = _rows(n, np.float32 if dt == "f32" else np.float64)
    f = rlxc.Func(f"fm_{red}_{dt}_{n}", lambda s: getattr(s.input("x", x.shape, dt), red)(1))
    (got,) = f.run_on("cpu", x=x)
    _same_bits(got, _ieee(x, red))
    # the same rows reversed: the order of the elements must not matter
    (got,) = f.run_on("cpu", x=np.ascontiguousarray(x[:, ::-1]))
    _same_bits(got, _ieee(x, red))


@pytest.mark.parametrize("red", ["max", "min"])
def test_jammed_rows_and_a_full_reduction(red):
    """Several rows per loop (reduce.py's unroll and jam) and one long row (the split
    reduction's chunks): each accumulator re-runs exactly from its own start value."""
    r = np.random.default_rng(7)
    x = r.normal(size=(64, 512)).astype(np.float32)
    x[3, 100] = np.nan
    x[9] = np.where(np.arange(512) % 3, -0.0, -1.0) if red == "max" else \
        np.where(np.arange(512) % 3, 0.0, 1.0)
    x[10, :] = 0.0
    x[10, 511] = -0.0
    f = rlxc.Func(f"fmj_{red}", lambda s: getattr(s.input("x", x.shape), red)(1))
    (got,) = f.run_on("cpu", x=x)
    _same_bits(got, _ieee(x, red))
    g = rlxc.Func(f"fmall_{red}", lambda s: getattr(s.input("x", x.shape).reshape(-1), red)(0))
    (got,) = g.run_on("cpu", x=x)
    _same_bits(np.asarray(got).reshape(-1)[:1], _ieee(x.reshape(1, -1), red))
    y = x.copy()
    y[3, 100] = 0.5
    (got,) = g.run_on("cpu", x=y)
    _same_bits(np.asarray(got).reshape(-1)[:1], _ieee(y.reshape(1, -1), red))


@pytest.mark.parametrize("red", ["max", "min"])
def test_nested_loops_carry_a_nan_or_zero_into_the_next_pass(red):
    """Reduced axes 0 and 2 around a kept axis 1: the inner loop runs once per i0 with
    the accumulator carried over, so a later pass starts from the NaN (or the zero) an
    earlier one left; the fast pass must not drop it."""
    r = np.random.default_rng(11)
    x = r.normal(size=(4, 3, 256)).astype(np.float32)
    x[0, 1, 5] = np.nan                               # kept index 1: NaN in the first pass
    x[:, 2, :] = -np.abs(x[:, 2, :]) - 1.0 if red == "max" else np.abs(x[:, 2, :]) + 1.0
    x[0, 2, 9] = 0.0                                  # kept index 2: +0 first, -0 later
    x[3, 2, 17] = -0.0
    f = rlxc.Func(f"fmn_{red}", lambda s: getattr(s.input("x", x.shape), red)((0, 2)))
    (got,) = f.run_on("cpu", x=x)
    want = _ieee(np.ascontiguousarray(x.transpose(1, 0, 2)).reshape(3, -1), red)
    _same_bits(got, want)


def test_argmax_rows_with_nan_and_ties():
    """argmax's max pass is this loop: first index of the max, or of the first NaN."""
    r = np.random.default_rng(3)
    x = r.normal(size=(32, 300)).astype(np.float32)
    x[1, 7] = x[1, 200] = 9.0                 # a tie: the first one
    x[2, 50], x[2, 10] = np.nan, 9.0          # a NaN after the max: the NaN
    x[3] = -0.0
    x[3, 5] = 0.0                             # zeros: equal, so the first one (NumPy)
    f = rlxc.Func("fm_argmax", lambda s: s.input("x", x.shape).argmax(1))
    (got,) = f.run_on("cpu", x=x)
    np.testing.assert_array_equal(got, np.argmax(x, axis=1))


def test_short_loops_stay_exact_only():
    """A 2x2 max pool after a ReLU (windows whose max is 0 are common) keeps the one
    exact loop: no maxnum, no re-run."""
    f = rlxc.Func("fm_pool", lambda s: s.input("x", (2, 3, 8, 8)).relu().max_pool2d(2))
    ir_text = emit_llvm(f.module)
    assert "llvm.maxnum" not in ir_text and "llvm.maximum" in ir_text
    x = np.random.default_rng(5).normal(size=(2, 3, 8, 8)).astype(np.float32)
    (got,) = f.run_on("cpu", x=x)
    want = np.maximum(x, 0).reshape(2, 3, 4, 2, 4, 2).max((3, 5))
    _same_bits(got, want.astype(np.float32) + np.float32(0.0))


def test_the_fast_loop_and_its_exact_rerun_are_emitted():
    """Golden shape of the LLVM IR: maxnum with nnan nsz in the first loop, the exact
    llvm.maximum only in the loop behind the NaN-or-zero test."""
    f = rlxc.Func("fm_ir", lambda s: s.input("x", (16, 256)).max(1))
    ir_text = emit_llvm(f.module)
    fast = 'call nnan nsz float @"llvm.maxnum.f32"'
    exact = 'call float @"llvm.maximum.f32"'
    assert fast in ir_text and exact in ir_text
    assert ir_text.index(fast) < ir_text.index(exact)


@pytest.mark.parametrize("red", ["max", "min"])
def test_dynamic_row_length_one_library(tmp_path, monkeypatch, red):
    """A reduction over a dynamic axis (one size-generic library, export.py): its loop
    count is symbolic, so it takes the fast loop at every length, short ones included,
    and stays bit for bit IEEE (NaN, -0 < +0, infinities) at lengths 1 to 300."""
    import importlib
    import sys

    from rlxc import export as aot

    name = f"fmdyn_{red}"
    rows = _rows(1, np.float32).shape[0]       # (B, T) would not be size-generic (B*T)
    f = rlxc.Func(name, lambda s: getattr(s.input("x", (rows, "T")), red)(1))
    from rlxc.lowering.cpu import fastminmax

    monkeypatch.setenv("RLXC_CACHE_DIR", str(tmp_path / "cache"))   # build, not a cache hit
    fast = []
    real = fastminmax.minmax_loop
    monkeypatch.setattr(fastminmax, "minmax_loop", lambda *a, **k: (fast.append(a[2]),
                                                                    real(*a, **k)))
    spec = aot.spec_from_func(f, name, cpu="x86-64-v3")
    aot.build_artifact(spec, str(tmp_path))
    assert fast and not isinstance(fast[0].var.extent, int)   # the symbolic loop went fast
    sys.path.insert(0, str(tmp_path))
    try:
        pkg = importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp_path))
    for n in (1, 5, 63, 64, 300):
        x = _rows(n, np.float32)
        (got,) = pkg.run(x=x)
        _same_bits(got, _ieee(x, red))
        (got,) = pkg.run(x=np.ascontiguousarray(x[:, ::-1]))
        _same_bits(got, _ieee(x, red))

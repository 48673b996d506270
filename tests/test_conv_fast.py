"""Regression tests of the CPU convolution speed work (issues 15 W9 and 17 CNN):

- im2col is a gather at constant indices that are affine in their position
  (dialect/conv_decompose.py makes them (C, kH, kW, OH, OW)); the CPU lowering turns
  such a gather into a strided view (lowering/cpu/fusion.py affine_constant_index), so
  the im2col kernel reads the image at affine offsets: no index load, no division of
  a loaded index, no runtime range check;
- a reshape of a materialized buffer reads it at the same row-major offset (no
  div/mod round trip), so the 6-D im2col result is a contiguous sgemm operand;
- a gather with more entries than its table reads the table through an expanding map,
  so a computed table (the padded image) is materialized once, not padded per window;
- the per-image GEMMs of a batched conv split over the threads (MatmulKernel.par_batch),
  one scratch slice per thread.
Each case is checked against the float64 interpreter (odd sizes, stride, dilation,
padding, groups, batch 1 and many)."""
import re

import numpy as np
import pytest

import rlxc
from rlxc.lowering.cpu.driver import lower
from rlxc.lowering.cpu.loops import CheckKernel, LoopKernel, format_program

rng = np.random.default_rng(1517)

CASES = [  # (N, C, H, W), (O, kH, kW), stride, padding, dilation, groups
    ((1, 1, 8, 8), (8, 3, 3), 1, 1, 1, 1),
    ((5, 3, 11, 9), (4, 5, 3), (2, 1), (2, 1), 1, 1),
    ((2, 4, 10, 13), (6, 3, 3), 1, 0, (2, 3), 2),
    ((3, 3, 12, 12), (6, 5, 5), 1, 0, 1, 1),
    ((2, 6, 7, 7), (6, 3, 3), 2, 1, 1, 3),
]


def _build(case):
    (n, c, h, w), (o, kh, kw), stride, pad, dil, g = case

    def build(s):
        y = s.input("x", (n, c, h, w)).conv2d(s.param("w", (o, c // g, kh, kw)), s.param("b", (o,)),
                                             stride=stride, padding=pad, dilation=dil, groups=g)
        return y.relu().sum(axes=(2, 3)), y
    return build


def _gather_kernels(prog):
    return [k for k in prog.kernels if isinstance(k, LoopKernel) and "gather" in k.what]


@pytest.mark.parametrize("case", CASES, ids=[str(k) for k in range(len(CASES))])
def test_im2col_is_an_affine_view(case):
    f = rlxc.Func("cf", _build(case))
    prog = lower(f.module)
    assert not [k for k in prog.kernels if isinstance(k, CheckKernel)]
    (k,) = _gather_kernels(prog)
    text = format_program(prog)
    body = text[text.index(f"kernel {k.name}"):]
    body = body[:body.index("\n\n")] if "\n\n" in body else body
    body = body.split("\n", 1)[1]   # the loops, without the header line
    # the gather's own stores (rowfuse.py may have put the pad of each image in its loop)
    out = re.search(r"rlx\.gather -> (%\w+)", k.what).group(1)
    body = "\n".join(line for line in body.splitlines() if line.strip().startswith(out + "["))
    assert body
    assert "//" not in body and " % " not in body, body   # no index arithmetic on loads
    assert "%c" not in body, body                           # the constant indices are not read
    assert "select" not in body and "clamp" not in body, body  # padded once, by its own kernel


@pytest.mark.parametrize("case", CASES, ids=[str(k) for k in range(len(CASES))])
def test_conv_forward_and_grads_match_interpreter(case):
    (n, c, h, w), (o, kh, kw), *_, g = case
    P = {"w": rng.standard_normal((o, c // g, kh, kw)).astype(np.float32),
         "b": rng.standard_normal(o).astype(np.float32)}
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    f = rlxc.Func("cfw", _build(case)).with_params(P)
    for u, v in zip(f.run(x=x), f.run_on("interp", x=x)):
        np.testing.assert_allclose(u, v, rtol=1e-4, atol=1e-4)
    loss = rlxc.Func("cfl", lambda s: (_build(case)(s)[1] ** 2).sum()).with_params(P)
    gf = loss.grad_all()
    for u, v in zip(gf.run(x=x), gf.run_on("interp", x=x)):
        np.testing.assert_allclose(u, v, rtol=1e-4, atol=1e-3)


def test_non_affine_constant_gather_keeps_its_index_load():
    """A constant index that is not affine in its position is still loaded (and correct)."""
    idx = np.array([[3, 0], [1, 2]], np.int32)
    f = rlxc.Func("na", lambda s: s.input("x", (2, 4)).gather(idx, axis=1))
    assert "%c" in format_program(lower(f.module))
    x = rng.standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_array_equal(f.run(x=x)[0], np.take(x, idx, axis=1))


def test_affine_constant_gather_out_of_range_still_raises():
    """An affine constant index that leaves the table is not treated as a view."""
    idx = np.array([1, 3, 5], np.int32)
    f = rlxc.Func("oob2", lambda s: s.input("x", (5,)).gather(idx))
    with pytest.raises(IndexError, match="out of range"):
        f.run(x=np.arange(5, dtype=np.float32))


def test_batched_conv_gemms_split_over_threads(monkeypatch):
    """Per-image GEMMs too small for an sgemm team run as a batch loop over the threads; the
    result is the same with 1 and 2 threads and matches the interpreter."""
    from rlxc.lowering.cpu.loops import MatmulKernel

    case = ((16, 3, 12, 12), (6, 3, 3), 1, 1, 1, 1)
    f = rlxc.Func("cft", _build(case))
    (mm,) = [k for k in lower(f.module, max_threads=2).kernels if isinstance(k, MatmulKernel)]
    assert mm.par_batch == 2 and mm.batch
    (mm1,) = [k for k in lower(f.module, max_threads=1).kernels if isinstance(k, MatmulKernel)]
    assert mm1.par_batch == 1 and mm.scratch.numel >= 2 * mm1.scratch.numel
    monkeypatch.setenv("RLXC_ADAPTIVE_THREADS", "0")
    P = {"w": rng.standard_normal((6, 3, 3, 3)).astype(np.float32),
         "b": rng.standard_normal(6).astype(np.float32)}
    x = rng.standard_normal((16, 3, 12, 12)).astype(np.float32)
    j = f.with_params(P).jit()
    want = f.with_params(P).run_on("interp", x=x)
    for t in (1, 2):
        j.set_num_threads(t)
        for u, v in zip(j.run(x=x), want):
            np.testing.assert_allclose(u, v, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", [CASES[1], CASES[2]], ids=["strided", "grouped"])
def test_conv_fast_paths_on_the_avx2_build(tmp_path, monkeypatch, case):
    """The affine im2col, the materialized pad and the batch team built for x86-64-v3 (AVX2,
    the portable target) give the interpreter's forward and filter gradient."""
    from rlxc import export
    from rlxc.runtime import load

    (n, c, h, w), (o, kh, kw), *_, g = case
    P = {"w": rng.standard_normal((o, c // g, kh, kw)).astype(np.float32),
         "b": rng.standard_normal(o).astype(np.float32)}
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    f = rlxc.Func("cfa", lambda s: (_build(case)(s)[1] ** 2).sum()).with_params(P)
    gf = f.value_and_grad_all()
    d = tmp_path / "a"
    meta = export.build_artifact(export.spec_from_func(gf, "cfa", cpu="x86-64-v3"), str(d))
    assert meta["cpu"] == "x86-64-v3"
    monkeypatch.setenv("RLXC_ADAPTIVE_THREADS", "0")
    want = gf.run_on("interp", x=x)
    for t in (1, 2):
        monkeypatch.setenv("RLXC_NUM_THREADS", str(t))
        for u, v in zip(load(d, new=True).run(x=x), want):
            np.testing.assert_allclose(u, v, rtol=1e-4, atol=1e-3)

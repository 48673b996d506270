"""Every rlx op compiled by the native CPU backend, against the NumPy interpreter.

Many op checks share one compiled function (one output per op) to keep
compile time down.  Tolerances:
- exact arithmetic (add/mul/compare/shape ops/casts/fake_quant): bitwise or
  rtol 1e-6 (same IEEE operations as NumPy; sums may reassociate);
- transcendentals: rtol 2e-6, atol 1e-6 (mathlib's bounds are <= 8 ulp, the
  interpreter's float32 NumPy functions have their own few-ulp errors, and
  e.g. gelu_tanh's reference cancels for negative x);
- large reductions (1M elements) against a float64 reference:
  |got - ref| <= 1e-6 * sum(|x|) for sums (f32 blocks of 4096 accumulated in
  f64, see lowering/cpu/reduce.py), exact for max/min.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import rlxc
from rlxc import Func
from rlxc.dialect import ops as O
from rlxc.dialect.interpreter import interpret
from rlxc.lowp import BUILTIN_FORMATS, quantize

from opcases import CASES

RNG = np.random.default_rng(1234)
UNARY = [n for n in O.UNARY]


def run_both(f, inputs):
    return f.run_on("cpu", **inputs), f.run_on("interp", **inputs)


def check(f, inputs, rtol=1e-6, atol=1e-7, names=None):
    got, ref = run_both(f, inputs)
    assert len(got) == len(ref)
    for k, (g, r) in enumerate(zip(got, ref)):
        what = names[k] if names else f"output {k}"
        assert g.shape == r.shape, f"{what}: shape {g.shape} vs {r.shape}"
        assert g.dtype == r.dtype, f"{what}: dtype {g.dtype} vs {r.dtype}"
        if g.dtype.kind in "biu":
            np.testing.assert_array_equal(g, r, err_msg=what)
        else:
            np.testing.assert_allclose(g, r, rtol=rtol, atol=atol, equal_nan=True, err_msg=what)
    return got


# ---------------------------------------------------------------- every op, once

def test_every_op_in_one_module():
    """All op cases of tests/opcases.py as the outputs of one compiled function."""
    names = sorted(CASES)

    def build(s):
        outs = []
        for n in names:
            b, _, inputs = CASES[n]
            ts = {k: s.input(f"{n}__{k}", v.shape) for k, v in inputs.items()}
            outs.append(b(s, **ts))
        return outs

    f = Func("all_ops", build)
    inputs = {f"{n}__{k}": v for n in names for k, v in CASES[n][2].items()}
    used = {op.name for op in f.module.walk() if op.name.startswith("rlx.")}
    missing = set(O.OPS) - used
    assert not missing, f"op cases do not cover {sorted(missing)}"
    check(f, inputs, rtol=2e-6, atol=1e-6, names=names)


# ---------------------------------------------------------------- unary family

SHAPES = [(), (1,), (3,), (7,), (17,), (33,), (1, 5), (4, 1), (3, 7), (2, 3, 5), (2, 1, 17),
          (1000,)]


def _values(shape, lo=-3.0, hi=3.0):
    x = RNG.uniform(lo, hi, size=shape).astype(np.float32)
    return x


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_unary_family(shape):
    def build(s):
        x = s.input("x", shape)
        return [getattr(x, n)() for n in UNARY] + [x.fake_quant("e4m3"), x.fake_quant("bf16")]

    check(Func("unary", build), {"x": _values(shape)}, rtol=2e-6, atol=1e-6,
          names=UNARY + ["fq_e4m3", "fq_bf16"])


def test_unary_wide_range():
    """exp/log/tanh/sigmoid/... over a wide range including under/overflow."""
    x = np.concatenate([np.linspace(-100, 100, 2001), np.logspace(-30, 30, 301),
                        -np.logspace(-30, 30, 301)]).astype(np.float32)
    ops_ = ["exp", "log", "tanh", "sigmoid", "softplus", "silu", "gelu", "erf", "sqrt", "rsqrt",
            "reciprocal", "abs", "sign", "relu", "neg"]

    def build(s):
        v = s.input("x", x.shape)
        return [getattr(v, n)() for n in ops_]

    f = Func("wide", build)
    got = f.run_on("cpu", x=x)
    ref = interpret(f.module, [x], float_dtype=np.float64)  # accurate reference
    x64 = x.astype(np.float64)
    # the interpreter's 0.5x(1+erf(x/sqrt2)) cancels for x < -8 even in float64: use erfc
    ref[ops_.index("gelu")] = 0.5 * x64 * np.vectorize(math.erfc)(-x64 / math.sqrt(2))
    for n, g, r in zip(ops_, got, ref):
        with np.errstate(over="ignore"):
            r32 = r.astype(np.float32)
        np.testing.assert_allclose(g, r32, rtol=4e-6, atol=1e-44, equal_nan=True, err_msg=n)


def test_sin_cos_range():
    """sin/cos on a dense range of ordinary arguments (huge ones: tests/test_mathlib.py)."""
    x = np.linspace(-2e4, 2e4, 40001).astype(np.float32)

    def build(s):
        v = s.input("x", x.shape)
        return [v.sin(), v.cos()]

    check(Func("trig", build), {"x": x}, rtol=1e-5, atol=2e-6)


# ---------------------------------------------------------------- binary / compare / select

PAIRS = [((3,), ()), ((), (4,)), ((1,), (7,)), ((17,), (17,)), ((4, 1), (1, 5)),
         ((2, 3, 5), (5,)), ((2, 1, 3), (4, 1)), ((33,), (1,)), ((3, 1, 7), (3, 4, 1))]
BINARY = ["add", "sub", "mul", "div", "maximum", "minimum", "pow"]
COMPARE = ["eq", "ne", "lt", "le", "gt", "ge"]


@pytest.mark.parametrize("sa,sb", PAIRS, ids=str)
def test_binary_compare_select(sa, sb):
    def build(s):
        x, y = s.input("x", sa), s.input("y", sb)
        outs = [x + y, x - y, x * y, x / y, x.maximum(y), x.minimum(y), (x.abs() + 0.5) ** y]
        outs += [getattr(x, c)(y) for c in COMPARE]
        outs.append(x.gt(y).where(x, y * 2.0))
        return outs

    x = np.round(RNG.uniform(-2, 2, sa) * 2).astype(np.float32) / 2
    y = np.round(RNG.uniform(-2, 2, sb) * 2).astype(np.float32) / 2
    y = np.where(y == 0, np.float32(0.5), y).astype(np.float32)
    check(Func("binary", build), {"x": x, "y": y}, rtol=2e-6, atol=1e-6,
          names=BINARY + COMPARE + ["select"])


def test_pow_constant_exponents():
    def build(s):
        x = s.input("x", (9,))
        return [x ** 2, x ** 2.0, x ** 1.0, x ** 0.0, x ** -1.0, x ** 3.0, x ** 0.5]

    x = np.array([-2, -1, -0.0, 0, 0.5, 1, 3, np.inf, np.nan], np.float32)
    check(Func("powc", build), {"x": x}, rtol=1e-6)


def test_integer_and_mask_ops():
    def build(s):
        a, b = s.input("a", (7,), "i32"), s.input("b", (7,), "i32")
        c = s.input("c", (7,), "i64")
        m = a.gt(b)
        return [a + b, a - b, a * b, a.maximum(b), a.minimum(b), a.lt(b), a.eq(b), a.ne(b),
                a.sum(), a.max(), a.min(), a.cast("f32"), a.cast("i64") + c, c.cast("i32"),
                m, m.cast("f32"), m.cast("i32"), m.where(a, b),
                s.emit(O.OPS["rlx.max"], [m], axes=(0,), keepdims=False),
                s.emit(O.OPS["rlx.min"], [m], axes=(0,), keepdims=False),
                s.emit(O.OPS["rlx.sum"], [m], axes=(0,), keepdims=False),
                a.cast("f32").cast("i1"), (a.cast("f32") * 0.7).cast("i32"), a / b]

    a = np.array([3, -7, 0, 12, -1, 5, 100], np.int32)
    b = np.array([2, 2, -3, 12, 4, -5, 7], np.int32)
    c = np.array([1, 2, 3, 4, 5, 6, 1 << 40], np.int64)
    check(Func("ints", build), {"a": a, "b": b, "c": c})


def test_mask_inputs_and_outputs():
    def build(s):
        m = s.input("m", (2, 5), "i1")
        x = s.input("x", (2, 5))
        return [m.where(x, -x), m, m.cast("f32").sum(1), x.gt(0.0).cast("f32").mean()]

    m = RNG.random((2, 5)) > 0.5
    check(Func("masks", build), {"m": m, "x": RNG.standard_normal((2, 5)).astype(np.float32)})


# ---------------------------------------------------------------- reductions

RED_CASES = [((1,), None), ((7,), 0), ((3, 5), 0), ((3, 5), 1), ((3, 5), None),
             ((4, 1, 33), (0, 2)), ((4, 1, 33), 1), ((2, 3, 4, 5), (1, 3)),
             ((2, 3, 4, 5), (0, 1)), ((2, 3, 4, 5), (2, 3)), ((17, 3), -1), ((5, 0), 1),
             ((6, 7), (0, 1))]


@pytest.mark.filterwarnings("ignore:Mean of empty slice")  # the interpreter's, on (5, 0)
@pytest.mark.parametrize("shape,axes", RED_CASES, ids=str)
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions(shape, axes, keepdims):
    kinds = ["sum", "mean", "prod"] + (["max", "min"] if 0 not in shape else [])

    def build(s):
        x = s.input("x", shape)
        return [getattr(x * 1.0 + 0.0, k)(axes, keepdims=keepdims) for k in kinds] + \
            [(x.exp() * 0.5).sum(axes, keepdims=keepdims)]

    x = RNG.uniform(0.5, 1.5, shape).astype(np.float32)
    check(Func("red", build), {"x": x}, rtol=3e-6, atol=1e-6, names=kinds + ["fused_exp_sum"])


def test_large_reductions_vs_float64():
    n = 1 << 20
    x = RNG.standard_normal(n).astype(np.float32)
    p = (1 + RNG.standard_normal(n) * 1e-4).astype(np.float32)

    def build(s):
        v, q = s.input("x", (n,)), s.input("p", (n,))
        return [v.sum(), v.mean(), v.max(), v.min(), q.prod(), (v * v).sum(), v.abs().sum()]

    got = Func("bigred", build).run(x=x, p=p)
    x64 = x.astype(np.float64)
    s_abs = np.abs(x64).sum()
    assert abs(got[0] - x64.sum()) <= 1e-6 * s_abs
    assert abs(got[1] - x64.mean()) <= 1e-6 * s_abs / n
    assert got[2] == x.max() and got[3] == x.min()
    assert abs(got[4] / np.prod(p.astype(np.float64)) - 1) < 1e-5
    assert abs(got[5] / (x64 * x64).sum() - 1) < 1e-6
    assert abs(got[6] / s_abs - 1) < 1e-6


def test_large_reduction_leading_axis():
    """Buffer-mode reduction (reduced axis outside the contiguous one)."""
    x = RNG.standard_normal((1 << 14, 16)).astype(np.float32)
    got = Func("axis0", lambda s: s.input("x", x.shape).sum(0)).run(x=x)[0]
    ref = x.astype(np.float64).sum(0)
    bound = 1e-5 * np.abs(x.astype(np.float64)).sum(0)
    assert np.all(np.abs(got - ref) <= bound)


def test_zero_d():
    def build(s):
        x, y = s.input("x", ()), s.input("y", (3,))
        return [x.exp(), x * y, (y * x).sum(), y.sum(keepdims=True), x + 1.0]

    check(Func("zerod", build), {"x": np.float32(0.7), "y": np.arange(3, dtype=np.float32)},
          rtol=2e-6)


# ---------------------------------------------------------------- NaN / inf

def test_nan_inf_propagation():
    """NaN in gives NaN out; +-inf as IEEE says.  At x = -inf gelu/silu/gelu_tanh give
    their limit -0 (not the -inf*0 = NaN of the x*sigmoid(x) formula), in the interpreter
    and the compiled kernels alike."""
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 1e-40], np.float32)
    un = ["exp", "tanh", "sigmoid", "relu", "log", "sqrt", "softplus", "gelu", "silu", "erf",
          "abs", "neg", "sin", "cos", "sign", "gelu_tanh"]
    limit_at_minus_inf = {"gelu", "silu", "gelu_tanh"}

    def build(s):
        v = s.input("x", x.shape)
        r = s.input("r", (2, 4))
        return [getattr(v, n)() for n in un] + [
            v.maximum(1.0), v.minimum(1.0), v.max(), v.min(), v.sum(), r.max(1), r.min(1),
            r.sum(1), r.prod(1), v.fake_quant("e4m3"), v.fake_quant("f16")]

    f = Func("nan", build)
    got, ref = run_both(f, {"x": x, "r": x.reshape(2, 4)})
    for k, (g, r) in enumerate(zip(got, ref)):
        name = un[k] if k < len(un) else f"output {k}"
        if name in limit_at_minus_inf:
            for v, who in ((g, "cpu"), (r, "interpreter")):
                assert v[2] == 0 and np.signbit(v[2]), f"{who}: {name}(-inf) should be -0"
        np.testing.assert_allclose(g, r, rtol=2e-6, atol=1e-30, equal_nan=True, err_msg=name)
    for k in range(len(un)):
        assert np.isnan(got[k][0]), f"{un[k]}(NaN) is not NaN"
    assert np.isnan(got[len(un) + 2]) and np.isnan(got[len(un) + 3])
    assert np.isnan(got[len(un) + 5][0])


# ---------------------------------------------------------------- fake_quant bits

def test_fake_quant_matches_lowp_bitwise():
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1.1754942e-38,
                        1.1754944e-38, 3.4028235e38, -3.4028235e38, 0.5, 1.5, 2.5, 1e-8, 6e-8,
                        448.0, 464.0, 480.0, 65504.0, 65520.0, 57344.0, 61440.0], np.float32)
    bits = RNG.integers(0, 2 ** 32, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    ramp = np.concatenate([np.linspace(-10, 10, 2001), np.logspace(-50, 5, 400),
                           np.ldexp(1.0, np.arange(-149, 128)) * 1.5]).astype(np.float32)
    x = np.concatenate([special, bits, ramp, -ramp]).astype(np.float32)
    fmts = sorted(set(BUILTIN_FORMATS.values())) + [(8, 23, float(np.finfo(np.float32).max)), (1, 0, 1.0),
                                                    (8, 0, 1e38), (3, 9, 100.0)]

    def build(s):
        v = s.input("x", x.shape)
        return [s.emit(O.FakeQuantOp, [v], exp_bits=e, man_bits=m, max_normal=mx)
                for e, m, mx in fmts]

    got = Func("fq", build).run(x=x)
    for (e, m, mx), g in zip(fmts, got):
        with np.errstate(invalid="ignore"):  # random bit patterns include signaling NaNs
            ref = quantize(x, e, m, mx)
        same = (g.view(np.uint32) == ref.view(np.uint32)) | (np.isnan(g) & np.isnan(ref))
        assert same.all(), f"e{e}m{m}: {x[~same][:5]} -> {g[~same][:5]} vs {ref[~same][:5]}"


# ---------------------------------------------------------------- shape ops

def test_shape_ops():
    def build(s):
        x = s.input("x", (2, 3, 4))
        y = s.input("y", (6, 5))
        return [x.transpose(2, 0, 1), x.transpose(1, 0, 2) * 2.0, x.reshape(6, 4),
                x.reshape(4, 3, 2) + 1.0, x.reshape(24), x.reshape(2, 12).T,
                y[1:5:2, ::2], y[::3, 1:4] * y[::3, 1:4], x.broadcast_to((5, 2, 3, 4)),
                y[:, :1].broadcast_to((6, 5)) + y,
                s.emit(O.PadOp, [y], low=(1, 0), high=(2, 3)),
                s.emit(O.PadOp, [y.exp()], low=(0, 2), high=(0, 0)),
                rlxc.concat([y, y * 2.0, y[:2]], 0), rlxc.concat([x, x.exp()], 2),
                x.sum(2).reshape(3, 2).T, x.transpose(2, 1, 0).reshape(4, 6)[1:3]]

    check(Func("shapes", build), {"x": RNG.standard_normal((2, 3, 4)).astype(np.float32),
                                  "y": RNG.standard_normal((6, 5)).astype(np.float32)},
          rtol=2e-6)


@pytest.mark.parametrize("dt", ["i32", "i64"])
def test_gather_scatter(dt):
    npdt = np.int32 if dt == "i32" else np.int64

    def build(s):
        t = s.input("t", (10, 4))
        i = s.input("i", (5,), dt)
        j = s.input("j", (2, 3), dt)
        u = s.input("u", (5, 4))
        return [t.gather(i), t.gather(j), t.exp().gather(i) * 2.0,
                t.gather(s.input("k", (3,), dt), axis=1),
                s.emit(O.ScatterAddOp, [i, u], axis=0, dim=10),
                s.emit(O.ScatterAddOp, [i, u.T], axis=1, dim=10),
                s.emit(O.ScatterAddOp, [j, u[:2, :3] * 1.0], axis=0, dim=10)]

    inputs = {"t": RNG.standard_normal((10, 4)).astype(np.float32),
              "i": np.array([0, 9, 3, 3, 1], npdt), "j": np.array([[1, 2, 1], [0, 9, 5]], npdt),
              "u": RNG.standard_normal((5, 4)).astype(np.float32),
              "k": np.array([3, 0, 3], npdt)}
    check(Func("gath", build), inputs, rtol=2e-6)


@pytest.mark.parametrize("bad", [10, -1, 1 << 30])
def test_gather_out_of_range_raises(bad):
    f = Func("oob", lambda s: s.input("t", (10, 4)).gather(s.input("i", (3,), "i32")) * 2.0)
    t = np.ones((10, 4), np.float32)
    with pytest.raises(IndexError, match="rlx.gather"):
        f.run(t=t, i=np.array([0, bad, 2], np.int32))
    np.testing.assert_array_equal(f.run(t=t, i=np.array([0, 9, 2], np.int32))[0], 2 * t[:3])
    j = f.jit()
    with pytest.raises(IndexError, match="index out of range"):
        j.run(t=t, i=np.array([bad, 0, 0], np.int32))


def test_scatter_out_of_range_raises():
    f = Func("soob", lambda s: s.emit(O.ScatterAddOp, [s.input("i", (2,), "i64"),
                                                      s.input("u", (2, 3))], axis=0, dim=4))
    with pytest.raises(IndexError, match="rlx.scatter_add"):
        f.run(i=np.array([4, 0]), u=np.ones((2, 3), np.float32))
    with pytest.raises(IndexError):
        f.run(i=np.array([-5, 0]), u=np.ones((2, 3), np.float32))


# ---------------------------------------------------------------- matmul

MM = [((1, 1), (1, 1)), ((3, 7), (7, 5)), ((17, 33), (33, 1)), ((1, 9), (9, 17)),
      ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (5, 4, 6)), ((3, 300), (300, 70)), ((4, 0), (0, 3))]


@pytest.mark.parametrize("sa,sb", MM, ids=str)
def test_matmul(sa, sb):
    def build(s):
        a, b = s.input("a", sa), s.input("b", sb)
        return [a @ b]

    a = RNG.standard_normal(sa).astype(np.float32)
    b = RNG.standard_normal(sb).astype(np.float32)
    got = Func("mm", build).run(a=a, b=b)[0]
    ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
    scale = np.matmul(np.abs(a).astype(np.float64), np.abs(b).astype(np.float64))
    assert got.shape == ref.shape
    assert np.all(np.abs(got - ref) <= 1e-5 * np.sqrt(max(sa[-1], 1)) * scale + 1e-30)


def test_matmul_transposed_and_epilogues():
    def build(s):
        x, w, b = s.input("x", (37, 300)), s.input("w", (300, 45)), s.input("b", (45,))
        v = s.input("v", (45, 300))
        r = s.input("r", (37, 45))
        return [(x @ w + b).relu(), (x @ w + b).gelu(), x @ v.T + r, (x.T.T @ w) * 2.0 - 1.0,
                (x @ w).tanh() + (x @ w), ((x @ w) + b).sigmoid().sum(1)]

    ins = {k: RNG.standard_normal(s).astype(np.float32) / np.sqrt(s[-1]) for k, s in
           [("x", (37, 300)), ("w", (300, 45)), ("b", (45,)), ("v", (45, 300)), ("r", (37, 45))]}
    check(Func("mmepi", build), ins, rtol=2e-5, atol=2e-6)


# ---------------------------------------------------------------- errors

def test_f64_arithmetic_and_reductions():
    def build(s):
        x, y = s.input("x", (5,), "f64"), s.input("y", (5,))
        d = x * y.cast("f64") + 1.0
        return [d, (d * d).sum().sqrt(), d.max(), d.gt(2.0), (d / 3.0).cast("f32"),
                d.maximum(x).minimum(4.0).abs().rsqrt()]

    x = np.array([1e-20, 2.0, 3.0, -4.0, 1e300], np.float64)
    f = Func("f64ok", build)
    got = f.run(x=x, y=np.arange(5, dtype=np.float32))
    ref = interpret(f.module, [x, np.arange(5, dtype=np.float32)], float_dtype=np.float64)
    assert got[0].dtype == np.float64 and got[0][0] == 1.0  # 1e-20 * 0 + 1: f64 kept
    for g, r in zip(got, ref):
        with np.errstate(over="ignore"):
            np.testing.assert_allclose(g, r.astype(g.dtype), rtol=1e-15)


@pytest.mark.parametrize("op", ["exp", "tanh"])
def test_f64_transcendentals_compute_in_f64(op):
    """Regression (issue 20 item 5): these raised "rlx.<op> on f64 is not supported"."""
    x = np.array([-3.0, 0.25, 1.0])
    got = Func("f64", lambda s: getattr(s.input("x", (3,), "f64"), op)()).run_on("cpu", x=x)[0]
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, getattr(np, op)(x), rtol=1e-15)


def test_dtype_outside_an_op_is_a_clear_error():
    f = Func("fq64", lambda s: s.input("x", (3,), "f64").fake_quant("e4m3"))
    with pytest.raises(NotImplementedError, match="rlx.fake_quant on f64"):
        f.run_on("cpu", x=np.ones(3))


def test_cuda_without_a_gpu_is_a_clear_error():
    from rlxc.runtime import cuda

    if cuda.available():
        pytest.skip("a GPU is present: this checks the no-GPU error")
    f = Func("c", lambda s: s.input("x", (3,)) + 1.0)
    with pytest.raises(cuda.CudaUnavailable, match="CUDA is not available"):
        f.run_on("cuda", x=np.ones(3, np.float32))
    with pytest.raises(cuda.CudaUnavailable):
        f.jit_on("cuda")

"""Every elementwise op's edge cases on the CPU, the GPU emulator and the interpreter.

The rules are written once, in the header of lowering/shared/scalar.py; this runs
NaN, +-inf, +-0, subnormals, huge values, the integer extremes, zero divisors and
out-of-range indices through the three and compares:
  - exact ops (arithmetic, compares, casts, select, fake_quant, ...): bit for bit
    (a NaN only has to be a NaN: its payload and sign are not specified);
  - transcendentals (an op with a `math` property): the CPU and the GPU within the
    mathlib ulp bound of the float64 interpreter, the float32 interpreter on the
    same special values (NaN, +-inf);
  - pow: specials exactly (C99 pow), finite values within POW_ULP (CPU: float32 in float64,
    pow_exp_log; float64: libm) or, on
    the GPU (exp(y*log|x|)), within 2 + |y*log2|x|| ulp (inf within that of FLT_MAX);
  - gather / scatter_add with an index outside [0, d): the same IndexError.
The op lists are derived from the op table (dialect/shapes.py), so a new
elementwise op is checked here without a new line.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import rlxc
from rlxc.dialect.interpreter import interpret
from rlxc.dialect.shapes import SHAPES, UNARY_OPS
from rlxc.lowering.gpu import emu
from rlxc.lowering.shared import mathlib
from test_pow_const import host_fma

F32_EDGES = np.array([
    np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, -2.5, 2.0, 3.0, -3.0,
    1e-45, -1e-45, 1.1754944e-38, 3.4028235e38, -3.4028235e38, 1e30, -1e30, 2147483520.0,
    2147483648.0, -2147483648.0, 3e9, -3e9, 9.3e18, -9.3e18, 448.0, 464.0, 65504.0, 1e-8,
    0.625, -0.625, 20.0, -20.0, 88.7, -103.0, 1e5, -1e5, 25000.0, 0.1, -7.0, 7.0],
    np.float32)
I32_EDGES = np.array([0, 1, -1, 2, -2, 3, 7, -7, 31, 100, -100, 2 ** 31 - 1, -2 ** 31,
                      -2 ** 31 + 1], np.int32)
I64_EDGES = np.array([0, 1, -1, 2, -2, 7, -7, 63, 2 ** 53 + 1, -(2 ** 53) - 1, 2 ** 63 - 1,
                      -2 ** 63, -2 ** 63 + 1], np.int64)
BIN_F32 = F32_EDGES[[0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 14, 16, 17, 19, 22, 36, 42]]


def _pairs(v):
    return np.repeat(v, len(v)), np.tile(v, len(v))


def _same_bits(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.dtype, want.dtype)
    if got.dtype.kind == "f":
        gn, wn = np.isnan(got), np.isnan(want)
        bad = (gn != wn) | (~gn & (got.view(f"u{got.itemsize}") != want.view(f"u{got.itemsize}")))
    else:
        bad = got != want
    assert not bad.any(), f"{what}: differs at {np.flatnonzero(bad)[:8]}: got " \
        f"{got[bad][:8]}, want {want[bad][:8]}"


def _ulps(got, ref):
    """|got - ref| in float32 ulps of ref (ref: float64; subnormal ulp 2^-149)."""
    r32 = np.minimum(np.abs(ref), 3.4028234663852886e38).astype(np.float32)
    ulp = np.maximum(np.spacing(np.minimum(r32, np.float32(2.0 ** 127))).astype(np.float64),
                     2.0 ** -149)
    return np.abs(got.astype(np.float64) - ref) / ulp


class Run:
    """One function on the three executors."""

    def __init__(self, name, build):
        self.f = rlxc.Func(name, build)

    def all(self, **inputs):
        args = self.f.bind_call((), inputs)
        return {"cpu": self.f.run_on("cpu", **inputs),
                "gpu-emu": emu.emulate(self.f.module, args),
                "interp": interpret(self.f.module, args)}

    def ref64(self, **inputs):
        return interpret(self.f.module, self.f.bind_call((), inputs), float_dtype=np.float64)


def _unary(name, dt="f32", params=None):
    return Run(f"u_{name[4:]}_{dt}", lambda s: s.emit(name, [s.input("x", (len(F32_EDGES),),
                                                                       dt)], **(params or {})))


def _binary(name, n, dt):
    return Run(f"b_{name[4:]}_{dt}", lambda s: s.emit(name, [s.input("x", (n,), dt),
                                                             s.input("y", (n,), dt)]))


def _check_exact(res):
    want = res["interp"]
    for k in ("cpu", "gpu-emu"):
        for i, (g, w) in enumerate(zip(res[k], want)):
            _same_bits(g, w, f"{k} output {i}")


# ---------------------------------------------------------------- unary float ops

EXACT_UNARY = [f"rlx.{n}" for n, (_, p) in UNARY_OPS.items() if not p.get("math")]
MATH_UNARY = [f"rlx.{n}" for n, (_, p) in UNARY_OPS.items() if p.get("math")]


@pytest.mark.parametrize("name", EXACT_UNARY)
@pytest.mark.parametrize("dt", ["f32", "f64"])
def test_exact_unary(name, dt):
    if dt not in SHAPES[name].dtypes:
        pytest.skip(f"{name} computes in {SHAPES[name].dtypes}")
    x = F32_EDGES.astype(dt.replace("f", "float"))
    _check_exact(_unary(name, dt).all(x=x))


def _erf(v):
    return np.vectorize(math.erf, otypes=[np.float64])(v)


def _erfc(v):
    return np.vectorize(math.erfc, otypes=[np.float64])(v)


def _sig(v):
    return np.exp(-np.logaddexp(0.0, -v))


# float64 references free of cancellation where the textbook formula has it (the
# interpreter's formulas lose digits in the tails); other ops: the interpreter in f64
EXACT64 = {
    "gelu": lambda x: 0.5 * x * _erfc(-x / math.sqrt(2)),
    "gelu_tanh": lambda x: x * _sig(2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)),
    "silu": lambda x: x * _sig(x),
    "sigmoid": _sig,
    "erf": _erf,
}


def _bound(name, x, ref):
    op = SHAPES[name].math
    b = np.full(x.shape, mathlib.SUPPORTED[op], np.float64)
    if op == "gelu_tanh":   # the header's bound below GELU_TANH_EXACT_FROM
        w = 2 * np.sqrt(2 / np.pi) * (x + 0.044715 * x.astype(np.float64) ** 3)
        b = np.where(x < mathlib.GELU_TANH_EXACT_FROM, 4 + 3 * np.abs(w), b)
    return b


@pytest.mark.parametrize("name", MATH_UNARY)
def test_transcendental_unary(name):
    x = F32_EDGES
    r = _unary(name)
    _check_math(name, x, r.all(x=x), r.ref64(x=x)[0])


def _check_math(name, x, res, ref):
    """The CPU and GPU emulator within the op's ulp bound of the float64 reference `ref`
    (NaN, inf and the sign of zero exactly); the float32 interpreter on NaN and inf."""
    exact = EXACT64.get(SHAPES[name].math)
    if exact is not None:
        with np.errstate(all="ignore"):
            ref = np.where(np.isfinite(x), exact(x.astype(np.float64)), ref)
    with np.errstate(over="ignore"):
        ref32 = ref.astype(np.float32)        # the exact result rounded: inf past FLT_MAX
    inf = np.isinf(ref32)
    zero = ref == 0
    for k in ("cpu", "gpu-emu", "interp"):
        g = res[k][0]
        assert g.dtype == np.float32
        np.testing.assert_array_equal(np.isnan(g), np.isnan(ref), err_msg=f"{k}: NaN")
        np.testing.assert_array_equal(g[inf], ref32[inf], err_msg=f"{k}: inf")
        if k == "interp":
            continue
        np.testing.assert_array_equal(np.signbit(g[zero]), np.signbit(ref[zero]),
                                      err_msg=f"{k}: sign of zero")
        m = np.isfinite(ref32)   # sin/cos included: their bound holds for every finite x
        u = _ulps(g[m], ref[m])
        bound = _bound(name, x, ref)[m]
        worst = np.argmax(u - bound)
        assert np.all(u <= bound), f"{k}: {name} {u[worst]:.2f} ulp at x = {x[m][worst]} " \
            f"(bound {bound[worst]})"


FORMATS = {"e4m3": (4, 3, 448.0), "e5m2": (5, 2, 57344.0), "e2m1": (2, 1, 6.0),
           "bf16": (8, 7, 3.3895314e38), "e3m2": (3, 2, 28.0)}


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_fake_quant_one_algorithm(fmt):
    e, m, mx = FORMATS[fmt]
    x = np.concatenate([F32_EDGES, np.random.default_rng(1).standard_normal(
        len(F32_EDGES)).astype(np.float32) * 100]).astype(np.float32)
    r = Run(f"fq_{fmt}", lambda s: s.emit("rlx.fake_quant", [s.input("x", (len(x),))],
                                          exp_bits=e, man_bits=m, max_normal=mx))
    _check_exact(r.all(x=x))


# ---------------------------------------------------------------- binary, compare

BINARY = [n for n, s in SHAPES.items() if s.family == "binary" and not s.math]
MATH_BINARY = [n for n, s in SHAPES.items() if s.family == "binary" and s.math]
COMPARE = [n for n, s in SHAPES.items() if s.family == "compare"]
INTS = {"i32": I32_EDGES, "i64": I64_EDGES}


@pytest.mark.parametrize("name", [n for n in BINARY if n != "rlx.pow"] + COMPARE)
@pytest.mark.parametrize("dt", ["f32", "f64", "i32", "i64"])
def test_exact_binary(name, dt):
    v = INTS[dt] if dt in INTS else BIN_F32.astype(dt.replace("f", "float"))
    x, y = _pairs(v)
    _check_exact(_binary(name, len(x), dt).all(x=x, y=y))


@pytest.mark.parametrize("name", MATH_BINARY)
def test_transcendental_binary(name):
    """atan2, hypot: every pair of the binary edge values (NaN, +-inf, +-0, FLT_MAX, ...)."""
    x, y = _pairs(BIN_F32)
    r = _binary(name, len(x), "f32")
    _check_math(name, x, r.all(x=x, y=y), r.ref64(x=x, y=y)[0])


@pytest.mark.parametrize("name", MATH_UNARY + MATH_BINARY)
def test_transcendentals_reject_integers_clearly(name):
    """A transcendental on integers is a clear error at trace time, not a wrong answer."""
    arity = 1 if name in MATH_UNARY else 2
    with pytest.raises(rlxc.ShapeError, match=name[4:]):
        rlxc.Func("bad", lambda s: s.emit(name, [s.input(f"x{i}", (3,), "i32")
                                                 for i in range(arity)])).module


def test_integer_division_rule():
    """Truncation toward zero, INT_MIN / -1 saturates, x / 0 = 0 (interpreter included)."""
    x = np.array([7, -7, 7, -7, -2 ** 31, 5, 0, -2 ** 31], np.int32)
    y = np.array([2, 2, -2, -2, -1, 0, 0, 2], np.int32)
    want = np.array([3, -3, -3, 3, 2 ** 31 - 1, 0, 0, -2 ** 30], np.int32)
    for k, out in _binary("rlx.div", len(x), "i32").all(x=x, y=y).items():
        np.testing.assert_array_equal(out[0], want, err_msg=k)


# CPU: exp(y*log|x|) in float64, rounded once; a host without FMA calls libm's powf
POW_ULP = 0.5 + 2.0 ** -10 if host_fma() else 2.0


def test_pow_float():
    x, y = _pairs(BIN_F32)
    r = _binary("rlx.pow", len(x), "f32")
    res, ref = r.all(x=x, y=y), r.ref64(x=x, y=y)[0]
    with np.errstate(over="ignore"):
        ref32 = ref.astype(np.float32)
    exact = ~np.isfinite(ref32) | (ref == 0) | (y == 0) | (np.abs(x) == 1) | np.isnan(x) | \
        np.isnan(y)
    for k in ("cpu", "gpu-emu", "interp"):
        g = res[k][0]
        _same_bits(g[exact], ref32[exact], f"{k}: pow specials")
        if k == "interp":
            continue
        gx, rx = g[~exact].astype(np.float64), ref[~exact]
        bound = POW_ULP if k == "cpu" else \
            2 + np.abs(y[~exact] * np.log2(np.abs(x[~exact]).astype(np.float64)))
        # within the bound of FLT_MAX, exp(y*log|x|) may round past it: inf
        near = np.isinf(gx) & (np.abs(rx) * (1 + bound * 2.0 ** -23) >= 3.4028234663852886e38)
        u = _ulps(np.where(near, rx, gx), rx)
        assert np.all(u <= bound), f"{k}: pow off by {u.max()} ulp"


def test_pow_f64_on_the_gpu():
    """The GPU's f64 pow (it raised NotImplementedError): C99 specials exactly, finite values
    within 2 + |y*log2|x|| float64 ulps of the CPU's libm pow."""
    x, y = _pairs(BIN_F32.astype(np.float64))
    r = _binary("rlx.pow", len(x), "f64")
    res = r.all(x=x, y=y)
    with np.errstate(all="ignore"):
        ref = np.power(x, y)
    exact = ~np.isfinite(ref) | (ref == 0) | (y == 0) | (np.abs(x) == 1) | np.isnan(x) | \
        np.isnan(y)
    for k in ("cpu", "gpu-emu", "interp"):
        g = res[k][0]
        assert g.dtype == np.float64
        _same_bits(g[exact], ref[exact], f"{k}: f64 pow specials")
        ulp = np.maximum(np.abs(np.spacing(ref[~exact])), 2.0 ** -1074)
        u = np.abs(g[~exact] - ref[~exact]) / ulp
        bound = 2 + np.abs(y[~exact] * np.log2(np.abs(x[~exact])))
        assert np.all(u <= bound), f"{k}: f64 pow off by {u.max()} ulp"


@pytest.mark.parametrize("dt", ["i32", "i64"])
def test_pow_integer(dt):
    """Exact, wrapping square-and-multiply (negative exponents: 1 / x ** -y truncated) on
    the CPU, the GPU (emulated) and in the interpreter, the same bits; NumPy's wrapping
    power where the exponent is not negative."""
    x, y = _pairs(INTS[dt][:9])
    r = _binary("rlx.pow", len(x), dt)
    want = r.f.run_on("interp", x=x, y=y)[0]
    _same_bits(r.f.run_on("cpu", x=x, y=y)[0], want, "cpu")
    _same_bits(emu.emulate(r.f.module, r.f.bind_call((), {"x": x, "y": y}))[0], want, "gpu")
    ok = y >= 0
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(want[ok], np.power(x[ok], y[ok]))


def test_select():
    x, y = _pairs(BIN_F32)
    def build(s):
        a, b = s.input("x", (len(x),)), s.input("y", (len(x),))
        return s.emit("rlx.select", [s.emit("rlx.lt", [a, b]), a, b])
    r = Run("sel", build)
    _check_exact(r.all(x=x, y=y))


# ---------------------------------------------------------------- casts

CASTS = [("f32", "i32"), ("f32", "i64"), ("f64", "i32"), ("f64", "i64"), ("f32", "i1"),
         ("f64", "f32"), ("f32", "f64"), ("i32", "f32"), ("i64", "f32"), ("i64", "i32"),
         ("i32", "i64"), ("i32", "i1"), ("i64", "f64")]


@pytest.mark.parametrize("src,dst", CASTS)
def test_cast(src, dst):
    if src in INTS:
        x = INTS[src]
    else:
        x = np.concatenate([F32_EDGES.astype(src.replace("f", "float")),
                            np.array([1e300, -1e300, 9.2233720368547748e18, -9.3e18, 5e-324,
                                      2147483647.5, -2147483648.9], np.float64).astype(
                                src.replace("f", "float"))])
    r = Run(f"c_{src}_{dst}", lambda s: s.input("x", (len(x),), src).cast(dst))
    res = r.all(x=x)
    _check_exact(res)
    if src[0] == "f" and dst[0] == "i" and dst != "i1":   # the rule itself, not only agreement
        info = np.iinfo(dst.replace("i", "int"))
        g = res["cpu"][0]
        assert g[0] == 0                                           # NaN -> 0
        assert g[1] == info.max and g[2] == info.min               # +-inf saturate
        assert g[6] == -1 and g[10] == -2                          # -1.0, -2.5: toward zero


def test_i1_to_float_and_back():
    r = Run("m", lambda s: s.input("x", (len(F32_EDGES),)).ne(0.0).cast("f32"))
    res = r.all(x=F32_EDGES)
    _check_exact(res)
    assert res["cpu"][0][0] == 1.0    # NaN != 0


# ---------------------------------------------------------------- reductions

def test_reductions_propagate_nan_and_inf():
    """NaN propagates through max/min; -0 < +0 whatever the order of the zeros."""
    x = np.array([[1.0, np.nan, 2.0], [1.0, np.inf, -np.inf], [np.inf, 2.0, 3.0],
                  [-1e30, -np.inf, 5.0], [-0.0, 0.0, -1.0], [0.0, -0.0, -1.0],
                  [-0.0, -0.0, 1.0], [0.0, 0.0, 1.0]], np.float32)
    for red in ("max", "min", "sum", "prod"):
        r = Run(f"r_{red}", lambda s, red=red: getattr(s.input("x", x.shape), red)(-1))
        _check_exact(r.all(x=x))


# ---------------------------------------------------------------- indices

def _raises_everywhere(r, msg, **inputs):
    args = r.f.bind_call((), inputs)
    for k, fn in (("cpu", lambda: r.f.run_on("cpu", **inputs)),
                  ("gpu-emu", lambda: emu.emulate(r.f.module, args)),
                  ("interp", lambda: interpret(r.f.module, args))):
        with pytest.raises(IndexError, match=msg):
            fn()


@pytest.mark.parametrize("bad", [10, -1, 2 ** 31 - 1])
def test_gather_out_of_range_is_an_error_everywhere(bad):
    E = np.arange(40, dtype=np.float32).reshape(10, 4)
    r = Run("gth", lambda s: s.input("E", (10, 4)).gather(s.input("i", (3,), "i32")) * 2.0
            + 1.0)
    _raises_everywhere(r, r"rlx.gather: index out of range \[0, 10\) along axis 0",
                       E=E, i=np.array([1, bad, 2], np.int32))
    _check_exact(r.all(E=E / 40, i=np.array([1, 9, 0], np.int32)))


def test_gather_i64_index_past_32_bits():
    r = Run("gth64", lambda s: s.input("E", (3, 7)).index_select(1, s.input("i", (2,), "i64")))
    _raises_everywhere(r, r"rlx.gather: index out of range \[0, 7\) along axis 1",
                       E=np.ones((3, 7), np.float32), i=np.array([2 ** 32 + 1, 0], np.int64))


def test_scatter_add_out_of_range_is_an_error_everywhere():
    r = Run("sct", lambda s: s.emit("rlx.scatter_add", [s.input("i", (3,), "i32"),
                                                        s.input("u", (3, 2))], axis=0, dim=4))
    _raises_everywhere(r, r"rlx.scatter_add: index out of range \[0, 4\)",
                       i=np.array([0, 4, 1], np.int32), u=np.ones((3, 2), np.float32))


def test_gpu_error_flag_resets_between_runs():
    """A bad call raises; the next good call on the same program succeeds (the flag is
    zeroed by the first step of the launch plan)."""
    f = rlxc.Func("gth_again", lambda s: s.input("E", (10, 4)).gather(s.input("i", (3,), "i32")))
    E = np.arange(40, dtype=np.float32).reshape(10, 4)
    prog = emu.emulate_program(f.module)
    try:
        with pytest.raises(IndexError, match="along axis 0"):
            prog.run(f.bind_call((), {"E": E, "i": np.array([0, 11, 0], np.int32)}))
        good = prog.run(f.bind_call((), {"E": E, "i": np.array([0, 9, 3], np.int32)}))
        np.testing.assert_array_equal(good[0], E[[0, 9, 3]])
    finally:
        prog.close()
    assert prog.meta["steps"][0] == {"op": "memset", "buffer": prog.meta["errors"]["buffer"]}

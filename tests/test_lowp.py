"""Low-precision formats: names, exact RNE rounding against ml_dtypes
(random inputs, every grid point and every tie), saturation, scaling, hooks."""
import zlib

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlxc.lowp import (BUILTIN_FORMATS, parse_format, quantize, quantize_named,
                       quantize_scaled)

F32 = np.float32
NVF4 = parse_format("nvf4")
E4M3 = parse_format("e4m3")

# format spec -> the ml_dtypes type with the same grid and maximum
REFERENCE = {
    "e4m3": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
    "nvf4": ml_dtypes.float4_e2m1fn,
    "f6e3m2": ml_dtypes.float6_e3m2fn,
    "f6e2m3": ml_dtypes.float6_e2m3fn,
    "bf16": ml_dtypes.bfloat16,
    "f16": np.float16,
    "f8m3e4": ml_dtypes.float8_e4m3,   # generic name, IEEE-like: max 240
    "f8e3m4": ml_dtypes.float8_e3m4,   # generic name, IEEE-like: max 15.5
}
# every named (OCP / MX / IEEE) format, by its canonical name
NAMED = {
    "e4m3fn": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
    "e2m3fn": ml_dtypes.float6_e2m3fn,
    "e3m2fn": ml_dtypes.float6_e3m2fn,
    "e2m1fn": ml_dtypes.float4_e2m1fn,
    "bf16": ml_dtypes.bfloat16,
    "f16": np.float16,
}


# -- names --------------------------------------------------------------------

@pytest.mark.parametrize("names, fmt", [
    (["f16", "fp16", "float16", "half"], (5, 10, 65504.0)),
    (["bf16", "bfloat16"], (8, 7, 3.3895314e38)),
    (["f8e4m3", "fp8", "f8", "e4m3", "e4m3fn", "fp8_e4m3"], (4, 3, 448.0)),
    (["bf8", "e5m2", "f8e5m2", "fp8_e5m2"], (5, 2, 57344.0)),
    (["nvf4", "fp4", "f4", "e2m1", "e2m1fn", "f4e2m1", "mxfp4"], (2, 1, 6.0)),
    (["f6e3m2", "e3m2", "e3m2fn", "fp6_e3m2"], (3, 2, 28.0)),
    (["f6e2m3", "e2m3", "e2m3fn", "fp6_e2m3"], (2, 3, 7.5)),
])
def test_builtin_names(names, fmt):
    for name in names:
        assert parse_format(name) == fmt
        assert parse_format(f"  {name.upper()}\n") == fmt


def test_named_formats_have_ml_dtypes_maxima():
    """OCP MX: all 64 FP6 codes and all 16 FP4 codes are finite (e2m3fn max 7.5, not 3.75)."""
    for name, dtype in NAMED.items():
        assert parse_format(name)[2] == pytest.approx(float(ml_dtypes.finfo(dtype).max),
                                                      rel=1e-7), name
    assert parse_format("f6e2m3") == (2, 3, 7.5) and parse_format("f6m3e2") == (2, 3, 3.75)
    assert parse_format("f4e2m1") == (2, 1, 6.0) and parse_format("f4m1e2") == (2, 1, 3.0)


@pytest.mark.parametrize("spec, expected", [
    ("f8m3e4", (4, 3, 240.0)), ("f8e4m3", (4, 3, 448.0)),  # builtin name wins
    ("f8e3m4", (3, 4, 15.5)), ("f8m4e3", (3, 4, 15.5)),
    ("f16e5m10", (5, 10, 65504.0)), ("f16m7e8", (8, 7, float(ml_dtypes.finfo(ml_dtypes.bfloat16).max))),
    ("F8E5M2", (5, 2, 57344.0)), ("f32e8m23", (8, 23, float(np.finfo(F32).max))),
    ("f2e1m0", (1, 0, 1.0)),
    ("f8e4m4", None), ("f7e0m6", None), ("f33e9m23", None), ("f26e1m24", None),
    ("e4m3x", None), ("", None), ("int8", None), ("f8e4", None),
])
def test_generic_and_unknown_names(spec, expected):
    assert parse_format(spec) == expected


@pytest.mark.parametrize("spec", ["f16", "bf16", "e5m2", "f8m3e4", "f8e3m4"])
def test_generic_max_rule_matches_ieee_like_types(spec):
    e, m, mx = parse_format(spec)
    bias = 2 ** (e - 1) - 1
    assert mx == pytest.approx((2 - 2.0 ** -m) * 2.0 ** bias, rel=1e-7)
    assert mx == pytest.approx(float(ml_dtypes.finfo(REFERENCE[spec]).max), rel=1e-7)


@pytest.mark.parametrize("spec", ["e4m3", "nvf4", "f6e3m2", "f6e2m3"])
def test_fn_builtins_use_top_exponent(spec):
    assert parse_format(spec)[2] == float(ml_dtypes.finfo(REFERENCE[spec]).max)


# -- fixed cases ----------------------------------------------------------------

def test_nvf4_grid_and_ties():
    grid = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], F32)
    assert np.array_equal(quantize(grid, *NVF4), grid)
    assert np.array_equal(quantize(-grid, *NVF4), -grid)
    assert quantize(np.array([5.0]), *NVF4)[0] == 4.0     # tie -> even mantissa
    assert quantize(np.array([2.5]), *NVF4)[0] == 2.0
    assert quantize(np.array([3.5]), *NVF4)[0] == 4.0
    assert quantize(np.array([0.25, 0.75]), *NVF4).tolist() == [0.0, 1.0]


def test_e4m3_rounding_and_saturation():
    assert quantize(np.array([1.1]), *E4M3)[0] == 1.125
    x = np.array([1e30, -1e30, np.inf, -np.inf, 448, 449, 480, 1e-30], F32)
    assert quantize(x, *E4M3).tolist() == [448, -448, 448, -448, 448, 448, 448, 0]
    # smallest subnormal 2**-9; half of it ties to zero, a bit more rounds up
    assert quantize(np.array([2.0 ** -9, 2.0 ** -10, 1.01 * 2.0 ** -10]), *E4M3).tolist() \
        == [2.0 ** -9, 0.0, 2.0 ** -9]


def test_nan_zero_sign_shape_dtype():
    x = np.array([[np.nan, -0.0], [0.0, -1e-6]], F32)
    q = quantize(x, *E4M3)
    assert q.dtype == F32 and q.shape == (2, 2)
    assert np.isnan(q[0, 0])
    assert [np.signbit(v) for v in (q[0, 1], q[1, 0], q[1, 1])] == [True, False, True]
    assert q[1, 1] == 0
    s = quantize(1.1, *E4M3)
    assert s.shape == () and s.dtype == F32 and s == 1.125
    assert quantize(np.arange(4), *NVF4).tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("args", [(0, 3, 448.0), (9, 3, 1.0), (4, -1, 448.0),
                                  (4, 24, 448.0), (4, 3, 0.0), (4, 3, np.inf),
                                  (4, 3, np.nan), (4, 3, 1e39)])
def test_bad_format_arguments(args):
    with pytest.raises(ValueError):
        quantize(np.ones(2), *args)


# -- agreement with ml_dtypes -----------------------------------------------------

def _random_in_range(rng, e, m, mx, n=20000):
    """Log-uniform magnitudes from below the smallest subnormal up to max."""
    bias = 2 ** (e - 1) - 1
    lo = 1 - bias - m - 2
    hi = float(np.log2(mx))
    mag = np.exp2(rng.uniform(lo, hi, n)).astype(F32)
    x = mag * rng.choice(np.array([-1, 1], F32), n)
    return x[np.abs(x) < F32(mx)]


@pytest.mark.parametrize("spec", list(REFERENCE))
def test_random_inputs_match_ml_dtypes(spec):
    e, m, mx = parse_format(spec)
    x = _random_in_range(np.random.default_rng(zlib.crc32(spec.encode())), e, m, mx)
    want = x.astype(REFERENCE[spec]).astype(F32)
    got = quantize(x, e, m, mx)
    bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert bad.size == 0, (x[bad[:5]], got[bad[:5]], want[bad[:5]])
    subnormal = np.abs(x) < 2.0 ** (2 - 2 ** (e - 1))
    assert subnormal.sum() > 100


@pytest.mark.parametrize("spec", ["e4m3", "e5m2", "nvf4", "f6e3m2", "f6e2m3", "f8m3e4",
                                  "f8e3m4"])
def test_every_grid_point_and_every_tie(spec):
    """Grid points are fixed points; every midpoint rounds like ml_dtypes (to even)."""
    dtype = REFERENCE[spec]
    e, m, mx = parse_format(spec)
    bits = 8 if np.dtype(dtype).itemsize == 1 else 16
    codes = np.arange(2 ** bits, dtype=np.uint8 if bits == 8 else np.uint16)
    grid = codes.view(dtype).astype(F32)
    grid = np.unique(grid[np.isfinite(grid) & (np.abs(grid) <= mx)])
    assert np.array_equal(quantize(grid, e, m, mx), grid)
    mids = ((grid[:-1].astype(np.float64) + grid[1:]) / 2).astype(F32)
    mids = mids[np.abs(mids) < mx]
    assert np.array_equal(quantize(mids, e, m, mx), mids.astype(dtype).astype(F32))


def test_all_f16_values_are_fixed_points_and_ties_match_numpy():
    grid = np.arange(2 ** 16, dtype=np.uint16).view(np.float16)
    grid = np.unique(grid[np.isfinite(grid)].astype(F32))
    f16 = parse_format("f16")
    assert np.array_equal(quantize(grid, *f16), grid)
    mids = ((grid[:-1].astype(np.float64) + grid[1:]) / 2).astype(F32)
    assert np.array_equal(quantize(mids, *f16), mids.astype(np.float16).astype(F32))


finite_f32 = st.floats(allow_nan=False, allow_infinity=False, width=32)


@settings(max_examples=300, deadline=None)
@given(x=finite_f32, spec=st.sampled_from(["e4m3", "e5m2", "nvf4", "bf16", "f16", "f6e3m2",
                                          "f6e2m3"]))
def test_properties(x, spec):
    e, m, mx = parse_format(spec)
    q = float(quantize(np.array([x], F32), e, m, mx)[0])
    assert float(quantize(np.array([q], F32), e, m, mx)[0]) == q          # idempotent
    assert float(quantize(np.array([-x], F32), e, m, mx)[0]) == -q        # odd
    assert abs(q) <= np.float32(mx)
    if abs(x) < mx:
        assert q == float(np.array([x], F32).astype(REFERENCE[spec]).astype(F32)[0])
        # error at most half a grid spacing
        ex = max(int(np.floor(np.log2(abs(x)))) if x else 0, 2 - 2 ** (e - 1))
        assert abs(q - x) <= 2.0 ** (ex - m) / 2


@settings(max_examples=100, deadline=None)
@given(a=finite_f32, b=finite_f32)
def test_monotone(a, b):
    lo, hi = sorted((a, b))
    q = quantize(np.array([lo, hi], F32), *E4M3)
    assert q[0] <= q[1]


# -- scaled quantization and hooks -------------------------------------------------

def test_quantize_scaled():
    x = np.array([0.003, -0.0015, 0.0007, 0.0], F32)
    q = quantize_scaled(x, *NVF4)
    scale = 0.003 / 6.0
    want = (quantize(x.astype(np.float64) / scale, *NVF4).astype(np.float64) * scale).astype(F32)
    assert q.dtype == F32 and np.array_equal(q, want)
    assert q[0] == x[0] and q[1] == x[1]          # absmax and absmax/2 are on the grid
    zeros = np.zeros(3, F32)
    assert np.array_equal(quantize_scaled(zeros, *E4M3), zeros)
    big = np.array([1e6, -5e5, np.inf, np.nan], F32)
    qb = quantize_scaled(big, *E4M3)
    assert qb[:3].tolist() == [1e6, -5e5, 1e6] and np.isnan(qb[3])


def test_quantize_scaled_relative_error():
    rng = np.random.default_rng(0)
    x = rng.normal(size=1000).astype(F32)
    q = quantize_scaled(x, *E4M3)
    big = np.abs(x) > np.abs(x).max() / 64       # normal range after scaling
    assert np.all(np.abs(q[big] - x[big]) <= np.abs(x[big]) * 2.0 ** -4 * 1.0001)


def test_quantize_named():
    hook = quantize_named(" E4M3 ")
    assert hook("w", np.array([1.1], F32)).tolist() == [1.125]
    scaled = quantize_named("nvf4", scaled=True)
    assert scaled("w", np.array([3.0, 1.0], F32)).tolist() == [3.0, 1.0]
    with pytest.raises(ValueError, match="unknown low-precision format 'f9'.*nvf4"):
        quantize_named("f9")
    with pytest.raises(TypeError):
        quantize_named(3)

    seen = []
    user = quantize_named(lambda name, a: (seen.append(name), a * 2)[1])
    out = user("layer.w", np.ones(2, np.float64))
    assert out.dtype == F32 and out.tolist() == [2, 2] and seen == ["layer.w"]
    bad = quantize_named(lambda name, a: a[:1])
    with pytest.raises(ValueError, match="'layer.b' returned shape"):
        bad("layer.b", np.ones(2, F32))


def test_builtin_table_is_consistent():
    for name, (e, m, mx) in BUILTIN_FORMATS.items():
        assert quantize(np.array([mx]), e, m, mx)[0] == F32(mx), name


# -- every named format, bit for bit, on the reference, compiled CPU, interp, GPU emulator --

def _codes(dtype) -> np.ndarray:
    """Every finite value of `dtype` as float32 (both signs), sorted and unique."""
    bits = ml_dtypes.finfo(dtype).bits
    codes = np.arange(2 ** bits, dtype=np.uint8 if bits <= 8 else np.uint16)
    vals = codes.view(dtype).astype(F32)
    return np.unique(vals[np.isfinite(vals)])


def _named_inputs(name: str, n_random: int = 60000) -> np.ndarray:
    """All representable values, every midpoint and its float32 neighbours, random
    in-range values (log-uniform and uniform over bit patterns), and out-of-range ones."""
    dtype = NAMED[name]
    e, m, mx = parse_format(name)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    grid = _codes(dtype)
    mids = ((grid[:-1].astype(np.float64) + grid[1:]) / 2).astype(F32)
    near = np.concatenate([np.nextafter(mids, F32(np.inf)), np.nextafter(mids, F32(-np.inf))])
    bits = rng.integers(0, 2 ** 32, n_random, dtype=np.uint64).astype(np.uint32).view(F32)
    bits = bits[np.isfinite(bits) & (np.abs(bits) < F32(mx))]
    top = F32(mx)
    with np.errstate(over="ignore"):   # bf16's max * 2 is inf in float32
        over = np.array([top, np.nextafter(top, F32(np.inf)), top * F32(1.0625), top * 2,
                         np.finfo(F32).max, np.inf], F32)
    return np.concatenate([grid, mids, near, bits, _random_in_range(rng, e, m, mx, n_random),
                           over, -over, [np.nan, 0.0, -0.0]]).astype(F32)


def _want(x: np.ndarray, name: str) -> np.ndarray:
    """ml_dtypes' rounding inside the range; saturation at +-max outside it; NaN kept."""
    dtype = NAMED[name]
    mx = F32(parse_format(name)[2])
    inside = np.abs(x) < mx
    with np.errstate(invalid="ignore", over="ignore"):
        want = np.where(inside, x, 0).astype(dtype).astype(F32)
    want = np.where(inside, want, np.copysign(mx, x))
    return np.where(np.isnan(x), x, want).astype(F32)


def _check_bits(got, x, name, who):
    want = _want(x, name)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), f"{who} {name}: {x[~same][:5]} -> {got[~same][:5]}, want {want[~same][:5]}"


_X_NAMED: dict = {}


def _x_named(name: str) -> np.ndarray:
    if name not in _X_NAMED:
        _X_NAMED[name] = _named_inputs(name)
    return _X_NAMED[name]


@pytest.mark.parametrize("name", list(NAMED))
def test_named_format_bit_exact_reference(name):
    x = _x_named(name)
    assert x.size > 2 * _codes(NAMED[name]).size
    _check_bits(quantize(x, *parse_format(name)), x, name, "lowp.quantize")


def _all_named_func():
    from rlxc import Func

    x = np.concatenate([_x_named(name) for name in NAMED])
    return Func("fq_named", lambda s: _fake_quant_all(s.input("x", x.shape))), x


def _fake_quant_all(v):
    return [v.fake_quant(name) for name in NAMED]


@pytest.mark.parametrize("device", ["cpu", "interp"])
def test_named_formats_bit_exact_compiled(device):
    """rlx.fake_quant through the compiled CPU kernel and the interpreter, every format."""
    f, x = _all_named_func()
    for name, got in zip(NAMED, f.run_on(device, x=x)):
        assert got.dtype == F32 and got.shape == x.shape
        _check_bits(got, x, name, device)


def test_named_formats_bit_exact_gpu_emulator():
    """The GPU kernels' fake_quant (built for the host) on every code, midpoint and edge."""
    from rlxc import Func
    from rlxc.lowering.gpu import emu as gpu_emu

    parts = []
    for name in NAMED:
        grid = _codes(NAMED[name])
        mids = ((grid[:-1].astype(np.float64) + grid[1:]) / 2).astype(F32)
        mx = F32(parse_format(name)[2])
        parts += [grid[:: max(1, grid.size // 2048)], mids[:: max(1, mids.size // 2048)],
                  np.array([mx, np.nextafter(mx, F32(np.inf)), np.inf, -np.inf, np.nan], F32)]
    x = np.concatenate(parts).astype(F32)
    f = Func("fq_named_gpu", lambda s: _fake_quant_all(s.input("x", x.shape)))
    prog = gpu_emu.emulate_program(f.module, gpu_emu.EmuDriver())
    try:
        got = prog.run(f.bind_call((), {"x": x}))
    finally:
        prog.close()
    for name, g in zip(NAMED, got):
        _check_bits(g, x, name, "gpu emulator")

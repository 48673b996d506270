"""lowering/shared/mathlib.py: accuracy against float64 NumPy references, IEEE special values,
vectorization and libm-freedom after O3, and NVPTX (sm_90) code generation.

Each op gets two loops, `void f(float* noalias x, float* noalias y, i64 n)`:
  <op>_vec     explicit <8 x float> body through mathlib.emit + a scalar tail
  <op>_scalar  one scalar call per element, left for LLVM's loop vectorizer
compiled at O3 with MCJIT for the host CPU and (on x86-64) for baseline x86-64 without FMA, so
the bounds hold both for fused and for separate multiply-add.  Self-contained: it does not
use lowering/cpu/target.py.
"""
from __future__ import annotations

import ctypes
import math
import platform
import re
import shutil
import subprocess
import zlib

import numpy as np
import pytest
import llvmlite.binding as llvm
from llvmlite import ir

from rlxc.lowering.shared import mathlib

# the float32 core kernels of mathlib.py (mathlib_more's are in test_mathlib_more.py)
OPS = ["cos", "erf", "erfc", "exp", "expm1", "gelu", "gelu_tanh", "log", "log1p", "sigmoid",
       "silu", "sin", "softplus", "tanh"]
F32, I64 = ir.FloatType(), ir.IntType(64)
FLT_MAX = float(np.finfo(np.float32).max)

llvm.initialize_all_targets()
llvm.initialize_all_asmprinters()
llvm.initialize_native_target()
llvm.initialize_native_asmprinter()


# ------------------------------------------------------------------------ loops and compilation
def _loop(m: ir.Module, name: str, op: str, vector: bool) -> None:
    """for i in [0, n): y[i] = op(x[i]); with vector=True the first n & ~7 elements go
    through one <8 x float> call per 8, the rest through the scalar tail loop (the one
    loop builder of tests/mathlib_kernels.py, at float32 and one argument)."""
    from mathlib_kernels import _loop as loop   # it imports this module: import on use

    loop(m, name, op, F32, 1, vector)


def _optimize(text: str, tm) -> llvm.ModuleRef:
    mod = llvm.parse_assembly(text)
    mod.verify()
    pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=3))
    pb.getModulePassManager().run(mod, pb)
    return mod


class Compiled:
    """All ops, both loop kinds, optimized at O3 and JIT-compiled for one x86 target."""

    def __init__(self, cpu: str, features: str):
        self.tm = llvm.Target.from_default_triple().create_target_machine(
            cpu=cpu, features=features, opt=3)
        m = ir.Module(name="mathlib_test")
        m.triple = llvm.get_process_triple()
        m.data_layout = str(self.tm.target_data)
        for op in OPS:
            _loop(m, f"{op}_vec", op, vector=True)
            _loop(m, f"{op}_scalar", op, vector=False)
        self.mod = _optimize(str(m), self.tm)
        self.ee = llvm.create_mcjit_compiler(self.mod, self.tm)
        self.ee.finalize_object()
        proto = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
        self.fns = {name: proto(self.ee.get_function_address(name))
                    for op in OPS for name in (f"{op}_vec", f"{op}_scalar")}

    def ir_of(self, name: str) -> str:
        return str(self.mod.get_function(name))

    def run(self, name: str, x) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        y = np.empty_like(x)
        self.fns[name](x.ctypes.data, y.ctypes.data, x.size)
        return y


_IS_X86 = platform.machine().lower() in ("x86_64", "amd64")
TARGETS = {"host": (llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten())}
if _IS_X86:
    TARGETS["x86-64"] = ("x86-64", "")     # SSE2 only: no FMA, no roundps


_CACHE: dict[str, Compiled] = {}


def compile_for(target: str) -> Compiled:
    if target not in _CACHE:
        _CACHE[target] = Compiled(*TARGETS[target])
    return _CACHE[target]


@pytest.fixture(scope="module", params=list(TARGETS))
def compiled(request) -> Compiled:
    return compile_for(request.param)


@pytest.fixture(scope="module")
def host() -> Compiled:
    return compile_for("host")


# ------------------------------------------------------------------------ float64 references
_erf64 = np.frompyfunc(math.erf, 1, 1)
_erfc64 = np.frompyfunc(math.erfc, 1, 1)


def _sigmoid64(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _gelu_tanh_w(x):
    return 2.0 * math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)


REF = {
    "exp": np.exp, "expm1": np.expm1, "log": np.log, "log1p": np.log1p,
    "sin": np.sin, "cos": np.cos, "tanh": np.tanh, "sigmoid": _sigmoid64,
    "silu": lambda x: x * _sigmoid64(x),
    "erf": lambda x: _erf64(x).astype(np.float64),
    "erfc": lambda x: _erfc64(x).astype(np.float64),
    "gelu": lambda x: 0.5 * x * _erfc64(-x / math.sqrt(2.0)).astype(np.float64),
    "gelu_tanh": lambda x: x * _sigmoid64(_gelu_tanh_w(x)),
    "softplus": lambda x: np.logaddexp(0.0, x),
}

# dense sweep of each op's interesting range
SWEEP = {
    "exp": (-104.0, 89.0), "expm1": (-20.0, 89.0), "log": (0.0, 16.0), "log1p": (-1.0, 16.0),
    "sin": (-40.0, 40.0), "cos": (-40.0, 40.0), "tanh": (-10.0, 10.0),
    "sigmoid": (-110.0, 110.0), "silu": (-110.0, 110.0), "erf": (-5.0, 5.0),
    "erfc": (-5.0, 11.0), "gelu": (-16.0, 16.0), "gelu_tanh": (-12.0, 12.0),
    "softplus": (-110.0, 100.0),
}


def ulp_error(y: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|y - ref| in float32 ulps of ref (subnormal ulp 2^-149); inf where y is inf/NaN but
    ref rounds to a finite float; 0 where both overflow to the same infinity or are NaN."""
    y64 = y.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        ref32 = ref.astype(np.float32)
        e = np.frexp(np.abs(ref))[1]
        ulp = np.ldexp(1.0, np.maximum(e - 1, -126) - 23)
        err = np.abs(y64 - ref) / np.where(ref == 0, 2.0 ** -149, ulp)
    over = np.isinf(ref32)
    err = np.where(over, np.where(y == ref32, 0.0, np.inf), err)
    err = np.where(np.isfinite(y) | over, err, np.inf)
    return np.where(np.isnan(ref), np.where(np.isnan(y), 0.0, np.inf), err)


def inputs(op: str, rng: np.random.Generator) -> np.ndarray:
    """Dense sweep of the op's range, random bit patterns (every binade, subnormals, huge),
    log-uniform magnitudes of both signs, random subnormals, [-2, 2]; finite values only."""
    lo, hi = SWEEP[op]
    dense = np.linspace(lo, hi, 600_001, dtype=np.float64).astype(np.float32)
    bits = rng.integers(0, 2 ** 32, 300_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    mags = np.exp(rng.uniform(math.log(1e-30), math.log(100.0), 50_000)).astype(np.float32)
    sub = rng.integers(1, 2 ** 23, 10_000, dtype=np.uint32).view(np.float32)
    small = rng.uniform(-2.0, 2.0, 50_000).astype(np.float32)
    parts = [dense, bits, mags, -mags, sub, -sub, small]
    if op in ("sin", "cos"):   # the Cody-Waite range, and huge arguments (Payne-Hanek)
        parts.append(rng.uniform(-25735.0, 25735.0, 400_000).astype(np.float32))
        parts.append(np.exp(rng.uniform(math.log(1e4), math.log(FLT_MAX), 200_000))
                     .astype(np.float32) * rng.choice([-1.0, 1.0], 200_000).astype(np.float32))
    x = np.concatenate(parts)
    return x[np.isfinite(x)]


def accuracy_mask(op: str, x: np.ndarray) -> np.ndarray:
    """Where SUPPORTED[op] is the bound (the header documents the rest)."""
    if op == "gelu_tanh":
        return x >= mathlib.GELU_TANH_EXACT_FROM
    return np.ones(x.shape, bool)


def measure(c: Compiled, op: str, x: np.ndarray, kind: str = "vec"):
    y = c.run(f"{op}_{kind}", x)
    with np.errstate(all="ignore"):
        ref = REF[op](x.astype(np.float64))
    return y, ref, ulp_error(y, ref)


# ------------------------------------------------------------------------ accuracy
@pytest.mark.parametrize("op", OPS)
def test_accuracy(compiled, op):
    rng = np.random.default_rng(zlib.crc32(op.encode()))
    x = inputs(op, rng)
    y, ref, err = measure(compiled, op, x)
    m = accuracy_mask(op, x)
    worst = int(np.argmax(np.where(m, err, -1.0)))
    assert err[m].max() <= mathlib.SUPPORTED[op], (
        f"{op}: {err[worst]:.2f} ulp at x={x[worst]!r} (got {y[worst]!r}, want {ref[worst]!r})")
    # the explicit vector loop and the auto-vectorized scalar loop compute the same bits
    ys = compiled.run(f"{op}_scalar", x)
    same = (ys.view(np.uint32) == y.view(np.uint32)) | (np.isnan(ys) & np.isnan(y))
    assert same.all(), f"{op}: scalar loop differs at x={x[~same][:4]}"
    if op == "gelu_tanh":             # documented tail bound: 4 + 3*|2u| ulp
        t = ~m & (ref != 0)
        assert np.all(err[t] <= 4.0 + 3.0 * np.abs(_gelu_tanh_w(x[t].astype(np.float64))))


def test_sin_cos_hard_arguments(compiled):
    # floats closest to multiples of pi/2 below 2^15 (|x - j*pi/2| down to 2^-27.8)
    x = np.array([252.898208618164, 505.796417236328, 4.71238899230957, 1011.59283447266,
                  9.42477798461914, 2023.18566894531, 1.5707963705062866, 3.1415927410125732,
                  25735.0, 8192.0, 16384.0, 1e4, 6434.0], np.float32)
    x = np.concatenate([x, -x])
    for op in ("sin", "cos"):
        _, _, err = measure(compiled, op, x)
        assert err.max() <= mathlib.SUPPORTED[op], (op, err)


# issue 13 item 16: |x| >~ 5.4e6 gave garbage (errors up to 2.0 absolute).  The float32
# nearest a multiple of pi/2 (16367173*2^72, |x*2/pi - j| = 2^-29.86), the Payne-Hanek
# threshold 2^14 and its neighbours, powers of two, the largest floats.
HUGE = [16367173 * 2.0 ** 72, 5.4e6, 5.5e6, 1e7, 16383.999, 16384.0, 16384.002, 2.0 ** 22,
        2.0 ** 23 + 1, 2.0 ** 24, 2.0 ** 60, 1e30, 2.0 ** 100, 2.0 ** 127, FLT_MAX,
        np.nextafter(np.float32(FLT_MAX), np.float32(0)), 3e38, 1.7e38, 8.5e37]


def test_sin_cos_huge_arguments(compiled):
    x = np.array(HUGE, np.float32)
    x = np.concatenate([x, -x, np.nextafter(x, np.float32(np.inf)),
                        np.nextafter(x, np.float32(0.0))])
    x = x[np.isfinite(x)]
    for op in ("sin", "cos"):
        y, ref, err = measure(compiled, op, x)
        assert err.max() <= mathlib.SUPPORTED[op], (op, x[np.argmax(err)], err.max())
        assert np.all(np.abs(y) <= 1.0)


# worst cases of an exhaustive search over all float32 (and of rejected variants: 1 + t
# rounded in tanh = (1-t)/(1+t) gave 2.03 ulp at 0.12510899 without FMA)
HARD = {
    "tanh": [0.12510899, 0.51095885, 0.51540923, 0.62610734, 0.63214535, 0.6576667, 8.1445],
    "sigmoid": [-16.635704, -16.636244, -16.643366, -1.9654468, -100.0, -103.9, 17.0],
    "silu": [-3.2097204, -3.2156084, -1.9505774, -5.1949334, -100.0],
    "gelu_tanh": [-0.9957013, -0.9292492, -0.79292, -0.9464571, -0.79788935],
}


@pytest.mark.parametrize("op", sorted(HARD))
def test_hard_arguments(compiled, op):
    x = np.array(HARD[op], np.float32)
    if op == "tanh":
        x = np.concatenate([x, -x])
    _, _, err = measure(compiled, op, x)
    assert err.max() <= mathlib.SUPPORTED[op], (op, x[np.argmax(err)], err.max())


# ------------------------------------------------------------------------ IEEE special values
INF, NAN = math.inf, math.nan
SPECIAL = {   # op: [(x, expected)], expected compared bitwise (sign of zero included)
    "exp": [(INF, INF), (-INF, 0.0), (0.0, 1.0), (-0.0, 1.0), (100.0, INF), (-200.0, 0.0),
            (88.72283935546875, INF), (88.72283172607422, 3.4027985e38), (-103.9, 1e-45)],
    "expm1": [(INF, INF), (-INF, -1.0), (0.0, 0.0), (-0.0, -0.0), (100.0, INF),
              (88.5, float(np.expm1(np.float64(88.5)).astype(np.float32)))],
    "log": [(0.0, -INF), (-0.0, -INF), (-1.0, NAN), (-INF, NAN), (INF, INF), (1.0, 0.0),
            (1e-45, -103.27893), (FLT_MAX, 88.72284)],
    "log1p": [(-1.0, -INF), (-2.0, NAN), (INF, INF), (0.0, 0.0), (-0.0, -0.0), (1e-45, 1e-45),
              (-INF, NAN)],
    "sin": [(INF, NAN), (-INF, NAN), (0.0, 0.0), (-0.0, -0.0), (1e-45, 1e-45), (-1e-45, -1e-45)],
    "cos": [(INF, NAN), (-INF, NAN), (0.0, 1.0), (-0.0, 1.0)],
    "tanh": [(INF, 1.0), (-INF, -1.0), (0.0, 0.0), (-0.0, -0.0), (20.0, 1.0), (-1e-45, -1e-45)],
    "sigmoid": [(INF, 1.0), (-INF, 0.0), (0.0, 0.5), (-0.0, 0.5), (-200.0, 0.0), (200.0, 1.0)],
    "silu": [(INF, INF), (-INF, -0.0), (0.0, 0.0), (-0.0, -0.0), (-200.0, -0.0)],
    "erf": [(INF, 1.0), (-INF, -1.0), (0.0, 0.0), (-0.0, -0.0), (5.0, 1.0), (-1e-45, -1e-45)],
    "erfc": [(INF, 0.0), (-INF, 2.0), (0.0, 1.0), (-0.0, 1.0), (11.0, 0.0), (-11.0, 2.0)],
    "gelu": [(INF, INF), (-INF, -0.0), (0.0, 0.0), (-0.0, -0.0), (20.0, 20.0), (-20.0, -0.0)],
    "gelu_tanh": [(INF, INF), (-INF, -0.0), (0.0, 0.0), (-0.0, -0.0), (20.0, 20.0),
                  (-20.0, -0.0)],
    "softplus": [(INF, INF), (-INF, 0.0), (0.0, math.log(2.0)), (-0.0, math.log(2.0)),
                 (1e30, 1e30), (-200.0, 0.0), (-100.0, 3.7200760e-44)],
}


def _same(a: np.float32, b: np.float32) -> bool:
    return (np.isnan(a) and np.isnan(b)) or a.view(np.uint32) == b.view(np.uint32)


@pytest.mark.parametrize("op", OPS)
def test_special_values(compiled, op):
    xs = np.array([x for x, _ in SPECIAL[op]], np.float32)
    want = np.array([w for _, w in SPECIAL[op]], np.float32)
    for kind in ("vec", "scalar"):
        # pad to 11 so both the <8 x float> body and the scalar tail see every value
        for rot in (0, 8):
            xx = np.roll(np.resize(xs, 11), rot) if xs.size < 11 else np.roll(xs, rot)
            got = compiled.run(f"{op}_{kind}", xx)
            for xi, gi in zip(xx, got):
                wi = want[list(xs.view(np.uint32)).index(xi.view(np.uint32))]
                assert _same(gi, wi), f"{op}_{kind}({xi!r}) = {gi!r}, want {wi!r}"


@pytest.mark.parametrize("op", OPS)
def test_nan_propagates(compiled, op):
    nans = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FFFFFFF, 0xFFFFFFFF] * 3,
                    np.uint32).view(np.float32)
    for kind in ("vec", "scalar"):
        assert np.isnan(compiled.run(f"{op}_{kind}", nans)).all(), op


# ------------------------------------------------------------------------ codegen checks
_LIBM = re.compile(r"call[^\n]*@(?!llvm\.)([\w.]+)")


@pytest.mark.parametrize("op", OPS)
def test_scalar_loop_vectorizes_without_libm(host, op):
    text = host.ir_of(f"{op}_scalar")
    widths = [int(w) for w in re.findall(r"<(\d+) x float>", text)]
    want = 8 if "+avx" in TARGETS["host"][1] else 4
    assert widths and max(widths) >= want, f"{op}: scalar loop not vectorized:\n{text[:2000]}"
    assert not _LIBM.findall(text), f"{op}: calls {_LIBM.findall(text)}"
    assert not re.search(r"call[^\n]*@rlx\.math", text), f"{op}: helper not inlined"
    assert not re.search(r"@llvm\.(exp|exp2|log|log2|log10|pow|sin|cos|tan)\.", text)


@pytest.mark.skipif(not _IS_X86, reason="x86-64 only")
def test_baseline_x86_has_no_libcalls():
    c = compile_for("x86-64")
    asm = c.tm.emit_assembly(c.mod)
    calls = re.findall(r"\bcall[lq]?\s+([^\s]+)", asm)
    assert not calls, f"libcalls on baseline x86-64: {sorted(set(calls))}"
    assert "mulps" in asm


@pytest.mark.parametrize("ncoef,low", [(1, 0), (2, 0), (5, 0), (8, 0), (11, 0), (11, 3),
                                       (9, 2), (4, 4)])
def test_estrin_matches_horner(ncoef, low):
    """mathlib_core.Ops.estrin (the latency-short polynomial erfc's R uses) is the same
    polynomial as horner: float64 values at many points agree to rounding."""
    from rlxc.lowering.shared.mathlib_core import Ops

    D = ir.DoubleType()
    rng = np.random.default_rng(ncoef * 10 + low)
    cs = [float(c) for c in rng.uniform(-2, 2, ncoef)]
    m = ir.Module(name="estrin")
    m.triple = llvm.get_process_triple()
    fn = ir.Function(m, ir.FunctionType(D, [D]), "p")
    b = ir.IRBuilder(fn.append_basic_block())
    b.ret(Ops(b, D).estrin(fn.args[0], cs, low))
    tm = llvm.Target.from_default_triple().create_target_machine(opt=2)
    ee = llvm.create_mcjit_compiler(_optimize(str(m), tm), tm)
    ee.finalize_object()
    p = ctypes.CFUNCTYPE(ctypes.c_double, ctypes.c_double)(ee.get_function_address("p"))
    xs = np.linspace(-1.5, 1.5, 61)
    got = np.array([p(float(x)) for x in xs])
    want = np.polynomial.polynomial.polyval(xs, cs)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * sum(map(abs, cs)) * 8)


def test_emit_shapes_and_errors():
    m = ir.Module()
    fn = ir.Function(m, ir.FunctionType(F32, [F32]), "f")
    b = ir.IRBuilder(fn.append_basic_block())
    v16 = ir.Constant(ir.VectorType(F32, 16), [1.0] * 16)
    assert mathlib.emit(b, "exp", v16).type == v16.type
    a = mathlib.emit(b, "tanh", fn.args[0])
    mathlib.emit(b, "tanh", a)                       # helper defined once per module and type
    b.ret(a)
    assert [g.name for g in m.functions].count("rlx.math.tanh.f32") == 1
    assert "rlx.math.exp.v16f32" in m.globals
    llvm.parse_assembly(str(m)).verify()
    with pytest.raises(KeyError, match="no elementwise math rule for 'nope'"):
        mathlib.emit(b, "nope", fn.args[0])
    with pytest.raises(TypeError, match="expected float, double"):
        mathlib.emit(b, "exp", ir.Constant(ir.IntType(32), 1))
    with pytest.raises(TypeError, match="all arguments alike"):
        mathlib.emit(b, "atan2", fn.args[0], ir.Constant(ir.DoubleType(), 1.0))
    with pytest.raises(TypeError, match="takes 2 argument"):
        mathlib.emit(b, "hypot", fn.args[0])
    d4 = ir.Constant(ir.VectorType(ir.DoubleType(), 4), [1.0] * 4)
    assert mathlib.emit(b, "erf", d4).type == d4.type
    assert mathlib.emit(b, "atan2", d4, d4).type == d4.type


def test_function_table():
    """FUNCTIONS is the one table: every (name, dtype) with a bound has a kernel and back."""
    from rlxc.lowering.shared.mathlib_core import KERNELS
    for dt in ("f32", "f64"):
        have = {n for n, d in KERNELS if d == dt and not n.startswith("_")}
        assert have == set(mathlib.BOUNDS[dt]) == set(mathlib.names(dt)), dt
    assert mathlib.names("f32", arity=2) == ["atan2", "hypot"]
    assert set(mathlib.SUPPORTED) == set(mathlib.names("f32"))
    f = mathlib.FUNCTIONS["sin"]
    assert (f.arity, f.ulp("f32"), f.ulp("f64")) == (1, 2.0, 1.0)


# ------------------------------------------------------------------------ NVPTX
def _nvptx_module(tm) -> ir.Module:
    """One kernel per (function, dtype): a <4 x T> and a scalar call per thread."""
    m = ir.Module(name="mathlib_nvptx")
    m.triple = "nvptx64-nvidia-cuda"
    m.data_layout = str(tm.target_data)
    i32 = ir.IntType(32)
    sreg = {s: ir.Function(m, ir.FunctionType(i32, []), f"llvm.nvvm.read.ptx.sreg.{s}")
            for s in ("tid.x", "ctaid.x", "ntid.x")}
    for dt, ty in (("f32", F32), ("f64", ir.DoubleType())):
        v4 = ir.VectorType(ty, 4)
        for op in mathlib.names(dt):
            ar = mathlib.FUNCTIONS[op].arity
            fn = ir.Function(m, ir.FunctionType(ir.VoidType(), [ty.as_pointer()] * 2 + [i32]),
                             f"k_{op}_{dt}")
            fn.calling_convention = "ptx_kernel"
            x, y, n = fn.args
            b = ir.IRBuilder(fn.append_basic_block("entry"))
            i = b.add(b.mul(b.call(sreg["ctaid.x"], []), b.call(sreg["ntid.x"], [])),
                      b.call(sreg["tid.x"], []))
            body, done = fn.append_basic_block("body"), fn.append_basic_block("done")
            b.cbranch(b.icmp_signed("<", b.mul(i, ir.Constant(i32, 4)), n), body, done)
            b.position_at_end(body)
            k = b.mul(i, ir.Constant(i32, 4))            # one <4 x T> and one T each
            pv = b.load(b.bitcast(b.gep(x, [k]), v4.as_pointer()), align=16)
            b.store(mathlib.emit(b, op, *[pv] * ar),
                    b.bitcast(b.gep(y, [k]), v4.as_pointer()), align=16)
            s = b.load(b.gep(x, [i]))
            b.store(mathlib.emit(b, op, *[s] * ar), b.gep(y, [i]))
            b.branch(done)
            b.position_at_end(done)
            b.ret_void()
    return m


def test_nvptx_sm90(tmp_path):
    tm = llvm.Target.from_triple("nvptx64-nvidia-cuda").create_target_machine(
        cpu="sm_90", features="+ptx80", opt=3)
    mod = _optimize(str(_nvptx_module(tm)), tm)
    ptx = tm.emit_assembly(mod)
    assert ".target sm_90" in ptx and ".version 8.0" in ptx
    for dt in ("f32", "f64"):
        for op in mathlib.names(dt):
            assert re.search(rf"\.entry\s+k_{op}_{dt}\b", ptx), f"k_{op}_{dt} is not a kernel"
    assert "call" not in ptx and ".extern" not in ptx, "PTX calls a function"
    assert "fma.rn.f32" in ptx and "div.rn.f32" in ptx and "fma.rn.f64" in ptx
    ptxas = shutil.which("ptxas")
    if ptxas is None:
        pytest.skip("ptxas not on PATH: PTX generated, not assembled")
    src = tmp_path / "mathlib.ptx"
    src.write_text(ptx)
    r = subprocess.run([ptxas, "-arch=sm_90", str(src), "-o", str(tmp_path / "mathlib.cubin")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_gpu_math_takes_f64():
    """gpu_math is a thin wrapper: every mathlib name at f64, and pow/sqrt/rsqrt on doubles
    (JIT-compiled for the host here; test_nvptx_sm90 assembles mathlib's f64 kernels)."""
    from rlxc.lowering.gpu import mathlib as gpu_math
    assert set(mathlib.FUNCTIONS) <= set(gpu_math.FUNCTIONS)
    d = ir.DoubleType()
    m = ir.Module(name="gpu_math_f64")
    m.triple = llvm.get_process_triple()
    names = ["pow", "atan2", "hypot", "sqrt", "rsqrt", "exp", "sin"]
    for name in names:
        fn = ir.Function(m, ir.FunctionType(d, [d, d]), f"g_{name}")
        b = ir.IRBuilder(fn.append_basic_block())
        args = fn.args if name in ("pow", "atan2", "hypot") else fn.args[:1]
        b.ret(gpu_math.emit(b, name, *args))
    tm = llvm.Target.from_default_triple().create_target_machine(opt=2)
    ee = llvm.create_mcjit_compiler(_optimize(str(m), tm), tm)
    ee.finalize_object()
    proto = ctypes.CFUNCTYPE(ctypes.c_double, ctypes.c_double, ctypes.c_double)
    ref = {"pow": np.power, "atan2": np.arctan2, "hypot": np.hypot, "sqrt": lambda x, y: np.sqrt(x),
           "rsqrt": lambda x, y: 1 / np.sqrt(x), "exp": lambda x, y: np.exp(x),
           "sin": lambda x, y: np.sin(x)}
    for name in names:
        f = proto(ee.get_function_address(f"g_{name}"))
        for x, y in [(2.0, 10.0), (-2.0, 3.0), (0.5, -1.5), (3.0, 0.0), (-8.0, 1 / 3)]:
            with np.errstate(all="ignore"):
                want = float(ref[name](np.float64(x), np.float64(y)))
            got = f(x, y)
            assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want, rel=1e-14), \
                (name, x, y, got, want)
    with pytest.raises(KeyError, match="no function 'nope'"):
        gpu_math.emit(b, "nope", fn.args[0])


def test_compiled_sin_cos_huge_arguments():
    """Issue 13 item 16 end to end: an rlxc-compiled sin/cos on huge float32 arguments
    (garbage up to 2.0 absolute for |x| >~ 5.4e6 before) agrees with NumPy in float64."""
    import rlxc
    rng = np.random.default_rng(16)
    x = np.concatenate([np.array(HUGE, np.float32),
                        (np.exp(rng.uniform(np.log(5e6), np.log(3e38), 4093))
                         * rng.choice([-1, 1], 4093)).astype(np.float32)])
    f = rlxc.Func("sincos_huge", lambda s: (lambda v: (v.sin(), v.cos()))(s.input("x", x.shape)))
    ys, yc = f.run_on("cpu", x=x)
    for y, ref in ((ys, np.sin(x.astype(np.float64))), (yc, np.cos(x.astype(np.float64)))):
        err = ulp_error(y, ref)
        assert err.max() <= 2.0, (x[np.argmax(err)], err.max())


def test_bench_math_runs(tmp_path):
    """benchmarks/bench_math.py end to end at a tiny size: each case checked against
    PyTorch where it is installed, then timed; one line per case."""
    import os
    import sys

    bench = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "bench_math.py")
    env = {**os.environ, "RLXC_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, bench, "--n", "4099", "--runs", "1", "--threads", "1"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    for case in ("gelu", "gelu_grad", "erf"):
        assert re.search(rf"^  {case} +rlxc +[\d.]+ us", out.stdout, re.M), out.stdout

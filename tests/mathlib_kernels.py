"""Shared by the mathlib tests of float64 and of the newer functions: compile loops
`void f(T* x, [T* x2,] T* y, i64 n)` for any (name, dtype) of mathlib.FUNCTIONS, as an
explicit <8 x T> body + scalar tail (`_vec`) and as one scalar call per element left to LLVM's
loop vectorizer (`_scalar`), at O3 with MCJIT for the host CPU and baseline x86-64 (no FMA);
and measure errors in ulps against a higher-precision reference."""
from __future__ import annotations

import ctypes

import numpy as np
import llvmlite.binding as llvm
from llvmlite import ir

from rlxc.lowering.shared import mathlib
from test_mathlib import TARGETS, _optimize

I64 = ir.IntType(64)
TYPES = {"f32": (ir.FloatType(), np.float32), "f64": (ir.DoubleType(), np.float64)}


def _loop(m: ir.Module, fname: str, op: str, ty, arity: int, vector: bool) -> None:
    fn = ir.Function(m, ir.FunctionType(ir.VoidType(), [ty.as_pointer()] * (arity + 1) + [I64]),
                     fname)
    *xs, y, n = fn.args
    for a in (*xs, y):
        a.add_attribute("noalias")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    start, pred = ir.Constant(I64, 0), b.block
    if vector:
        vt = ir.VectorType(ty, 8)
        nv = b.and_(n, ir.Constant(I64, -8))
        vhead, vbody = fn.append_basic_block("vhead"), fn.append_basic_block("vbody")
        b.branch(vhead)
        b.position_at_end(vhead)
        i = b.phi(I64)
        i.add_incoming(start, pred)
        start, pred = nv, vhead
        b.cbranch(b.icmp_signed("<", i, nv), vbody, shead := fn.append_basic_block("shead"))
        b.position_at_end(vbody)
        args = [b.load(b.bitcast(b.gep(x, [i]), vt.as_pointer()), align=4) for x in xs]
        b.store(mathlib.emit(b, op, *args), b.bitcast(b.gep(y, [i]), vt.as_pointer()), align=4)
        i.add_incoming(b.add(i, ir.Constant(I64, 8)), vbody)
        b.branch(vhead)
    else:
        b.branch(shead := fn.append_basic_block("shead"))
    sbody, done = fn.append_basic_block("sbody"), fn.append_basic_block("done")
    b.position_at_end(shead)
    j = b.phi(I64)
    j.add_incoming(start, pred)
    b.cbranch(b.icmp_signed("<", j, n), sbody, done)
    b.position_at_end(sbody)
    b.store(mathlib.emit(b, op, *[b.load(b.gep(x, [j])) for x in xs]), b.gep(y, [j]))
    j.add_incoming(b.add(j, ir.Constant(I64, 1)), sbody)
    b.branch(shead)
    b.position_at_end(done)
    b.ret_void()


class Kernels:
    """Every (op, dtype) in `pairs`, both loop kinds, compiled for one target."""

    def __init__(self, target: str, pairs):
        cpu, features = TARGETS[target]
        self.tm = llvm.Target.from_default_triple().create_target_machine(
            cpu=cpu, features=features, opt=3)
        m = ir.Module(name="mathlib_kernels")
        m.triple = llvm.get_process_triple()
        m.data_layout = str(self.tm.target_data)
        self.pairs = list(pairs)
        for op, dt in self.pairs:
            ar = mathlib.FUNCTIONS[op].arity
            for kind in ("vec", "scalar"):
                _loop(m, f"{op}_{dt}_{kind}", op, TYPES[dt][0], ar, kind == "vec")
        self.mod = _optimize(str(m), self.tm)
        self.ee = llvm.create_mcjit_compiler(self.mod, self.tm)
        self.ee.finalize_object()
        self.fns = {}
        for op, dt in self.pairs:
            ar = mathlib.FUNCTIONS[op].arity
            proto = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * (ar + 1), ctypes.c_int64)
            for kind in ("vec", "scalar"):
                name = f"{op}_{dt}_{kind}"
                self.fns[name] = proto(self.ee.get_function_address(name))

    def ir_of(self, name: str) -> str:
        return str(self.mod.get_function(name))

    def run(self, op: str, dt: str, *xs, kind: str = "vec") -> np.ndarray:
        npt = TYPES[dt][1]
        xs = [np.ascontiguousarray(x, dtype=npt) for x in xs]
        xs = np.broadcast_arrays(*xs)
        xs = [np.ascontiguousarray(x) for x in xs]
        y = np.empty_like(xs[0])
        self.fns[f"{op}_{dt}_{kind}"](*[x.ctypes.data for x in xs], y.ctypes.data, y.size)
        return y


def ulp_error(y: np.ndarray, ref: np.ndarray, dt: str) -> np.ndarray:
    """|y - ref| in ulps of ref at dtype dt (ref: float64 for f32 results, longdouble for f64);
    inf where y is inf/NaN but ref rounds to a finite value; 0 where both round to the same
    infinity or are NaN."""
    npt = TYPES[dt][1]
    fi = np.finfo(npt)
    emin, mant = fi.minexp, fi.nmant                 # -126/23, -1022/52
    wide = np.longdouble if dt == "f64" else np.float64
    ref = np.asarray(ref, dtype=wide)
    with np.errstate(over="ignore", invalid="ignore"):
        refn = ref.astype(npt)
        e = np.frexp(np.abs(ref))[1]
        ulp = np.ldexp(wide(1.0), (np.maximum(e - 1, emin) - mant).astype(np.int32))
        err = (np.abs(y.astype(wide) - ref) / np.where(ref == 0, np.ldexp(wide(1.0), emin - mant),
                                                        ulp)).astype(np.float64)
    over = np.isinf(refn)
    err = np.where(over, np.where(y == refn, 0.0, np.inf), err)
    err = np.where(np.isfinite(y) | over, err, np.inf)
    return np.where(np.isnan(ref), np.where(np.isnan(y), 0.0, np.inf), err)


def random_bits(rng, n: int, dt: str) -> np.ndarray:
    """n random bit patterns of dtype dt (every binade, both signs), finite only."""
    if dt == "f32":
        x = rng.integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    else:
        x = rng.integers(0, 2 ** 63, n, dtype=np.uint64)
        x = (x | (rng.integers(0, 2, n, dtype=np.uint64) << np.uint64(63))).view(np.float64)
    return x[np.isfinite(x)]


# ------------------------------------------------------------------ long double references
LD = np.longdouble
PI_LD = np.longdouble("3.14159265358979323846264338327950288")


def _exp_neg_sq(x):
    """e^(-x^2) for float64 x in long double, with x^2 split so it is (nearly) exact."""
    x = np.abs(np.asarray(x, dtype=LD))
    xh = np.ldexp(np.floor(np.ldexp(x, 26 - np.frexp(x)[1].astype(np.int32))),
                  np.frexp(x)[1].astype(np.int32) - 26)
    xl = x - xh
    return np.exp(-(xh * xh)) * np.exp(-(2 * xh * xl + xl * xl))


def erf_ld(x):
    """erf in long double: 2/sqrt(pi) e^(-x^2) sum 2^n x^(2n+1)/(2n+1)!! (no cancellation)."""
    x = np.asarray(x, dtype=LD)
    a = np.minimum(np.abs(x), LD(7))
    term = a.copy()
    total = a.copy()
    for n in range(1, 200):
        term = term * 2 * a * a / (2 * n + 1)
        total = total + term
    with np.errstate(all="ignore"):
        r = 2 / np.sqrt(PI_LD) * _exp_neg_sq(a) * total
    r = np.where(np.abs(x) >= 7, LD(1), r)
    return np.where(np.isnan(x), x, np.copysign(r, x))


def erfc_ld(x):
    """erfc in long double: 1 - erf for x < 2, the continued fraction for x >= 2."""
    x = np.asarray(x, dtype=LD)
    a = np.clip(x, LD(2), LD(30))
    f = a.copy()                                    # Lentz-free backward recurrence
    acc = a.copy()
    for k in range(400, 0, -1):
        acc = a + (k / LD(2)) / acc
    with np.errstate(all="ignore"):
        cf = _exp_neg_sq(a) / np.sqrt(PI_LD) / acc
    del f
    r = np.where(x >= 2, cf, 1 - erf_ld(x))
    return np.where(x > 30, LD(0), r)

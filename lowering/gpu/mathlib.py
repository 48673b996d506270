"""Scalar f32/f64 math for GPU kernels, as plain LLVM IR (no libm, no libdevice).

    emit(builder, "exp", x)   x: f32 or f64 SSA value (atan2/hypot/pow take two)
          │ mathlib.py (shared with the CPU backend): every name of mathlib.FUNCTIONS,
          │   at the dtypes it has (exp/log/tanh/erf/sin/atan2/... in both)
          │ here: pow, sqrt, rsqrt (NumPy's special cases for pow)
          ▼
    SSA value of the same type, built from instructions the NVPTX backend lowers

The NVPTX backend has no lowering for @llvm.exp/log/sin/tanh/pow.f32 (LLVM
aborts with "no libcall available"), so every transcendental an rlx op needs
comes from `rlxc.lowering.shared.mathlib` (branch-free Cephes-style kernels, ulp
bounds in its header) or from this file.  pow(x, y) = exp(y·log|x|), then
C's / NumPy's rules: y == 0, x == 1 or (x, y) = (-1, +-inf) → 1; an odd
integer y keeps the sign of x (-0 and -inf included); a finite x < 0 needs an
integer y, else NaN; float32 and float64.  Error: within 2 + |y·log2|x|| ulp
(tests/test_edge_semantics.py).  sqrt is `sqrt.rn`, rsqrt is 1/sqrt.rn (IEEE
division), so both are correctly rounded or within 1 ulp.  sin/cos/tan read 2/pi
from a small constant table for huge float64 arguments (the NVPTX backend places
it in global memory).
"""
from __future__ import annotations

import llvmlite.ir as ir

from rlxc.lowering.shared import mathlib
from rlxc.lowering.shared import scalar as shared_scalar

F32 = ir.FloatType()

__all__ = ["emit", "FUNCTIONS", "fconst", "intrinsic"]


def fconst(v: float, ty: ir.Type = F32) -> ir.Constant:
    return ir.Constant(ty, float(v))


def intrinsic(b: ir.IRBuilder, name: str, ret, args):
    """Call intrinsic `name` (declared once per module)."""
    mod = b.module
    fn = mod.globals.get(name)
    if fn is None:
        fn = ir.Function(mod, ir.FunctionType(ret, [a.type for a in args]), name)
    return b.call(fn, args)


def _sfx(x) -> str:
    return "f64" if isinstance(x.type, ir.DoubleType) else "f32"


def sqrt(b, x):
    return intrinsic(b, f"llvm.sqrt.{_sfx(x)}", x.type, [x])


def rsqrt(b, x):
    return b.fdiv(fconst(1.0, x.type), sqrt(b, x))


def pow_(b, x, y):
    """x**y with C's / NumPy's float rules (see the header); float32 and float64."""
    return shared_scalar.pow_exp_log(b, x, y)


def _from_mathlib(name):
    return lambda b, *xs: mathlib.emit(b, name, *xs)


FUNCTIONS = {name: _from_mathlib(name) for name in mathlib.FUNCTIONS}
FUNCTIONS.update({"pow": pow_, "sqrt": sqrt, "rsqrt": rsqrt})


def emit(builder: ir.IRBuilder, name: str, *args):
    """`name(*args)` at the builder's position (args: f32 or f64 SSA values, all alike);
    mathlib raises TypeError for a dtype a function does not have."""
    try:
        fn = FUNCTIONS[name]
    except KeyError:
        raise KeyError(f"gpu_math: no function {name!r}; valid: {sorted(FUNCTIONS)}") from None
    return fn(builder, *args)

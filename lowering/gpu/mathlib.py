"""Scalar f32 math for GPU kernels, as plain LLVM IR (no libm, no libdevice).

    emit(builder, "exp", x)   x: f32 SSA value
          │ mathlib.py (shared with the CPU backend): exp/log/tanh/erf/sin/...
          │ here: pow, sqrt, rsqrt (NumPy's special cases for pow)
          ▼
    f32 SSA value built from instructions the NVPTX backend lowers

The NVPTX backend has no lowering for @llvm.exp/log/sin/tanh/pow.f32 (LLVM
aborts with "no libcall available"), so every transcendental an rlx op needs
comes from `rlxc.lowering.shared.mathlib` (branch-free Cephes-style kernels, ulp
bounds in its header) or from this file.  pow(x, y) = exp(y·log|x|), then
C's / NumPy's rules: y == 0, x == 1 or (x, y) = (-1, +-inf) → 1; an odd
integer y keeps the sign of x (-0 and -inf included); a finite x < 0 needs an
integer y, else NaN.  Error: within 2 + |y·log2|x|| ulp (tests/
test_edge_semantics.py).  sqrt is `sqrt.rn`, rsqrt is 1/sqrt.rn (IEEE
division), so both are correctly rounded or within 1 ulp.
"""
from __future__ import annotations

import math

import llvmlite.ir as ir

from rlxc.lowering.shared import mathlib

F32 = ir.FloatType()
I32 = ir.IntType(32)
I1 = ir.IntType(1)

__all__ = ["emit", "FUNCTIONS", "fconst", "intrinsic"]


def fconst(v: float) -> ir.Constant:
    return ir.Constant(F32, float(v))


def intrinsic(b: ir.IRBuilder, name: str, ret, args):
    """Call intrinsic `name` (declared once per module)."""
    mod = b.module
    fn = mod.globals.get(name)
    if fn is None:
        fn = ir.Function(mod, ir.FunctionType(ret, [a.type for a in args]), name)
    return b.call(fn, args)


def _fabs(b, x):
    return intrinsic(b, "llvm.fabs.f32", F32, [x])


def sqrt(b, x):
    return intrinsic(b, "llvm.sqrt.f32", F32, [x])


def rsqrt(b, x):
    return b.fdiv(fconst(1.0), sqrt(b, x))


def pow_(b, x, y):
    """x**y with C's / NumPy's float rules (see the header)."""
    r = mathlib.emit(b, "exp", b.fmul(y, mathlib.emit(b, "log", _fabs(b, x))))
    ty = intrinsic(b, "llvm.trunc.f32", F32, [y])
    yint = b.fcmp_ordered("==", ty, y)
    big = b.fcmp_ordered(">=", _fabs(b, y), fconst(16777216.0))  # every such float is even
    odd = b.and_(b.trunc(b.fptosi(b.select(big, fconst(0.0), ty), I32), I1), b.not_(big))
    odd = b.and_(yint, odd)
    signbit = b.icmp_signed("<", b.bitcast(x, I32), ir.Constant(I32, 0))   # -0 and -inf too
    r = b.select(b.and_(signbit, odd), b.fneg(r), r)
    xneg = b.and_(b.fcmp_ordered("<", x, fconst(0.0)),
                  b.fcmp_ordered("!=", x, fconst(-math.inf)))            # finite x < 0
    r = b.select(b.and_(xneg, b.not_(yint)), fconst(math.nan), r)
    one = b.or_(b.fcmp_ordered("==", y, fconst(0.0)), b.fcmp_ordered("==", x, fconst(1.0)))
    one = b.or_(one, b.and_(b.fcmp_ordered("==", x, fconst(-1.0)),                # (-1)^+-inf
                            b.fcmp_ordered("==", _fabs(b, y), fconst(math.inf))))
    return b.select(one, fconst(1.0), r)


def _from_mathlib(name):
    return lambda b, x: mathlib.emit(b, name, x)


FUNCTIONS = {name: _from_mathlib(name) for name in mathlib.SUPPORTED}
FUNCTIONS.update({"pow": pow_, "sqrt": sqrt, "rsqrt": rsqrt})


def emit(builder: ir.IRBuilder, name: str, *args):
    """f32 `name(*args)` at the builder's position (args are f32 SSA values)."""
    try:
        fn = FUNCTIONS[name]
    except KeyError:
        raise KeyError(f"gpu_math: no function {name!r}; valid: {sorted(FUNCTIONS)}") from None
    return fn(builder, *args)

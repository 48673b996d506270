"""GPU overrides of the shared scalar rules: only where NVPTX truly differs.

    GPU_RULES = shared.scalar.LOWER_RULES, with
          │ rlx.pow  exp(y*log|x|) with NumPy's sign/NaN rules (gpu/mathlib.pow_): the
          │          NVPTX backend has no lowering for @llvm.pow (no libm on the device);
          │          float32 and float64 (integers: the shared int_pow)
          ▼
    gpu/expr.py applies a rule per lane (one register each); the reductions in
    gpu/kernels.py use the shared `combine` and `identity`

Everything else (casts, integer division, fake_quant, the transcendentals of
mathlib) is the CPU's rule, so both targets follow the edge semantics written
once in lowering/shared/scalar.py.
"""
from __future__ import annotations

import llvmlite.ir as ir

from rlxc.dialect.types import dtype_of
from rlxc.lowering.gpu import mathlib as gpu_math
from rlxc.lowering.shared import scalar as shared
from rlxc.lowering.shared.scalar import TYPES as REG_TYPE  # noqa: F401  (register types)

TARGET = "GPU lowering"


def _pow(c, x, y):
    if c.dtype not in ("f32", "f64"):
        return shared.int_pow(c.b, x, y, x.type)   # exact integer pow: the CPU's rule
    return gpu_math.emit(c.b, "pow", x, y)


GPU_RULES = {**shared.LOWER_RULES, "rlx.pow": _pow}


def emit(b: ir.IRBuilder, op, args: list):
    """The GPU rule of xDSL op `op` on its operands' registers `args`."""
    return shared.emit(b, op.name, args, dtype_of(op.results[0].type),
                       dtype_of(op.operands[0].type), op.params(), GPU_RULES, TARGET)


def convert(b, x, src: str, dst: str):
    """Cast a register between rlx dtypes (the shared cast rule)."""
    return shared.cast(b, x, src, dst)


def nan_identity(name: str, dt: str):
    """Identity element of reduction `name` ("rlx.max") for dtype `dt`, as an IR constant."""
    return shared.const(REG_TYPE[dt], shared.identity(shared.SHAPES[name].combine, dt))


def combine(b, name: str, dt: str, acc, x):
    """acc <op> x for reduction `name` (the shared accumulator update)."""
    return shared.combine(b, shared.SHAPES[name].combine, acc, x, dt)

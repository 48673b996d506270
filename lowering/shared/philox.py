"""The LLVM rule of rlx.philox, shared by the CPU (vector lanes) and the GPU (registers).

    philox(k0, k1, ctr) {word, stream}      i32 (or <N x i32>) registers
          │ counter (ctr, stream, 0, 0), key (k0, k1); 10 rounds of
          │   mulhilo: zext to i64, mul, lshr 32 / trunc     (PTX: mul.wide.u32)
          │   xor the high halves with the other words and the key; bump the key
          ▼
    uitofp(word >> 8) * 2**-24       a uniform f32 in [0, 1)

Algorithm and constants: dialect/philox.py (the NumPy rule it matches bit for bit).
Words the chosen output does not use are dead code that LLVM removes.
"""
from __future__ import annotations

import llvmlite.ir as ir

from rlxc.dialect.philox import M0, M1, ROUNDS, W0, W1

_I32, _I64, _F32 = ir.IntType(32), ir.IntType(64), ir.FloatType()


def _like(ty, elem):
    return ir.VectorType(elem, ty.count) if isinstance(ty, ir.VectorType) else elem


def _const(ty, v):
    if isinstance(ty, ir.VectorType):
        return ir.Constant(ty, [ir.Constant(ty.element, v)] * ty.count)
    return ir.Constant(ty, v)


def _signed32(v: int) -> int:
    return v - (1 << 32) if v >= 1 << 31 else v


def philox_words(b: ir.IRBuilder, k0, k1, c0, c1, c2, c3):
    """The four output words of Philox-4x32-10 (i32 registers or vectors)."""
    t = k0.type
    t64 = _like(t, _I64)

    def mulhilo(m, x):
        p = b.mul(_const(t64, m), b.zext(x, t64))
        return b.trunc(b.lshr(p, _const(t64, 32)), t), b.trunc(p, t)

    for r in range(ROUNDS):
        if r:
            k0 = b.add(k0, _const(t, _signed32(W0)))
            k1 = b.add(k1, _const(t, _signed32(W1)))
        hi0, lo0 = mulhilo(M0, c0)
        hi1, lo1 = mulhilo(M1, c2)
        c0, c1, c2, c3 = b.xor(b.xor(hi1, c1), k0), lo1, b.xor(b.xor(hi0, c3), k1), lo0
    return c0, c1, c2, c3


def philox_rule(c, k0, k1, ctr):
    """LOWER_RULES["rlx.philox"]: At `c` (params word, stream) on the operand registers."""
    b, t = c.b, k0.type
    stream = _const(t, _signed32(int(c.params["stream"])))
    zero = _const(t, 0)
    w = philox_words(b, k0, k1, ctr, stream, zero, zero)[int(c.params["word"])]
    f = b.uitofp(b.lshr(w, _const(t, 8)), _like(t, _F32))
    return b.fmul(f, _const(_like(t, _F32), 2.0 ** -24))

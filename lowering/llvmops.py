"""Elementwise ops of the loop IR as LLVM instructions, on scalars or vectors.

    loops.Op(op, args, dtype)          (args already emitted: float / <N x float> / iK ...)
          │ emit_op: one rule per op, width-generic (constants splat to the arg type)
          ▼
    fadd/fcmp/select/bitcast ... , mathlib.emit for transcendentals, llvm.* intrinsics

Used by llvmgen.py for loop bodies (scalar code that LLVM vectorizes) and for
sgemm epilogues (explicit <VL x float> code), so every rule works on both.
Semantics follow the NumPy interpreter: float compares are ordered except `ne`
(NaN != NaN); maximum/minimum propagate NaN (llvm.maximum/minimum); relu and
sign pass NaN through; float->int casts truncate toward zero and saturate
(llvm.fptosi.sat, NaN -> 0; NumPy leaves those cases undefined); integer
division is float64 division truncated, as `np.divide(...).astype(int)`.
No fast-math flags on elementwise arithmetic, so results round like NumPy's;
transcendentals come from mathlib (error bounds in its header; pow calls libm
powf except for small constant exponents).

fake_quant rounds to the (exp_bits, man_bits) grid with integer arithmetic on
the float's bits: with a = |x| bits, e the unbiased exponent and
ex = max(e, emin), the low d = (ex - M) - (max(e, -126) - 23) bits of a are
rounded to nearest even (a carry into the exponent field is the correct next
binade); magnitudes below half the smallest subnormal of the format become 0
(one d == 24 tie case becomes that subnormal); then |r| is clipped to
max_normal (inf included) and the sign restored.  NaN passes.  This equals
rlxc.lowp.quantize bit for bit (tests/test_cpu_ops.py).
"""
from __future__ import annotations

import struct

import llvmlite.ir as ir
import numpy as np

F32 = ir.FloatType()
F64 = ir.DoubleType()
I1 = ir.IntType(1)
I8 = ir.IntType(8)
I32 = ir.IntType(32)
I64 = ir.IntType(64)

TYPES = {"f32": F32, "f64": F64, "i1": I1, "i32": I32, "i64": I64}
MEM_TYPES = {"f32": F32, "f64": F64, "i1": I8, "i32": I32, "i64": I64}
MATH = {"exp", "log", "tanh", "sigmoid", "gelu", "gelu_tanh", "silu", "softplus", "sin", "cos",
        "erf"}
FCMP = {"eq": "==", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
ROUNDING = {"floor": "llvm.floor", "ceil": "llvm.ceil", "round": "llvm.roundeven"}


def vtype(dt: str, width=None):
    t = TYPES[dt]
    return ir.VectorType(t, width) if width else t


def width_of(v):
    return v.type.count if isinstance(v.type, ir.VectorType) else None


def const(ty, value):
    """Constant of type ty (scalar or vector; vectors get a splat)."""
    if isinstance(ty, ir.VectorType):
        return ir.Constant(ty, [_scalar(ty.element, value)] * ty.count)
    return ir.Constant(ty, _scalar(ty, value))


def _scalar(ty, value):
    if isinstance(ty, (ir.FloatType, ir.DoubleType)):
        return float(value)
    if ty.width == 1:
        return int(bool(value))
    return int(value)


def intrinsic(b: ir.IRBuilder, base: str, ty, nargs: int = 1, ret=None, suffix=None):
    """Declare/get `llvm.<base>.<suffix>` taking nargs values of `ty`."""
    if suffix is None:
        suffix = _suffix(ty)
    name = f"{base}.{suffix}"
    fn = b.module.globals.get(name)
    if fn is None:
        fn = ir.Function(b.module, ir.FunctionType(ret or ty, [ty] * nargs), name)
    return fn


def _suffix(ty):
    if isinstance(ty, ir.VectorType):
        return f"v{ty.count}{_suffix(ty.element)}"
    if isinstance(ty, ir.FloatType):
        return "f32"
    if isinstance(ty, ir.DoubleType):
        return "f64"
    return f"i{ty.width}"


def _is_float(dt):
    return dt in ("f32", "f64")


def emit_op(b: ir.IRBuilder, node, args: list):
    """Emit loops.Op `node` applied to the already emitted `args`."""
    op, dt = node.op, node.dtype
    adt = node.args[0].dtype if node.args else dt
    x = args[0] if args else None
    ty = x.type if x is not None else None
    if op in MATH:
        from . import mathlib

        return mathlib.emit(b, op, x)
    if op == "stop_gradient":
        return x
    if op == "neg":
        return b.fneg(x) if _is_float(dt) else b.sub(const(ty, 0), x)
    if op == "sqrt":
        return b.call(intrinsic(b, "llvm.sqrt", ty), [x])
    if op == "rsqrt":
        return b.fdiv(const(ty, 1.0), b.call(intrinsic(b, "llvm.sqrt", ty), [x]))
    if op == "reciprocal":
        return b.fdiv(const(ty, 1.0), x)
    if op in ROUNDING:  # floor, ceil, round (halves to even): one intrinsic each
        return b.call(intrinsic(b, ROUNDING[op], ty), [x])
    if op == "relu":
        return b.select(b.fcmp_unordered(">", x, const(ty, 0.0)), x, const(ty, 0.0))
    if op == "abs":
        if _is_float(dt):
            return b.call(intrinsic(b, "llvm.fabs", ty), [x])
        return b.select(b.icmp_signed("<", x, const(ty, 0)), b.sub(const(ty, 0), x), x)
    if op == "sign":
        if _is_float(dt):
            pos, neg = b.fcmp_ordered(">", x, const(ty, 0.0)), b.fcmp_ordered("<", x, const(ty, 0.0))
            return b.select(pos, const(ty, 1.0), b.select(neg, const(ty, -1.0), x))
        pos, neg = b.icmp_signed(">", x, const(ty, 0)), b.icmp_signed("<", x, const(ty, 0))
        return b.select(pos, const(ty, 1), b.select(neg, const(ty, -1), const(ty, 0)))
    if op == "fake_quant":
        return fake_quant(b, x, **dict(node.params))
    if op == "cast":
        return cast(b, x, adt, dt)
    if op == "select":
        return b.select(args[0], args[1], args[2])
    if op == "and":
        return b.and_(args[0], args[1])
    if op == "or":
        return b.or_(args[0], args[1])
    y = args[1]
    if op in FCMP or op == "ne":
        if _is_float(adt):
            if op == "ne":
                return b.fcmp_unordered("!=", x, y)
            return b.fcmp_ordered(FCMP[op], x, y)
        sym = "!=" if op == "ne" else FCMP[op]
        if adt == "i1":
            return b.icmp_unsigned(sym, x, y)
        return b.icmp_signed(sym, x, y)
    return combine(b, op, x, y, dt)


def combine(b, op, x, y, dt, flags=()):
    """Binary arithmetic, also the accumulator updates of reductions (op names of both)."""
    ty = x.type
    fl = _is_float(dt)
    if op == "add":
        return b.fadd(x, y, flags=flags) if fl else (b.or_(x, y) if dt == "i1" else b.add(x, y))
    if op == "sub":
        return b.fsub(x, y) if fl else b.sub(x, y)
    if op == "mul":
        return b.fmul(x, y, flags=flags) if fl else (b.and_(x, y) if dt == "i1" else b.mul(x, y))
    if op == "div":
        if fl:
            return b.fdiv(x, y)
        fty = ir.VectorType(F64, ty.count) if isinstance(ty, ir.VectorType) else F64
        q = b.fdiv(b.sitofp(x, fty), b.sitofp(y, fty))
        return _fptosi(b, q, ty)
    if op in ("max", "maximum"):
        if fl:
            return b.call(intrinsic(b, "llvm.maximum", ty, 2), [x, y])
        if dt == "i1":
            return b.or_(x, y)
        return b.select(b.icmp_signed(">", x, y), x, y)
    if op in ("min", "minimum"):
        if fl:
            return b.call(intrinsic(b, "llvm.minimum", ty, 2), [x, y])
        if dt == "i1":
            return b.and_(x, y)
        return b.select(b.icmp_signed("<", x, y), x, y)
    if op == "or":
        return b.or_(x, y)
    if op == "and":
        return b.and_(x, y)
    if op == "pow":
        return _pow(b, x, y, dt)
    if op == "rem":  # truncated remainder (C fmod)
        if fl:
            return b.frem(x, y)
        # srem by 0 is undefined and INT_MIN srem -1 traps: both give 0 (NumPy's result)
        bad = b.or_(b.icmp_signed("==", y, const(ty, 0)), b.icmp_signed("==", y, const(ty, -1)))
        return b.srem(x, b.select(bad, const(ty, 1), y))
    raise NotImplementedError(f"cpu backend: no LLVM rule for op {op!r}")


def _pow(b, x, y, dt):
    ty = x.type
    if _is_float(dt):
        c = getattr(y, "constant", None)
        if isinstance(c, float) or (isinstance(c, list) and len(set(map(float, c))) == 1):
            k = float(c if isinstance(c, float) else c[0])
            if k == 1.0:
                return x
            if k == 2.0:
                return b.fmul(x, x)
            if k == -1.0:
                return b.fdiv(const(ty, 1.0), x)
            if k == 0.0:
                return const(ty, 1.0)
        return b.call(intrinsic(b, "llvm.pow", ty, 2), [x, y])
    fty = ir.VectorType(F64, ty.count) if isinstance(ty, ir.VectorType) else F64
    r = b.call(intrinsic(b, "llvm.pow", fty, 2), [b.sitofp(x, fty), b.sitofp(y, fty)])
    return _fptosi(b, r, ty)


def _fptosi(b, x, ity):
    fn = intrinsic(b, "llvm.fptosi.sat", x.type, 1, ret=ity,
                   suffix=f"{_suffix(ity)}.{_suffix(x.type)}")
    return b.call(fn, [x])


def cast(b, x, src: str, dst: str):
    if src == dst:
        return x
    w = width_of(x)
    to = vtype(dst, w)
    if _is_float(src):
        if _is_float(dst):
            return b.fpext(x, to) if dst == "f64" else b.fptrunc(x, to)
        if dst == "i1":
            return b.fcmp_unordered("!=", x, const(x.type, 0.0))
        return _fptosi(b, x, to)
    if src == "i1":
        return b.uitofp(x, to) if _is_float(dst) else b.zext(x, to)
    if _is_float(dst):
        return b.sitofp(x, to)
    if dst == "i1":
        return b.icmp_signed("!=", x, const(x.type, 0))
    sw, dw = TYPES[src].width, TYPES[dst].width
    return b.sext(x, to) if dw > sw else b.trunc(x, to)


def _f32_bits(v: float) -> int:
    return struct.unpack("<I", struct.pack("<f", float(np.float32(v))))[0]


def fake_quant(b, x, exp_bits: int, man_bits: int, max_normal: float):
    """Round f32 (or <N x f32>) x to the (exp_bits, man_bits) grid; see the header."""
    E, M = int(exp_bits), int(man_bits)
    if not (1 <= E <= 8 and 0 <= M <= 23):
        raise NotImplementedError(f"cpu backend: rlx.fake_quant e{E}m{M} does not fit in f32")
    emin = 2 - 2 ** (E - 1)
    q = emin - M
    qbits = ((q + 127) << 23) if q >= -126 else (1 << (q + 149))
    limit = _f32_bits(max_normal)
    w = width_of(x)
    ity = ir.VectorType(I32, w) if w else I32

    def k(v):
        return const(ity, v & 0xFFFFFFFF if v >= 0 else v)

    def smax(p, r):
        return b.select(b.icmp_signed(">", p, r), p, r)

    def smin(p, r):
        return b.select(b.icmp_signed("<", p, r), p, r)

    u = b.bitcast(x, ity)
    sign = b.and_(u, k(-0x80000000))
    a = b.and_(u, k(0x7FFFFFFF))
    eb = b.lshr(a, k(23))
    e_eff = b.sub(smax(eb, k(1)), k(127))
    ex = smax(b.sub(eb, k(127)), k(emin))
    d = b.add(b.sub(ex, e_eff), k(23 - M))
    dc = smin(smax(d, k(0)), k(24))
    one = b.shl(k(1), dc)
    mask = b.sub(one, k(1))
    half = b.lshr(one, k(1))
    low = b.and_(a, mask)
    base = b.and_(a, b.xor(mask, k(-1)))  # a carry out of the mantissa bumps the exponent
    # parity of the kept significand: bit d of the mantissa with its implicit 1 (d = 23
    # reaches the implicit bit, which a's exponent field does not hold)
    sig = b.select(b.icmp_unsigned("!=", eb, k(0)), b.or_(b.and_(a, k(0x7FFFFF)), k(0x800000)), a)
    odd = b.icmp_unsigned("!=", b.and_(b.lshr(sig, dc), k(1)), k(0))
    up = b.or_(b.icmp_unsigned(">", low, half),
               b.and_(b.icmp_unsigned("==", low, half), odd))
    up = b.and_(up, b.icmp_signed(">", d, k(0)))
    r = b.add(base, b.select(up, one, k(0)))
    big = b.and_(b.icmp_unsigned("!=", eb, k(0)), b.icmp_signed(">=", d, k(24)))
    tie_up = b.and_(b.icmp_signed("==", d, k(24)),
                    b.icmp_unsigned("!=", b.and_(a, k(0x7FFFFF)), k(0)))
    r = b.select(big, b.select(tie_up, k(qbits), k(0)), r)
    r = b.select(b.icmp_unsigned(">", r, k(limit)), k(limit), r)
    res = b.bitcast(b.or_(r, sign), x.type)
    isnan = b.icmp_unsigned(">", a, k(0x7F800000))
    return b.select(isnan, x, res)

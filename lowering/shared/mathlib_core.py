"""Builder helpers shared by the mathlib kernels (mathlib.py: float32, mathlib_f64.py:
float64, mathlib_more.py: both): `Ops` is arithmetic on one float type, float/double or a
vector of them, with constants splatted to match and integer views of the same width.
KERNELS maps (name, "f32"|"f64") to a kernel `fn(o, *args)`; kernels that build on others
look them up there at emit time (`kernel(o, "exp")`), so the modules import only this one.
"""
from __future__ import annotations

from llvmlite import ir

F32 = ir.FloatType()
F64 = ir.DoubleType()
I32 = ir.IntType(32)
I64 = ir.IntType(64)


def type_suffix(ty: ir.Type) -> str:
    """f32, f64, v8f32, v4f64, ... (LLVM intrinsic and helper name suffix)."""
    if isinstance(ty, ir.VectorType):
        return f"v{ty.count}{type_suffix(ty.element)}"
    return "f64" if isinstance(ty, ir.DoubleType) else "f32"


# ---------------------------------------------------------------------------- builder helpers
class Ops:
    """Arithmetic on one float type (float, double, or a vector of either), constants splatted
    to match; integer ops act on the same-width integer view (i32 or i64 lanes: ity)."""

    def __init__(self, b: ir.IRBuilder, ty: ir.Type):
        self.b, self.ty = b, ty
        self.n = ty.count if isinstance(ty, ir.VectorType) else None
        elem = ty.element if self.n else ty
        self.is64 = isinstance(elem, ir.DoubleType)
        it = I64 if self.is64 else I32
        self.ity = it if self.n is None else ir.VectorType(it, self.n)
        self.mb, self.bias = (52, 1023) if self.is64 else (23, 127)   # mantissa bits, bias
        self.suffix = type_suffix(ty)

    def like(self, elem):
        """Ops for `elem` (a scalar type) at this width."""
        return Ops(self.b, elem if self.n is None else ir.VectorType(elem, self.n))

    # constants
    def f(self, v: float):
        return ir.Constant(self.ty, v if self.n is None else [v] * self.n)

    def i(self, v: int):
        return ir.Constant(self.ity, v if self.n is None else [v] * self.n)

    # float arithmetic (no fast-math flags: IEEE semantics, NaN/inf preserved)
    def add(self, a, c): return self.b.fadd(a, c)
    def sub(self, a, c): return self.b.fsub(a, c)
    def mul(self, a, c): return self.b.fmul(a, c)
    def div(self, a, c): return self.b.fdiv(a, c)
    def neg(self, a): return self.b.fneg(a)

    def _intrinsic(self, name, nargs):
        module = self.b.module
        full = f"{name}.{self.suffix}"
        fn = module.globals.get(full)
        if fn is None:
            fn = ir.Function(module, ir.FunctionType(self.ty, [self.ty] * nargs), full)
        return fn

    def fma(self, a, c, d):
        """a*c + d, fused where the target has FMA (llvm.fmuladd)."""
        return self.b.call(self._intrinsic("llvm.fmuladd", 3), [a, c, d])

    def _intrinsic_int(self, name, nargs):
        sfx = f"i{self.ity.element.width if self.n else self.ity.width}"
        full = f"{name}.{sfx if self.n is None else f'v{self.n}{sfx}'}"
        fn = self.b.module.globals.get(full)
        if fn is None:
            fn = ir.Function(self.b.module, ir.FunctionType(self.ity, [self.ity] * nargs), full)
        return fn

    def abs(self, a): return self.b.call(self._intrinsic("llvm.fabs", 1), [a])
    def copysign(self, mag, sgn): return self.b.call(self._intrinsic("llvm.copysign", 2), [mag, sgn])

    def horner(self, x, coeffs):
        """coeffs[0] + coeffs[1]*x + ...; each coefficient a float or a ready value."""
        cs = [self.f(c) if isinstance(c, float) else c for c in coeffs]
        acc = cs[-1]
        for c in reversed(cs[:-1]):
            acc = self.fma(acc, x, c)
        return acc

    def estrin(self, x, coeffs, exact_low: int = 0):
        """The polynomial of horner() in Estrin's scheme: pairs c[2i] + c[2i+1]*x, then
        pairs of those with x^2, x^4, ...: about log2(len) multiply-add latencies instead of
        len - 1 (a long Horner chain keeps one vector in flight per loop iteration when the
        loop body fills the out-of-order window; a few more multiplies).  exact_low: the
        lowest this many terms by Horner steps around the Estrin value of the rest (the
        last steps carry most of the rounding error)."""
        cs = [self.f(c) if isinstance(c, float) else c for c in coeffs]
        if exact_low >= len(cs) - 1:
            return self.horner(x, cs)
        if exact_low:
            return self.horner(x, cs[:exact_low] + [self.estrin(x, cs[exact_low:])])
        p = x
        while len(cs) > 1:
            nxt = [self.fma(cs[i + 1], p, cs[i]) for i in range(0, len(cs) - 1, 2)]
            if len(cs) % 2:
                nxt.append(cs[-1])
            cs = nxt
            if len(cs) > 1:
                p = self.mul(p, p)
        return cs[0]

    # compares: ordered (false on NaN) unless stated
    def lt(self, a, c): return self.b.fcmp_ordered("<", a, c)
    def gt(self, a, c): return self.b.fcmp_ordered(">", a, c)
    def eq(self, a, c): return self.b.fcmp_ordered("==", a, c)
    def ult(self, a, c): return self.b.fcmp_unordered("<", a, c)   # true on NaN
    def sel(self, cond, a, c): return self.b.select(cond, a, c)

    def clamp(self, x, lo, hi):
        """min(max(x, lo), hi) that keeps NaN (ordered compares, selects)."""
        x = self.sel(self.lt(x, self.f(lo)), self.f(lo), x)
        return self.sel(self.gt(x, self.f(hi)), self.f(hi), x)

    # bits
    def bits(self, x): return self.b.bitcast(x, self.ity)
    def flt(self, i): return self.b.bitcast(i, self.ty)
    def iadd(self, a, c): return self.b.add(a, c)
    def isub(self, a, c): return self.b.sub(a, c)
    def iand(self, a, c): return self.b.and_(a, c)
    def ixor(self, a, c): return self.b.xor(a, c)
    def shl(self, a, k): return self.b.shl(a, self.i(k))
    def ashr(self, a, k): return self.b.ashr(a, self.i(k))
    def itof(self, i): return self.b.sitofp(i, self.ty)
    def lshr(self, a, k): return self.b.lshr(a, self.i(k))
    def ior(self, a, c): return self.b.or_(a, c)
    def icmp(self, op, a, c): return self.b.icmp_signed(op, a, c)
    def isel(self, cond, a, c): return self.b.select(cond, a, c)

    def convert(self, v, other: "Ops"):
        """v (a value of `other`'s float type) converted to this float type."""
        wide = self.is64 and not other.is64
        if self.is64 == other.is64:
            return v
        return (self.b.fpext if wide else self.b.fptrunc)(v, self.ty)

    def pow2(self, n):
        """2.0**n for integer n in [1-bias, bias] (bias+1 gives inf), via the exponent field."""
        return self.flt(self.shl(self.iadd(n, self.i(self.bias)), self.mb))

    def ldexp(self, v, n):
        """v * 2**n for n in [-252, 254] as two exact-or-final multiplies (one rounding)."""
        n1 = self.ashr(n, 1)
        return self.mul(self.mul(v, self.pow2(n1)), self.pow2(self.isub(n, n1)))

    def split(self, x):
        """x = hi + lo with hi = x cut to 12 significant bits, so hi*hi is exact."""
        hi = self.flt(self.iand(self.bits(x), self.i(-4096)))   # 0xFFFFF000
        return hi, self.sub(x, hi)


KERNELS: dict = {}


def dtype_of(o: Ops) -> str:
    return "f64" if o.is64 else "f32"


def kernel(o: Ops, name: str):
    """The kernel registered for `name` at o's float type."""
    return KERNELS[(name, dtype_of(o))]


def two_sum(o, a, c):
    """a + c = s + e exactly (Knuth; no FMA needed)."""
    s = o.add(a, c)
    cc = o.sub(s, a)
    return s, o.add(o.sub(a, o.sub(s, cc)), o.sub(c, cc))


def log_specials(o, x, r):
    """log's IEEE cases over the polynomial result r: log(+inf) = +inf, log(+-0) = -inf,
    log(x < 0) = log(NaN) = NaN."""
    r = o.sel(o.eq(x, o.f(float("inf"))), x, r)
    r = o.sel(o.eq(x, o.f(0.0)), o.f(float("-inf")), r)
    return o.sel(o.ult(x, o.f(0.0)), o.f(float("nan")), r)   # x < 0 or NaN


def log1p_via(o, x, log):
    """log1p(x) = log(u) + (x - (u - 1)) / u with u = 1 + x rounded: the second term
    corrects u's rounding error (relative), dropped where u is 0 or inf; log1p(-0) = -0."""
    u = o.add(o.f(1.0), x)
    corr = o.div(o.sub(x, o.sub(u, o.f(1.0))), u)
    finite = o.b.and_(o.gt(u, o.f(0.0)), o.lt(u, o.f(float("inf"))))
    r = o.add(log(o, u), o.sel(finite, corr, o.f(0.0)))
    return o.sel(o.eq(x, o.f(0.0)), x, r)

"""Tracing: GraphScope and Tensor record a light trace of rlx ops (no IR, no xDSL).

`GraphScope` declares the function's inputs, params and constants;
`Tensor` is a traced value whose methods append rlx ops. NumPy broadcasting
is resolved here: binary ops broadcast both sides explicitly with
`rlx.broadcast_to`, and Python scalars become rank-0 constants broadcast the
same way (never an array of the result's size: constant folding later stores
them as one-value splats). Shape errors are raised at trace time and name the
op and the shapes (each op's shape function, dialect/shapes.py, runs as the op
is recorded). NumPy indexing (x[idx], masks, negative steps) is rlxc/indexing.py.

What is recorded is a `Trace` (dialect/trace.py): Func builds the rlx module
from it on first use, and its digest keys caches before any IR exists.
"""
from __future__ import annotations

import numbers

import numpy as np

from rlxc.dialect.shapes import (
    DTYPE_NAMES as DTYPES,
    FLOAT_DTYPES,
    INT_DTYPES,
    SHAPES,
    ShapeError,
    TType,
    check_u32,
    as_dims,
    as_int,
    broadcast_shapes,
    dense_bytes,
    normalize_axes,
    numel,
)
from rlxc.dialect import symdims as sd
from rlxc.dialect.trace import KINDS, Arg, Trace
from rlxc.runtime.errors import NameLookupError


def _np_dtype_name(a: np.ndarray, default_float="f32") -> str:
    k = a.dtype.kind
    if k == "b":
        return "i1"
    if k in "iu":
        return "i32" if a.dtype.itemsize <= 4 else "i64"
    if k == "f":
        return "f64" if (a.dtype == np.float64 and default_float == "f64") else "f32"
    raise TypeError(f"unsupported array dtype {a.dtype}")


class GraphScope:
    """Declares inputs, params and constants of a traced function, and records its ops."""

    def __init__(self):
        self.trace = Trace()
        self.args: list[Arg] = self.trace.args
        self._splats: dict = {}  # (value bytes, dtype, shape) -> Tensor: one per scalar use

    def _anonymous(self, name: str, shape) -> tuple:
        """The input's shape with each None an anonymous symbol named after the input and
        axis ("?x.0", shown as x.0); a named symbol may not take such a name."""
        shape = sd.user_dims(shape, f"input {name!r}", lambda axis: f"?{name}.{axis}")
        syms = {d for a in self.args for d in a.shape if isinstance(d, str)} | \
            {d for d in shape if isinstance(d, str)}
        for d in sorted(syms):
            if d.startswith("?") and d[1:] in syms:
                raise ValueError(f"input {name!r}: the dimension symbol {d[1:]!r} is also the "
                                 f"name of {sd.describe(d)}; choose another symbol name")
        return shape

    # -- leaves ----------------------------------------------------------
    def _arg(self, name: str, shape, dtype: str, kind: str) -> "Tensor":
        if not isinstance(name, str) or not name:
            raise ValueError(f"{kind} name must be a non-empty string, got {name!r}")
        if any(a.name == name for a in self.args):
            raise ValueError(f"duplicate name {name!r}: already declared as "
                             f"{next(a.kind for a in self.args if a.name == name)}")
        if dtype not in DTYPES:
            raise TypeError(f"{kind} {name!r}: unknown dtype {dtype!r}; valid: {', '.join(DTYPES)}")
        shape = self._anonymous(name, shape) if kind == "input" else _param_dims(shape, name)
        if any(not sd.is_sym(d) and d < 0 for d in shape):
            raise ShapeError(f"{kind} {name!r}: negative dimension in {shape}")
        _check_size(f"{kind} {name!r}", shape, dtype)
        return Tensor(self, self.trace.add_arg(Arg(name, kind, shape, dtype)))

    def input(self, name: str, shape, dtype: str = "f32") -> "Tensor":
        """A named runtime input of the given shape and dtype (f32, f64, i1, i32, i64, or
        u32 for the (2,) keys of rlxc.random).  A str in the shape is a dynamic dimension
        symbol (every input naming "B" shares one size, given per call); None is an
        anonymous one, named after the input and axis: "x.0" (shown so in errors and in
        an artifact's dimension names)."""
        return self._arg(name, shape, dtype, "input")

    def param(self, name: str, shape, dtype: str = "f32") -> "Tensor":
        """A named trainable parameter; bind data with Func.with_param / init_*."""
        if dtype not in FLOAT_DTYPES:
            raise TypeError(f"param {name!r}: params are float tensors, got {dtype!r}")
        return self._arg(name, shape, dtype, "param")

    def constant(self, array, dtype: str | None = None) -> "Tensor":
        """A dense constant (float arrays become f32 unless dtype says otherwise)."""
        a = np.asarray(array)
        dt = dtype or _np_dtype_name(a)
        return self._emit_const(a, dt)

    def scalar(self, x, dtype: str = "f32") -> "Tensor":
        """A rank-0 constant."""
        return self._emit_const(np.asarray(x), dtype)

    def _emit_const(self, a: np.ndarray, dtype: str) -> "Tensor":
        _check_dtype(dtype)
        data = dense_bytes(a, dtype)
        (v,) = self.trace.add("rlx.constant", [], {}, [TType(data[0], dtype)], data)
        return Tensor(self, v)

    def _splat(self, value, shape, dtype) -> "Tensor":
        """`value` everywhere in `shape`: a rank-0 constant and a broadcast_to (no array of
        the full size is ever built; constant folding makes it a splat stored once). Each
        (value, dtype) and (value, dtype, shape) is traced once: `x * 2.0` a thousand
        times shares them, so the graph does not grow by two ops per Python scalar."""
        _check_dtype(dtype)
        raw = dense_bytes(np.asarray(value), dtype)[2]
        shape = tuple(d if sd.is_sym(d) else int(d) for d in shape)
        t = self._splats.get((raw, dtype, shape))
        if t is None:
            c = self._splats.get((raw, dtype, ()))
            if c is None:
                c = self._splats[(raw, dtype, ())] = self._emit_const(np.asarray(value), dtype)
            t = self._splats[(raw, dtype, shape)] = c.broadcast_to(shape)
        return t

    def emit(self, op, operands, **params) -> "Tensor":
        """Record one rlx op (its name, like "rlx.pad", or its class) on `operands`."""
        name = op if isinstance(op, str) else op.name
        spec = SHAPES[name]
        check_u32(name, [t.dtype for t in operands])
        shape, dtype = spec.infer([t.value.type for t in operands], **params)
        _check_dtype(dtype)
        _check_size(name, shape, dtype)
        (v,) = self.trace.add(name, [t.value for t in operands], spec.canonical(params),
                              [TType(tuple(d if sd.is_sym(d) else int(d) for d in shape),
                                     dtype)])
        return Tensor(self, v)

    def call(self, fn, args) -> list["Tensor"]:
        """Inline a traced function (a Func or an rlx module) into this scope.

        `args` maps each of its argument names (inputs and params) to a Tensor
        of this scope (or an array, made a constant). Returns its outputs."""
        import hashlib

        from rlxc.dialect import module as M
        from rlxc.dialect.types import ttype

        mod = fn.module if hasattr(fn, "module") else fn
        # a Func's IR never changes, so its hash (which prints the module) is taken only
        # when the trace's digest asks for it (dialect/trace.py); a bare module may be
        # changed later, so it is hashed now
        ir = fn.ir_hash if hasattr(fn, "ir_hash") else \
            hashlib.sha256(M.to_text(mod).encode()).hexdigest()
        f = M.get_func(mod.clone())  # inlined as it is now, whatever later happens to `mod`
        sig = M.signature(f)
        missing = [a.name for a in sig if a.name not in args]
        extra = [k for k in args if k not in {a.name for a in sig}]
        if missing or extra:
            raise NameLookupError(f"call @{f.sym_name.data}: missing {missing}, unknown {extra}; "
                                  f"arguments: {[a.name for a in sig]}")
        operands, mapping = [], {}
        for a, v in zip(sig, f.args):
            t = args[a.name]
            if not isinstance(t, Tensor):
                t = self.constant(np.asarray(t), a.dtype)
            if t.shape != tuple(a.shape) or t.dtype != a.dtype:
                raise ShapeError(f"call @{f.sym_name.data}: argument {a.name!r} expects "
                                 f"{tuple(a.shape)} {a.dtype}, got {t.shape} {t.dtype}")
            operands.append(t.value)
            mapping[v] = t.value
        outs = M.outputs(f)
        new, seen = [], set()  # callee outputs computed by its body, not its arguments
        for o in outs:
            if o not in mapping and id(o) not in seen:
                seen.add(id(o))
                new.append(o)
        res = self.trace.add("call", operands, {}, [ttype(o) for o in new], (f, new, ir))
        mapping.update(zip(new, res))
        return [Tensor(self, mapping[o]) for o in outs]

    # -- conveniences mirroring Tensor methods ----------------------------
    @staticmethod
    def concat(tensors, axis: int = 0) -> "Tensor":
        return concat(tensors, axis)

    @staticmethod
    def where(cond, a, b) -> "Tensor":
        return where(cond, a, b)


class Tensor:
    """A traced value. Arithmetic broadcasts like NumPy; every rlx op has a method."""

    __array_priority__ = 1000  # so `ndarray + Tensor` reaches Tensor.__radd__

    def __init__(self, scope: GraphScope, value):
        self.scope = scope
        self.value = value

    # -- info ------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self.value.type.shape

    @property
    def dtype(self) -> str:
        return self.value.type.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        if sd.is_dynamic(self.shape):
            raise TypeError(f"size: {self.shape} has dynamic dimensions "
                            f"{sd.symbols(self.shape)}; its size is known per call")
        return numel(self.shape)

    def __repr__(self):
        return f"Tensor(shape={self.shape}, dtype={self.dtype})"

    def __bool__(self):
        raise TypeError("a traced Tensor has no truth value; use where()/select instead")

    # `==` and the other comparisons are elementwise (i1 masks, below), so a Tensor is
    # hashed by identity, as JAX tracers are: Tensors still work as dict keys and in sets.
    __hash__ = object.__hash__

    # -- operand coercion -------------------------------------------------
    def _lift(self, other, what: str) -> "Tensor":
        if isinstance(other, Tensor):
            if other.scope is not self.scope:
                raise ValueError(f"{what}: tensors come from different scopes")
            return other
        if isinstance(other, (numbers.Number, np.number, np.bool_, bool)):
            return None  # scalar: handled by the caller as a splat
        if isinstance(other, (np.ndarray, list, tuple)):
            a = np.asarray(other)
            # arrays adopt a float tensor's dtype; otherwise they keep their own
            dt = self.dtype if self.dtype in FLOAT_DTYPES else _np_dtype_name(a)
            return self.scope.constant(a, dt)
        raise TypeError(f"{what}: cannot combine a Tensor with {type(other).__name__}")

    def _pair(self, what: str, other, swap=False) -> tuple["Tensor", "Tensor"]:
        """(self, other) as two Tensors of one dtype and the broadcast shape (swapped when
        `other` was on the left); a Python scalar becomes a broadcast rank-0 constant."""
        o = self._lift(other, what)
        if o is None:
            if self.dtype == "i1" and not isinstance(other, (bool, np.bool_)):
                # a mask in arithmetic counts as 0/1 (NumPy): with a Python int as i32, with
                # a float as f32 (`mask + 1`, `mask * 0.5`)
                dt = "f32" if isinstance(other, (float, np.floating)) else "i32"
                return self.cast(dt)._pair(what, other, swap)
            o = self._scalar(other, what)
        elif "i1" in (o.dtype, self.dtype) and o.dtype != self.dtype:
            # a mask meets numbers: it counts as 0/1 of their dtype (x * (y == x), NumPy)
            if o.dtype == "i1":
                o = o.cast(self.dtype)
            else:
                return self.cast(o.dtype)._pair(what, o, swap)
        elif o.dtype != self.dtype:
            raise TypeError(f"{what}: dtypes differ: {self.dtype} vs {o.dtype}; use .cast()")
        a, b = (o, self) if swap else (self, o)
        shp = broadcast_shapes(a.shape, b.shape, what)
        return a.broadcast_to(shp), b.broadcast_to(shp)

    def _scalar(self, value, what: str) -> "Tensor":
        """A Python scalar as a splat of this tensor's dtype, or an error where that would
        change its value (NumPy 2 raises the same): a non-integer float with an integer
        tensor, an integer outside the dtype's range (never wrapped around), a number other
        than 0/1 with a mask."""
        dt = self.dtype
        if dt not in FLOAT_DTYPES:
            if not _whole(value):
                raise TypeError(f"{what}: float scalar {value} with {dt} tensor")
            _fits(value, dt, what)
        return self.scope._splat(value, self.shape, dt)

    def _binary(self, op: str, other, swap=False) -> "Tensor":
        a, b = self._pair(op, other, swap)
        if op == "rlx.sub" and a.dtype == "i1":
            raise TypeError("-: subtracting masks is not defined (NumPy); use ^ (xor) or "
                            "cast to an integer dtype")
        return self.scope.emit(op, [a, b])

    def _compare(self, op: str, other, swap=False) -> "Tensor":
        """Elementwise comparison -> i1 mask. An integer tensor against a non-integer
        number compares exactly in f64 (`arange(3) < 2.5`), as NumPy does."""
        x = self
        if isinstance(other, (numbers.Real, np.number)) and \
                not isinstance(other, (bool, np.bool_)):
            if x.dtype == "i1":
                x = x.cast("i32")   # a mask against a number counts as 0/1 (NumPy)
            if x.dtype not in FLOAT_DTYPES:
                if not _whole(other):
                    x = x.cast("f64")   # 2.5, inf, NaN: exactly in f64
                else:
                    lo, hi = _int_limits(x.dtype)
                    v = int(other)
                    if not lo <= v <= hi:
                        # beyond the dtype's range every element compares alike (NumPy 2):
                        # the answer for its nearest bound, never the wrapped-around number
                        r = hi if v > hi else lo
                        a, b = (v, r) if swap else (r, v)
                        res = {"rlx.eq": a == b, "rlx.ne": a != b, "rlx.lt": a < b,
                               "rlx.le": a <= b, "rlx.gt": a > b, "rlx.ge": a >= b}[op]
                        return self.scope._splat(res, self.shape, "i1")
        return x._binary(op, other, swap)

    def __add__(self, o): return self._binary("rlx.add", o)
    def __radd__(self, o): return self._binary("rlx.add", o, swap=True)
    def __sub__(self, o): return self._binary("rlx.sub", o)
    def __rsub__(self, o): return self._binary("rlx.sub", o, swap=True)
    def __mul__(self, o): return self._binary("rlx.mul", o)
    def __rmul__(self, o): return self._binary("rlx.mul", o, swap=True)
    def __truediv__(self, o): return self._true_div(o, False)
    def __rtruediv__(self, o): return self._true_div(o, True)

    def _true_div(self, o, swap: bool) -> "Tensor":
        """`/` as NumPy's true division: integers and masks divide as f64 (`i32 / 2` is
        0.5 at 1, never the truncated 0; rlx.div on integers truncates, for `//`), or as
        the float Tensor on the other side (`mask / x`, `x.sum() / mask.sum()`)."""
        x = self
        numeric = INT_DTYPES + ("i1",)
        if isinstance(o, Tensor) and o.dtype in FLOAT_DTYPES and x.dtype in numeric:
            x = x.cast(o.dtype)                  # int or mask / float: the float's type
        elif x.dtype in numeric:
            x = x.cast("f64")
            if isinstance(o, Tensor) and o.dtype in numeric:
                o = o.cast("f64")
        elif isinstance(o, Tensor) and o.dtype in numeric:
            o = o.cast(x.dtype)                  # float / int or mask
        return x._binary("rlx.div", o, swap)

    def __pow__(self, o):
        if self.dtype == "i1":
            return self.cast("i32") ** o   # a mask counts as 0/1 (mask ** 2 is not a mask)
        if isinstance(o, numbers.Number) and o == 2:
            return self * self  # exact, cheaper, and differentiable at 0
        if self.dtype in INT_DTYPES and isinstance(o, (numbers.Integral, np.integer)) and o < 0:
            raise ValueError(f"**: integers to negative integer powers ({o}) are not allowed "
                             "(NumPy); cast to a float dtype")
        return self._binary("rlx.pow", o)

    def __rpow__(self, o): return self._binary("rlx.pow", o, swap=True)
    def __neg__(self): return self.neg()
    def __matmul__(self, o): return self.matmul(o)

    def __rmatmul__(self, o):
        return self._lift(o, "rlx.matmul").matmul(self)

    def maximum(self, o): return self._binary("rlx.maximum", o)
    def minimum(self, o): return self._binary("rlx.minimum", o)
    def pow(self, o): return self._binary("rlx.pow", o)

    # comparisons -> i1 masks; the operators are elementwise, as in NumPy and JAX
    def eq(self, o): return self._compare("rlx.eq", o)
    def ne(self, o): return self._compare("rlx.ne", o)
    def lt(self, o): return self._compare("rlx.lt", o)
    def le(self, o): return self._compare("rlx.le", o)
    def gt(self, o): return self._compare("rlx.gt", o)
    def ge(self, o): return self._compare("rlx.ge", o)

    def __eq__(self, o):
        return self.eq(o) if _comparable(o) else NotImplemented

    def __ne__(self, o):
        return self.ne(o) if _comparable(o) else NotImplemented

    def __lt__(self, o): return self.lt(o)
    def __le__(self, o): return self.le(o)
    def __gt__(self, o): return self.gt(o)
    def __ge__(self, o): return self.ge(o)

    # i1 masks: & | ^ ~ (logical; integer tensors have no bitwise ops)
    def _logic(self, op, o, what):
        if self.dtype != "i1":
            raise TypeError(f"{what}: needs i1 masks (from comparisons), got {self.dtype}")
        return self._binary(op, _truth(o, what))

    def __and__(self, o): return self._logic("rlx.mul", o, "&")
    def __rand__(self, o): return self._logic("rlx.mul", o, "&")
    def __or__(self, o):
        if self.dtype != "i1":
            raise TypeError(f"|: needs i1 masks (from comparisons), got {self.dtype}")
        a, b = self._pair("|", _truth(o, "|"))
        return ~(~a & ~b)  # and/not only: every backend has them on i1

    def __ror__(self, o): return self | o
    def __xor__(self, o): return self._logic("rlx.ne", o, "^")
    def __rxor__(self, o): return self._logic("rlx.ne", o, "^")

    def __invert__(self):
        return self._logic("rlx.eq", False, "~")

    # -- remainder, floor division, rounding -----------------------------------
    def fmod(self, o) -> "Tensor":
        """C fmod: the remainder of truncated division, with the sign of `self`."""
        self._no_bool("fmod")
        return self._binary("rlx.rem", o)

    def _divmod(self, other, swap, what):
        """NumPy's divmod (npy_divmod): remainder with the sign of the divisor and the
        floor quotient, from the truncated remainder m = fmod(a, b)."""
        if self.dtype == "i1":
            return self.cast("i32")._divmod(other, swap, what)   # a mask counts as 0/1
        a, b = self._pair(what, other, swap)
        m = a.scope.emit("rlx.rem", [a, b])
        fix = (m != 0) & ((m < 0) != (b < 0))  # m and b of opposite signs
        mod = where(fix, m + b, m)
        if a.dtype in FLOAT_DTYPES:
            q = (a - m) / b  # an integer up to rounding, which the next lines undo as NumPy
            q = where(fix, q - 1.0, q)
            fl = q.floor()
            fl = where((q - fl) > 0.5, fl + 1.0, fl)
            div = where(b == 0.0, a / b, fl)  # x // 0 is inf or NaN, like a / 0
        else:
            # integer: b == 0 gives 0 and MIN // -1 wraps to MIN (NumPy). The quotient of
            # the exact multiple a - m: f64 division (`/` on integers) is off by at most
            # ~2**11 beyond 2**53; the residual (a - m) - q0 * b is then small and exact
            # (wrapping arithmetic) and one more division of it corrects q0 exactly
            bs = where((b == 0) | (b == -1), 1, b)
            q0 = a.scope.emit("rlx.div", [a - m, bs])          # truncating integer division
            q = q0 + a.scope.emit("rlx.div", [(a - m) - q0 * bs, bs])
            q = where(fix, q - 1, q)
            div = where(b == 0, 0, where(b == -1, 0 - a, q))
        return div.stop_gradient(), mod

    def __mod__(self, o): return self._divmod(o, False, "%")[1]
    def __rmod__(self, o): return self._divmod(o, True, "%")[1]
    def __floordiv__(self, o): return self._divmod(o, False, "//")[0]
    def __rfloordiv__(self, o): return self._divmod(o, True, "//")[0]
    def __divmod__(self, o): return self._divmod(o, False, "divmod")
    def __rdivmod__(self, o): return self._divmod(o, True, "divmod")
    def remainder(self, o): return self % o
    def floor_divide(self, o): return self // o

    def _no_bool(self, what):
        if self.dtype == "i1":
            raise TypeError(f"{what}: not defined on i1 masks; cast to an integer or float")

    def _rounding(self, name):
        self._no_bool(name)
        return self if self.dtype not in FLOAT_DTYPES else self._unary(name)

    def floor(self): return self._rounding("floor")
    def ceil(self): return self._rounding("ceil")

    def round(self, decimals: int = 0) -> "Tensor":
        """Round half to even, as np.round: `decimals` digits (scaled by 10**decimals)."""
        if decimals == 0 or self.dtype not in FLOAT_DTYPES:
            if self.dtype in INT_DTYPES and decimals < 0:   # NumPy: to tens, hundreds, ...
                f = 10.0 ** -int(decimals)                    # halves to even, via f64
                return ((self.cast("f64") / f)._rounding("round") * f).cast(self.dtype)
            return self._rounding("round")
        f = 10.0 ** abs(int(decimals))
        if decimals > 0:
            return (self * f)._rounding("round") / f
        return (self / f)._rounding("round") * f

    def __round__(self, ndigits=None):
        return self.round(ndigits or 0)

    def __floor__(self): return self.floor()
    def __ceil__(self): return self.ceil()

    def clip(self, lo=None, hi=None) -> "Tensor":
        """min(max(x, lo), hi), as np.clip (either bound may be None; NaN propagates)."""
        if lo is None and hi is None:
            raise ValueError("clip: give lo, hi or both")
        r = self if lo is None else self.maximum(lo)
        return r if hi is None else r.minimum(hi)

    def where(self, a, b) -> "Tensor":
        """`self` is an i1 mask: a where true, b where false."""
        return where(self, a, b)

    # -- unary -------------------------------------------------------------
    def _unary(self, name: str) -> "Tensor":
        return self.scope.emit(f"rlx.{name}", [self])

    def exp(self): return self._unary("exp")
    def log(self): return self._unary("log")
    def sqrt(self): return self._unary("sqrt")
    def rsqrt(self): return self._unary("rsqrt")
    def tanh(self): return self._unary("tanh")
    def sigmoid(self): return self._unary("sigmoid")
    def relu(self): return self._unary("relu")

    def gelu(self, approximate: str = "none"):
        """GELU; approximate="tanh" selects the tanh form."""
        if approximate not in ("none", "tanh"):
            raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
        return self._unary("gelu" if approximate == "none" else "gelu_tanh")

    def gelu_tanh(self): return self._unary("gelu_tanh")
    def silu(self): return self._unary("silu")
    def softplus(self): return self._unary("softplus")
    def abs(self):
        if self.dtype in INT_DTYPES:     # integers (NumPy; abs(MIN) wraps to MIN)
            return where(self < 0, 0 - self, self)
        return self._unary("abs")

    def __abs__(self): return self.abs()
    def sin(self): return self._unary("sin")
    def cos(self): return self._unary("cos")
    def sign(self):
        if self.dtype in INT_DTYPES:
            return (self > 0).cast(self.dtype) - (self < 0).cast(self.dtype)
        return self._unary("sign")
    def reciprocal(self): return self._unary("reciprocal")
    def erf(self): return self._unary("erf")
    def neg(self):
        return 0 - self if self.dtype in INT_DTYPES else self._unary("neg")
    def stop_gradient(self): return self._unary("stop_gradient")

    def fake_quant(self, fmt) -> "Tensor":
        """Round to a low-precision format (name like 'f8e4m3' or (e, m, max)); STE gradient."""
        from rlxc.lowp import parse_format

        spec = parse_format(fmt) if isinstance(fmt, str) else tuple(fmt)
        if spec is None:
            raise ValueError(f"fake_quant: unknown format {fmt!r}")
        e, m, mx = spec
        return self.scope.emit("rlx.fake_quant", [self], exp_bits=e, man_bits=m, max_normal=mx)

    # -- reductions --------------------------------------------------------
    def _reduce(self, name, axes, keepdims):
        ax = normalize_axes(axes, self.ndim, name)
        return self.scope.emit(f"rlx.{name}", [self], axes=ax, keepdims=bool(keepdims))

    def _counts(self) -> "Tensor":
        return self.cast("i32") if self.dtype == "i1" else self

    # NumPy's dtypes: a mask's sum/prod count in i32 (its max/min stay masks), the mean of
    # integers is f64; a mask's mean (a fraction: accuracy) is f32, the default float
    def sum(self, axes=None, keepdims=False): return self._counts()._reduce("sum", axes, keepdims)

    def mean(self, axes=None, keepdims=False):
        x = self if self.dtype in FLOAT_DTYPES else self.cast("f32" if self.dtype == "i1"
                                                              else "f64")
        return x._reduce("mean", axes, keepdims)

    def max(self, axes=None, keepdims=False): return self._reduce("max", axes, keepdims)
    def min(self, axes=None, keepdims=False): return self._reduce("min", axes, keepdims)
    def prod(self, axes=None, keepdims=False):
        return self._counts()._reduce("prod", axes, keepdims)

    # -- linear algebra ----------------------------------------------------
    def matmul(self, other) -> "Tensor":
        """NumPy matmul: vectors are promoted to matrices and the added dim removed."""
        o = self._lift(other, "rlx.matmul")
        if o is None:
            raise TypeError("matmul: operand must be a tensor or array, not a scalar")
        a, b = self, o
        if a.ndim == 0 or b.ndim == 0:
            raise ShapeError(f"matmul: {a.shape} @ {b.shape}: scalars are not allowed")
        va, vb = a.ndim == 1, b.ndim == 1
        if va:
            a = a.reshape(1, a.shape[0])
        if vb:
            b = b.reshape(b.shape[0], 1)
        if a.shape[-1] != b.shape[-2]:
            raise ShapeError(f"matmul: {self.shape} @ {o.shape}: inner dimensions "
                             f"{a.shape[-1]} != {b.shape[-2]}")
        r = self.scope.emit("rlx.matmul", [a, b])
        if va or vb:
            shp = r.shape[:-2] + ((r.shape[-2],) if not va else ()) + \
                ((r.shape[-1],) if not vb else ())
            r = r.reshape(*shp) if shp else r.reshape(())
        return r

    def linear(self, w, b=None) -> "Tensor":
        """x @ w (+ b), with w laid out (in_features, out_features)."""
        y = self.matmul(w)
        return y + b if b is not None else y

    # -- shape -------------------------------------------------------------
    def reshape(self, *shape) -> "Tensor":
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape = _dims(shape, "reshape")
        if sd.is_dynamic(self.shape) or sd.is_dynamic(shape):
            shape = sd.reshape_target(self.shape, shape)
            return self if shape == self.shape else \
                self.scope.emit("rlx.reshape", [self], shape=shape)
        if shape.count(-1) > 1:
            raise ShapeError(f"reshape: at most one -1 in {shape}")
        if -1 in shape:
            rest = numel(d for d in shape if d != -1)
            if rest == 0 or self.size % rest:
                raise ShapeError(f"reshape: cannot reshape {self.shape} to {shape}")
            shape = tuple(self.size // rest if d == -1 else d for d in shape)
        if numel(shape) != self.size or any(d < 0 for d in shape):
            raise ShapeError(f"reshape: cannot reshape {self.shape} to {shape}")
        if shape == self.shape:
            return self
        return self.scope.emit("rlx.reshape", [self], shape=shape)

    def flatten(self) -> "Tensor":
        return self.reshape(-1)

    def expand_dims(self, axis: int) -> "Tensor":
        axis = as_int(axis, "expand_dims", "axis")
        r = self.ndim + 1
        if not -r <= axis < r:
            raise ShapeError(f"expand_dims: axis {axis} out of range for rank {self.ndim}")
        axis %= r
        return self.reshape(self.shape[:axis] + (1,) + self.shape[axis:])

    def squeeze(self, axes=None) -> "Tensor":
        if axes is None:
            ax = tuple(i for i, d in enumerate(self.shape) if d == 1)
        else:
            ax = normalize_axes(axes, self.ndim, "squeeze")
        for a in ax:
            if self.shape[a] != 1:
                raise ShapeError(f"squeeze: dim {a} of {self.shape} is not 1")
        return self.reshape(tuple(d for i, d in enumerate(self.shape) if i not in ax))

    def transpose(self, *perm) -> "Tensor":
        if len(perm) == 1 and isinstance(perm[0], (tuple, list)):
            perm = tuple(perm[0])
        if not perm:
            perm = tuple(reversed(range(self.ndim)))
        perm = tuple(as_int(p, "transpose", "axis") for p in perm)
        if any(not -self.ndim <= p < self.ndim for p in perm):  # NumPy's AxisError
            raise ShapeError(f"transpose: axes {perm} out of range for rank {self.ndim}")
        perm = tuple(p % self.ndim for p in perm)
        if perm == tuple(range(self.ndim)):
            return self
        return self.scope.emit("rlx.transpose", [self], perm=perm)

    @property
    def T(self) -> "Tensor":
        return self.transpose()

    def broadcast_to(self, shape) -> "Tensor":
        shape = _dims(shape, "broadcast_to")
        if shape == self.shape:
            return self
        return self.scope.emit("rlx.broadcast_to", [self], shape=shape)

    def slice(self, starts, limits, strides=None) -> "Tensor":
        strides = tuple(strides) if strides is not None else (1,) * self.ndim
        return self.scope.emit("rlx.slice", [self], starts=tuple(starts), limits=tuple(limits),
                               strides=strides)

    def narrow(self, axis: int, start: int, length: int) -> "Tensor":
        axis = normalize_axes(axis, self.ndim, "narrow")[0]
        start, length = as_int(start, "narrow", "start"), as_int(length, "narrow", "length")
        starts = [0] * self.ndim
        limits = list(self.shape)
        starts[axis], limits[axis] = start, start + length
        return self.slice(starts, limits)

    def __getitem__(self, key) -> "Tensor":
        """NumPy indexing: ints, slices (any step), None, ..., integer arrays, lists or
        Tensors (negative entries count from the end), static bool masks (rlxc/indexing.py)."""
        from rlxc.indexing import getitem

        return getitem(self, key)

    def take(self, indices, axis: int = 0) -> "Tensor":
        """np.take: slices along `axis` at `indices`; negative indices count from the end."""
        from rlxc.indexing import take

        return take(self, indices, axis)

    def flip(self, axis=None) -> "Tensor":
        """np.flip: reverse the elements along `axis` (every axis when None)."""
        from rlxc.indexing import flip

        return flip(self, axis)

    def gather(self, indices, axis: int = 0) -> "Tensor":
        """Take slices along `axis` at integer `indices` in [0, n) (embedding lookup when
        axis=0): the rlx.gather op itself. x[idx] and take() also accept negative indices."""
        if not isinstance(indices, Tensor):
            indices = self.scope.constant(np.asarray(indices))
        if indices.dtype not in INT_DTYPES:
            raise TypeError(f"gather: indices must be i32 or i64, got {indices.dtype}")
        axis = normalize_axes(axis, self.ndim, "gather")[0]
        return self.gather_raw(indices, axis)

    def gather_raw(self, indices: "Tensor", axis: int, label: str = "") -> "Tensor":
        """rlx.gather with an optional label that index errors quote (the user's indexing)."""
        return self.scope.emit("rlx.gather", [self, indices], axis=axis, label=label)

    def index_select(self, axis: int, indices) -> "Tensor":
        return self.gather(indices, axis)

    def cast(self, dtype: str) -> "Tensor":
        if dtype not in DTYPES:
            raise TypeError(f"cast: unknown dtype {dtype!r}; valid: {', '.join(DTYPES)}")
        if dtype == self.dtype:
            return self
        if dtype == "u32" and self.dtype not in INT_DTYPES:
            raise TypeError(f"cast: only i32/i64 tensors cast to u32 (the key dtype), "
                            f"got {self.dtype}")
        (v,) = self.scope.trace.add("rlx.cast", [self.value], {"dtype": dtype},
                                    [TType(self.shape, dtype)])
        return Tensor(self.scope, v)

    # -- composites ----------------------------------------------------------
    def logsumexp(self, axis=-1, keepdims=False) -> "Tensor":
        """log(sum(exp(x))) shifted by the row max m; a non-finite m shifts by 0 instead
        (JAX's rule), so a row holding +inf gives +inf and an all -inf row -inf, not the
        NaN of inf - inf. Rows that are finite, or hold some -inf, keep finite gradients."""
        self._nonempty(axis, "logsumexp")
        m = self.max(axis, keepdims=True).stop_gradient()
        m = where(m.abs() < float("inf"), m, 0.0)
        r = (self - m).exp().sum(axis, keepdims=True).log() + m
        return r if keepdims else r.squeeze(normalize_axes(axis, self.ndim, "logsumexp"))

    def _nonempty(self, axis, what: str) -> None:
        """The error for a row op over an empty axis names the op called, not its max."""
        for a in normalize_axes(axis, self.ndim, what):
            if self.shape[a] == 0:
                raise ShapeError(f"{what}: axis {a} of {self.shape} is empty")

    def log_softmax(self, axis=-1) -> "Tensor":
        self._nonempty(axis, "log_softmax")
        return self - self.logsumexp(axis, keepdims=True)

    def softmax(self, axis=-1) -> "Tensor":
        self._nonempty(axis, "softmax")
        m = self.max(axis, keepdims=True).stop_gradient()
        e = (self - m).exp()
        return e / e.sum(axis, keepdims=True)

    def layer_norm(self, axes=-1, eps: float = 1e-5, weight=None, bias=None) -> "Tensor":
        mu = self.mean(axes, keepdims=True)
        xc = self - mu
        var = (xc * xc).mean(axes, keepdims=True)
        y = xc * (var + eps).rsqrt()
        if weight is not None:
            y = y * weight
        if bias is not None:
            y = y + bias
        return y

    def rms_norm(self, axes=-1, eps: float = 1e-6, weight=None) -> "Tensor":
        y = self * ((self * self).mean(axes, keepdims=True) + eps).rsqrt()
        return y * weight if weight is not None else y

    def cross_entropy(self, targets) -> "Tensor":
        """Softmax cross-entropy of these logits, averaged over the batch.

        `targets` is either one-hot/probabilities of the logits' shape, or
        integer class labels of shape logits.shape[:-1]; a label outside
        [0, classes) raises IndexError when the function runs."""
        if not isinstance(targets, Tensor):
            targets = self.scope.constant(np.asarray(targets))
        if targets.dtype in INT_DTYPES:
            if targets.shape != self.shape[:-1]:
                raise ShapeError(f"cross_entropy: labels {targets.shape} do not match "
                                 f"logits {self.shape} without the class axis")
            classes = self.scope.constant(np.arange(self.shape[-1], dtype=np.int64),
                                          targets.dtype)
            # classes[labels] is the labels themselves, but a gather checks its indices:
            # a label outside [0, classes) raises IndexError at run time instead of
            # adding 0 loss and 0 gradient while still counting in the mean
            # (the message names the label and its row: runtime/cpu.py reads it back)
            targets = classes.gather_raw(targets, 0, "cross_entropy labels") \
                .expand_dims(-1).eq(classes).cast(self.dtype)
        elif targets.shape != self.shape:
            raise ShapeError(f"cross_entropy: targets {targets.shape} vs logits {self.shape}")
        nll = -(targets * self.log_softmax(-1)).sum(-1)
        return nll.mean()

    def mse(self, target) -> "Tensor":
        d = self - target
        return (d * d).mean()

    # -- indexing ops and randomness (rlxc/indexops.py, rlxc/random.py) ------
    def argmax(self, axis=None, keepdims=False) -> "Tensor":
        """i32 index of the largest element along `axis`; first on ties, NaN wins (NumPy)."""
        from rlxc.indexops import argmax
        return argmax(self, axis, keepdims)

    def argmin(self, axis=None, keepdims=False) -> "Tensor":
        """i32 index of the smallest element along `axis`; first on ties, NaN wins (NumPy)."""
        from rlxc.indexops import argmin
        return argmin(self, axis, keepdims)

    def cumsum(self, axis=None) -> "Tensor":
        """Inclusive running sum along `axis` (np.cumsum / torch.cumsum)."""
        from rlxc.indexops import cumsum
        return cumsum(self, axis)

    def topk(self, k, axis=-1) -> tuple["Tensor", "Tensor"]:
        """(values, i32 indices) of the k largest along `axis`, descending (torch.topk)."""
        from rlxc.indexops import topk
        return topk(self, k, axis)

    def dropout(self, p, key, stream=0) -> "Tensor":
        """Inverted dropout with a u32 key of shape (2,): rlxc.random.dropout."""
        from rlxc.random import dropout
        return dropout(self, p, key, stream)

    def one_hot(self, n, dtype="f32") -> "Tensor":
        """One-hot rows of length n for an integer tensor (jax.nn.one_hot)."""
        from rlxc.indexops import one_hot
        return one_hot(self, n, dtype)


def _as_tensor(x, like: Tensor, what: str) -> Tensor:
    t = like._lift(x, what)
    if t is not None:
        return t
    return like._scalar(_truth(x, what) if like.dtype == "i1" else x, what)


def _whole(value) -> bool:
    """A Python/NumPy integer, or a float with an integer value (2.0; not 2.5, inf, NaN)."""
    return isinstance(value, (numbers.Integral, np.integer)) or float(value).is_integer()


def _fits(value, dtype: str, what: str) -> None:
    """OverflowError unless the integer `value` is in `dtype`'s range (never wrapped)."""
    lo, hi = _int_limits(dtype)
    if not lo <= int(value) <= hi:
        raise OverflowError(f"{what}: Python integer {int(value)} out of bounds for {dtype} "
                            f"({lo} .. {hi})")


def _int_limits(dtype: str) -> tuple[int, int]:
    """The range of an integer dtype (i1: a mask, 0 .. 1)."""
    if dtype == "i1":
        return 0, 1
    i = np.iinfo(np.dtype({"i32": np.int32, "i64": np.int64, "u32": np.uint32}[dtype]))
    return int(i.min), int(i.max)


def _truth(o, what: str):
    """A mask's operand: a Tensor, or a scalar that is a truth value (bool, 0 or 1)."""
    if isinstance(o, (numbers.Number, np.number)) and not isinstance(o, (bool, np.bool_)):
        if o not in (0, 1):
            raise TypeError(f"{what}: a mask combines with masks or True/False, not {o!r}")
        return bool(o)
    return o


def where(cond: Tensor, a, b) -> Tensor:
    """Elementwise select with NumPy broadcasting of all three operands."""
    if not isinstance(cond, Tensor) or cond.dtype != "i1":
        raise TypeError("where: the condition must be an i1 mask Tensor (from lt/gt/eq/...)")
    ref = a if isinstance(a, Tensor) else b if isinstance(b, Tensor) else None
    if any(isinstance(t, Tensor) and t.scope is not cond.scope for t in (a, b)):
        raise ValueError("where: the condition and a branch are Tensors of another traced "
                         "function (another GraphScope)")
    if ref is None:
        dt = _pair_dtype(a, b)
        a = cond.scope._splat(a, cond.shape, dt)
        b = cond.scope._splat(b, cond.shape, dt)
    else:
        a, b = _as_tensor(a, ref, "rlx.select"), _as_tensor(b, ref, "rlx.select")
    if a.dtype != b.dtype:
        raise TypeError(f"where: branch dtypes differ: {a.dtype} vs {b.dtype}")
    shp = broadcast_shapes(broadcast_shapes(cond.shape, a.shape, "select"), b.shape, "select")
    return cond.scope.emit("rlx.select", [cond.broadcast_to(shp), a.broadcast_to(shp),
                                        b.broadcast_to(shp)])


def _pair_dtype(a, b) -> str:
    """where()'s dtype for two Python scalars: NumPy's kind at rlxc's default width (two
    bools: a mask; ints, or an int and a bool: i32; any float: f32)."""
    for v in (a, b):
        if not isinstance(v, (numbers.Real, np.number, np.bool_)):
            raise TypeError(f"where: a branch must be a Tensor or a real number, got "
                            f"{type(v).__name__}")
    if all(isinstance(v, (bool, np.bool_)) for v in (a, b)):
        return "i1"
    if not all(isinstance(v, (numbers.Integral, np.integer, np.bool_)) for v in (a, b)):
        return "f32"
    for v in (a, b):
        _fits(v, "i32", "where")
    return "i32"


def concat(tensors, axis: int = 0) -> Tensor:
    tensors = list(tensors)
    if not tensors or not all(isinstance(t, Tensor) for t in tensors):
        raise TypeError("concat: needs a non-empty list of Tensors")
    axis = normalize_axes(axis, tensors[0].ndim, "concat")[0]
    return tensors[0].scope.emit("rlx.concat", tensors, axis=axis)


def _comparable(o) -> bool:
    """What `==` / `!=` compare elementwise; anything else falls back to Python's identity."""
    return isinstance(o, (Tensor, numbers.Number, np.number, np.bool_, np.ndarray, list, tuple))


MAX_BYTES = 2 ** 63 - 1  # byte sizes are signed 64-bit in the lowering and the runtime


def _dims(shape, what: str) -> tuple:
    """A shape argument of reshape/broadcast_to: ints and symbol names (not None)."""
    dims = tuple(shape) if hasattr(shape, "__iter__") and not isinstance(shape, str) else (shape,)
    if not any(isinstance(d, str) for d in dims):
        return as_dims(dims, what)
    return sd.user_dims(dims, what, anon_ok=True)


def _param_dims(shape, name: str) -> tuple:
    """A param's shape: static only (params are bound arrays of one size)."""
    dims = tuple(shape) if hasattr(shape, "__iter__") and not isinstance(shape, str) else (shape,)
    if any(d is None or isinstance(d, str) for d in dims):
        raise ShapeError(f"param {name!r}: shape {dims} has a dynamic dimension; params "
                         "are static (use a symbol on an input)")
    return as_dims(dims, f"param {name!r}")


def _check_size(what: str, shape, dtype: str) -> None:
    """An impossible tensor size fails here, naming the op (not deep in NumPy or LLVM)."""
    n = sd.static_numel(shape) * (1 if dtype == "i1" else int(dtype[1:]) // 8)
    if n > MAX_BYTES:
        raise ShapeError(f"{what}: a tensor of shape {tuple(shape)} {dtype} would hold {n} "
                         f"bytes, more than any address space (2**63)")


def _check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise TypeError(f"unknown dtype {dtype!r}; valid: {', '.join(DTYPES)}")


# NumPy's spellings of elementwise ops whose rlx name is the C/JAX one (x.arctan() is x.atan()).
NUMPY_ALIASES = {"arcsin": "asin", "arccos": "acos", "arctan": "atan", "arctan2": "atan2",
                 "arcsinh": "asinh", "arccosh": "acosh", "arctanh": "atanh"}


def _derive_elementwise_methods() -> None:
    """Every unary and binary elementwise op of the dialect (dialect/shapes.py UNARY,
    BINARY) is a Tensor method of the same name unless one is written above, so adding
    an op needs no line here; NUMPY_ALIASES add NumPy's names."""
    from rlxc.dialect.shapes import BINARY, UNARY

    def unary(name, doc):
        def m(self):
            return self._unary(name)
        m.__name__, m.__doc__ = name, f"Elementwise {doc}."
        return m

    def binary(name, doc):
        def m(self, other):
            return self._binary(f"rlx.{name}", other)
        m.__name__, m.__doc__ = name, f"Elementwise {doc} (NumPy broadcasting)."
        return m

    for name, doc in UNARY.items():
        if not hasattr(Tensor, name):
            setattr(Tensor, name, unary(name, doc))
    for name, doc in BINARY.items():
        if not hasattr(Tensor, name):
            setattr(Tensor, name, binary(name, doc))
    for alias, name in NUMPY_ALIASES.items():
        if hasattr(Tensor, name) and not hasattr(Tensor, alias):
            setattr(Tensor, alias, getattr(Tensor, name))


_derive_elementwise_methods()

from rlxc.conv import install as _install_conv  # noqa: E402  (conv/pool methods, rlxc/conv.py)

_install_conv(Tensor)

__all__ = ["GraphScope", "Tensor", "where", "concat", "KINDS", "NUMPY_ALIASES"]

"""Reference interpreter: evaluates an rlx module with NumPy, op by op.

This is the semantic definition of every op and the oracle for every backend
and transform. `EVAL_RULES` maps an op name to `rule(inputs, **params) -> array`.
f32 tensors are computed in float32 or, on request, in float64 for gradient
checks; f64 tensors always in float64; NaN and inf propagate as IEEE says.
The edge cases NumPy leaves undefined or decides differently follow the rules
written once in lowering/shared/scalar.py (its header): float -> int casts
truncate and saturate (NaN -> 0); integer division truncates and saturates,
x / 0 = 0; integer pow is exact and wraps (a negative exponent: 1 / x ** -y truncated);
maximum/minimum order
-0 < +0; sign keeps +-0.
"""
from __future__ import annotations

import math

import numpy as np
from xdsl.dialects import func

from .attention import attention_ref
from .module import get_func, outputs  # noqa: F401
from .ops import OPS, RlxOp
from .philox import philox_uniform
from .symdims import bind_sizes, resolve_value
from .types import NP_DTYPES, dense_value, dtype_of, shape_of

_erf = np.vectorize(math.erf, otypes=[np.float64])


def erf(x):
    return _erf(x).astype(x.dtype) if x.size else x.copy()


def sigmoid(x):
    """Stable logistic: never exponentiates a positive number."""
    e = np.exp(-np.abs(x))
    pos = 1 / (1 + e)
    return np.asarray(np.where(x >= 0, pos, e * pos), dtype=x.dtype)


def _gelu_tanh(x):
    c = x.dtype.type(math.sqrt(2 / math.pi))
    return 0.5 * x * (1 + np.tanh(c * (x + x.dtype.type(0.044715) * x ** 3)))


def _gating(f):
    """x * gate(x) ops (gelu, gelu_tanh, silu) at x = -inf: their limit -0, as the compiled
    kernels give it (lowering/shared/mathlib.py), not the NaN of -inf * 0."""
    def g(x):
        with np.errstate(invalid="ignore"):
            y = f(x)
        return np.asarray(np.where(x == -np.inf, x.dtype.type(-0.0), y), dtype=x.dtype)
    return g


def _fake_quant(x, exp_bits, man_bits, max_normal):
    from rlxc.lowp import quantize  # the one definition of the rounding

    return quantize(x, exp_bits, man_bits, max_normal).astype(x.dtype)


def float_to_int(x, dtype):
    """Cast float array x to integer dtype: truncate toward zero, saturate, NaN -> 0."""
    info = np.iinfo(dtype)
    x = np.asarray(x, dtype=np.float64)
    t = np.where(np.isnan(x), 0.0, np.trunc(x))
    lo, hi = t <= float(info.min), t >= float(info.max)   # float(max) may round up
    out = np.where(lo | hi, 0.0, t).astype(dtype)
    return np.where(lo, info.min, np.where(hi, info.max, out)).astype(dtype)


def _div(a, b):
    if a.dtype.kind not in "iu":
        return np.divide(a, b)
    info = np.iinfo(a.dtype)
    zero = b == 0
    ovf = (a == info.min) & (b == -1)
    d = np.where(zero | ovf, 1, b).astype(a.dtype)
    q = a // d                                                     # floor ...
    q = np.where((q * d != a) & ((a < 0) != (d < 0)), q + 1, q)   # ... toward zero
    return np.where(zero, 0, np.where(ovf, info.max, q)).astype(a.dtype)


def _pow(a, b):
    if a.dtype.kind not in "iu":
        return np.power(a, b)
    a, b = np.broadcast_arrays(a, b)
    neg = b < 0
    e = np.where(neg, 0, b).astype(a.dtype)
    r, base = np.ones_like(a), a.copy()
    for _ in range(a.dtype.itemsize * 8 - 1):     # square and multiply, wrapping (NumPy)
        r = np.where(e & 1, r * base, r)
        base = base * base
        e = e >> 1
    inv = np.where(a == 1, 1, np.where(a == -1, np.where(b & 1, -1, 1), 0))
    return np.where(neg, inv, r).astype(a.dtype)


def _extremum(fn, neg_zero_wins):
    """np.maximum/np.minimum with -0 < +0 (IEEE maximum/minimum, as llvm.maximum)."""
    def f(a, b):
        r = fn(a, b)
        if a.dtype.kind != "f":
            return r
        both = (a == 0) & (b == 0)
        sa, sb = np.signbit(a), np.signbit(b)
        neg = (sa | sb) if neg_zero_wins else (sa & sb)
        return np.where(both, np.where(neg, -0.0, 0.0).astype(a.dtype), r)
    return f


def _sign(x):
    return np.where(x == 0, x, np.sign(x)).astype(x.dtype)     # +-0 and NaN pass


def _who(opname: str, label: str) -> str:
    """How an index error names its op: the user's indexing (the op's label) when known."""
    return f"{label} ({opname})" if label else opname


def _scatter_add(idx, upd, axis, dim, label=""):
    n = idx.ndim
    out_shape = upd.shape[:axis] + (dim,) + upd.shape[axis + n:]
    out = np.zeros(out_shape, dtype=upd.dtype)
    if np.any((idx < 0) | (idx >= dim)):
        raise IndexError(f"{_who('rlx.scatter_add', label)}: index out of range [0, {dim})")
    u = np.moveaxis(upd.reshape(upd.shape[:axis] + (-1,) + upd.shape[axis + n:]), axis, 0) \
        if n != 1 else np.moveaxis(upd, axis, 0)
    o = np.moveaxis(out, axis, 0)
    np.add.at(o, idx.reshape(-1), u.reshape((idx.size,) + o.shape[1:]))
    return out


def _gather(table, idx, axis, label=""):
    d = table.shape[axis]
    if idx.size and (idx.min() < 0 or idx.max() >= d):
        pos = tuple(int(i) for i in np.argwhere((idx < 0) | (idx >= d))[0])
        raise IndexError(f"{_who('rlx.gather', label)}: index out of range [0, {d}) along "
                         f"axis {axis}: {int(idx[pos])} at position {pos} of the indices")
    return np.take(table, idx, axis=axis)


def _slice(x, starts, limits, strides):
    return x[tuple(slice(s, l, st) for s, l, st in zip(starts, limits, strides))].copy()


def _red(fn):
    return lambda x, axes, keepdims: np.asarray(fn(x, axis=tuple(axes), keepdims=keepdims),
                                                dtype=x.dtype)


def _red_extremum(fn, neg_zero_wins):
    """np.max/np.min, with -0 < +0 (a zero result's sign does not depend on the order)."""
    def f(x, axes, keepdims):
        ax = tuple(axes)
        r = np.asarray(fn(x, axis=ax, keepdims=keepdims), dtype=x.dtype)
        if x.dtype.kind != "f" or not x.size:
            return r
        z = (x == 0)
        neg = np.any(z & np.signbit(x), axis=ax, keepdims=keepdims) if neg_zero_wins else \
            ~np.any(z & ~np.signbit(x), axis=ax, keepdims=keepdims)
        return np.where(r == 0, np.where(neg, -0.0, 0.0).astype(x.dtype), r)
    return f


EVAL_RULES = {
    # unary
    "rlx.neg": lambda x: -x,
    "rlx.exp": np.exp,
    "rlx.log": np.log,
    "rlx.sqrt": np.sqrt,
    "rlx.rsqrt": lambda x: 1 / np.sqrt(x),
    "rlx.tanh": np.tanh,
    "rlx.sigmoid": sigmoid,
    "rlx.relu": lambda x: np.where(x > 0, x, np.where(np.isnan(x), x, 0)).astype(x.dtype),
    "rlx.gelu": _gating(lambda x: 0.5 * x * (1 + erf(x / x.dtype.type(math.sqrt(2))))),
    "rlx.gelu_tanh": _gating(_gelu_tanh),
    "rlx.silu": _gating(lambda x: x * sigmoid(x)),
    "rlx.softplus": lambda x: np.logaddexp(x.dtype.type(0), x),
    "rlx.abs": np.abs,
    "rlx.sin": np.sin,
    "rlx.cos": np.cos,
    "rlx.sign": _sign,
    "rlx.reciprocal": lambda x: 1 / x,
    "rlx.erf": erf,
    "rlx.stop_gradient": lambda x: x,
    "rlx.floor": np.floor,
    "rlx.ceil": np.ceil,
    "rlx.round": np.rint,  # halves to even
    "rlx.expm1": np.expm1,
    "rlx.log1p": np.log1p,
    "rlx.exp2": np.exp2,
    "rlx.log2": np.log2,
    "rlx.log10": np.log10,
    "rlx.tan": np.tan,
    "rlx.atan": np.arctan,
    "rlx.asin": np.arcsin,
    "rlx.acos": np.arccos,
    "rlx.sinh": np.sinh,
    "rlx.cosh": np.cosh,
    "rlx.asinh": np.arcsinh,
    "rlx.acosh": np.arccosh,
    "rlx.atanh": np.arctanh,
    "rlx.fake_quant": _fake_quant,
    # binary
    "rlx.add": np.add,
    "rlx.sub": np.subtract,
    "rlx.mul": np.multiply,
    "rlx.div": _div,
    "rlx.pow": _pow,
    "rlx.maximum": _extremum(np.maximum, False),
    "rlx.minimum": _extremum(np.minimum, True),
    "rlx.atan2": np.arctan2,
    "rlx.hypot": np.hypot,
    "rlx.rem": np.fmod,  # integers: x rem 0 is 0 (NumPy's result)
    # compare
    "rlx.eq": np.equal,
    "rlx.ne": np.not_equal,
    "rlx.lt": np.less,
    "rlx.le": np.less_equal,
    "rlx.gt": np.greater,
    "rlx.ge": np.greater_equal,
    "rlx.select": np.where,
    # reductions
    "rlx.sum": _red(np.sum),
    "rlx.mean": _red(np.mean),
    "rlx.max": _red_extremum(np.max, False),
    "rlx.min": _red_extremum(np.min, True),
    "rlx.prod": _red(np.prod),
    # linear algebra and shape
    "rlx.matmul": np.matmul,
    "rlx.transpose": lambda x, perm: np.transpose(x, perm).copy(),
    "rlx.reshape": lambda x, shape: x.reshape(shape).copy(),
    "rlx.broadcast_to": lambda x, shape: np.broadcast_to(x, shape).copy(),
    "rlx.slice": _slice,
    "rlx.pad": lambda x, low, high: np.pad(x, list(zip(low, high))),
    "rlx.concat": lambda *xs, axis: np.concatenate(xs, axis=axis),
    "rlx.gather": _gather,
    "rlx.scatter_add": _scatter_add,
    "rlx.philox": philox_uniform,     # dialect/philox.py
}

from .conv_ref import EVAL_RULES as _CONV_EVAL  # noqa: E402  (convolution family)

EVAL_RULES.update(_CONV_EVAL)
EVAL_RULES["rlx.attention"] = attention_ref
from .attention_bwd import bwd_ref as _attn_bwd, lse_ref as _attn_lse  # noqa: E402
EVAL_RULES["rlx.attention_lse"] = _attn_lse
EVAL_RULES["rlx.attention_bwd"] = _attn_bwd
EVAL_RULES["rlx.iota"] = lambda size: np.arange(int(size), dtype=np.int32)   # dialect/iota.py

missing = set(OPS) - set(EVAL_RULES) - {"rlx.constant", "rlx.cast"}
assert not missing, f"no interpreter rule for {sorted(missing)}"


def _np_dtype(d: str, float_dtype):
    """f32 tensors compute in `float_dtype` (f64 for gradient checks); f64 stays f64."""
    if d == "f32":
        return float_dtype
    if d == "f64":
        return np.float64
    return NP_DTYPES[d]


def _result_dtype(op, float_dtype):
    return _np_dtype(dtype_of(op.results[0].type), float_dtype)


def interpret(module, args: list[np.ndarray], float_dtype=np.float32) -> list[np.ndarray]:
    """Run the module's function on `args` (in signature order); returns the outputs."""
    f = module if isinstance(module, func.FuncOp) else get_func(module)
    arrays = [np.asarray(a, dtype=_np_dtype(dtype_of(v.type), float_dtype))
              for v, a in zip(f.args, args)]
    sizes = _sizes(f, arrays)   # each dynamic dim's size in this call
    return [np.array(v) for v in eval_block(f.body.block, arrays, float_dtype, sizes)]


def eval_block(block, args, float_dtype=np.float32, sizes=None) -> list:
    """Run one block (a function body or a region) on `args`; the values its terminator
    (func.return or rlx.yield) passes on.  Region ops recurse (control.CONTROL_EVAL).
    `sizes` maps each dynamic dim (symbol) of the enclosing function to its size."""
    from .control import CONTROL_EVAL

    env = {}
    for v, a in zip(block.args, args):
        env[v] = np.asarray(a, dtype=_np_dtype(dtype_of(v.type), float_dtype))

    def run(b, vals):
        return eval_block(b, vals, float_dtype, sizes)
    run.sizes = sizes     # a region op's symbolic parameter (a scan's length) reads it
    with np.errstate(all="ignore"):
        for op in block.ops:
            if op is block.last_op and not op.results:
                break
            if op.name in CONTROL_EVAL:
                for r, val in zip(op.results, CONTROL_EVAL[op.name](
                        op, [env[o] for o in op.operands], run)):
                    env[r] = val
                continue
            rdt = _result_dtype(op, float_dtype)
            if op.name == "rlx.constant":
                val = dense_value(op.value).astype(rdt)
            elif op.name == "rlx.cast":
                x = env[op.operands[0]]
                if np.dtype(rdt).kind in "iu" and x.dtype.kind == "f":
                    val = float_to_int(x, rdt)
                else:
                    val = x.astype(rdt)
            else:
                rule = EVAL_RULES.get(op.name)
                if rule is None or not isinstance(op, RlxOp):
                    raise NotImplementedError(f"interpreter: no rule for {op.name}")
                params = op.params()
                if sizes:
                    params = {k: resolve_value(p, sizes) for k, p in params.items()}
                val = rule(*[env[o] for o in op.operands], **params)
                val = np.asarray(val)
                if val.dtype != rdt:
                    val = val.astype(rdt)
            env[op.results[0]] = val
    return [env[v] for v in block.last_op.operands]


class _ArgShape:
    __slots__ = ("name", "kind", "shape")

    def __init__(self, i, v):
        self.name, self.kind, self.shape = f"#{i}", "argument", shape_of(v.type)


def _sizes(f, arrays) -> dict:
    """The size of every dynamic dim (symbol) of `f`'s arguments in this call."""
    args = [_ArgShape(i, v) for i, v in enumerate(f.args)]
    if not any(isinstance(d, str) for a in args for d in a.shape):
        return {}
    return bind_sizes(args, [a.shape for a in arrays], "interpreter")

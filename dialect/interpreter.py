"""Reference interpreter: evaluates an rlx module with NumPy, op by op.

This is the semantic definition of every op and the oracle for every backend
and transform. `EVAL_RULES` maps an op name to `rule(inputs, **params) -> array`.
f32 tensors are computed in float32 or, on request, in float64 for gradient
checks; f64 tensors always in float64; NaN and inf propagate as IEEE says.
"""
from __future__ import annotations

import math

import numpy as np
from xdsl.dialects import func

from .module import get_func, outputs
from .ops import OPS, RlxOp
from .types import NP_DTYPES, dense_value, dtype_of

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
    kernels give it (lowering/mathlib.py), not the NaN of -inf * 0."""
    def g(x):
        with np.errstate(invalid="ignore"):
            y = f(x)
        return np.asarray(np.where(x == -np.inf, x.dtype.type(-0.0), y), dtype=x.dtype)
    return g


def _fake_quant(x, exp_bits, man_bits, max_normal):
    from rlxc.lowp import quantize  # the one definition of the rounding

    return quantize(x, exp_bits, man_bits, max_normal).astype(x.dtype)


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
        raise IndexError(f"{_who('rlx.gather', label)}: index out of range [0, {d}) "
                         f"along axis {axis}")
    return np.take(table, idx, axis=axis)


def _slice(x, starts, limits, strides):
    return x[tuple(slice(s, l, st) for s, l, st in zip(starts, limits, strides))].copy()


def _red(fn):
    return lambda x, axes, keepdims: np.asarray(fn(x, axis=tuple(axes), keepdims=keepdims),
                                                dtype=x.dtype)


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
    "rlx.sign": np.sign,
    "rlx.reciprocal": lambda x: 1 / x,
    "rlx.erf": erf,
    "rlx.stop_gradient": lambda x: x,
    "rlx.floor": np.floor,
    "rlx.ceil": np.ceil,
    "rlx.round": np.rint,  # halves to even
    "rlx.fake_quant": _fake_quant,
    # binary
    "rlx.add": np.add,
    "rlx.sub": np.subtract,
    "rlx.mul": np.multiply,
    "rlx.div": np.divide,
    "rlx.pow": np.power,
    "rlx.maximum": np.maximum,
    "rlx.minimum": np.minimum,
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
    "rlx.max": _red(np.max),
    "rlx.min": _red(np.min),
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
}

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
    env = {}
    for v, a in zip(f.args, args):
        env[v] = np.asarray(a, dtype=_np_dtype(dtype_of(v.type), float_dtype))
    with np.errstate(all="ignore"):
        for op in f.body.block.ops:
            if isinstance(op, func.ReturnOp):
                break
            rdt = _result_dtype(op, float_dtype)
            if op.name == "rlx.constant":
                val = dense_value(op.value).astype(rdt)
            elif op.name == "rlx.cast":
                x = env[op.operands[0]]
                if np.dtype(rdt).kind in "iu" and x.dtype.kind == "f":
                    x = np.trunc(x)
                val = x.astype(rdt)
            else:
                rule = EVAL_RULES.get(op.name)
                if rule is None or not isinstance(op, RlxOp):
                    raise NotImplementedError(f"interpreter: no rule for {op.name}")
                val = rule(*[env[o] for o in op.operands], **op.params())
                val = np.asarray(val)
                if val.dtype != rdt:
                    val = val.astype(rdt)
            env[op.results[0]] = val
    return [np.array(env[v]) for v in outputs(f)]

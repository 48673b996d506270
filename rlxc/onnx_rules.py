"""The ONNX op table of rlxc/onnx_import.py: one row per ONNX op type.

    RULES["Gemm"] = Rule(fn, unsupported)
      fn(cx, node, ins, attrs) -> output values, in node.output order
      unsupported(node, attrs, opset) -> why (str) or None: checked for every node
        before tracing, so one error lists all the nodes rlxc cannot express

A value is an rlxc Tensor or, when known at trace time, a NumPy array (integer
initializers, Constant, Shape, ...). Rules compute on arrays with NumPy when every
operand is one, so shape arithmetic (Shape -> Gather -> Concat -> Reshape) folds
away and never reaches the graph; otherwise arrays become constants.
Conv/pool rows call the Tensor methods of rlxc/conv.py (conv2d, max_pool2d, ...).
"""
from __future__ import annotations

import math

import numpy as np

from .onnx_base import Ctx, Rule, ints_of, is_static, attr_text, tensors, static  # noqa: F401
from .onnx_base import axis_of, shape_array
from .onnx_rules_more import MORE_RULES
from .onnx_import import ONNX_DTYPES, OnnxImportError, tensor_array
from .onnx_rules_nn import (batch_norm, batch_norm_unsupported, conv,
                            conv_transpose, conv_transpose_unsupported, global_pool,
                            layer_norm, layer_norm_unsupported, pool,
                            pool_unsupported, resize, resize_unsupported)


# -- elementwise ---------------------------------------------------------------------------
def unary(method: str, np_fn=None):
    def fn(cx, node, ins, at):
        x = ins[0]
        if isinstance(x, np.ndarray) and np_fn is not None:
            return np_fn(x)
        return getattr(cx.T(x), method)()
    return Rule(fn)


def _int_div(a, b):
    """ONNX integer Div truncates toward zero (NumPy's // floors).  Static operands (0-d
    ones give NumPy scalars, not arrays) stay NumPy; a shape holding a dynamic dim is an
    object array, whose SymDim refuses the arithmetic by name."""
    q = a // b
    fix = ((a % b) != 0) & ((a < 0) ^ (b < 0))
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return np.asarray(np.where(fix, q + 1, q))
    return fix.where(q + 1, q)


def _div(a, b):
    # shapes: int64 arrays, or object arrays once a dim is a symbol (onnx_base.shape_array)
    a_int = np.asarray(a).dtype.kind in "iuO" if isinstance(a, np.ndarray) else \
        a.dtype in ("i32", "i64")
    return _int_div(a, b) if a_int else a / b


BINARY_FNS = {
    "Add": lambda a, b: a + b, "Sub": lambda a, b: a - b, "Mul": lambda a, b: a * b,
    "Div": _div,
    "Equal": lambda a, b: a == b, "Less": lambda a, b: a < b, "Greater": lambda a, b: a > b,
    "LessOrEqual": lambda a, b: a <= b, "GreaterOrEqual": lambda a, b: a >= b,
    "And": lambda a, b: a & b, "Or": lambda a, b: a | b, "Xor": lambda a, b: a ^ b,
}


def binary(name):
    op = BINARY_FNS[name]

    def fn(cx, node, ins, at):
        a, b = ins[:2]
        if is_static(a, b):
            r = op(a, b)
            return np.asarray(r, dtype=np.result_type(a, b)) if name in ("Add", "Sub", "Mul",
                                                                         "Div") else r
        return op(*tensors(cx, a, b))
    return Rule(fn)


def _pow(cx, node, ins, at):
    x, y = ins
    if is_static(x, y):
        return np.power(x, y).astype(x.dtype)
    if isinstance(y, np.ndarray) and y.size == 1:
        e = float(y.reshape(()))
        return cx.T(x) ** (int(e) if e.is_integer() else e)
    x, y = tensors(cx, x, y)
    return x.pow(y.cast(x.dtype) if y.dtype != x.dtype else y)


def variadic(np_fn, method):
    def fn(cx, node, ins, at):
        vals = [v for v in ins if v is not None]
        if is_static(*vals):
            r = vals[0]
            for v in vals[1:]:
                r = np_fn(r, v)
            return r
        ts = tensors(cx, *vals)
        r = ts[0]
        for t in ts[1:]:
            r = getattr(r, method)(t) if isinstance(method, str) else method(r, t)
        return r
    return Rule(fn)


def _mean(cx, node, ins, at):
    ts = tensors(cx, *ins)
    r = ts[0]
    for t in ts[1:]:
        r = r + t
    return r / float(len(ts))


def _leaky_relu(cx, node, ins, at):
    x = cx.T(ins[0])
    return (x < 0).where(x * float(at.get("alpha", 0.01)), x)


def _elu(cx, node, ins, at):
    x = cx.T(ins[0])
    return (x < 0).where((x.exp() - 1.0) * float(at.get("alpha", 1.0)), x)


def _selu(cx, node, ins, at):
    x = cx.T(ins[0])
    a, g = float(at.get("alpha", 1.67326319217681884765625)), \
        float(at.get("gamma", 1.05070102214813232421875))
    return (x <= 0).where((x.exp() - 1.0) * (a * g), x * g)


def _hard_sigmoid(cx, node, ins, at, alpha=None, beta=None):
    x = cx.T(ins[0])
    a = float(at.get("alpha", 0.2)) if alpha is None else alpha
    b = float(at.get("beta", 0.5)) if beta is None else beta
    return (x * a + b).clip(0.0, 1.0)


def _hard_swish(cx, node, ins, at):
    return cx.T(ins[0]) * _hard_sigmoid(cx, node, ins, at, 1.0 / 6.0, 0.5)


def _gelu(cx, node, ins, at):
    return cx.T(ins[0]).gelu(attr_text(at.get("approximate", "none")))


def _where(cx, node, ins, at):
    c, a, b = ins
    if is_static(c, a, b):
        return np.where(c, a, b)
    from rlxc.tensor import Tensor, where

    like = a if isinstance(a, Tensor) else b if isinstance(b, Tensor) else None
    a, b = cx.T(a, like), cx.T(b, like)
    return where(cx.T(c), a, b)


def _cast_dtype(at) -> str:
    return ONNX_DTYPES[int(at["to"])]


def _cast(cx, node, ins, at):
    dt = _cast_dtype(at)
    x = ins[0]
    if isinstance(x, np.ndarray):
        from rlxc.dialect.shapes import NP_DTYPES

        return x.astype(NP_DTYPES[dt])
    return x.cast(dt)


def _cast_unsupported(node, at, opset):
    to = int(at.get("to", 0))
    if to not in ONNX_DTYPES:
        from .onnx_import import ONNX_DTYPE_NAMES

        return f"cast to {ONNX_DTYPE_NAMES.get(to, to)} (supported: FLOAT, DOUBLE, INT32, " \
               "INT64, BOOL)"
    return None


def _clip(cx, node, ins, at):
    x = ins[0]
    lo = ins[1] if len(ins) > 1 else at.get("min")
    hi = ins[2] if len(ins) > 2 else at.get("max")
    if isinstance(x, np.ndarray) and is_static(lo, hi):
        return np.clip(x, lo, hi).astype(x.dtype)
    x = cx.T(x)
    for bound, m in ((lo, "maximum"), (hi, "minimum")):
        if bound is None:
            continue
        b = float(static(bound, "Clip bound").reshape(())) if not hasattr(bound, "scope") \
            else bound
        x = getattr(x, m)(b)
    return x


def _mod(cx, node, ins, at):
    a, b = ins
    if is_static(a, b):
        return np.fmod(a, b) if at.get("fmod", 0) else np.mod(a, b)
    a, b = tensors(cx, a, b)
    return a.fmod(b) if at.get("fmod", 0) else a % b


def _not(cx, node, ins, at):
    x = ins[0]
    return np.logical_not(x) if isinstance(x, np.ndarray) else ~x


# -- linear algebra ------------------------------------------------------------------------
def _matmul(cx, node, ins, at):
    a, b = ins
    if is_static(a, b):
        return np.matmul(a, b)
    a, b = tensors(cx, a, b)
    if a.ndim > 2 and b.ndim == 2 and not any(isinstance(d, str) for d in a.shape[:-2]):
        # (..., M, K) @ (K, N): one (prod(...) * M, K) GEMM, not prod(...) small ones
        return (a.reshape(-1, a.shape[-1]) @ b).reshape(a.shape[:-1] + (b.shape[-1],))
    return a @ b


def _gemm(cx, node, ins, at):
    a, b = tensors(cx, ins[0], ins[1])
    c = ins[2] if len(ins) > 2 else None
    if at.get("transA", 0):
        a = a.T
    if at.get("transB", 0):
        b = b.T
    y = a @ b
    alpha, beta = float(at.get("alpha", 1.0)), float(at.get("beta", 1.0))
    if alpha != 1.0:
        y = y * alpha
    if c is not None and beta != 0.0:
        c = cx.T(c, y)
        y = y + (c * beta if beta != 1.0 else c)
    return y


def _einsum(cx, node, ins, at):
    from .onnx_einsum import einsum

    return einsum(attr_text(at["equation"]), tensors(cx, *ins))


# -- reductions ----------------------------------------------------------------------------
def _reduce_axes(cx, node, ins, at, axes_input: bool):
    if axes_input:
        axes = ins[1] if len(ins) > 1 and ins[1] is not None else None
        axes = None if axes is None else ints_of(static(axes, "the axes input"))
    else:
        axes = at.get("axes")
        axes = None if axes is None else list(axes)
    if not axes:
        return None if not at.get("noop_with_empty_axes", 0) else ()
    return tuple(axes)


def reduction(kind: str, axes_input_from: int):
    """ReduceSum/Mean/...: axes from the attribute, or (opset >= axes_input_from) input 1."""
    def fn(cx, node, ins, at):
        axes = _reduce_axes(cx, node, ins, at, cx.opset >= axes_input_from)
        keep = bool(at.get("keepdims", 1))
        x = ins[0]
        if axes == ():   # noop_with_empty_axes: no reduction, but the elementwise step
            if kind in ("sum", "mean", "max", "min", "prod", "log_sum_exp"):
                return x   # (log of exp: x itself)
            x = cx.T(x)
            return {"sum_square": lambda: x * x, "l1": x.abs, "l2": x.abs,
                    "log_sum": x.log}[kind]()
        if isinstance(x, np.ndarray):
            npf = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min,
                   "prod": np.prod}.get(kind)
            if npf is not None:
                return np.asarray(npf(x, axis=axes, keepdims=keep), dtype=x.dtype)
        x = cx.T(x)
        ax = axes if axes is not None else tuple(range(x.ndim))
        if kind == "mean" and x.dtype in ("i32", "i64"):   # ONNX keeps the type: truncated
            return x.mean(ax, keepdims=keep).cast(x.dtype)
        if kind in ("sum", "mean", "max", "min", "prod"):
            return getattr(x, kind)(ax, keepdims=keep)
        if kind == "sum_square":
            return (x * x).sum(ax, keepdims=keep)
        if kind == "l1":
            return x.abs().sum(ax, keepdims=keep)
        if kind == "l2":
            return (x * x).sum(ax, keepdims=keep).sqrt()
        if kind == "log_sum":
            return x.sum(ax, keepdims=keep).log()
        if kind == "log_sum_exp":
            return x.logsumexp(ax, keepdims=keep)
        raise AssertionError(kind)
    return Rule(fn, static_inputs=(1,))


def arg_reduce(kind: str):
    """ArgMax/ArgMin: the first index of the max/min (Tensor.argmax/argmin: a NaN is the
    extreme, as in NumPy and ONNX's reference), or with select_last_index the last one."""
    def fn(cx, node, ins, at):
        x = cx.T(ins[0])
        axis = axis_of(at.get("axis", 0), x.ndim, "axis")
        keep = bool(at.get("keepdims", 1))
        arg = "arg" + kind
        if not at.get("select_last_index", 0):
            return getattr(x, arg)(axis, keepdims=keep).cast("i64")
        # the last one: the first of the flipped axis (its NaN rule included)
        return (x.shape[axis] - 1 - getattr(x.flip(axis), arg)(axis, keepdims=keep)).cast("i64")
    return Rule(fn)


def _softmax_like(method: str):
    def fn(cx, node, ins, at):
        x = cx.T(ins[0])
        if cx.opset >= 13:
            return getattr(x, method)(int(at.get("axis", -1)))
        axis = axis_of(at.get("axis", 1), x.ndim, "axis")  # opset < 13: the flattened tail
        tail = x.shape[axis:]
        if len(tail) == 1:   # one axis (what exporters write): no reshape, any leading dims
            return getattr(x, method)(axis)
        if any(isinstance(d, str) for d in tail):
            raise OnnxImportError(f"{node.op_type} (opset {cx.opset}) over the flattened axes "
                                  f"{axis}.. of {tuple(x.shape)}: a dynamic dimension among "
                                  "them; give its size with input_shapes=")
        y = x.reshape(tuple(x.shape[:axis]) + (math.prod(tail),))   # leading dims kept
        return getattr(y, method)(-1).reshape(x.shape)
    return Rule(fn)


# -- shapes --------------------------------------------------------------------------------
def _shape_of(v) -> tuple:
    return tuple(v.shape)


def _reshape(cx, node, ins, at):
    x = ins[0]
    shp = ints_of(static(ins[1], "Reshape's shape input")) if len(ins) > 1 else \
        list(at["shape"])
    if not at.get("allowzero", 0):
        shp = [x.shape[i] if d == 0 else d for i, d in enumerate(shp)]
    return x.reshape(shp) if isinstance(x, np.ndarray) else x.reshape(tuple(shp))


def _flatten(cx, node, ins, at):
    x = ins[0]
    r = len(x.shape)
    axis = int(at.get("axis", 1))
    axis = axis + r if axis < 0 else axis
    a, b = x.shape[:axis], x.shape[axis:]
    dyn = [any(isinstance(d, str) for d in p) for p in (a, b)]
    if all(dyn):
        raise OnnxImportError(f"Flatten at axis {axis} of {tuple(x.shape)}: dynamic "
                              "dimensions on both sides")
    shp = tuple(-1 if d else math.prod(p) for d, p in zip(dyn, (a, b)))
    return x.reshape(shp)


def _transpose(cx, node, ins, at):
    x = ins[0]
    perm = at.get("perm")
    perm = tuple(perm) if perm is not None else tuple(reversed(range(len(x.shape))))
    return np.transpose(x, perm) if isinstance(x, np.ndarray) else x.transpose(perm)


def _axes_arg(cx, ins, at, first_input_opset=13):
    if cx.opset >= first_input_opset:
        return None if len(ins) < 2 or ins[1] is None else ints_of(static(ins[1], "axes"))
    a = at.get("axes")
    return None if a is None else list(a)


def _squeeze(cx, node, ins, at):
    x = ins[0]
    r = len(x.shape)
    axes = _axes_arg(cx, ins, at)
    if axes is None:
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    axes = sorted(axis_of(a, r, "axis") for a in axes)
    shp = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    return x.reshape(shp) if not isinstance(x, np.ndarray) or shp else x.reshape(())


def _unsqueeze(cx, node, ins, at):
    x = ins[0]
    axes = _axes_arg(cx, ins, at)
    r = len(x.shape) + len(axes)
    axes = sorted(axis_of(a, r, "axis") for a in axes)
    if len(set(axes)) != len(axes):
        raise OnnxImportError(f"Unsqueeze's axes {axes} repeat an axis")
    shp, it = [], iter(x.shape)
    for i in range(r):
        shp.append(1 if i in axes else next(it))
    return x.reshape(tuple(shp))


def _concat(cx, node, ins, at):
    vals = [v for v in ins if v is not None]
    axis = int(at["axis"])
    if is_static(*vals):
        return np.concatenate(vals, axis=axis)
    from rlxc.tensor import concat

    ts = tensors(cx, *vals)
    return concat(ts, axis_of(axis, ts[0].ndim, "axis"))


def _split(cx, node, ins, at):
    x = ins[0]
    r = len(x.shape)
    axis = axis_of(at.get("axis", 0), r, "axis")
    n = x.shape[axis]
    if len(ins) > 1 and ins[1] is not None:
        sizes = ints_of(static(ins[1], "Split's split input"))
    elif "split" in at:
        sizes = list(at["split"])
    else:
        k = int(at.get("num_outputs", len(node.output)))
        c = -(-n // k)
        sizes = [min(c, n - i * c) for i in range(k)]
    if sum(sizes) != n:
        raise OnnxImportError(f"split sizes {sizes} do not add up to dim {axis} = {n}")
    outs, start = [], 0
    for sz in sizes:
        idx = (slice(None),) * axis + (slice(start, start + sz),)
        outs.append(x[idx])
        start += sz
    return outs


def _slice_key(shape, starts, ends, axes, steps):
    key = [slice(None)] * len(shape)
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        if sp == 0:
            raise OnnxImportError("Slice step 0")
        ax = axis_of(ax, len(shape), "Slice's axis")
        if isinstance(shape[ax], str):
            # a dynamic (dim_param) axis: only the whole of it, as exporters write a no-op
            # slice ([0, INT64_MAX) with step 1); a part of it would need sizes computed
            # from the symbol
            if sp == 1 and st in (0, -2 ** 63) and en >= 2 ** 31 - 1:
                continue
            raise OnnxImportError(f"Slice [{st}:{en}:{sp}] of axis {ax}, the dynamic "
                                  f"dimension {shape[ax]!r}: only the whole axis can be "
                                  "sliced; give its size with input_shapes=")
        a, b, c = slice(st, en, sp).indices(shape[ax])
        if c < 0 and b < 0:
            b = None   # runs to the start: -1 would mean "the last element"
        key[ax] = slice(a, b, c)
    return tuple(key)


def _slice(cx, node, ins, at):
    x = ins[0]
    if cx.opset >= 10:
        starts = ints_of(static(ins[1], "Slice's starts"))
        ends = ints_of(static(ins[2], "Slice's ends"))
        axes = ints_of(static(ins[3], "Slice's axes")) if len(ins) > 3 and ins[3] is not None \
            else list(range(len(starts)))
        steps = ints_of(static(ins[4], "Slice's steps")) if len(ins) > 4 and ins[4] is not None \
            else [1] * len(starts)
    else:
        starts, ends = list(at["starts"]), list(at["ends"])
        axes = list(at.get("axes", range(len(starts))))
        steps = [1] * len(starts)
    return x[_slice_key(x.shape, starts, ends, axes, steps)]


def _gather(cx, node, ins, at):
    data, idx = ins
    axis = int(at.get("axis", 0))
    if is_static(data, idx):
        return np.asarray(np.take(data, idx, axis=axis), data.dtype)  # (a SymDim stays 0-d)
    data = cx.T(data)
    axis = axis_of(axis, data.ndim, "axis")
    if isinstance(idx, np.ndarray) and idx.ndim == 0:
        i = int(idx)
        return data.take(np.asarray([i]), axis).squeeze(axis)
    return data.take(idx, axis)


def _expand(cx, node, ins, at):
    x = ins[0]
    shp = ints_of(static(ins[1], "Expand's shape input"))
    from rlxc.dialect.shapes import broadcast_shapes

    out = broadcast_shapes(tuple(x.shape), tuple(shp), "Expand")
    if isinstance(x, np.ndarray):
        return np.broadcast_to(x, out).copy()
    x = x.reshape((1,) * (len(out) - x.ndim) + x.shape) if x.ndim < len(out) else x
    return x.broadcast_to(out)


def _tile(cx, node, ins, at):
    x = ins[0]
    reps = ints_of(static(ins[1], "Tile's repeats"))
    if isinstance(x, np.ndarray):
        return np.tile(x, reps)
    inter = tuple(v for d in x.shape for v in (1, d))
    full = tuple(v for r, d in zip(reps, x.shape) for v in (r, d))
    return x.reshape(inter).broadcast_to(full).reshape(tuple(r * d for r, d in
                                                            zip(reps, x.shape)))


def _pad(cx, node, ins, at):
    x = cx.T(ins[0])
    r = x.ndim
    mode = attr_text(at.get("mode", "constant"))
    if cx.opset >= 11:
        pads = ints_of(static(ins[1], "Pad's pads"))
        value = ins[2] if len(ins) > 2 and ins[2] is not None else None
        axes = ints_of(static(ins[3], "Pad's axes")) if len(ins) > 3 and ins[3] is not None \
            else list(range(r))
    else:
        pads, value, axes = list(at["pads"]), at.get("value", 0.0), list(range(r))
    k = len(axes)
    lo, hi = [0] * r, [0] * r
    for i, a in enumerate(axes):
        a = axis_of(a, r, "Pad's axis")
        lo[a], hi[a] = pads[i], pads[i + k]
    for a, d in enumerate(x.shape):   # a dynamic (dim_param) axis passes unpadded
        if isinstance(d, str) and (lo[a] or hi[a]):
            raise OnnxImportError(f"Pad of axis {a}, the dynamic dimension {d!r}: only "
                                  "static axes can be padded or cropped; give its size with "
                                  "input_shapes=")
    # negative pads crop
    if any(p < 0 for p in lo + hi):
        key = tuple(slice(-l if l < 0 else 0, d + h if h < 0 else d) if l or h else slice(None)
                    for l, h, d in zip(lo, hi, x.shape))
        x = x[key]
        lo, hi = [max(p, 0) for p in lo], [max(p, 0) for p in hi]
    if not any(lo + hi):
        return x
    if mode == "constant":
        y = x.scope.emit("rlx.pad", [x], low=tuple(lo), high=tuple(hi))
        c = 0.0 if value is None else float(np.asarray(static(value, "Pad's constant_value"))
                                               .reshape(()))
        if c != 0.0:   # the frame: where a padded splat of ones is 0 (any leading dims)
            from rlxc.tensor import where

            inside = x.scope.emit("rlx.pad", [cx.s._splat(1.0, x.shape, x.dtype)],
                                  low=tuple(lo), high=tuple(hi))
            y = where(inside == 1.0, y, c)
        return y
    npmode = {"reflect": "reflect", "edge": "edge", "wrap": "wrap"}[mode]
    for a in range(r):
        if lo[a] or hi[a]:
            idx = np.pad(np.arange(x.shape[a]), (lo[a], hi[a]), mode=npmode)
            x = x.take(idx.astype(np.int64), a)
    return x


def _pad_unsupported(node, at, opset):
    mode = attr_text(at.get("mode", "constant"))
    return None if mode in ("constant", "reflect", "edge", "wrap") else f"mode {mode!r}"


def _identity(cx, node, ins, at):
    return ins[0]


def _constant(cx, node, ins, at):
    if "value" in at:
        return tensor_array(at["value"])
    if "value_float" in at:
        return np.asarray(at["value_float"], np.float32)
    if "value_floats" in at:
        return np.asarray(at["value_floats"], np.float32)
    if "value_int" in at:
        return np.asarray(at["value_int"], np.int64)
    if "value_ints" in at:
        return np.asarray(at["value_ints"], np.int64)
    raise OnnxImportError(f"Constant with attribute {sorted(at)} is not supported")


def _constant_unsupported(node, at, opset):
    ok = {"value", "value_float", "value_floats", "value_int", "value_ints"}
    return None if set(at) & ok else f"attribute {sorted(at)[0] if at else '(none)'}"


def _constant_of_shape(cx, node, ins, at):
    shp = ints_of(static(ins[0], "ConstantOfShape's shape"))
    v = tensor_array(at["value"]) if "value" in at else np.zeros(1, np.float32)
    if any(isinstance(d, str) for d in shp):   # zeros_like(x) of a dynamic x: a splat
        return cx.s._splat(v.reshape(-1)[0].item(), tuple(shp), cx.dtype_of(v))
    return np.full(shp, v.reshape(-1)[0], dtype=v.dtype)


def _shape(cx, node, ins, at):
    shp = shape_array(_shape_of(ins[0]))       # a dynamic dim is a SymDim (onnx_base)
    start, end = at.get("start", 0), at.get("end")
    return shp[start:end]


def _size(cx, node, ins, at):
    return np.asarray(math.prod(shape_array(_shape_of(ins[0]))), np.int64)


def _range(cx, node, ins, at):
    a, b, d = (static(v, "Range's start/limit/delta") for v in ins)
    return np.arange(a.reshape(()), b.reshape(()), d.reshape(()), dtype=a.dtype)


def _dropout(cx, node, ins, at):
    x = ins[0]
    return [x, np.ones(_shape_of(x), np.bool_)]


RULES: dict[str, Rule] = {
    # elementwise
    "Neg": unary("neg", np.negative), "Abs": unary("abs", np.abs), "Exp": unary("exp"),
    "Log": unary("log"), "Sqrt": unary("sqrt"), "Reciprocal": unary("reciprocal"),
    "Tanh": unary("tanh"), "Sigmoid": unary("sigmoid"), "Relu": unary("relu"),
    "Erf": unary("erf"), "Softplus": unary("softplus"), "Sin": unary("sin"),
    "Cos": unary("cos"), "Tan": unary("tan"), "Atan": unary("atan"), "Asin": unary("asin"),
    "Acos": unary("acos"), "Sinh": unary("sinh"), "Cosh": unary("cosh"),
    "Floor": unary("floor", np.floor), "Ceil": unary("ceil", np.ceil),
    "Round": unary("round", np.round), "Sign": unary("sign", np.sign),
    "Not": Rule(_not),
    "LeakyRelu": Rule(_leaky_relu), "Elu": Rule(_elu), "Selu": Rule(_selu),
    "HardSigmoid": Rule(_hard_sigmoid), "HardSwish": Rule(_hard_swish), "Gelu": Rule(_gelu),
    "Add": binary("Add"), "Sub": binary("Sub"), "Mul": binary("Mul"), "Div": binary("Div"),
    "Pow": Rule(_pow, static_inputs=(1,)), "Mod": Rule(_mod),
    "Equal": binary("Equal"), "Less": binary("Less"), "Greater": binary("Greater"),
    "LessOrEqual": binary("LessOrEqual"), "GreaterOrEqual": binary("GreaterOrEqual"),
    "And": binary("And"), "Or": binary("Or"), "Xor": binary("Xor"),
    "Where": Rule(_where), "Cast": Rule(_cast, _cast_unsupported),
    "Clip": Rule(_clip, static_inputs=(1, 2)),
    "Min": variadic(np.minimum, "minimum"), "Max": variadic(np.maximum, "maximum"),
    "Sum": variadic(np.add, lambda a, b: a + b), "Mean": Rule(_mean),
    # linear algebra
    "MatMul": Rule(_matmul), "Gemm": Rule(_gemm), "Einsum": Rule(_einsum),
    # reductions (axes became an input: ReduceSum at opset 13, the others at 18)
    "ReduceSum": reduction("sum", 13), "ReduceMean": reduction("mean", 18),
    "ReduceMax": reduction("max", 18), "ReduceMin": reduction("min", 18),
    "ReduceProd": reduction("prod", 18), "ReduceSumSquare": reduction("sum_square", 18),
    "ReduceL1": reduction("l1", 18), "ReduceL2": reduction("l2", 18),
    "ReduceLogSum": reduction("log_sum", 18), "ReduceLogSumExp": reduction("log_sum_exp", 18),
    "ArgMax": arg_reduce("max"), "ArgMin": arg_reduce("min"),
    "Softmax": _softmax_like("softmax"), "LogSoftmax": _softmax_like("log_softmax"),
    # shapes
    "Reshape": Rule(_reshape, static_inputs=(1,)), "Flatten": Rule(_flatten),
    "Transpose": Rule(_transpose), "Concat": Rule(_concat), "Gather": Rule(_gather),
    "Squeeze": Rule(_squeeze, static_inputs=(1,)),
    "Unsqueeze": Rule(_unsqueeze, static_inputs=(1,)),
    "Split": Rule(_split, static_inputs=(1,)),
    "Slice": Rule(_slice, static_inputs=(1, 2, 3, 4)),
    "Expand": Rule(_expand, static_inputs=(1,)), "Tile": Rule(_tile, static_inputs=(1,)),
    "Pad": Rule(_pad, _pad_unsupported, (1, 2, 3)),
    "Identity": Rule(_identity), "Constant": Rule(_constant, _constant_unsupported),
    "ConstantOfShape": Rule(_constant_of_shape, static_inputs=(0,)),
    "Shape": Rule(_shape), "Size": Rule(_size),
    "Range": Rule(_range, static_inputs=(0, 1, 2)),
    # normalization, dropout
    "BatchNormalization": Rule(batch_norm, batch_norm_unsupported, (3, 4)),
    "LayerNormalization": Rule(layer_norm, layer_norm_unsupported),
    "Dropout": Rule(_dropout, static_inputs=(1, 2)),
    # conv / pool / resize
    "Conv": Rule(conv),
    "ConvTranspose": Rule(conv_transpose, conv_transpose_unsupported),
    "MaxPool": Rule(pool("max"), pool_unsupported),
    "AveragePool": Rule(pool("avg"), pool_unsupported),
    "GlobalAveragePool": global_pool("mean"), "GlobalMaxPool": global_pool("max"),
    "Resize": Rule(resize, resize_unsupported, (1, 2, 3)),
}
RULES.update(MORE_RULES)   # cumsum, topk, trilu, prelu, isnan/isinf, one-hot, ... (more)

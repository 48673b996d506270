"""More ONNX rules, each a composite of Tensor ops (merged into onnx_rules.RULES):

    CumSum     x.cumsum(axis); reverse: on the flipped axis; exclusive: shifted by one
    TopK       x.topk(k, axis) (values, i64 indices; largest=0: the top k of -x)
    Trilu      where(triu/tril mask of the last two (static) dims, x, 0)
    PRelu      where(x < 0, slope * x, x)
    IsNaN      x != x;  IsInf: x == +inf / x == -inf as the detect_* attributes say
    OneHot     off + (on - off) * one_hot(index (negative: from the end), depth), at `axis`
    GatherElements  data[idx at `axis`, the other dims' aranges] (advanced indexing;
               static index shapes)
    InstanceNormalization  layer_norm over the spatial dims, then scale/bias per channel
    SoftmaxCrossEntropyLoss  log_softmax over axis 1, the labels' entries, weights,
               ignore_index, reduction (F.cross_entropy inside a model)

What torch.onnx.export writes for cumsum, topk, triu/tril (and SDPA's causal mask),
nn.PReLU, isnan/isinf, one_hot, torch.gather and GroupNorm/instance_norm.
"""
from __future__ import annotations

import numpy as np

from .onnx_base import Rule, axis_of, static, tensors
from .onnx_import import OnnxImportError


def _axis_input(ins, i, what):
    return int(np.asarray(static(ins[i], what)).reshape(()))


def _shift(y, a: int):
    """y moved one step along axis a, a zero entering: the exclusive scan of an inclusive one."""
    n = y.shape[a]
    head = y[(slice(None),) * a + (slice(0, n - 1),)]
    low = [0] * y.ndim
    low[a] = 1
    return y.scope.emit("rlx.pad", [head], low=tuple(low), high=(0,) * y.ndim)


def _cumsum(cx, node, ins, at):
    x = cx.T(ins[0])
    a = axis_of(_axis_input(ins, 1, "CumSum's axis"), x.ndim, "axis")
    rev = bool(at.get("reverse", 0))
    if rev:
        x = x.flip(a)
    y = x.cumsum(a)
    if at.get("exclusive", 0):
        y = _shift(y, a)
    return y.flip(a) if rev else y


def _topk(cx, node, ins, at):
    x = cx.T(ins[0])
    k = int(np.asarray(static(ins[1], "TopK's K")).reshape(-1)[0])
    a = axis_of(at.get("axis", -1), x.ndim, "axis")
    largest = bool(at.get("largest", 1))
    vals, idx = (x if largest else -x).topk(k, a)
    return [vals if largest else -vals, idx.cast("i64")]


def _trilu(cx, node, ins, at):
    from rlxc.tensor import where

    x = cx.T(ins[0])
    k = _axis_input(ins, 1, "Trilu's k") if len(ins) > 1 and ins[1] is not None else 0
    n, m = x.shape[-2:]
    if isinstance(n, str) or isinstance(m, str):
        raise OnnxImportError(f"Trilu of {tuple(x.shape)}: its last two dims must be static")
    keep = (np.triu if at.get("upper", 1) else np.tril)(np.ones((n, m), np.bool_), k)
    return where(cx.s.constant(keep, "i1"), x, 0.0 if x.dtype in ("f32", "f64") else 0)


def _prelu(cx, node, ins, at):
    from rlxc.tensor import where

    x, slope = tensors(cx, *ins[:2])
    return where(x < 0, x * slope, x)


def _isnan(cx, node, ins, at):
    x = cx.T(ins[0])
    return x != x


def _isinf(cx, node, ins, at):
    x = cx.T(ins[0])
    pos, neg = at.get("detect_positive", 1), at.get("detect_negative", 1)
    if pos and neg:
        return x.abs() == float("inf")
    if pos:
        return x == float("inf")
    if neg:
        return x == float("-inf")
    return (x != x) & (x == x)   # neither: all False (NaN too), of x's shape


def _one_hot(cx, node, ins, at):
    i = cx.T(ins[0])
    depth = int(np.asarray(static(ins[1], "OneHot's depth")).reshape(-1)[0])
    vals = np.asarray(static(ins[2], "OneHot's values")).reshape(-1)
    dt = cx.dtype_of(vals)   # torch's F.one_hot writes int64 values [0, 1]
    if dt not in ("f32", "f64", "i32", "i64"):
        raise OnnxImportError(f"OneHot with {vals.dtype} values")
    off, on = (float(vals[0]), float(vals[1])) if dt[0] == "f" else (int(vals[0]), int(vals[1]))
    if i.dtype not in ("i32", "i64"):
        i = i.cast("i64")
    from rlxc.tensor import where

    i = where(i < 0, i + depth, i)                      # [-depth, -1] count from the end
    y = i.one_hot(depth, dt)
    if (off, on) != (0, 1):
        y = y * (on - off) + off
    a = axis_of(at.get("axis", -1), y.ndim, "axis")
    if a != y.ndim - 1:
        perm = list(range(y.ndim - 1))
        perm.insert(a, y.ndim - 1)
        y = y.transpose(tuple(perm))
    return y


def _gather_elements(cx, node, ins, at):
    from rlxc.tensor import where

    data = cx.T(ins[0])
    idx = cx.T(ins[1])
    a = axis_of(at.get("axis", 0), data.ndim, "axis")
    if idx.ndim != data.ndim:
        raise OnnxImportError(f"GatherElements: indices of rank {idx.ndim} for data of rank "
                              f"{data.ndim}")
    if any(isinstance(d, str) for d in idx.shape):
        raise OnnxImportError(f"GatherElements with indices of shape {tuple(idx.shape)}: "
                              "static shapes only")
    n = data.shape[a]
    key = []
    for d in range(data.ndim):
        if d == a:
            key.append(where(idx < 0, idx + n, idx))
        else:
            shape = [1] * data.ndim
            shape[d] = idx.shape[d]
            key.append(np.arange(idx.shape[d]).reshape(shape))
    return data[tuple(key)]


def _instance_norm(cx, node, ins, at):
    x = cx.T(ins[0])
    scale, bias = (cx.T(v, x) for v in ins[1:3])
    c = (x.shape[1],) + (1,) * (x.ndim - 2)
    y = x.layer_norm(tuple(range(2, x.ndim)), float(at.get("epsilon", 1e-5)))
    return y * scale.reshape(c) + bias.reshape(c)


def _sce_loss(cx, node, ins, at):
    """SoftmaxCrossEntropyLoss: log_softmax over axis 1, the labels' entries (a mask, never
    a product with -inf), weights[label], ignore_index (loss and weight 0), reduced."""
    from rlxc.tensor import where

    x = cx.T(ins[0])
    y = cx.T(ins[1])
    if y.dtype not in ("i32", "i64"):
        raise OnnxImportError(f"SoftmaxCrossEntropyLoss: labels of dtype {y.dtype}")
    c = x.shape[1]
    if isinstance(c, str):
        raise OnnxImportError("SoftmaxCrossEntropyLoss: the class axis (1) must be static")
    lp = x.log_softmax(1)
    ign = at.get("ignore_index")
    keep = (y != int(ign)) if ign is not None else None
    ys = where(keep, y, 0) if keep is not None else y
    iota = np.arange(c).reshape((1, c) + (1,) * (x.ndim - 2))
    hit = ys.expand_dims(1) == cx.s.constant(iota, ys.dtype)
    loss = -(where(hit, lp, 0.0).sum(1))
    w = None
    if len(ins) > 2 and ins[2] is not None:
        w = cx.T(ins[2], x).take(ys, 0)
    if keep is not None:
        k = keep.cast(x.dtype)
        w = k if w is None else w * k
    if w is not None:
        loss = loss * w
    red = at.get("reduction", b"mean")
    red = red.decode() if isinstance(red, bytes) else red
    if red == "none":
        out = loss
    elif red == "sum":
        out = loss.sum()
    elif red == "mean":   # weighted: by the weights' sum (ignored entries weigh 0)
        out = loss.mean() if w is None else loss.sum() / w.sum()
    else:
        raise OnnxImportError(f"SoftmaxCrossEntropyLoss: reduction {red!r}")
    return [out, lp]


MORE_RULES: dict[str, Rule] = {
    "CumSum": Rule(_cumsum, static_inputs=(1,)),
    "TopK": Rule(_topk, static_inputs=(1,)),
    "Trilu": Rule(_trilu, static_inputs=(1,)),
    "PRelu": Rule(_prelu),
    "IsNaN": Rule(_isnan), "IsInf": Rule(_isinf),
    "OneHot": Rule(_one_hot, static_inputs=(1, 2)),
    "GatherElements": Rule(_gather_elements),
    "InstanceNormalization": Rule(_instance_norm),
    "SoftmaxCrossEntropyLoss": Rule(_sce_loss),
}

__all__ = ["MORE_RULES"]

"""One test case per rlx op: a traced builder, a hand-written NumPy oracle, inputs.

Shared by the dialect tests (print/parse/interpret) and the backend tests.
Inputs are chosen away from kinks and outside singular domains.
"""
from __future__ import annotations

import math

import numpy as np

import rlxc

rng = np.random.default_rng(0)


def _r(*shape, lo=-2.0, hi=2.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def _pos(*shape):
    return rng.uniform(0.3, 3.0, size=shape).astype(np.float32)


def _erf(x):
    return np.vectorize(math.erf)(x.astype(np.float64))


def _sig(x):
    return 1 / (1 + np.exp(-x.astype(np.float64)))


# name -> (build(scope, **inputs) -> Tensor, numpy oracle(**arrays), {input: array})
CASES = {}


def case(name, inputs, build, oracle):
    CASES[name] = (build, oracle, inputs)


def _unary(name, method, oracle, gen=_r):
    case(name, {"x": gen(3, 5)}, lambda s, x: getattr(x, method)(), oracle)


_unary("neg", "neg", lambda x: -x)
_unary("exp", "exp", np.exp)
_unary("log", "log", np.log, _pos)
_unary("sqrt", "sqrt", np.sqrt, _pos)
_unary("rsqrt", "rsqrt", lambda x: 1 / np.sqrt(x), _pos)
_unary("tanh", "tanh", np.tanh)
_unary("sigmoid", "sigmoid", _sig)
_unary("relu", "relu", lambda x: np.maximum(x, 0))
_unary("gelu", "gelu", lambda x: 0.5 * x * (1 + _erf(x / np.sqrt(2))))
_unary("gelu_tanh", "gelu_tanh",
       lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))))
_unary("silu", "silu", lambda x: x * _sig(x))
_unary("softplus", "softplus", lambda x: np.log1p(np.exp(x.astype(np.float64))))
_unary("abs", "abs", np.abs)
_unary("sin", "sin", np.sin)
_unary("cos", "cos", np.cos)
_unary("sign", "sign", np.sign)
_unary("reciprocal", "reciprocal", lambda x: 1 / x, _pos)
_unary("erf", "erf", _erf)
_unary("stop_gradient", "stop_gradient", lambda x: x)
_unary("floor", "floor", np.floor)
_unary("ceil", "ceil", np.ceil)
_HALVES = np.array([[-2.5, -1.5, -0.5, 0.5, 1.5], [2.5, -0.49, 0.51, 3.7, -3.7],
                    [0.0, -0.0, 1.0, -1.0, 2.0]], np.float32)
case("round", {"x": _HALVES}, lambda s, x: x.round(), np.round)  # halves to even
# numerators whose quotients are not near an integer (f32 and f64 floor alike)
_NUM = (np.array([[0.3, 1.7, 2.4], [-0.3, -1.7, -2.4], [3.6, -3.6, 1.1]]) * 1.25).astype(np.float32)
_DEN = np.array([[1.25, 1.25, -1.25], [1.25, -1.25, -1.25], [1.25, 1.25, -1.25]], np.float32)
case("fmod", {"x": _NUM * 3, "y": _DEN}, lambda s, x, y: x.fmod(y), np.fmod)
case("mod", {"x": _NUM * 3, "y": _DEN}, lambda s, x, y: x % y, np.remainder)
case("floordiv", {"x": _NUM * 3, "y": _DEN}, lambda s, x, y: x // y, np.floor_divide)
case("clip", {"x": _r(3, 5)}, lambda s, x: x.clip(-0.5, 1.0), lambda x: np.clip(x, -0.5, 1.0))
case("fake_quant", {"x": _r(4, 6)}, lambda s, x: x.fake_quant("e2m1"),
     lambda x: np.clip(np.sign(x) * np.array([0, .5, 1, 1.5, 2, 3, 4, 6])[
         np.abs(np.abs(x)[..., None] - np.array([0, .5, 1, 1.5, 2, 3, 4, 6])).argmin(-1)], -6, 6))

_BIN = {"add": (lambda x, y: x + y, np.add), "sub": (lambda x, y: x - y, np.subtract),
        "mul": (lambda x, y: x * y, np.multiply), "div": (lambda x, y: x / y, np.divide),
        "maximum": (lambda x, y: x.maximum(y), np.maximum),
        "minimum": (lambda x, y: x.minimum(y), np.minimum)}
for _n, (_b, _f) in _BIN.items():
    case(_n, {"x": _r(3, 4), "y": _r(4)}, (lambda b: lambda s, x, y: b(x, y))(_b), _f)
case("pow", {"x": _pos(3, 4), "y": _r(3, 4)}, lambda s, x, y: x ** y, np.power)
for _n, _f in {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
               "gt": np.greater, "ge": np.greater_equal}.items():
    case(_n, {"x": np.round(_r(3, 4)), "y": np.round(_r(1, 4))},
         (lambda m: lambda s, x, y: getattr(x, m)(y).cast("f32"))(_n),
         (lambda f: lambda x, y: f(x, y).astype(np.float32))(_f))
case("select", {"x": _r(3, 4), "y": _r(3, 4)}, lambda s, x, y: x.gt(y).where(x, y * 2),
     lambda x, y: np.where(x > y, x, y * 2))
for _n, _f in {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min,
               "prod": np.prod}.items():
    case(_n, {"x": _r(3, 4, 5, lo=0.5, hi=1.5)},
         (lambda m: lambda s, x: getattr(x, m)([0, 2], keepdims=False))(_n),
         (lambda f: lambda x: f(x, axis=(0, 2)))(_f))
    case(_n + "_keepdims", {"x": _r(3, 4, lo=0.5, hi=1.5)},
         (lambda m: lambda s, x: getattr(x, m)(-1, keepdims=True))(_n),
         (lambda f: lambda x: f(x, axis=-1, keepdims=True))(_f))
    case(_n + "_all", {"x": _r(4, 5, lo=0.5, hi=1.5)},
         (lambda m: lambda s, x: getattr(x, m)())(_n), (lambda f: lambda x: f(x))(_f))
case("matmul", {"x": _r(5, 4), "y": _r(4, 3)}, lambda s, x, y: x @ y, np.matmul)
case("matmul_batched", {"x": _r(2, 5, 4), "y": _r(4, 3)}, lambda s, x, y: x @ y, np.matmul)
case("matmul_bcast", {"x": _r(2, 1, 5, 4), "y": _r(3, 4, 2)}, lambda s, x, y: x @ y, np.matmul)
case("matmul_vec", {"x": _r(4), "y": _r(4, 3)}, lambda s, x, y: x @ y, np.matmul)
case("transpose", {"x": _r(2, 3, 4)}, lambda s, x: x.transpose(2, 0, 1),
     lambda x: np.transpose(x, (2, 0, 1)))
case("T", {"x": _r(3, 4)}, lambda s, x: x.T, lambda x: x.T)
case("reshape", {"x": _r(3, 4)}, lambda s, x: x.reshape(2, -1), lambda x: x.reshape(2, -1))
case("broadcast_to", {"x": _r(3, 1)}, lambda s, x: x.broadcast_to((2, 3, 4)),
     lambda x: np.broadcast_to(x, (2, 3, 4)))
case("expand_dims", {"x": _r(3, 4)}, lambda s, x: x.expand_dims(1), lambda x: x[:, None])
case("squeeze", {"x": _r(3, 1, 4)}, lambda s, x: x.squeeze(1), lambda x: x[:, 0])
case("slice", {"x": _r(6, 5)}, lambda s, x: x[1:5:2, 2:], lambda x: x[1:5:2, 2:])
case("narrow", {"x": _r(6, 5)}, lambda s, x: x.narrow(1, 1, 3), lambda x: x[:, 1:4])
case("pad", {"x": _r(2, 3)},
     lambda s, x: s.emit(rlxc.dialect.ops.PadOp, [x], low=(1, 0), high=(0, 2)),
     lambda x: np.pad(x, ((1, 0), (0, 2))))
case("concat", {"x": _r(2, 3), "y": _r(4, 3)}, lambda s, x, y: rlxc.concat([x, y, x], 0),
     lambda x, y: np.concatenate([x, y, x], 0))
case("gather", {"x": _r(10, 4)}, lambda s, x: x.gather(np.array([3, 0, 9, 3], np.int32)),
     lambda x: x[[3, 0, 9, 3]])
case("index_select", {"x": _r(3, 10)},
     lambda s, x: x.index_select(1, np.array([[1, 2], [9, 0]], np.int64)),
     lambda x: x[:, [[1, 2], [9, 0]]])
case("getitem_array", {"x": _r(5, 6)}, lambda s, x: x[[0, -1, 2, 2]], lambda x: x[[0, -1, 2, 2]])
case("getitem_two_arrays", {"x": _r(5, 6)}, lambda s, x: x[np.array([[0], [4]]), [1, -1, 3]],
     lambda x: x[np.array([[0], [4]]), [1, -1, 3]])
case("getitem_neg_step", {"x": _r(6, 5)}, lambda s, x: x[::-1, 4:0:-2],
     lambda x: x[::-1, 4:0:-2])
case("flip", {"x": _r(3, 4)}, lambda s, x: x.flip(), lambda x: np.flip(x))
case("scatter_add", {"x": _r(4, 3)},
     lambda s, x: s.emit(rlxc.dialect.ops.ScatterAddOp,
                         [s.constant(np.array([1, 3, 1, 0], np.int32)), x], axis=0, dim=5),
     lambda x: np.stack([x[3], x[0] + x[2], np.zeros(3), x[1], np.zeros(3)]))
case("cast", {"x": _r(3, 4, lo=-5, hi=5)}, lambda s, x: x.cast("i32").cast("f32"),
     lambda x: np.trunc(x))
case("where_fn", {"x": _r(3, 4)}, lambda s, x: rlxc.where(x.lt(0), 0.0, x),
     lambda x: np.where(x < 0, 0, x))
case("softmax", {"x": _r(3, 5)}, lambda s, x: x.softmax(),
     lambda x: np.exp(x) / np.exp(x).sum(-1, keepdims=True))
case("log_softmax", {"x": _r(3, 5)}, lambda s, x: x.log_softmax(),
     lambda x: x - np.log(np.exp(x).sum(-1, keepdims=True)))
case("logsumexp", {"x": _r(3, 5)}, lambda s, x: x.logsumexp(1),
     lambda x: np.log(np.exp(x).sum(1)))
case("layer_norm", {"x": _r(3, 8)}, lambda s, x: x.layer_norm(),
     lambda x: (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5))
case("rms_norm", {"x": _r(3, 8)}, lambda s, x: x.rms_norm(),
     lambda x: x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6))
case("linear", {"x": _r(3, 4), "w": _r(4, 2), "b": _r(2)}, lambda s, x, w, b: x.linear(w, b),
     lambda x, w, b: x @ w + b)
case("cross_entropy_labels", {"x": _r(4, 5)},
     lambda s, x: x.cross_entropy(s.constant(np.array([0, 4, 2, 2], np.int32))),
     lambda x: -np.mean((x - np.log(np.exp(x).sum(-1, keepdims=True)))[range(4), [0, 4, 2, 2]]))
case("cross_entropy_onehot", {"x": _r(2, 3), "t": np.array([[0, 1, 0], [.5, .5, 0]], np.float32)},
     lambda s, x, t: x.cross_entropy(t),
     lambda x, t: -np.mean((t * (x - np.log(np.exp(x).sum(-1, keepdims=True)))).sum(-1)))
case("mse", {"x": _r(3, 4), "y": _r(3, 4)}, lambda s, x, y: x.mse(y),
     lambda x, y: np.mean((x - y) ** 2))
case("scalar_ops", {"x": _r(3)}, lambda s, x: 2.0 - x * 3 + 1 / (x * x + 1) - (x ** 3.0),
     lambda x: 2 - x * 3 + 1 / (x * x + 1) - x ** 3)
case("rdiv_array", {"x": _pos(3)}, lambda s, x: np.array([1.0, 2.0, 3.0]) / x,
     lambda x: np.array([1.0, 2.0, 3.0]) / x)

# The NumPy elementwise family added with the mathlib kernels (issue 12, issue 20 item 4);
# own generator so the inputs of the cases above do not move.
_rng2 = np.random.default_rng(12)


def _u(lo, hi):
    return lambda *shape: _rng2.uniform(lo, hi, size=shape).astype(np.float32)


MATH_FAMILY = {   # op -> (NumPy oracle, input generator (its domain, away from poles))
    "expm1": (np.expm1, _u(-2, 2)), "log1p": (np.log1p, _u(-0.7, 3)),
    "exp2": (np.exp2, _u(-3, 3)), "log2": (np.log2, _u(0.2, 4)),
    "log10": (np.log10, _u(0.2, 4)), "tan": (np.tan, _u(-1.2, 1.2)),
    "atan": (np.arctan, _u(-3, 3)), "asin": (np.arcsin, _u(-0.9, 0.9)),
    "acos": (np.arccos, _u(-0.9, 0.9)), "sinh": (np.sinh, _u(-2, 2)),
    "cosh": (np.cosh, _u(-2, 2)), "asinh": (np.arcsinh, _u(-3, 3)),
    "acosh": (np.arccosh, _u(1.2, 4)), "atanh": (np.arctanh, _u(-0.8, 0.8)),
}
for _n, (_f, _g) in MATH_FAMILY.items():
    _unary(_n, _n, _f, _g)
MATH_FAMILY_BINARY = {"atan2": np.arctan2, "hypot": np.hypot}
for _n, _f in MATH_FAMILY_BINARY.items():   # y away from 0 keeps atan2 off its branch cut
    case(_n, {"x": _u(-2, 2)(3, 4), "y": _u(0.3, 2)(4)},
         (lambda m: lambda s, x, y: getattr(x, m)(y))(_n), _f)


# issue 15: indexing ops and randomness (rlxc/indexops.py, rlxc/random.py); own generator
_rng15 = np.random.default_rng(15)
_TIES = np.array([[1, 3, 3, -2, 0], [5, 5, 5, 5, 5], [-1, 2, 0.5, 2, -3]], np.float32)
_KEYF = np.array([3.5, 7.5], np.float32)        # a runtime key: cast i32 -> u32 (3, 7)


def _g15(*shape):
    return _rng15.uniform(-2, 2, size=shape).astype(np.float32)


def _philox_ref(key, shape, word=0):
    import philox_ref   # tests/philox_ref.py: pure-Python Philox-4x32-10
    return philox_ref.uniform(np.trunc(key).astype(np.int64), shape, word)


def _stable_topk(x, k):
    i = np.argsort(-x, axis=-1, kind="stable")[..., :k]
    return np.take_along_axis(x, i, -1), i.astype(np.int32)


case("argmax", {"x": _TIES}, lambda s, x: x.argmax(1), lambda x: np.argmax(x, 1).astype(np.int32))
case("argmin", {"x": _TIES}, lambda s, x: x.argmin(0), lambda x: np.argmin(x, 0).astype(np.int32))
case("argmax_all", {"x": _g15(3, 4)}, lambda s, x: x.argmax(), lambda x: np.int32(np.argmax(x)))
case("cumsum", {"x": _g15(3, 7)}, lambda s, x: x.cumsum(1), lambda x: np.cumsum(x, 1))
case("cumsum_axis0", {"x": _g15(5, 2, 3)}, lambda s, x: x.cumsum(0), lambda x: np.cumsum(x, 0))
case("topk_values", {"x": _g15(3, 7)}, lambda s, x: x.topk(3)[0],
     lambda x: _stable_topk(x, 3)[0])
case("topk_indices", {"x": _g15(2, 6, 3)}, lambda s, x: x.topk(2, axis=1)[1],
     lambda x: np.moveaxis(_stable_topk(np.moveaxis(x, 1, -1), 2)[1], -1, 1))
case("one_hot", {"x": _g15(2, 3) * 3 + 2.5}, lambda s, x: x.cast("i32").one_hot(5),
     lambda x: (np.trunc(x).astype(np.int64)[..., None] == np.arange(5)).astype(np.float32))
case("philox", {"k": _KEYF},
     lambda s, k: rlxc.random.uniform(k.cast("i32").cast("u32"), (4, 5)),
     lambda k: _philox_ref(k, (4, 5)))
case("dropout", {"x": _g15(4, 6), "k": _KEYF},
     lambda s, x, k: x.dropout(0.25, k.cast("i32").cast("u32")),
     lambda x, k: np.where(_philox_ref(k, (4, 6)) >= 0.25, x / 0.75, 0).astype(np.float32))
# The convolution family (rlxc/conv.py); NumPy oracles from the definitions, in float64.
_rng3 = np.random.default_rng(15)


def _c(*shape):
    return _rng3.uniform(-1, 1, size=shape).astype(np.float32)


def _np_conv2d(x, w, stride=(1, 1), pad=(0, 0, 0, 0), dil=(1, 1), groups=1):
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), pad[:2], pad[2:]))
    oh = (h + pad[0] + pad[1] - dil[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + pad[2] + pad[3] - dil[1] * (kw - 1) - 1) // stride[1] + 1
    y = np.zeros((n, o, oh, ow))
    og = o // groups
    for oc in range(o):
        g = oc // og
        for i in range(kh):
            for j in range(kw):
                win = xp[:, g * cg:(g + 1) * cg, i * dil[0]:i * dil[0] + (oh - 1) * stride[0] + 1:stride[0],
                         j * dil[1]:j * dil[1] + (ow - 1) * stride[1] + 1:stride[1]]
                y[:, oc] += np.einsum("nchw,c->nhw", win, w[oc, :, i, j])
    return y


def _np_pool(x, k, s, p, fn, fill):
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (p, p), (p, p)), constant_values=fill)
    oh, ow = (xp.shape[2] - k) // s + 1, (xp.shape[3] - k) // s + 1
    return fn(np.stack([xp[:, :, i:i + (oh - 1) * s + 1:s, j:j + (ow - 1) * s + 1:s]
                        for i in range(k) for j in range(k)]), axis=0)


case("conv2d", {"x": _c(2, 4, 7, 6), "w": _c(6, 2, 3, 2), "b": _c(6)},
     lambda s, x, w, b: x.conv2d(w, b, stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2),
     lambda x, w, b: _np_conv2d(x, w, (2, 1), (1, 1, 2, 2), (1, 2), 2) + b[:, None, None])
case("conv2d_relu_same", {"x": _c(2, 3, 6, 6), "w": _c(4, 3, 3, 3)},
     lambda s, x, w: x.conv2d(w, padding="same").relu(),
     lambda x, w: np.maximum(_np_conv2d(x, w, pad=(1, 1, 1, 1)), 0))
case("conv2d_depthwise", {"x": _c(2, 3, 5, 5), "w": _c(3, 1, 3, 3)},
     lambda s, x, w: x.conv2d(w, padding=1, groups=3),
     lambda x, w: _np_conv2d(x, w, pad=(1, 1, 1, 1), groups=3))
case("conv1d", {"x": _c(2, 3, 9), "w": _c(4, 3, 3)},
     lambda s, x, w: x.conv1d(w, stride=2, padding=1),
     lambda x, w: _np_conv2d(x[:, :, None], w[:, :, None], (1, 2), (0, 0, 1, 1))[:, :, 0])
# conv_transpose2d is the adjoint of conv2d: <conv_transpose2d(y, w), e_k> = <y, conv2d(e_k, w)>
case("conv_transpose2d", {"x": _c(2, 4, 3, 3), "w": _c(4, 3, 3, 2)},
     lambda s, x, w: x.conv_transpose2d(w, stride=2, padding=1, output_padding=1),
     lambda x, w: np.stack([np.einsum("nohw,nohw->n", x.astype(np.float64), _np_conv2d(
         np.eye(3 * 6 * 5)[k].reshape(1, 3, 6, 5).repeat(2, 0), w, (2, 2), (1, 1, 1, 1)))
         for k in range(3 * 6 * 5)], 1).reshape(2, 3, 6, 5))
# conv2d_filter_grad is the adjoint in w: dw[k] = <dy, conv2d(x, e_k)>
case("conv2d_filter_grad", {"x": _c(2, 4, 5, 5), "y": _c(2, 2, 3, 5)},
     lambda s, x, y: s.emit("rlx.conv2d_filter_grad", [x, y], stride=(2, 1), padding=(0, 1, 1, 0),
                            dilation=(1, 1), groups=2, kernel=(2, 2)),
     lambda x, y: np.array([np.sum(y.astype(np.float64) * _np_conv2d(
         x, np.eye(2 * 2 * 2 * 2)[k].reshape(2, 2, 2, 2), (2, 1), (0, 1, 1, 0), (1, 1), 2))
         for k in range(16)]).reshape(2, 2, 2, 2))
case("max_pool2d", {"x": _c(2, 3, 7, 6)}, lambda s, x: x.max_pool2d(3, 2, padding=1),
     lambda x: _np_pool(x, 3, 2, 1, np.max, -np.inf))
case("max_pool2d_relu", {"x": _c(2, 3, 6, 6)}, lambda s, x: x.relu().max_pool2d(2),
     lambda x: _np_pool(np.maximum(x, 0), 2, 2, 0, np.max, 0))
case("avg_pool2d", {"x": _c(2, 3, 7, 6)}, lambda s, x: x.avg_pool2d(3, 2, padding=1),
     lambda x: _np_pool(x, 3, 2, 1, np.mean, 0))
case("upsample_nearest2d", {"x": _c(2, 3, 2, 3)}, lambda s, x: x.upsample_nearest2d((2, 3)),
     lambda x: x.repeat(2, axis=2).repeat(3, axis=3))


def make_func(name):
    build, oracle, inputs = CASES[name]
    names = list(inputs)

    def b(s):
        ts = {k: s.input(k, v.shape, "f32") for k, v in inputs.items()}
        return build(s, **ts)

    return rlxc.Func("case_" + name.replace("-", "_"), b), oracle, inputs, names


# ---- attention and einsum (issue 15); own generator so the inputs above do not move
_rng3 = np.random.default_rng(15)


def _a(*shape):
    return _rng3.normal(size=shape).astype(np.float32)


def _attn_oracle(q, k, v, allowed=None, scale=None, softcap=None):
    """Naive NumPy attention: softmax over the allowed keys, zeros for an empty row."""
    s = q @ np.swapaxes(k, -1, -2) * (1 / np.sqrt(q.shape[-1]) if scale is None else scale)
    if softcap:
        s = softcap * np.tanh(s / softcap)
    allowed = np.ones(s.shape, bool) if allowed is None else np.broadcast_to(allowed, s.shape)
    e = np.where(allowed, np.exp(s - np.where(allowed, s, -np.inf).max(-1, keepdims=True)), 0)
    return (e / np.maximum(e.sum(-1, keepdims=True), 1e-300)) @ v


_ATTN_MASK = _rng3.uniform(size=(1, 2, 5, 6)) < 0.6
_ATTN_MASK[0, 1, 2] = False       # one fully masked row: zeros
case("attention_causal_softcap", {"q": _a(2, 2, 5, 4), "k": _a(2, 2, 6, 4), "v": _a(2, 2, 6, 4)},
     lambda s, q, k, v: rlxc.attention(q, k, v, mask="causal", softcap=1.5),
     lambda q, k, v: _attn_oracle(q, k, v, np.tril(np.ones((5, 6), bool)), softcap=1.5))
case("attention_tensor_mask", {"q": _a(2, 2, 5, 4), "k": _a(2, 2, 6, 4), "v": _a(2, 2, 6, 4)},
     lambda s, q, k, v: rlxc.attention(q, k, v, mask=_ATTN_MASK, scale=0.3),
     lambda q, k, v: _attn_oracle(q, k, v, _ATTN_MASK, scale=0.3))


def _lse_oracle(q, k, allowed, scale):
    """Row logsumexp over the allowed keys (0 for an empty row)."""
    s = np.where(np.broadcast_to(allowed, q.shape[:3] + k.shape[2:3]),
                 q @ np.swapaxes(k, -1, -2) * scale, -np.inf)
    mx = s.max(-1, keepdims=True)
    mx = np.where(np.isinf(mx), 0, mx)
    den = np.exp(s - mx).sum(-1, keepdims=True)
    return mx + np.log(np.where(den == 0, 1, den))


def _attn_bwd_oracle(q, k, v, do, allowed, scale):
    """[dq; dk; dv] of sum(attention(q, k, v) * do), softmax derivative written out."""
    s = q @ np.swapaxes(k, -1, -2) * scale
    allowed = np.broadcast_to(allowed, s.shape)
    e = np.where(allowed, np.exp(s - np.where(allowed, s, -np.inf).max(-1, keepdims=True)), 0)
    p = e / np.maximum(e.sum(-1, keepdims=True), 1e-300)
    dp = do @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (p * dp).sum(-1, keepdims=True)) * scale
    return np.concatenate([ds @ k, np.swapaxes(ds, -1, -2) @ q, np.swapaxes(p, -1, -2) @ do], 2)


_AP = dict(scale=0.3, softcap=0.0, kind="tensor", window=0)
case("attention_lse", {"q": _a(2, 2, 5, 4), "k": _a(2, 2, 6, 4), "v": _a(2, 2, 6, 4)},
     lambda s, q, k, v: s.emit("rlx.attention_lse", [q, k, v, s.constant(_ATTN_MASK, "i1")],
                               **_AP),
     lambda q, k, v: _lse_oracle(q, k, _ATTN_MASK, 0.3))


def _attn_bwd_build(s, q, k, v, do):
    m = s.constant(_ATTN_MASK, "i1")
    o = s.emit("rlx.attention", [q, k, v, m], **_AP)
    lse = s.emit("rlx.attention_lse", [q, k, v, m], **_AP)
    return s.emit("rlx.attention_bwd", [q, k, v, o, do, lse, m], **_AP)


case("attention_bwd", {"q": _a(2, 2, 5, 4), "k": _a(2, 2, 6, 4), "v": _a(2, 2, 6, 4),
                       "do": _a(2, 2, 5, 4)}, _attn_bwd_build,
     lambda q, k, v, do: _attn_bwd_oracle(q, k, v, do, _ATTN_MASK, 0.3))
case("einsum_bmm", {"x": _a(2, 3, 4), "y": _a(2, 4, 5)},
     lambda s, x, y: rlxc.einsum("bij,bjk->bik", x, y), lambda x, y: np.einsum("bij,bjk->bik", x, y))
case("einsum_trace_diag", {"x": _a(3, 4, 4)},
     lambda s, x: rlxc.einsum("bii->bi", x) + rlxc.einsum("bii->b", x)[:, None],
     lambda x: np.einsum("bii->bi", x) + np.einsum("bii->b", x)[:, None])

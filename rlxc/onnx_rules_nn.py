"""ONNX rules for normalization, conv, pooling and resize (rows of RULES in
rlxc/onnx_rules.py).

BatchNormalization (inference form) and LayerNormalization are plain ops. Conv,
ConvTranspose, MaxPool and AveragePool call Tensor methods (conv2d, conv1d,
conv_transpose2d, max_pool2d, avg_pool2d); asymmetric conv pads become an explicit
rlx.pad. A pool with symmetric pads and floor sizes maps straight onto the method. Any
other pool (asymmetric pads, ceil_mode=1) pads explicitly to the full extent of its last
window (-inf for MaxPool: never the max) and pools unpadded; AveragePool then rescales
each output by kH*kW / (the number of cells its window counts): the real pixels without
count_include_pad, plus the explicit pads with it, never the ceil_mode overhang
(onnxruntime's and PyTorch's divisors), a constant computed with NumPy. Resize
(nearest, integer factors) is reshape + broadcast + reshape.
"""
from __future__ import annotations

import numpy as np

from .onnx_base import Rule, axis_of, ints_of, attr_text, static
from .onnx_import import OnnxImportError

# -- normalization ---------------------------------------------------------------------------
def batch_norm(cx, node, ins, at):
    x = cx.T(ins[0])
    scale, b, mean, var = (cx.T(v, x) for v in ins[1:5])
    eps = float(at.get("epsilon", 1e-5))
    shp = (x.shape[1],) + (1,) * (x.ndim - 2)
    k = scale * (var + eps).rsqrt()
    return (x - mean.reshape(shp)) * k.reshape(shp) + b.reshape(shp)


def batch_norm_unsupported(node, at, opset):
    if at.get("training_mode", 0):
        return "training_mode=1 (rlxc imports inference BatchNormalization)"
    if sum(1 for o in node.output if o) > 1:
        return "running mean/var outputs (training form)"
    return None


def layer_norm_unsupported(node, at, opset):
    extra = [o for o in node.output[1:] if o]
    return "the Mean/InvStdDev outputs" if extra else None


def layer_norm(cx, node, ins, at):
    x = cx.T(ins[0])
    axis = axis_of(at.get("axis", -1), x.ndim, "axis")
    w = cx.T(ins[1], x) if len(ins) > 1 and ins[1] is not None else None
    b = cx.T(ins[2], x) if len(ins) > 2 and ins[2] is not None else None
    return x.layer_norm(tuple(range(axis, x.ndim)), float(at.get("epsilon", 1e-5)), w, b)


# -- conv / pool (Tensor methods of rlxc/conv.py) ---------------------------------------------
def _one(v):
    v = tuple(int(x) for x in v)
    return v[0] if len(set(v)) == 1 else v


def _conv_pads(x_sp, k, strides, dil, at):
    """(begin, end) pads per spatial dim, from `pads` or `auto_pad`."""
    n = len(x_sp)
    auto = attr_text(at.get("auto_pad", "NOTSET"))
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        lo, hi = [], []
        for d, kk, s, dl in zip(x_sp, k, strides, dil):
            total = max((-(-d // s) - 1) * s + (kk - 1) * dl + 1 - d, 0)
            small = total // 2
            lo.append(small if auto == "SAME_UPPER" else total - small)
            hi.append(total - lo[-1])
        return lo, hi
    if auto == "VALID":
        return [0] * n, [0] * n
    p = list(at.get("pads", [0] * 2 * n))
    return p[:n], p[n:]


def conv(cx, node, ins, at):
    x = cx.T(ins[0])
    w = cx.T(ins[1], x)
    b = cx.T(ins[2], x) if len(ins) > 2 and ins[2] is not None else None
    n = x.ndim - 2
    k = w.shape[2:]
    strides = list(at.get("strides", [1] * n))
    dil = list(at.get("dilations", [1] * n))
    lo, hi = _conv_pads(x.shape[2:], k, strides, dil, at)
    if lo != hi:
        x = x.scope.emit("rlx.pad", [x], low=(0, 0, *lo), high=(0, 0, *hi))
        lo = [0] * n
    method = {1: "conv1d", 2: "conv2d"}.get(n)
    if method is None:
        raise OnnxImportError(f"{n}-d Conv: only 1-d and 2-d are supported")
    return getattr(x, method)(w, b, stride=_one(strides), padding=_one(lo),
                              dilation=_one(dil), groups=int(at.get("group", 1)))


def conv_transpose(cx, node, ins, at):
    x = cx.T(ins[0])
    w = cx.T(ins[1], x)
    b = cx.T(ins[2], x) if len(ins) > 2 and ins[2] is not None else None
    n = x.ndim - 2
    if n != 2:
        raise OnnxImportError(f"{n}-d ConvTranspose: only 2-d is supported")
    strides = list(at.get("strides", [1] * n))
    p = list(at.get("pads", [0] * 2 * n))
    if p[:n] != p[n:]:
        raise OnnxImportError(f"asymmetric pads {p}")
    return x.conv_transpose2d(w, b, stride=_one(strides), padding=_one(p[:n]),
                              output_padding=_one(at.get("output_padding", [0] * n)))


def conv_transpose_unsupported(node, at, opset):
    if int(at.get("group", 1)) != 1:
        return "group != 1"
    if any(d != 1 for d in at.get("dilations", [])):
        return "dilations != 1"
    if "output_shape" in at:
        return "output_shape attribute"
    if attr_text(at.get("auto_pad", "NOTSET")) != "NOTSET":
        return "auto_pad"
    return None


def _pool_extent(d, k, s, lo, hi, ceil):
    """(output size, extra end padding) of one spatial dim: with ceil_mode the last window
    may hang past the padded input, but must start inside the input or its begin pad."""
    span = d + lo + hi - k
    if span < 0:
        raise OnnxImportError(f"kernel {k} does not fit the padded size {d + lo + hi}")
    out = (-(-span // s) if ceil else span // s) + 1
    if ceil and (out - 1) * s >= d + lo:
        out -= 1
    return out, max((out - 1) * s + k - (d + lo + hi), 0)


def _pool_counts(x_sp, k, strides, lo, hi, extra, with_pads):
    """(1, 1, OH, OW) float32: how many cells of each window the average divides by."""
    full = [d + a + b + e for d, a, b, e in zip(x_sp, lo, hi, extra)]
    mask = np.zeros(full, np.float32)
    if with_pads:
        mask[:full[0] - extra[0], :full[1] - extra[1]] = 1
    else:
        mask[lo[0]:lo[0] + x_sp[0], lo[1]:lo[1] + x_sp[1]] = 1
    oh = (full[0] - k[0]) // strides[0] + 1
    ow = (full[1] - k[1]) // strides[1] + 1
    win = np.lib.stride_tricks.sliding_window_view(mask, k)[::strides[0], ::strides[1]]
    return win[:oh, :ow].sum(axis=(2, 3)).reshape(1, 1, oh, ow)


def pool(kind: str):
    def fn(cx, node, ins, at):
        x = cx.T(ins[0])
        k = list(at["kernel_shape"])
        if x.ndim != 4:
            raise OnnxImportError(f"{x.ndim - 2}-d {node.op_type}: only 2-d is supported")
        strides = list(at.get("strides", [1, 1]))
        lo, hi = _conv_pads(x.shape[2:], k, strides, [1, 1], at)
        ceil = bool(at.get("ceil_mode", 0))
        extra = [_pool_extent(d, kk, s, a, b, ceil)[1]
                 for d, kk, s, a, b in zip(x.shape[2:], k, strides, lo, hi)]
        simple = lo == hi and not any(extra) and all(p <= kk // 2 for p, kk in zip(lo, k))
        if simple and kind == "max":
            return x.max_pool2d(_one(k), stride=_one(strides), padding=_one(lo))
        if simple and (not any(lo) or at.get("count_include_pad", 0)):
            return x.avg_pool2d(_one(k), stride=_one(strides), padding=_one(lo))
        # explicit padding to the last window's end, then an unpadded pool
        real = _pool_counts(x.shape[2:], k, strides, lo, hi, extra, False)
        if not real.all():
            raise OnnxImportError(f"pads {lo + hi} with kernel {k}: a window covers "
                                  "only padding")
        end = [b + e for b, e in zip(hi, extra)]
        xp = x
        if any(lo) or any(end):
            xp = x.scope.emit("rlx.pad", [x], low=(0, 0, *lo), high=(0, 0, *end))
        if kind == "max":
            if any(lo) or any(end):
                from rlxc.tensor import where

                inside = np.zeros(xp.shape[2:], bool)
                inside[lo[0]:lo[0] + x.shape[2], lo[1]:lo[1] + x.shape[3]] = True
                xp = where(cx.s.constant(inside, "i1"), xp, -np.inf)
            return xp.max_pool2d(_one(k), stride=_one(strides))
        y = xp.avg_pool2d(_one(k), stride=_one(strides))
        counts = _pool_counts(x.shape[2:], k, strides, lo, hi, extra, True) \
            if at.get("count_include_pad", 0) else real
        return y * cx.s.constant((k[0] * k[1] / counts).astype(np.float32), x.dtype)
    return fn


def pool_unsupported(node, at, opset):
    if any(d != 1 for d in at.get("dilations", [])):
        return "dilations != 1"
    if node.op_type == "MaxPool" and len([o for o in node.output if o]) > 1:
        return "the Indices output"
    return None


def global_pool(kind):
    def fn(cx, node, ins, at):
        x = cx.T(ins[0])
        return getattr(x, kind)(tuple(range(2, x.ndim)), keepdims=True)
    return Rule(fn)


def _scale(size, dim, axis: int) -> float:
    """Resize's factor for one axis from its output size; a dynamic (dim_param) axis only
    at its own size (what interpolate(size=...) exports: Concat(Shape[:2], [H, W]))."""
    if size == dim:
        return 1.0
    if isinstance(size, str) or isinstance(dim, str):
        raise OnnxImportError(f"Resize of axis {axis} ({dim!r}) to {size!r}: a dynamic "
                              "dimension can only keep its size")
    return float(size) / dim


def _resize_factors(x_shape, ins, opset: int, axes=None):
    """(scale, output size) per axis: from `sizes` (scale = out / in) or `scales`
    (out = floor(in * scale))."""
    def opt(i):
        return ins[i] if len(ins) > i and ins[i] is not None else None
    # Resize-10's inputs are (X, scales); from opset 11 (X, roi, scales, sizes)
    scales, sizes = (opt(1), None) if opset < 11 else (opt(2), opt(3))
    r = len(x_shape)
    axes = [axis_of(a, r, "Resize's axis") for a in axes] if axes is not None else \
        list(range(r))
    fs, outs = [1.0] * r, list(x_shape)
    if sizes is not None and static(sizes, "Resize's sizes").size:
        for o, a in zip(ints_of(sizes), axes):   # opset 18 `axes`: these axes only
            fs[a], outs[a] = _scale(o, x_shape[a], a), o
    else:
        for v, a in zip(static(scales, "Resize's scales").reshape(-1), axes):
            fs[a] = float(v)
            if fs[a] != 1.0:
                if isinstance(x_shape[a], str):
                    raise OnnxImportError(f"Resize of axis {a}, the dynamic dimension "
                                          f"{x_shape[a]!r}: a dynamic dimension can only "
                                          "keep its size")
                outs[a] = int(np.floor(x_shape[a] * fs[a]))
    return fs, outs


def _source(n_in: int, n_out: int, scale: float, ct: str) -> np.ndarray:
    """ONNX's coordinate transformation: the input coordinate of each output one."""
    xo = np.arange(n_out, dtype=np.float64)
    if ct == "align_corners":
        return xo * ((n_in - 1) / (n_out - 1)) if n_out > 1 else np.zeros(n_out)
    if ct == "asymmetric":
        return xo / scale
    if ct == "pytorch_half_pixel" and n_out == 1:
        return np.zeros(1)
    return (xo + 0.5) / scale - 0.5   # half_pixel


def _linear(x, a: int, n_out: int, scale: float, ct: str):
    """Linear interpolation along axis a: the two neighbours of each source coordinate
    (clamped to the axis, as onnxruntime), weighted by the distance."""
    n = x.shape[a]
    src = np.clip(_source(n, n_out, scale, ct), 0, n - 1)
    i0 = np.floor(src).astype(np.int64)
    i1 = np.minimum(i0 + 1, n - 1)
    shape = [1] * x.ndim
    shape[a] = n_out
    w = x.scope.constant((src - i0).reshape(shape), x.dtype)
    x0, x1 = x.take(i0, a), x.take(i1, a)
    return x0 + (x1 - x0) * w


def resize(cx, node, ins, at):
    x = cx.T(ins[0])
    fs, outs = _resize_factors(x.shape, ins, cx.opset, at.get("axes"))
    if attr_text(at.get("mode", "nearest")) == "linear":
        ct = attr_text(at.get("coordinate_transformation_mode",   # Resize-10: asymmetric
                              "half_pixel" if cx.opset >= 11 else "asymmetric"))
        for a, (f, o) in enumerate(zip(fs, outs)):
            if f != 1.0 or o != x.shape[a]:
                x = _linear(x, a, o, f, ct)
        return x
    if any(not f.is_integer() or f < 1 for f in fs):
        raise OnnxImportError(f"nearest Resize with scales {fs}: only integer upsampling "
                              "factors are supported")
    fs = [int(f) for f in fs]
    if all(f == 1 for f in fs):
        return x
    inter = tuple(v for d in x.shape for v in (d, 1))
    full = tuple(v for d, f in zip(x.shape, fs) for v in (d, f))
    return x.reshape(inter).broadcast_to(full).reshape(tuple(d * f for d, f in
                                                            zip(x.shape, fs)))


def resize_unsupported(node, at, opset):
    mode = attr_text(at.get("mode", "nearest"))
    ct = attr_text(at.get("coordinate_transformation_mode", "half_pixel"))
    if at.get("antialias", 0):
        return "antialias=1"
    if attr_text(at.get("keep_aspect_ratio_policy", "stretch")) != "stretch":
        return f"keep_aspect_ratio_policy {attr_text(at['keep_aspect_ratio_policy'])!r}"
    if mode == "linear":
        linear = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric")
        return None if ct in linear else f"linear with coordinate_transformation_mode {ct!r}"
    if mode != "nearest":
        return f"mode {mode!r} (nearest and linear)"
    nm = attr_text(at.get("nearest_mode", "round_prefer_floor"))
    ok = (ct == "asymmetric" and nm == "floor") or \
        (ct in ("half_pixel", "pytorch_half_pixel") and nm in ("round_prefer_floor",
                                                               "round_prefer_ceil"))
    return None if ok else f"coordinate_transformation_mode {ct!r} with nearest_mode {nm!r}"

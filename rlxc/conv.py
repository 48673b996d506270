"""Convolution, pooling and upsampling on traced Tensors (PyTorch's layouts and arguments).

    x.conv2d(w, b=None, stride=1, padding=0, dilation=1, groups=1)     rlx.conv2d (+ bias add)
    x.conv1d(...)                          the same on (N, C, L): conv2d of (N, C, 1, L)
    x.conv_transpose2d(w, b=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1)
                                           rlx.conv_transpose2d (the VJP of conv2d in x)
    x.max_pool2d(kernel, stride=None, padding=0)   max over the windows, gathered at constant
                                           indices as (N, C, kH*kW, OH*OW); padding is
                                           -inf (a select), so it never wins; with
                                           stride == kernel and no padding, one max
                                           reduction over a (N, C, OH, kH, OW, kW) view
    x.avg_pool2d(kernel, stride=None, padding=0)   mean of the windows, zeros counted
                                           (count_include_pad=True, PyTorch's default)
    x.upsample_nearest2d(scale)            reshape, broadcast, reshape

`padding` is an int, a pair (h, w), "same" (stride 1; an odd total pads one more at the
bottom/right, like PyTorch) or "valid" (0).  The pools and upsampling are compositions of
primitive ops (gather, select, max/mean, reshape, broadcast_to), so every transform and backend
handles them and the elementwise fusion puts an activation before a pool into the pool's
kernel.  The batch dim N is never computed with.  Bad arguments raise ShapeError naming
the op and the shapes.
"""
from __future__ import annotations

import numpy as np

from rlxc.dialect.shapes import ShapeError, as_int


def _pair(v, what: str, name: str) -> tuple[int, int]:
    if isinstance(v, (tuple, list)):
        if len(v) != 2:
            raise ShapeError(f"{what}: {name} must be an int or a pair, got {tuple(v)}")
        return as_int(v[0], what, name), as_int(v[1], what, name)
    v = as_int(v, what, name)
    return v, v


def _padding(padding, kernel, stride, dilation, what: str) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) from an int, a pair, "same" or "valid"."""
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0, 0, 0)
        if padding != "same":
            raise ShapeError(f"{what}: padding must be an int, a pair, 'same' or 'valid', "
                             f"got {padding!r}")
        if stride != (1, 1):
            raise ShapeError(f"{what}: padding='same' needs stride 1, got {stride}")
        out = []
        for k, d in zip(kernel, dilation):
            total = d * (k - 1)
            out += [total // 2, total - total // 2]
        return tuple(out)
    ph, pw = _pair(padding, what, "padding")
    if ph < 0 or pw < 0:
        raise ShapeError(f"{what}: padding must be non-negative, got {(ph, pw)}")
    return (ph, ph, pw, pw)


def _check_rank(x, w, rank: int, what: str, layout: str):
    from rlxc.tensor import Tensor

    if not isinstance(w, Tensor):
        raise TypeError(f"{what}: the weight must be a Tensor (an input or param), "
                        f"got {type(w).__name__}")
    if x.ndim != rank or w.ndim != rank:
        raise ShapeError(f"{what}: input must be {layout} and the weight rank {rank}; got input "
                         f"{x.shape} and weight {w.shape}")


def _bias(y, b, what: str):
    if b is None:
        return y
    if tuple(b.shape) != (y.shape[1],):
        raise ShapeError(f"{what}: bias must have shape ({y.shape[1]},), got {tuple(b.shape)}")
    return y + b.reshape(y.shape[1], *(1,) * (y.ndim - 2))


def conv2d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    """2-D convolution: x (N, C, H, W), w (O, C/groups, kH, kW), b (O,) -> (N, O, OH, OW)."""
    what = "conv2d"
    _check_rank(x, w, 4, what, "NCHW (rank 4)")
    stride, dilation = _pair(stride, what, "stride"), _pair(dilation, what, "dilation")
    pad = _padding(padding, w.shape[2:], stride, dilation, what)
    groups = as_int(groups, what, "groups")
    y = x.scope.emit("rlx.conv2d", [x, w], stride=stride, padding=pad, dilation=dilation,
                     groups=groups)
    return _bias(y, b, what)


def conv1d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    """1-D convolution: x (N, C, L), w (O, C/groups, k), b (O,) -> (N, O, OL)."""
    what = "conv1d"
    _check_rank(x, w, 3, what, "NCL (rank 3)")
    s, d = as_int(stride, what, "stride"), as_int(dilation, what, "dilation")
    if isinstance(padding, str):
        pad = _padding(padding, (1, w.shape[2]), (1, s), (1, d), what)[2:]
    else:
        p = as_int(padding, what, "padding")
        pad = (p, p)
    n, c, length = x.shape
    y = x.scope.emit("rlx.conv2d", [x.reshape(n, c, 1, length),
                                    w.reshape(w.shape[0], w.shape[1], 1, w.shape[2])],
                     stride=(1, s), padding=(0, 0) + tuple(pad), dilation=(1, d),
                     groups=as_int(groups, what, "groups"))
    y = y.reshape(y.shape[0], y.shape[1], y.shape[3])
    return _bias(y, b, what)


def conv_transpose2d(x, w, b=None, stride=1, padding=0, output_padding=0, groups=1,
                     dilation=1):
    """Transposed convolution: x (N, Ci, H, W), w (Ci, Co/groups, kH, kW) -> (N, Co, OH, OW)."""
    what = "conv_transpose2d"
    _check_rank(x, w, 4, what, "NCHW (rank 4)")
    stride, dilation = _pair(stride, what, "stride"), _pair(dilation, what, "dilation")
    if isinstance(padding, str):
        raise ShapeError(f"{what}: padding must be an int or a pair, got {padding!r}")
    pad = _padding(padding, w.shape[2:], stride, dilation, what)
    y = x.scope.emit("rlx.conv_transpose2d", [x, w], stride=stride, padding=pad,
                     dilation=dilation, groups=as_int(groups, what, "groups"),
                     output_padding=_pair(output_padding, what, "output_padding"))
    return _bias(y, b, what)


def _pool_geometry(x, kernel, stride, padding, what):
    if x.ndim != 4:
        raise ShapeError(f"{what}: input must be NCHW (rank 4), got {x.shape}")
    k = _pair(kernel, what, "kernel")
    s = _pair(stride, what, "stride") if stride is not None else k
    p = _pair(padding, what, "padding")
    if min(k) < 1 or min(s) < 1 or min(p) < 0:
        raise ShapeError(f"{what}: kernel {k} and stride {s} must be positive, padding {p} "
                         "non-negative")
    if p[0] > k[0] // 2 or p[1] > k[1] // 2:
        raise ShapeError(f"{what}: padding {p} must be at most half the kernel {k}")
    h, w = x.shape[2] + 2 * p[0], x.shape[3] + 2 * p[1]
    oh, ow = (h - k[0]) // s[0] + 1, (w - k[1]) // s[1] + 1
    if oh < 1 or ow < 1:
        raise ShapeError(f"{what}: kernel {k} does not fit input {x.shape} padded by {p}")
    return k, s, p, oh, ow


def _pool_windows(xp, k, s, oh, ow):
    """(N, C, kH*kW, OH*OW): every window's pixels, one gather at constant indices."""
    n, c, hp, wp = xp.shape
    i, j, p, q = np.ix_(range(k[0]), range(k[1]), range(oh), range(ow))
    idx = ((p * s[0] + i) * wp + (q * s[1] + j)).reshape(k[0] * k[1], oh * ow)
    return xp.reshape(n, c, hp * wp).gather(idx.astype(np.int32), axis=2)


def _pad_hw(x, p):
    if not any(p):
        return x
    return x.scope.emit("rlx.pad", [x], low=(0, 0, p[0], p[1]), high=(0, 0, p[0], p[1]))


def _tiles(x, k, oh, ow):
    """Non-overlapping windows (stride == kernel, no padding) as dims 3 and 5 of a
    (N, C, OH, kH, OW, kW) view: the pool is then one reduction."""
    n, c = x.shape[:2]
    if (oh * k[0], ow * k[1]) != x.shape[2:]:
        x = x.slice((0, 0, 0, 0), (n, c, oh * k[0], ow * k[1]))
    return x.reshape(n, c, oh, k[0], ow, k[1])


def max_pool2d(x, kernel, stride=None, padding=0):
    """Max over kH x kW windows of NCHW x; padded positions are -inf (never the max).
    Ties within a window share the gradient evenly (the max reduction's rule)."""
    from rlxc.tensor import where

    k, s, p, oh, ow = _pool_geometry(x, kernel, stride, padding, "max_pool2d")
    if s == k and not any(p):
        return _tiles(x, k, oh, ow).max((3, 5))
    xp = _pad_hw(x, p)
    if any(p):
        inside = np.zeros(xp.shape[2:], bool)
        inside[p[0]:p[0] + x.shape[2], p[1]:p[1] + x.shape[3]] = True
        xp = where(x.scope.constant(inside, "i1"), xp, -np.inf)
    return _pool_windows(xp, k, s, oh, ow).max(2).reshape(x.shape[0], x.shape[1], oh, ow)


def avg_pool2d(x, kernel, stride=None, padding=0):
    """Mean over kH x kW windows of NCHW x, padded zeros included (count_include_pad)."""
    k, s, p, oh, ow = _pool_geometry(x, kernel, stride, padding, "avg_pool2d")
    if s == k and not any(p):
        return _tiles(x, k, oh, ow).mean((3, 5))
    win = _pool_windows(_pad_hw(x, p), k, s, oh, ow)
    return win.mean(2).reshape(x.shape[0], x.shape[1], oh, ow)


def upsample_nearest2d(x, scale):
    """Repeat each pixel of NCHW x scale times along H and W (an int or a pair)."""
    what = "upsample_nearest2d"
    if x.ndim != 4:
        raise ShapeError(f"{what}: input must be NCHW (rank 4), got {x.shape}")
    sh, sw = _pair(scale, what, "scale")
    if sh < 1 or sw < 1:
        raise ShapeError(f"{what}: scale must be positive, got {(sh, sw)}")
    n, c, h, w = x.shape
    y = x.reshape(n, c, h, 1, w, 1).broadcast_to((n, c, h, sh, w, sw))
    return y.reshape(n, c, h * sh, w * sw)


METHODS = {"conv2d": conv2d, "conv1d": conv1d, "conv_transpose2d": conv_transpose2d,
           "max_pool2d": max_pool2d, "avg_pool2d": avg_pool2d,
           "upsample_nearest2d": upsample_nearest2d}


def install(cls) -> None:
    """Make each function a method of Tensor (x.conv2d(w, ...))."""
    for name, fn in METHODS.items():
        setattr(cls, name, fn)


__all__ = list(METHODS)

"""Shape functions of the convolution family (NCHW, PyTorch layouts): no xDSL.

    rlx.conv2d             x (N, C, H, W), w (O, C/g, kH, kW)        -> (N, O, OH, OW)
    rlx.conv_transpose2d   y (N, Ci, H, W), w (Ci, Co/g, kH, kW)     -> (N, Co, OH, OW)
    rlx.conv2d_filter_grad x (N, C, H, W), dy (N, O, OH, OW)         -> (O, C/g, kH, kW)

Parameters (all ops): `stride` (sh, sw), `padding` (top, bottom, left, right: asymmetric,
so "same" with even kernels is exact), `dilation` (dh, dw), `groups`; conv_transpose2d
adds `output_padding` (oh, ow) and conv2d_filter_grad the `kernel` size (kH, kW).

    OH = (H + top + bottom - dh*(kH-1) - 1) // sh + 1              (conv2d)
    OH = (H - 1)*sh - top - bottom + dh*(kH-1) + output_padding + 1 (conv_transpose2d)

conv_transpose2d is the adjoint of conv2d in x and conv2d_filter_grad its adjoint in w, so
the three ops close under differentiation (dialect/autodiff.py).  The batch dim N is only
ever passed through (never computed with), so a symbolic N stays a symbol.  Registered
into shapes.SHAPES by shapes.py (one row per op at the end of this file).
"""
from __future__ import annotations

from rlxc.runtime.errors import ShapeError

CONV_PARAMS = {"stride": "ints", "padding": "ints", "dilation": "ints", "groups": "int"}


def _check_params(op, stride, padding, dilation, groups):
    if len(stride) != 2 or min(stride) < 1:
        raise ShapeError(f"{op}: stride must be two positive ints, got {tuple(stride)}")
    if len(dilation) != 2 or min(dilation) < 1:
        raise ShapeError(f"{op}: dilation must be two positive ints, got {tuple(dilation)}")
    if len(padding) != 4 or min(padding) < 0:
        raise ShapeError(f"{op}: padding must be four non-negative ints (top, bottom, left, "
                         f"right), got {tuple(padding)}")
    if groups < 1:
        raise ShapeError(f"{op}: groups must be >= 1, got {groups}")


def _operands(op, types, what_b, stride, padding, dilation, groups):
    """The two operands (input, `what_b`) of a conv-family op, checked with its params."""
    a, b = types
    _float_pair(op, a, b, "input", what_b)
    _check_params(op, stride, padding, dilation, groups)
    return a, b


def _float_pair(op, a, b, what_a, what_b):
    if a.dtype != b.dtype or a.dtype not in ("f32", "f64"):
        raise ShapeError(f"{op}: {what_a} and {what_b} must be float tensors of one dtype, "
                         f"got {a} and {b}")
    if len(a.shape) != 4 or len(b.shape) != 4:
        raise ShapeError(f"{op}: {what_a} and {what_b} must have rank 4, got {a.shape} and "
                         f"{b.shape}")


def conv_out(size, lo, hi, k, s, d):
    """Output length of a convolution along one dim (< 1 when the window does not fit)."""
    return (size + lo + hi - d * (k - 1) - 1) // s + 1


def conv_out2d(h, w, kernel, stride, padding, dilation):
    """(OH, OW) of conv2d on an (h, w) image (padding = top, bottom, left, right)."""
    return (conv_out(h, padding[0], padding[1], kernel[0], stride[0], dilation[0]),
            conv_out(w, padding[2], padding[3], kernel[1], stride[1], dilation[1]))


def conv_transpose_out2d(h, w, kernel, stride, padding, dilation, output_padding):
    """(OH, OW) of conv_transpose2d on an (h, w) input (the formula in the module doc)."""
    return ((h - 1) * stride[0] - padding[0] - padding[1] + dilation[0] * (kernel[0] - 1)
            + output_padding[0] + 1,
            (w - 1) * stride[1] - padding[2] - padding[3] + dilation[1] * (kernel[1] - 1)
            + output_padding[1] + 1)


def _infer_conv2d(types, stride, padding, dilation, groups):
    x, w = _operands("conv2d", types, "weight", stride, padding, dilation, groups)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    if c % groups or o % groups or c // groups != cg:
        raise ShapeError(f"conv2d: input {x.shape} (C={c}) and weight {w.shape} do not fit "
                         f"groups={groups}: weight must be (O, C/groups, kH, kW) with O and C "
                         f"divisible by groups")
    oh, ow = conv_out2d(h, wd, (kh, kw), stride, padding, dilation)
    if kh < 1 or kw < 1 or oh < 1 or ow < 1:
        raise ShapeError(f"conv2d: kernel {(kh, kw)} (dilation {tuple(dilation)}) does not fit "
                         f"input {x.shape} padded by {tuple(padding)}")
    return (n, o, oh, ow), x.dtype


def _infer_conv_transpose2d(types, stride, padding, dilation, groups, output_padding):
    y, w = _operands("conv_transpose2d", types, "weight", stride, padding, dilation, groups)
    n, ci, h, wd = y.shape
    ci2, cog, kh, kw = w.shape
    if ci != ci2 or ci % groups:
        raise ShapeError(f"conv_transpose2d: input {y.shape} and weight {w.shape} do not fit "
                         f"groups={groups}: weight must be (C_in, C_out/groups, kH, kW)")
    if len(output_padding) != 2 or not all(0 <= p < s for p, s in zip(output_padding, stride)):
        raise ShapeError(f"conv_transpose2d: output_padding {tuple(output_padding)} must be "
                         f"non-negative and smaller than the stride {tuple(stride)}")
    oh, ow = conv_transpose_out2d(h, wd, (kh, kw), stride, padding, dilation, output_padding)
    if kh < 1 or kw < 1 or h < 1 or wd < 1 or oh < 1 or ow < 1:
        raise ShapeError(f"conv_transpose2d: input {y.shape}, weight {w.shape} and padding "
                         f"{tuple(padding)} give an empty output ({oh}, {ow})")
    return (n, cog * groups, oh, ow), y.dtype


def _infer_filter_grad(types, stride, padding, dilation, groups, kernel):
    op = "conv2d_filter_grad"
    x, dy = _operands(op, types, "output gradient", stride, padding, dilation, groups)
    n, c, h, wd = x.shape
    n2, o, oh, ow = dy.shape
    if len(kernel) != 2 or min(kernel) < 1:
        raise ShapeError(f"{op}: kernel must be two positive ints, got {tuple(kernel)}")
    kh, kw = kernel
    want = conv_out2d(h, wd, kernel, stride, padding, dilation)
    if n2 != n or c % groups or o % groups or (oh, ow) != want:
        raise ShapeError(f"{op}: output gradient {dy.shape} does not match conv2d of input "
                         f"{x.shape} with kernel {tuple(kernel)}, groups={groups} "
                         f"(expected (N, O, {want[0]}, {want[1]}))")
    return (o, c // groups, kh, kw), x.dtype


# (name, shape function, params) -- registered by dialect/shapes.py
CONV_SHAPES = {
    "conv2d": (_infer_conv2d, CONV_PARAMS),
    "conv_transpose2d": (_infer_conv_transpose2d, {**CONV_PARAMS, "output_padding": "ints"}),
    "conv2d_filter_grad": (_infer_filter_grad, {**CONV_PARAMS, "kernel": "ints"}),
}

"""NumPy reference semantics of the convolution family (the interpreter's rules).

Written from the definitions, independently of the lowering's decomposition
(dialect/conv_decompose.py), so the two check each other:

    conv2d            y[n, g*Og+o, p, q] = sum_{c,i,j} xpad[n, g*Cg+c, p*sh + i*dh, q*sw + j*dw]
                                                       * w[g*Og+o, c, i, j]
    conv_transpose2d  scatter-add of every input pixel times the kernel into a canvas at
                      (p*sh + i*dh, q*sw + j*dw), cropped by the padding
    filter_grad       dw[g*Og+o, c, i, j] = sum_{n,p,q} dy[n, g*Og+o, p, q] * xpad[...]

All three gather the kH*kW shifted strided windows of the padded input ("cols") and
contract them with einsum.
"""
from __future__ import annotations

import numpy as np

from .conv_shapes import conv_out2d, conv_transpose_out2d


def _cols(x, kernel, stride, padding, dilation):
    """(N, C, kH, kW, OH, OW): the strided windows of the zero-padded input."""
    n, c, h, w = x.shape
    kh, kw = kernel
    (sh, sw), (dh, dw) = stride, dilation
    xp = np.pad(x, ((0, 0), (0, 0), (padding[0], padding[1]), (padding[2], padding[3])))
    oh, ow = conv_out2d(h, w, kernel, stride, padding, dilation)
    cols = np.empty((n, c, kh, kw, oh, ow), x.dtype)
    for i in range(kh):
        for j in range(kw):
            cols[:, :, i, j] = xp[:, :, i * dh:i * dh + (oh - 1) * sh + 1:sh,
                                  j * dw:j * dw + (ow - 1) * sw + 1:sw]
    return cols


def conv2d(x, w, stride, padding, dilation, groups):
    o, cg, kh, kw = w.shape
    cols = _cols(x, (kh, kw), stride, padding, dilation)
    n, c, _, _, oh, ow = cols.shape
    cols = cols.reshape(n, groups, cg, kh, kw, oh, ow)
    wg = w.reshape(groups, o // groups, cg, kh, kw)
    y = np.einsum("ngcijpq,gocij->ngopq", cols, wg, optimize=True)
    return y.reshape(n, o, oh, ow)


def conv_transpose2d(y, w, stride, padding, dilation, groups, output_padding):
    n, ci, h, wd = y.shape
    _, cog, kh, kw = w.shape
    (sh, sw), (dh, dw) = stride, dilation
    oh, ow = conv_transpose_out2d(h, wd, (kh, kw), stride, padding, dilation, output_padding)
    hc = max((h - 1) * sh + dh * (kh - 1) + 1, padding[0] + oh)
    wc = max((wd - 1) * sw + dw * (kw - 1) + 1, padding[2] + ow)
    yg = y.reshape(n, groups, ci // groups, h, wd)
    wg = w.reshape(groups, ci // groups, cog, kh, kw)
    canvas = np.zeros((n, groups, cog, hc, wc), np.result_type(y, w))
    for i in range(kh):
        for j in range(kw):
            canvas[:, :, :, i * dh:i * dh + (h - 1) * sh + 1:sh, j * dw:j * dw + (wd - 1) * sw + 1:sw] \
                += np.einsum("ngcpq,gco->ngopq", yg, wg[:, :, :, i, j], optimize=True)
    canvas = canvas.reshape(n, groups * cog, hc, wc)
    return canvas[:, :, padding[0]:padding[0] + oh, padding[2]:padding[2] + ow]


def conv2d_filter_grad(x, dy, stride, padding, dilation, groups, kernel):
    kh, kw = kernel
    cols = _cols(x, kernel, stride, padding, dilation)
    n, c, _, _, oh, ow = cols.shape
    o = dy.shape[1]
    cols = cols.reshape(n, groups, c // groups, kh, kw, oh, ow)
    dyg = dy.reshape(n, groups, o // groups, oh, ow)
    dw = np.einsum("ngcijpq,ngopq->gocij", cols, dyg, optimize=True)
    return dw.reshape(o, c // groups, kh, kw)


EVAL_RULES = {
    "rlx.conv2d": conv2d,
    "rlx.conv_transpose2d": conv_transpose2d,
    "rlx.conv2d_filter_grad": conv2d_filter_grad,
}

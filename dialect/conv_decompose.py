"""The `rlx-decompose-conv` pass: the convolution family as pad/gather/slice/reshape/matmul.

    rlx.conv2d(x, w)                       im2col, then ONE (batched) GEMM in NCHW order:
      xpad = pad(x)                          cols[n, (c,i,j), (p,q)] = xpad[n, c, p*sh+i*dh, q*sw+j*dw]
      cols = gather(xpad, IDX)               one gather at constant indices (one kernel, not
                                             kH*kW window copies: LLVM time stays small)
      y    = w(g, O/g, C/g*kH*kW) @ cols(N, g, C/g*kH*kW, OH*OW)  -> (N, O, OH, OW)
    rlx.conv_transpose2d(y, w)             GEMM, then col2im:
      cols = w^T(g, Co/g*kH*kW, Ci/g) @ y(N, g, Ci/g, H*W)
      z    = crop(scatter_add(IDX, cols))    entry (co, i, j, p, q) adds into canvas pixel
                                             (p*sh + i*dh, q*sw + j*dw): one scatter kernel
    rlx.conv2d_filter_grad(x, dy)          dw^T = sum_n cols(N, g, K, L) @ dy^T(N, g, L, O/g)

A 1x1, stride-1, unpadded conv2d skips im2col (cols is x reshaped).  Depthwise conv2d
(one input and one output channel per group) is a weighted sum of the kH*kW windows, an
elementwise kernel, not M=1 GEMMs.  Every op emitted is a primitive the CPU and GPU
backends already lower (the matmuls reach the packed sgemm on the CPU), and the rewrite
runs right before lowering, after the transforms, so grad/jvp/vmap still see one op.
Epilogue chain: the conv's result, then each single-use value's only user while that is
a unary op, or a binary op whose other operand is a per-channel broadcast (the bias) or a
splat, is rebuilt on the groups-1 GEMM's own (N, O, OH*OW) result, the bias a per-row
value of each image's C; the CPU then runs bias + activation in the sgemm epilogue, not
as a pass over the conv output (the fusion cannot see through the reshape between).
After a rewrite the module is cleaned up (cse merges the forward's cols with the
filter gradient's).  The caller's module is never mutated: a clone is rewritten.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from .autodiff import Builder
from .ops import ConstantOp
from .types import dense_attr, dense_value, dtype_of, is_splat, tensor_type
from .conv_shapes import CONV_SHAPES
from .module import get_func

CONV_OPS = frozenset(f"rlx.{n}" for n in CONV_SHAPES)


def _pad_hw(b: Builder, x, padding):
    if not any(padding):
        return x
    return b.op("pad", x, low=(0, 0, padding[0], padding[2]), high=(0, 0, padding[1], padding[3]))


def _windows(b: Builder, x, kernel, stride, padding, dilation, oh, ow):
    """The kH*kW strided windows of the padded x, each (N, C, OH, OW), row-major in (i, j)."""
    n, c = x.shape[:2]
    (sh, sw), (dh, dw) = stride, dilation
    xp = _pad_hw(b, x, padding)
    out = []
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            out.append(b.op("slice", xp, starts=(0, 0, i * dh, j * dw),
                            limits=(n, c, i * dh + (oh - 1) * sh + 1, j * dw + (ow - 1) * sw + 1),
                            strides=(1, 1, sh, sw)))
    return out


def _const(b: Builder, array, dtype: str):
    op = ConstantOp.create(result_types=[tensor_type(array.shape, dtype)],
                           properties={"value": dense_attr(array, dtype)})
    b.block.insert_op_before(op, b.anchor)
    return b.wrap(op.results[0])


def _cols(b: Builder, x, kernel, stride, padding, dilation, oh, ow, g):
    """(N, g, C/g*kH*kW, OH*OW): im2col as ONE gather of the padded image's pixels at
    constant indices (K ordered (c, i, j), the weight's own order); a plain reshape
    for a 1x1 stride-1 conv."""
    n, c = x.shape[:2]
    if tuple(kernel) == (1, 1) and tuple(stride) == (1, 1) and not any(padding):
        return b.reshape(x, (n, g, c // g, oh * ow))
    xp = _pad_hw(b, x, padding)
    hp, wp = xp.shape[2:]
    (sh, sw), (dh, dw) = stride, dilation
    ch, i, j, p, q = np.ix_(range(c), range(kernel[0]), range(kernel[1]), range(oh), range(ow))
    idx = ch * (hp * wp) + (p * sh + i * dh) * wp + (q * sw + j * dw)   # (C, kH, kW, OH, OW)
    cols = b.op("gather", b.reshape(xp, (n, c * hp * wp)), _const(b, idx.astype(np.int32), "i32"),
                axis=1, label="")
    return b.reshape(cols, (n, g, (c // g) * kernel[0] * kernel[1], oh * ow))


def _w_rows(b: Builder, w, g):
    """(O, C/g, kH, kW) -> (g, O/g, C/g*kH*kW): K in the (c, i, j) order of _cols."""
    o, cg, kh, kw = w.shape
    return b.reshape(w, (g, o // g, cg * kh * kw))


def _squeeze_groups(b: Builder, v, g):
    """Drop the group dim (axis -3) when there is one group: a plain 2-D/3-D GEMM."""
    return b.reshape(v, v.shape[:-3] + v.shape[-2:]) if g == 1 else v


def _tree_sum(terms):
    while len(terms) > 1:
        terms = [terms[k] + terms[k + 1] if k + 1 < len(terms) else terms[k]
                 for k in range(0, len(terms), 2)]
    return terms[0]


def _channel_vector(v, o: int):
    """The (O,) values whose broadcast `v` is (a (O, 1, 1) / (1, O, 1, 1) vector broadcast
    to NCHW), or None."""
    d = v.owner
    if getattr(d, "name", "") != "rlx.broadcast_to":
        return None
    src = d.operands[0]
    shp = tuple(src.type.get_shape())
    shp = (1,) * (4 - len(shp)) + shp
    return src if len(shp) == 4 and shp == (1, o, 1, 1) else None


def _splat(v):
    d = v.owner
    return d if isinstance(d, ConstantOp) and is_splat(d.value) else None


def _epilogue_chain(op) -> list:
    """The elementwise ops that follow conv2d `op` and can run in its GEMM's epilogue (see
    the header): each the only user of the previous value, f32, of the conv's shape."""
    o = op.results[0].type.get_shape()[1]
    chain, r = [], op.results[0]
    while r.has_one_use():
        e = r.get_user_of_unique_use()
        fam = getattr(e, "FAMILY", "")
        if fam not in ("unary", "binary") or e.results[0].type != r.type:
            break
        others = [v for v in e.operands if v is not r]
        if len(others) != len(e.operands) - 1 or not all(
                _channel_vector(v, o) is not None or _splat(v) is not None for v in others):
            break
        chain.append(e)
        r = e.results[0]
    return chain


def _replay(b: Builder, op, chain, y, other):
    """Rebuild `chain` (see _epilogue_chain) on y, which stands for conv `op`'s result;
    `other(v)` maps each operand that is not the chain's own value."""
    cur = op.results[0]
    for e in chain:
        y = b.emit(type(e), [y if v is cur else other(v) for v in e.operands], **e.params())
        cur = e.results[0]
    return y


def _conv2d(b: Builder, op, chain=()):
    x, w = (b.wrap(o) for o in op.operands)
    p = op.params()
    n, c = x.shape[:2]
    o, cg, kh, kw = w.shape
    oh, ow = op.results[0].type.get_shape()[2:]
    g = p["groups"]
    args = ((kh, kw), p["stride"], p["padding"], p["dilation"], oh, ow)
    if cg == 1 and o == g:   # depthwise: sum_ij window_ij * w[:, 0, i, j]
        wins = _windows(b, x, *args)
        terms = []
        for k, win in enumerate(wins):
            wk = b.op("slice", w, starts=(0, 0, k // kw, k % kw), limits=(o, 1, k // kw + 1, k % kw + 1),
                      strides=(1, 1, 1, 1))
            terms.append(win * b.broadcast_to(b.reshape(wk, (o, 1, 1)), win.shape))
        return _replay(b, op, chain, _tree_sum(terms), b.wrap)
    cols = _squeeze_groups(b, _cols(b, x, *args, g), g)
    y = b.op("matmul", _squeeze_groups(b, _w_rows(b, w, g), g), cols)
    if g == 1:   # the epilogue chain on the GEMM's own (N, O, OH*OW) result: the bias is
        #          a per-row value of each image's C, fused into the sgemm epilogue
        def other(v):
            vec = _channel_vector(v, o)
            if vec is not None:
                return b.broadcast_to(b.reshape(b.wrap(vec), (1, o, 1)), y.shape)
            return b.full(float(dense_value(_splat(v).value).reshape(-1)[0]), y.shape,
                          dtype_of(v.type))
        return b.reshape(_replay(b, op, chain, y, other), (n, o, oh, ow))
    return _replay(b, op, chain, b.reshape(y, (n, o, oh, ow)), b.wrap)


def _conv_transpose2d(b: Builder, op):
    y, w = (b.wrap(o) for o in op.operands)
    p = op.params()
    n, ci, h, wd = y.shape
    _, cog, kh, kw = w.shape
    g = p["groups"]
    co = cog * g
    oh, ow = op.results[0].type.get_shape()[2:]
    (sh, sw), (dh, dw), pad = p["stride"], p["dilation"], p["padding"]
    kk = cog * kh * kw
    if g == 1:
        wt = b.transpose(b.reshape(w, (ci, kk)), (1, 0))
        cols = b.op("matmul", wt, b.reshape(y, (n, ci, h * wd)))
    else:
        wt = b.transpose(b.reshape(w, (g, ci // g, kk)), (0, 2, 1))
        cols = b.op("matmul", wt, b.reshape(y, (n, g, ci // g, h * wd)))
    # col2im: ONE scatter-add of every (i, j, p, q) column entry to its canvas pixel
    hc = max((h - 1) * sh + dh * (kh - 1) + 1, pad[0] + oh)
    wc = max((wd - 1) * sw + dw * (kw - 1) + 1, pad[2] + ow)
    i, j, p_, q = np.ix_(range(kh), range(kw), range(h), range(wd))
    idx = ((p_ * sh + i * dh) * wc + (q * sw + j * dw)).reshape(-1).astype(np.int32)
    z = b.op("scatter_add", _const(b, idx, "i32"), b.reshape(cols, (n, co, kh * kw * h * wd)),
             axis=2, dim=hc * wc, label="")
    z = b.reshape(z, (n, co, hc, wc))
    if (hc, wc) == (oh, ow):
        return z
    return b.op("slice", z, starts=(0, 0, pad[0], pad[2]), limits=(n, co, pad[0] + oh, pad[2] + ow),
                strides=(1, 1, 1, 1))


def _conv2d_filter_grad(b: Builder, op):
    x, dy = (b.wrap(o) for o in op.operands)
    p = op.params()
    n, c = x.shape[:2]
    o, oh, ow = dy.shape[1:]
    kh, kw = p["kernel"]
    g = p["groups"]
    cols = _squeeze_groups(b, _cols(b, x, (kh, kw), p["stride"], p["padding"], p["dilation"],
                                    oh, ow, g), g)
    # dw^T = cols @ dy^T summed over N: the transposed operand is the small dy
    dyt = b.mT(_squeeze_groups(b, b.reshape(dy, (n, g, o // g, oh * ow)), g))
    dwt = b.reduce("sum", b.op("matmul", cols, dyt), (0,))        # ([g,] kH*kW*C/g, O/g)
    return b.reshape(b.mT(dwt), (o, c // g, kh, kw))


DECOMPOSE = {
    "rlx.conv2d": _conv2d,
    "rlx.conv_transpose2d": _conv_transpose2d,
    "rlx.conv2d_filter_grad": _conv2d_filter_grad,
}
assert set(DECOMPOSE) == CONV_OPS


def decompose_conv(module: ModuleOp, clean: bool = True) -> ModuleOp:
    """`module`, or a rewritten clone of it, without convolution ops."""
    if not any(op.name in DECOMPOSE for op in get_func(module).body.block.ops):
        return module
    module = module.clone()
    block = get_func(module).body.block
    for op in list(block.ops):
        rule = DECOMPOSE.get(op.name)
        if rule is None:
            continue
        # conv2d also replaces its epilogue chain: built before the chain's last op, where
        # the chain's other operands (the bias) are defined too
        chain = _epilogue_chain(op) if op.name == "rlx.conv2d" else []
        last = chain[-1] if chain else op
        b = Builder(block, last)
        new = rule(b, op, chain) if chain else rule(b, op)
        last.results[0].replace_all_uses_with(new.v)
        for dead in reversed(chain):
            block.erase_op(dead)
        block.erase_op(op)
    if clean:
        from .passes import cleanup
        cleanup(module)
    return module


@dataclass(frozen=True)
class DecomposeConvPass(ModulePass):
    """Rewrite conv2d / conv_transpose2d / conv2d_filter_grad into primitives."""

    name = "rlx-decompose-conv"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        new = decompose_conv(op)
        if new is not op:
            from .vmap import replace_module_body
            replace_module_body(op, new)

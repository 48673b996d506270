"""ONNX models built with onnx.helper, one per operator family, with edge attributes.

Each case is (id, opset, nodes, inputs {name: array}, initializers {name: array},
outputs [(name, elem type)]). tests/test_onnx_ops.py builds the model, runs it in
onnxruntime and in rlxc, and compares. Shared with the benchmark-free smoke script.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

F, I64, B = TP.FLOAT, TP.INT64, TP.BOOL
_rng = np.random.default_rng(17)


def r(*shape, lo=None):
    a = _rng.normal(size=shape).astype(np.float32)
    return np.abs(a) + lo if lo is not None else a


def i64(*v):
    return np.asarray(v, np.int64)


def N(op, ins, outs, **at):
    return h.make_node(op, ins, outs if isinstance(outs, list) else [outs], **at)


X = r(2, 3, 4)
P = r(2, 3, 4, lo=0.1)
TIES = np.round(_rng.normal(size=(3, 5)) * 1.2).astype(np.float32)
IMG = r(2, 3, 4, 6)

CASES = [
    ("unary", 17, [N(op, ["x"], op) for op in (
        "Neg", "Abs", "Exp", "Tanh", "Sigmoid", "Relu", "Erf", "Softplus", "Sin", "Cos",
        "Floor", "Ceil", "Sign", "Round")] + [N(op, ["p"], op) for op in ("Log", "Sqrt",
                                                                           "Reciprocal")],
     {"x": X, "p": P}, {}, [(op, F) for op in ("Neg", "Abs", "Exp", "Tanh", "Sigmoid", "Relu",
                                               "Erf", "Softplus", "Sin", "Cos", "Floor",
                                               "Ceil", "Sign", "Round", "Log", "Sqrt",
                                               "Reciprocal")]),
    ("activations", 20, [N("LeakyRelu", ["x"], "lr", alpha=0.2), N("Elu", ["x"], "elu", alpha=0.5),
                         N("Gelu", ["x"], "ge"), N("Gelu", ["x"], "get", approximate="tanh"),
                         N("HardSigmoid", ["x"], "hs", alpha=0.3, beta=0.4),
                         N("HardSwish", ["x"], "hw"), N("Selu", ["x"], "se")],
     {"x": X}, {}, [(n, F) for n in ("lr", "elu", "ge", "get", "hs", "hw", "se")]),
    ("binary_broadcast", 17, [N("Add", ["a", "b"], "add"), N("Sub", ["b", "a"], "sub"),
                              N("Mul", ["a", "b"], "mul"), N("Div", ["a", "p"], "div"),
                              N("Pow", ["p", "two"], "pow2"), N("Pow", ["p", "b"], "powt"),
                              N("Min", ["a", "b", "c"], "min3"), N("Max", ["a", "b"], "max2"),
                              N("Sum", ["a", "b", "c"], "sum3"), N("Mean", ["a", "b"], "mean2"),
                              N("Mod", ["a", "b"], "fmod", fmod=1)],
     {"a": r(3, 1, 4), "b": r(5, 4), "p": r(3, 5, 4, lo=0.5)},
     {"two": np.float32(2.0).reshape(()), "c": r(4)},
     [(n, F) for n in ("add", "sub", "mul", "div", "pow2", "powt", "min3", "max2", "sum3",
                       "mean2", "fmod")]),
    ("compare_logic_where_cast", 17, [
        N("Less", ["a", "b"], "lt"), N("Greater", ["a", "b"], "gt"),
        N("Equal", ["t", "u"], "eq"), N("LessOrEqual", ["t", "u"], "le"),
        N("Not", ["lt"], "nlt"), N("And", ["le", "eq"], "and"), N("Or", ["gt", "lt"], "or"),
        N("Xor", ["gt", "lt"], "xor"), N("Where", ["lt", "a", "b"], "wh"),
        N("Where", ["gt", "a", "zero"], "wh0"), N("Cast", ["a"], "ci", to=I64),
        N("Cast", ["lt"], "cf", to=F), N("Cast", ["a"], "cb", to=B)],
     {"a": r(3, 4) * 3, "b": r(4) * 3, "t": TIES, "u": TIES[::-1].copy()},
     {"zero": np.float32(0).reshape(())},
     [("lt", B), ("gt", B), ("eq", B), ("le", B), ("nlt", B), ("and", B), ("or", B),
      ("xor", B), ("wh", F), ("wh0", F), ("ci", I64), ("cf", F), ("cb", B)]),
    ("clip", 13, [N("Clip", ["x", "lo", "hi"], "c2"), N("Clip", ["x", "lo"], "c1"),
                  N("Clip", ["x", "", "hi"], "c0")],
     {"x": X}, {"lo": np.float32(-0.5).reshape(()), "hi": np.float32(0.7).reshape(())},
     [("c2", F), ("c1", F), ("c0", F)]),
    ("clip_opset6", 6, [N("Clip", ["x"], "c", min=-0.3, max=0.2)], {"x": X}, {}, [("c", F)]),
    ("matmul_gemm", 17, [
        N("MatMul", ["x", "w"], "mm"), N("MatMul", ["v", "w"], "mv"),
        N("MatMul", ["x", "w3"], "bmm"),
        N("Gemm", ["a", "b", "c"], "g1", transA=1, transB=1, alpha=0.5, beta=2.0),
        N("Gemm", ["a", "bt"], "g2", transA=1), N("Gemm", ["at", "bt", "c1"], "g3", beta=0.0)],
     {"x": X, "v": r(4), "a": r(5, 3)},
     {"w": r(4, 6), "w3": r(2, 4, 5), "b": r(4, 5), "bt": r(5, 4), "c": r(4), "at": r(3, 5),
      "c1": r(3, 4)},
     [(n, F) for n in ("mm", "mv", "bmm", "g1", "g2", "g3")]),
    ("einsum", 17, [N("Einsum", ["x", "w3"], "e1", equation="bij,bjk->bik"),
                    N("Einsum", ["x"], "e2", equation="bij->jb"),
                    N("Einsum", ["x"], "e3", equation="bij"),
                    N("Einsum", ["q", "k"], "e4", equation="bhqd,bhkd->bhqk"),
                    N("Einsum", ["x", "w"], "e5", equation="...j,jk->...k"),
                    N("Einsum", ["x", "x", "w"], "e6", equation="bij,bik,jl->bkl")],
     {"x": X, "q": r(2, 2, 3, 4), "k": r(2, 2, 5, 4)}, {"w3": r(2, 4, 5), "w": r(4, 3)},
     [(n, F) for n in ("e1", "e2", "e3", "e4", "e5", "e6")]),
    ("reduce18", 18, [
        N("ReduceSum", ["x", "ax1"], "rs", keepdims=0), N("ReduceMean", ["x", "axm"], "rm"),
        N("ReduceMax", ["x"], "rmax_all", keepdims=0), N("ReduceMin", ["x", "ax1"], "rmin"),
        N("ReduceProd", ["x", "axm"], "rp", keepdims=0),
        N("ReduceSum", ["x", "empty"], "noop", noop_with_empty_axes=1),
        N("ReduceL2", ["x", "ax1"], "l2"), N("ReduceLogSumExp", ["x", "axm"], "lse"),
        N("ReduceSumSquare", ["x", "ax1"], "ss"), N("ReduceL1", ["x", "ax1"], "l1"),
        # no axes with noop_with_empty_axes: no reduction, but the elementwise step
        N("ReduceSumSquare", ["x", "empty"], "nss", noop_with_empty_axes=1),
        N("ReduceL1", ["x"], "nl1", noop_with_empty_axes=1),
        N("ReduceL2", ["x"], "nl2", noop_with_empty_axes=1),
        N("ReduceLogSum", ["xp"], "nls", noop_with_empty_axes=1)],
     {"x": X, "xp": r(2, 3, 4, lo=0.5)},
     {"ax1": i64(1), "axm": i64(-1, 0), "empty": np.zeros(0, np.int64)},
     [(n, F) for n in ("rs", "rm", "rmax_all", "rmin", "rp", "noop", "l2", "lse", "ss", "l1",
                       "nss", "nl1", "nl2", "nls")]),
    ("reduce13_attr_axes", 13, [N("ReduceMean", ["x"], "rm", axes=[1, 2]),
                                N("ReduceMax", ["x"], "rx", axes=[-1], keepdims=0),
                                N("ReduceSum", ["x", "ax"], "rs")],
     {"x": X}, {"ax": i64(0)}, [("rm", F), ("rx", F), ("rs", F)]),
    ("argmax_softmax", 13, [
        N("ArgMax", ["t"], "am", axis=1), N("ArgMin", ["t"], "an", axis=0, keepdims=0),
        N("ArgMax", ["t"], "aml", axis=1, select_last_index=1, keepdims=0),
        N("Softmax", ["x"], "sm", axis=1), N("LogSoftmax", ["x"], "lsm"),
        N("Softmax", ["x"], "smd")],
     {"t": TIES, "x": X}, {},
     [("am", I64), ("an", I64), ("aml", I64), ("sm", F), ("lsm", F), ("smd", F)]),
    ("softmax_opset11", 11, [N("Softmax", ["x"], "sm"), N("LogSoftmax", ["x"], "lsm", axis=2)],
     {"x": X}, {}, [("sm", F), ("lsm", F)]),
    ("shapes", 17, [
        N("Reshape", ["x", "shp"], "rs"), N("Flatten", ["x"], "fl", axis=2),
        N("Flatten", ["x"], "fl0", axis=0), N("Transpose", ["x"], "tr", perm=[2, 0, 1]),
        N("Transpose", ["x"], "trd"), N("Unsqueeze", ["x", "uax"], "us"),
        N("Squeeze", ["us", "sax"], "sq"), N("Concat", ["x", "x2"], "cc", axis=-1),
        N("Identity", ["x"], "id"), N("Expand", ["col", "eshape"], "ex"),
        N("Tile", ["x", "reps"], "ti")],
     {"x": X, "x2": r(2, 3, 2), "col": r(3, 1)},
     {"shp": i64(0, -1, 2), "uax": i64(0, -1), "sax": i64(-1), "eshape": i64(2, 1, 5),
      "reps": i64(2, 1, 3)},
     [(n, F) for n in ("rs", "fl", "fl0", "tr", "trd", "us", "sq", "cc", "id", "ex", "ti")]),
    ("split_slice_gather", 18, [
        N("Split", ["x", "sizes"], ["s0", "s1"], axis=2),
        N("Split", ["x"], ["t0", "t1"], axis=1, num_outputs=2),
        N("Slice", ["x", "st", "en", "ax", "sp"], "sl"),
        N("Slice", ["x", "st2", "en2"], "sl2"),
        N("Gather", ["x", "gi"], "g1", axis=1), N("Gather", ["x", "gs"], "g0", axis=2),
        N("Gather", ["x", "idx"], "gd", axis=0)],
     {"x": X, "idx": np.array([[1, 0], [-1, 1]], np.int64)},
     {"sizes": i64(1, 3), "st": i64(-1, 3), "en": i64(-100, 0), "ax": i64(2, 1),
      "sp": i64(-2, -1), "st2": i64(0, 1), "en2": i64(1, 1000), "gi": i64(2, -1, 0),
      "gs": np.int64(-1).reshape(())},
     [(n, F) for n in ("s0", "s1", "t0", "t1", "sl", "sl2", "g1", "g0", "gd")]),
    ("pad_modes", 19, [
        N("Pad", ["x", "pads", "cv"], "pc"), N("Pad", ["x", "pads"], "pr", mode="reflect"),
        N("Pad", ["x", "pads"], "pe", mode="edge"), N("Pad", ["x", "pads"], "pw", mode="wrap"),
        N("Pad", ["x", "negp"], "pn"), N("Pad", ["x", "p2", "", "axes"], "pa")],
     {"x": X},
     {"pads": i64(0, 1, 2, 0, 1, 1), "cv": np.float32(1.5).reshape(()),
      "negp": i64(0, -1, 1, 0, 0, -2), "p2": i64(1, 2), "axes": i64(-1)},
     [(n, F) for n in ("pc", "pr", "pe", "pw", "pn", "pa")]),
    ("static_shape_math", 17, [
        N("Shape", ["x"], "sh"), N("Gather", ["sh", "zero"], "b"),
        N("Unsqueeze", ["b", "zax"], "b1"), N("Concat", ["b1", "m1"], "newshape", axis=0),
        N("Reshape", ["x", "newshape"], "flat"),
        N("Shape", ["x"], "sh_tail", start=1), N("ConstantOfShape", ["sh_tail"], "ones",
                                                 value=h.make_tensor("v", F, [1], [1.0])),
        N("Add", ["x", "ones"], "xp1"),
        N("Constant", [], "k", value_floats=[0.5, 2.0, -1.0, 3.0]), N("Mul", ["x", "k"], "xk"),
        N("Range", ["r0", "r1", "r2"], "rng"), N("Cast", ["rng"], "rngf", to=F),
        N("Add", ["x", "rngf"], "xr"), N("Size", ["x"], "sz"), N("Cast", ["sz"], "szf", to=F),
        N("Mul", ["x", "szf"], "xs")],
     {"x": X}, {"zero": np.int64(0).reshape(()), "zax": i64(0), "m1": i64(-1),
                "r0": np.int64(1).reshape(()), "r1": np.int64(9).reshape(()),
                "r2": np.int64(2).reshape(())},
     [("flat", F), ("xp1", F), ("xk", F), ("xr", F), ("xs", F)]),
    ("norm_dropout", 17, [
        N("BatchNormalization", ["img", "sc", "bi", "mu", "var"], "bn", epsilon=1e-3),
        N("LayerNormalization", ["x", "lw", "lb"], "ln", axis=-2, epsilon=1e-4),
        N("LayerNormalization", ["x", "lw2"], "ln0"),
        N("Dropout", ["x"], ["do", "mask"]), N("Dropout", ["x", "ratio"], "do2"),
        N("GlobalAveragePool", ["img"], "gap"), N("GlobalMaxPool", ["img"], "gmp")],
     {"img": IMG, "x": X},
     {"sc": r(3), "bi": r(3), "mu": r(3), "var": r(3, lo=0.5), "lw": r(3, 4), "lb": r(3, 4),
      "lw2": r(4), "ratio": np.float32(0.3).reshape(())},
     [("bn", F), ("ln", F), ("ln0", F), ("do", F), ("mask", B), ("do2", F), ("gap", F),
      ("gmp", F)]),
    ("resize_nearest", 13, [
        N("Resize", ["img", "", "scales"], "up", mode="nearest",
          coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
        N("Resize", ["img", "", "", "sizes"], "up2", mode="nearest")],
     {"img": IMG}, {"scales": np.array([1, 1, 2, 3], np.float32), "sizes": i64(2, 3, 12, 6)},
     [("up", F), ("up2", F)]),
    ("resize10", 10, [N("Resize", ["img", "scales"], "up", mode="nearest")],   # (X, scales)
     {"img": IMG}, {"scales": np.array([1, 1, 2, 3], np.float32)}, [("up", F)]),
    ("resize_axes18", 18, [
        N("Resize", ["img", "", "s2"], "up", mode="nearest", axes=[-1, 2],
          coordinate_transformation_mode="asymmetric", nearest_mode="floor")],
     {"img": IMG}, {"s2": np.array([2, 3], np.float32)}, [("up", F)]),
]

CASES.append(
    ("opset21", 21, [
        N("Reshape", ["x", "shp"], "r"), N("Cast", ["r"], "rd", to=TP.DOUBLE),
        N("Cast", ["rd"], "rf", to=F), N("Softmax", ["rf"], "sm", axis=0),
        N("ReduceMean", ["x", "ax"], "mean", keepdims=0), N("Gemm", ["rf", "w"], "g"),
        N("Squeeze", ["x1", "ax0"], "sq"), N("Transpose", ["sq"], "t", perm=[1, 0])],
     {"x": X, "x1": r(1, 3, 2)},
     {"shp": i64(6, 4), "ax": i64(1), "w": r(4, 2), "ax0": i64(0)},
     [("sm", F), ("mean", F), ("g", F), ("t", F)]))

# Conv and pools, which need the Tensor methods conv2d/max_pool2d/... (skipped without them)
CONV_CASES = [
    ("conv", 17, [
        N("Conv", ["img", "w", "b"], "c1", pads=[1, 1, 1, 1], strides=[1, 2]),
        N("Conv", ["img", "w"], "c2", auto_pad="SAME_UPPER", strides=[2, 2]),
        N("Conv", ["img", "wg"], "c3", group=3, dilations=[2, 1], auto_pad="VALID"),
        N("Conv", ["img", "w"], "c4", pads=[0, 1, 1, 0])],
     {"img": IMG}, {"w": r(5, 3, 3, 3), "b": r(5), "wg": r(6, 1, 2, 2)},
     [(n, F) for n in ("c1", "c2", "c3", "c4")]),
    ("pools", 17, [
        N("MaxPool", ["img"], "mp", kernel_shape=[2, 2], strides=[2, 2]),
        N("MaxPool", ["img"], "mp3", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        N("AveragePool", ["img"], "ap", kernel_shape=[2, 3], strides=[1, 2]),
        N("AveragePool", ["img"], "apx", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        N("AveragePool", ["img"], "api", kernel_shape=[3, 3], pads=[1, 1, 1, 1],
          count_include_pad=1)],
     {"img": IMG}, {}, [(n, F) for n in ("mp", "mp3", "ap", "apx", "api")]),
    # asymmetric pads (explicit and SAME_*) and ceil_mode: explicit pad + unpadded pool
    ("pools_asym_ceil", 17, [
        N("MaxPool", ["img"], "ma", kernel_shape=[2, 2], pads=[0, 1, 1, 0]),
        N("MaxPool", ["img"], "ms", kernel_shape=[2, 3], auto_pad="SAME_UPPER"),
        N("MaxPool", ["img"], "mc", kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
        N("MaxPool", ["odd"], "mcd", kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1],
          ceil_mode=1),
        N("AveragePool", ["img"], "aa", kernel_shape=[3, 3], pads=[1, 0, 0, 2]),
        N("AveragePool", ["img"], "aai", kernel_shape=[3, 3], pads=[1, 0, 0, 2],
          count_include_pad=1),
        N("AveragePool", ["img"], "asl", kernel_shape=[2, 2], auto_pad="SAME_LOWER"),
        N("AveragePool", ["img"], "ac", kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
        N("AveragePool", ["odd"], "aci", kernel_shape=[3, 2], strides=[2, 2],
          pads=[1, 1, 1, 0], ceil_mode=1, count_include_pad=1),
        N("AveragePool", ["odd"], "acx", kernel_shape=[2, 2], strides=[2, 2],
          pads=[1, 1, 1, 1], ceil_mode=1)],
     {"img": IMG, "odd": r(1, 2, 5, 5)}, {},
     [(n, F) for n in ("ma", "ms", "mc", "mcd", "aa", "aai", "asl", "ac", "aci", "acx")]),
    ("conv_transpose", 17, [
        N("ConvTranspose", ["img", "wt", "b"], "ct", strides=[2, 2], pads=[1, 1, 1, 1],
          output_padding=[1, 1])],
     {"img": IMG}, {"wt": r(3, 4, 3, 3), "b": r(4)}, [("ct", F)]),
]


def make_model(case):
    """The onnx.ModelProto of a case (value infos for inputs; outputs untyped-shape)."""
    name, opset, nodes, inputs, inits, outs = case
    elem = {np.dtype(np.float32): F, np.dtype(np.int64): I64, np.dtype(np.bool_): B}
    g = h.make_graph(
        nodes, name,
        [h.make_tensor_value_info(k, elem[v.dtype], v.shape) for k, v in inputs.items()],
        [h.make_tensor_value_info(n, t, None) for n, t in outs],
        [nh.from_array(np.asarray(v), k) for k, v in inits.items()])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = min(m.ir_version, 10)   # what onnxruntime reads
    return m

# onnx_rules_more.py: what torch.onnx.export writes for cumsum, topk, triu/tril, PReLU,
# isnan/isinf, one_hot, gather and GroupNorm/instance_norm
_SPECIAL = np.array([[1.0, np.nan, -np.inf, 2.0], [np.inf, -1.0, 0.0, np.nan]], np.float32)
CASES.append(
    ("more_ops", 17, [
        N("CumSum", ["x", "ax1"], "cs"), N("CumSum", ["x", "axm"], "csr", reverse=1),
        N("CumSum", ["x", "ax1"], "cse", exclusive=1),
        N("CumSum", ["x", "ax1"], "csre", exclusive=1, reverse=1),
        N("TopK", ["t", "k2"], ["tv", "ti"], axis=1),
        N("TopK", ["t", "k2"], ["bv", "bi"], axis=0, largest=0),
        N("Trilu", ["x"], "up"), N("Trilu", ["x", "km1"], "lo", upper=0),
        N("PRelu", ["x", "slope"], "pr"),
        N("IsNaN", ["sp"], "nan"), N("IsInf", ["sp"], "inf"),
        N("IsInf", ["sp"], "ninf", detect_positive=0),
        N("OneHot", ["oh_i", "depth", "ohv"], "oh", axis=1),
        N("OneHot", ["oh_i", "depth", "ohv"], "oh_last"),
        N("OneHot", ["oh_i", "depth", "ohv_int"], "oh_int"),   # F.one_hot: int64 values
        N("GatherElements", ["x", "ge_i"], "ge", axis=1),
        N("GatherElements", ["x", "ge_j"], "ge0", axis=0),
        N("InstanceNormalization", ["img", "isc", "ibi"], "inorm", epsilon=1e-4)],
     {"x": X, "t": TIES, "sp": _SPECIAL, "oh_i": i64(0, 3, -1, 2, -4), "img": IMG},
     {"ax1": i64(1), "axm": i64(-1), "k2": i64(2), "km1": i64(-1),
      "slope": r(4), "depth": i64(4), "ohv": np.array([-1.0, 3.0], np.float32),
      "ohv_int": i64(0, 1),
      "ge_i": np.array([[[0, 2, 1, 0], [2, -1, 0, 1]], [[1, 1, 2, 0], [0, 0, 0, 2]]], np.int64),
      "ge_j": np.array([[[1, 0, 1, 0]]], np.int64), "isc": r(3), "ibi": r(3)},
     [("cs", F), ("csr", F), ("cse", F), ("csre", F), ("tv", F), ("ti", I64), ("bv", F),
      ("bi", I64), ("up", F), ("lo", F), ("pr", F), ("nan", B), ("inf", B), ("ninf", B),
      ("oh", F), ("oh_last", F), ("oh_int", I64), ("ge", F), ("ge0", F), ("inorm", F)]))

# Resize mode linear (F.interpolate(mode="bilinear")): every coordinate transformation,
# up and down, integer and fractional scales, from scales and from sizes; Resize-10
CASES.append(
    ("resize_linear", 13, [
        N("Resize", ["img", "", "s2"], "hp", mode="linear"),
        N("Resize", ["img", "", "s3"], "php", mode="linear",
          coordinate_transformation_mode="pytorch_half_pixel"),
        N("Resize", ["img", "", "", "sz"], "ac", mode="linear",
          coordinate_transformation_mode="align_corners"),
        N("Resize", ["img", "", "s3"], "asym", mode="linear",
          coordinate_transformation_mode="asymmetric"),
        N("Resize", ["img", "", "", "sz1"], "one", mode="linear",
          coordinate_transformation_mode="pytorch_half_pixel")],
     {"img": IMG},
     {"s2": np.array([1, 1, 2, 2], np.float32), "s3": np.array([1, 1, 0.6, 1.7], np.float32),
      "sz": i64(2, 3, 7, 5), "sz1": i64(2, 3, 1, 9)},
     [("hp", F), ("php", F), ("ac", F), ("asym", F), ("one", F)]))
CASES.append(
    ("resize10_linear", 10, [N("Resize", ["img", "scales"], "up", mode="linear")],
     {"img": IMG}, {"scales": np.array([1, 1, 1.5, 2], np.float32)}, [("up", F)]))

_LAB = np.array([[2, 0, 4], [1, 3, 3]], np.int64)
CASES.append(
    ("sce_loss", 13, [
        N("SoftmaxCrossEntropyLoss", ["sc", "lab"], ["l_mean", "lp"]),
        N("SoftmaxCrossEntropyLoss", ["sc", "lab"], "l_none", reduction="none"),
        N("SoftmaxCrossEntropyLoss", ["sc", "lab", "cw"], "l_w"),
        N("SoftmaxCrossEntropyLoss", ["sc", "lab", "cw"], "l_wi", ignore_index=3),
        N("SoftmaxCrossEntropyLoss", ["sc", "lab"], "l_si", reduction="sum", ignore_index=0),
        N("SoftmaxCrossEntropyLoss", ["sc2", "lab2"], "l_2d")],
     {"sc": r(2, 5, 3), "lab": _LAB, "sc2": r(4, 5), "lab2": i64(0, 4, 2, 2)},
     {"cw": r(5, lo=0.2)},
     [("l_mean", F), ("lp", F), ("l_none", F), ("l_w", F), ("l_wi", F), ("l_si", F),
      ("l_2d", F)]))

# ReduceMean keeps an integer input's type (the mean truncated), as onnxruntime
CASES.append(
    ("reduce_mean_int", 18, [N("ReduceMean", ["xi", "ax1"], "rmi", keepdims=0),
                             N("ReduceMean", ["xi"], "rma")],
     {"xi": np.array([[3, 4, 2, 5], [1, 0, 3, 3], [9, 8, 9, 9]], np.int64)},
     {"ax1": i64(1)}, [("rmi", I64), ("rma", I64)]))

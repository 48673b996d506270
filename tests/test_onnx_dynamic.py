"""ONNX import with dynamic dims (issue 17 x issue 14): a `dim_param` becomes a dimension
symbol, so one imported Func runs at every batch size; `input_shapes=` still overrides.

Oracles: the committed torch exports (tests/fixtures/onnx, batch axis exported dynamic)
with PyTorch's outputs, loss and autograd gradients at batch 2 and 5, and onnxruntime
(when installed) at two batch sizes.  Shape arithmetic on a symbol that cannot stay
symbolic is an error naming it."""
from __future__ import annotations

import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto as TP  # noqa: E402
from onnx import helper as h  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402

import rlxc  # noqa: E402
from rlxc.onnx_import import OnnxImportError, symbol_name, with_loss  # noqa: E402

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "onnx")
SHAPES = {"mlp": ("batch", 64), "cnn": ("batch", 1, 8, 8), "encoder": ("batch", 6, 32)}


@pytest.mark.parametrize("name", ["mlp", "cnn", "encoder"])
def test_committed_export_is_dynamic_and_matches_pytorch_at_two_batches(name):
    path = os.path.join(FIX, f"{name}.onnx")
    refs = np.load(os.path.join(FIX, f"{name}_ref.npz"))
    f = rlxc.from_onnx(path)
    assert f.input_shape_of("x") == SHAPES[name]
    assert f.output_shapes()[0][0] == "batch"
    for b, dev in ((2, "interp"), (5, "cpu")):   # one Func, two sizes (CPU: per size)
        x = refs[f"b{b}/x"]
        np.testing.assert_allclose(f.run_on(dev, x=x)[0], refs[f"b{b}/y"], rtol=1e-4,
                                   atol=1e-5)
    if name == "encoder":
        return                                   # (its refs hold no gradients)
    vg = with_loss(f, "cross_entropy").value_and_grad_all()
    for b, dev in ((2, "cpu"), (5, "interp")):
        loss, *grads = vg.run_on(dev, x=refs[f"b{b}/x"], labels=refs[f"b{b}/labels"])
        np.testing.assert_allclose(float(loss), float(refs[f"b{b}/loss"]), rtol=1e-4)
        for pname, g in zip(f.param_names(), grads):
            if f"b{b}/grad:{pname}" in refs:
                np.testing.assert_allclose(g, refs[f"b{b}/grad:{pname}"], rtol=1e-3,
                                           atol=1e-5, err_msg=pname)


def test_committed_export_matches_onnxruntime_at_two_batches():
    ort = pytest.importorskip("onnxruntime")
    path = os.path.join(FIX, "encoder.onnx")
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    f = rlxc.from_onnx(path)
    for b in (1, 3):
        x = np.random.default_rng(b).normal(size=(b, 6, 32)).astype(np.float32)
        want = sess.run(None, {"x": x})[0]
        np.testing.assert_allclose(f.run_on("cpu", x=x)[0], want, rtol=1e-4, atol=1e-5)


def _model(nodes, inputs, outputs, inits=()):
    g = h.make_graph(nodes, "g", inputs, outputs, list(inits))
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def test_dim_params_share_symbols_and_input_shapes_overrides():
    x = h.make_tensor_value_info("x", TP.FLOAT, ("batch size", 4))
    y = h.make_tensor_value_info("y", TP.FLOAT, ("batch size", 4))
    u = h.make_tensor_value_info("u", TP.FLOAT, (None, 4))          # unknown: anonymous
    m = _model([h.make_node("Add", ["x", "y"], ["z"]), h.make_node("Neg", ["u"], ["v"])],
               [x, y, u], [h.make_tensor_value_info("z", TP.FLOAT, ("batch size", 4)),
                           h.make_tensor_value_info("v", TP.FLOAT, (None, 4))])
    f = rlxc.from_onnx(m)
    assert symbol_name("batch size") == "batch_size" and symbol_name("0n") == "_0n"
    assert f.input_shape_of("x") == f.input_shape_of("y") == ("batch_size", 4)
    assert f.input_shape_of("u")[0].startswith("?")
    a = np.ones((3, 4), np.float32)
    z, v = f.run_on("interp", x=a, y=a * 2, u=a[:1])
    np.testing.assert_allclose(z, a * 3)
    np.testing.assert_allclose(v, -a[:1])
    with pytest.raises(Exception, match="batch_size"):
        f.run_on("interp", x=a, y=np.ones((2, 4), np.float32), u=a)
    g = rlxc.from_onnx(m, input_shapes={"x": (3, 4), "y": (3, 4), "u": (1, 4)})
    assert g.input_shape_of("x") == (3, 4)


def test_shape_arithmetic_on_a_symbol_names_it():
    x = h.make_tensor_value_info("x", TP.FLOAT, ("batch", 4))
    two = nh.from_array(np.array([2], np.int64), "two")
    nodes = [h.make_node("Shape", ["x"], ["s"]), h.make_node("Mul", ["s", "two"], ["s2"]),
             h.make_node("Reshape", ["x", "s2"], ["y"])]
    m = _model(nodes, [x], [h.make_tensor_value_info("y", TP.FLOAT, None)], [two])
    with pytest.raises(OnnxImportError, match="dynamic dimension 'batch'"):
        rlxc.from_onnx(m)
    # Shape -> Gather -> Concat -> Reshape keeps the symbol (what torch exports emit)
    idx = nh.from_array(np.array(0, np.int64), "i0")
    rest = nh.from_array(np.array([2, 2], np.int64), "rest")
    ax = nh.from_array(np.array([0], np.int64), "ax")
    nodes = [h.make_node("Shape", ["x"], ["s"]), h.make_node("Gather", ["s", "i0"], ["b"]),
             h.make_node("Unsqueeze", ["b", "ax"], ["b1"]),
             h.make_node("Concat", ["b1", "rest"], ["t"], axis=0),
             h.make_node("Reshape", ["x", "t"], ["y"])]
    m = _model(nodes, [x], [h.make_tensor_value_info("y", TP.FLOAT, None)], [idx, rest, ax])
    f = rlxc.from_onnx(m)
    assert f.output_shapes() == [("batch", 2, 2)]
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(f.run_on("cpu", x=a)[0], a.reshape(3, 2, 2))


def _const(name, v, dt=np.int64):
    return h.make_node("Constant", [], [name], value=nh.from_array(np.array(v, dt)))


# exporter patterns on a dim_param batch (torch.onnx.export, TorchScript, opsets 11-17)
EXPORT_CASES = {
    # x.chunk(4, -1): Shape -> Gather -> Div (integer) -> Mul -> Slice: the shape is an
    # object array once it holds a symbol, and its Div did float division (chunks 2,3,3,0)
    "chunk_div": ([h.make_node("Shape", ["x"], ["s"]), _const("i", 1),
                   h.make_node("Gather", ["s", "i"], ["d"]), _const("three", 3),
                   h.make_node("Div", ["d", "three"], ["q"]), _const("two", 2),
                   h.make_node("Mul", ["q", "two"], ["e"]), _const("z", [0]),
                   h.make_node("Unsqueeze", ["e", "z"], ["ee"]), _const("ax", [1]),
                   h.make_node("Slice", ["x", "z", "ee", "ax"], ["y"])], ["batch", 8], 13),
    "softmax11_3d": ([h.make_node("Softmax", ["x"], ["y"], axis=2)], ["batch", 4, 8], 11),
    # torch.where(isnan(x), zeros_like(x), x): ConstantOfShape(Shape(x)) of a dynamic x
    "zeros_like": ([h.make_node("Shape", ["x"], ["s"]),
                    h.make_node("ConstantOfShape", ["s"], ["z"]),
                    h.make_node("IsNaN", ["x"], ["n"]),
                    h.make_node("Where", ["n", "z", "x"], ["y"])], ["batch", 4], 13),
    "logsoftmax11": ([h.make_node("LogSoftmax", ["x"], ["y"], axis=2)],
                     ["batch", "seq", 8], 11),
    "pad_value": ([_const("p", [0, 0, 1, 1, 0, 0, 1, 1]), _const("v", 3.0, np.float32),
                   h.make_node("Pad", ["x", "p", "v"], ["y"])], ["batch", 3, 4, 4], 13),
    "pad_crop": ([_const("p", [0, 0, 0, -1, 0, 0, 0, 1]), h.make_node("Pad", ["x", "p"], ["y"])],
                 ["batch", 3, 4, 4], 13),
    "einsum_free": ([_const("w", np.arange(8.0), np.float32),
                     h.make_node("Einsum", ["x", "w"], ["y"], equation="bij,j->bi")],
                    ["batch", 5, 8], 13),
    "resize_sizes": ([h.make_node("Shape", ["x"], ["s"]), _const("st", [0]), _const("en", [2]),
                      _const("hw", [10, 12]), h.make_node("Slice", ["s", "st", "en"], ["s2"]),
                      h.make_node("Concat", ["s2", "hw"], ["sz"], axis=0),
                      h.make_node("Resize", ["x", "", "", "sz"], ["y"], mode="nearest",
                                  coordinate_transformation_mode="asymmetric",
                                  nearest_mode="floor")], ["batch", 3, 5, 6], 13),
}


@pytest.mark.parametrize("case", sorted(EXPORT_CASES))
def test_exporter_patterns_on_a_dynamic_batch_match_onnxruntime(case):
    ort = pytest.importorskip("onnxruntime")
    nodes, shape, opset = EXPORT_CASES[case]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, shape)],
                     [h.make_tensor_value_info("y", TP.FLOAT, None)])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = min(m.ir_version, 10)
    f = rlxc.from_onnx(m)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for b in (2, 3):
        xs = tuple(b if d == "batch" else 4 if d == "seq" else d for d in shape)
        x = np.random.default_rng(b).normal(size=xs).astype(np.float32)
        want = sess.run(None, {"x": x})[0]
        got = f.run(x=x)[0]
        assert got.shape == want.shape, (case, b, got.shape, want.shape)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"{case} b={b}")


def test_integer_div_of_two_scalars_is_folded():
    """Div of two 0-d static ints: NumPy's // gives a scalar, not an array, and the rule
    took the Tensor branch (AttributeError: 'numpy.bool' object has no attribute 'where')."""
    x = h.make_tensor_value_info("x", TP.FLOAT, (4, 8))
    m = _model([_const("a", 9), _const("b", -2), h.make_node("Div", ["a", "b"], ["q"]),
                _const("z", [0]), h.make_node("Unsqueeze", ["q", "z"], ["qq"]),
                _const("four", [4]), h.make_node("Concat", ["four", "qq"], ["shp"], axis=0),
                _const("st", [0, 0]), _const("ax", [0, 1]),
                h.make_node("Neg", ["qq"], ["en1"]), h.make_node("Concat", ["four", "en1"],
                                                                 ["en"], axis=0),
                h.make_node("Slice", ["x", "st", "en", "ax"], ["y"])],
               [x], [h.make_tensor_value_info("y", TP.FLOAT, None)])
    xv = np.arange(32, dtype=np.float32).reshape(4, 8)
    np.testing.assert_array_equal(rlxc.from_onnx(m).run(x=xv)[0], xv[:, :4])   # 9 / -2 = -4

"""rlxc.from_onnx against onnxruntime, operator by operator (models in tests/onnx_cases.py).

Each case runs in onnxruntime and in rlxc's NumPy reference interpreter; then all cases
are inlined into ONE Func (s.call) and compiled once for the CPU, so the native code of
every rule is checked too at the cost of one compile. Outputs agree within 1e-4
relative. Also: the errors (every unsupported node listed at once, dynamic dims without
a size), input_shapes, external data beside the file, params under ONNX names.
"""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import rlxc  # noqa: E402
from onnx import TensorProto as TP  # noqa: E402
from onnx import helper as h  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402
from rlxc.onnx_import import OnnxImportError, UnsupportedOnnxOp  # noqa: E402

from onnx_cases import CASES, CONV_CASES, make_model  # noqa: E402

HAS_CONV = hasattr(rlxc.Tensor, "conv2d")
NO_CONV = "needs Tensor.conv2d/max_pool2d/... (the conv/pool work), absent in this build"


def reference(case):
    sess = ort.InferenceSession(make_model(case).SerializeToString(),
                                providers=["CPUExecutionProvider"])
    return sess.run(None, case[3])


def assert_close(got, ref, what):
    for (name, _), g, r in zip(what, got, ref):
        g, r = np.asarray(g), np.asarray(r)
        assert g.shape == r.shape, (name, g.shape, r.shape)
        assert g.dtype == r.dtype or (g.dtype.kind == r.dtype.kind == "f"), (name, g.dtype)
        if r.dtype.kind in "f":
            np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5, err_msg=name)
        else:
            np.testing.assert_array_equal(g, r, err_msg=name)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_op_against_onnxruntime_interp(case):
    f = rlxc.from_onnx(make_model(case))
    assert_close(f.run_on("interp", **case[3]), reference(case), case[5])


def _all_in_one(cases):
    """One Func computing every case (inputs and params prefixed c<i>_), and its inputs."""
    funcs = [rlxc.from_onnx(make_model(c)) for c in cases]

    def build(s):
        outs = []
        for i, f in enumerate(funcs):
            args = {a.name: (s.input if a.kind == "input" else s.param)(f"c{i}_{a.name}",
                                                                        a.shape, a.dtype)
                    for a in f.signature()}
            outs += s.call(f, args)
        return tuple(outs)

    params = {f"c{i}_{k}": v for i, f in enumerate(funcs) for k, v in f.params().items()}
    inputs = {f"c{i}_{k}": v for i, c in enumerate(cases) for k, v in c[3].items()}
    return rlxc.Func("onnx_cases", build).with_params(params), inputs


def test_every_op_compiled_for_cpu_against_onnxruntime():
    f, inputs = _all_in_one(CASES)
    got = f.run_on("cpu", **inputs)
    k = 0
    for c in CASES:
        n = len(c[5])
        assert_close(got[k:k + n], reference(c), c[5])
        k += n


@pytest.mark.skipif(not HAS_CONV, reason=NO_CONV)
@pytest.mark.parametrize("case", CONV_CASES, ids=[c[0] for c in CONV_CASES])
def test_conv_pool_against_onnxruntime(case):
    f = rlxc.from_onnx(make_model(case))
    ref = reference(case)
    assert_close(f.run_on("interp", **case[3]), ref, case[5])
    assert_close(f.run_on("cpu", **case[3]), ref, case[5])


def test_conv_is_unsupported_without_the_tensor_method():
    if HAS_CONV:
        pytest.skip("this build has Tensor.conv2d")
    with pytest.raises(UnsupportedOnnxOp, match="Tensor.conv2d"):
        rlxc.from_onnx(make_model(CONV_CASES[0]))


# -- errors ------------------------------------------------------------------------------
def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = h.make_graph(nodes, "m", inputs, outputs, list(inits))
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)])


def test_unsupported_lists_every_node_with_op_type_and_opset():
    x = h.make_tensor_value_info("x", TP.FLOAT, (3, 4))
    m = _model([h.make_node("NonZero", ["x"], ["nz"], name="find"),
                h.make_node("Relu", ["x"], ["r"]),
                h.make_node("LSTM", ["x", "x", "x"], ["l"], name="rnn"),
                h.make_node("Pad", ["x", "p"], ["pd"], mode="banana"),
                h.make_node("MaxPool", ["x"], ["mp"], kernel_shape=[2], ceil_mode=1),
                h.make_node("LayerNormalization", ["x", "s"], ["ln", "mean"], name="ln")],
               [x], [h.make_tensor_value_info("r", TP.FLOAT, None)],
               [nh.from_array(np.zeros(4, np.int64), "p"),
                nh.from_array(np.ones(4, np.float32), "s")], opset=19)
    with pytest.raises(UnsupportedOnnxOp) as e:
        rlxc.from_onnx(m)
    msg = str(e.value)
    assert msg.startswith("5 unsupported ONNX node(s)") or msg.startswith("6 unsupported")
    assert "'ln': LayerNormalization (opset 19): the Mean/InvStdDev outputs" in msg
    assert "'find': NonZero (opset 19)" in msg and "'rnn': LSTM (opset 19)" in msg
    assert "Pad (opset 19): mode 'banana'" in msg and "MaxPool" in msg
    assert "Relu" not in msg
    assert [n[1] for n in e.value.nodes][:3] == ["NonZero", "LSTM", "Pad"]


def test_dynamic_dim_is_a_symbol_and_input_shapes_gives_a_size():
    x = h.make_tensor_value_info("x", TP.FLOAT, ("batch", 4))
    w = nh.from_array(np.arange(12, dtype=np.float32).reshape(4, 3), "fc.weight")
    m = _model([h.make_node("MatMul", ["x", "fc.weight"], ["y"])], [x],
               [h.make_tensor_value_info("y", TP.FLOAT, ("batch", 3))], [w])
    assert rlxc.from_onnx(m).input_shape_of("x") == ("batch", 4)   # tests/test_onnx_dynamic.py
    for b in (2, 5):
        f = rlxc.from_onnx(m, input_shapes={"x": (b, 4)})
        xv = np.random.default_rng(b).normal(size=(b, 4)).astype(np.float32)
        assert f.param_names() == ["fc.weight"]
        np.testing.assert_allclose(f.run(x=xv)[0], xv @ nh.to_array(w), rtol=1e-5)
    with pytest.raises(OnnxImportError, match="dim 1 is fixed to 4"):
        rlxc.from_onnx(m, input_shapes={"x": (2, 5)})
    with pytest.raises(OnnxImportError, match="'y' is not an input"):
        rlxc.from_onnx(m, input_shapes={"y": (2, 3)})


def test_unsupported_dtype_and_runtime_shape_named():
    x = h.make_tensor_value_info("x", TP.FLOAT16, (3,))
    m = _model([h.make_node("Relu", ["x"], ["y"])], [x],
               [h.make_tensor_value_info("y", TP.FLOAT16, None)])
    with pytest.raises(OnnxImportError, match="input 'x'.*FLOAT16"):
        rlxc.from_onnx(m)
    x = h.make_tensor_value_info("x", TP.FLOAT, (2, 3))
    s = h.make_tensor_value_info("s", TP.INT64, (2,))
    m = _model([h.make_node("Reshape", ["x", "s"], ["y"], name="rs")], [x, s],
               [h.make_tensor_value_info("y", TP.FLOAT, None)])
    with pytest.raises(OnnxImportError, match="node 'rs' \\(Reshape\\): Reshape's shape input "
                                              "must be known"):
        rlxc.from_onnx(m)


def test_external_data_is_loaded_from_beside_the_file(tmp_path):
    rng = np.random.default_rng(3)
    w = rng.normal(size=(64, 32)).astype(np.float32)
    x = h.make_tensor_value_info("x", TP.FLOAT, (2, 64))
    m = _model([h.make_node("MatMul", ["x", "w"], ["y"])], [x],
               [h.make_tensor_value_info("y", TP.FLOAT, None)], [nh.from_array(w, "w")])
    d = tmp_path / "model"
    d.mkdir()
    onnx.save_model(m, str(d / "m.onnx"), save_as_external_data=True,
                    location="weights.bin", size_threshold=0)
    assert (d / "weights.bin").stat().st_size >= w.nbytes
    xv = rng.normal(size=(2, 64)).astype(np.float32)
    f = rlxc.from_onnx(d / "m.onnx", name="ext")
    assert f.name == "ext"
    np.testing.assert_allclose(f.run(x=xv)[0], xv @ w, rtol=1e-5)
    # a ModelProto whose external data was not loaded: a clear error
    lazy = onnx.load(str(d / "m.onnx"), load_external_data=False)
    with pytest.raises(OnnxImportError, match="initializer 'w'.*external file"):
        rlxc.from_onnx(lazy)
    (d / "weights.bin").unlink()
    with pytest.raises(OnnxImportError, match="external data"):
        rlxc.from_onnx(d / "m.onnx")


def test_batched_matmul_by_a_matrix_is_one_gemm():
    """(B, T, K) @ (K, N) imports as one (B*T, K) @ (K, N) matmul (a transformer's
    projections: one large GEMM instead of B small ones; 2.4x on the encoder at batch 64)."""
    x = h.make_tensor_value_info("x", TP.FLOAT, (4, 6, 8))
    w = np.random.default_rng(0).normal(size=(8, 5)).astype(np.float32)
    m = _model([h.make_node("MatMul", ["x", "w"], ["y"])], [x],
               [h.make_tensor_value_info("y", TP.FLOAT, None)], [nh.from_array(w, "w")])
    f = rlxc.from_onnx(m)
    text = f.mlir()
    assert "tensor<24x8xf32>, tensor<8x5xf32> -> tensor<24x5xf32>" in text
    xv = np.random.default_rng(1).normal(size=(4, 6, 8)).astype(np.float32)
    np.testing.assert_allclose(f.run_on("interp", x=xv)[0], xv @ w, rtol=1e-5, atol=1e-6)


def test_dangling_names_are_named():
    x = h.make_tensor_value_info("x", TP.FLOAT, (3,))
    y = h.make_tensor_value_info("y", TP.FLOAT, None)
    m = _model([h.make_node("Add", ["x", "ghost"], ["y"], name="add")], [x], [y])
    with pytest.raises(OnnxImportError, match="node 'add' \\(Add\\): input 'ghost' is not"):
        rlxc.from_onnx(m)
    m = _model([h.make_node("Relu", ["x"], ["r"])], [x], [y])
    with pytest.raises(OnnxImportError, match="graph output 'y' is computed by no node"):
        rlxc.from_onnx(m)

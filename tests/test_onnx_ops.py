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


@pytest.mark.parametrize("case", CONV_CASES, ids=[c[0] for c in CONV_CASES])
def test_conv_pool_against_onnxruntime(case):
    f = rlxc.from_onnx(make_model(case))
    ref = reference(case)
    assert_close(f.run_on("interp", **case[3]), ref, case[5])
    assert_close(f.run_on("cpu", **case[3]), ref, case[5])


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
                h.make_node("MaxPool", ["x"], ["mp"], kernel_shape=[2], dilations=[2]),
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
    assert "Pad (opset 19): mode 'banana'" in msg and "MaxPool (opset 19): dilations" in msg
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



def test_argmax_argmin_with_nan_pick_the_nan_as_numpy():
    """A NaN is the extreme (Tensor.argmax, np.argmax, onnx.reference); never an index
    outside [0, n) (the NaN made x == max false everywhere before)."""
    x = np.array([[1.0, np.nan, 3.0, np.nan], [4.0, 2.0, 4.0, 0.5]], np.float32)
    xi = h.make_tensor_value_info("x", TP.FLOAT, (2, 4))
    outs = ["amax", "amin", "alast", "ilast"]
    m = _model([h.make_node("ArgMax", ["x"], ["amax"], axis=1, keepdims=0),
                h.make_node("ArgMin", ["x"], ["amin"], axis=-1, keepdims=0),
                h.make_node("ArgMax", ["x"], ["alast"], axis=1, keepdims=0,
                            select_last_index=1),
                h.make_node("ArgMin", ["x"], ["ilast"], axis=1, keepdims=1,
                            select_last_index=1)],
               [xi], [h.make_tensor_value_info(o, TP.INT64, None) for o in outs], opset=13)
    got = rlxc.from_onnx(m).run(x=x)
    np.testing.assert_array_equal(got[0], [1, 0])
    np.testing.assert_array_equal(got[1], [1, 3])
    np.testing.assert_array_equal(got[2], [3, 2])
    np.testing.assert_array_equal(got[3], [[3], [3]])
    assert all(g.dtype == np.int64 for g in got)


@pytest.mark.parametrize("node, rank", [
    (h.make_node("Concat", ["x", "x"], ["y"], axis=5), 2),
    (h.make_node("Softmax", ["x"], ["y"], axis=4), 2),
    (h.make_node("ArgMax", ["x"], ["y"], axis=3), 2),
    (h.make_node("Split", ["x"], ["y", "z"], axis=-3), 2),
    (h.make_node("Squeeze", ["x"], ["y"], axes=[2]), 2),
    (h.make_node("Unsqueeze", ["x"], ["y"], axes=[4]), 2),
    (h.make_node("Gather", ["x", "i"], ["y"], axis=2), 2),
])
def test_out_of_range_axis_is_an_import_error(node, rank):
    """ONNX rejects these (onnxruntime too); wrapping them around would run another axis."""
    x = h.make_tensor_value_info("x", TP.FLOAT, (2, 3))
    m = _model([node], [x], [h.make_tensor_value_info("y", TP.FLOAT, None)],
               [nh.from_array(np.zeros(1, np.int64), "i")], opset=11)
    with pytest.raises(OnnxImportError, match=r"axis -?\d+ is out of range for a rank-\d"):
        rlxc.from_onnx(m)


@pytest.mark.parametrize("node, opset, match", [
    (h.make_node("MaxPool", ["x"], ["y"], name="pool1"), 17,
     r"node 'pool1' \(MaxPool\): the required attribute 'kernel_shape' is missing"),
    (h.make_node("Gemm", ["x"], ["y"]), 17, r"\(Gemm\): 1 input\(s\), opset 17 needs at least 2"),
    (h.make_node("Unsqueeze", ["x"], ["y"]), 11, r"required attribute 'axes' is missing"),
    (h.make_node("Relu", ["x", "x"], ["y"]), 17, r"\(Relu\): 2 inputs, opset 17 takes at most 1"),
])
def test_malformed_nodes_are_named_against_the_schema(node, opset, match):
    x = h.make_tensor_value_info("x", TP.FLOAT, (1, 1, 4, 4))
    m = _model([node], [x], [h.make_tensor_value_info("y", TP.FLOAT, None)], opset=opset)
    with pytest.raises(OnnxImportError, match=match):
        rlxc.from_onnx(m)


def test_slice_of_a_dynamic_axis():
    """The whole axis (the no-op slice exporters write) passes; a part of it is named."""
    x = h.make_tensor_value_info("x", TP.FLOAT, ("N", 4))

    def model(start, end, axis):
        inits = [nh.from_array(np.array([start], np.int64), "st"),
                 nh.from_array(np.array([end], np.int64), "en"),
                 nh.from_array(np.array([axis], np.int64), "ax")]
        return _model([h.make_node("Slice", ["x", "st", "en", "ax"], ["y"])], [x],
                      [h.make_tensor_value_info("y", TP.FLOAT, None)], inits, opset=13)

    xv = np.arange(12, dtype=np.float32).reshape(3, 4)
    f = rlxc.from_onnx(model(0, 2 ** 63 - 1, 0))
    assert f.input_shape_of("x") == ("N", 4)
    np.testing.assert_array_equal(f.run(x=xv)[0], xv)
    np.testing.assert_array_equal(rlxc.from_onnx(model(1, 3, 1)).run(x=xv)[0], xv[:, 1:3])
    with pytest.raises(OnnxImportError, match=r"Slice \[1:.*\] of axis 0, the dynamic "
                                              r"dimension 'N': only the whole axis"):
        rlxc.from_onnx(model(1, 2 ** 63 - 1, 0))

# -- pool gradients through the explicit-padding path (asymmetric pads, ceil_mode) --------
def _np_pool(x, kind, k, s, lo, hi, ceil, count_pads):
    """NumPy MaxPool/AveragePool (ONNX semantics, window by window) and its VJP."""
    n, c, H, W = x.shape
    outs = []
    for d, kk, ss, a, b in zip((H, W), k, s, lo, hi):
        span = d + a + b - kk
        o = (-(-span // ss) if ceil else span // ss) + 1
        if ceil and (o - 1) * ss >= d + a:
            o -= 1
        outs.append(o)
    y = np.zeros((n, c, *outs))
    back = []   # (out index, [(pixel index, weight)])
    for i in range(outs[0]):
        for j in range(outs[1]):
            r0, c0 = i * s[0] - lo[0], j * s[1] - lo[1]
            rows = [r for r in range(r0, r0 + k[0]) if 0 <= r < H]
            cols = [q for q in range(c0, c0 + k[1]) if 0 <= q < W]
            win = x[:, :, rows][:, :, :, cols].reshape(n, c, -1)
            if kind == "max":
                y[:, :, i, j] = win.max(-1)
                back.append(((i, j), rows, cols, None))
            else:
                cnt = (len(rows) * len(cols)) if not count_pads else \
                    (len([r for r in range(r0, r0 + k[0]) if -lo[0] <= r < H + hi[0]])
                     * len([q for q in range(c0, c0 + k[1]) if -lo[1] <= q < W + hi[1]]))
                y[:, :, i, j] = win.sum(-1) / cnt
                back.append(((i, j), rows, cols, cnt))

    def vjp(dy):
        dx = np.zeros_like(x)
        for (i, j), rows, cols, cnt in back:
            for b in range(n):
                for ch in range(c):
                    if cnt is None:
                        win = x[b, ch][np.ix_(rows, cols)]
                        r, q = np.unravel_index(np.argmax(win), win.shape)
                        dx[b, ch, rows[r], cols[q]] += dy[b, ch, i, j]
                    else:
                        dx[b, ch][np.ix_(rows, cols)] += dy[b, ch, i, j] / cnt
        return dx
    return y, vjp


POOL_GRAD_CASES = [
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    ("MaxPool", dict(kernel_shape=[2, 2], pads=[0, 1, 1, 0])),
    ("AveragePool", dict(kernel_shape=[3, 2], strides=[2, 2], pads=[1, 1, 1, 0], ceil_mode=1,
                         count_include_pad=1)),
    ("AveragePool", dict(kernel_shape=[3, 3], pads=[1, 0, 0, 2])),
]


@pytest.mark.parametrize("op,at", POOL_GRAD_CASES,
                         ids=[f"{o}-{i}" for i, (o, _) in enumerate(POOL_GRAD_CASES)])
def test_pool_gradient_asymmetric_ceil_against_numpy(op, at):
    """Fine-tuning through a MaxPool/AveragePool that needs the explicit-padding path:
    the gradient of an mse loss w.r.t. the pooled tensor (an initializer, so a param)
    equals a window-by-window NumPy VJP (reference interpreter and compiled CPU code)."""
    from rlxc.onnx_import import with_loss

    rng = np.random.default_rng(5)
    img = rng.normal(size=(2, 2, 5, 7)).astype(np.float32)
    m = _model([h.make_node(op, ["img"], ["y"], **at)], [],
               [h.make_tensor_value_info("y", TP.FLOAT, None)], [nh.from_array(img, "img")])
    f = rlxc.from_onnx(m)
    k, s = at["kernel_shape"], at.get("strides", [1, 1])
    p = at.get("pads", [0, 0, 0, 0])
    want, vjp = _np_pool(img.astype(np.float64), "max" if op == "MaxPool" else "avg", k, s,
                         p[:2], p[2:], at.get("ceil_mode", 0), at.get("count_include_pad", 0))
    np.testing.assert_allclose(f.run_on("interp")[0], want, rtol=1e-5, atol=1e-6)
    labels = rng.normal(size=want.shape).astype(np.float32)
    dy = 2 * (want - labels) / want.size            # d mean((y - labels)^2) / dy
    for device in ("interp", "cpu"):
        loss, g = with_loss(f, "mse").value_and_grad_all().run_on(device, labels=labels)
        np.testing.assert_allclose(float(loss), np.mean((want - labels) ** 2), rtol=1e-5)
        np.testing.assert_allclose(g, vjp(dy), rtol=1e-4, atol=1e-6, err_msg=device)


def test_pool_window_of_only_padding_is_named():
    x = h.make_tensor_value_info("x", TP.FLOAT, (1, 1, 4, 4))
    m = _model([h.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2],
                            pads=[0, 0, 2, 0], name="ap")], [x],
               [h.make_tensor_value_info("y", TP.FLOAT, None)])
    with pytest.raises(OnnxImportError, match=r"node 'ap' \(AveragePool\).*a window covers "
                                              "only padding"):
        rlxc.from_onnx(m)

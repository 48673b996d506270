"""ONNX models as rlxc Funcs: `rlxc.from_onnx(path_or_ModelProto)`.

    model.onnx (+ external data beside it)
      │ check every node against RULES (rlxc/onnx_rules.py, one row per op type):
      │   all unsupported nodes -> one UnsupportedOnnxOp listing them
      ▼
    trace: graph inputs -> s.input, float initializers -> s.param (bound, ONNX names),
      │ integer initializers and Constant nodes -> static NumPy arrays
      │ each node: its rule on (Tensor | np.ndarray) operands
      │   (shape arithmetic -- Shape, Gather, Concat, Range, ... -- folds in NumPy)
      ▼
    Func (outputs in graph order), params bound

Dynamic dims become symbols (issue 14): a `dim_param` is a named symbol (every input
using "batch" shares one size), an unknown size a fresh anonymous one, so one Func
runs at any batch.  `input_shapes={"x": (4, 784)}` overrides an input's shape (static
sizes, or symbol names).  Shape arithmetic on a dynamic dim that cannot stay symbolic
fails with an error naming the node and the symbol; give input_shapes= there.
"""
from __future__ import annotations

import os
import re

import numpy as np

from rlxc.dialect.symdims import user_dims

# ONNX TensorProto element types -> rlx dtypes
ONNX_DTYPES = {1: "f32", 11: "f64", 6: "i32", 7: "i64", 9: "i1"}
ONNX_DTYPE_NAMES = {1: "FLOAT", 2: "UINT8", 3: "INT8", 4: "UINT16", 5: "INT16", 6: "INT32",
                    7: "INT64", 8: "STRING", 9: "BOOL", 10: "FLOAT16", 11: "DOUBLE",
                    12: "UINT32", 13: "UINT64", 16: "BFLOAT16"}


class OnnxImportError(ValueError):
    """An ONNX model rlxc cannot import (the message names the input, node or file)."""


class UnsupportedOnnxOp(OnnxImportError):
    """Nodes whose op type (or attributes) rlxc cannot express; `.nodes` lists every one
    as (node name, op type, opset, reason)."""

    def __init__(self, nodes):
        self.nodes = list(nodes)
        lines = [f"  node {n!r}: {op} (opset {v}){': ' + why if why else ''}"
                 for n, op, v, why in self.nodes]
        super().__init__(f"{len(self.nodes)} unsupported ONNX node(s):\n" + "\n".join(lines))


def load_model(model):
    """A ModelProto from a path (external data loaded from beside the file) or a proto."""
    import onnx

    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.isfile(path):
            raise OnnxImportError(f"ONNX file {path!r} not found")
        try:
            return onnx.load(path, load_external_data=True)
        except FileNotFoundError as e:
            raise OnnxImportError(f"{path}: external data file missing: {e}") from None
        except Exception as e:
            if "should be stored in" in str(e):   # onnx's check of an external data file
                raise OnnxImportError(f"{path}: external data file missing: {e}") from None
            raise OnnxImportError(f"{path}: not an ONNX model: {type(e).__name__}: {e}") from None
    if isinstance(model, onnx.ModelProto):
        return model
    raise TypeError(f"from_onnx: expected a path or an onnx.ModelProto, got "
                    f"{type(model).__name__}")


def opset_of(model) -> int:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    return 1


def node_label(node, i: int) -> str:
    return node.name or f"#{i} {node.op_type}"


def attrs_of(node) -> dict:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def tensor_array(t) -> np.ndarray:
    """A TensorProto as a NumPy array (external data must be loaded already)."""
    from onnx import external_data_helper, numpy_helper

    if external_data_helper.uses_external_data(t):
        raise OnnxImportError(f"initializer {t.name!r} keeps its data in an external file that "
                              "was not loaded: pass the .onnx path (data is read from beside "
                              "it), or onnx.load(path) first")
    if t.data_type not in ONNX_DTYPES:
        raise OnnxImportError(f"tensor {t.name!r}: element type "
                              f"{ONNX_DTYPE_NAMES.get(t.data_type, t.data_type)} is not "
                              f"supported (supported: FLOAT, DOUBLE, INT32, INT64, BOOL)")
    return numpy_helper.to_array(t)


def check_supported(model, opset: int) -> None:
    """Raise UnsupportedOnnxOp listing EVERY node rlxc cannot express."""
    from .onnx_rules import RULES

    bad = []
    for i, node in enumerate(model.graph.node):
        rule = RULES.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        if rule is None:
            why = "" if node.domain in ("", "ai.onnx") else f"domain {node.domain!r}"
            bad.append((node_label(node, i), node.op_type, opset, why))
            continue
        why = rule.unsupported(node, attrs_of(node), opset)
        if why:
            bad.append((node_label(node, i), node.op_type, opset, why))
    if bad:
        raise UnsupportedOnnxOp(bad)


def check_schema(node, label: str, opset: int) -> None:
    """The node against its operator's ONNX schema at the model's opset: enough inputs
    and every required attribute, so that a malformed node (a MaxPool without
    kernel_shape, a one-input Gemm) is named here rather than failing inside its rule."""
    from onnx import defs

    try:
        schema = defs.get_schema(node.op_type, opset, "")
    except Exception:   # no schema at this opset (check_supported listed what it could)
        return
    given = len(node.input)
    while given and not node.input[given - 1]:
        given -= 1          # trailing "" inputs are omitted optional ones
    if given < schema.min_input:
        raise OnnxImportError(f"node {label!r} ({node.op_type}): {given} input(s), opset "
                              f"{opset} needs at least {schema.min_input}")
    if given > schema.max_input:
        raise OnnxImportError(f"node {label!r} ({node.op_type}): {given} inputs, opset "
                              f"{opset} takes at most {schema.max_input}")
    have = {a.name for a in node.attribute}
    for name, a in schema.attributes.items():
        if a.required and name not in have:
            raise OnnxImportError(f"node {label!r} ({node.op_type}): the required attribute "
                                  f"{name!r} is missing (opset {opset})")


def _input_shape(vi, overrides: dict) -> tuple[tuple, str]:
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type"):
        raise OnnxImportError(f"input {vi.name!r}: only tensor inputs are supported")
    if tt.elem_type not in ONNX_DTYPES:
        raise OnnxImportError(f"input {vi.name!r}: element type "
                              f"{ONNX_DTYPE_NAMES.get(tt.elem_type, tt.elem_type)} is not "
                              "supported (supported: FLOAT, DOUBLE, INT32, INT64, BOOL)")
    dtype = ONNX_DTYPES[tt.elem_type]
    dims = list(tt.shape.dim)
    if vi.name in overrides:
        want = user_dims(overrides[vi.name], f"input_shapes[{vi.name!r}]")
        if len(want) != len(dims) and tt.HasField("shape"):
            raise OnnxImportError(f"input_shapes[{vi.name!r}] = {want} has rank {len(want)}; "
                                  f"the model declares rank {len(dims)}")
        for i, (d, w) in enumerate(zip(dims, want)):
            if d.HasField("dim_value") and d.dim_value != w and not isinstance(w, str):
                raise OnnxImportError(f"input_shapes[{vi.name!r}] = {want}: dim {i} is fixed to "
                                      f"{d.dim_value} by the model")
        return want, dtype
    if not tt.HasField("shape"):
        raise OnnxImportError(f"input {vi.name!r} has no shape: pass input_shapes="
                              f"{{{vi.name!r}: (...)}}")
    shape = []
    for i, d in enumerate(dims):
        if d.HasField("dim_value") and d.dim_value >= 0:
            shape.append(int(d.dim_value))
        else:     # a dim_param is a named symbol; an unknown size an anonymous one
            shape.append(symbol_name(d.dim_param) if d.dim_param else None)
    return tuple(shape), dtype


def symbol_name(dim_param: str) -> str:
    """An ONNX dim_param as an rlxc dimension symbol (letters, digits, _ and ., starting
    with a letter or _): other characters become _."""
    out = re.sub(r"[^A-Za-z0-9_.]", "_", dim_param)
    return out if out[:1].isalpha() or out[:1] == "_" else "_" + out


def from_onnx(model, name: str | None = None, input_shapes: dict | None = None):
    """An rlxc Func computing the ONNX model: its graph inputs are the Func's inputs, its
    float initializers bound params under their ONNX names (except those read as shapes,
    scales or BatchNormalization statistics: constants), its outputs in graph order.

    `model`: a path (external data is read from beside it) or an onnx.ModelProto.
    Dynamic (dim_param) dims are symbols, so one Func runs at any size; `input_shapes`
    overrides an input's shape, {"x": (4, 784)} (ints, or symbol names).
    Raises UnsupportedOnnxOp listing every node rlxc cannot express."""
    from rlxc.func import Func

    from .onnx_rules import RULES, Ctx

    m = load_model(model)
    opset = opset_of(m)
    g = m.graph
    check_supported(m, opset)
    overrides = dict(input_shapes or {})
    inits = {t.name: t for t in g.initializer}
    unknown = [k for k in overrides if k not in {vi.name for vi in g.input}]
    if unknown:
        names = ", ".join(vi.name for vi in g.input if vi.name not in inits)
        raise OnnxImportError(f"input_shapes: {unknown[0]!r} is not an input of the model; "
                              f"inputs: {names}")
    graph_inputs = [(vi.name, *_input_shape(vi, overrides)) for vi in g.input
                    if vi.name not in inits]
    consts, params = {}, {}
    read_static = {x for node in g.node if node.op_type in RULES
                   for i, x in enumerate(node.input) if i in RULES[node.op_type].static_inputs}
    for t in g.initializer:
        a = tensor_array(t)
        if a.dtype.kind == "f" and t.name not in read_static:
            params[t.name] = a.astype(np.float64 if a.dtype == np.float64 else np.float32)
        else:
            consts[t.name] = a
    fname = name or func_name(g.name)

    def build(s):
        env = dict(consts)
        for n, shape, dtype in graph_inputs:
            env[n] = s.input(n, shape, dtype)
        for n, a in params.items():
            env[n] = s.param(n, a.shape, "f64" if a.dtype == np.float64 else "f32")
        cx = Ctx(s, opset)
        for i, node in enumerate(g.node):
            missing = [x for x in node.input if x and x not in env]
            if missing:
                raise OnnxImportError(f"node {node_label(node, i)!r} ({node.op_type}): input "
                                      f"{missing[0]!r} is not a graph input, initializer or "
                                      "output of an earlier node (nodes must be in "
                                      "topological order)")
            check_schema(node, node_label(node, i), opset)
            ins = [env[x] if x else None for x in node.input]
            rule = RULES[node.op_type]
            try:
                outs = rule.fn(cx, node, ins, attrs_of(node))
            except OnnxImportError as e:
                raise OnnxImportError(f"node {node_label(node, i)!r} ({node.op_type}): {e}") \
                    from None
            except (ValueError, TypeError, IndexError, KeyError, NotImplementedError) as e:
                raise OnnxImportError(f"node {node_label(node, i)!r} ({node.op_type}): "
                                      f"{type(e).__name__}: {e}") from e
            outs = outs if isinstance(outs, (list, tuple)) else [outs]
            for j, o in enumerate(node.output):
                if not o:
                    continue
                if j >= len(outs) or outs[j] is None:
                    raise OnnxImportError(f"node {node_label(node, i)!r} ({node.op_type}): "
                                          f"output #{j} ({o!r}) is not supported")
                env[o] = outs[j]
        res = []
        for vo in g.output:
            if vo.name not in env:
                raise OnnxImportError(f"graph output {vo.name!r} is computed by no node")
            v = env[vo.name]
            res.append(v if not isinstance(v, np.ndarray) else s.constant(v, cx.dtype_of(v)))
        return tuple(res) if len(res) != 1 else res[0]

    return Func(fname, build).with_params(params)


def func_name(graph_name: str) -> str:
    n = re.sub(r"\W", "_", graph_name or "")
    return n if n and not n[0].isdigit() else "onnx_model" if not n else "m_" + n


def with_loss(f, loss: str, labels: str = "labels"):
    """`f` with a loss of its output 0 against a new `labels` input as output 0 (the model's
    outputs follow): "cross_entropy" (integer class labels, shape of output 0 without its
    last axis) or "mse" (targets of output 0's shape). For --train on an ONNX model."""
    from rlxc.func import Func

    if loss not in ("mse", "cross_entropy"):
        raise OnnxImportError(f"unknown loss {loss!r}; valid: mse, cross_entropy")
    sig = f.signature()
    if any(a.name == labels for a in sig):
        raise OnnxImportError(f"the model already has an argument named {labels!r}")
    out0 = f.output_shapes()[0]

    def build(s):
        args = {a.name: (s.input if a.kind == "input" else s.param)(a.name, a.shape, a.dtype)
                for a in sig}
        outs = s.call(f, args)
        if loss == "cross_entropy":
            y = s.input(labels, out0[:-1], "i32")
            val = outs[0].cross_entropy(y)
        else:
            y = s.input(labels, out0, "f32")
            val = outs[0].mse(y)
        return (val, *outs)

    return Func(f.name, build).with_params(f.params())

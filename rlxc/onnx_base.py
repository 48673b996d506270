"""Shared pieces of the ONNX rule tables (rlxc/onnx_rules.py, rlxc/onnx_rules_nn.py).

A value is an rlxc Tensor or, when known at trace time, a NumPy array; `Ctx.T` makes
a Tensor of either, `static` demands an array (naming the operand otherwise).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .onnx_import import OnnxImportError

_NP_TO_DTYPE = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64",
                np.dtype(np.int32): "i32", np.dtype(np.int64): "i64", np.dtype(np.bool_): "i1"}


@dataclass(frozen=True)
class Rule:
    fn: Callable
    unsupported: Callable = lambda node, at, opset: None
    # inputs read at import time (shapes, axes, pads, scales, ...; BatchNormalization's
    # running statistics): a float initializer feeding one is a constant, not a param
    static_inputs: tuple = ()


class Ctx:
    """What a rule needs: the scope it traces into, the model's opset, conversions."""

    def __init__(self, scope, opset: int):
        self.s, self.opset = scope, opset

    @staticmethod
    def dtype_of(a: np.ndarray) -> str:
        dt = _NP_TO_DTYPE.get(np.asarray(a).dtype)
        if dt is None:
            raise OnnxImportError(f"array of dtype {np.asarray(a).dtype} is not supported")
        return dt

    def T(self, v, like=None):
        """`v` as a Tensor (an array becomes a constant, of `like`'s dtype if given)."""
        from rlxc.tensor import Tensor

        if isinstance(v, Tensor):
            return v
        a = np.asarray(v)
        return self.s.constant(a, like.dtype if like is not None else self.dtype_of(a))


def static(v, what: str) -> np.ndarray:
    """`v` as an array known at trace time, or a clear error naming `what`."""
    if isinstance(v, np.ndarray):
        return v
    if isinstance(v, (int, float, np.number)):
        return np.asarray(v)
    raise OnnxImportError(f"{what} must be known when the model is imported (a constant, an "
                          f"initializer or computed from static shapes), not a runtime tensor")


def axis_of(a, rank: int, what: str) -> int:
    """An ONNX axis attribute or input in [-rank, rank) as its index; outside, an error
    naming it (ONNX rejects such a model; wrapping it around would run another axis)."""
    a = int(a)
    if not -rank <= a < rank:
        raise OnnxImportError(f"{what} {a} is out of range for a rank-{rank} tensor "
                              f"(valid: {-rank} to {rank - 1})")
    return a % rank


def is_static(*vs) -> bool:
    return all(v is None or isinstance(v, np.ndarray) for v in vs)


def tensors(cx, *vs):
    """All operands as Tensors of one dtype (the first Tensor's), arrays made constants."""
    from rlxc.tensor import Tensor

    like = next((v for v in vs if isinstance(v, Tensor)), None)
    return [cx.T(v, like) for v in vs]


def attr_text(v) -> str:
    return v.decode() if isinstance(v, bytes) else v


def ints_of(v) -> list:
    """The ints of a static shape-like array; a dynamic dim (SymDim) gives its symbol."""
    return [x.name if isinstance(x, SymDim) else int(x) for x in np.asarray(v).reshape(-1)]


class SymDim:
    """A dynamic dimension inside a static shape array (Shape of a tensor with a symbol,
    as an object array): Gather, Unsqueeze, Concat and Reshape carry it through; any
    arithmetic or int() on it is an error naming the symbol (never a silent value)."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self):
        return self.name

    def __eq__(self, other):
        return isinstance(other, SymDim) and other.name == self.name

    def __hash__(self):
        return hash(("SymDim", self.name))

    def _fail(self, *_):
        raise OnnxImportError(f"shape arithmetic on dynamic dimension {self.name!r} (a "
                              "dim_param) is not supported; give its size with input_shapes=")
    __int__ = __index__ = __float__ = __bool__ = _fail
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _fail
    __floordiv__ = __rfloordiv__ = __truediv__ = __rtruediv__ = __mod__ = __neg__ = _fail
    __lt__ = __le__ = __gt__ = __ge__ = _fail


def shape_array(shape) -> np.ndarray:
    """A tensor's shape as a static int64 array; with symbols an object array of SymDim."""
    if any(isinstance(d, str) for d in shape):
        return np.array([SymDim(d) if isinstance(d, str) else int(d) for d in shape], object)
    return np.asarray(shape, np.int64)

"""`rlx.iota`: arange(size) as i32, where `size` is a dynamic dimension (a symbol).

    %i = rlx.iota size = -1 : tensor<?xi32, ["B"]>        the counters 0..B-1

Only symbolic shapes need it: a static arange is a small rlx.constant (what the tracer
emits for static dims), so the op exists only in dynamic modules: dialect/specialize.py
turns it into that constant at the call's sizes, except for the CPU's size-generic
lowering (lowering/cpu/dynsizes.py), which keeps it and computes the counters from the
loop index (loops.IndexValue) so that no constant holds data of the sampled sizes.  The
interpreter evaluates it at the call's sizes.  It has no operands, so every transform
treats it as shared (vmap clones it, grad and jvp see no active operand) and
constant folding leaves it alone.  Users: rlxc.random's element counters and
the tracer emits it through rlxc.random._iota (xDSL-free).
"""
from __future__ import annotations

from typing import ClassVar

from xdsl.dialects.builtin import IntegerAttr, TensorType, i64
from xdsl.irdl import irdl_op_definition, prop_def, result_def, traits_def
from xdsl.traits import Pure

from .ops import RlxOp
from .shapes import ShapeError


def infer_iota(types, size):
    if types:
        raise ShapeError(f"iota: takes no operands, got {len(types)}")
    if not isinstance(size, str) and size < 0:
        raise ShapeError(f"iota: size must be >= 0, got {size}")
    return (size,), "i32"


@irdl_op_definition
class IotaOp(RlxOp):
    """arange(size) as i32 along one dynamic dimension (see the module doc).

    Example:

        %i = rlx.iota size = -1 : tensor<?xi32, ["B"]>
    """

    name = "rlx.iota"
    FAMILY: ClassVar[str] = "iota"
    PARAMS: ClassVar[dict] = {"size": "int"}
    size = prop_def(IntegerAttr[i64])
    result = result_def(TensorType)
    traits = traits_def(Pure())
    assembly_format = "`size` `=` $size attr-dict `:` type($result)"

    @staticmethod
    def infer(types, **params):
        return infer_iota(types, **params)

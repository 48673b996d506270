"""Zero-size tensors before scheduling: every empty computation becomes a constant.

    rlx op with a zero-size result            ──► rlx.constant (no elements)
    non-empty result read from empty operands ──► by op, from EMPTY_RULES:
        sum / prod / mean over an empty axis      splat 0 / 1 / NaN (NumPy's values)
        matmul with K == 0, scatter_add of no     splat 0
          updates, pad of an empty tensor
        concat with empty pieces                  concat of the others (or the one left)
        max / min over an empty axis              ValueError naming the op (NumPy raises)
        gather from an empty table                CPU: kept, its index check always raises;
                                                  GPU (gathers clamp, no error channel): 0

Why: the loop builders assume every extent is positive (a size-0 dim would
divide by zero when loops are collapsed or a flat index is delinearized), and
nothing has to be computed anyway: an empty result holds no data, and a
non-empty result of empty operands is a constant whose value the op alone
decides.  The CPU schedule and the GPU plan both start from this rewrite.
Dynamic dims (-1) are never zero here.  Like smallmm, the module is cloned
only when something is rewritten; the caller's module is never mutated.
"""
from __future__ import annotations

import numpy as np
from xdsl.dialects import func
from xdsl.dialects.builtin import BytesAttr, DenseIntOrFPElementsAttr
from xdsl.ir import SSAValue

from rlxc.dialect.ops import OPS, ConstantOp, make_op
from rlxc.dialect.types import NP_DTYPES, dense_attr, dtype_of, shape_of


def _is_empty(v) -> bool:
    return 0 in shape_of(v.type)


def _splat(value):
    """A rule: replace the op by a splat constant of `value` at the result's type."""
    def rule(op):
        typ = op.results[0].type
        dt = dtype_of(typ)
        raw = np.asarray([value]).astype(np.int8 if dt == "i1" else NP_DTYPES[dt]).tobytes()
        return ConstantOp.create(result_types=[typ], properties={
            "value": DenseIntOrFPElementsAttr(typ, BytesAttr(raw))})
    return rule


def _no_identity(op):
    raise ValueError(f"{op.name}: reduction over an empty axis of "
                     f"{shape_of(op.operands[0].type)} has no identity (NumPy raises too)")


def _concat(op):
    keep = [v for v in op.operands if not _is_empty(v)]
    if len(keep) == 1:
        return keep[0]
    return make_op(OPS["rlx.concat"], keep, axis=op.params()["axis"])


# op name -> rule(op) -> a new op to insert (its result replaces op's) or an existing value.
# Ops missing here cannot have a non-empty result with an empty operand (elementwise ops,
# views and broadcast_to keep the element count or a zero extent), except gather (below).
EMPTY_RULES = {
    "rlx.sum": _splat(0),
    "rlx.prod": _splat(1),
    "rlx.mean": _splat(np.nan),
    "rlx.max": _no_identity,
    "rlx.min": _no_identity,
    "rlx.matmul": _splat(0),
    "rlx.scatter_add": _splat(0),
    "rlx.pad": _splat(0),
    "rlx.concat": _concat,
}


# where a gather has no index check (the GPU clamps indices), a row of an empty table
# cannot be read at all: every index is out of range, and the result is zeros
UNCHECKED_RULES = {**EMPTY_RULES, "rlx.gather": _splat(0)}


def _needs(op, rules) -> bool:
    if isinstance(op, (func.ReturnOp, ConstantOp)) or not op.results:
        return False
    if _is_empty(op.results[0]):
        return True
    return op.name in rules and any(_is_empty(v) for v in op.operands)


def rewrite_empty(module, checked_indices: bool = True):
    """`module`, or a rewritten clone of it, with no computation on zero-size tensors.

    checked_indices=False is for backends whose gathers do not raise (the GPU)."""
    from rlxc.dialect.module import get_func

    rules = EMPTY_RULES if checked_indices else UNCHECKED_RULES
    if not any(_needs(op, rules) for op in get_func(module).body.block.ops):
        return module
    module = module.clone()
    block = get_func(module).body.block
    for op in list(block.ops):
        if not _needs(op, rules):
            continue
        res = op.results[0]
        if _is_empty(res):
            dt = dtype_of(res.type)
            new = ConstantOp.create(result_types=[res.type], properties={
                "value": dense_attr(np.zeros(shape_of(res.type), NP_DTYPES[dt]), dt)})
        else:
            new = rules[op.name](op)
        if not isinstance(new, SSAValue):  # an op to insert, not an existing value
            block.insert_op_before(new, op)
            new = new.results[0]
        res.replace_all_uses_with(new)
        block.erase_op(op)
    return module


__all__ = ["rewrite_empty", "EMPTY_RULES", "UNCHECKED_RULES"]

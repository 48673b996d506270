"""constant-fold: evaluate ops whose operands are all constants.

Algorithm: one forward walk per function block (so folded results feed later
folds in the same walk). An rlx op whose operands are all `rlx.constant` is
evaluated with the reference interpreter's rule (`interpreter.EVAL_RULES`, at
the declared element type) and replaced by a constant, but only when that
keeps the graph small:
- all operands are splats and the op is elementwise (unary, binary, compare,
  select, fake_quant, cast) or a pure relayout (reshape, broadcast_to,
  transpose, slice): the rule runs on one element and the result is a splat
  of any size, stored once;
- a float sum/mean/max/min of a splat is a splat in closed form (count x value,
  computed in float64; the value): a dynamic mean's count sum(ones) folds at every size,
  so a size-generic program (lowering/cpu/dynsizes.py) has the same graph at each;
- otherwise the result has at most FOLD_LIMIT elements (and the operands at
  most INPUT_LIMIT in all, so a reduction of a huge splat is not expanded at
  compile time). broadcast_to of a
  non-splat is never folded: it is a view in the lowering and folding would
  materialize copies.
Ops whose evaluation raises (a gather index out of range) are left for run
time, and so are results holding inf or NaN: xDSL prints those as hex bit
patterns it does not parse back, and the module text must round-trip.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from xdsl.context import Context
from xdsl.dialects.builtin import BytesAttr, DenseIntOrFPElementsAttr, ModuleOp
from xdsl.passes import ModulePass

from .canonicalize import blocks, replace_op
from .interpreter import EVAL_RULES
from .ops import OPS, ConstantOp, RlxOp
from .symdims import is_dynamic
from .types import NP_DTYPES, dense_attr, dense_value, dtype_of, is_splat, numel, shape_of

FOLD_LIMIT = 4096
INPUT_LIMIT = 1 << 20
_ELEMENTWISE = {n for n, c in OPS.items() if c.FAMILY in ("unary", "binary", "compare", "select")}
_ELEMENTWISE.add("rlx.cast")
_RELAYOUT = {"rlx.reshape", "rlx.broadcast_to", "rlx.transpose", "rlx.slice"}
_SPLAT_REDUCE = {"rlx.sum", "rlx.mean", "rlx.max", "rlx.min"}


def _reduce_splat(op: RlxOp, attr, n: int):
    """A float sum/mean/max/min of the splat `attr` over n outputs: the value (float64 for
    a sum, rounded once), or None (not a float, or nothing reduced)."""
    src = shape_of(attr.type)
    if dtype_of(attr.type) not in ("f32", "f64") or is_dynamic(src) or not numel(src):
        return None
    v = _first(attr)
    if op.name != "rlx.sum":
        return v
    with np.errstate(over="ignore"):   # an overflow to inf: _finite keeps it an op
        return np.asarray([float(v[0]) * (numel(src) // n)]).astype(v.dtype)


def evaluate(op: RlxOp, arrays: list[np.ndarray]) -> np.ndarray:
    """The op's result on NumPy inputs, exactly as the reference interpreter computes it."""
    rdt = NP_DTYPES[dtype_of(op.results[0].type)]
    with np.errstate(all="ignore"):
        if op.name == "rlx.cast":
            x = arrays[0]
            if np.dtype(rdt).kind in "iu" and x.dtype.kind == "f":
                x = np.trunc(x)
            return x.astype(rdt)
        val = np.asarray(EVAL_RULES[op.name](*arrays, **op.params()))
    return val.astype(rdt) if val.dtype != rdt else val


def _splat_attr(value, typ) -> DenseIntOrFPElementsAttr:
    dt = dtype_of(typ)
    npdt = np.int8 if dt == "i1" else NP_DTYPES[dt]
    return DenseIntOrFPElementsAttr(typ, BytesAttr(np.asarray([value]).astype(npdt).tobytes()))


def _first(attr) -> np.ndarray:
    dt = dtype_of(attr.type)
    flat = np.frombuffer(attr.data.data, dtype=np.int8 if dt == "i1" else NP_DTYPES[dt])[:1]
    return flat.astype(np.bool_) if dt == "i1" else flat.copy()


def _finite(val: np.ndarray) -> bool:
    return val.dtype.kind != "f" or bool(np.all(np.isfinite(val)))


def fold_op(op: RlxOp):
    """The constant attribute `op` folds to, or None when it should not be folded."""
    typ = op.results[0].type
    attrs = [o.owner.value for o in op.operands]
    if is_dynamic(shape_of(typ)):
        return None       # its size is known per call: it stays an op
    n = numel(shape_of(typ))
    try:
        if n > 0 and all(is_splat(a) for a in attrs) and (
                op.name in _ELEMENTWISE or op.name in _RELAYOUT):
            if op.name in _RELAYOUT:
                val = _first(attrs[0])
            else:
                val = evaluate(op, [_first(a) for a in attrs])
            return _splat_attr(val[0], typ) if _finite(val) else None
        if n > 0 and op.name in _SPLAT_REDUCE and is_splat(attrs[0]):
            val = _reduce_splat(op, attrs[0], n)
            if val is not None:
                return _splat_attr(val[0], typ) if _finite(val) else None
        if n > FOLD_LIMIT or op.name == "rlx.broadcast_to" or \
                sum(numel(shape_of(a.type)) for a in attrs) > INPUT_LIMIT:
            return None
        val = evaluate(op, [dense_value(a) for a in attrs])
    except (ArithmeticError, IndexError, ValueError):
        return None
    if not _finite(val) or val.shape != shape_of(typ):
        return None
    return dense_attr(val, dtype_of(typ))


def constant_fold(module: ModuleOp) -> int:
    """Fold constant subexpressions in place; returns the number of ops folded."""
    count = 0
    for block in blocks(module):
        for op in list(block.ops):
            if not isinstance(op, RlxOp) or isinstance(op, ConstantOp) or not op.operands:
                continue
            if not all(isinstance(o.owner, ConstantOp) for o in op.operands):
                continue
            attr = fold_op(op)
            if attr is None:
                continue
            c = ConstantOp.create(result_types=[op.results[0].type], properties={"value": attr})
            block.insert_op_before(c, op)
            replace_op(block, op, c.results[0])
            count += 1
    return count


@dataclass(frozen=True)
class ConstantFoldPass(ModulePass):
    """Constant folding: ops on constants become constants (small or splat results only)."""

    name = "constant-fold"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        constant_fold(op)

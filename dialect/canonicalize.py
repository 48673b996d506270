"""canonicalize: local algebraic simplifications of rlx ops.

Algorithm: one forward walk over each function block. `CANON_RULES[op.name]`
looks at the op (and the ops defining its operands) and returns the value that
replaces its result, or None. A rule may insert new ops before `op` (e.g. the
composed transpose); the replaced op is erased and ops it left without users
are removed later by dce. Because the walk runs forward, users see rewritten
operands, and chains (neg(neg(neg x)), transpose of transpose of transpose)
collapse in one walk. `cleanup` repeats the passes to a fixed point. A direct
walk is used instead of xDSL's PatternRewriteWalker: it is several times
faster on graphs of thousands of ops.

Rules (x: any value, c: a constant operand, also a broadcast one, as the tracer's scalars):
- x + 0, 0 + x, x - 0, x * 1, 1 * x, x / 1  ->  x
  (the sign of zero is not preserved: -0.0 + 0.0 is +0.0 in IEEE, these rules
  treat the two zeros alike, as compilers do under no-signed-zeros)
- x * 0, 0 * x -> 0 only where x is provably finite: an integer tensor, or a
  constant whose values are all finite. A runtime float input may hold inf or
  NaN (inf * 0 is NaN), so there the multiply stays.
- neg(neg x) -> x; stop_gradient(stop_gradient x) -> stop_gradient x;
  select(c, x, x) -> x
- transpose(transpose x) -> one transpose with the composed perm; an identity
  perm is removed
- reshape(reshape x) -> reshape x; broadcast_to(broadcast_to x) -> broadcast_to x
- reshape / broadcast_to / cast to the operand's own type are removed; so are
  a full unit-stride slice, a zero pad and a one-input concat
- a reduction over no axes is removed; over axes that all have size 1 it is a
  reshape (or nothing, with keepdims)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from .ops import OPS, ConstantOp, make_op
from .types import dense_value, dtype_of, is_splat, numel, shape_of, splat_element

SMALL = 4096  # non-splat constants up to this many elements are inspected


# ---------------------------------------------------------------- shared helpers

def blocks(module: ModuleOp):
    """The body blocks of every function in the module, then the blocks of the regions
    inside them (rlx.scan/while/if bodies), outer before inner."""
    out = [op.body.block for op in module.ops if isinstance(op, func.FuncOp)]
    for block in out:  # grows while walking: nested regions are visited too
        for op in block.ops:
            out.extend(b for r in op.regions for b in r.blocks)
    return out


def defining(v, name: str):
    """The op named `name` that defines `v`, or None."""
    owner = v.owner
    return owner if getattr(owner, "name", None) == name else None


def _through_broadcast(v):
    """The source of a broadcast_to (the tracer's scalars: a rank-0 constant broadcast)."""
    op = v.owner
    return op.operands[0] if getattr(op, "name", None) == "rlx.broadcast_to" else v


def splat_scalar(v):
    """If `v` is a constant with one value everywhere (or one broadcast), that value (a NumPy
    scalar); else None."""
    op = _through_broadcast(v).owner
    if not isinstance(op, ConstantOp):
        return None
    attr = op.value
    if is_splat(attr):
        return splat_element(attr)
    n = numel(shape_of(attr.type))
    if n == 0 or n > SMALL:
        return None
    arr = dense_value(attr).reshape(-1)
    return arr[0] if np.all(arr == arr[0]) else None


def is_const(v, value) -> bool:
    s = splat_scalar(v)
    return s is not None and s == value


def finite(v) -> bool:
    """True when every element of `v` is provably finite."""
    if dtype_of(v.type) not in ("f32", "f64"):
        return True
    v = _through_broadcast(v)
    op = v.owner
    if not isinstance(op, ConstantOp):
        return False
    s = splat_scalar(v)
    if s is not None:
        return bool(math.isfinite(s))
    if numel(shape_of(v.type)) > SMALL:
        return False
    return bool(np.all(np.isfinite(dense_value(op.value))))


def replace_op(block, op, value) -> None:
    """Replace the single result of `op` by `value` and erase `op`."""
    op.results[0].replace_all_uses_with(value)
    block.erase_op(op)


def insert_before(block, op, cls, operands, **params):
    new = make_op(cls, operands, **params)
    block.insert_op_before(new, op)
    return new.results[0]


# ---------------------------------------------------------------- rules

def _add(block, op):
    a, b = op.operands
    if is_const(b, 0):
        return a
    if is_const(a, 0):
        return b
    return None


def _sub(block, op):
    a, b = op.operands
    return a if is_const(b, 0) else None


def _mul(block, op):
    a, b = op.operands
    if is_const(b, 1):
        return a
    if is_const(a, 1):
        return b
    if is_const(b, 0) and finite(a):
        return b
    if is_const(a, 0) and finite(b):
        return a
    return None


def _div(block, op):
    a, b = op.operands
    return a if is_const(b, 1) else None


def _neg(block, op):
    inner = defining(op.operands[0], "rlx.neg")
    return inner.operands[0] if inner is not None else None


def _stop_gradient(block, op):
    inner = defining(op.operands[0], "rlx.stop_gradient")
    return inner.results[0] if inner is not None else None


def _select(block, op):
    _, a, b = op.operands
    return a if a is b else None


def _same_type(block, op):
    x = op.operands[0]
    return x if x.type == op.results[0].type else None


def _transpose(block, op):
    x = op.operands[0]
    perm = op.params()["perm"]
    inner = defining(x, "rlx.transpose")
    if inner is not None:
        # result dim i = inner dim perm[i] = source dim inner_perm[perm[i]]
        ip = inner.params()["perm"]
        perm = tuple(ip[p] for p in perm)
        x = inner.operands[0]
    if perm == tuple(range(len(perm))):
        return x
    if inner is None:
        return None
    return insert_before(block, op, OPS["rlx.transpose"], [x], perm=perm)


def _chain(opname):
    """reshape(reshape x) / broadcast_to(broadcast_to x): one op from the source."""
    def rule(block, op):
        x = op.operands[0]
        inner = defining(x, opname)
        if inner is not None:
            x = inner.operands[0]
        if x.type == op.results[0].type:
            return x
        if inner is None:
            return None
        return insert_before(block, op, OPS[opname], [x], shape=op.params()["shape"])
    return rule


def _slice(block, op):
    x = op.operands[0]
    p = op.params()
    if all(s == 0 for s in p["starts"]) and all(s == 1 for s in p["strides"]) \
            and x.type == op.results[0].type:
        return x
    return None


def _pad(block, op):
    p = op.params()
    return op.operands[0] if not any(p["low"]) and not any(p["high"]) else None


def _concat(block, op):
    return op.operands[0] if len(op.operands) == 1 else None


def _reduce(block, op):
    x = op.operands[0]
    p = op.params()
    shp = shape_of(x)
    if any(shp[a] != 1 for a in p["axes"]):
        return None
    if p["keepdims"] or not p["axes"]:
        return x
    return insert_before(block, op, OPS["rlx.reshape"], [x], shape=shape_of(op.results[0]))


CANON_RULES = {
    "rlx.add": _add,
    "rlx.sub": _sub,
    "rlx.mul": _mul,
    "rlx.div": _div,
    "rlx.neg": _neg,
    "rlx.stop_gradient": _stop_gradient,
    "rlx.select": _select,
    "rlx.transpose": _transpose,
    "rlx.reshape": _chain("rlx.reshape"),
    "rlx.broadcast_to": _chain("rlx.broadcast_to"),
    "rlx.cast": _same_type,
    "rlx.slice": _slice,
    "rlx.pad": _pad,
    "rlx.concat": _concat,
    **{n: _reduce for n, cls in OPS.items() if cls.FAMILY == "reduce"},
}


# ---------------------------------------------------------------- entry points

def canonicalize(module: ModuleOp) -> int:
    """Apply CANON_RULES in place; returns the number of rewrites."""
    count = 0
    for block in blocks(module):
        for op in list(block.ops):
            rule = CANON_RULES.get(op.name)
            if rule is None or op.parent is None:
                continue
            v = rule(block, op)
            if v is not None and v is not op.results[0]:
                replace_op(block, op, v)
                count += 1
    return count


@dataclass(frozen=True)
class CanonicalizePass(ModulePass):
    """Algebraic simplifications: x*1, x+0, neg(neg x), transpose/reshape/broadcast chains."""

    name = "canonicalize"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        canonicalize(op)

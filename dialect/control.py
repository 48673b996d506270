"""Control flow of the rlx dialect: `rlx.scan`, `rlx.while`, `rlx.if`, `rlx.yield`.

Ops with regions, as MLIR's scf and StableHLO, never unrolled.  Every region
is isolated from above: captures of outer values are explicit operands, so a
body is a function of its block arguments and each transform treats it as
one (dialect/control_ad.py turns bodies into modules and back).

    %c, %ys = "rlx.scan"(%init, %xs, %w) <{length = 8, num_carry = 1, num_xs = 1}> ({
    ^bb0(%h: tensor<4xf32>, %x: tensor<4xf32>, %w: tensor<4x4xf32>):   // carry, slice, capture
      ...
      rlx.yield %h2, %y : tensor<4xf32>, tensor<4xf32>                 // carry, y slice
    }) : (...) -> (tensor<4xf32>, tensor<8x4xf32>)                     // carry, stacked ys

- scan: operands [carries (num_carry), xs (num_xs, scanned along axis 0, each of
  `length` rows), captures]; block arguments are the carries, one row of each xs
  and the captures; the body yields the new carries and one row of each y; the
  results are the final carries and the ys stacked along a new axis 0.  `reverse`
  walks the rows from the last (ys keep their positions, as jax.lax.scan).
- while: operands [carries (num_carry), captures]; regions `cond` (yields a
  rank-0 i1) and `body` (yields the new carries), both with block arguments of
  the operands' types; results are the final carries.
- if: operands [pred (rank-0 i1 or integer), operands...]; regions `then` and
  `else` take the operands and yield the results (same types in both).

Printed in MLIR's generic op form (the bodies in the custom form of each op),
which the parser reads back.  `CONTROL_EVAL` holds the interpreter's rules.
"""
from __future__ import annotations

import numpy as np
from xdsl.dialects.builtin import IntegerAttr, TensorType, UnitAttr, i64
from xdsl.ir import Block, Region
from xdsl.irdl import (
    IRDLOperation,
    irdl_op_definition,
    opt_prop_def,
    prop_def,
    region_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.traits import IsolatedFromAbove, IsTerminator
from xdsl.utils.exceptions import VerifyException

from .symdims import DYN
from .types import NP_DTYPES, dtype_of, shape_of, tensor_type


def _fmt(types) -> str:
    return "(" + ", ".join(str(t) for t in types) + ")"


def _yield_types(region) -> list:
    term = region.block.last_op
    if not isinstance(term, YieldOp):
        raise VerifyException("a control-flow region must end with rlx.yield")
    return [o.type for o in term.operands]


def _check_args(op: str, regions, want: list) -> None:
    """Each (what, region) of `regions` must take block arguments of the types `want`."""
    for what, r in regions:
        if _arg_types(r) != want:
            raise VerifyException(f"{op}: {what} arguments {_fmt(_arg_types(r))} should be "
                                  f"{_fmt(want)}")


def _check_results(op, want: list) -> None:
    """The region op `op` must have results of the types `want`."""
    if [r.type for r in op.outs] != want:
        raise VerifyException(f"{op.name}: results {_fmt(r.type for r in op.outs)} should be "
                              f"{_fmt(want)}")


def _arg_types(region) -> list:
    return [a.type for a in region.block.args]


@irdl_op_definition
class YieldOp(IRDLOperation):
    """Terminator of a region of rlx.scan / rlx.while / rlx.if: the values it passes on.

    Example:

        rlx.yield %h, %y : tensor<4xf32>, tensor<4xf32>
    """

    name = "rlx.yield"
    values = var_operand_def(TensorType)
    traits = traits_def(IsTerminator())
    assembly_format = "($values^ `:` type($values))? attr-dict"


class ControlOp(IRDLOperation):
    """Shared helpers of the region ops."""

    def params(self) -> dict:
        out = {}
        for k in ("length", "num_carry", "num_xs"):
            if k in self.properties:
                out[k] = int(self.properties[k].value.data)
        if self.name == "rlx.scan":
            out["reverse"] = "reverse" in self.properties
            if out["length"] == DYN:   # a symbolic length: axis 0 of an xs or of a y
                out["length"] = _scan_symbol(self, out["num_carry"], out["num_xs"])
        return out


def _scan_symbol(op, nc: int, nx: int):
    """The symbol a scan's DYN length stands for: axis 0 of its first xs, else of its
    first stacked y (the tracer refuses a symbolic length with neither)."""
    for t in [o.type for o in op.operands[nc:nc + nx]] + [r.type for r in op.results[nc:]]:
        s = shape_of(t)
        if s and isinstance(s[0], str):
            return s[0]
    raise VerifyException("rlx.scan: a dynamic length (stored as -1) needs an xs operand "
                          "or a y result whose axis 0 names the symbol")


@irdl_op_definition
class ScanOp(ControlOp):
    """Loop over axis 0 of `xs` with carries; captures are explicit operands (see module doc)."""

    name = "rlx.scan"
    inputs = var_operand_def(TensorType)
    outs = var_result_def(TensorType)
    body = region_def("single_block")
    length = prop_def(IntegerAttr[i64])
    num_carry = prop_def(IntegerAttr[i64])
    num_xs = prop_def(IntegerAttr[i64])
    reverse = opt_prop_def(UnitAttr)
    traits = traits_def(IsolatedFromAbove())

    def verify_(self) -> None:
        p = self.params()
        n, nc, nx = p["length"], p["num_carry"], p["num_xs"]
        ops = [o.type for o in self.inputs]
        if (not isinstance(n, str) and n < 0) or nc < 0 or nx < 0 or nc + nx > len(ops):
            raise VerifyException(f"rlx.scan: bad length/num_carry/num_xs {n}/{nc}/{nx} for "
                                  f"{len(ops)} operands")
        rows = []
        for t in ops[nc:nc + nx]:
            s = shape_of(t)
            if not s or s[0] != n:
                raise VerifyException(f"rlx.scan: xs operand {t} is not {n} rows along axis 0")
            rows.append(tensor_type(s[1:], dtype_of(t)))
        want = ops[:nc] + rows + ops[nc + nx:]
        if _arg_types(self.body) != want:
            raise VerifyException(f"rlx.scan: body arguments {_fmt(_arg_types(self.body))} "
                                  f"should be {_fmt(want)} (carries, rows of xs, captures)")
        ys = _yield_types(self.body)
        if ys[:nc] != ops[:nc]:
            raise VerifyException(f"rlx.scan: the body yields carries {_fmt(ys[:nc])}, the "
                                  f"initial carries are {_fmt(ops[:nc])}")
        _check_results(self, ops[:nc] + [tensor_type((n,) + shape_of(t), dtype_of(t))
                                         for t in ys[nc:]])


@irdl_op_definition
class WhileOp(ControlOp):
    """Loop while `cond` yields true; carries in, final carries out (see module doc)."""

    name = "rlx.while"
    inputs = var_operand_def(TensorType)
    outs = var_result_def(TensorType)
    cond = region_def("single_block")
    body = region_def("single_block")
    num_carry = prop_def(IntegerAttr[i64])
    traits = traits_def(IsolatedFromAbove())

    def verify_(self) -> None:
        nc = self.params()["num_carry"]
        ops = [o.type for o in self.inputs]
        if not 0 <= nc <= len(ops):
            raise VerifyException(f"rlx.while: num_carry {nc} for {len(ops)} operands")
        _check_args("rlx.while", (("cond", self.cond), ("body", self.body)), ops)
        c = _yield_types(self.cond)
        if len(c) != 1 or shape_of(c[0]) != () or dtype_of(c[0]) != "i1":
            raise VerifyException(f"rlx.while: cond must yield one tensor<i1>, got {_fmt(c)}")
        if _yield_types(self.body) != ops[:nc]:
            raise VerifyException(f"rlx.while: body yields {_fmt(_yield_types(self.body))}, "
                                  f"the carries are {_fmt(ops[:nc])}")
        if [r.type for r in self.outs] != ops[:nc]:
            raise VerifyException("rlx.while: results must have the carries' types")


@irdl_op_definition
class IfOp(ControlOp):
    """`then` or `else` on the operands, chosen by a rank-0 predicate (see module doc)."""

    name = "rlx.if"
    inputs = var_operand_def(TensorType)
    outs = var_result_def(TensorType)
    then = region_def("single_block")
    orelse = region_def("single_block")
    traits = traits_def(IsolatedFromAbove())

    def verify_(self) -> None:
        ops = [o.type for o in self.inputs]
        if not ops or shape_of(ops[0]) != () or dtype_of(ops[0]) not in ("i1", "i32", "i64"):
            raise VerifyException("rlx.if: the first operand must be a rank-0 i1/i32/i64 "
                                  "predicate")
        _check_args("rlx.if", (("then", self.then), ("else", self.orelse)), ops[1:])
        t, e = _yield_types(self.then), _yield_types(self.orelse)
        if t != e:
            raise VerifyException(f"rlx.if: the branches yield different types: then "
                                  f"{_fmt(t)}, else {_fmt(e)}")
        _check_results(self, t)


CONTROL_OPS = {c.name: c for c in (ScanOp, WhileOp, IfOp, YieldOp)}
REGION_OP_CLASSES = (ScanOp, WhileOp, IfOp)


def is_control(op) -> bool:
    return isinstance(op, REGION_OP_CLASSES)


# ---------------------------------------------------------------- building

def region_of(arg_types, fill) -> Region:
    """A one-block region with arguments of `arg_types`; `fill(block)` returns the yields."""
    block = Block(arg_types=list(arg_types))
    outs = fill(block)
    block.add_op(YieldOp.create(operands=list(outs)))
    return Region(block)


def make_control(name: str, operands, result_types, regions, **params):
    """Build a region op; params: length, num_carry, num_xs, reverse (as the op takes)."""
    props = {}
    for k in ("length", "num_carry", "num_xs"):
        if k in params:
            v = params[k]   # a symbolic scan length is stored as DYN (ControlOp.params)
            props[k] = IntegerAttr(DYN if isinstance(v, str) else int(v), i64)
    if params.get("reverse"):
        props["reverse"] = UnitAttr()
    cls = CONTROL_OPS[name]
    return cls.create(operands=list(operands), result_types=list(result_types),
                      properties=props, regions=list(regions))


def scan_result_types(carry_types, y_types, length):
    return list(carry_types) + [tensor_type((length,) + shape_of(t), dtype_of(t))
                                for t in y_types]


def body_ops(region):
    """The ops of a region's block, without its yield."""
    return [op for op in region.block.ops if not isinstance(op, YieldOp)]


def yielded(region) -> list:
    return list(region.block.last_op.operands)


# ---------------------------------------------------------------- interpreter rules

def _eval_scan(op, args, run):
    p = op.params()
    n, nc, nx = p["length"], p["num_carry"], p["num_xs"]
    if isinstance(n, str):        # a dynamic length: its size in this call
        n = (getattr(run, "sizes", None) or {}).get(n, n)
        if isinstance(n, str):
            raise ValueError(f"interpreter: rlx.scan length {n!r} has no size in this call")
    carry, xs, caps = list(args[:nc]), args[nc:nc + nx], list(args[nc + nx:])
    ys = [None] * n
    for t in (range(n - 1, -1, -1) if p["reverse"] else range(n)):
        outs = run(op.body.block, carry + [x[t] for x in xs] + caps)
        carry, ys[t] = list(outs[:nc]), outs[nc:]
    stacked = []
    for j, r in enumerate(op.outs[nc:]):
        if n:
            stacked.append(np.stack([y[j] for y in ys]))
        else:
            stacked.append(np.zeros(shape_of(r.type), dtype=NP_DTYPES[dtype_of(r.type)]))
    return carry + stacked


def _eval_while(op, args, run):
    nc = op.params()["num_carry"]
    carry, caps = list(args[:nc]), list(args[nc:])
    while bool(run(op.cond.block, carry + caps)[0]):
        carry = list(run(op.body.block, carry + caps))
    return carry


def _eval_if(op, args, run):
    region = op.then if bool(args[0]) else op.orelse
    return list(run(region.block, list(args[1:])))


CONTROL_EVAL = {"rlx.scan": _eval_scan, "rlx.while": _eval_while, "rlx.if": _eval_if}


def from_trace_node(e, operands, replay) -> IRDLOperation:
    """The region op of a light-trace node (dialect/control_trace.py): each Body becomes a
    one-block region, its events replayed by module.replay, its outputs yielded."""
    regions = []
    for body in e.data:
        block = Block(arg_types=[tensor_type(v.type.shape, v.type.dtype)
                                 for v in body.block_args])
        vals = {v.index: a for v, a in zip(body.block_args, block.args)}
        replay(body.events, block, vals)
        block.add_op(YieldOp.create(operands=[vals[v.index] for v in body.outputs]))
        regions.append(Region(block))
    types = [tensor_type(r.type.shape, r.type.dtype) for r in e.results]
    return make_control(e.op, operands, types, regions, **e.params)

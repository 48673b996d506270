"""regions: cleanup across the boundary of rlx.scan / rlx.while / rlx.if.

canonicalize, constant-fold, cse and dce walk every block, region bodies
included (canonicalize.blocks); this pass does what needs both sides of a
region op.  One walk over the region ops, innermost first:

1. `rlx.if` on a constant predicate is replaced by the chosen branch, inlined.
2. Constant operands (splats, or at most SINK_LIMIT elements) passed as captures
   are sunk into the regions, so folding and canonicalization see them.
3. Loop-invariant code motion: an op of a scan or while body whose operands are
   all captures (block arguments that every iteration sees unchanged) or constants
   (at least one capture) is hoisted
   before the loop and becomes a capture itself; chains hoist in one walk.
   Expanding views (broadcast_to) stay inside: hoisting would materialize them.
4. Unused captures are dropped (operand and block arguments), and so are unused
   stacked ys of a scan, and carries whose result and block argument are both
   unused (the op is rebuilt with fewer results, its regions moved over).

`simplify_regions` returns the number of changes (cleanup's fixed point).
"""
from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from .control import REGION_OP_CLASSES, YieldOp, body_ops, make_control
from .ops import ConstantOp
from .types import is_splat, numel, shape_of

SINK_LIMIT = 4096
NO_HOIST = {"rlx.broadcast_to", "rlx.constant"}


def _region_ops(module):
    """Region ops, innermost first (post-order)."""
    out = []

    def walk(block):
        for op in block.ops:
            for r in op.regions:
                for b in r.blocks:
                    walk(b)
            if isinstance(op, REGION_OP_CLASSES):
                out.append(op)
    for f in module.ops:
        if isinstance(f, func.FuncOp):
            walk(f.body.block)
    return out


def _first_capture(op) -> int:
    """Index of the first operand that every iteration / branch sees unchanged."""
    p = op.params()
    if op.name == "rlx.scan":
        return p["num_carry"] + p["num_xs"]
    if op.name == "rlx.while":
        return p["num_carry"]
    return 1


def _off(op) -> int:
    """Operand i is block argument i - _off(op) (rlx.if: the predicate has none)."""
    return 1 if op.name == "rlx.if" else 0


def _fold_if(op) -> bool:
    pred = op.operands[0].owner
    if not isinstance(pred, ConstantOp) or not is_splat(pred.value):
        return False
    from .types import dense_value
    taken = op.then if bool(dense_value(pred.value).reshape(-1)[0]) else op.orelse
    block = op.parent_block()
    mapping = dict(zip(taken.block.args, op.operands[1:]))
    for inner in body_ops(taken):
        block.insert_op_before(inner.clone(value_mapper=mapping), op)
    for r, y in zip(op.results, taken.block.last_op.operands):
        r.replace_all_uses_with(mapping.get(y, y))
    block.erase_op(op)
    return True


def _sink_constants(op) -> int:
    n = 0
    for i in range(_first_capture(op), len(op.operands)):
        c = op.operands[i].owner
        if not isinstance(c, ConstantOp) or not (
                is_splat(c.value) or numel(shape_of(c.results[0].type)) <= SINK_LIMIT):
            continue
        for r in op.regions:
            arg = r.block.args[i - _off(op)]
            if arg.first_use is None:
                continue
            new = c.clone()
            r.block.insert_op_before(new, r.block.first_op)
            arg.replace_all_uses_with(new.results[0])
            n += 1
    return n


def _hoist(op) -> int:
    if op.name == "rlx.if":
        return 0
    first = _first_capture(op)
    body = op.body
    n = 0
    for inner in body_ops(body):
        if inner.name in NO_HOIST or inner.regions or not inner.operands:
            continue
        mapping, consts = {}, []
        for o in inner.operands:
            if isinstance(o.owner, ConstantOp) and o.owner.parent_block() is body.block:
                consts.append(o)
            elif getattr(o, "owner", None) is body.block and o.index >= first:
                mapping[o] = op.operands[o.index]
            else:
                break
        else:
            if not mapping:   # constants only: constant folding's business
                continue
            for c in consts:
                out = c.owner.clone()
                op.parent_block().insert_op_before(out, op)
                mapping[c] = out.results[0]
            out = inner.clone(value_mapper=mapping)
            op.parent_block().insert_op_before(out, op)
            k = len(op.operands)
            op.operands = list(op.operands) + [out.results[0]]
            for r in op.regions:
                a = r.block.insert_arg(out.results[0].type, k)
                if r is body:
                    inner.results[0].replace_all_uses_with(a)
            body.block.erase_op(inner)
            n += 1
    return n


def _drop_captures(op) -> int:
    o = _off(op)
    keep = [i for i in range(len(op.operands))
            if i < _first_capture(op) or any(r.block.args[i - o].first_use is not None
                                             for r in op.regions)]
    if len(keep) == len(op.operands):
        return 0
    for r in op.regions:
        for i in reversed(range(len(op.operands))):
            if i not in keep:
                r.block.erase_arg(r.block.args[i - o])
    dropped = len(op.operands) - len(keep)
    op.operands = [op.operands[i] for i in keep]
    return dropped


def _prune_results(op) -> int:
    """Unused ys of a scan; carries (scan, while) whose result and block arg are unused."""
    if op.name == "rlx.if":
        return 0
    p = op.params()
    nc = p["num_carry"]
    regions = list(op.regions)
    dead_c = [k for k in range(nc) if op.results[k].first_use is None and
              all(r.block.args[k].first_use is None for r in regions)]
    dead_y = [j for j in range(nc, len(op.results)) if op.results[j].first_use is None]
    if not dead_c and not dead_y:
        return 0
    body = op.body.block
    ys = list(body.last_op.operands)
    keep_y = [j for j in range(len(ys)) if j not in dead_c and j not in dead_y]
    body.erase_op(body.last_op)
    body.add_op(YieldOp.create(operands=[ys[j] for j in keep_y]))
    for r in regions:
        for k in reversed(dead_c):
            r.block.erase_arg(r.block.args[k])
    operands = [o for i, o in enumerate(op.operands) if i not in dead_c]
    p["num_carry"] = nc - len(dead_c)
    kept = [r for j, r in enumerate(op.results) if j in keep_y]
    new = make_control(op.name, operands, [r.type for r in kept],
                       [op.detach_region(r) for r in regions], **p)
    op.parent_block().insert_op_before(new, op)
    for old, r in zip(kept, new.results):
        old.replace_all_uses_with(r)
    op.parent_block().erase_op(op)
    return len(dead_c) + len(dead_y)


def simplify_regions(module: ModuleOp) -> int:
    """Steps 1-4 of the module doc over every region op; returns the number of changes."""
    n = 0
    for op in _region_ops(module):
        if op.name == "rlx.if" and _fold_if(op):
            n += 1
            continue
        n += _sink_constants(op) + _hoist(op) + _drop_captures(op) + _prune_results(op)
    return n


@dataclass(frozen=True)
class RegionsPass(ModulePass):
    """Across region boundaries: fold if on a constant, sink constants, hoist invariants."""

    name = "regions"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        simplify_regions(op)

"""cse: common subexpression elimination of pure rlx ops.

Algorithm: one forward walk per function block with a hash table keyed by
(op name, operand values, properties, attributes, result types). An op whose
key was seen before is replaced by the earlier op's result (which dominates
it: the block is straight-line code) and erased. Constants are ops like any
other, so two constants with equal type and bytes merge. Only ops with the
Pure trait take part (every rlx op); func.return never does.
"""
from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.traits import Pure

from .canonicalize import blocks


def _key(op):
    return (op.name, tuple(op.operands), frozenset(op.properties.items()),
            frozenset(op.attributes.items()), tuple(r.type for r in op.results))


def cse(module: ModuleOp) -> int:
    """Merge equal pure ops in place; returns the number of ops removed."""
    count = 0
    for block in blocks(module):
        seen = {}
        for op in list(block.ops):
            if op.regions or not op.has_trait(Pure):
                continue
            key = _key(op)
            prev = seen.get(key)
            if prev is None:
                seen[key] = op
                continue
            for old, new in zip(op.results, prev.results):
                old.replace_all_uses_with(new)
            block.erase_op(op)
            count += 1
    return count


@dataclass(frozen=True)
class CSEPass(ModulePass):
    """Common subexpression elimination: equal pure ops (and equal constants) merged."""

    name = "cse"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        cse(op)

"""dce: dead code elimination.

Algorithm: one backward walk per function block; a pure op (every rlx op)
whose results have no uses is erased. Walking backward erases whole dead
chains in one pass, since an op's users come after it. Function arguments are
the signature and are never removed, used or not. Region bodies are walked too,
and a region op (rlx.scan/while/if: no side effects) with no used result is dead.
"""
from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.traits import Pure

from .canonicalize import blocks
from .control import is_control


def dce(module: ModuleOp) -> int:
    """Erase unused pure ops in place; returns the number of ops removed."""
    count = 0
    for block in reversed(blocks(module)):   # region bodies before the ops holding them
        op = block.last_op
        while op is not None:
            prev = op.prev_op
            if (not op.regions and op.has_trait(Pure) or is_control(op)) and \
                    all(r.first_use is None for r in op.results):
                block.erase_op(op)
                count += 1
            op = prev
    return count


@dataclass(frozen=True)
class DCEPass(ModulePass):
    """Dead code elimination: pure ops whose results are unused are removed."""

    name = "dce"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        dce(op)

"""Backend-neutral helpers of control-flow lowering (lowering/cpu/regions.py and
lowering/gpu/regions.py).

Both backends split a function that holds region ops (rlx.scan / rlx.while / rlx.if)
into straight-line segments and the region ops between them:

    func @f { ops_a ; rlx.scan ; ops_b }  ──►  seg(ops_a) ; scan loop ; seg(ops_b)

and compile each segment as an ordinary program.  `segment_module` builds that program:
a fresh function whose inputs are the values the segment reads from outside and whose
outputs are the values it defines that are read later; `has_regions` says whether a
function needs the split at all.  What a backend does with the pieces (a native loop
calling functions, or a host-side list of kernel launches and copies) stays in its file.
"""
from __future__ import annotations

from rlxc.dialect.module import Arg, finish_function, get_func, new_function
from rlxc.dialect.types import dtype_of, shape_of


def has_regions(module) -> bool:
    """Whether the function of `module` (an xDSL module or a wrapper with `.module`) holds
    a region op at its top level."""
    from rlxc.dialect.control import is_control

    return any(is_control(op) for op in get_func(getattr(module, "module", module)).body.block.ops)


def segment_module(ops, ins, res):
    """A module `seg(v0, v1, ...) -> res` holding clones of `ops`, the values `ins` bound to
    its arguments in order."""
    args = [Arg(f"v{i}", "input", shape_of(v.type), dtype_of(v.type)) for i, v in enumerate(ins)]
    mod, f, block = new_function("seg", args)
    mapping = dict(zip(ins, block.args))
    for op in ops:
        block.add_op(op.clone(value_mapper=mapping))
    finish_function(f, block, [mapping[r] for r in res])
    return mod

"""specialize: a module with dynamic dims (symbols) -> the same module at given sizes.

    func.func @f(%x: tensor<?x784xf32, ["B", ""]>) ...   sizes {"B": 32}
          │ every argument and result type: symbols -> the sizes
          │ every dim-holding op parameter (symdims FILL: reshape/broadcast_to shape,
          │ slice limits, scatter_add dim): symbols -> the sizes
          ▼
    func.func @f(%x: tensor<32x784xf32>) ...             (verified)

The native backends run a dynamic Func through this (rlxc/dynamic.py): one
static program per distinct set of sizes, compiled on first use and cached.
Ops are replayed in order into a new block, so the result is built only from
public constructors.  Region ops (rlx.scan/while/if) are rebuilt with their
regions specialized the same way (block arguments and yields carry symbolic
types too; a scan's symbolic `length` becomes its size); a symbolic
`rlx.iota` becomes the constant it is at these sizes.
"""
from __future__ import annotations

from xdsl.dialects import func
from xdsl.ir import Block, Region

from .control import YieldOp, is_control, make_control
from .module import finish_function, get_func, new_function, signature
from .iota import IotaOp
from .ops import OPS, CastOp, ConstantOp, RlxOp, create_op
from .symdims import is_dynamic, resolve, resolve_value
from .trace import Arg
from .types import dtype_of, shape_of, tensor_type


def _static(t, sizes: dict):
    shp = shape_of(t)
    return tensor_type(resolve(shp, sizes), dtype_of(t)) if is_dynamic(shp) else t


def specialize(module, sizes: dict, keep_iota: bool = False):
    """A new module: `module` with every symbol replaced by its size in `sizes`.
    `keep_iota`: a symbolic rlx.iota stays an op of the static size (the CPU's
    size-generic lowering computes it; a constant would hold data of this size)."""
    f = get_func(module)
    args = [Arg(a.name, a.kind, resolve(a.shape, sizes), a.dtype) for a in signature(f)]
    mod, nf, block = new_function(f.sym_name.data, args)
    vals = dict(zip(f.args, block.args))
    ret = _replay(f.body.block, block, vals, sizes, keep_iota)
    finish_function(nf, block, [vals[o] for o in ret.operands])
    mod.verify()
    return mod


def _replay(src: Block, block: Block, vals: dict, sizes: dict, keep_iota: bool = False):
    """Specialize the ops of `src` into `block` (`vals`: old value -> new value); returns
    `src`'s terminator (func.return or rlx.yield), not copied."""
    for op in src.ops:
        if isinstance(op, (func.ReturnOp, YieldOp)):
            return op
        operands = [vals[o] for o in op.operands]
        if is_control(op):
            new = _control(op, operands, sizes)
        elif op.name == "rlx.iota":
            new = _iota_constant(op, sizes) if not keep_iota else \
                create_op(IotaOp, [], _static(op.results[0].type, sizes),
                          size=shape_of(_static(op.results[0].type, sizes))[0])
        elif isinstance(op, ConstantOp) or not any(is_dynamic(shape_of(r.type))
                                                   for r in op.results):
            new = op.clone(value_mapper=dict(zip(op.operands, operands)))
        elif isinstance(op, CastOp):
            new = CastOp.create(operands=operands,
                                result_types=[_static(op.results[0].type, sizes)])
        elif isinstance(op, RlxOp) and op.name in OPS:
            params = {k: resolve_value(v, sizes) for k, v in op.params().items()}
            new = create_op(OPS[op.name], operands, _static(op.results[0].type, sizes),
                            **params)
        else:
            raise NotImplementedError(f"specialize: no rule for {op.name}")
        block.add_op(new)
        vals.update(zip(op.results, new.results))
    raise ValueError("specialize: a block without a terminator")


def _control(op, operands, sizes: dict):
    """A region op rebuilt at `sizes`: each region replayed into a block of static types."""
    regions = []
    for r in op.regions:
        src = r.block
        blk = Block(arg_types=[_static(a.type, sizes) for a in src.args])
        vals = dict(zip(src.args, blk.args))
        term = _replay(src, blk, vals, sizes)
        blk.add_op(YieldOp.create(operands=[vals[o] for o in term.operands]))
        regions.append(Region(blk))
    params = {k: resolve_value(v, sizes) for k, v in op.params().items()}
    return make_control(op.name, operands, [_static(r.type, sizes) for r in op.results],
                        regions, **params)


def _iota_constant(op, sizes: dict):
    """A symbolic rlx.iota at `sizes`: the constant arange it is (dialect/iota.py)."""
    import numpy as np

    from .types import dense_attr

    t = _static(op.results[0].type, sizes)
    return ConstantOp.create(result_types=[t], properties={
        "value": dense_attr(np.arange(shape_of(t)[0]), dtype_of(t))})

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
public constructors; an op with regions is refused by name.
"""
from __future__ import annotations

from xdsl.dialects import func

from .module import finish_function, get_func, new_function, signature
from .ops import OPS, CastOp, ConstantOp, RlxOp, create_op
from .symdims import is_dynamic, resolve, resolve_value
from .trace import Arg
from .types import dtype_of, shape_of, tensor_type


def _static(t, sizes: dict):
    shp = shape_of(t)
    return tensor_type(resolve(shp, sizes), dtype_of(t)) if is_dynamic(shp) else t


def specialize(module, sizes: dict):
    """A new module: `module` with every symbol replaced by its size in `sizes`."""
    f = get_func(module)
    args = [Arg(a.name, a.kind, resolve(a.shape, sizes), a.dtype) for a in signature(f)]
    mod, nf, block = new_function(f.sym_name.data, args)
    vals = dict(zip(f.args, block.args))
    ret = None
    for op in f.body.block.ops:
        if isinstance(op, func.ReturnOp):
            ret = op
            break
        if op.regions:
            raise NotImplementedError(f"specialize: {op.name} has regions; dynamic sizes "
                                      "through it are not supported yet")
        operands = [vals[o] for o in op.operands]
        if isinstance(op, ConstantOp) or not any(is_dynamic(shape_of(r.type))
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
    finish_function(nf, block, [vals[o] for o in ret.arguments])
    mod.verify()
    return mod

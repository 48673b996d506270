"""Batching (vmap) of the region ops rlx.scan / rlx.while / rlx.if.

Each body becomes a module (control_ad.body_module), vmap.vmap_module batches it
(so nested control flow recurses), and the result is inlined into a new region:
- scan: every carry is batched (an unbatched initial carry is broadcast); the
  rows of a batched xs are (B, n, ...) -> (n, B, ...) so the loop still walks axis
  0, and the stacked ys go back to (B, n, ...);
- cond with an unbatched predicate: one rlx.if of the batched branches; with a
  batched predicate: both branches inline, then a per-lane select;
- while: the loop runs while any lane's cond holds; in the body, lanes whose cond
  is false keep their carries (a per-lane select), so finished lanes are masked.
"""
from __future__ import annotations

from .control import make_control, scan_result_types
from .control_ad import body_module, emit_value, inline, new_region
from .module import get_func, outputs
from .ops import OPS, CastOp, ConstantOp
from .types import dense_attr, dtype_of, shape_of, tensor_type


# ---------------------------------------------------------------- batching rules

def _vmap_body(region, batched_idx, B):
    from .vmap import vmap_module

    mod = body_module(region)
    if not batched_idx:
        return mod
    return vmap_module(mod, [f"a{i}" for i in batched_idx], B)


def _bt_batched(bt, v, flag):
    return v if flag else bt.bcast(v)


def _scan_batch(bt, op, xs, bs):
    p = op.params()
    n, nc, nx = p["length"], p["num_carry"], p["num_xs"]
    B = bt.B
    carries = [_bt_batched(bt, v, f) for v, f in zip(xs[:nc], bs[:nc])]
    seqs = []
    for v, f in zip(xs[nc:nc + nx], bs[nc:nc + nx]):   # (B, n, ...) -> (n, B, ...)
        r = len(shape_of(v.type))
        seqs.append(bt.transpose(v, (1, 0) + tuple(range(2, r))) if f else v)
    caps = list(xs[nc + nx:])
    bidx = list(range(nc)) + [i for i in range(nc, len(xs)) if bs[i]]
    vm = _vmap_body(op.body, bidx, B)
    f = get_func(vm)
    arg_types = [a.type for a in f.args]
    region = new_region(arg_types, lambda blk: inline(blk, vm, list(blk.args)))
    outs = outputs(f)
    types = [o.type for o in outs[:nc]] + scan_result_types([], [o.type for o in outs[nc:]], n)
    new = make_control("rlx.scan", carries + seqs + caps, types, [region], **p)
    bt.block.add_op(new)
    res = list(new.results[:nc])
    for y in new.results[nc:]:                        # (n, B, ...) -> (B, n, ...)
        r = len(shape_of(y.type))
        res.append(bt.transpose(y, (1, 0) + tuple(range(2, r))))
    return res


def _any_lane(blk, m):
    """rank-0 i1: some lane of the (B,) i1 mask `m` is set."""
    f = emit_value(blk, "rlx.max", [_cast(blk, m, "f32")], axes=(0,), keepdims=False)
    zero = ConstantOp.create(result_types=[f.type], properties={"value": dense_attr(0, "f32")})
    blk.add_op(zero)
    return emit_value(blk, "rlx.gt", [f, zero.results[0]])


def _cast(blk, v, dtype):
    if dtype_of(v.type) == dtype:
        return v
    op = CastOp.create(operands=[v], result_types=[tensor_type(shape_of(v.type), dtype)])
    blk.add_op(op)
    return op.results[0]


def _select_lanes(blk, mask, a, b):
    """Per lane (axis 0): a where mask else b."""
    shp = shape_of(a.type)
    m = mask
    if len(shp) > 1:
        m = emit_value(blk, "rlx.reshape", [m], shape=(shp[0],) + (1,) * (len(shp) - 1))
        m = emit_value(blk, "rlx.broadcast_to", [m], shape=shp)
    return emit_value(blk, "rlx.select", [m, a, b])


def _while_batch(bt, op, xs, bs):
    nc = op.params()["num_carry"]
    B = bt.B
    carries = [_bt_batched(bt, v, f) for v, f in zip(xs[:nc], bs[:nc])]
    caps = list(xs[nc:])
    bidx = list(range(nc)) + [i for i in range(nc, len(xs)) if bs[i]]
    cm, bm = _vmap_body(op.cond, bidx, B), _vmap_body(op.body, bidx, B)
    arg_types = [a.type for a in get_func(bm).args]

    def fill_cond(blk):
        (m,) = inline(blk, cm, list(blk.args))
        return [_any_lane(blk, m)]

    def fill_body(blk):
        a = list(blk.args)
        (m,) = inline(blk, cm, a)
        new = inline(blk, bm, a)
        return [_select_lanes(blk, m, n_, o) for n_, o in zip(new, a[:nc])]
    new = make_control("rlx.while", carries + caps, [c.type for c in carries],
                       [new_region(arg_types, fill_cond), new_region(arg_types, fill_body)],
                       num_carry=nc)
    bt.block.add_op(new)
    return list(new.results)


def _if_batch(bt, op, xs, bs):
    B = bt.B
    bidx = [i - 1 for i in range(1, len(xs)) if bs[i]]
    mods = [_vmap_body(r, bidx, B) for r in (op.then, op.orelse)]
    if not bs[0]:
        if not bidx:
            raise AssertionError("batching rule called without a batched operand")
        arg_types = [a.type for a in get_func(mods[0]).args]
        regions = [new_region(arg_types, lambda blk, m=m: inline(blk, m, list(blk.args)))
                   for m in mods]
        types = [o.type for o in outputs(get_func(mods[0]))]
        new = make_control("rlx.if", list(xs), types, regions)
        bt.block.add_op(new)
        return list(new.results)
    # batched predicate: both branches, then a per-lane select
    pred = xs[0]
    if dtype_of(pred.type) != "i1":
        zero = bt.constant(0, dtype_of(pred.type))
        pred = bt.emit(OPS["rlx.ne"], [pred, bt.emit(OPS["rlx.broadcast_to"], [zero],
                                                      shape=(B,))])
    outs = []
    for m in mods:
        vals = inline(bt.block, m, list(xs[1:]))
        outs.append(vals if bidx else [bt.bcast(v) for v in vals])
    return [_select_lanes(bt.block, pred, t, e) for t, e in zip(*outs)]


BATCH_CONTROL = {"rlx.scan": _scan_batch, "rlx.while": _while_batch, "rlx.if": _if_batch}

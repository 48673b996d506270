"""Transforms of the region ops: VJP, JVP and batching of rlx.scan / rlx.while / rlx.if.

Regions are isolated from above, so a body is a function of its block
arguments.  Each rule turns a body into a module (`body_module`), runs the
module-level transform on it (autodiff.grad_module, jvp.jvp_module,
vmap.vmap_module: the same rule tables, so nested control flow recurses), and
inlines the result into a new region (`inline`).

grad of scan (memory O(length x carry), never O(length^2)):
    forward  the scan is rebuilt to also stack its carries c_t (the state *before*
             step t) as extra ys: the per-step residuals
    backward a scan in the opposite direction; carries (dc, dk_acc), rows
             (c_t, x_t, dy_t), captures k.  Its body is the VJP of the forward body
             at (c_t, x_t, k) with cotangents (dc, dy_t), recomputing that one step's
             intermediates: yields (dc_prev, dk_acc + dk_t) and dx_t.
grad of cond: an rlx.if on the same predicate whose branches are the branch VJPs.
grad of while_loop: an error (the trip count is dynamic), as in JAX.
jvp: the same op with tangents as extra carries / rows / captures / results and
     the body's JVP as its body (the cond of a while ignores the tangents).  It is
     emitted after the primal graph (where the tangent pass emits), so the primal
     loop runs once more there.
(vmap of the region ops: dialect/control_vmap.py, on the same helpers.)
"""
from __future__ import annotations

from xdsl.dialects import func
from xdsl.ir import Block, Region

from .control import YieldOp, body_ops, make_control, scan_result_types, yielded
from .module import Arg, finish_function, get_func, new_function, outputs
from .ops import OPS, make_op
from .types import FLOAT_DTYPES, dtype_of, shape_of, tensor_type

WHILE_VJP_ERROR = ("reverse-mode of while_loop with a dynamic trip count is not supported; "
                   "use scan or fori_loop")


def _float(v) -> bool:
    return dtype_of(v.type) in FLOAT_DTYPES


# ---------------------------------------------------------------- bodies as modules

def body_module(region, extra=(), name="body"):
    """A module whose function takes the region's block arguments (named a0, a1, ...) and
    `extra` more arguments (types; named e0, e1, ...) and returns the region's yields."""
    args = [Arg(f"a{i}", "input", shape_of(a.type), dtype_of(a.type))
            for i, a in enumerate(region.block.args)]
    args += [Arg(f"e{i}", "input", shape_of(t), dtype_of(t)) for i, t in enumerate(extra)]
    mod, f, block = new_function(name, args)
    mapping = dict(zip(region.block.args, block.args))
    for op in body_ops(region):
        block.add_op(op.clone(value_mapper=mapping))
    finish_function(f, block, [mapping.get(v, v) for v in yielded(region)])
    return mod


def inline(block: Block, module, args) -> list:
    """Append the ops of `module`'s function to `block`, its arguments bound to `args`;
    returns the values of its outputs."""
    f = get_func(module)
    mapping = dict(zip(f.args, args))
    for op in f.body.block.ops:
        if isinstance(op, func.ReturnOp):
            break
        block.add_op(op.clone(value_mapper=mapping))
    return [mapping.get(v, v) for v in outputs(f)]


def emit_value(block, name, operands, **params):
    op = make_op(OPS[name], operands, **params)
    block.add_op(op)
    return op.results[0]


def _const_before(b, typ, value=0):
    """A splat constant of `typ` emitted by the autodiff/jvp Builder `b`."""
    return b.full(value, shape_of(typ), dtype_of(typ)).v


def new_region(arg_types, fill) -> Region:
    block = Block(arg_types=list(arg_types))
    block.add_op(YieldOp.create(operands=list(fill(block))))
    return Region(block)


def _loss_module(region, gtypes, gidx):
    """The body as a module with cotangent arguments e_j for its outputs `gidx`, whose
    output 0 is sum_j sum(out_j * e_j): its gradient is the body's VJP."""
    mod = body_module(region, gtypes)
    f = get_func(mod)
    block = f.body.block
    outs = outputs(f)
    ret = block.last_op
    block.detach_op(ret)
    ne = len(gtypes)
    es = list(block.args)[-ne:] if ne else []
    terms = []
    for j, e in zip(gidx, es):
        p = emit_value(block, "rlx.mul", [outs[j], e])
        terms.append(emit_value(block, "rlx.sum", [p], axes=tuple(range(len(shape_of(p.type)))),
                           keepdims=False))
    if not terms:
        raise AssertionError("VJP of a body without cotangents")
    loss = terms[0]
    for t in terms[1:]:
        loss = emit_value(block, "rlx.add", [loss, t])
    finish_function(f, block, [loss])
    return mod


def _vjp_module(region, gtypes, gidx, wrt_idx):
    """grad of the body's loss module w.r.t. block arguments `wrt_idx`: a module with
    arguments (block args..., cotangents...) returning one gradient per wrt index."""
    from .autodiff import grad_module

    return grad_module(_loss_module(region, gtypes, gidx), [f"a{i}" for i in wrt_idx])


# ---------------------------------------------------------------- VJP rules

def _scan_vjp(b, op, gs, need):
    p = op.params()
    n, nc, nx = p["length"], p["num_carry"], p["num_xs"]
    opnds = list(op.operands)
    nops = len(opnds)
    carries, caps = opnds[:nc], opnds[nc + nx:]
    fc = [i for i in range(nc) if _float(carries[i])]
    fy = [j for j in range(nc, len(op.results)) if gs[j] is not None and _float(op.results[j])]
    dx = [i for i in range(nc, nc + nx) if need[i] and _float(opnds[i])]
    dk = [i for i in range(nc + nx, nops) if need[i] and _float(opnds[i])]
    wrt = fc + dx + dk
    if not fc and not fy:
        return [None] * nops
    body = op.body
    gtypes = [body.block.args[i].type for i in fc] + \
        [yielded(body)[j].type for j in fy]
    vjp = _vjp_module(body, gtypes, fc + fy, wrt)

    # forward again, stacking the carries before each step (the residuals)
    block = op.parent_block()
    fwd_region = op.body.clone()
    fb = fwd_region.block
    ys = list(fb.last_op.operands)
    fb.erase_op(fb.last_op)
    fb.add_op(YieldOp.create(operands=ys + list(fb.args[:nc])))
    types = [r.type for r in op.results] + scan_result_types([], [c.type for c in carries], n)
    fwd = make_control("rlx.scan", opnds, types, [fwd_region], **p)
    block.insert_op_before(fwd, op)
    for old, new in zip(op.results, fwd.results):
        old.replace_all_uses_with(new)
    block.erase_op(op)
    resid = list(fwd.results[len(op.results):])

    # backward: reverse scan over (c_t, x_t, dy_t)
    gc0 = [gs[i].v if gs[i] is not None else _const_before(b, carries[i].type) for i in fc]
    gk0 = [_const_before(b, opnds[i].type) for i in dk]
    gy = [gs[j].v for j in fy]
    bx = resid + opnds[nc:nc + nx] + gy
    row = lambda v: tensor_type(shape_of(v.type)[1:], dtype_of(v.type))  # noqa: E731
    nbc = len(fc) + len(dk)
    arg_types = [v.type for v in gc0 + gk0] + [row(v) for v in bx] + [v.type for v in caps]

    def fill(blk):
        a = list(blk.args)
        gcs, gks = a[:len(fc)], a[len(fc):nbc]
        cs = a[nbc:nbc + nc]
        xs = a[nbc + nc:nbc + nc + nx]
        gys = a[nbc + nc + nx:nbc + nc + nx + len(fy)]
        ks = a[nbc + nc + nx + len(fy):]
        grads = inline(blk, vjp, cs + xs + ks + gcs + gys)
        g_c, g_x, g_k = grads[:len(fc)], grads[len(fc):len(fc) + len(dx)], \
            grads[len(fc) + len(dx):]
        acc = [emit_value(blk, "rlx.add", [s, t]) for s, t in zip(gks, g_k)]
        return g_c + acc + g_x
    region = new_region(arg_types, fill)
    btypes = [v.type for v in gc0 + gk0] + scan_result_types(
        [], [tensor_type(shape_of(opnds[i].type)[1:], dtype_of(opnds[i].type)) for i in dx], n)
    bwd = make_control("rlx.scan", gc0 + gk0 + bx + caps, btypes, [region], length=n,
                       num_carry=nbc, num_xs=len(bx), reverse=not p["reverse"])
    b.block.insert_op_before(bwd, b.anchor)
    res = list(bwd.results)
    out = [None] * nops
    for i, r in zip(fc, res[:len(fc)]):
        out[i] = b.wrap(r)
    for i, r in zip(dk, res[len(fc):nbc]):
        out[i] = b.wrap(r)
    for i, r in zip(dx, res[nbc:]):
        out[i] = b.wrap(r)
    return out


def _if_vjp(b, op, gs, need):
    opnds = list(op.operands)
    gi = [j for j, g in enumerate(gs) if g is not None and _float(op.results[j])]
    wrt = [i for i in range(1, len(opnds)) if need[i] and _float(opnds[i])]
    if not gi or not wrt:
        return [None] * len(opnds)
    gtypes = [op.results[j].type for j in gi]
    mods = [_vjp_module(r, gtypes, gi, [i - 1 for i in wrt]) for r in (op.then, op.orelse)]
    arg_types = [o.type for o in opnds[1:]] + gtypes
    regions = [new_region(arg_types, lambda blk, m=m: inline(blk, m, list(blk.args))) for m in mods]
    new = make_control("rlx.if", opnds + [gs[j].v for j in gi], [opnds[i].type for i in wrt],
                       regions)
    b.block.insert_op_before(new, b.anchor)
    out = [None] * len(opnds)
    for i, r in zip(wrt, new.results):
        out[i] = b.wrap(r)
    return out


def _while_vjp(b, op, gs, need):
    raise NotImplementedError(WHILE_VJP_ERROR)


VJP_CONTROL = {"rlx.scan": _scan_vjp, "rlx.if": _if_vjp, "rlx.while": _while_vjp}


# ---------------------------------------------------------------- JVP rules

def _jvp_body(region, tan_idx):
    """(the jvp module of a body w.r.t. block arguments `tan_idx`): arguments
    (a..., tangent_a...), outputs (outs..., tangents of outs...)."""
    from .jvp import jvp_module

    mod = body_module(region)
    if not tan_idx:
        return mod
    return jvp_module(mod, [f"a{i}" for i in tan_idx])


def _tangent_or_zero(b, ts, i, v):
    return ts[i].v if ts[i] is not None else _const_before(b, v.type)


def _scan_jvp(b, op, ts):
    p = op.params()
    n, nc, nx = p["length"], p["num_carry"], p["num_xs"]
    opnds = list(op.operands)
    fc = [i for i in range(nc) if _float(opnds[i])]
    tx = [i for i in range(nc, nc + nx) if ts[i] is not None and _float(opnds[i])]
    tk = [i for i in range(nc + nx, len(opnds)) if ts[i] is not None and _float(opnds[i])]
    jm = _jvp_body(op.body, fc + tx + tk)
    nouts = len(yielded(op.body))
    fy = [j for j in range(nc, nouts) if _float(op.results[j])]
    tc0 = [_tangent_or_zero(b, ts, i, opnds[i]) for i in fc]
    carries = opnds[:nc] + tc0
    xs = opnds[nc:nc + nx] + [ts[i].v for i in tx]
    caps = opnds[nc + nx:] + [ts[i].v for i in tk]
    row = lambda v: tensor_type(shape_of(v.type)[1:], dtype_of(v.type))  # noqa: E731
    arg_types = [v.type for v in carries] + [row(v) for v in xs] + [v.type for v in caps]
    ntc = len(fc)

    def fill(blk):
        a = list(blk.args)
        c, t_c = a[:nc], a[nc:nc + ntc]
        x, t_x = a[nc + ntc:nc + ntc + nx], a[nc + ntc + nx:nc + ntc + nx + len(tx)]
        k_end = nc + ntc + nx + len(tx) + len(opnds) - nc - nx
        k, t_k = a[nc + ntc + nx + len(tx):k_end], a[k_end:]
        outs = inline(blk, jm, c + x + k + t_c + t_x + t_k)
        prim, tan = outs[:nouts], outs[nouts:]
        return prim[:nc] + [tan[i] for i in fc] + prim[nc:] + [tan[j] for j in fy]
    region = new_region(arg_types, fill)
    ytypes = [r.type for r in yielded(op.body)[nc:]] + [yielded(op.body)[j].type for j in fy]
    types = [v.type for v in carries] + scan_result_types([], ytypes, n)
    new = make_control("rlx.scan", carries + xs + caps, types, [region], length=n,
                       num_carry=nc + ntc, num_xs=len(xs), reverse=p["reverse"])
    return _replace(b, op, new, nc, fc, fy, nc + ntc)


def _replace(b, op, new, nc, fc, fy, ncarry_new):
    """Emit `new` (primal results first, tangents after) with the tangents; returns them.
    The tangent pass emits after the whole primal graph, which keeps using `op`: the loop
    runs again for its tangents (the primal results of `new` are not used outside)."""
    b.block.insert_op_before(new, b.anchor)
    r = list(new.results)
    nprim_y = len(op.results) - nc
    tan = [None] * len(op.results)
    for i, v in zip(fc, r[nc:ncarry_new]):
        tan[i] = b.wrap(v)
    for j, v in zip(fy, r[ncarry_new + nprim_y:]):
        tan[j] = b.wrap(v)
    return tan


def _while_jvp(b, op, ts):
    nc = op.params()["num_carry"]
    opnds = list(op.operands)
    fc = [i for i in range(nc) if _float(opnds[i])]
    tk = [i for i in range(nc, len(opnds)) if ts[i] is not None and _float(opnds[i])]
    jm = _jvp_body(op.body, fc + tk)
    tc0 = [_tangent_or_zero(b, ts, i, opnds[i]) for i in fc]
    operands = opnds[:nc] + tc0 + opnds[nc:] + [ts[i].v for i in tk]
    arg_types = [v.type for v in operands]
    ntc = len(fc)
    cm = body_module(op.cond)

    def split(blk):
        a = list(blk.args)
        c, t_c = a[:nc], a[nc:nc + ntc]
        k, t_k = a[nc + ntc:nc + ntc + len(opnds) - nc], a[nc + ntc + len(opnds) - nc:]
        return c, t_c, k, t_k

    def fill_cond(blk):
        c, _, k, _ = split(blk)
        return inline(blk, cm, c + k)

    def fill_body(blk):
        c, t_c, k, t_k = split(blk)
        outs = inline(blk, jm, c + k + t_c + t_k)
        return outs[:nc] + [outs[nc + i] for i in fc]
    new = make_control("rlx.while", operands, [v.type for v in operands[:nc + ntc]],
                       [new_region(arg_types, fill_cond), new_region(arg_types, fill_body)],
                       num_carry=nc + ntc)
    return _replace(b, op, new, nc, fc, [], nc + ntc)


def _if_jvp(b, op, ts):
    opnds = list(op.operands)
    ti = [i for i in range(1, len(opnds)) if ts[i] is not None and _float(opnds[i])]
    nouts = len(op.results)
    fo = [j for j in range(nouts) if _float(op.results[j])]
    mods = [_jvp_body(r, [i - 1 for i in ti]) for r in (op.then, op.orelse)]
    operands = opnds + [ts[i].v for i in ti]
    arg_types = [v.type for v in operands[1:]]

    def fill(m):
        def f(blk):
            outs = inline(blk, m, list(blk.args))
            return outs[:nouts] + [outs[nouts + j] for j in fo]
        return f
    types = [r.type for r in op.results] + [op.results[j].type for j in fo]
    new = make_control("rlx.if", operands, types, [new_region(arg_types, fill(m)) for m in mods])
    b.block.insert_op_before(new, b.anchor)
    r = list(new.results)
    tan = [None] * nouts
    for j, v in zip(fo, r[nouts:]):
        tan[j] = b.wrap(v)
    return tan


JVP_CONTROL = {"rlx.scan": _scan_jvp, "rlx.while": _while_jvp, "rlx.if": _if_jvp}

"""Forward-mode autodiff over the rlx dialect: the `rlx-jvp` and `rlx-hvp` passes.

    func(args) -> [outs...]   ==>   func(args, tangent_<n>...) -> [outs..., d outs...]

Algorithm: clone the module; append one input `tangent_<name>` per listed
argument (same type, kind "input", in the listed order; where that name is
taken, as in a jvp of a jvp, the first free `tangent_<name>_2`, `_3`, ...); walk the ops in order
and, for each op with at least one operand tangent, dispatch into
`JVP_RULES[op.name]`, which emits rlx ops (before the return, after the primal
values it reads) and yields the result's tangent. A symbolically zero tangent
is `None` and is never materialised inside the graph; only an output whose
tangent is zero gets a zeros constant. An op without a rule on a tangent's path
fails with "no JVP rule for rlx.X".

Elementwise unary and binary rules are not written twice: the VJP expressions
of `dialect/autodiff.py` are `g * partial` with a diagonal Jacobian, so the
tangent is the same expression with g := t (summed over operands). Linear ops
(shape ops, sum/mean, gather, scatter_add, concat, float casts) apply
themselves to the tangents.

hvp is forward-over-reverse: `jvp(value_and_grad(f, wrt), wrt)`, giving
outputs `[loss, grads..., <grad, v>, Hv...]`: the jvp of the loss output is the
directional derivative <grad, v>, and the jvps of the gradients are H v.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from xdsl.context import Context
from xdsl.dialects.builtin import ArrayAttr, ModuleOp
from xdsl.passes import ModulePass

from .autodiff import (
    BINARY_VJPS,
    UNARY_VJPS,
    ZERO_DERIVATIVE,
    Builder,
    reduce_weights,
    differentiable,
    grad_module,
    replace_module,
    resolve_names,
    set_outputs,
    split_names,
)
from .module import Arg, arg_attr, get_func, outputs, signature
from .types import FLOAT_DTYPES, dtype_of, shape_of

# rule(b, op, tangents) -> tangent of the result or None; `tangents[i]` is the
# tangent of operand i (a V) or None when symbolically zero.
JVP_RULES: dict[str, Callable] = {}


def _same_op(b, op, operands):
    """Re-apply `op` (same class and params) to other operands: the JVP of a linear op."""
    return b.emit(type(op), operands, **op.params())


def _or_zeros(b, t, value):
    return t if t is not None else b.zeros_like(b.wrap(value))


def defunary(name: str, fn: Callable | None):
    """Tangent of an elementwise unary op from its VJP expression fn(g, x, y)."""
    def rule(b, op, ts):
        (t,) = ts
        if fn is None:
            return None
        return fn(t, b.wrap(op.operands[0]), b.wrap(op.results[0]))
    JVP_RULES[name] = rule


def defbinary(name: str, da: Callable, db: Callable):
    """Tangent of an elementwise binary op: da(ta, ...) + db(tb, ...)."""
    def rule(b, op, ts):
        x, z = (b.wrap(o) for o in op.operands)
        y = b.wrap(op.results[0])
        parts = [fn(t, x, z, y) for fn, t in zip((da, db), ts) if t is not None]
        return parts[0] if len(parts) == 1 else parts[0] + parts[1]
    JVP_RULES[name] = rule


def deflinear(name: str):
    """A linear op applied to its only tangent operand (shape ops, sum, mean, fake_quant)."""
    JVP_RULES[name] = lambda b, op, ts: _same_op(b, op, ts)


def defrule(name: str):
    def deco(fn):
        JVP_RULES[name] = fn
        return fn
    return deco


# ---- elementwise: from the VJP expressions
for _n, _fn in UNARY_VJPS.items():
    defunary(_n, _fn)
for _n, (_da, _db) in BINARY_VJPS.items():
    defbinary(_n, _da, _db)


@defrule("rlx.add")
def _add_jvp(b, op, ts):
    ta, tb = ts
    return b.add_opt(ta, tb)


@defrule("rlx.sub")
def _sub_jvp(b, op, ts):
    ta, tb = ts
    if tb is None:
        return ta
    return -tb if ta is None else ta - tb


for _n in ("eq", "ne", "lt", "le", "gt", "ge"):
    JVP_RULES[f"rlx.{_n}"] = lambda b, op, ts: None
JVP_RULES["rlx.philox"] = lambda b, op, ts: None     # integer operands: zero tangent


@defrule("rlx.select")
def _select_jvp(b, op, ts):
    _, ta, tb = ts
    c, x, z = (b.wrap(o) for o in op.operands)
    return b.select(c, _or_zeros(b, ta, x.v), _or_zeros(b, tb, z.v))


# ---- reductions
deflinear("rlx.sum")
deflinear("rlx.mean")


def _weighted_reduce_jvp(b, op, ts):
    """max/min/prod: the tangent is sum(partials * t) over the reduced axes."""
    p = op.params()
    return b.reduce("sum", reduce_weights(b, op) * ts[0], p["axes"], p["keepdims"])


for _n in ("max", "min", "prod"):
    JVP_RULES[f"rlx.{_n}"] = _weighted_reduce_jvp


# ---- linear algebra and shape ops
@defrule("rlx.matmul")
def _matmul_jvp(b, op, ts):
    x, z = (b.wrap(o) for o in op.operands)
    tx, tz = ts
    return b.add_opt(b.op("matmul", tx, z) if tx is not None else None,
                     b.op("matmul", x, tz) if tz is not None else None)


for _n in ("transpose", "reshape", "broadcast_to", "slice", "pad"):
    deflinear(f"rlx.{_n}")


@defrule("rlx.concat")
def _concat_jvp(b, op, ts):
    return _same_op(b, op, [_or_zeros(b, t, o) for t, o in zip(ts, op.operands)])


@defrule("rlx.gather")
def _gather_jvp(b, op, ts):
    return _same_op(b, op, [ts[0], b.wrap(op.operands[1])]) if ts[0] is not None else None


@defrule("rlx.scatter_add")
def _scatter_add_jvp(b, op, ts):
    return _same_op(b, op, [b.wrap(op.operands[0]), ts[1]]) if ts[1] is not None else None


@defrule("rlx.cast")
def _cast_jvp(b, op, ts):
    if dtype_of(op.results[0].type) in FLOAT_DTYPES and ts[0] is not None:
        return b.cast(ts[0], dtype_of(op.results[0].type))
    return None


def _bilinear_jvp(b, op, ts):
    """A bilinear op (the convolution family): op(t0, x1) + op(x0, t1)."""
    x0, x1 = (b.wrap(o) for o in op.operands)
    t0, t1 = ts
    return b.add_opt(_same_op(b, op, [t0, x1]) if t0 is not None else None,
                     _same_op(b, op, [x0, t1]) if t1 is not None else None)


for _n in ("conv2d", "conv_transpose2d", "conv2d_filter_grad"):
    JVP_RULES[f"rlx.{_n}"] = _bilinear_jvp
@defrule("rlx.attention")
def _attention_jvp(b, op, ts):  # dialect/attention.py
    from .attention import attention_jvp

    return attention_jvp(b, op, ts)


@defrule("rlx.attention_lse")
@defrule("rlx.attention_bwd")
def _attention_derived_jvp(b, op, ts):  # dialect/attention_bwd.py: by expansion
    from .attention_bwd import jvp_by_expansion

    return jvp_by_expansion(b, op, ts)


# ---------------------------------------------------------------- the transforms

def jvp_module(module: ModuleOp, tangent_for: list[str], what: str = "rlx-jvp",
               sum_first: bool = False) -> ModuleOp:
    """A new module with inputs `tangent_<name>` appended, returning [primals..., tangents...]
    (`sum_first`: output 0's tangent summed to a scalar, hvp's <grad, v>)."""
    from .control_ad import JVP_CONTROL
    module = module.clone()
    f = get_func(module)
    block = f.body.block
    names = list(tangent_for)
    if len(set(names)) != len(names):
        raise ValueError(f"{what}: repeated name in {names}")
    targets = resolve_names(f, names, what)
    sig = signature(f)
    taken = {a.name for a in sig}
    new_args = []
    for n, v in zip(names, targets):
        tn, k = f"tangent_{n}", 2
        while tn in taken:  # nested jvp: tangent_x exists already -> tangent_x_2
            tn, k = f"tangent_{n}_{k}", k + 1
        taken.add(tn)
        new_args.append(Arg(tn, "input", shape_of(v.type), dtype_of(v.type)))
    tangents = {}
    for a, v in zip(new_args, targets):
        t = block.insert_arg(v.type, len(block.args))
        if a.name.replace("_", "a").isalnum():
            t.name_hint = a.name
        tangents[v] = t
    f.arg_attrs = ArrayAttr([arg_attr(a) for a in sig + new_args])

    outs = outputs(f)
    b = Builder(block, block.last_op)
    tan = {v: b.wrap(t) for v, t in tangents.items()}
    for op in list(block.ops)[:-1]:
        if not op.results:
            continue
        ts = [tan.get(o) for o in op.operands]
        if all(t is None for t in ts) or op.name in ZERO_DERIVATIVE:
            continue
        if op.name in JVP_CONTROL:   # region ops: several results (dialect/control_ad.py)
            for r, t in zip(op.results, JVP_CONTROL[op.name](b, op, ts)):
                if t is not None:
                    tan[r] = t
            continue
        r = op.results[0]
        if not differentiable(r):
            continue
        rule = JVP_RULES.get(op.name)
        if rule is None:
            raise NotImplementedError(f"{what}: no JVP rule for {op.name}")
        t = rule(b, op, ts)
        if t is not None:
            tan[r] = t
    touts = [tan[o] if o in tan else b.zeros_like(b.wrap(o)) for o in outs]
    if sum_first and touts and len(touts[0].shape):
        touts[0] = b.reduce("sum", touts[0], tuple(range(len(touts[0].shape))))
    set_outputs(f, block, list(outs) + [t.v for t in touts])
    return module


def hvp_module(module: ModuleOp, wrt: list[str]) -> ModuleOp:
    """Forward-over-reverse: inputs `tangent_<name>` added; outputs
    [loss, grads..., <grad, v>, Hv...] (v = the tangents, in `wrt` order).  A loss that is
    not a scalar is summed for the derivatives, as grad does: <grad, v> is the scalar
    sum of its tangent."""
    resolve_names(get_func(module), list(wrt), "rlx-hvp")
    return jvp_module(grad_module(module, list(wrt), True), list(wrt), "rlx-hvp",
                      sum_first=True)


@dataclass(frozen=True)
class JvpPass(ModulePass):
    """`rlx-jvp{wrt=x}`: adds inputs tangent_<name>; returns [outs..., tangents...]."""

    name = "rlx-jvp"
    wrt: str | tuple[str, ...]

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        replace_module(op, jvp_module(op, split_names(self.wrt)))


@dataclass(frozen=True)
class HvpPass(ModulePass):
    """`rlx-hvp{wrt=w}`: adds tangent_<name>; returns [loss, grads..., <grad,v>, Hv...]."""

    name = "rlx-hvp"
    wrt: str | tuple[str, ...]

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        replace_module(op, hvp_module(op, split_names(self.wrt)))


__all__ = ["JVP_RULES", "jvp_module", "hvp_module", "JvpPass", "HvpPass"]

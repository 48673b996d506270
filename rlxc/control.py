"""Control flow on Tensors, as jax.lax: scan, while_loop, cond, fori_loop.

    rlxc.scan(body, init, xs)            body(carry, x) -> (carry, y)
          │ trace `body` once into a Body (dialect/control_trace.py): block arguments
          │ for the carries and one row of each xs; outer Tensors it touches are captured
          ▼
    one rlx.scan node in the enclosing trace (regions, never unrolled: the IR does not
    grow with the length), operands = init + xs + captures

Carries, xs, ys and branch operands are Tensors or (nested) tuples/lists of
Tensors; Python numbers in `init` become rank-0 constants (f32 for floats,
i32 for ints).  A body must return carries of exactly the initial types
(ShapeError naming the carry otherwise); the two branches of `cond` must return
the same structure and types (ShapeError naming both).  Bodies run in the same
GraphScope; while one is being traced the scope's ops go to its Body, and the
scope's scalar cache is set aside so no body value leaks out through it.
"""
from __future__ import annotations

import numbers

import numpy as np

from rlxc.dialect.control_trace import Body
from rlxc.dialect.shapes import TType, as_int
from rlxc.runtime.errors import ShapeError
from rlxc.runtime.dims import describe, is_sym

from .tensor import Tensor

__all__ = ["scan", "while_loop", "cond", "fori_loop"]


# ---------------------------------------------------------------- pytrees of Tensors

def _flatten(tree, what: str, scope):
    leaves: list[Tensor] = []

    def rec(t):
        if isinstance(t, Tensor):
            leaves.append(t)
            return "T"
        if isinstance(t, (tuple, list)):
            return (type(t), tuple(rec(x) for x in t))
        if t is None:
            return None
        if isinstance(t, (bool, np.bool_)):
            leaves.append(scope.scalar(bool(t), "i1"))
            return "T"
        if isinstance(t, (numbers.Integral, np.integer)):
            leaves.append(scope.scalar(int(t), "i32"))
            return "T"
        if isinstance(t, (numbers.Real, np.floating)):
            leaves.append(scope.scalar(float(t), "f32"))
            return "T"
        raise TypeError(f"{what}: expected Tensors or tuples/lists of Tensors, got "
                        f"{type(t).__name__}")
    return leaves, rec(tree)


def _unflatten(spec, leaves):
    it = iter(leaves)

    def rec(s):
        if s == "T":
            return next(it)
        if s is None:
            return None
        typ, kids = s
        return typ(rec(k) for k in kids)
    return rec(spec)


def _scope_of(*trees):
    for t in trees:
        if isinstance(t, Tensor):
            return t.scope
        if isinstance(t, (tuple, list)):
            s = _scope_of(*t)
            if s is not None:
                return s
    return None


def _types(leaves) -> str:
    return "(" + ", ".join(str(t.value.type) for t in leaves) + ")"


# ---------------------------------------------------------------- tracing a body

def _trace_body(scope, arg_types, call, what: str):
    """Trace `call(args)` (which returns a list of output Tensors) as a new Body."""
    root = scope.trace
    body = Body(root.inner[-1] if root.inner else root)
    args = [Tensor(scope, body.add_block_arg(t)) for t in arg_types]
    root.inner.append(body)
    saved, scope._splats = scope._splats, {}
    try:
        outs, extra = call(args)
    finally:
        root.inner.pop()
        scope._splats = saved
    body.finish(what, [body.localize(t.value) for t in outs])
    return body, extra


def _merge_captures(bodies, nfixed: int) -> list:
    """Give every body the same block arguments: the fixed ones, then each body's captures
    in turn (unused placeholders in the other bodies).  Returns the outer capture values."""
    caps = []
    for i, b in enumerate(bodies):
        caps.extend(b.captures)
    for i, b in enumerate(bodies):
        args = b.block_args[:nfixed]
        for j, o in enumerate(bodies):
            args += o.capture_args if o is b else [b._value(v.type) for v in o.captures]
        b.block_args = args
    return caps


def _emit(scope, op, operands, params, result_types, bodies):
    vals = scope.trace.add(op, operands, params, result_types, tuple(bodies))
    return [Tensor(scope, v) for v in vals]


# ---------------------------------------------------------------- the API

def scan(body, init, xs=None, length=None, reverse: bool = False):
    """`(carry, ys)`: `carry, y = body(carry, x)` for each row x of `xs` (axis 0), ys stacked.

    `xs=None` with `length=n` runs n steps with x None; `reverse` walks the rows from the
    last (ys keep their positions, as jax.lax.scan)."""
    scope = _scope_of(init, xs)
    if scope is None:
        raise TypeError("scan: init or xs must hold at least one Tensor")
    c_leaves, c_spec = _flatten(init, "scan: init", scope)
    x_leaves, x_spec = _flatten(xs, "scan: xs", scope)
    n = None if length is None else length if is_sym(length) else \
        as_int(length, "scan: length", "length")
    for x in x_leaves:
        if x.ndim < 1:
            raise ShapeError(f"scan: xs leaf {x.value.type} has no axis 0 to scan over")
        if n is None:
            n = x.shape[0]
        elif x.shape[0] != n:
            raise ShapeError(f"scan: xs leaf {x.value.type} has {x.shape[0]} rows, expected "
                             f"{n} (length or the other xs)")
    if n is None:
        raise ValueError("scan: give xs or length")
    if not is_sym(n) and n < 0:
        raise ValueError(f"scan: length must be >= 0, got {n}")
    nc = len(c_leaves)
    types = [t.value.type for t in c_leaves] + [TType(x.shape[1:], x.dtype) for x in x_leaves]

    def call(args):
        out = body(_unflatten(c_spec, args[:nc]), _unflatten(x_spec, args[nc:]))
        if not isinstance(out, tuple) or len(out) != 2:
            raise TypeError("scan: body must return a pair (carry, y)")
        cl, cs = _flatten(out[0], "scan: the carry body returns", scope)
        yl, ys = _flatten(out[1], "scan: the y body returns", scope)
        if cs != c_spec or [t.value.type for t in cl] != [t.value.type for t in c_leaves]:
            raise ShapeError(f"scan: body returns the carry {_types(cl)} but the initial carry "
                             f"is {_types(c_leaves)} (same structure, shapes and dtypes needed)")
        return cl + yl, (ys, [t.value.type for t in yl])
    b, (y_spec, y_types) = _trace_body(scope, types, call, "scan body")
    caps = _merge_captures([b], len(types))
    if is_sym(n) and not x_leaves and not y_types:
        raise ShapeError(f"scan: a dynamic length {describe(n)} needs xs or a y output whose "
                         "axis 0 carries it (a carry-only loop of a symbolic length is not "
                         "supported)")
    res_types = [t.value.type for t in c_leaves] + [TType((n,) + tuple(t.shape), t.dtype)
                                                    for t in y_types]
    params = {"length": n, "num_carry": nc, "num_xs": len(x_leaves), "reverse": bool(reverse)}
    res = _emit(scope, "rlx.scan", [t.value for t in c_leaves + x_leaves] + caps, params,
                res_types, [b])
    return _unflatten(c_spec, res[:nc]), _unflatten(y_spec, res[nc:])


def while_loop(cond_fn, body_fn, init):
    """`val = body_fn(val)` while `cond_fn(val)` (a rank-0 i1 Tensor) is true; returns val."""
    scope = _scope_of(init)
    if scope is None:
        raise TypeError("while_loop: init must hold at least one Tensor")
    c_leaves, c_spec = _flatten(init, "while_loop: init", scope)
    types = [t.value.type for t in c_leaves]

    def call_cond(args):
        p = cond_fn(_unflatten(c_spec, args))
        if not isinstance(p, Tensor) or p.shape != () or p.dtype != "i1":
            got = p.value.type if isinstance(p, Tensor) else type(p).__name__
            raise TypeError(f"while_loop: cond_fn must return a rank-0 boolean (i1) Tensor, "
                            f"got {got}")
        return [p], None

    def call_body(args):
        cl, cs = _flatten(body_fn(_unflatten(c_spec, args)), "while_loop: body_fn result", scope)
        if cs != c_spec or [t.value.type for t in cl] != types:
            raise ShapeError(f"while_loop: body_fn returns {_types(cl)} but the loop carries "
                             f"{_types(c_leaves)} (same structure, shapes and dtypes needed)")
        return cl, None
    bc, _ = _trace_body(scope, types, call_cond, "while cond")
    bb, _ = _trace_body(scope, types, call_body, "while body")
    caps = _merge_captures([bc, bb], len(types))
    res = _emit(scope, "rlx.while", [t.value for t in c_leaves] + caps,
                {"num_carry": len(types)}, types, [bc, bb])
    return _unflatten(c_spec, res)


def cond(pred, true_fn, false_fn, *operands):
    """`true_fn(*operands)` if `pred` else `false_fn(*operands)`; `pred` is a rank-0 i1 or
    integer Tensor (a Python bool picks the branch at trace time)."""
    if isinstance(pred, (bool, np.bool_, numbers.Integral)):
        return true_fn(*operands) if pred else false_fn(*operands)
    if not isinstance(pred, Tensor):
        raise TypeError(f"cond: pred must be a rank-0 i1 or integer Tensor, got "
                        f"{type(pred).__name__}")
    if pred.shape != () or pred.dtype not in ("i1", "i32", "i64"):
        raise ShapeError(f"cond: pred must be a rank-0 i1 or integer Tensor, got "
                         f"{pred.value.type}")
    scope = pred.scope
    o_leaves, o_spec = _flatten(tuple(operands), "cond: operands", scope)
    types = [t.value.type for t in o_leaves]

    def branch(fn):
        def call(args):
            leaves, spec = _flatten(fn(*_unflatten(o_spec, args)), "cond: branch result", scope)
            return leaves, (spec, [t.value.type for t in leaves])
        return call
    bt, (ts, tt) = _trace_body(scope, types, branch(true_fn), "cond true_fn")
    bf, (fs, ft) = _trace_body(scope, types, branch(false_fn), "cond false_fn")
    if ts != fs or tt != ft:
        show = lambda ty: "(" + ", ".join(str(t) for t in ty) + ")"  # noqa: E731
        raise ShapeError(f"cond: true_fn returns {show(tt)} but false_fn returns {show(ft)} "
                         f"(both branches need the same structure, shapes and dtypes)")
    caps = _merge_captures([bt, bf], len(types))
    res = _emit(scope, "rlx.if", [pred.value] + [t.value for t in o_leaves] + caps, {}, tt,
                [bt, bf])
    return _unflatten(ts, res)


def fori_loop(lo: int, hi: int, body, init):
    """`val = body(i, val)` for i in range(lo, hi) (static bounds; i is an i32 Tensor):
    a scan with no xs, so the IR does not grow with hi - lo."""
    lo, hi = as_int(lo, "fori_loop: lo", "bound"), as_int(hi, "fori_loop: hi", "bound")
    scope = _scope_of(init)
    if scope is None:
        raise TypeError("fori_loop: init must hold at least one Tensor")

    def step(c, _):
        i, v = c
        return (i + 1, body(i, v)), None
    (_, out), _ = scan(step, (scope.scalar(lo, "i32"), init), None, length=max(hi - lo, 0))
    return out

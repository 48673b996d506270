"""Batching (vmap): map a function over a new leading axis of some of its inputs.

    f(x: (3,), w: (3, 2))  --vmap(["x"], B)-->  g(x: (B, 3), w: (3, 2)) -> (B, ...)

Algorithm (JAX's batching interpreter, run once over the IR): walk the ops of
the function in order, tracking for every value whether it carries the batch
axis. The batch axis is always axis 0, so rules never have to move it around
between ops. An op with no batched operand is copied unchanged: params,
unbatched inputs and everything computed from them alone stay shared, never
copied B times. An op with a batched operand dispatches into
`BATCH_RULES[op.name](bt, op, operands, batched)`, which emits the batched
equivalent at the end of the new block and returns a value batched along
axis 0. Where an unbatched operand meets a batched one in an elementwise op it
is broadcast with `rlx.broadcast_to` (a view in the lowering, not a copy).
Every output gains the batch axis (JAX's out_axes=0): an output that does not
depend on a batched input is broadcast to the batch.

Rules come from family helpers, one row per op:
- `def_elementwise`: unary, binary, compare, select, fake_quant, cast —
  broadcast the unbatched operands, re-emit the op on the bigger shape;
- `def_reducer`: reductions — shift the axes by one;
- matmul: a batched lhs with an unbatched 2-D rhs becomes ONE large matmul
  ((B, m, k) -> (B*m, k) @ (k, n)); otherwise a batched matmul whose batch dims
  are padded with 1s so that NumPy broadcasting keeps B at axis 0;
- shape ops (transpose, reshape, broadcast_to, slice, pad, concat) prepend the
  batch dim to their parameters;
- gather / scatter_add with batched indices fold the batch into the indexed
  axis and offset the indices by b * dim (one gather, no loop).

The input module is never mutated: a new module is built. A missing rule
fails at transform time with "vmap: no batching rule for rlx.X".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from rlxc.runtime.errors import NameLookupError

from .module import Arg, finish_function, get_func, new_function, outputs, signature
from .ops import OPS, CastOp, ConstantOp, RlxOp, make_op
from .symdims import is_dynamic
from .types import dense_attr, dtype_of, numel, shape_of, tensor_type

BatchRule = Callable[["Batcher", RlxOp, list, list], object]
BATCH_RULES: dict[str, BatchRule] = {}


# ---------------------------------------------------------------- emission helpers

class Batcher:
    """Emits ops at the end of the new block; B is the batch size."""

    def __init__(self, block, batch_size: int):
        self.block = block
        self.B = batch_size
        self._bcast: dict = {}

    def emit(self, cls, operands, **params):
        op = make_op(cls, operands, **params)
        self.block.add_op(op)
        return op.results[0]

    def remake(self, op: RlxOp, operands, **override):
        """`op` again on new operands, with some params overridden."""
        if isinstance(op, CastOp):
            new = CastOp.create(operands=list(operands),
                                result_types=[tensor_type(shape_of(operands[0]),
                                                          dtype_of(op.results[0]))])
            self.block.add_op(new)
            return new.results[0]
        return self.emit(type(op), operands, **{**op.params(), **override})

    def reshape(self, x, shape):
        shape = tuple(shape)
        return x if shape_of(x) == shape else self.emit(OPS["rlx.reshape"], [x], shape=shape)

    def transpose(self, x, perm):
        perm = tuple(perm)
        if perm == tuple(range(len(perm))):
            return x
        return self.emit(OPS["rlx.transpose"], [x], perm=perm)

    def moveaxis_to_front(self, x, src: int):
        rank = len(shape_of(x))
        return self.transpose(x, (src,) + tuple(i for i in range(rank) if i != src))

    def bcast(self, x):
        """An unbatched value broadcast to the batch (one broadcast per value)."""
        r = self._bcast.get(x)
        if r is None:
            r = self.emit(OPS["rlx.broadcast_to"], [x], shape=(self.B,) + shape_of(x))
            self._bcast[x] = r
        return r

    def constant(self, array, dtype: str):
        arr = np.asarray(array)
        op = ConstantOp.create(result_types=[tensor_type(arr.shape, dtype)],
                               properties={"value": dense_attr(arr, dtype)})
        self.block.add_op(op)
        return op.results[0]

    def batch_offsets(self, idx, stride: int):
        """b * stride for every element of a batched index tensor (same shape and dtype)."""
        shp = shape_of(idx)
        off = np.arange(self.B, dtype=np.int64).reshape((self.B,) + (1,) * (len(shp) - 1)) * stride
        c = self.constant(off, dtype_of(idx))
        c = self.emit(OPS["rlx.broadcast_to"], [c], shape=shp) if shape_of(c) != shp else c
        return self.emit(OPS["rlx.add"], [idx, c])


# ---------------------------------------------------------------- family rules

def _elementwise(bt: Batcher, op, xs, bs):
    return bt.remake(op, [x if b else bt.bcast(x) for x, b in zip(xs, bs)])


def _reducer(bt: Batcher, op, xs, bs):
    return bt.remake(op, xs, axes=tuple(a + 1 for a in op.params()["axes"]))


def def_elementwise(*names: str) -> None:
    for n in names:
        BATCH_RULES[n] = _elementwise


def def_reducer(*names: str) -> None:
    for n in names:
        BATCH_RULES[n] = _reducer


def _family(*families: str) -> list[str]:
    return [n for n, cls in OPS.items() if cls.FAMILY in families]


def_elementwise(*_family("unary", "binary", "compare", "select"), "rlx.cast")  # fake_quant is unary
def_reducer(*_family("reduce"))
def_elementwise(*_family("random"))   # rlx.philox: the batch of keys broadcasts per element


# ---------------------------------------------------------------- matmul

def _matmul(bt: Batcher, op, xs, bs):
    (a, b), (ba, bb) = xs, bs
    sa, sb = shape_of(a), shape_of(b)
    if ba and not bb and len(sb) == 2 and not is_dynamic(sa):
        # one large matmul: every leading dim of the lhs (batch included) becomes rows
        rows = bt.reshape(a, (numel(sa[:-1]), sa[-1]))
        r = bt.emit(OPS["rlx.matmul"], [rows, b])
        return bt.reshape(r, sa[:-1] + (sb[-1],))
    # batched matmul: give both batched operands the same number of batch dims so
    # that NumPy broadcasting lines B up at axis 0 (an unbatched operand is shorter)
    ra, rb = len(sa) - ba, len(sb) - bb
    n = max(ra, rb)
    if ba and ra < n:
        a = bt.reshape(a, (bt.B,) + (1,) * (n - ra) + sa[1:])
    if bb and rb < n:
        b = bt.reshape(b, (bt.B,) + (1,) * (n - rb) + sb[1:])
    return bt.emit(OPS["rlx.matmul"], [a, b])


BATCH_RULES["rlx.matmul"] = _matmul


# ---------------------------------------------------------------- shape ops

def _transpose(bt, op, xs, bs):
    return bt.remake(op, xs, perm=(0,) + tuple(p + 1 for p in op.params()["perm"]))


def _reshape(bt, op, xs, bs):
    return bt.remake(op, xs, shape=(bt.B,) + op.params()["shape"])


def _broadcast_to(bt, op, xs, bs):
    (x,) = xs
    target = op.params()["shape"]
    s = shape_of(x)[1:]
    x = bt.reshape(x, (bt.B,) + (1,) * (len(target) - len(s)) + s)  # keep B at axis 0
    return bt.remake(op, [x], shape=(bt.B,) + target)


def _slice(bt, op, xs, bs):
    p = op.params()
    return bt.remake(op, xs, starts=(0,) + p["starts"], limits=(bt.B,) + p["limits"],
                     strides=(1,) + p["strides"])


def _pad(bt, op, xs, bs):
    p = op.params()
    return bt.remake(op, xs, low=(0,) + p["low"], high=(0,) + p["high"])


def _concat(bt, op, xs, bs):
    return bt.remake(op, [x if b else bt.bcast(x) for x, b in zip(xs, bs)],
                     axis=op.params()["axis"] + 1)


BATCH_RULES.update({
    "rlx.transpose": _transpose,
    "rlx.reshape": _reshape,
    "rlx.broadcast_to": _broadcast_to,
    "rlx.slice": _slice,
    "rlx.pad": _pad,
    "rlx.concat": _concat,
})


# ---------------------------------------------------------------- convolution family

# op -> (axis of operand 0, axis of operand 1, axis of the result) that the batch folds into
_CONV_FOLD = {"rlx.conv2d": (1, 0, 1), "rlx.conv_transpose2d": (1, 0, 1),
              "rlx.conv2d_filter_grad": (1, 1, 0)}


def _fold(bt: Batcher, x, axis: int):
    """(B, *s) -> s with the batch folded into dim `axis` as its major part (B*s[axis])."""
    shp = shape_of(x)[1:]
    perm = tuple(range(1, axis + 1)) + (0,) + tuple(range(axis + 1, len(shp) + 1))
    x = bt.transpose(x, perm)
    return bt.reshape(x, shp[:axis] + (bt.B * shp[axis],) + shp[axis + 1:])


def _unfold(bt: Batcher, y, axis: int):
    shp = shape_of(y)
    y = bt.reshape(y, shp[:axis] + (bt.B, shp[axis] // bt.B) + shp[axis + 1:])
    return bt.moveaxis_to_front(y, axis)


def _conv(bt: Batcher, op, xs, bs):
    """The batch becomes B times as many groups: both operands fold it into their channel
    dim (an unbatched one is broadcast first), one convolution, the result unfolds it."""
    a0, a1, ar = _CONV_FOLD[op.name]
    x0, x1 = (x if b else bt.bcast(x) for x, b in zip(xs, bs))
    y = bt.remake(op, [_fold(bt, x0, a0), _fold(bt, x1, a1)],
                  groups=op.params()["groups"] * bt.B)
    return _unfold(bt, y, ar)


for _n in _CONV_FOLD:
    BATCH_RULES[_n] = _conv


# ---------------------------------------------------------------- gather / scatter_add

def _gather(bt: Batcher, op, xs, bs):
    (table, idx), (btab, bidx) = xs, bs
    axis, label = op.params()["axis"], op.params()["label"]
    GatherOp = OPS["rlx.gather"]
    if not bidx:
        return bt.emit(GatherOp, [table, idx], axis=axis + 1, label=label)
    if btab:
        # fold B into the gathered axis: (B, T..) -> (T[:a], B*Ta, T[a+1:]), idx += b*Ta
        st = shape_of(table)[1:]
        table = bt.transpose(table, tuple(range(1, axis + 1)) + (0,)
                             + tuple(range(axis + 1, len(st) + 1)))
        table = bt.reshape(table, st[:axis] + (bt.B * st[axis],) + st[axis + 1:])
        idx = bt.batch_offsets(idx, st[axis])
    r = bt.emit(GatherOp, [table, idx], axis=axis, label=label)  # T[:a] + (B, I..) + T[a+1:]
    return bt.moveaxis_to_front(r, axis)


def _scatter_add(bt: Batcher, op, xs, bs):
    (idx, upd), (bidx, bupd) = xs, bs
    p = op.params()
    axis, dim, label = p["axis"], p["dim"], p["label"]
    ScatterOp = OPS["rlx.scatter_add"]
    if not bidx:
        return bt.emit(ScatterOp, [idx, upd], axis=axis + 1, dim=dim, label=label)
    if not bupd:
        upd = bt.bcast(upd)
    # put B just before the indexed dims of the updates, scatter into B*dim rows
    su = shape_of(upd)[1:]
    n = len(shape_of(idx)) - 1
    upd = bt.transpose(upd, tuple(range(1, axis + 1)) + (0,) + tuple(range(axis + 1, len(su) + 1)))
    idx = bt.batch_offsets(idx, dim)
    r = bt.emit(ScatterOp, [idx, upd], axis=axis, dim=bt.B * dim, label=label)
    r = bt.reshape(r, su[:axis] + (bt.B, dim) + su[axis + n:])
    return bt.moveaxis_to_front(r, axis)


BATCH_RULES["rlx.gather"] = _gather
BATCH_RULES["rlx.scatter_add"] = _scatter_add


def _attention(bt, op, xs, bs):  # dialect/attention.py: the vmapped axis folds into B
    from .attention import attention_vmap

    return attention_vmap(bt, op, xs, bs)


BATCH_RULES["rlx.attention"] = _attention
BATCH_RULES["rlx.attention_lse"] = _attention      # the same fold (dialect/attention_bwd.py)
BATCH_RULES["rlx.attention_bwd"] = _attention


# ---------------------------------------------------------------- the transform

def vmap_module(module: ModuleOp, batched, batch_size: int) -> ModuleOp:
    """A new module mapping the function over a leading axis of size `batch_size` added to
    each input named in `batched`; other inputs and all params are shared."""
    from .control_vmap import BATCH_CONTROL

    f = get_func(module)
    sig = signature(f)
    batched = [batched] if isinstance(batched, str) else list(batched)
    if isinstance(batch_size, bool) or int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f"vmap: batch_size must be an integer >= 1, got {batch_size!r}")
    B = int(batch_size)
    kinds = {a.name: a.kind for a in sig}
    inputs = [a.name for a in sig if a.kind == "input"]
    for n in batched:
        if kinds.get(n) == "param":
            raise ValueError(f"vmap: params are shared, not batched: {n!r}")
        if n not in kinds:
            raise NameLookupError(f"vmap: unknown input {n!r}; valid: {inputs}")
    bset = set(batched)

    new_args = [Arg(a.name, a.kind, ((B,) + tuple(a.shape)) if a.name in bset else a.shape,
                    a.dtype) for a in sig]
    mod, nf, block = new_function(f.sym_name.data, new_args)
    env = dict(zip(f.args, block.args))
    is_b = {nv for a, nv in zip(sig, block.args) if a.name in bset}
    bt = Batcher(block, B)

    for op in f.body.block.ops:
        if isinstance(op, func.ReturnOp):
            break
        flags = [env[o] in is_b for o in op.operands]
        if not any(flags):
            block.add_op(op.clone(value_mapper=env))  # shared: maps op's result into env
            continue
        if op.name in BATCH_CONTROL:   # region ops: several results (dialect/control_ad.py)
            for r, new in zip(op.results, BATCH_CONTROL[op.name](
                    bt, op, [env[o] for o in op.operands], flags)):
                env[r] = new
                is_b.add(new)
            continue
        rule = BATCH_RULES.get(op.name)
        if rule is None or not isinstance(op, RlxOp):
            raise NotImplementedError(f"vmap: no batching rule for {op.name}")
        new = rule(bt, op, [env[o] for o in op.operands], flags)
        want = (B,) + shape_of(op.results[0])
        assert shape_of(new) == want, f"vmap rule of {op.name}: got {shape_of(new)}, want {want}"
        if new.name_hint is None:
            new.name_hint = op.results[0].name_hint
        env[op.results[0]] = new
        is_b.add(new)

    outs = [env[v] if env[v] in is_b else bt.bcast(env[v]) for v in outputs(f)]
    finish_function(nf, block, outs)
    return mod


@dataclass(frozen=True)
class VmapPass(ModulePass):
    """vmap: add a leading batch axis of `size` to the inputs in `batched`."""

    name = "rlx-vmap"

    batched: tuple[str, ...]
    size: int

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        new = vmap_module(op, list(self.batched), self.size)
        replace_module_body(op, new)


def replace_module_body(op: ModuleOp, new: ModuleOp) -> None:
    """Make `op` hold the contents of `new` (how a rebuilding pass mutates in place)."""
    body = op.body.block
    for old in list(body.ops):
        body.erase_op(old, safe_erase=False)
    for nop in list(new.body.block.ops):
        nop.detach()
        body.add_op(nop)

"""Fusion: which rlx values get a buffer, and every other value as an inlined expression.

    rlx func body (tensor SSA values)
          │ plan(): one reverse pass decides the *materialized* values
          ▼
    roots:  outputs, reductions, matmuls, concat, scatter_add, non-splat constants,
            index operands of gather/scatter_add, and every computed value that
            would otherwise be evaluated twice or through an expanding index map
          │ Gen.value(v, idx): expression of v at a multi-index, stopping at buffers
          ▼
    loops.Expr trees whose leaves are Load(buffer, Affine) and Const

Algorithm.  Walking the ops backwards, each value collects the set of *paths*
by which roots consume it: (root, view ops passed through).  A path through a
pure index map (broadcast_to, reshape, transpose, slice) keeps the element
identity of that map; elementwise ops keep the path unchanged, so `y*y` is one
path (generated once, shared by memoisation) while `y + y.T` is two.  A
computed value is materialized when it has more than one path (it would be
recomputed and possibly re-read), or when a path runs through an *expanding*
map (broadcast that grows the element count, pad), which would evaluate it
more often than it has elements (also a gather with more entries than its table:
im2col's padded image is padded once, not once per window).  Views and splat constants are never
materialized on their own: they are free index maps.  Everything else is
inlined into the loop nest of its root, so a chain of elementwise ops, the
broadcasts and reshapes between them and the reduction that consumes them are
one kernel and no intermediate touches memory.

A matmul needs each operand as a strided 2-D view of a buffer.  The walk
through the operand's view chain is tried symbolically: if the base value's
buffer is reached with an offset affine in (batch, row, k), the base is
materialized and the strides go to sgemm (`x.T @ w` packs from x directly);
otherwise the operand itself is materialized.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np
from xdsl.dialects import func

from rlxc.dialect.module import get_func, outputs
from rlxc.dialect.shapes import ELEMENTWISE_FAMILIES, SHAPES, ops_where  # noqa: F401
from rlxc.dialect.types import dense_value, dtype_of, is_splat, numel, shape_of, splat_element

from rlxc.lowering.cpu import indexing as ix
from rlxc.lowering.cpu.loops import Buffer, Const, IndexValue, InRange, Load, Op

# name sets derived from the op properties (dialect/shapes.py)
VIEW_OPS = ops_where(lambda s: s.view)
FREE_OPS = VIEW_OPS | {"rlx.stop_gradient"}  # never worth a buffer of their own
# roots: the ops computed by a kernel of their own, and concat (the CPU writes it piecewise)
ROOT_OPS = ops_where(lambda s: s.root) | {"rlx.concat"}
SUPPORTED_DTYPES = ("f32", "f64", "i1", "i32", "i64", "u32")


def unsupported_dtype(opname: str, dtype: str):
    return NotImplementedError(
        f"cpu backend: {opname} on {dtype} is not supported (f32 compute; f64 only for "
        f"arithmetic, compares, casts and reductions; i1 masks; i32/i64 indices) - "
        f"cast to f32 before compiling")


def check_dtype(v, opname: str):
    d = dtype_of(v.type)
    if d not in SUPPORTED_DTYPES:
        raise unsupported_dtype(opname, d)
    return d


def is_splat_const(v) -> bool:
    op = v.owner
    return getattr(op, "name", None) == "rlx.constant" and is_splat(op.value)


def splat_value(v):
    x = splat_element(v.owner.value)
    d = dtype_of(v.type)
    return bool(x) if d == "i1" else (int(x) if d in ("i32", "i64", "u32") else float(x))


class Plan:
    """The fusion decisions for one function body."""

    def __init__(self, module):
        f = module if isinstance(module, func.FuncOp) else get_func(module)
        self.func = f
        self.args = list(f.args)
        self.ops = [op for op in f.body.block.ops if not isinstance(op, func.ReturnOp)]
        self.outputs = outputs(f)
        self.materialized: set = set(self.args)
        self.reasons: dict = {}
        self.paths: dict = defaultdict(set)
        for v in self.args:
            check_dtype(v, "argument")
        self._decide()

    def _mark(self, v, why):
        if v not in self.materialized:
            self.materialized.add(v)
            self.reasons[v] = why

    def _decide(self):
        for k, v in enumerate(self.outputs):
            self._mark(v, f"output {k}")
            self.paths[v].add(("return", k))
        for op in reversed(self.ops):
            v = op.results[0]
            check_dtype(v, op.name)
            name = op.name
            if not self.paths.get(v):
                continue  # dead: nothing consumes it
            if name == "rlx.constant":
                if not is_splat(op.value):
                    self._mark(v, "constant data")
                continue
            if name in ROOT_OPS:
                self._mark(v, name)
            elif name not in FREE_OPS and (len(self.paths[v]) > 1 or any(
                    p[1] == "expand" for p in self.paths[v])):
                self._mark(v, "several consumers" if len(self.paths[v]) > 1 else
                           "read through an expanding broadcast/pad")
            mine = {(v, ())} if v in self.materialized else self.paths[v]
            expands = name == "rlx.pad" or (name in ("rlx.broadcast_to", "rlx.gather") and
                                            numel(shape_of(v.type)) >
                                            numel(shape_of(op.operands[0].type)))
            for pos, o in enumerate(op.operands):
                if name in ("rlx.gather", "rlx.scatter_add") and pos == (1 if name ==
                                                                        "rlx.gather" else 0):
                    self._mark(o, f"indices of {name}")
                    self.paths[o].add((v, ("idx",)))
                    continue
                if name == "rlx.matmul":
                    self._matmul_operand(o)
                for root, path in mine:
                    if expands:
                        self.paths[o].add((root, "expand"))
                    elif path == "expand":
                        self.paths[o].add((root, "expand"))
                    elif name in VIEW_OPS:
                        self.paths[o].add((root, path + ((op, pos),)))
                    else:
                        self.paths[o].add((root, path))

    def _matmul_operand(self, o):
        base = o
        while getattr(base.owner, "name", None) in VIEW_OPS:
            base = base.owner.operands[0]
        if is_splat_const(base):
            self._mark(o, "matmul operand (constant)")
            return
        placeholder = Buffer("probe", "temp", dtype_of(base.type), numel(shape_of(base.type)))
        g = Gen(self, {base: placeholder}, stop=base)
        shp = shape_of(o.type)
        vars_ = [ix.var(ix.Var(f"p{d}", n)) if n != 1 else ix.ZERO for d, n in enumerate(shp)]
        e = g.value(o, tuple(vars_))
        if isinstance(e, Load) and e.buf is placeholder and ix.is_plain(e.off):
            self._mark(base, "matmul operand (strided view)")
        else:
            self._mark(o, "matmul operand")

    def describe(self) -> list[str]:
        return [f"{v.name_hint or '%'}: {why}" for v, why in self.reasons.items()]


class Gen:
    """Expressions of rlx values at symbolic multi-indices.

    `bufs` maps materialized values to their buffers; `stop` (optional) is a
    value treated as a buffer even if not in the plan (used for probing).
    `checks` collects (index buffer, bound, op) triples that must be
    bounds-checked before the generated code runs."""

    def __init__(self, plan: Plan, bufs: dict, stop=None):
        self.plan = plan
        self.bufs = bufs
        self.stop = stop
        self.memo: dict = {}
        self.checks: list = []

    def value(self, v, idx: tuple):
        """Expression of value `v` at multi-index `idx` (a tuple of Affine)."""
        if v in self.bufs and (v in self.plan.materialized or v is self.stop):
            if is_splat_const(v):
                return Const(splat_value(v), dtype_of(v.type))
            return Load(self.bufs[v], ix.linearize(idx, shape_of(v.type)))
        if is_splat_const(v):
            return Const(splat_value(v), dtype_of(v.type))
        key = (v, idx)
        e = self.memo.get(key)
        if e is None:
            e = self.compute(v, idx)
            self.memo[key] = e
        return e

    def compute(self, v, idx: tuple):
        """Expression of v's defining op at idx (v's own buffer is not consulted)."""
        op = v.owner
        name = op.name
        short = name[4:]
        shp = shape_of(v.type)
        dt = check_dtype(v, name)
        fam = getattr(op, "FAMILY", "")
        if name == "rlx.constant":
            if is_splat(op.value):
                return Const(splat_value(v), dt)
            raise AssertionError("non-splat constants are materialized")
        if name == "rlx.iota":   # a size-generic program's counters (dialect/iota.py)
            return IndexValue(idx[0], dt)
        if fam in ELEMENTWISE_FAMILIES:
            args = tuple(self.value(o, idx) for o in op.operands)
            for o in op.operands:
                check_dtype(o, name)
            if name == "rlx.cast":
                return Op("cast", args, dt)
            params = tuple(sorted(op.params().items())) if name in ("rlx.fake_quant",
                                                                    "rlx.philox") else ()
            if fam in ("unary", "binary") and dt not in SHAPES[name].dtypes:
                raise unsupported_dtype(name, dt)
            return Op(short, args, dt, params)
        x = op.operands[0]
        p = op.params()
        if name == "rlx.broadcast_to":
            xs = shape_of(x.type)
            lead = len(shp) - len(xs)
            return self.value(x, tuple(ix.ZERO if xs[d] == 1 else idx[lead + d]
                                       for d in range(len(xs))))
        if name == "rlx.transpose":
            perm = p["perm"]
            inner = [None] * len(perm)
            for i, pi in enumerate(perm):
                inner[pi] = idx[i]
            return self.value(x, tuple(inner))
        if name == "rlx.reshape":
            flat = ix.linearize(idx, shp)
            if x in self.bufs and (x in self.plan.materialized or x is self.stop) and \
                    not is_splat_const(x):   # same row-major offset: no div/mod round trip
                return Load(self.bufs[x], flat)
            return self.value(x, tuple(ix.delinearize(flat, shape_of(x.type))))
        if name == "rlx.slice":
            return self.value(x, tuple(ix.add(ix.scale(i, st), s) for i, s, st in
                                       zip(idx, p["starts"], p["strides"])))
        if name == "rlx.pad":
            xs = shape_of(x.type)
            conds, inner = [], []
            for i, d, lo, hi in zip(idx, xs, p["low"], p["high"]):
                j = ix.add(i, -lo)
                if lo or hi:
                    conds.append(InRange(j, 0, d))
                inner.append(ix.clamp(j, 0, max(d - 1, 0)))
            val = self.value(x, tuple(inner))
            if not conds:
                return val
            cond = conds[0]
            for c in conds[1:]:
                cond = Op("and", (cond, c), "i1")
            zero = Const(False if dt == "i1" else 0, dt)
            return Op("select", (cond, val, zero), dt)
        if name == "rlx.gather":
            table, ind = op.operands
            check_dtype(ind, name)
            ts, si = shape_of(table.type), shape_of(ind.type)
            axis = p["axis"]
            bound = ts[axis]
            n = len(si)
            aff = affine_constant_index(self.plan, ind, bound)
            if aff is not None:   # in range (checked here, once): an affine position
                pos = ix.add(ix.const(aff[0]), *(ix.scale(i, k) for i, k in
                                                  zip(idx[axis:axis + n], aff[1])))
                return self.value(table, tuple(idx[:axis]) + (pos,) + tuple(idx[axis + n:]))
            ibuf = self.bufs[ind]
            self.checks.append((ibuf, bound, name, axis, p.get("label", "")))
            pos = ix.of(ix.LoadIdx(ibuf, ix.linearize(idx[axis:axis + n], si), bound))
            return self.value(table, tuple(idx[:axis]) + (pos,) + tuple(idx[axis + n:]))
        raise AssertionError(f"{name} is a root op and has no inline expression")


def affine_constant_index(plan, ind, bound: int):
    """(c0, coefs) when `ind` is a constant whose entries are c0 + sum_d coefs[d] * i_d at
    position (i_0, i_1, ...), coefs >= 0, and all lie in [0, bound) (im2col's window indices,
    dialect/conv_decompose.py), else None.  Such a gather is a strided view: no index
    load, no division of the loaded index, no runtime range check.  Cached on the plan."""
    cache = plan.__dict__.setdefault("_affine_idx", {})
    key = (ind, bound)
    if key in cache:
        return cache[key]
    out = None
    if getattr(ind.owner, "name", None) == "rlx.constant" and not is_splat(ind.owner.value):
        arr = np.asarray(dense_value(ind.owner.value)).astype(np.int64)
        if arr.size and arr.min() >= 0 and arr.max() < bound:
            c0 = int(arr.reshape(-1)[0])
            coefs = tuple(int(arr[(0,) * d + (1,) + (0,) * (arr.ndim - d - 1)]) - c0
                          if arr.shape[d] > 1 else 0 for d in range(arr.ndim))
            want = np.full(arr.shape, c0, np.int64)
            for d, k in enumerate(coefs):
                if k:
                    want += k * np.arange(arr.shape[d]).reshape((-1,) + (1,) * (arr.ndim - d - 1))
            # non-negative steps only (im2col's): a descending index, read through a
            # reshape of the table, would leave floordiv a possibly negative offset
            if min(coefs) >= 0 and np.array_equal(arr, want):
                out = (c0, coefs)
    cache[key] = out
    return out


def const_bytes(v) -> tuple[bytes, str]:
    """Raw little-endian data of a constant value (i1 as one byte each)."""
    arr = dense_value(v.owner.value)
    d = dtype_of(v.type)
    if d == "i1":
        return np.ascontiguousarray(arr, dtype=np.uint8).tobytes(), d
    return np.ascontiguousarray(arr).tobytes(), d

"""Inline evaluation of fused rlx expressions at an index, inside a GPU kernel.

    value(ctx, v, Index(shape, linear | dims, lanes))
          │ materialized v  → load from its buffer   (<4 x T> load when lanes = 4)
          │ fused heavy v   → ctx.hooks[v](idx)      (matmul / reduction accumulator)
          │ otherwise       → EXPR_RULES[op.name](ctx, op, idx): elementwise ops apply
          │                   the shared scalar rules (gpu/scalar.GPU_RULES) per lane;
          │                   views map the index to
          │                   the operand's index:
          │   broadcast_to  dims of size 1 → 0      reshape   linear index kept
          │   transpose     dims permuted           slice     start + i*stride
          │   pad           i - low, zero outside   concat    branch on the axis
          │   gather        the table's axis index is read from the indices operand
          ▼
    list of SSA scalars: one per lane, or a single one when lane-uniform

An Index holds a shape plus its linear index and/or per-dim indices, each
computed lazily (udiv/urem by constants) and cached, so a chain of elementwise
ops reads each leaf once and a leaf of the root's shape needs no division.
Vector mode (lanes = 4 along the innermost dim) is used only for trees of
elementwise ops and broadcasts (see `vectorizable`): a leaf whose innermost dim
matches the root's is read with one 16-byte load, one broadcast along the
innermost dim is read once and shared by the lanes.  Values are memoized per
(value, index) so x*sigmoid(x) reads x once; the memo is scoped around the
branches of concat.  i1 masks are stored one byte per element.
"""
from __future__ import annotations

import llvmlite.ir as ir
import numpy as np

from rlxc.dialect.types import dense_value, dtype_of, numel, shape_of

from rlxc.lowering.gpu.plan import op_of
from rlxc.lowering.gpu import scalar as S
from rlxc.lowering.gpu.scalar import REG_TYPE, convert

from rlxc.lowering.shared.scalar import F32, F64, I1, I8, I32, I64  # noqa: E402  (one definition of the IR types)

# register type and storage type of each rlx dtype
MEM_TYPE = {"f32": F32, "f64": F64, "i1": I8, "i32": I32, "i64": I64, "u32": I32}
from rlxc.dialect.shapes import DTYPE_BYTES as MEM_BYTES  # noqa: E402


def strides(shape) -> list[int]:
    out, s = [], 1
    for d in reversed(shape):
        out.append(s)
        s *= int(d)
    return out[::-1]


class Index:
    """A position in a tensor of `shape`: linear and/or per-dim indices (lazy, cached)."""

    def __init__(self, ctx, shape, linear=None, dims=None, lanes: int = 1):
        self.ctx, self.shape, self.lanes = ctx, tuple(shape), lanes
        self._lin = linear
        self._dims = list(dims) if dims is not None else [None] * len(self.shape)
        if not self.shape:
            self._lin = ctx.const(0)

    def linear(self):
        if self._lin is None:
            b, c = self.ctx.b, self.ctx.const
            acc = None
            for d, s, n in zip(self._dims_all(), strides(self.shape), self.shape):
                if n == 1:
                    continue
                t = d if s == 1 else b.mul(d, c(s))
                acc = t if acc is None else b.add(acc, t)
            self._lin = acc if acc is not None else c(0)
        return self._lin

    def dim(self, i: int):
        if self._dims[i] is None:
            b, c = self.ctx.b, self.ctx.const
            if self.shape[i] == 1:
                self._dims[i] = c(0)
            else:
                s = strides(self.shape)[i]
                q = self._lin if s == 1 else b.udiv(self._lin, c(s))
                self._dims[i] = q if i == 0 else b.urem(q, c(self.shape[i]))
        return self._dims[i]

    def _dims_all(self):
        return [self.dim(i) for i in range(len(self.shape))]

    def has_dims(self) -> bool:
        """True when every dim index is known without a division."""
        return all(d is not None or n == 1 for d, n in zip(self._dims, self.shape))

    def force(self):
        """Compute everything now (before a branch, so both sides can use it)."""
        self._dims_all()
        self.linear()


class ExprCtx:
    """Per-kernel state: builder, index type, buffer pointers, fused-heavy hooks, memo."""

    def __init__(self, sm, plan, ptr_of: dict, itype=I32, hooks=None):
        self.sm, self.plan, self.itype = sm, plan, itype
        self.ptr_of = ptr_of          # buffer id -> pointer argument
        self.hooks = hooks or {}      # SSA value -> fn(idx) -> lanes
        self.memo: dict = {}

    @property
    def b(self) -> ir.IRBuilder:
        return self.sm.b

    def const(self, v: int):
        return ir.Constant(self.itype, int(v))

    def pointer(self, v):
        return self.ptr_of[self.plan.buffer_of[v].id]


def check_index(ctx, op, iv, bound: int) -> None:
    """Index register `iv` (in its own dtype) of gather/scatter_add `op` must lie in
    [0, bound): otherwise write the op's error code to the error flag (gpu/plan.py step 6;
    the runtime raises the IndexError the CPU and the interpreter raise)."""
    code = ctx.plan.error_codes.get(op)
    if code is None:
        raise AssertionError(f"{op.name} has no error code in the GPU plan")
    b = ctx.b
    bad = b.icmp_unsigned(">=", iv, ir.Constant(iv.type, bound))    # negative: huge unsigned
    with b.if_then(bad, likely=False):
        b.store(ir.Constant(I32, code), ctx.ptr_of[ctx.plan.error_buffer.id])


# ---------------------------------------------------------------- loads / stores

def element_ptr(ctx, v, lin):
    dt = dtype_of(v.type)
    return ctx.b.gep(ctx.pointer(v), [gep_index(ctx, lin)], source_etype=MEM_TYPE[dt])


def gep_index(ctx, lin):
    return ctx.b.zext(lin, I64) if lin.type == I32 else lin


def _from_mem(ctx, x, dt):
    return ctx.b.icmp_unsigned("!=", x, ir.Constant(I8, 0)) if dt == "i1" else x


def _to_mem(ctx, x, dt):
    return ctx.b.zext(x, I8) if dt == "i1" else x


def load(ctx, v, idx: Index) -> list:
    dt = dtype_of(v.type)
    b = ctx.b
    if idx.lanes == 4 and MEM_BYTES[dt] == 4:
        vt = ir.VectorType(MEM_TYPE[dt], 4)
        vec = b.load(element_ptr(ctx, v, idx.linear()), typ=vt, align=16)
        return [b.extract_element(vec, ir.Constant(I32, j)) for j in range(4)]
    out = []
    for j in range(idx.lanes):
        lin = idx.linear() if j == 0 else b.add(idx.linear(), ctx.const(j))
        x = b.load(element_ptr(ctx, v, lin), typ=MEM_TYPE[dt])
        out.append(_from_mem(ctx, x, dt))
    return out


def store(ctx, v, idx: Index, vals: list) -> None:
    """Store the lanes of root `v` at `idx` (one 16-byte store when 4 lanes of 4 bytes)."""
    dt = dtype_of(v.type)
    b = ctx.b
    vals = vals * idx.lanes if len(vals) == 1 else vals
    if idx.lanes == 4 and MEM_BYTES[dt] == 4:
        vt = ir.VectorType(MEM_TYPE[dt], 4)
        vec = ir.Constant(vt, ir.Undefined)
        for j, x in enumerate(vals):
            vec = b.insert_element(vec, x, ir.Constant(I32, j))
        b.store(vec, element_ptr(ctx, v, idx.linear()), align=16)
        return
    for j, x in enumerate(vals):
        lin = idx.linear() if j == 0 else b.add(idx.linear(), ctx.const(j))
        b.store(_to_mem(ctx, x, dt), element_ptr(ctx, v, lin))


# ---------------------------------------------------------------- evaluation

def value(ctx, v, idx: Index, root: bool = False) -> list:
    """The lanes of SSA value `v` at `idx` (root=True: compute v even if it has a buffer)."""
    key = (v, id(idx))
    hit = ctx.memo.get(key)
    if hit is not None:
        return hit[1]
    if v in ctx.hooks:
        out = ctx.hooks[v](idx)
    elif not root and v in ctx.plan.materialized:
        out = load(ctx, v, idx)
    else:
        op = op_of(v)
        if op is None:
            raise AssertionError(f"argument {v} has no buffer")
        rule = EXPR_RULES.get(op.name)
        if rule is None:
            raise NotImplementedError(f"GPU lowering: no expression rule for {op.name}")
        out = rule(ctx, op, idx)
    ctx.memo[key] = (idx, out)
    return out


def _lanes(*xs):
    n = max(len(x) for x in xs)
    return [x * n if len(x) == 1 else x for x in xs], n


def _elementwise(ctx, op, idx):
    """An elementwise op: its shared scalar rule (gpu/scalar.py) applied per lane."""
    ins = [value(ctx, o, idx) for o in op.operands]
    ins, n = _lanes(*ins)
    return [S.emit(ctx.b, op, [x[j] for x in ins]) for j in range(n)]


def _constant(ctx, op, idx):
    dt = dtype_of(op.results[0].type)
    arr = dense_value(op.value)
    flat = arr.reshape(-1)  # splat: all elements the same bits (NaN != NaN, -0.0 == 0.0)
    if flat.size > 1 and flat.tobytes() != flat[:1].tobytes() * flat.size:
        return load(ctx, op.results[0], idx)   # materialized (non-splat)
    x = arr.reshape(-1)[0].item() if arr.size else 0
    if dt in ("f32", "f64"):
        return [ir.Constant(REG_TYPE[dt], float(x))]
    return [ir.Constant(REG_TYPE[dt], int(x))]


# ---------------------------------------------------------------- views

def _broadcast(ctx, op, idx):
    x = op.operands[0]
    xs, os_ = shape_of(x.type), idx.shape
    n, r = len(os_), len(xs)
    inner_lanes = 1 if (r == 0 or xs[-1] == 1) else idx.lanes
    if numel(xs) == 1:
        return value(ctx, x, Index(ctx, xs, linear=ctx.const(0), lanes=1))
    stripped = list(xs)
    while stripped and stripped[0] == 1:
        stripped.pop(0)
    k = len(stripped)
    if tuple(stripped) == tuple(os_[n - k:]) and not idx.has_dims():  # leading bcast only
        lin = ctx.b.urem(idx.linear(), ctx.const(numel(xs))) if numel(xs) != numel(os_) \
            else idx.linear()
        return value(ctx, x, Index(ctx, xs, linear=lin, lanes=inner_lanes))
    dims = []
    for j in range(r):
        oj = j + n - r
        dims.append(ctx.const(0) if xs[j] == 1 and os_[oj] != 1 else idx.dim(oj))
    return value(ctx, x, Index(ctx, xs, dims=dims, lanes=inner_lanes))


def _reshape(ctx, op, idx):
    x = op.operands[0]
    assert idx.lanes == 1
    return value(ctx, x, Index(ctx, shape_of(x.type), linear=idx.linear()))


def _transpose(ctx, op, idx):
    x = op.operands[0]
    perm = op.params()["perm"]
    dims = [None] * len(perm)
    for i, p in enumerate(perm):
        dims[p] = idx.dim(i)
    return value(ctx, x, Index(ctx, shape_of(x.type), dims=dims))


def _slice(ctx, op, idx):
    x = op.operands[0]
    p = op.params()
    b = ctx.b
    dims = []
    for i, (s, st) in enumerate(zip(p["starts"], p["strides"])):
        d = idx.dim(i)
        if st != 1:
            d = b.mul(d, ctx.const(st))
        if s:
            d = b.add(d, ctx.const(s))
        dims.append(d)
    return value(ctx, x, Index(ctx, shape_of(x.type), dims=dims))


def _pad(ctx, op, idx):
    x = op.operands[0]
    xs = shape_of(x.type)
    p = op.params()
    b = ctx.b
    dims, ok = [], None
    for i, (lo, n) in enumerate(zip(p["low"], xs)):
        d = idx.dim(i)
        if lo == 0 and p["high"][i] == 0:
            dims.append(d)
            continue
        t = b.sub(d, ctx.const(lo)) if lo else d
        inb = b.icmp_unsigned("<", t, ctx.const(n))      # 0 <= i - low < n
        dims.append(b.select(inb, t, ctx.const(0)))
        ok = inb if ok is None else b.and_(ok, inb)
    vals = value(ctx, x, Index(ctx, xs, dims=dims))
    if ok is None:
        return vals
    dt = dtype_of(x.type)
    zero = ir.Constant(REG_TYPE[dt], 0.0 if dt in ("f32", "f64") else 0)
    return [b.select(ok, v, zero) for v in vals]


def _concat(ctx, op, idx):
    axis = op.params()["axis"]
    idx.force()
    b = ctx.b
    d = idx.dim(axis)
    n = len(op.operands)
    ty = REG_TYPE[dtype_of(op.results[0].type)]
    end = b.append_basic_block("concat.end")
    incoming = []
    off = 0
    saved = dict(ctx.memo)
    for k, x in enumerate(op.operands):
        xs = shape_of(x.type)
        last = k == n - 1
        if not last:
            here = b.append_basic_block(f"concat.in{k}")
            other = b.append_basic_block(f"concat.not{k}")
            b.cbranch(b.icmp_unsigned("<", d, ctx.const(off + xs[axis])), here, other)
            b.position_at_end(here)
        dims = [idx.dim(i) if i != axis else (b.sub(d, ctx.const(off)) if off else d)
                for i in range(len(xs))]
        ctx.memo = dict(saved)
        (v,) = value(ctx, x, Index(ctx, xs, dims=dims))
        incoming.append((v, b.block))
        b.branch(end)
        if not last:
            b.position_at_end(other)
        off += xs[axis]
    ctx.memo = saved
    b.position_at_end(end)
    phi = b.phi(ty)
    for v, blk in incoming:
        phi.add_incoming(v, blk)
    return [phi]


def _gather(ctx, op, idx):
    table, ids = op.operands
    axis = op.params()["axis"]
    ts, is_ = shape_of(table.type), shape_of(ids.type)
    k = len(is_)
    b = ctx.b
    (iv,) = value(ctx, ids, Index(ctx, is_, dims=[idx.dim(axis + j) for j in range(k)]))
    check_index(ctx, op, iv, ts[axis])
    iv = convert(b, iv, dtype_of(ids.type), "i64" if ctx.itype == I64 else "i32")
    # out-of-range indices set the error flag (IndexError after the run) and are clamped
    # to [0, d), so no kernel reads outside the table
    hi = ctx.const(ts[axis] - 1)
    iv = b.select(b.icmp_signed("<", iv, ctx.const(0)), ctx.const(0), iv)
    iv = b.select(b.icmp_signed(">", iv, hi), hi, iv)
    dims = [idx.dim(i) for i in range(axis)] + [iv] + \
           [idx.dim(axis + k + i) for i in range(len(ts) - axis - 1)]
    return value(ctx, table, Index(ctx, ts, dims=dims))


EXPR_RULES = {
    **{name: _elementwise for name in S.GPU_RULES},
    "rlx.constant": _constant,
    "rlx.broadcast_to": _broadcast,
    "rlx.reshape": _reshape,
    "rlx.transpose": _transpose,
    "rlx.slice": _slice,
    "rlx.pad": _pad,
    "rlx.concat": _concat,
    "rlx.gather": _gather,
}

LANE_OPS = {name for name, r in EXPR_RULES.items()
            if name not in ("rlx.constant", "rlx.broadcast_to", "rlx.reshape", "rlx.transpose",
                            "rlx.slice", "rlx.pad", "rlx.concat", "rlx.gather")}


def vectorizable(plan, root, hooks=(), lanes: int = 4) -> bool:
    """Can the tree of `root` run `lanes` consecutive innermost elements per thread?
    Only elementwise ops, broadcasts and splat constants between root and leaves; the
    root's innermost dim divisible by `lanes`."""
    shp = shape_of(root.type)
    if not shp or shp[-1] % lanes:
        return False
    seen = set()

    def ok(v, top=False):
        if v in seen:
            return True
        seen.add(v)
        if v in hooks or (not top and v in plan.materialized):
            return True
        op = op_of(v)
        if op is None:
            return True
        if op.name == "rlx.constant":
            arr = dense_value(op.value)
            return arr.size <= 1 or bool(np.all(arr == arr.reshape(-1)[0]))
        if op.name not in LANE_OPS and op.name != "rlx.broadcast_to":
            return False
        return all(ok(o) for o in op.operands)

    return ok(root, top=True)


def index_type(plan, values) -> ir.IntType:
    """i32 when every tensor the kernel touches has fewer than 2^31 elements, else i64."""
    big = max((numel(shape_of(v.type)) for v in values), default=0)
    return I32 if big < 2 ** 31 - 1024 else I64

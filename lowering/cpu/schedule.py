"""Schedules: one loop nest (or sgemm call) per fusion root.

    fusion.Plan (materialized values) + fusion.Gen (inlined expressions)
          │ build_program: buffers for args/outputs/constants/temps, then per root
          ▼
    map        for i...: out[lin(i)] = expr(i)            (elementwise, views, pad, gather,
                                                            output copies, concat pieces)
    reduce     scalar:  for kept: acc = id; for red: acc op= expr; out = fin(acc)
               buffer:  for kept_outer: out[:] = id; for red: for kept_inner: out op= expr
               split:   parallel partials over chunks of the first reduced dim, then combine
    matmul     (matmul_schedule.py) sgemm per batch element on strided views; an elementwise consumer
               that is the only reader becomes its epilogue (bias, activation fused)
    scatter    out = 0; check indices; for upd: out[idx[j]] += upd[j]   (serial; affine
               constant indices, col2im: a strided nest instead, strided_scatter.py)
          ▼
    loops.Program (buffers.plan assigns workspace offsets afterwards)

Loop shaping: size-1 dims get no loop; adjacent dims are collapsed into one
loop whenever every index expression stays affine after substituting
i = j // n, k = j % n (so contiguous elementwise kernels become one flat loop
of i64 induction, the shape LLVM's vectorizer likes).  The outermost loop is
marked parallel when the estimated work is large enough to pay for waking
threads.  Float sums and products over more than BLOCK elements are
accumulated in f32 blocks of BLOCK elements (vectorized, reassociated) whose
results are added in f64: the error stays near a few f32 ulps of the result,
independent of the reduction length.  Reductions whose reduced dims are not
innermost (e.g. sum over axis 0) accumulate in the f32 output buffer
sequentially (error grows like n * 2^-24 relative to sum |x|).
"""
from __future__ import annotations

from rlxc.dialect.shapes import SHAPES
from rlxc.dialect.types import dtype_of, numel, shape_of

from rlxc.lowering.cpu import indexing as ix
from rlxc.lowering.cpu.fusion import ELEMENTWISE_FAMILIES, Gen, Plan, const_bytes, is_splat_const
from rlxc.lowering.cpu.loops import (Buffer, CheckKernel, Const, For, InRange, IndexValue, Load,
                    LoopKernel, Op, Program, Store, walk_expr)

from rlxc.lowering.shared.scalar import identity as scalar_identity
from rlxc.lowering.cpu.tuning import (BLOCK, CHUNK, MAX_CHUNKS, PAR_MIN_WORK,  # noqa: F401
                                       SGEMM_PAR_MIN, SPLIT_MIN, STREAM_MIN_BYTES,
                                       STREAM_MIN_ROW)

# work units of one element of each loop-IR op, from the op's cost class (dialect/shapes.py)
COST = {name[4:]: {"cheap": 1, "costly": 4, "heavy": 10}[s.cost] for name, s in SHAPES.items()}


def cost(e) -> int:
    c = 0
    for x in walk_expr(e):
        if isinstance(x, Op):
            c += COST.get(x.op, 1)
    return c


def map_expr(e, mapping: dict, memo=None, rebase=None):
    """Substitute loop variables inside every index of an expression tree; with `rebase`,
    each load's offset then becomes rebase(buf, offset)."""
    memo = {} if memo is None else memo
    r = memo.get(id(e))
    if r is not None:
        return r
    if isinstance(e, Load):
        off = ix.subst(e.off, mapping)
        r = Load(e.buf, rebase(e.buf, off) if rebase else off)
    elif isinstance(e, InRange):
        r = InRange(ix.subst(e.idx, mapping), e.lo, e.hi)
    elif isinstance(e, IndexValue):
        r = IndexValue(ix.subst(e.idx, mapping), e.dtype)
    elif isinstance(e, Op):
        r = Op(e.op, tuple(map_expr(a, mapping, memo, rebase) for a in e.args), e.dtype,
               e.params)
    else:
        r = e
    memo[id(e)] = r
    return r


def _affines(e):
    for x in walk_expr(e):
        if isinstance(x, Load):
            yield x.off
        elif isinstance(x, (InRange, IndexValue)):
            yield x.idx


def _plain_in(a, v) -> bool:
    for atom, _ in ix.of(a).terms:
        if isinstance(atom, ix.LoadIdx):
            if not _plain_in(atom.off, v):
                return False
        elif not isinstance(atom, ix.Var) and v in ix.variables(ix.of(atom)):
            return False
    return True


def collapse(vars_, exprs, affs, labels=None):
    """Merge adjacent loops (same label) when all indices stay affine; returns new lists."""
    vars_, exprs, affs = list(vars_), list(exprs), list(affs)
    labels = list(labels) if labels else [0] * len(vars_)
    i = len(vars_) - 2
    while i >= 0:
        a, b = vars_[i], vars_[i + 1]
        if labels[i] == labels[i + 1]:
            j = ix.Var(a.name, a.extent * b.extent)
            m = {a: ix.floordiv(ix.var(j), b.extent), b: ix.mod(ix.var(j), b.extent)}
            memo: dict = {}
            ne = [map_expr(e, m, memo) for e in exprs]
            na = [ix.subst(x, m) for x in affs]
            if all(_plain_in(x, j) for x in na) and all(
                    _plain_in(x, j) for e in ne for x in _affines(e)):
                vars_[i:i + 2] = [j]
                labels[i:i + 2] = [labels[i]]
                exprs, affs = ne, na
        i -= 1
    return vars_, exprs, affs


def coeff_along(a, v) -> int:
    return ix.of(a).coeffs().get(v, 0)


def linear_in(a, v) -> bool:
    """`a` depends on `v` only through a plain `k * v` term (no div/mod/clamp/indirection)."""
    return all(isinstance(atom, ix.Var) or v not in ix.variables(ix.of(atom))
               for atom, _ in ix.of(a).terms)


def streamable(out, live, expr, off) -> bool:
    """Can the innermost loop of this map store `out` with vector non-temporal stores?

    It must write a large f32 output contiguously (offset coefficient 1) over at least
    STREAM_MIN_ROW iterations, and every leaf must be a plain load that is either
    contiguous f32 along that loop (coefficient 1) or invariant in it."""
    if out.kind != "output" or out.dtype != "f32" or out.nbytes < STREAM_MIN_BYTES or not live:
        return False
    v = live[-1]
    if v.extent < STREAM_MIN_ROW or coeff_along(off, v) != 1 or not linear_in(off, v):
        return False
    for x in walk_expr(expr):
        if isinstance(x, Load):
            c = coeff_along(x.off, v)
            if not linear_in(x.off, v) or c not in (0, 1) or (c == 1 and x.buf.dtype != "f32"):
                return False
        elif isinstance(x, InRange):
            if v in ix.variables(ix.of(x.idx)):
                return False
        elif isinstance(x, Op):
            if x.op in ("fake_quant",):
                return False
        elif not isinstance(x, Const):
            return False
    return True


def nest(vars_, body, parallel=False):
    for v in reversed(vars_):
        body = [For(v, ix.ZERO, ix.const(v.extent), body)]
    if parallel and vars_:
        body[0].parallel = True
    return body


def identity(combine: str, dt: str):
    return Const(scalar_identity(combine, dt), dt)


def _idx(vars_):
    return tuple(ix.var(v) if v.extent != 1 else ix.ZERO for v in vars_)


class Builder:
    def __init__(self, module, name: str, sgemm_threads: int = 1, cpu: str = "native",
                 symbol_sizes: frozenset = frozenset()):
        from rlxc.dialect.module import signature

        self.plan = Plan(module)
        self.name = name
        self.cpu = cpu
        # the sample sizes of a size-generic program's symbols (dynsizes.py; empty for a
        # static program): a dim of one of these sizes may be a symbol, so a schedule
        # choice must not depend on it (reduce.py)
        self.symbol_sizes = symbol_sizes
        self.sgemm_threads = sgemm_threads
        self.args = signature(self.plan.func)
        self.bufs: dict = {}
        self.buffers: list = []
        self.kernels: list = []
        self.errors: dict = {}
        self.error_args: dict = {}
        self._checked: dict = {}
        self._n = 0
        self._assign_buffers()

    # ------------------------------------------------------------ buffers
    def _buf(self, name, kind, dtype, n, index=-1, data=None) -> Buffer:
        b = Buffer(name, kind, dtype, n, index, data)
        self.buffers.append(b)
        return b

    def _assign_buffers(self):
        plan = self.plan
        counts = {"input": 0, "param": 0}
        for a, v in zip(self.args, plan.args):
            k = counts[a.kind]
            counts[a.kind] += 1
            self.bufs[v] = self._buf(f"{a.kind[:2] if a.kind == 'input' else 'p'}{k}_{a.name}"
                                     .replace(".", "_"), a.kind, a.dtype, numel(a.shape), k)
        for op in plan.ops:
            v = op.results[0]
            if v in plan.materialized and op.name == "rlx.constant" and not is_splat_const(v):
                data, dt = const_bytes(v)
                self.bufs[v] = self._buf(f"c{len(self.buffers)}", "const", dt,
                                         numel(shape_of(v.type)), data=data)
        self.out_bufs = []
        for k, v in enumerate(plan.outputs):
            b = self._buf(f"out{k}", "output", dtype_of(v.type), numel(shape_of(v.type)), k)
            self.out_bufs.append(b)
            if v not in self.bufs:
                self.bufs[v] = b
        for op in plan.ops:
            v = op.results[0]
            if v in plan.materialized and v not in self.bufs:
                self.bufs[v] = self._buf(f"t{len(self.buffers)}", "temp", dtype_of(v.type),
                                         numel(shape_of(v.type)))

    # ------------------------------------------------------------ kernels
    def _kname(self, tag):
        self._n += 1
        return f"k{self._n}_{tag}"

    def _add(self, kernel, gen=None):
        for ibuf, bound, opname, axis, *label in (gen.checks if gen else []):
            label = label[0] if label else ""  # the op's label: the user's indexing
            key = (id(ibuf), bound)
            if key in self._checked or _const_in_range(ibuf, bound):
                continue
            code = len(self.errors) + 1
            who = f"{label} ({opname})" if label else opname
            msg = (f"{who}: index out of range [0, {bound}) along axis {axis}"
                   if opname == "rlx.gather" else f"{who}: index out of range [0, {bound})")
            self.errors[code] = ("IndexError", msg)
            if ibuf.kind in ("input", "param"):
                self.error_args[code] = (ibuf.kind, ibuf.index, bound)
            self._checked[key] = code
            self.kernels.append(CheckKernel(self._kname("check"), f"indices of {opname}",
                                            ibuf, ibuf.numel, bound, code, ibuf.numel))
        self.kernels.append(kernel)

    def map_kernel(self, what, shape, out, value_fn, off_fn=None, combine=None,
                   parallel_ok=True, tag="map"):
        if numel(shape) == 0:
            return
        vars_ = [ix.Var(f"i{d}", n) for d, n in enumerate(shape)]
        idx = _idx(vars_)
        gen = Gen(self.plan, self.bufs)
        expr = value_fn(gen, idx)
        off = off_fn(idx) if off_fn else ix.linearize(idx, shape)
        live = [v for v in vars_ if v.extent != 1]
        live, (expr,), (off,) = collapse(live, [expr], [off])
        work = numel(shape) * (1 + cost(expr))
        body = nest(live, [Store(out, off, expr, combine)],
                    parallel=parallel_ok and work >= PAR_MIN_WORK)
        if combine is None and streamable(out, live, expr, off):
            inner = body[0]
            while inner.body and isinstance(inner.body[0], For):
                inner = inner.body[0]
            inner.stream = True
        self._add(LoopKernel(self._kname(tag), what, body, work, [out]), gen)

    def build(self) -> Program:
        plan = self.plan
        deferred: dict = {}
        for op in plan.ops:
            v = op.results[0]
            if v not in plan.materialized:
                continue
            if op.name == "rlx.constant":
                if is_splat_const(v):
                    self.map_kernel(f"fill {op.name}", shape_of(v.type), self.bufs[v],
                                    lambda g, idx, v=v: g.compute(v, idx), tag="fill")
                continue
            what = f"{op.name} -> {self.bufs[v]!r}"
            fam = getattr(op, "FAMILY", "")
            if op.name == "rlx.matmul":
                root = self._epilogue_root(v)
                if root is not None and root not in deferred:  # one matmul per epilogue
                    deferred[root] = (v, op)
                else:
                    self.matmul_kernel(v, op, self.bufs[v], what)
            elif v in deferred:
                c, cop = deferred.pop(v)
                if not self.matmul_kernel(c, cop, self.bufs[v], what + " (fused epilogue)",
                                          epilogue_root=v):
                    self.matmul_kernel(c, cop, self.bufs[c], f"{cop.name} -> {self.bufs[c]!r}")
                    self._map_value(v, what)
            elif fam == "reduce":
                self.reduce_kernel(v, op, what)
            elif op.name == "rlx.concat":
                self.concat_kernels(v, op, what)
            elif op.name == "rlx.scatter_add":
                self.scatter_kernels(v, op, what)
            elif op.name in ("rlx.attention", "rlx.attention_lse"):   # fused flash-style kernel
                from rlxc.lowering.cpu.attention_bwd import attention_pair_kernels

                attention_pair_kernels(self, v, op, what)   # (attention_kernel.py; O and L)
            elif op.name == "rlx.attention_bwd":   # fused backward (attention_bwd.py)
                from rlxc.lowering.cpu.attention_bwd import attention_bwd_kernels

                attention_bwd_kernels(self, v, op, what)
            elif fam in ELEMENTWISE_FAMILIES or op.name in (
                    "rlx.broadcast_to", "rlx.reshape", "rlx.transpose", "rlx.slice", "rlx.pad",
                    "rlx.gather", "rlx.fake_quant", "rlx.iota"):
                self._map_value(v, what)
            else:
                raise NotImplementedError(f"cpu backend: no lowering for {op.name}")
        for k, v in enumerate(plan.outputs):
            out = self.out_bufs[k]
            if self.bufs[v] is not out:
                self.map_kernel(f"output {k} <- {self.bufs[v]!r}", shape_of(v.type), out,
                                lambda g, idx, v=v: g.value(v, idx), tag="copy")
        return Program(self.name, self.args,
                       [(shape_of(v.type), dtype_of(v.type)) for v in plan.outputs],
                       self.buffers, self.kernels, self.errors,
                       sgemm_threads=self.sgemm_threads, error_args=self.error_args)

    def _map_value(self, v, what):
        self.map_kernel(what, shape_of(v.type), self.bufs[v],
                        lambda g, idx: g.compute(v, idx))

    # ------------------------------------------------------------ reductions
    def reduce_kernel(self, v, op, what):
        from rlxc.lowering.cpu.reduce import build_reduction

        build_reduction(self, v, op, what)

    # ------------------------------------------------------------ concat / scatter
    def concat_kernels(self, v, op, what):
        axis = op.params()["axis"]
        out_shape = shape_of(v.type)
        start = 0
        for j, o in enumerate(op.operands):
            s = shape_of(o.type)

            def off_fn(idx, start=start):
                idx = list(idx)
                idx[axis] = ix.add(idx[axis], start)
                return ix.linearize(idx, out_shape)
            self.map_kernel(f"{what} piece {j}", s, self.bufs[v],
                            lambda g, idx, o=o: g.value(o, idx), off_fn, tag="concat")
            start += s[axis]

    def scatter_kernels(self, v, op, what):
        ind, upd = op.operands
        p = op.params()
        axis, dim = p["axis"], p["dim"]
        out = self.bufs[v]
        out_shape = shape_of(v.type)
        dt = dtype_of(v.type)
        self.map_kernel(f"{what} zero", out_shape, out,
                        lambda g, idx: Const(False if dt == "i1" else 0, dt), tag="zero")
        from rlxc.lowering.cpu.strided_scatter import strided_scatter

        if strided_scatter(self, v, op, what):   # col2im: affine constant indices
            return
        si = shape_of(ind.type)
        n = len(si)
        ibuf = self.bufs[ind]

        def value(g, idx):
            g.checks.append((ibuf, dim, op.name, axis, p.get("label", "")))
            return g.value(upd, idx)

        def off_fn(idx):
            pos = ix.of(ix.LoadIdx(ibuf, ix.linearize(idx[axis:axis + n], si), dim))
            return ix.linearize(tuple(idx[:axis]) + (pos,) + tuple(idx[axis + n:]), out_shape)
        self.map_kernel(f"{what} accumulate", shape_of(upd.type), out, value, off_fn,
                        combine="add", parallel_ok=False, tag="scatter")

    # ------------------------------------------------------------ matmul (matmul_schedule.py)
    def _epilogue_root(self, c):
        from rlxc.lowering.cpu.matmul_schedule import epilogue_root

        return epilogue_root(self, c)

    def matmul_kernel(self, c, op, out, what, epilogue_root=None) -> bool:
        from rlxc.lowering.cpu.matmul_schedule import matmul_kernel

        return matmul_kernel(self, c, op, out, what, epilogue_root)


def build_program(module, name: str, sgemm_threads: int = 1, cpu: str = "native",
                  symbol_sizes: frozenset = frozenset()) -> Program:
    from rlxc.dialect.attention import expand_module
    from rlxc.lowering.cpu.matvec import rewrite_small_matmuls
    from rlxc.lowering.shared.empty import rewrite_empty

    from rlxc.dialect.conv_decompose import decompose_conv

    module = decompose_conv(module)   # convolutions -> im2col + GEMM (dialect/conv_decompose.py)
    from rlxc.lowering.cpu.attention_kernel import covers

    # rlx.attention: the fused kernel where it covers the op, else query-blocked
    # matmul-softmax-matmul
    module = expand_module(module, keep=covers)
    return Builder(rewrite_small_matmuls(rewrite_empty(module)), name, sgemm_threads, cpu,
                   symbol_sizes).build()


__all__ = ["build_program", "Builder", "collapse", "nest", "identity", "cost", "map_expr"]


def _const_in_range(ibuf, bound) -> bool:
    """True when `ibuf` is a constant whose indices all lie in [0, bound): checked once here,
    at compile time, instead of by a check kernel on every call (im2col / col2im indices)."""
    if ibuf.kind != "const" or ibuf.data is None:
        return False
    import numpy as np

    dt = {"i32": np.int32, "i64": np.int64, "u32": np.uint32}.get(ibuf.dtype)
    if dt is None:
        return False
    a = np.frombuffer(ibuf.data, dt)
    return a.size == ibuf.numel and (a.size == 0 or (int(a.min()) >= 0 and int(a.max()) < bound))

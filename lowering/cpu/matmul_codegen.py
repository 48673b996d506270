"""Matmul kernels in LLVM IR: batch loops around a call of the shared sgemm.

    loops.MatmulKernel(batch vars, M, N, K, A, B, out, scratch, epilogue)
          │ matmul_kernel: NAME.kN(A*, B*, C*, ws*, epilogue buffers*...) noalias
          ▼
    for b in batch:
        no epilogue:  rlxc_sgemm_plain_TAG(M, N, K, A + a(b), rsa, csa, B + b(b), rsb, csb,
                                           C + b*M*N, N, 0, ws, ws_floats)
        epilogue:     ctx[s] = base_s + off_s(b) for every epilogue slot s
                      rlxc_sgemm_cb_TAG(..., NAME.kN.epi, ctx)
        bias(+relu):  rlxc_sgemm_cb_TAG(..., (i8*)BUILTIN_BIAS[_RELU], ctx)   (inlined
                      in the sgemm, no call: builtin_epilogue)
    NAME.kN.epi(ctx, row, col, float* c, ldc, rows, n):   the rows x n block at c (row
        stride ldc) = epilogue(c, loads at (row + r, col + j)), in place: once per register
        tile of the packed path, once per row-vector (rows = 1) in the other kernels
    prologue (operand_prologue.py): NAME.kN.pro(bufs..., b) before each element's sgemm
        writes that element's slice of an operand (noalias, its own function)
    par_batch > 1 (matmul_schedule.batch_team: per-element GEMMs too small for a team):
        openmp.emit_parallel_ranges over the flattened batch, elements claimed one at a
        time; thread t: its own epilogue ctx, scratch slice ws + t*(ws_floats/par_batch)
        and prologue slice, one thread per sgemm

The sgemm itself is not emitted here: it is declared and comes from the shared
object of sgemm_object.py, linked in by cpu.py.  The epilogue is emitted once, as
vector code on <VL x float> (VL = the sgemm's vector width): EpiValue is the
vector of C values, a load with column coefficient 1 is a vector load at
ptr + row*rc + col (masked, lanes < n, at a row's partial end), one with coefficient 0
a scalar load splatted.
Each distinct (buffer, batch/constant offset) of the epilogue is one slot of
the ctx array, filled at the call site for the current batch element.
"""
from __future__ import annotations

import llvmlite.ir as ir

from rlxc.lowering.cpu import indexing as ix
from rlxc.lowering.cpu import sgemm_object as sgemmlib
from rlxc.lowering.shared.scalar import F32, I8, I32, I64, const, emit_op, vtype
from rlxc.lowering.cpu.loops import (Const, EpiValue, For, Load, MatmulKernel, Op, Store,
                                     stmt_buffers, walk, walk_expr)

F32P = F32.as_pointer()
I8P = I8.as_pointer()


def c64(v: int):
    from rlxc.lowering.cpu.codegen import c64 as c

    return c(v)


def _declare(module, name, fnty):
    fn = module.globals.get(name)
    if fn is None:
        fn = ir.Function(module, fnty, name)
    return fn


def matmul_kernel(g, k: MatmulKernel):
    """The kernel function of a MatmulKernel; returns (function, buffers it takes)."""
    from rlxc.lowering.cpu.codegen import VOID, Body, ptr_type
    from rlxc.lowering.cpu.sgemm_kernels import sgemm_signature

    slots = epilogue_slots(k)
    bufs = [k.a.buf, k.b.buf, k.out, k.scratch]
    pro = [x for st in walk(k.prologue) for x in stmt_buffers(st)]
    argbufs = []
    for x in bufs + [s[0] for s in slots] + pro:
        if all(x is not y for y in argbufs):
            argbufs.append(x)
    fn = g._fn(k.name, VOID, [ptr_type(x.dtype) for x in argbufs])
    ptrs = {id(x): a for x, a in zip(argbufs, fn.args)}
    plain, cb = sgemmlib.symbols(g.cpu)
    g.uses_sgemm = True
    if k.epilogue is None:
        sg = _declare(g.m, plain, sgemm_signature())
        epi = None
    else:
        sg = _declare(g.m, cb, sgemm_signature([I8P, I8P]))
        code = builtin_epilogue(k)
        epi = _epilogue_fn(g, k, slots) if code is None else \
            ir.Constant(I64, code).inttoptr(I8P)
    body = _body(g, fn, ptrs)
    pro = _prologue_fn(g, k) if k.prologue else None
    b = ir.IRBuilder(fn.entry_basic_block)
    live = [v for v in k.batch if v.extent != 1]
    if k.par_batch > 1 and live:
        _batch_team(g, k, b, fn, argbufs, live, sg, epi, slots, pro)
    else:
        ctx = b.alloca(ir.ArrayType(F32P, max(1, len(slots))), name="epi.ctx")
        _nest(b, body, live, {v: c64(0) for v in k.batch},
              lambda bb, vars_: _call(bb, k, sg, epi, slots, ptrs, body, ctx,
                                      ptrs[id(k.scratch)], c64(k.scratch.numel), vars_, pro))
    b.ret_void()
    return fn, argbufs


def _body(g, fn, ptrs):
    from rlxc.lowering.cpu import vsum
    from rlxc.lowering.cpu.codegen import Body

    body = Body(fn, ptrs, sgemmlib.vector_width(g.cpu))
    body.lut = vsum.lut_for(g.cpu)
    return body


def _slice_bufs(k: MatmulKernel) -> list:
    """The per-thread slice buffers k's prologue writes (operand_prologue.py)."""
    out = []
    for st in walk(k.prologue):
        if isinstance(st, Store) and all(st.buf is not x for x in out):
            out.append(st.buf)
    return out


def _prologue_fn(g, k: MatmulKernel):
    """NAME.kN.pro(buffers..., batch indices...): k's prologue for one batch element, its
    own function so that its pointers are noalias (its copy loops vectorize; inside the
    batch team's outlined worker they would not)."""
    from rlxc.lowering.cpu.codegen import VOID, ptr_type

    bufs = []
    for x in (x for st in walk(k.prologue) for x in stmt_buffers(st)):
        if all(x is not y for y in bufs):
            bufs.append(x)
    fn = g._fn(f"{k.name}.pro", VOID, [ptr_type(x.dtype) for x in bufs] + [I64] * len(k.batch))
    body = _body(g, fn, {id(x): a for x, a in zip(bufs, fn.args)})
    b = ir.IRBuilder(fn.entry_basic_block)
    body.stmts(b, k.prologue, dict(zip(k.batch, fn.args[len(bufs):])))
    b.ret_void()
    return fn, bufs


def _call(bb, k, sg, epi, slots, ptrs, body, ctx, ws, ws_floats, vars_, pro=None):
    """One sgemm call: batch element `vars_` of k (scratch ws of ws_floats floats),
    after k's prologue `pro` (the element's slice of an operand, operand_prologue.py)."""
    if pro is not None:
        fn, bufs = pro
        bb.call(fn, [ptrs[id(x)] for x in bufs] + [vars_[v] for v in k.batch])

    def at(buf, off):
        return bb.gep(ptrs[id(buf)], [body.index(bb, off, vars_)], inbounds=True)
    coff = ix.scale(ix.linearize(k.batch, [v.extent for v in k.batch]), k.m * k.n)
    args = [c64(k.m), c64(k.n), c64(k.k), at(k.a.buf, k.a.off), c64(k.a.rs),
            c64(k.a.cs), at(k.b.buf, k.b.off), c64(k.b.rs), c64(k.b.cs),
            at(k.out, coff), c64(k.n), ir.Constant(I32, 0), ws, ws_floats]
    if epi is not None:
        for n, (buf, base) in enumerate(slots):
            bb.store(at(buf, base), bb.gep(ctx, [ir.Constant(I32, 0), ir.Constant(I32, n)],
                                           inbounds=True))
        args += [epi if epi.type == I8P else bb.bitcast(epi, I8P), bb.bitcast(ctx, I8P)]
    bb.call(sg, args)


def _nest(bb, body, vs, vars_, fn):
    if not vs:
        fn(bb, vars_)
        return
    body.loop(bb, For(vs[0], ix.ZERO, ix.const(vs[0].extent), []), vars_,
              body_fn=lambda b2, v2: _nest(b2, body, vs[1:], v2, fn))


def _batch_team(g, k, b, fn, argbufs, live, sg, epi, slots, pro=None):
    """The batch loop split over OpenMP threads (k.par_batch > 1): the threads claim the
    flattened batch's elements one at a time (a shared counter; on a shared VM a static
    half per thread waits for the slower vCPU at the join), one single-thread sgemm per
    element, in scratch slice t (and prologue slice t) of thread t."""
    from rlxc.lowering.cpu.codegen import Body
    from rlxc.lowering.cpu.matmul_schedule import BATCH_PAR_MIN
    from rlxc.lowering.cpu import openmp as parallel

    nb = 1
    for v in live:
        nb *= v.extent
    per = k.scratch.numel // k.par_batch

    def team_body(wb, lo, hi, tid, nt, args):
        if g.dims:   # sizes in the outlined worker: its copies of fn's trailing size args
            from rlxc.lowering.cpu import symint
            saved = symint.save()
            symint.enter(wb.function, dict(zip(g.dims, args[len(args) - len(g.dims):])),
                         len(wb.function.entry_basic_block.instructions))
        wptrs = {id(x): a for x, a in zip(argbufs, args)}
        for sb in _slice_bufs(k):   # the thread's own slice of the prologue's buffer
            wptrs[id(sb)] = wb.gep(wptrs[id(sb)], [wb.mul(wb.sext(tid, I64),
                                                          c64(k.slice_floats))], inbounds=True)
        wbody = _body(g, wb.function, wptrs)
        ctx = parallel.entry_alloca(wb, ir.ArrayType(F32P, max(1, len(slots))), name="epi.ctx")
        ws = wb.gep(wptrs[id(k.scratch)], [wb.mul(wb.sext(tid, I64), c64(per))], inbounds=True)
        flat = ix.Var("bflat", nb)

        def one(bb, vars_):
            rest, at = vars_[flat], {v: c64(0) for v in k.batch}
            for v in reversed(live):
                at[v] = bb.urem(rest, c64(v.extent))
                rest = bb.udiv(rest, c64(v.extent))
            _call(bb, k, sg, epi, slots, wptrs, wbody, ctx, ws, c64(per), at, pro)
        wbody.loop(wb, For(flat, ix.ZERO, ix.const(nb), []), {}, lohi=(lo, hi), body_fn=one)
        if g.dims:
            symint.restore(saved)   # flushes the worker's size computations

    parallel.emit_parallel_ranges(g.m, b, c64(nb), team_body, list(fn.args),
                                  name=f"{fn.name}.team", work=c64(k.work),
                                  min_work=BATCH_PAR_MIN, max_threads=c64(k.par_batch),
                                  dynamic=1)


# epilogue ops that cost an instruction or two: an epilogue of only these runs its
# rows' vectors in a loop (one copy of its code); any other op (gelu, tanh, exp, ...)
# gets a row's NR/VL vectors side by side
CHEAP_EPI_OPS = frozenset({"add", "sub", "mul", "neg", "relu", "max", "min", "maximum",
                           "minimum", "select", "abs", "and", "or", "cast", "convert"})


def _epilogue_fn(g, k: MatmulKernel, slots):
    """void NAME.kN.epi(i8* ctx, i64 row, i64 col, float* c, i64 ldc, i64 rows, i64 n):
    the rows x n block at c (row stride ldc; its (0, 0) is C's (row, col)) = epilogue,
    in place (sgemm_object's callback ABI).  The block's vectors go one by one in a loop,
    a row's last one masked when partial; but when the epilogue has a costly op (not
    CHEAP_EPI_OPS) a block NR wide (an sgemm register tile) runs each row's NR/VL vectors
    side by side: independent chains, where a gelu or tanh is latency-bound one vector at
    a time (W10's fc1 + gelu, 2048x1024x256: 11.7% slower one by one on x86-64-v3).
    Compile time is what shapes the rest (a 20-layer residual MLP's value_and_grad has
    dozens of epilogues): `optsize` (no unrolling or interleaving of these short loops,
    same speed) and one loop for a cheap epilogue, not one per case (in-process compile
    of that model: 0.30 s with every epilogue unrolled, 0.25 s so; 0.22 s with the
    per-vector callback before the tile form)."""
    from rlxc.lowering.cpu.sgemm_kernels import (counted_loop, lane_mask, masked_load,
                                                  masked_store, sgemm_config, splat)

    lanes = sgemmlib.vector_width(g.cpu)
    nr = sgemm_config(g.cpu).nr
    fn = ir.Function(g.m, sgemmlib.EPI_FN, f"{g.sym}.{k.name}.epi")
    fn.linkage = "internal"
    fn.attributes.add("nounwind")
    fn.attributes.add("optsize")
    ctx, row0, col0, c, ldc, rows, n = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    table = b.bitcast(ctx, F32P.as_pointer())
    bases = [b.load(b.gep(table, [ir.Constant(I32, s)], inbounds=True))
             for s in range(len(slots))]
    slot_of = {(id(buf), base): s for s, (buf, base) in enumerate(slots)}

    def apply(b, p, row, col, mask):
        """c[p .. p + VL) (lanes in mask) = epilogue at (row, col)."""
        vec = masked_load(b, p, lanes, mask)
        memo: dict = {}

        def ev(e):
            r = memo.get(id(e))
            if r is not None:
                return r
            if isinstance(e, EpiValue):
                r = vec
            elif isinstance(e, Const):
                r = const(vtype(e.dtype, lanes), e.value)
            elif isinstance(e, Load):
                co = e.off.coeffs()
                base = ix.subst(e.off, {k.row: ix.ZERO, k.col: ix.ZERO})
                rc, cc = co.get(k.row, 0), co.get(k.col, 0)
                off = b.mul(row, c64(rc)) if rc else c64(0)
                if cc:
                    off = b.add(off, col)
                q = b.gep(bases[slot_of[(id(e.buf), base)]], [off], inbounds=True)
                if cc == 1:
                    if rc:
                        _prefetch_next_tile(b, q, rc, g.cpu)
                    r = masked_load(b, q, lanes, mask)
                else:
                    r = splat(b, b.load(q), lanes)
            elif isinstance(e, Op):
                r = emit_op(b, e, [ev(a) for a in e.args])
            else:
                raise TypeError(e)
            memo[id(e)] = r
            return r
        masked_store(b, ev(k.epilogue), p, mask)

    def full_row(b, r):
        crow, row = b.gep(c, [b.mul(r, ldc)], inbounds=True), b.add(row0, r)
        for v in range(nr // lanes):
            apply(b, b.gep(crow, [c64(v * lanes)], inbounds=True), row,
                  b.add(col0, c64(v * lanes)), None)

    def flat(b):
        """Every vector of the block, row by row, in one loop (one loop, not two: each
        costs compile time); a row's last vector masked when partial (AVX2's masked
        stores on every vector cost W4's train step 15%)."""
        nvec = b.sdiv(b.add(n, c64(lanes - 1)), c64(lanes))

        def one(b, t):
            r, j = b.udiv(t, nvec), b.urem(t, nvec)
            c0 = b.mul(j, c64(lanes))
            p, row, col = (b.gep(c, [b.add(b.mul(r, ldc), c0)], inbounds=True),
                           b.add(row0, r), b.add(col0, c0))
            left = b.sub(n, c0)
            with b.if_else(b.icmp_signed(">=", left, c64(lanes)), likely=True) as (tf, tp):
                with tf:
                    apply(b, p, row, col, None)
                with tp:
                    apply(b, p, row, col, lane_mask(b, 0, left, lanes))
        counted_loop(b, c64(0), b.mul(rows, nvec), 1, one, "flat")

    cheap = all(not isinstance(e, Op) or e.op in CHEAP_EPI_OPS for e in walk_expr(k.epilogue))
    if cheap:
        flat(b)
    else:
        with b.if_else(b.icmp_signed("==", n, c64(nr)), likely=True) as (t, o):
            with t:
                counted_loop(b, c64(0), rows, 1, full_row, "full")
            with o:
                flat(b)
    b.ret_void()
    return fn


def _prefetch_next_tile(b, p, rc: int, cpu: str) -> None:
    """Prefetch the epilogue load at `p` (row stride `rc`) for the sgemm's next register
    tile, MR rows further down: the sgemm walks a column panel's tiles down its rows
    (sgemm_kernels._emit_seq), so that load comes one tile's K loop (hundreds of cycles)
    later.  Without it each call waits on its own cache miss: the SGD update fused into
    dW's GEMM (W - lr * dW, W 1.6 MB) cost 13% of W4's train step at ~35 ns a vector.
    A prefetch never faults, so the rows past the last tile need no guard."""
    from rlxc.lowering.cpu.sgemm_kernels import prefetch, sgemm_config

    mr = sgemm_config(cpu).mr
    prefetch(b, b.gep(p, [c64(mr * rc)]), 0, 3)


def builtin_epilogue(k: MatmulKernel) -> int | None:
    """The sgemm's built-in epilogue code for k's epilogue, or None (then it is called):
    C + bias -> BUILTIN_BIAS, relu(C + bias) -> BUILTIN_BIAS_RELU, where bias is an f32
    load at C's column (column coefficient 1, row coefficient 0; batch terms allowed).
    Its one slot (epilogue_slots) is the bias row, which the call site puts in ctx[0]."""
    e, code = k.epilogue, sgemmlib.BUILTIN_BIAS
    if isinstance(e, Op) and e.op == "relu" and len(e.args) == 1 and e.dtype == "f32":
        e, code = e.args[0], sgemmlib.BUILTIN_BIAS_RELU
    if not (isinstance(e, Op) and e.op == "add" and e.dtype == "f32" and len(e.args) == 2
            and not e.params):
        return None
    x, y = e.args
    if isinstance(y, EpiValue):
        x, y = y, x
    if not (isinstance(x, EpiValue) and isinstance(y, Load) and y.buf.dtype == "f32"):
        return None
    co = y.off.coeffs()
    if co.get(k.row, 0) != 0 or co.get(k.col, 0) != 1:
        return None
    return code


def epilogue_slots(k: MatmulKernel) -> list:
    """(buffer, base offset) of every distinct epilogue load, in first-use order."""
    if k.epilogue is None:
        return []
    out, seen, order = [], set(), []

    def dfs(e):
        if isinstance(e, Op):
            for a in e.args:
                dfs(a)
        elif isinstance(e, Load):
            order.append(e)
    dfs(k.epilogue)
    for e in order:
        base = ix.subst(e.off, {k.row: ix.ZERO, k.col: ix.ZERO})
        if (id(e.buf), base) not in seen:
            seen.add((id(e.buf), base))
            out.append((e.buf, base))
    return out


# what matmul_chain.py shares, under public names
declare, epilogue_fn = _declare, _epilogue_fn

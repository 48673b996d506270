"""Matmul schedules: strided sgemm operands and fused elementwise epilogues.

    rlx.matmul(A, B)  (+ its single elementwise consumer R, e.g. relu(C + bias))
          │ operand(): the view chain of each operand, as an affine offset of a buffer
          │            -> (buffer, batch offset, row stride, column stride)
          │ _epilogue(): R's expression with C's loads replaced by EpiValue, if every
          │            other leaf is an f32 load whose column coefficient is 0 or 1
          ▼
    loops.MatmulKernel(batch vars, M, N, K, A, B, out = R's buffer or C's, epilogue)

Epilogue rule.  A matmul result C that is not an output and is read only by
one materialized elementwise value R at R's own index (plan paths == {(R, ())})
is not stored: sgemm applies R's expression to each finished row-vector of C
(bias rows: column coefficient 1, per-row values: coefficient 0, so they become
masked vector loads or broadcasts) and writes R directly.  When the expression
does not qualify (a gather, a transposed read, a pow/cast), C is materialized
and R is one fused elementwise pass over it.  One matmul per epilogue root.

Batch team.  A batched product that is not folded and whose GEMMs each run on one
thread (below SGEMM_PAR_MIN) splits its batch loop over the threads instead
(par_batch, one scratch slice per thread; matmul_codegen.py).

Batch fold.  A batched product whose B is one matrix for every batch element and
whose A rows follow each other batch-major (a (B, T, K) activation times a (K, N)
weight) is one GEMM of B*T rows instead of B small ones (C is batch-major already).
"""
from __future__ import annotations

from rlxc.dialect.types import dtype_of, numel, shape_of

from rlxc.lowering.cpu import indexing as ix
from rlxc.lowering.cpu.fusion import Gen, is_splat_const, unsupported_dtype
from rlxc.lowering.cpu.loops import Buffer, Const, EpiValue, Load, MatmulKernel, MatOperand, Op
from rlxc.lowering.cpu.tuning import SGEMM_PAR_MIN


def _idx(vars_):
    return tuple(ix.var(v) if v.extent != 1 else ix.ZERO for v in vars_)


def epilogue_root(bl, c):
    """The value whose epilogue matmul result `c` can become (see the header), or None."""
    plan = bl.plan
    if c in plan.outputs:
        return None
    paths = plan.paths.get(c, set())
    if len(paths) != 1:
        return None
    root, path = next(iter(paths))
    if root == "return" or path != () or root not in plan.materialized:
        return None
    op = root.owner
    if getattr(op, "FAMILY", "") not in ("unary", "binary", "select") or \
            shape_of(root.type) != shape_of(c.type) or dtype_of(root.type) != "f32":
        return None
    return root


def matmul_kernel(bl, c, op, out, what, epilogue_root=None) -> bool:
    """Append the MatmulKernel of `c` writing `out`; False if the epilogue does not qualify."""
    from rlxc.lowering.cpu.sgemm_kernels import sgemm_workspace_floats

    a, b = op.operands
    for x in (a, b):
        if dtype_of(x.type) != "f32":
            raise unsupported_dtype("rlx.matmul", dtype_of(x.type))
    cs = shape_of(c.type)
    batch, (M, N) = cs[:-2], cs[-2:]
    K = shape_of(a.type)[-1]
    bvars = [ix.Var(f"b{d}", n) for d, n in enumerate(batch)]
    bidx = _idx(bvars)
    iv, jv, kv = ix.Var("i", M), ix.Var("j", N), ix.Var("k", K)
    gen = Gen(bl.plan, bl.bufs)

    def operand(x, rv, cv):
        xs = shape_of(x.type)
        xb = xs[:-2]
        lead = len(batch) - len(xb)
        idx = tuple(ix.ZERO if xb[d] == 1 else bidx[lead + d] for d in range(len(xb))) + \
            (ix.var(rv) if xs[-2] != 1 else ix.ZERO, ix.var(cv) if xs[-1] != 1 else ix.ZERO)
        if x in bl.bufs and is_splat_const(x):
            # a splat operand is materialized by a fill kernel: read its buffer, since
            # Gen would otherwise inline it as a constant
            e = Load(bl.bufs[x], ix.linearize(idx, xs))
        else:
            e = gen.value(x, idx)
        if not (isinstance(e, Load) and ix.is_plain(e.off)):
            raise AssertionError(f"internal: matmul operand is not a strided view: {e}")
        co = e.off.coeffs()
        return MatOperand(e.buf, ix.subst(e.off, {rv: ix.ZERO, cv: ix.ZERO}),
                          co.get(rv, 0), co.get(cv, 0))

    epi = None
    if epilogue_root is not None:
        epi = _epilogue(bl, c, epilogue_root, bidx, iv, jv)
        if epi is None:
            return False
    if numel(cs) == 0:
        return True
    opa, opb = operand(a, iv, kv), operand(b, kv, jv)
    folded = _fold_batch(bvars, iv, M, opa, opb, epi)
    if folded is not None:   # (B.., M, K) @ (K, N): one GEMM of B*M rows
        bvars, iv, opa, epi = folded
        M = iv.extent
    # the workspace caps sgemm's team: small products get one thread's worth
    threads = bl.sgemm_threads if M * N * max(K, 1) >= SGEMM_PAR_MIN else 1
    team = batch_team(bl.sgemm_threads, bvars, M, N, K) if threads == 1 else 1
    ws = sgemm_workspace_floats(M, N, K, threads, cpu=bl.cpu)
    scratch = bl._buf(f"ws{len(bl.buffers)}", "temp", "f32",
                      ws if team == 1 else team * _aligned(ws))
    k = MatmulKernel(bl._kname("matmul"), what, [v for v in bvars], M, N, K,
                     opa, opb, out, scratch, epi, iv, jv,
                     work=numel(cs) * max(K, 1), par_batch=team)
    bl._add(k, gen)
    return True


BATCH_PAR_MIN = 1 << 17   # multiply-adds of a whole batched product below which its
#                           one-thread GEMMs stay on the calling thread (a fork costs ~5 us)


def _aligned(floats: int) -> int:
    return -(-floats // 16) * 16   # per-thread scratch slices start 64-byte aligned


def batch_team(threads: int, bvars, M, N, K) -> int:
    """Threads for the batch loop of a product whose GEMMs are each too small for a team of
    their own (a conv's per-image GEMMs, attention's per-head ones): the batch elements are
    independent (disjoint C), so they split over the threads, one sgemm per element."""
    live = 1
    for v in bvars:
        live *= v.extent if isinstance(v.extent, int) else 0
    if threads <= 1 or live < 2 or not all(isinstance(d, int) for d in (M, N, K)) or \
            live * M * N * max(K, 1) < BATCH_PAR_MIN:
        return 1
    return min(threads, live)


def _fold_batch(bvars, iv, M, opa, opb, epi):
    """A batched matmul whose B is the same matrix for every batch element and whose A rows
    follow each other batch-major at stride rs (a (B, T, K) activation times a (K, N)
    weight) is ONE GEMM of B*T rows: C is batch-major with ldc = N already, so row
    i' = b*T + i of the folded product is C's row (b, i).  Epilogue loads must index rows
    the same way (or not depend on the row).  Returns (bvars, iv, A, epilogue) or None."""
    live = [v for v in bvars if v.extent != 1]
    if not live:
        return None
    stride, strides = M, {}
    for v in reversed(live):
        strides[v] = stride
        stride *= v.extent
    rows = ix.Var("i", stride)
    bco, aco = opb.off.coeffs(), opa.off.coeffs()
    if any(bco.get(v, 0) for v in live) or any(aco.get(v, 0) != opa.rs * strides[v] for v in live):
        return None
    zero = {v: ix.ZERO for v in live}
    new_epi = None
    if epi is not None:   # the epilogue's reads must follow the folded rows too
        from rlxc.lowering.cpu.loops import walk_expr
        from rlxc.lowering.cpu.schedule import map_expr

        for e in walk_expr(epi):
            if isinstance(e, Load):
                co = e.off.coeffs()
                if any(co.get(v, 0) != co.get(iv, 0) * strides[v] for v in live):
                    return None
        new_epi = map_expr(epi, {**zero, iv: ix.var(rows)})
    a = MatOperand(opa.buf, ix.subst(opa.off, zero), opa.rs, opa.cs)
    return [], rows, a, new_epi


def _epilogue(bl, c, root, bidx, iv, jv):
    probe = Buffer("mm", "temp", "f32", numel(shape_of(c.type)))
    bufs = dict(bl.bufs)
    bufs[c] = probe
    g = Gen(bl.plan, bufs)
    full = tuple(bidx) + (ix.var(iv) if iv.extent != 1 else ix.ZERO,
                          ix.var(jv) if jv.extent != 1 else ix.ZERO)
    expr = g.compute(root, full)
    ident = ix.linearize(full, shape_of(c.type))
    if g.checks:
        return None
    memo: dict = {}

    def conv(e):
        r = memo.get(id(e))
        if r is not None:
            return r
        if isinstance(e, Load):
            if e.buf is probe:
                if e.off != ident:
                    raise ValueError
                r = EpiValue()
            else:
                co = e.off.coeffs()
                if e.buf.dtype != "f32" or not ix.is_plain(e.off) or co.get(jv, 0) not in (0, 1):
                    raise ValueError
                r = e
        elif isinstance(e, Op):
            if e.dtype not in ("f32", "i1") or e.op in ("pow", "cast"):
                raise ValueError
            r = Op(e.op, tuple(conv(x) for x in e.args), e.dtype, e.params)
        elif isinstance(e, Const) and e.dtype in ("f32", "i1"):
            r = e
        else:
            raise ValueError
        memo[id(e)] = r
        return r
    try:
        return conv(expr)
    except ValueError:
        return None

"""The C entry of a batch-separable dynamic program: one OpenMP region over row chunks.

    i32 rlx_NAME(ins, outs, params, ws, dims)                    (exported; dynentry.py ABI)
        N = dims[n]; t = min(team limit, TCAP, N / MIN_ROWS)
        if split off, t < 2 or work(N) < min_work:  return NAME.body(ins, outs, params, ws, dims)
        NAME.pin_team()
        GOMP_parallel: thread tid of nt, rows [lo, hi) = [N tid / nt, N (tid + 1) / nt):
            dims'  = dims with N := hi - lo
            ins'   = split inputs + lo * row bytes (shared inputs as given); outs' likewise
            ws'    = ws + tid * round64(NAME.ws_body(dims with N := ceil(N / nt)))
            rc     = NAME.body(ins', outs', params, ws', dims')   (first nonzero rc wins)
    void rlx_NAME_set_batch_split(i64 min_work)   < 0: never split; else the work threshold
    i32  rlx_NAME_last_split(void)                team of the calling thread's last call (0: unsplit)

NAME.body is the size-generic program (codegen.py through dynentry.entry_head); its
own parallel loops run inline inside the region: openmp.emit_team_limit is 1 inside
an active OpenMP region, so no nested team and no oversubscription.  The workspace
the caller passes is sized by batchsplit.split_ends (TCAP slices at the largest
chunk), which the exported workspace-size function and the metadata include.

Cost rule: split when the team (rlxc_num_threads or omp_get_max_threads(), capped by
TCAP, the thread count the library was compiled for) has >= 2 threads, every thread
gets >= MIN_ROWS rows, and the program's estimated work at N (the kernels' work
estimates, the units of tuning.PAR_MIN_WORK) reaches the threshold (default
PAR_MIN_WORK: a call too small for one fork stays on the calling thread).
"""
from __future__ import annotations

import llvmlite.ir as ir

from rlxc.lowering.cpu import openmp, symint
from rlxc.lowering.cpu.loops import DTYPE_BYTES
from rlxc.lowering.shared.scalar import I8, I32, I64

I8P = I8.as_pointer()
I8PP = I8P.as_pointer()
I64P = I64.as_pointer()
VOID = ir.VoidType()
MIN_ROWS = 2          # rows per thread at least


def _c(v: int):
    return ir.Constant(I64, v)


def _smin(b, x, y):
    return b.select(b.icmp_signed("<", x, y), x, y)


def _ws_body(m, sym: str, dims: list, ends: list) -> ir.Function:
    """i64 NAME.ws_body(i64* dims): the body's own workspace bytes (max of its ends)."""
    fn = ir.Function(m, ir.FunctionType(I64, [I64P]), f"{sym}.ws_body")
    fn.linkage = "internal"
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    loads = [b.load(b.gep(fn.args[0], [_c(j)], inbounds=True)) for j in range(len(dims))]
    symint.enter(fn, dict(zip(dims, loads)), 2 * len(loads))
    best = None
    for e in ends:
        v = symint.value(e) if isinstance(e, symint.SymInt) else _c(int(e))
        best = v if best is None else b.select(b.icmp_signed(">", v, best), v, best)
    b.ret(best)
    symint.flush()
    return fn


def _row_bytes(b, row, dtype: str, env: dict):
    """Bytes of one row (shape `row`, ints and symbols) from the sizes in `env`."""
    v = _c(DTYPE_BYTES[dtype])
    for d in row:
        v = b.mul(v, env[d] if isinstance(d, str) else _c(int(d)))
    return v


def _controls(m, sym: str, min_work: int):
    mw = ir.GlobalVariable(m, I64, f"{sym}.split_min_work")
    mw.linkage = "internal"
    mw.initializer = _c(min_work)
    last = ir.GlobalVariable(m, I32, f"{sym}.last_split")
    last.linkage = "internal"
    last.storage_class = "thread_local"
    last.initializer = ir.Constant(I32, 0)
    setter = ir.Function(m, ir.FunctionType(VOID, [I64]), f"{sym}_set_batch_split")
    b = ir.IRBuilder(setter.append_basic_block("entry"))
    b.store(setter.args[0], mw)
    b.ret_void()
    getter = ir.Function(m, ir.FunctionType(I32, []), f"{sym}_last_split")
    b = ir.IRBuilder(getter.append_basic_block("entry"))
    b.ret(b.load(last))
    return mw, last


def emit_split_entry(m: ir.Module, p, tcap: int, min_work: int, fallback=None) -> None:
    """Define the exported entry `rlx_NAME` of program `p` (p.batch_split a Decision with a
    symbol) around `rlx_NAME.body`, which codegen already emitted into `m`.

    `fallback`: the function an unsplit call runs instead of the body
    (batchsplit_static.py: the plain static program, ABI (ins, outs, params, ws))."""
    from rlxc.lowering.cpu.pinning import emit_pin_team

    sym = f"rlx_{p.name}"
    d = p.batch_split
    body = m.get_global(f"{sym}.body")
    wsb = _ws_body(m, sym, p.dims, p.body_workspace_ends)
    mw, last = _controls(m, sym, min_work)
    pin = m.globals.get(f"{sym}.pin_team") or emit_pin_team(m, sym)
    in_args = [a for a in p.args if a.kind == "input"]
    nd, jn = len(p.dims), p.dims.index(d.symbol)

    entry = ir.Function(m, ir.FunctionType(I32, [I8PP, I8PP, I8PP, I8P, I64P]), sym)
    entry.attributes.add("nounwind")
    ins, outs, pars, ws, dims = entry.args
    b = ir.IRBuilder(entry.append_basic_block("entry"))
    loads = [b.load(b.gep(dims, [_c(j)], inbounds=True)) for j in range(nd)]
    symint.enter(entry, dict(zip(p.dims, loads)), 2 * nd)
    n = loads[jn]
    work = _c(0)
    for k in p.kernels:
        w = getattr(k, "work", 0)
        work = b.add(work, symint.value(w) if isinstance(w, symint.SymInt) else _c(int(w)))
    team = _smin(b, _smin(b, openmp.emit_team_limit(m, b), _c(tcap)),
                 b.sdiv(n, _c(MIN_ROWS)))
    thr = b.load(mw)
    go = b.and_(b.icmp_signed(">=", team, _c(2)),
                b.and_(b.icmp_signed(">=", thr, _c(0)), b.icmp_signed(">=", work, thr)))
    with b.if_then(b.not_(go), likely=False):
        b.store(ir.Constant(I32, 0), last)
        b.ret(b.call(fallback, [ins, outs, pars, ws]) if fallback is not None else
              b.call(body, [ins, outs, pars, ws, dims]))
    b.call(pin, [])
    rc_slot = b.alloca(I32, name="rc")
    b.store(ir.Constant(I32, 0), rc_slot)

    def chunk(wb, lo, hi, tid, nt, args):
        ins_, outs_, pars_, ws_, dims_, rc_ = args
        rows = wb.sub(hi, lo)
        nt64 = wb.sext(nt, I64)
        full = [wb.load(wb.gep(dims_, [_c(j)], inbounds=True)) for j in range(nd)]
        nn = full[jn]
        env = dict(zip(p.dims, full))
        mine = wb.alloca(ir.ArrayType(I64, max(nd, 1)), name="dims.mine")
        most = wb.alloca(ir.ArrayType(I64, max(nd, 1)), name="dims.most")
        cmax = wb.sdiv(wb.add(nn, wb.sub(nt64, _c(1))), nt64)
        for j in range(nd):
            idx = [ir.Constant(I32, 0), ir.Constant(I32, j)]
            wb.store(rows if j == jn else full[j], wb.gep(mine, idx, inbounds=True))
            wb.store(cmax if j == jn else full[j], wb.gep(most, idx, inbounds=True))
        stride = wb.call(wsb, [wb.bitcast(most, I64P)])
        stride = wb.and_(wb.add(stride, _c(63)), _c(-64))
        myws = wb.gep(ws_, [wb.mul(wb.sext(tid, I64), stride)], inbounds=True)

        def offset(arr, count, rowspecs, name):
            out = wb.alloca(ir.ArrayType(I8P, max(count, 1)), name=name)
            for i in range(count):
                ptr = wb.load(wb.gep(arr, [_c(i)], inbounds=True))
                row, dt = rowspecs[i]
                if row is not None:
                    ptr = wb.gep(ptr, [wb.mul(lo, _row_bytes(wb, row, dt, env))], inbounds=True)
                wb.store(ptr, wb.gep(out, [ir.Constant(I32, 0), ir.Constant(I32, i)],
                                     inbounds=True))
            return wb.bitcast(out, I8PP)

        ins2 = offset(ins_, len(in_args), [(r, a.dtype) for r, a in zip(d.inputs, in_args)],
                      "ins.mine")
        outs2 = offset(outs_, len(p.outputs),
                       [(r, dt) for r, (_, dt) in zip(d.outputs, p.outputs)], "outs.mine")
        with wb.if_then(wb.icmp_signed(">", rows, _c(0))):
            rc = wb.call(body, [ins2, outs2, pars_, myws, wb.bitcast(mine, I64P)])
            with wb.if_then(wb.icmp_signed("!=", rc, ir.Constant(I32, 0)), likely=False):
                wb.cmpxchg(rc_, ir.Constant(I32, 0), rc, "monotonic", "monotonic")

    openmp.emit_parallel_ranges(m, b, n, chunk, [ins, outs, pars, ws, dims, rc_slot],
                                name=f"{sym}.split", max_threads=team)
    b.store(b.trunc(team, I32), last)
    b.ret(b.load(rc_slot))
    symint.flush()


__all__ = ["emit_split_entry", "MIN_ROWS"]

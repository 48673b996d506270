"""Pin the OpenMP team's worker threads, one per allowed CPU other than the caller's.

    entry of a library whose kernels may fork (codegen.py, batchsplit_entry.py):
        NAME.pin_team()                      before the first region of a call
          │ t = rlxc_num_threads or omp_get_max_threads(); nothing if t < 2, or when
          │ done for t and the caller's CPU (sched_getcpu) is none of its workers' CPUs
          │ NAME.repin (cold: not optimized) when it must (re)pin:
          │ GOMP_parallel(NAME.pin_worker, {caller's mask, caller's CPU, bound}, t, 0)
          ▼
        NAME.pin_worker:  thread k > 0 of the team binds itself to the (k-1 mod n)-th CPU
                          of the caller's affinity mask other than the caller's current
                          CPU (n of them) and records it in `bound`; thread 0, the
                          caller, is left alone

Why: a libgomp worker that has gone to sleep (after its spin count, e.g. between
calls made every 100 ms) is woken by a futex from the calling thread, and the
Linux scheduler's wake-affine placement then often puts it on the caller's CPU.
From there on the two threads of every parallel region time-share one CPU while
the other idles, and each region's join waits for a scheduler slice: measured
on a 2-core VM, a 0.6 ms call became 8 ms per region and stayed so.  Bound
workers cannot be moved onto the caller's CPU; the caller itself is not bound
(pinning it would pin every thread it creates later).  The caller can still be moved
onto a worker's CPU (or start there: the mask's k-th CPU is where the caller happened
to be): then the two time-share it, on a 2-core VM every region waiting ~40 us or a
scheduler tick.  So each call compares the caller's CPU with the CPUs its workers are
bound to (`NAME.pinned_cpus`, a thread-local bit set: one load and one test) and re-pins
the team around the caller's CPU when they meet.

State.  `NAME.pinned_for` (the team size pinned; -1: pinning is off) is a
thread_local global: libgomp gives every thread that starts a parallel region
its own pool of workers, so the state belongs to the calling thread; one shared
global would be a data race between concurrent callers and would leave the
teams of every caller but the first unpinned.

Skipped when the user binds threads (OMP_PROC_BIND or GOMP_CPU_AFFINITY set),
or with RLXC_PIN_THREADS=0.  The workers belong to libgomp's pool of the calling
thread, which other OpenMP code of the process called from that thread shares;
binding them one per CPU is also what OMP_PROC_BIND=close does.
"""
from __future__ import annotations

import llvmlite.ir as ir

from rlxc.lowering.cpu.openmp import NUM_THREADS_GLOBAL, thread_control

I8 = ir.IntType(8)
I8P = I8.as_pointer()
I32 = ir.IntType(32)
I64 = ir.IntType(64)
VOID = ir.VoidType()
CPUSET = ir.ArrayType(I64, 16)  # cpu_set_t: 1024 bits


def _declare(m: ir.Module, name: str, fnty: ir.FunctionType) -> ir.Function:
    fn = m.globals.get(name)
    if fn is None:
        fn = ir.Function(m, fnty, name)
    return fn


def _cstring(m: ir.Module, name: str, text: str):
    data = bytearray(text.encode() + b"\0")
    g = ir.GlobalVariable(m, ir.ArrayType(I8, len(data)), name)
    g.initializer = ir.Constant(ir.ArrayType(I8, len(data)), data)
    g.global_constant = True
    g.linkage = "private"
    return g


def _for(b: ir.IRBuilder, n: int, body, name: str):
    """for (i64 i = 0; i < n; ++i) body(b, i)"""
    fn = b.function
    head, loop, done = (fn.append_basic_block(f"{name}.{s}") for s in ("head", "body", "done"))
    pre = b.block
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(I64, name=name)
    i.add_incoming(ir.Constant(I64, 0), pre)
    b.cbranch(b.icmp_signed("<", i, ir.Constant(I64, n)), loop, done)
    b.position_at_end(loop)
    body(b, i)
    i.add_incoming(b.add(i, ir.Constant(I64, 1)), b.block)
    b.branch(head)
    b.position_at_end(done)


# what pin_team hands its team: the caller's affinity mask, the caller's CPU, and the
# CPUs the workers bound themselves to (each worker ORs its bit in, atomically)
PINDATA = ir.LiteralStructType([CPUSET, I64, CPUSET])


def _bit_of(b: ir.IRBuilder, cpu):
    """(word index, bit) of i64 `cpu` in a CPUSET."""
    return (b.lshr(cpu, ir.Constant(I64, 6)),
            b.shl(ir.Constant(I64, 1), b.and_(cpu, ir.Constant(I64, 63))))


def _word(b: ir.IRBuilder, ptr, w):
    return b.gep(ptr, [ir.Constant(I32, 0), w], inbounds=True)


def _pin_worker(m: ir.Module, sym: str) -> ir.Function:
    fn = ir.Function(m, ir.FunctionType(VOID, [I8P]), f"{sym}.pin_worker")
    fn.linkage = "internal"
    # cold (runs only when a team is pinned, around a syscall): not optimized, which
    # took ~9% of the LLVM time of a small program's compile (W4's train step)
    fn.attributes.add("noinline")
    fn.attributes.add("optnone")
    setaff = _declare(m, "sched_setaffinity", ir.FunctionType(I32, [I32, I64, I8P]))
    tidf = _declare(m, "omp_get_thread_num", ir.FunctionType(I32, []))
    ctpop = _declare(m, "llvm.ctpop.i64", ir.FunctionType(I64, [I64]))
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    one = b.alloca(CPUSET, name="one")
    count = b.alloca(I64, name="count")
    pick = b.alloca(I64, name="pick")
    chosen = b.alloca(I64, name="chosen")
    tid = b.sext(b.call(tidf, []), I64)
    with b.if_then(b.icmp_signed("==", tid, ir.Constant(I64, 0))):
        b.ret_void()
    data = b.bitcast(fn.args[0], PINDATA.as_pointer())
    mask = b.gep(data, [ir.Constant(I32, 0), ir.Constant(I32, 0)], inbounds=True)
    caller = b.load(b.gep(data, [ir.Constant(I32, 0), ir.Constant(I32, 1)], inbounds=True))
    busy = b.gep(data, [ir.Constant(I32, 0), ir.Constant(I32, 2)], inbounds=True)

    def word(bb, w):
        return bb.load(_word(bb, mask, w))

    def usable(bb, i):   # CPU i is in the caller's mask and is not the caller's CPU
        w = bb.lshr(i, ir.Constant(I64, 6))
        isset = bb.trunc(bb.lshr(word(bb, w), bb.and_(i, ir.Constant(I64, 63))), ir.IntType(1))
        return bb.and_(isset, bb.icmp_signed("!=", i, caller))

    b.store(ir.Constant(I64, 0), count)
    _for(b, 16, lambda bb, w: bb.store(bb.add(bb.load(count), bb.call(ctpop, [word(bb, w)])),
                                       count), "w")
    n = b.load(count)
    # the caller's CPU does not count when it is in the mask
    cw, cb = _bit_of(b, b.select(b.icmp_signed("<", caller, ir.Constant(I64, 0)),
                                 ir.Constant(I64, 0), caller))
    in_mask = b.and_(b.icmp_signed(">=", caller, ir.Constant(I64, 0)),
                     b.icmp_unsigned("!=", b.and_(word(b, cw), cb), ir.Constant(I64, 0)))
    n = b.sub(n, b.zext(in_mask, I64))
    with b.if_then(b.icmp_signed("<", n, ir.Constant(I64, 1))):
        b.ret_void()
    # worker k takes the (k-1 mod n)-th CPU of the mask other than the caller's
    b.store(b.srem(b.sub(tid, ir.Constant(I64, 1)), n), pick)
    b.store(ir.Constant(CPUSET, None), one)
    b.store(ir.Constant(I64, -1), chosen)

    def bit(bb, i):
        with bb.if_then(usable(bb, i)):
            k = bb.load(pick)
            with bb.if_then(bb.icmp_signed("==", k, ir.Constant(I64, 0))):
                w, v = _bit_of(bb, i)
                bb.store(v, _word(bb, one, w))
                bb.store(i, chosen)
            bb.store(bb.sub(k, ir.Constant(I64, 1)), pick)
    _for(b, 1024, bit, "cpu")
    c = b.load(chosen)
    with b.if_then(b.icmp_signed(">=", c, ir.Constant(I64, 0))):
        b.call(setaff, [ir.Constant(I32, 0), ir.Constant(I64, 128), b.bitcast(one, I8P)])
        w, v = _bit_of(b, c)
        b.atomic_rmw("or", _word(b, busy, w), v, "monotonic")
    b.ret_void()
    return fn


def emit_pin_team(m: ir.Module, sym: str) -> ir.Function:
    """Define `void SYM.pin_team()` in `m` (see the module docstring); returns it."""
    gv = thread_control(m)
    assert gv.name == NUM_THREADS_GLOBAL
    # team size pinned; -1: never.  One per calling thread: libgomp keeps a separate
    # pool of workers for every thread that starts a team, so each caller pins its own,
    # and concurrent callers never share (race on) this state.
    done = ir.GlobalVariable(m, I32, f"{sym}.pinned_for")
    done.linkage = "internal"
    done.storage_class = "thread_local"
    done.initializer = ir.Constant(I32, 0)
    # the CPUs this caller's workers are bound to: a caller found on one of them re-pins
    busy = ir.GlobalVariable(m, CPUSET, f"{sym}.pinned_cpus")
    busy.linkage = "internal"
    busy.storage_class = "thread_local"
    busy.initializer = ir.Constant(CPUSET, None)
    getcpu = _declare(m, "sched_getcpu", ir.FunctionType(I32, []))
    maxf = _declare(m, "omp_get_max_threads", ir.FunctionType(I32, []))
    slow = _repin(m, sym, done, busy)
    fn = ir.Function(m, ir.FunctionType(VOID, []), f"{sym}.pin_team")
    fn.linkage = "internal"
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    # in the caller's frame (pin_team inlines into the entry), as before the split: a
    # frame of its own would reuse stack the kernels' teams read (a helgrind report)
    data = b.alloca(PINDATA, name="data")
    st = b.load(done)
    t = b.load(gv)
    t = b.select(b.icmp_signed(">", t, ir.Constant(I32, 0)), t, b.call(maxf, []))
    off = b.or_(b.icmp_signed("<", t, ir.Constant(I32, 2)), b.icmp_signed("<", st, ir.Constant(I32, 0)))
    with b.if_then(off, likely=True):
        b.ret_void()
    cpu = b.sext(b.call(getcpu, []), I64)
    ok = b.and_(b.icmp_signed(">=", cpu, ir.Constant(I64, 0)),
                b.icmp_signed("<", cpu, ir.Constant(I64, 1024)))
    cpu = b.select(ok, cpu, ir.Constant(I64, -1))
    cw, cb = _bit_of(b, b.select(ok, cpu, ir.Constant(I64, 0)))
    collide = b.and_(ok, b.icmp_unsigned("!=", b.and_(b.load(_word(b, busy, cw)), cb),
                                         ir.Constant(I64, 0)))
    with b.if_then(b.and_(b.icmp_signed("==", st, t), b.not_(collide)), likely=True):
        b.ret_void()
    b.call(slow, [t, st, cpu, data])
    b.ret_void()
    return fn


def _repin(m: ir.Module, sym: str, done, busy) -> ir.Function:
    """`void SYM.repin(i32 t, i32 st, i64 cpu, PINDATA *data)`: what pin_team does when
    the team must be (re)pinned -- the first call (the environment), a new team size, or
    a caller on a worker's CPU.  Cold, so not optimized (noinline optnone): ~8% of the
    LLVM time of W4's train step; pin_team's per-call check stays optimized (inlined
    into the entry), and so does `data`, in the entry's frame as before."""
    worker = _pin_worker(m, sym)
    getenv = _declare(m, "getenv", ir.FunctionType(I8P, [I8P]))
    getaff = _declare(m, "sched_getaffinity", ir.FunctionType(I32, [I32, I64, I8P]))
    par = _declare(m, "GOMP_parallel", ir.FunctionType(
        VOID, [ir.FunctionType(VOID, [I8P]).as_pointer(), I8P, I32, I32]))
    names = [_cstring(m, f"{sym}.env{i}", s)
             for i, s in enumerate(("RLXC_PIN_THREADS", "OMP_PROC_BIND", "GOMP_CPU_AFFINITY"))]
    fn = ir.Function(m, ir.FunctionType(VOID, [I32, I32, I64, PINDATA.as_pointer()]),
                     f"{sym}.repin")
    fn.linkage = "internal"
    fn.attributes.add("noinline")
    fn.attributes.add("optnone")
    t, st, cpu, data = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    with b.if_then(b.icmp_signed("==", st, ir.Constant(I32, 0))):  # first time: ask the env
        null = ir.Constant(I8P, None)
        vals = [b.call(getenv, [b.bitcast(g, I8P)]) for g in names]
        off = b.icmp_unsigned("!=", vals[0], null)
        with b.if_then(off):
            zero = b.icmp_signed("==", b.load(vals[0]), ir.Constant(I8, ord("0")))
            off2 = b.or_(zero, b.or_(b.icmp_unsigned("!=", vals[1], null),
                                     b.icmp_unsigned("!=", vals[2], null)))
            with b.if_then(off2):
                b.store(ir.Constant(I32, -1), done)
                b.ret_void()
        bound = b.or_(b.icmp_unsigned("!=", vals[1], null), b.icmp_unsigned("!=", vals[2], null))
        with b.if_then(bound):
            b.store(ir.Constant(I32, -1), done)
            b.ret_void()
    b.store(ir.Constant(PINDATA, None), data)
    mask = b.gep(data, [ir.Constant(I32, 0), ir.Constant(I32, 0)], inbounds=True)
    rc = b.call(getaff, [ir.Constant(I32, 0), ir.Constant(I64, 128), b.bitcast(mask, I8P)])
    with b.if_then(b.icmp_signed("!=", rc, ir.Constant(I32, 0))):  # cannot read: never pin
        b.store(ir.Constant(I32, -1), done)
        b.ret_void()
    b.store(cpu, b.gep(data, [ir.Constant(I32, 0), ir.Constant(I32, 1)], inbounds=True))
    b.call(par, [worker, b.bitcast(data, I8P), t, ir.Constant(I32, 0)])
    # no worker bound itself (no CPU but the caller's in its mask): they keep their
    # earlier binding, and so does the record of it
    got = b.gep(data, [ir.Constant(I32, 0), ir.Constant(I32, 2)], inbounds=True)
    acc = b.alloca(I64, name="any")
    b.store(ir.Constant(I64, 0), acc)
    _for(b, 16, lambda bb, w: bb.store(bb.or_(bb.load(acc), bb.load(_word(bb, got, w))), acc),
         "any")
    with b.if_then(b.icmp_unsigned("!=", b.load(acc), ir.Constant(I64, 0))):
        b.store(b.load(got), busy)
    b.store(t, done)
    b.ret_void()
    return fn


__all__ = ["emit_pin_team"]

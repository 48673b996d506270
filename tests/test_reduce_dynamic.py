"""Dynamic chunk claiming of split reductions (openmp.emit_parallel_ranges(dynamic=g), set by
reduce.py's split kernel through LoopKernel.dynamic).

A thread that starts late or is descheduled must not hold back a statically assigned half
of the chunks: each thread claims the next chunk from an atomic counter.  Checked with a
library whose thread 1 sleeps in every range it gets (it ends up with almost none, and
every chunk still runs once), on the emitted W1-style sum (the claim loop is there), and
for the result: bit for bit the same with 1 and 2 threads (the partials are combined in
chunk order whoever computed them).
"""
from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest
from llvmlite import ir

from rlxc import Func
from rlxc.lowering.cpu import openmp as parallel
from rlxc.lowering.cpu import target

I32 = ir.IntType(32)
I64 = ir.IntType(64)
VOID = ir.VoidType()


@pytest.fixture(scope="module")
def dynlib(tmp_path_factory):
    """claim(n, tids, work): for each chunk c < n: tids[c] = the thread that ran it; thread
    1 sleeps 5 ms in every range it claims (dynamic=1: one chunk per claim)."""
    m = target.ir_module("dyn")
    f = ir.Function(m, ir.FunctionType(VOID, [I64, I32.as_pointer(), I64]), "claim")
    n, tids, work = f.args
    b = ir.IRBuilder(f.append_basic_block("entry"))
    usleep = ir.Function(m, ir.FunctionType(I32, [I32]), "usleep")

    def body(b, lo, hi, tid, nt, args):
        (tids_,) = args
        with b.if_then(b.icmp_signed("==", tid, ir.Constant(I32, 1))):
            b.call(usleep, [ir.Constant(I32, 5000)])
        fn = b.function
        head, loop, done = (fn.append_basic_block(s) for s in ("c.head", "c.loop", "c.done"))
        pre = b.block
        b.branch(head)
        b.position_at_end(head)
        c = b.phi(I64)
        c.add_incoming(lo, pre)
        b.cbranch(b.icmp_signed("<", c, hi), loop, done)
        b.position_at_end(loop)
        b.store(tid, b.gep(tids_, [c], inbounds=True))
        c.add_incoming(b.add(c, ir.Constant(I64, 1)), loop)
        b.branch(head)
        b.position_at_end(done)

    parallel.emit_parallel_ranges(m, b, n, body, [tids], work=work, min_work=1000, dynamic=1)
    b.ret_void()
    lib = ctypes.CDLL(target.build_shared(m, str(tmp_path_factory.mktemp("dyn") / "libdyn.so")))
    lib.claim.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64]
    return lib


def _claim(lib, n, work):
    tids = np.full(n, -1, np.int32)
    lib.claim(n, tids.ctypes.data, work)
    assert (tids >= 0).all(), tids          # every chunk ran (once: one slot each)
    return tids


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two CPUs")
def test_slow_thread_leaves_its_chunks_to_the_other(dynlib):
    """With a static split thread 1 would run 32 of the 64 chunks; claiming them one by
    one, the thread that sleeps 5 ms per claim runs a few at most."""
    dynlib.rlxc_set_num_threads(2)
    tids = _claim(dynlib, 64, 10**6)
    assert set(tids) <= {0, 1}
    assert (tids == 1).sum() <= 4, tids


def test_inline_and_empty(dynlib):
    """One thread (or too little work): the calling thread claims every chunk itself."""
    dynlib.rlxc_set_num_threads(1)
    assert set(_claim(dynlib, 37, 10**6)) == {0}
    dynlib.rlxc_set_num_threads(2)
    assert set(_claim(dynlib, 37, 10)) == {0}
    _claim(dynlib, 0, 10**6)


def _w1(n):
    def build(s):
        x, a, b = s.input("x", (n,)), s.input("a", ()), s.input("b", ())
        return ((x * a + b).tanh() * x.sigmoid()).sum(), (x * x).sum()
    return Func(f"w1_dyn_{n}", build)


def test_split_reduction_claims_chunks():
    """The split reduction's parallel kernel claims its chunks from a counter (an atomic
    add in the emitted worker); its result is bit for bit the same on 1 and 2 threads."""
    from rlxc.lowering.cpu.driver import emit_llvm

    n = 1 << 20
    text = emit_llvm(_w1(n).module, "w1", optimized=True)
    assert "atomicrmw add" in text
    x = np.random.default_rng(2).standard_normal(n).astype(np.float32)
    j = _w1(n).jit()
    a, b = np.float32(0.7), np.float32(0.1)
    j.set_num_threads(1)
    one = j.run(x, a, b)
    j.set_num_threads(2)
    two = [j.run(x, a, b) for _ in range(5)]
    j.set_num_threads(0)
    for r in two:
        for p, q in zip(one, r):
            np.testing.assert_array_equal(p, q)

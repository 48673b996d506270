"""rlxc.lowering.cpu.target (target machines, O3, objects, linking) and
rlxc.lowering.cpu.openmp (libgomp parallel-for emission)."""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest

import llvmlite.binding as llvm
import llvmlite.ir as ir

from rlxc.lowering.cpu import openmp as parallel
from rlxc.lowering.cpu import target

F32 = ir.FloatType()
F32P = F32.as_pointer()
I32 = ir.IntType(32)
I64 = ir.IntType(64)
VOID = ir.VoidType()

SAXPY = """
define void @saxpy(i64 %n, float %a, float* noalias %x, float* noalias %y) {
entry:
  br label %head
head:
  %i = phi i64 [0, %entry], [%i1, %body]
  %c = icmp slt i64 %i, %n
  br i1 %c, label %body, label %done
body:
  %px = getelementptr inbounds float, float* %x, i64 %i
  %py = getelementptr inbounds float, float* %y, i64 %i
  %vx = load float, float* %px
  %vy = load float, float* %py
  %m = fmul contract float %a, %vx
  %s = fadd contract float %m, %vy
  store float %s, float* %py
  %i1 = add i64 %i, 1
  br label %head
done:
  ret void
}
"""


def test_host_cpu():
    assert target.host_cpu_name()
    assert isinstance(target.host_has_avx512(), bool)


def test_target_machine_cache():
    assert target.target_machine() is target.target_machine("native", 3)
    assert target.target_machine("x86-64-v3") is target.target_machine("x86-64-v3")
    assert target.target_machine("x86-64-v3") is not target.target_machine()
    assert target.target_machine("x86-64-v3", opt=2) is not target.target_machine("x86-64-v3")


def test_compile_vectorizes_saxpy():
    mod = target.compile_ir(SAXPY, cpu="x86-64-v3")
    assert isinstance(mod, llvm.ModuleRef)
    assert "<8 x float>" in str(mod) or "<16 x float>" in str(mod)
    asm = target.emit_asm(mod, cpu="x86-64-v3")
    assert "vfmadd" in asm and "%ymm" in asm


def test_compile_errors_are_loud():
    with pytest.raises(RuntimeError):
        target.compile_ir("define void @f( {")
    bad = "define i32 @f() {\nentry:\n  ret i64 0\n}\n"
    with pytest.raises(RuntimeError):
        target.compile_ir(bad)


def test_emit_object_and_link(tmp_path):
    obj = target.emit_object(SAXPY)
    assert obj[:4] == b"\x7fELF"
    out = tmp_path / "libsaxpy.so"
    path = target.link_shared([obj], str(out), extra_libs=())
    assert path == str(out) and out.exists()
    # atomic write: nothing but the library is left in the directory
    assert sorted(os.listdir(tmp_path)) == ["libsaxpy.so"]
    lib = ctypes.CDLL(path)
    lib.saxpy.argtypes = [ctypes.c_int64, ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p]
    x = np.arange(37, dtype=np.float32)
    y = np.ones(37, np.float32)
    lib.saxpy(37, 2.0, x.ctypes.data, y.ctypes.data)
    np.testing.assert_array_equal(y, 2 * np.arange(37, dtype=np.float32) + 1)


def test_link_failure_reports_cc_stderr(tmp_path):
    with pytest.raises(RuntimeError, match="link_shared") as ei:
        target.link_shared([b"this is not an object file"], str(tmp_path / "libbad.so"))
    assert "part0.o" in str(ei.value)  # cc's complaint names the bad input
    assert not (tmp_path / "libbad.so").exists()
    assert os.listdir(tmp_path) == []


def test_link_two_objects_sharing_thread_control(tmp_path):
    """Two modules that both define rlxc_num_threads (weak) link into one .so."""
    objs = []
    for k in range(2):
        m = target.ir_module(f"m{k}")
        gv = parallel.thread_control(m)
        f = ir.Function(m, ir.FunctionType(I32, []), f"read{k}")
        b = ir.IRBuilder(f.append_basic_block())
        b.ret(b.load(gv))
        objs.append(target.emit_object(m))
    lib = ctypes.CDLL(target.link_shared(objs, str(tmp_path / "libtwo.so")))
    lib.rlxc_set_num_threads(3)
    assert lib.read0() == 3 and lib.read1() == 3 and lib.rlxc_get_num_threads() == 3
    lib.rlxc_set_num_threads(-5)
    assert lib.rlxc_get_num_threads() == 0
    with pytest.raises(AttributeError):  # the global itself stays inside the library
        lib.rlxc_num_threads


# ---------------------------------------------------------------- parallel.py

def _omp_thread_num(module):
    fn = module.globals.get("omp_get_thread_num")
    return fn or ir.Function(module, ir.FunctionType(I32, []), "omp_get_thread_num")


@pytest.fixture(scope="module")
def plib(tmp_path_factory):
    """pfor(n, out, tids, scale, work): for c < n: out[c] = scale*c + out[c]; tids[c] = thread.
    prange(n, lo_hi, work): lo_hi[2*tid] = lo, lo_hi[2*tid+1] = hi."""
    m = target.ir_module("par")

    f = ir.Function(m, ir.FunctionType(VOID, [I64, F32P, I32.as_pointer(), F32, I64]), "pfor")
    n, out, tids, scale, work = f.args
    b = ir.IRBuilder(f.append_basic_block("entry"))

    def body(b, c, args):
        out_, tids_, scale_ = args
        p = b.gep(out_, [c], inbounds=True)
        b.store(b.fadd(b.fmul(scale_, b.sitofp(c, F32)), b.load(p)), p)
        b.store(b.call(_omp_thread_num(b.module), []), b.gep(tids_, [c], inbounds=True))

    parallel.emit_parallel_for(m, b, n, body, [out, tids, scale], work=work, min_work=1000)
    b.ret_void()

    g = ir.Function(m, ir.FunctionType(VOID, [I64, I64.as_pointer(), I64]), "prange")
    n, lohi, work = g.args
    b = ir.IRBuilder(g.append_basic_block("entry"))

    def rbody(b, lo, hi, tid, nt, args):
        (lohi_,) = args
        t = b.mul(b.sext(tid, I64), ir.Constant(I64, 2))
        b.store(lo, b.gep(lohi_, [t], inbounds=True))
        b.store(hi, b.gep(lohi_, [b.add(t, ir.Constant(I64, 1))], inbounds=True))

    parallel.emit_parallel_ranges(m, b, n, rbody, [lohi], work=work, min_work=1000,
                                  max_threads=ir.Constant(I64, 2))
    b.ret_void()
    path = target.build_shared(m, str(tmp_path_factory.mktemp("par") / "libpar.so"))
    lib = ctypes.CDLL(path)
    lib.pfor.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_float,
                         ctypes.c_int64]
    lib.prange.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64]
    return lib


def _pfor(lib, n, work):
    out = np.ones(n, np.float32)
    tids = np.full(n, -1, np.int32)
    lib.pfor(n, out.ctypes.data, tids.ctypes.data, 0.5, work)
    np.testing.assert_array_equal(out, 0.5 * np.arange(n, dtype=np.float32) + 1)  # each chunk once
    return tids


def test_parallel_for_uses_threads(plib):
    plib.rlxc_set_num_threads(2)
    tids = _pfor(plib, 101, work=10**6)
    assert set(tids) <= {0, 1}
    if (os.cpu_count() or 1) >= 2:
        assert set(tids) == {0, 1}
        # static schedule: thread 0 takes a contiguous prefix
        assert (np.diff(tids) >= 0).all()


def test_parallel_for_small_work_runs_inline(plib):
    plib.rlxc_set_num_threads(2)
    assert set(_pfor(plib, 101, work=10)) == {0}
    plib.rlxc_set_num_threads(1)
    assert set(_pfor(plib, 101, work=10**6)) == {0}
    plib.rlxc_set_num_threads(2)
    assert set(_pfor(plib, 1, work=10**6)) == {0}  # one chunk: no team
    _pfor(plib, 0, work=10**6)  # empty loop


def test_parallel_ranges_static_split(plib):
    plib.rlxc_set_num_threads(8)  # capped by max_threads=2
    lohi = np.full(16, -1, np.int64)
    plib.prange(10, lohi.ctypes.data, 10**6)
    if (os.cpu_count() or 1) >= 2:
        assert list(lohi[:4]) == [0, 5, 5, 10]
        assert (lohi[4:] == -1).all()
    plib.prange(10, lohi.ctypes.data, 1)  # inline: one range
    assert list(lohi[:2]) == [0, 10]


def test_thread_control_default(plib):
    plib.rlxc_set_num_threads(0)
    assert plib.rlxc_get_num_threads() == 0
    _pfor(plib, 64, work=10**6)  # all cores

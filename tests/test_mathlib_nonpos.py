"""mathlib.exp_nonpos, the overflow-free e^x the attention kernels use on score - max <= 0:
accuracy against float64 NumPy on [-100, 0], exact 0 below -87 and at -inf, NaN kept."""
from __future__ import annotations

import ctypes

import numpy as np
import llvmlite.binding as llvm
from llvmlite import ir

from rlxc.lowering.shared import mathlib
from test_mathlib import ulp_error

F32, I64 = ir.FloatType(), ir.IntType(64)
W = 8


def _compiled():
    """y[i:i+8] = exp_nonpos(x[i:i+8]) for i < n (n a multiple of 8), JIT-compiled at O3."""
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    tm = llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3)
    m = ir.Module(name="exp_nonpos")
    m.triple = llvm.get_process_triple()
    vt = ir.VectorType(F32, W)
    fn = ir.Function(m, ir.FunctionType(ir.VoidType(), [F32.as_pointer()] * 2 + [I64]), "f")
    x, y, n = fn.args
    entry, body, done = (fn.append_basic_block(s) for s in ("entry", "body", "done"))
    b = ir.IRBuilder(entry)
    b.cbranch(b.icmp_signed(">", n, ir.Constant(I64, 0)), body, done)
    b.position_at_end(body)
    i = b.phi(I64)
    i.add_incoming(ir.Constant(I64, 0), entry)
    px = b.bitcast(b.gep(x, [i]), vt.as_pointer())
    py = b.bitcast(b.gep(y, [i]), vt.as_pointer())
    b.store(mathlib.exp_nonpos(b, b.load(px, align=4)), py, align=4)
    nxt = b.add(i, ir.Constant(I64, W))
    i.add_incoming(nxt, body)
    b.cbranch(b.icmp_signed("<", nxt, n), body, done)
    b.position_at_end(done)
    b.ret_void()
    mod = llvm.parse_assembly(str(m))
    mod.verify()
    ee = llvm.create_mcjit_compiler(mod, tm)
    ee.finalize_object()
    f = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(
        ee.get_function_address("f"))
    return ee, f


def test_exp_nonpos_accuracy_and_specials():
    ee, f = _compiled()
    x = np.concatenate([np.linspace(-100.0, 0.0, 400_000, dtype=np.float32),
                        np.float32([-0.0, -87.0, -87.5, -1e30, -np.inf, np.nan, -1e-40,
                                    -np.float32(1e-45)])])
    x = np.concatenate([x, np.zeros((-x.size) % W, np.float32)])
    y = np.empty_like(x)
    f(x.ctypes.data, y.ctypes.data, x.size)
    ok = x >= -87.0
    err = ulp_error(y[ok], np.exp(x[ok].astype(np.float64)))
    assert np.nanmax(err) <= 1.5, float(np.nanmax(err))
    assert np.all(y[(x < -87.0)] == 0.0)          # -87.5, -1e30 and -inf: exactly 0
    assert np.isnan(y[np.isnan(x)]).all()         # NaN is not clamped into a number
    assert y[x == 0.0].tolist() == [1.0] * int((x == 0.0).sum())
    del ee

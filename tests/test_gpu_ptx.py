"""PTX for every op and fusion pattern, assembled by ptxas for sm_90 — no GPU needed.

Each case compiles through lowering/gpu_driver.compile_cuda (LLVM NVPTX, PTX
8.0 for sm_90) and, when a ptxas is found, is assembled with `ptxas -arch=sm_90
-v`: any ptxas error fails the test; registers and spills are recorded and
printed (`pytest -s`), and the simple kernels must not spill.  Without ptxas
the assembly part is skipped with the reason.
"""
from __future__ import annotations

import re

import llvmlite.ir as ir
import numpy as np
import pytest

import rlxc
from opcases import CASES, make_func
from rlxc.lowering.gpu import driver as gpu_driver
from rlxc.lowering.gpu import mathlib as gpu_math
from rlxc.lowering.gpu import nvptx

PTXAS = nvptx.find_ptxas()
needs_ptxas = pytest.mark.skipif(PTXAS is None, reason="no ptxas found (PATH, $CUDA_HOME/bin, "
                                 "/usr/local/cuda/bin, nvidia-cuda-nvcc wheel): PTX only")
REPORT: dict[str, dict] = {}


def _compile(f, name):
    art = gpu_driver.compile_cuda(f.module, ptxas=PTXAS or False)
    ptx = art.ptx
    assert ".target sm_90" in ptx and re.search(r"^\.version \d+\.\d+", ptx, re.M)
    launches = [s for s in art.meta["steps"] if s["op"] == "launch"]
    for s in launches:
        assert re.search(rf"^\.visible \.entry {re.escape(s['kernel'])}\(", ptx, re.M), s
    if PTXAS:
        assert art.cubin and art.cubin[:4] == b"\x7fELF"
        for k, info in art.kernels.items():
            REPORT[f"{name}:{k.split('_k', 1)[-1]}"] = info
            print(f"{name:28s} {k:40s} regs={info['registers']:3d} "
                  f"spills={info['spill_stores']}/{info['spill_loads']} stack={info['stack']} "
                  f"smem={info['smem']}")
    return art


def _no_spills(art):
    for k, info in art.kernels.items():
        assert info["spill_stores"] == 0 and info["spill_loads"] == 0 and info["stack"] == 0, \
            (k, info)


@pytest.mark.parametrize("name", list(CASES))
def test_op_ptx(name):
    f = make_func(name)[0]
    art = _compile(f, name)
    if PTXAS:
        _no_spills(art)


PATTERNS = {
    "elementwise_chain": (lambda s: (s.input("x", (256, 1024)) * 2.0 + 1.0).tanh().exp(),
                          ["elementwise"]),
    "broadcast": (lambda s: s.input("x", (256, 1024)) * s.input("b", (1024,))
                  + s.input("c", (256, 1)), ["elementwise"]),
    "reduction_after_elementwise": (lambda s: ((s.input("x", (512, 1000)) - 1.0) ** 2.0).sum(-1),
                                    ["reduce"]),
    "reduction_block": (lambda s: s.input("x", (4, 100000)).max(-1), ["reduce"]),
    "reduction_cols": (lambda s: s.input("x", (4096, 512)).sum(0), ["reduce"]),
    "matmul_bias_relu": (lambda s: (s.input("x", (512, 256)) @ s.input("w", (256, 1024))
                                    + s.input("b", (1024,))).relu(), ["matmul"]),
    "matmul_large": (lambda s: s.input("a", (4096, 4096)) @ s.input("b", (4096, 4096)),
                     ["matmul"]),
    "matmul_transposed": (lambda s: s.input("a", (1024, 512)).T @ s.input("b", (1024, 256)),
                          ["matmul"]),
    "softmax": (lambda s: s.input("x", (128, 1000)).softmax(), None),
}


@pytest.mark.parametrize("name", list(PATTERNS))
def test_fusion_pattern_ptx(name):
    build, kinds = PATTERNS[name]
    f = rlxc.Func("f_" + name, build)
    art = _compile(f, name)
    if kinds is not None:
        assert [s["kernel"].rsplit("_", 1)[-1] for s in art.meta["steps"]] == kinds
    if PTXAS:
        _no_spills(art)
    if name == "matmul_large":      # the 128x128 tile: 16-byte loads, 512 FMAs per K step
        ptx = art.ptx
        assert "ld.shared.v4" in ptx and "ld.global.nc.v4" in ptx and "bar.sync" in ptx
        assert ptx.count("fma.rn.f32") >= 512
    if name == "elementwise_chain":
        assert "ld.global.nc.v4" in art.ptx and "st.global.v4" in art.ptx
    if name == "reduction_after_elementwise":
        assert "shfl.sync.bfly" in art.ptx


def _mlp(batch=256):
    def build(s):
        x = s.input("x", (batch, 784))
        y = s.input("y", (batch,), "i32")
        w1, b1 = s.param("w1", (784, 512)), s.param("b1", (512,))
        w2, b2 = s.param("w2", (512, 10)), s.param("b2", (10,))
        return ((x @ w1 + b1).relu() @ w2 + b2).cross_entropy(y)
    return rlxc.Func("mlp", build)


def test_mlp_forward_ptx():
    art = _compile(_mlp(), "mlp_forward")
    if PTXAS:
        _no_spills(art)


def test_mlp_train_step_ptx():
    try:
        g = _mlp().value_and_grad_all()
    except ImportError as e:  # pragma: no cover - autodiff not built yet
        pytest.skip(f"value_and_grad_all unavailable: {e}")
    art = _compile(g, "mlp_train_step")
    kinds = [s["kernel"].rsplit("_", 1)[-1] for s in art.meta["steps"] if s["op"] == "launch"]
    assert kinds.count("matmul") == 5      # forward 2; backward dW2, dh, dW1 (no dx)
    if PTXAS:
        _no_spills(art)


def test_kernel_signature_is_ptx_kernel():
    """Kernels use the ptx_kernel calling convention, global pointers in addrspace(1):
    the PTX is valid whatever GPU (or none) is present."""
    mod, plan, steps = gpu_driver.build_kernels(make_func("softmax")[0].module, "gpu")
    text = str(mod)
    names = [s["kernel"] for s in steps if s["op"] == "launch"]
    for n in names:
        assert re.search(rf'define ptx_kernel void @"{n}"\(ptr addrspace\(1\) noalias', text)
    ptx = nvptx.emit_ptx(mod)
    assert ptx.count(".visible .entry") == len(names)
    assert nvptx.ptx_features("sm_90") == "+ptx80"
    assert ".version 8.6" in nvptx.emit_ptx(mod, "sm_90", ptx_version=86)


def test_unsupported_intrinsic_is_an_error_not_an_abort():
    m = nvptx.new_module()
    fn = ir.Function(m, ir.FunctionType(ir.VoidType(), [ir.PointerType(addrspace=1)]), "k")
    fn.calling_convention = "ptx_kernel"
    b = ir.IRBuilder(fn.append_basic_block())
    x = b.load(fn.args[0], typ=ir.FloatType())
    b.store(gpu_math.intrinsic(b, "llvm.exp.f32", ir.FloatType(), [x]), fn.args[0])
    b.ret_void()
    with pytest.raises(nvptx.NvptxError, match="llvm.exp.f32"):
        nvptx.emit_ptx(m)


@needs_ptxas
def test_ptxas_errors_carry_stderr():
    with pytest.raises(nvptx.PtxasError, match="ptxas"):
        nvptx.assemble(".version 8.0\n.target sm_90\n.address_size 64\nbogus;\n", "sm_90")


def test_ptxas_missing_ships_ptx(monkeypatch):
    monkeypatch.setenv("RLXC_PTXAS", "none")
    assert nvptx.find_ptxas() is None
    assert nvptx.assemble("whatever", "sm_90") == (None, {})
    art = gpu_driver.compile_cuda(make_func("exp")[0].module)
    assert art.cubin is None and ".entry" in art.ptx and art.meta["kernels"]


def test_parse_ptxas_info():
    text = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k_matmul' for 'sm_90'
ptxas info    : Function properties for k_matmul
    8 bytes stack frame, 4 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 157 registers, used 1 barriers, 16640 bytes smem, 392 bytes cmem[0]
"""
    info = nvptx.parse_ptxas_info(text)["k_matmul"]
    assert info == {"registers": 157, "spill_stores": 4, "spill_loads": 8, "stack": 8,
                    "smem": 16640, "cmem": 392, "barriers": 1}


def test_pow_special_cases_on_host():
    """gpu_math.pow (pure IR) JIT-compiled for the host: NumPy's special cases."""
    import ctypes

    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    m = ir.Module()
    m.triple = llvm.get_process_triple()
    f32 = ir.FloatType()
    fn = ir.Function(m, ir.FunctionType(f32, [f32, f32]), "p")
    b = ir.IRBuilder(fn.append_basic_block())
    b.ret(gpu_math.emit(b, "pow", *fn.args))
    mod = llvm.parse_assembly(str(m))
    tm = llvm.Target.from_default_triple().create_target_machine()
    ee = llvm.create_mcjit_compiler(mod, tm)
    ee.finalize_object()
    p = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_float, ctypes.c_float)(
        ee.get_function_address("p"))
    xs = [-2, -2, -2, 0, 0, 0, 1, np.nan, np.nan, -8, np.inf, 2, 3.5, 0.3]
    ys = [3, 2, 0.5, 2, -1, 0, np.nan, 0, 1, 1 / 3, -1, np.inf, 1.7, -2.2]
    with np.errstate(all="ignore"):
        want = np.power(np.float32(xs), np.float32(ys))
    got = np.float32([p(x, y) for x, y in zip(xs, ys)])
    np.testing.assert_allclose(got, want, rtol=1e-6, equal_nan=True)


def test_report_table():
    """Print the registers/spills table of everything assembled in this session."""
    if not REPORT:
        pytest.skip("nothing assembled (no ptxas, or run alone)")
    print(f"\n{'kernel':44s} {'regs':>5s} {'spills':>7s} {'smem':>6s}")
    for k, v in sorted(REPORT.items()):
        print(f"{k:44s} {v['registers']:5d} {v['spill_stores']:7d} {v['smem']:6d}")

"""The CUDA runtime (runtime/cuda.py) and the GPU kernels, without a GPU where possible.

- no GPU: available() is False with a reason; contexts and programs raise
  CudaUnavailable (never crash); driver errors carry the driver's name/string
  (a fake libcuda); argument packing, the artifact container, arch matching.
- the GPU program's numerics through the real runtime (CudaProgram) with an
  emulating driver (lowering/gpu/emu.py: the same kernel generators built for the
  host, thread by thread): every op case, the fusion patterns, every reduction
  strategy and matmul config, the MLP train step — against the interpreter.
- on a machine with an NVIDIA GPU (marked `gpu`): the same cases on the device.
"""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

import rlxc
from opcases import CASES, make_func
from rlxc.dialect import ops as O
from rlxc.lowering.gpu import emu as gpu_emu
from rlxc.lowering.gpu import driver as gpu_driver
from rlxc.lowering.gpu import plan as gpu_plan
from rlxc.runtime import cuda as rt
from rlxc.runtime.errors import ArtifactError

HAS_GPU = rt.available()
gpu = [pytest.mark.gpu, pytest.mark.skipif(
    not HAS_GPU, reason=f"needs an NVIDIA GPU: {rt.unavailable_reason()}")]
rng = np.random.default_rng(7)


def R(*s):
    return rng.standard_normal(s).astype(np.float32)


# ---------------------------------------------------------------- no device needed

@pytest.mark.skipif(HAS_GPU, reason="a CUDA device is present")
def test_unavailable_has_reason_and_raises_cleanly():
    assert rt.available() is False
    why = rt.unavailable_reason()
    assert isinstance(why, str) and why
    with pytest.raises(rt.CudaUnavailable, match="not available"):
        rt.driver()
    with pytest.raises(rt.CudaUnavailable):
        rt.context(0)
    art = gpu_driver.compile_cuda(make_func("exp")[0].module, ptxas=False)
    with pytest.raises(rt.CudaUnavailable):
        art.program()


def test_missing_library_reason(monkeypatch):
    monkeypatch.setenv("RLXC_LIBCUDA", "/nonexistent/libcuda.so.1")
    monkeypatch.setattr(rt, "_state", {})
    assert rt.available() is False
    assert "/nonexistent/libcuda.so.1" in rt.unavailable_reason()
    with pytest.raises(rt.CudaUnavailable, match="cannot load"):
        rt.context()


class _FakeLib:
    """A libcuda stand-in whose calls fail with a given CUresult."""

    def __init__(self, rc):
        self.rc = rc

    def cuMemAlloc_v2(self, ptr, n):
        return self.rc

    def cuGetErrorName(self, rc, out):
        out._obj.value = b"CUDA_ERROR_OUT_OF_MEMORY" if rc == 2 else b"CUDA_ERROR_X"
        return 0

    def cuGetErrorString(self, rc, out):
        out._obj.value = b"out of memory"
        return 0


def test_driver_errors_carry_name_and_string():
    drv = rt.Driver(_FakeLib(2))
    with pytest.raises(rt.CudaError) as ei:
        drv.mem_alloc(1 << 40)
    e = ei.value
    assert (e.code, e.name, e.call) == (2, "CUDA_ERROR_OUT_OF_MEMORY", "cuMemAlloc_v2")
    assert "out of memory" in str(e) and "cuMemAlloc_v2" in str(e)
    assert rt.Driver(_FakeLib(0)).mem_alloc(16) == 0
    with pytest.raises(rt.CudaUnavailable, match="cuLaunchKernel"):
        drv.call("cuLaunchKernel")


def test_pack_args_roundtrip():
    kinds = ["ptr", "i32", "i64", "f32", "f64"]
    vals = [0xDEADBEEF00, -5, 1 << 40, 1.5, -2.25]
    arr, keep = rt.pack_args(vals, kinds)
    assert len(keep) == 5 and ctypes.sizeof(arr) == 5 * ctypes.sizeof(ctypes.c_void_p)
    assert rt.unpack_args(arr, kinds) == vals
    arr, _ = rt.pack_args([1, 2, 3])          # device pointers by default
    assert rt.unpack_args(arr, ["ptr"] * 3) == [1, 2, 3]
    with pytest.raises(ValueError, match="unknown kind"):
        rt.pack_args([1], ["u8"])


def test_artifact_container_roundtrip():
    f = make_func("softmax")[0]
    art = gpu_driver.compile_cuda(f.module, ptxas=False)
    data = art.to_bytes()
    back = gpu_driver.CudaArtifact.from_bytes(data)
    assert back.meta == art.meta and back.blobs == art.blobs
    assert back.ptx.startswith("//") and ".entry" in back.ptx
    with pytest.raises(ArtifactError, match="magic"):
        rt.load_artifact(b"garbage" * 3)
    bad = data.replace(b"rlxc-cuda-1", b"rlxc-cuda-0")
    with pytest.raises(ArtifactError, match="format"):
        rt.load_artifact(bad)


def test_arch_fits():
    assert rt.arch_fits("sm_90", (9, 0)) == "cubin"
    assert rt.arch_fits("sm_90", (10, 0)) == "ptx"
    assert rt.arch_fits("sm_90", (8, 9)) is None
    assert rt.arch_fits("sm_90a", (9, 0)) == "cubin"
    assert rt.arch_fits("sm_90a", (10, 0)) is None
    assert rt.arch_fits("sm_80", (8, 6)) == "cubin"


def test_launch_plan_and_buffers():
    """Kernel order, aliases, and work-buffer reuse in the plan."""
    def b(s):
        x = s.input("x", (64, 32))
        h = (x * 2.0).exp()                       # cheap: recomputed in both kernels below
        r = h.sum(-1, keepdims=True)              # reduce
        y = (h / r).reshape(32, 64)               # elementwise (root: the reshape)
        t = (y @ s.input("w", (64, 16))).tanh()   # matmul + epilogue
        return y.sum(0), y, t.sum()
    plan = gpu_plan.plan_module(rlxc.Func("p", b).module)
    assert [k.kind for k in plan.kernels] == ["reduce", "elementwise", "matmul", "reduce",
                                              "reduce"]
    outs = [plan.buffer_of[v] for v in plan.outputs]
    assert outs[1].region == "work" and outs[1].last == len(plan.kernels)
    work = [bf for bf in plan.buffers if bf.region == "work"]
    for i, p in enumerate(work):            # overlapping live ranges never share bytes
        for q in work[i + 1:]:
            if not (p.last < q.first or q.last < p.first):
                assert p.offset + p.nbytes <= q.offset or q.offset + q.nbytes <= p.offset


# ---------------------------------------------------------------- emulated GPU numerics

def _check(f, inputs, rtol=2e-5, atol=2e-5):
    args = f.bind_call((), dict(inputs))
    ref = f.run_on("interp", **inputs)
    drv = gpu_emu.EmuDriver()
    prog = gpu_emu.emulate_program(f.module, drv)
    try:
        got = prog.run(args)
    finally:
        prog.close()
    assert len(got) == len(ref)
    for i, (g, r) in enumerate(zip(got, ref)):
        assert g.shape == r.shape and g.dtype == r.dtype, (i, g.shape, r.shape)
        np.testing.assert_allclose(g, r, rtol=rtol, atol=atol, equal_nan=True,
                                   err_msg=f"{f.name} output {i}")
    return drv


@pytest.mark.parametrize("name", list(CASES))
def test_emulated_op(name):
    f, _, inputs, _ = make_func(name)
    _check(f, inputs)


PATTERNS = {
    # name: (build, inputs, expected kernel kinds)
    "elementwise_chain_vec4": (lambda s: (s.input("x", (64, 256)) * 2.0 + 1.0).tanh().exp(),
                               {"x": R(64, 256)}, ["elementwise"]),
    "broadcast_bias": (lambda s: (s.input("x", (64, 256)) + s.input("b", (256,))).relu(),
                       {"x": R(64, 256), "b": R(256)}, ["elementwise"]),
    "broadcast_column": (lambda s: s.input("x", (30, 50)) - s.input("m", (30, 1)),
                         {"x": R(30, 50), "m": R(30, 1)}, ["elementwise"]),
    "reduce_after_elementwise": (lambda s: (s.input("x", (37, 300)) * 3.0).exp().sum(-1),
                                 {"x": R(37, 300) * 0.1}, ["reduce"]),
    "reduce_epilogue": (lambda s: (s.input("x", (40, 100)).exp().sum(-1)).log() * 2.0,
                        {"x": R(40, 100)}, ["reduce"]),
    "reduce_block": (lambda s: s.input("x", (3, 5000)).sum(-1), {"x": R(3, 5000)}, ["reduce"]),
    "reduce_cols": (lambda s: s.input("x", (500, 33)).sum(0), {"x": R(500, 33)}, ["reduce"]),
    "reduce_middle": (lambda s: s.input("x", (6, 50, 7)).max([0, 2]), {"x": R(6, 50, 7)},
                      ["reduce"]),
    "matmul_bias_relu": (lambda s: (s.input("a", (96, 64)) @ s.input("w", (64, 128))
                                    + s.input("b", (128,))).relu(),
                         {"a": R(96, 64), "w": R(64, 128), "b": R(128)}, ["matmul"]),
    "matmul_edges": (lambda s: s.input("a", (100, 37)) @ s.input("b", (37, 70)),
                     {"a": R(100, 37), "b": R(37, 70)}, ["matmul"]),
    "matmul_transposed": (lambda s: s.input("a", (33, 50)).T @ s.input("w", (17, 33)).T,
                          {"a": R(33, 50), "w": R(17, 33)}, ["matmul"]),
    "matmul_batch_bcast": (lambda s: s.input("a", (3, 1, 20, 16)) @ s.input("b", (4, 16, 12)),
                           {"a": R(3, 1, 20, 16), "b": R(4, 16, 12)}, ["matmul"]),
    "matmul_config_M": (lambda s: s.input("a", (512, 16)) @ s.input("b", (16, 512)),
                        {"a": R(512, 16), "b": R(16, 512)}, ["matmul"]),
    "matmul_config_L": (lambda s: s.input("a", (1024, 16)) @ s.input("b", (16, 2048)),
                        {"a": R(1024, 16), "b": R(16, 2048)}, ["matmul"]),
    "matmul_k0": (lambda s: s.input("a", (8, 0)) @ s.input("b", (0, 4)),
                  {"a": R(8, 0), "b": R(0, 4)}, ["matmul"]),
    "embedding": (lambda s: s.input("E", (100, 32)).gather(s.input("i", (64,), "i32")),
                  {"E": R(100, 32), "i": rng.integers(0, 100, 64).astype(np.int32)},
                  ["elementwise"]),
    "scatter_add": (lambda s: s.emit(O.ScatterAddOp, [s.input("i", (300,), "i32"),
                                                      s.input("u", (300, 16))], axis=0, dim=50),
                    {"i": rng.integers(0, 50, 300).astype(np.int32), "u": R(300, 16)},
                    ["scatter"]),
}


@pytest.mark.parametrize("name", list(PATTERNS))
def test_emulated_pattern(name):
    build, inputs, kinds = PATTERNS[name]
    f = rlxc.Func("p_" + name, build)
    assert [k.kind for k in gpu_plan.plan_module(f.module).kernels] == kinds
    _check(f, inputs, rtol=1e-4, atol=1e-4)


def test_matmul_configs_chosen():
    from rlxc.lowering.gpu.matmul import choose_config

    assert choose_config(4096, 4096, 1) == "L"
    assert choose_config(512, 512, 1) == "M"
    assert choose_config(256, 256, 1) == "S"
    assert choose_config(8, 16, 1) == "S"


@pytest.mark.parametrize("dtype", ["f64", "i32", "i64"])
def test_emulated_matmul_of_other_dtypes(dtype):
    """The tiled GEMM in float64 and the integers (scalar loads; integers multiply-add and
    wrap): odd edges, a transposed operand read in place, a broadcast batch, and an f64
    attention whose backward expands to matmuls; the PTX assembles where ptxas is."""
    from rlxc.lowering.gpu import nvptx

    npdt = {"f64": np.float64, "i32": np.int32, "i64": np.int64}[dtype]
    r = np.random.default_rng(3)

    def arr(*shape):
        a = r.standard_normal(shape) if dtype == "f64" else r.integers(-50, 50, shape)
        return a.astype(npdt)

    def build(s):
        a, b = s.input("a", (37, 19), dtype), s.input("b", (19, 70), dtype)
        c, d = s.input("c", (3, 5, 9), dtype), s.input("d", (9, 6), dtype)
        return [a @ b, (b.T @ a.T), c @ d, a[:5] @ b[:, :1]]

    f = rlxc.Func(f"mm_{dtype}", build)
    inputs = {"a": arr(37, 19), "b": arr(19, 70), "c": arr(3, 5, 9), "d": arr(9, 6)}
    _check(f, inputs, rtol=1e-12, atol=1e-9)
    gpu_driver.compile_cuda(f.module, ptxas=nvptx.find_ptxas() or False)
    if dtype == "f64":
        def att(s):
            q, k, v = (s.input(n, (1, 2, 5, 8), "f64") for n in "qkv")
            return rlxc.attention(q, k, v, mask="causal").sum()
        g = rlxc.Func("att64", att).value_and_grad(["q", "k", "v"])
        _check(g, {n: r.standard_normal((1, 2, 5, 8)) for n in "qkv"}, rtol=1e-10,
               atol=1e-12)


def mlp_func(batch=64, d_in=32, hidden=64, classes=10):
    def build(s):
        x = s.input("x", (batch, d_in))
        y = s.input("y", (batch,), "i32")
        w1, b1 = s.param("w1", (d_in, hidden)), s.param("b1", (hidden,))
        w2, b2 = s.param("w2", (hidden, classes)), s.param("b2", (classes,))
        h = (x @ w1 + b1).relu()
        return (h @ w2 + b2).cross_entropy(y)
    return rlxc.Func("mlp", build).init_randn(0, 0.1)


def test_emulated_mlp_train_step():
    g = mlp_func().value_and_grad_all()
    inputs = {"x": R(64, 32), "y": rng.integers(0, 10, 64).astype(np.int32)}
    _check(g, inputs, rtol=1e-4, atol=1e-5)


def test_params_stay_resident():
    f = mlp_func(batch=8, d_in=4, hidden=8, classes=3)
    inputs = {"x": R(8, 4), "y": rng.integers(0, 3, 8).astype(np.int32)}
    drv = gpu_emu.EmuDriver()
    prog = gpu_emu.emulate_program(f.module, drv)
    copies = []
    real = drv.memcpy_htod
    drv.memcpy_htod = lambda dst, src, n, s=None: (copies.append(dst), real(dst, src, n, s))
    args = f.bind_call((), inputs)
    ref = f.run_on("interp", **inputs)
    for _ in range(2):
        copies.clear()
        np.testing.assert_allclose(prog.run(args)[0], ref[0], rtol=1e-5)
    assert len(copies) == 2                   # second call: the two inputs only
    new = f.with_param("b2", np.ones(3, np.float32))
    copies.clear()
    np.testing.assert_allclose(prog.run(new.bind_call((), inputs))[0],
                               new.run_on("interp", **inputs)[0], rtol=1e-5)
    assert len(copies) == 3                   # inputs + the changed param
    prog.close()


DTYPE_CASES = {
    "f64_reduce": (lambda s: s.input("x", (5, 70)).cast("f64").sum(-1), {"x": R(5, 70)}),
    "i32_arith": (lambda s: (s.input("i", (5, 7), "i32") * 3 + 1).maximum(s.input("j", (5, 7),
                                                                                   "i32")),
                  {"i": rng.integers(-9, 9, (5, 7)).astype(np.int32),
                   "j": rng.integers(-9, 9, (5, 7)).astype(np.int32)}),
    "i32_warp_sum": (lambda s: s.input("i", (5, 700), "i32").sum(-1),
                     {"i": rng.integers(-9, 9, (5, 700)).astype(np.int32)}),
    "i64_max": (lambda s: s.input("i", (5, 70), "i64").max(-1),
                {"i": rng.integers(-9, 9, (5, 70)).astype(np.int64)}),
    "mask_output": (lambda s: s.input("x", (5, 70)).gt(0.0), {"x": R(5, 70)}),
    "identity": (lambda s: s.input("x", (5, 7)), {"x": R(5, 7)}),
    "same_output_twice": (lambda s: (lambda y: (y, y, y.reshape(7, 5)))(s.input("x", (5, 7)) * 2.0),
                          {"x": R(5, 7)}),
    "constant_output": (lambda s: s.constant(np.arange(6, dtype=np.float32).reshape(2, 3)), {}),
    "scalar_input": (lambda s: s.input("x", ()) * 3.0, {"x": np.float32(2.0)}),
    "empty": (lambda s: s.input("x", (0, 3)) * 3.0, {"x": np.zeros((0, 3), np.float32)}),
}


@pytest.mark.parametrize("name", list(DTYPE_CASES))
def test_emulated_dtypes_and_edges(name):
    build, inputs = DTYPE_CASES[name]
    _check(rlxc.Func("d_" + name, build), inputs)


def test_f64_math_on_the_gpu():
    """f64 transcendentals compile for the GPU (they raised "rlx.exp on f64"); a dtype an
    op lacks still fails loudly, naming the op and the dtype."""
    x = np.array([-2.0, 0.5, 3.0, 40.0], np.float32)
    f = rlxc.Func("f64exp", lambda s: s.input("x", (4,)).cast("f64").exp())
    got = gpu_emu.emulate(f.module, [x])[0]
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, np.exp(x.astype(np.float64)), rtol=1e-15)
    g = rlxc.Func("fq64", lambda s: s.input("x", (4,)).cast("f64").fake_quant("e4m3"))
    with pytest.raises(NotImplementedError, match="rlx.fake_quant on f64"):
        gpu_driver.compile_cuda(g.module, ptxas=False)


def test_timing_profile_and_pinned_paths():
    """time(), profile() and pinned staging run through the driver interface."""
    f = mlp_func(batch=8, d_in=4, hidden=8, classes=3)
    inputs = {"x": R(8, 4), "y": rng.integers(0, 3, 8).astype(np.int32)}
    art = gpu_emu.emulation_artifact(f.module)
    prog = rt.CudaProgram(art.meta, art.blobs, drv=gpu_emu.EmuDriver(), pinned=True)
    args = f.bind_call((), inputs)
    np.testing.assert_allclose(prog.run(args)[0], f.run_on("interp", **inputs)[0], rtol=1e-5)
    t = prog.time(args, iters=2, warmup=1)
    assert set(t) == {"kernels_ms", "run_ms"}
    prof = prog.profile(args, iters=1)
    assert [n for n, _ in prof] == [s.get("kernel", "memset") for s in art.meta["steps"]]
    prog.close()
    with pytest.raises(rlxc.RlxError, match="closed"):
        prog.run(args)


def test_scatter_memsets_before_launch():
    build, inputs, _ = PATTERNS["scatter_add"]
    f = rlxc.Func("sc", build)
    art = gpu_driver.compile_cuda(f.module, ptxas=False)
    ops = [s["op"] for s in art.meta["steps"]]
    assert ops == ["memset", "memset", "launch"]    # the index checks' error flag, the output
    assert art.meta["steps"][0]["buffer"] == art.meta["errors"]["buffer"]
    assert art.meta["steps"][1]["buffer"] == art.meta["steps"][2]["args"][0]


# ---------------------------------------------------------------- on a real GPU

GPU_CASES = ["exp", "add", "sum", "sum_keepdims", "max_all", "matmul", "matmul_batched",
             "softmax", "layer_norm", "gather", "scatter_add", "concat", "pad", "fake_quant",
             "cross_entropy_labels"]


@pytest.mark.parametrize("name", GPU_CASES)
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason=f"needs an NVIDIA GPU: {rt.unavailable_reason()}")
def test_gpu_op(name):
    f, _, inputs, _ = make_func(name)
    art = gpu_driver.compile_cuda(f.module)
    with art.program() as prog:
        got = prog.run(f.bind_call((), dict(inputs)))
    for g, r in zip(got, f.run_on("interp", **inputs)):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason=f"needs an NVIDIA GPU: {rt.unavailable_reason()}")
def test_gpu_mlp_train_step():
    g = mlp_func(batch=256, d_in=64, hidden=256).value_and_grad_all()
    inputs = {"x": R(256, 64), "y": rng.integers(0, 10, 256).astype(np.int32)}
    with gpu_driver.compile_cuda(g.module).program() as prog:
        got = prog.run(g.bind_call((), inputs))
    for a, b in zip(got, g.run_on("interp", **inputs)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)

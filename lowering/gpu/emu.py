"""Run GPU programs on the CPU: the real launch plan and runtime, emulated kernels.

    rlx module ──build_kernels(target="host")──► host LLVM IR (gpu_simt host target:
          │                                      thread loops per phase, registers
          │                                      in [threads] arrays)
          │ artifact with that IR in place of the PTX
          ▼
    runtime.cuda.CudaProgram(meta, blobs, drv=EmuDriver())
          EmuDriver: the Driver interface over host memory (NumPy arrays) and
          MCJIT-compiled kernels; launch() unpacks the packed kernel parameters and
          calls NAME.grid(ptr...), which runs every block, thread by thread
          ▼
    outputs, compared by tests with the NumPy interpreter

This exercises everything but the NVPTX backend and the hardware: fusion,
buffer planning and reuse, index arithmetic, the shuffle/shared-memory
reduction trees, the tiled matmul's tiles, double buffering and barriers
(sequential threads are a legal schedule: a missing barrier reads stale
shared memory), argument packing and the runtime's copies.  Grids are run
block by block, so keep emulated sizes small.
"""
from __future__ import annotations

import ctypes

import llvmlite.binding as llvm
import numpy as np

from rlxc.runtime import cuda as rt

from rlxc.lowering.gpu import driver as gpu_driver
from rlxc.lowering.gpu import kernels as gpu_kernels

_init = False


def _ensure_init():
    global _init
    if not _init:
        llvm.initialize_all_targets()
        llvm.initialize_all_asmprinters()
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        _init = True


class EmuDriver:
    """The subset of runtime.cuda.Driver that CudaProgram uses, on the host."""

    emulated = True   # size-generic host kernels take the grid as arguments (dyncuda.py)

    def __init__(self, capability=(9, 0)):
        self.capability = capability
        self._mem: dict[int, np.ndarray] = {}
        self._engines = {}
        self.calls: list = []

    # devices / contexts
    def device_count(self):
        return 1

    def device(self, ordinal):
        return ordinal

    def device_name(self, dev):
        return "rlxc host emulation"

    def compute_capability(self, dev):
        return self.capability

    def primary_context(self, dev):
        return 1

    def set_current(self, ctx):
        pass

    def synchronize(self):
        pass

    # memory
    def mem_alloc(self, nbytes):
        a = np.empty(max(1, int(nbytes)) + 256, dtype=np.uint8)
        a.fill(0xA5)                  # poison: an unwritten output shows up
        ptr = (a.ctypes.data + 255) // 256 * 256
        self._mem[ptr] = a
        return ptr

    def mem_free(self, ptr):
        self._mem.pop(ptr, None)

    host_alloc = mem_alloc
    host_free = mem_free

    def memcpy_htod(self, dst, src, nbytes, stream=None):
        ctypes.memmove(dst, src, nbytes)

    def memcpy_dtoh(self, dst, src, nbytes, stream=None):
        ctypes.memmove(dst, src, nbytes)

    def memset(self, dst, value, nbytes, stream=None):
        ctypes.memset(dst, value, nbytes)

    def memcpy_dtod(self, dst, src, nbytes, stream=None):
        ctypes.memmove(dst, src, nbytes)

    # modules
    def module_load(self, image: bytes):
        _ensure_init()
        mod = llvm.parse_assembly(image.rstrip(b"\0").decode())
        mod.verify()
        tm = llvm.Target.from_default_triple().create_target_machine(opt=2)
        pto = llvm.create_pipeline_tuning_options(speed_level=2)
        pb = llvm.create_pass_builder(tm, pto)
        pb.getModulePassManager().run(mod, pb)
        ee = llvm.create_mcjit_compiler(mod, tm)
        ee.finalize_object()
        h = len(self._engines) + 1
        self._engines[h] = (ee, mod)
        return h

    def module_unload(self, h):
        self._engines.pop(h, None)

    def function(self, h, name):
        ee, mod = self._engines[h]
        nargs = len(list(mod.get_function(name + ".grid").arguments))
        addr = ee.get_function_address(name + ".grid")
        fn = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * nargs))(addr)
        fn._nargs = nargs
        fn._name = name
        return fn

    def function_attribute(self, fn, attr):
        return 0

    def launch(self, fn, grid, block, smem, stream, params):
        vals = rt.unpack_args(params, ["ptr"] * fn._nargs)
        self.calls.append((fn._name, tuple(grid), tuple(block), vals))
        fn(*vals)

    # streams / events
    def stream_create(self):
        return 1

    def stream_synchronize(self, s):
        pass

    def stream_destroy(self, s):
        pass

    def event_create(self):
        return 1

    def event_record(self, e, s):
        pass

    def event_synchronize(self, e):
        pass

    def event_elapsed_ms(self, a, b):
        return 0.0

    def event_destroy(self, e):
        pass


def emulation_artifact(module, name=None) -> gpu_driver.CudaArtifact:
    """An artifact whose "ptx" blob is host LLVM IR of the emulated kernels."""
    from rlxc.lowering.gpu import regions as R

    if R.has_regions(module):   # control flow: sub-programs linked, host-side loop steps
        _ensure_init()
        text, meta, consts = R.build_regions(module, "host")
        mod = llvm.parse_assembly(text)
        mod.triple = llvm.get_process_triple()
        meta = {"format": "rlxc-cuda-1", "name": name or gpu_driver.M_name(module),
                "arch": "sm_90", **meta, "kernels": {}}
        return gpu_driver.CudaArtifact(meta, {"ptx": str(mod).encode(), "consts": consts})
    mod, plan, steps = gpu_kernels.build_kernels(module, "host")
    _ensure_init()
    mod.triple = llvm.get_process_triple()
    meta, consts = gpu_driver.plan_meta(plan, steps, name or plan.func.sym_name.data, "sm_90")
    meta["kernels"] = {}
    return gpu_driver.CudaArtifact(meta, {"ptx": str(mod).encode(), "consts": consts})


def emulate_program(module, drv: EmuDriver | None = None) -> rt.CudaProgram:
    art = emulation_artifact(module)
    return rt.CudaProgram(art.meta, art.blobs, drv=drv or EmuDriver())


def emulate(module, args) -> list[np.ndarray]:
    """Run an rlx module (or Func) through the emulated GPU path: outputs."""
    prog = emulate_program(module)
    try:
        return prog.run(list(args))
    finally:
        prog.close()

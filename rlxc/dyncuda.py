"""One GPU program per dynamic Func (issue 14): the cuda backend's one-library path.

    Func with symbols ─ one_program(func, backend) ─┬─► DynCudaExecutor: one module for every
                                                    │   size (lowering/gpu/dynplan.py ->
                                                    │   runtime/dyncuda.py), compiled once per
                                                    │   process, IR and arch
                                                    └─► None: not size-generic on the GPU;
                                                        rlxc.dynone.FALLBACKS[ir hash] says
                                                        why, and rlxc/dynamic.py keeps one
                                                        static program per size

No CUDA device: None as well (the per-size path raises CudaUnavailable when it runs,
as before).  A driver marked `emulated` (lowering/gpu/emu.EmuDriver) gets host kernels,
so the whole path runs in tests without a GPU.  RLXC_ONE_LIBRARY=0 turns it off.
"""
from __future__ import annotations

import os
import threading

STATS = {"compiles": 0}
_progs: dict = {}
_lock = threading.Lock()


class DynCudaExecutor:
    """`run(arrays)` (every argument in signature order) on a size-generic GPU program."""

    def __init__(self, program):
        self.program = program
        self.lib = self                 # SizedJitted.set_num_threads reaches .lib

    def run(self, arrays) -> list:
        return self.program.run(list(arrays))

    def set_num_threads(self, n: int) -> None:
        """GPU programs have no host threads to set."""


def one_program(func, backend, drv=None):
    """The DynCudaExecutor serving every size of `func`, or None (per-size fallback)."""
    if os.environ.get("RLXC_ONE_LIBRARY", "1") == "0":
        return None
    from rlxc.runtime import cuda as rt

    if drv is None:
        if not rt.available():
            return None
        ctx = rt.context(0)
    else:
        ctx = rt.context(0, drv)
    emulated = bool(getattr(ctx.driver, "emulated", False))
    key = (func.ir_hash(), ctx.arch, emulated, id(ctx.driver) if drv is not None else 0)
    with _lock:
        if key in _progs:
            return _progs[key]
        ex = None
        try:
            from rlxc.func import c_symbol
            from rlxc.lowering.gpu.dynplan import compile_dynamic_cuda
            from rlxc.runtime.dyncuda import DynCudaProgram

            meta, blobs = compile_dynamic_cuda(func.module, c_symbol(func.name), ctx.arch,
                                               target="host" if emulated else "gpu")
            STATS["compiles"] += 1
            ex = DynCudaExecutor(DynCudaProgram(meta, blobs, drv=ctx.driver))
        except Exception as e:   # noqa: BLE001 - any refusal: per-size programs instead
            from rlxc.dynone import FALLBACKS

            FALLBACKS[key[0]] = f"{type(e).__name__}: {e}"
        _progs[key] = ex
        return ex

"""One native library per dynamic Func on the host CPU (issue 14), else one per size.

    Func with symbols ─ one_library(func, backend) ─┬─► DynExecutor: one .so for every size
                                                    │   (lowering/cpu/dynsizes.py), compiled
                                                    │   once per process and IR
                                                    └─► None: the graph is not size-generic
                                                        under the lowering; FALLBACKS[ir
                                                        hash] says why, and rlxc/dynamic.py
                                                        keeps one static program per size

RLXC_ONE_LIBRARY=0 turns the one-library path off (benchmarks compare both).
"""
from __future__ import annotations

import os
import threading

_libs: dict = {}
FALLBACKS: dict = {}     # ir hash -> why the one-library path refused that graph
_lock = threading.Lock()


def enabled(backend) -> bool:
    from rlxc.registry import CpuBackend

    return (os.environ.get("RLXC_ONE_LIBRARY", "1") != "0" and isinstance(backend, CpuBackend)
            and not backend.target.triple)


def one_library(func, backend):
    """The DynExecutor serving every size of `func` on `backend`, or None (fallback)."""
    if getattr(backend, "name", "") == "cuda":   # the GPU's one program: rlxc/dyncuda.py
        from .dyncuda import one_program

        return one_program(func, backend)
    if not enabled(backend):
        return None
    key = (func.ir_hash(), backend.cpu_string())
    with _lock:
        if key in _libs:
            return _libs[key]
        ex = None
        try:
            from rlxc.lowering.cpu.dynsizes import compile_dynamic
            from rlxc.runtime.dyncpu import DynExecutor, DynLibrary

            from rlxc.func import c_symbol

            meta = compile_dynamic(func.module, c_symbol(func.name), backend.cpu_string())
            meta.pop("object")
            ex = DynExecutor(DynLibrary(meta["so_path"], meta))
        except Exception as e:   # noqa: BLE001 - any refusal: per-size programs instead
            FALLBACKS[key[0]] = f"{type(e).__name__}: {e}"
        _libs[key] = ex
        return ex


def fallback_reason(func) -> str | None:
    return FALLBACKS.get(func.ir_hash())

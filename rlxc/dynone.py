"""One native library per dynamic Func on the host CPU (issue 14), else one per size.

    Func with symbols ─ one_library(func, backend) ─┬─► DynExecutor: one .so for every size
                                                    │   (lowering/cpu/dynsizes.py), compiled
                                                    │   once per process and IR
                                                    └─► None: the graph is not size-generic
                                                        under the lowering; FALLBACKS[ir
                                                        hash] says why, and rlxc/dynamic.py
                                                        keeps one static program per size

Disk cache (rlxc/cache.py): the library is an entry of kind "cpu-dyn" keyed by the
IR hash, the CPU and the thread count, so a second process loads it instead of
compiling (DynLibrary cross-checks the workspace size function against the entry's
metadata); a graph the lowering refused is remembered as a "cpu-dyn-refused" entry
(its reason), so a second process does not retry the sample lowerings either.

A refusal the lowering means (DynamicSizeError: it needed a size as a number) is silent:
the per-size programs are the designed answer.  Any other exception there is a bug in the
size-generic lowering, and falling back would hide it behind slower compiles (one per
size): it is recorded the same way and also warned about (SizeGenericFallbackWarning;
the test suite turns that warning into an error).

RLXC_ONE_LIBRARY=0 turns the one-library path off (benchmarks compare both).
"""
from __future__ import annotations

import os
import threading
import warnings

_libs: dict = {}
FALLBACKS: dict = {}     # ir hash -> why the one-library path refused that graph
_lock = threading.Lock()


class SizeGenericFallbackWarning(RuntimeWarning):
    """The size-generic lowering of a dynamic Func failed unexpectedly (not a
    DynamicSizeError): rlxc compiles one program per size instead."""


def record_fallback(func, key, err: Exception, backend: str) -> None:
    """Remember why `func` got per-size programs; warn when `err` is not a refusal the
    lowering means (see the header)."""
    from rlxc.lowering.cpu.symint import DynamicSizeError

    FALLBACKS[key] = why = f"{type(err).__name__}: {err}"
    if not isinstance(err, (DynamicSizeError, Refused)):
        warnings.warn(f"{func.name}: the size-generic {backend} lowering failed ({why}); "
                      "compiling one program per size instead", SizeGenericFallbackWarning,
                      stacklevel=3)


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
            ex = _cached_or_compiled(func, backend.cpu_string())
        except Exception as e:   # noqa: BLE001 - any refusal: per-size programs instead
            _libs[key] = None
            record_fallback(func, key[0], e, "CPU")
            return None
        _libs[key] = ex
        return ex


class Refused(Exception):
    """The lowering refused this graph (remembered in the disk cache)."""


def _check_args(func):
    want = [[a.name, a.kind, list(a.shape), a.dtype] for a in func.signature()]

    def check(meta):
        from rlxc.cache import BadEntry

        got = [[a["name"], a["kind"], list(a["shape"]), a["dtype"]] for a in meta["args"]]
        if got != want:
            raise BadEntry(f"arguments {got} differ from the Func's {want}")
    return check


def _cached_or_compiled(func, cpu: str):
    """The DynExecutor of `func`: from the disk cache, else compiled and stored."""
    from rlxc import cache
    from rlxc.backends import cpu_key
    from rlxc.func import c_symbol
    from rlxc.lowering.cpu.driver import default_threads
    from rlxc.runtime.dyncpu import DynExecutor, DynLibrary

    parts = (func.ir_hash(), cpu_key(cpu), "O3", f"t{default_threads()}")
    key = cache.entry_key("cpu-dyn", *parts)
    no_key = cache.entry_key("cpu-dyn-refused", *parts)
    why = cache.load(no_key, "cpu-dyn-refused", lambda path, meta: meta["why"])
    if why is not None:
        raise Refused(why)
    lib = cache.load(key, "cpu-dyn", DynLibrary, _check_args(func))
    if lib is not None:
        cache.STATS["disk_hits"] += 1
        return DynExecutor(lib)
    from rlxc.lowering.cpu.dynsizes import compile_dynamic
    from rlxc.lowering.cpu.symint import DynamicSizeError
    from rlxc.lowering.cpu.target import link_shared

    try:
        meta = compile_dynamic(func.module, c_symbol(func.name), cpu, link=False)
    except DynamicSizeError as e:
        why = f"DynamicSizeError: {e}"
        cache.store(no_key, "cpu-dyn-refused", lambda path: _write(path, why.encode()),
                    {"why": why}, ".txt")
        raise Refused(why) from None
    cache.STATS["compiles"] += 1
    obj = meta.pop("object")
    meta.pop("so_path")
    entry = cache.store(key, "cpu-dyn", lambda path: link_shared([obj], path, cpu=cpu), meta,
                        ".so")
    return DynExecutor(DynLibrary(entry.path, entry.meta))


def _write(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def fallback_reason(func) -> str | None:
    return FALLBACKS.get(func.ir_hash())

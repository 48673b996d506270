"""One GPU program per dynamic Func (issue 14): the cuda backend's one-library path.

    Func with symbols ─ one_program(func, backend) ─┬─► DynCudaExecutor: one module for every
                                                    │   size (lowering/gpu/dynplan.py ->
                                                    │   runtime/dyncuda.py), compiled once per
                                                    │   IR and arch (disk cache: one entry,
                                                    │   whatever the sizes)
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

STATS = {"compiles": 0, "disk_hits": 0}
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
            from rlxc.runtime.dyncuda import DynCudaProgram

            meta, blobs = cached_build(func, c_symbol(func.name), ctx.arch,
                                       "host" if emulated else "gpu")
            ex = DynCudaExecutor(DynCudaProgram(meta, blobs, drv=ctx.driver))
        except Exception as e:   # noqa: BLE001 - any refusal: per-size programs instead
            from rlxc.dynone import record_fallback

            _progs[key] = None
            record_fallback(func, key[0], e, "GPU")
            return None
        _progs[key] = ex
        return ex


def cached_build(func, name: str, arch: str, target: str) -> tuple[dict, dict]:
    """(meta, blobs) of `func`'s size-generic program: the disk cache (one entry per IR,
    arch and target, never one per size), else a compile stored there."""
    from rlxc import cache
    from rlxc.runtime import cuda as rt
    from rlxc.runtime.dyncuda import FORMAT

    key = cache.entry_key(func.ir_hash(), "cuda-dyn", arch, FORMAT, target)
    want = [[a.name, a.kind, list(a.shape), a.dtype] for a in func.signature()]

    def check(meta):
        got = [[a["name"], a["kind"], list(a["shape"]), a["dtype"]] for a in meta["args"]]
        if got != want:
            raise cache.BadEntry(f"arguments {got} differ from the Func's {want}")

    got = cache.load(key, "cuda-dyn", _open_entry, check)
    if got is not None:
        STATS["disk_hits"] += 1
        return got
    from rlxc.lowering.gpu.dynplan import compile_dynamic_cuda

    meta, blobs = compile_dynamic_cuda(func.module, name, arch, target=target)
    STATS["compiles"] += 1
    data = rt.dump_artifact(meta, blobs)
    short = {k: meta[k] for k in ("format", "name", "arch", "dims", "args")}

    def write(path):
        with open(path, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    cache.store(key, "cuda-dyn", write, short, ".rlxgpu")
    return meta, blobs


def _open_entry(path: str, entry: dict) -> tuple[dict, dict]:
    from rlxc.runtime.dyncuda import load_artifact
    from rlxc.runtime.errors import ArtifactError

    with open(path, "rb") as f:
        meta, blobs = load_artifact(f.read())
    for k in ("format", "name", "arch", "dims", "args"):
        if meta.get(k) != entry.get(k):
            raise ArtifactError(f"{path}: {k} {meta.get(k)!r} differs from the cache "
                                f"entry's {entry.get(k)!r}")
    return meta, blobs

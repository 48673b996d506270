"""Native backends behind `Func.run` / `Func.jit`: compile once, cache, load, call.

    Func (IR hash, signature, bound params)
          │ library(func, device): memory cache ─miss─> disk cache ─miss─> compile_cpu
          │   key = sha256(IR hash, device, cpu, opt, threads, compiler fingerprint)
          ▼
    runtime.cpu.CpuLibrary (loaded .so)
          ├─ executor(func, device).run(arrays in signature order)    (Func.run path)
          └─ jit(func, device) -> Jitted.run(*inputs, **inputs)        (no cache lookup)

Disk cache: $RLXC_CACHE_DIR, else ~/.cache/rlxc.  An entry is KEY.json plus
KEY-SHA16.so, where SHA16 starts the sha256 of the library's bytes; the JSON
holds the full sha256, the byte size and the runtime metadata.  Loading checks
all three before dlopen, so a truncated or altered library, or an unreadable
JSON, is detected and rebuilt, never loaded.  Writes are atomic: the library
is linked to a private temporary name and renamed, then the JSON is written to
a temporary file and renamed, so a reader sees either no entry or a complete
one.  Two processes compiling the same function at once each write complete
files and the last rename wins; both results are valid (the library name is
content-addressed, so a JSON never points at a library with other contents).
The compiler fingerprint (a hash of the lowering sources) is part of the key,
so editing the compiler invalidates old entries.  `STATS` counts compiles and
hits (tests use it to prove that a second lookup compiles nothing).
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
import uuid

import numpy as np

from rlxc.runtime.cpu import ABI, NP_DTYPES, CpuCaller, CpuExecutor, CpuLibrary
from rlxc.runtime.errors import ArtifactError
from rlxc.runtime.signature import coerce

STATS = {"compiles": 0, "disk_hits": 0, "memory_hits": 0, "rejected": 0}
CACHE_FORMAT = "rlxc-cpu-cache"

# the lowering files whose contents decide the generated CPU code
CPU_SOURCES = ("buffers.py", "cpu.py", "fusion.py", "indexing.py", "llvmgen.py", "llvmmatmul.py",
               "llvmops.py", "matmul.py", "sgemmlib.py",
               "loops.py", "mathlib.py", "mathlib_core.py", "mathlib_f64.py", "mathlib_more.py",
               "parallel.py", "reduce.py", "schedule.py", "sgemm.py",
               "pinning.py", "smallmm.py", "target.py")

_libs: dict = {}
_executors: dict = {}
_lock = threading.Lock()
_key_locks: dict = {}
_compile_lock = threading.Lock()
_fingerprint = None


def cache_dir() -> str:
    return os.environ.get("RLXC_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache",
                                                            "rlxc")


def clear_memory_cache() -> None:
    """Forget loaded libraries (the next lookup goes to disk)."""
    with _lock:
        _libs.clear()
        _executors.clear()


def compiler_fingerprint() -> str:
    """Hash of the CPU lowering sources and the LLVM binding version."""
    global _fingerprint
    if _fingerprint is None:
        import rlxc.lowering as low

        h = hashlib.sha256()
        d = os.path.dirname(low.__file__)
        for n in CPU_SOURCES:
            try:
                with open(os.path.join(d, n), "rb") as f:
                    h.update(n.encode() + b"\0" + f.read())
            except OSError:
                h.update(n.encode() + b"\0missing")
        # llvmlite's version without importing it (a cache hit must not load LLVM) or
        # importlib.metadata (tens of ms): the bytes of its _version.py
        from importlib.util import find_spec

        spec = find_spec("llvmlite")
        try:
            with open(os.path.join(os.path.dirname(spec.origin), "_version.py"), "rb") as f:
                h.update(f.read())
        except (OSError, TypeError, AttributeError):  # pragma: no cover
            h.update(b"llvmlite ?")
        _fingerprint = h.hexdigest()[:16]
    return _fingerprint


def _cpu_key(cpu: str) -> str:
    if cpu not in ("native", "host", ""):
        return cpu
    h = hashlib.sha256()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "flags")):
                    h.update(line.encode())
                if line.startswith("flags"):
                    break
    except OSError:
        import platform

        h.update(platform.processor().encode())
    return "native-" + h.hexdigest()[:12]


def _options(options: dict) -> tuple:
    from rlxc.lowering.cpu import default_threads

    cpu = options.get("cpu", "native")
    opt = int(options.get("opt", 3))
    threads = int(options.get("max_threads") or default_threads())
    unknown = set(options) - {"cpu", "opt", "max_threads"}
    if unknown:
        raise TypeError(f"unknown backend options {sorted(unknown)}; valid: cpu, opt, "
                        "max_threads")
    return cpu, opt, threads


def _check_device(device: str) -> None:
    if device != "cpu":
        raise ValueError(f"unknown native device {device!r}; valid: ['cpu', 'cuda']")


def _entry_key(name: str, device: str, cpu: str, opt: int, threads: int) -> str:
    return hashlib.sha256("|".join([name, device, _cpu_key(cpu), f"O{opt}", f"t{threads}",
                                    compiler_fingerprint(), f"abi{ABI}"])
                          .encode()).hexdigest()[:40]


def library(func, device: str = "cpu", **options) -> CpuLibrary:
    """The loaded library for `func` (memory cache, then disk cache, then compile)."""
    _check_device(device)
    cpu, opt, threads = _options(options)
    mkey = (func.ir_hash(), device, cpu, opt, threads)
    lib = _libs.get(mkey)
    if lib is not None:
        STATS["memory_hits"] += 1
        return lib
    with _lock:
        klock = _key_locks.setdefault(mkey, threading.Lock())
    with klock:
        lib = _libs.get(mkey)
        if lib is not None:
            STATS["memory_hits"] += 1
            return lib
        key = _entry_key(func.ir_hash(), device, cpu, opt, threads)
        d = cache_dir()
        lib = _load_entry(d, key)
        if lib is not None:
            STATS["disk_hits"] += 1
        else:
            lib = _compile_entry(d, key, func, cpu, opt, threads)
        lib.cache_key = key
        _libs[mkey] = lib
        return lib


def library_for(alias: str, make_func, device: str = "cpu", **options) -> CpuLibrary:
    """The library of the Func that `make_func()` returns, looked up by `alias`.

    `alias` must determine that Func's IR (e.g. the model's IR hash plus how a
    train step is built from it, with the sources that build it).  A disk file
    ALIAS_KEY.alias names the entry it resolved to last time, so a warm process
    loads the library without tracing or transforming anything; on a miss (or a
    stale or broken alias) the Func is built and looked up as `library` does, and
    the alias is (re)written."""
    _check_device(device)
    cpu, opt, threads = _options(options)
    akey = _entry_key("alias:" + alias, device, cpu, opt, threads)
    mkey = ("alias", akey)
    lib = _libs.get(mkey)
    if lib is not None:
        STATS["memory_hits"] += 1
        return lib
    d = cache_dir()
    ap = os.path.join(d, akey + ".alias")
    try:
        with open(ap, encoding="utf-8") as f:
            target = f.read().strip()
    except OSError:
        target = ""
    if len(target) == 40 and all(c in "0123456789abcdef" for c in target):
        lib = _load_entry(d, target)
        if lib is not None:
            STATS["disk_hits"] += 1
            lib.cache_key = target
            _libs[mkey] = lib
            return lib
    lib = library(make_func(), device, **options)
    try:
        if os.access(d, os.W_OK):
            _write_atomic(ap, lib.cache_key.encode())
    except OSError:
        pass
    _libs[mkey] = lib
    return lib


def _sha256(path: str) -> tuple[str, int]:
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
            n += len(chunk)
    return h.hexdigest(), n


def _load_entry(d: str, key: str) -> CpuLibrary | None:
    jp = os.path.join(d, key + ".json")
    if not os.path.exists(jp):
        return None
    try:
        with open(jp, encoding="utf-8") as f:
            info = json.load(f)
        if info.get("format") != CACHE_FORMAT or info.get("key") != key or \
                info.get("abi") != ABI:
            raise ValueError("foreign entry")
        so = os.path.join(d, os.path.basename(info["so"]))
        sha, size = _sha256(so)
        if sha != info["sha256"] or size != info["size"]:
            raise ValueError("library checksum mismatch")
        return CpuLibrary(so, info["meta"])
    except (OSError, ValueError, KeyError, TypeError, ArtifactError):
        STATS["rejected"] += 1
        return None


def _write_atomic(path: str, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(path))
    try:
        os.chmod(tmp, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _compile_entry(d, key, func, cpu, opt, threads) -> CpuLibrary:
    from rlxc.lowering.cpu import compile_cpu

    try:
        os.makedirs(d, exist_ok=True)
        writable = os.access(d, os.W_OK)
    except OSError:
        writable = False
    work = d if writable else tempfile.mkdtemp(prefix="rlxc-")
    tmp_so = os.path.join(work, f".tmp-{key[:16]}-{os.getpid()}-{uuid.uuid4().hex[:8]}.so")
    try:
        with _compile_lock:  # LLVM's global context is not thread-safe
            art = compile_cpu(func.module, func.name, cpu=cpu, opt=opt, so_path=tmp_so,
                              max_threads=threads)
        STATS["compiles"] += 1
        sha, size = _sha256(tmp_so)
        so = os.path.join(work, f"{key}-{sha[:16]}.so")
        os.replace(tmp_so, so)
    finally:
        if os.path.exists(tmp_so):
            os.unlink(tmp_so)
    meta = art.metadata()
    if writable:
        info = {"format": CACHE_FORMAT, "abi": ABI, "key": key, "so": os.path.basename(so),
                "sha256": sha, "size": size, "meta": meta}
        _write_atomic(os.path.join(d, key + ".json"),
                      json.dumps(info, indent=1, sort_keys=True).encode())
    return CpuLibrary(so, meta)


_cuda_programs: dict = {}


def cuda_program(func, arch: str | None = None):
    """The loaded GPU program for `func` (compiled once per IR hash and arch).

    Raises runtime.cuda.CudaUnavailable (a clear RlxError) when no GPU/driver is present,
    before anything is compiled."""
    from rlxc.runtime import cuda as rt

    ctx = rt.context(0)
    arch = arch or ctx.arch
    key = (func.ir_hash(), arch)
    prog = _cuda_programs.get(key)
    if prog is None:
        from rlxc.lowering.gpu_kernels import compile_cuda

        STATS["compiles"] += 1
        prog = _cuda_programs[key] = compile_cuda(func.module, func.name, arch=arch).program()
    return prog


def executor(func, device: str = "cpu", **options) -> CpuExecutor:
    """An object with `.run(arrays) -> outputs` (arrays: every argument in signature order)."""
    if device == "cuda":
        return cuda_program(func, options.get("arch"))
    lib = library(func, device, **options)
    ex = _executors.get(id(lib))
    if ex is None or ex.lib is not lib:
        ex = _executors[id(lib)] = CpuExecutor(lib)
    return ex


def jit(func, device: str = "cpu", **options) -> "Jitted":
    """Compile (or fetch) `func` once and return a Jitted bound to its params."""
    if device == "cuda":
        return CudaJitted(func, cuda_program(func, options.get("arch")))
    return Jitted(func, library(func, device, **options))


class CudaJitted:
    """A GPU program with the Func's params bound (they stay resident on the device)."""

    def __init__(self, func, program):
        self.func, self.program = func, program

    def run(self, *args, **inputs) -> list:
        return self.program.run(self.func._bind(args, inputs, f"{self.func.name}.run"))

    __call__ = run

    def with_param(self, name: str, data) -> "CudaJitted":
        return CudaJitted(self.func.with_param(name, data), self.program)


class Jitted:
    """A compiled Func with its params bound: `run` does no cache lookup.

    `run(x, y)` (inputs in declaration order), `run(x=..., y=...)` or
    `run({"x": ...})`; returns the list of outputs (new arrays each call).
    Passing a param by name overrides the bound one for that call.
    `with_param(name, data)` returns a new Jitted on the same library (no
    recompilation)."""

    def __init__(self, func, lib: CpuLibrary):
        self.func = func
        self.lib = lib
        self._ins = [(a.name, tuple(a.shape), a.dtype, np.dtype(NP_DTYPES[a.dtype]))
                     for a in func.signature() if a.kind == "input"]
        names = func.param_names()
        bound = [func.param_binding(n) for n in names]
        self._bound = all(b is not None for b in bound)
        self._caller = CpuCaller(lib, bound if self._bound else None)
        self._in_pos = [i for i, a in enumerate(func.signature()) if a.kind == "input"]
        self._par_pos = [i for i, a in enumerate(func.signature()) if a.kind == "param"]

    def run(self, *args, **inputs) -> list:
        if args:
            if len(args) == 1 and isinstance(args[0], dict):
                inputs = {**args[0], **inputs}
            else:
                if len(args) > len(self._ins):
                    raise TypeError(f"{self.func.name}.run: {len(args)} positional inputs, "
                                    f"expected at most {len(self._ins)} "
                                    f"({[s[0] for s in self._ins]})")
                for spec, a in zip(self._ins, args):
                    if spec[0] in inputs:
                        raise TypeError(f"{self.func.name}.run: input {spec[0]!r} given twice")
                    inputs[spec[0]] = a
        if self._bound and len(inputs) == len(self._ins):
            arrays = []
            for name, shape, dt, npdt in self._ins:
                a = inputs.get(name)
                if a is None:
                    break
                if not (type(a) is np.ndarray and a.dtype == npdt and a.shape == shape and
                        a.flags.c_contiguous):
                    a = coerce("input", name, a, shape, dt)
                arrays.append(a)
            else:
                return self._caller.call(arrays)
        full = self.func._bind((), inputs, f"{self.func.name}.run")
        return self._caller.call([full[i] for i in self._in_pos],
                                 [full[i] for i in self._par_pos])

    __call__ = run

    def with_param(self, name: str, data) -> "Jitted":
        return Jitted(self.func.with_param(name, data), self.lib)

    def with_params(self, params: dict) -> "Jitted":
        return Jitted(self.func.with_params(params), self.lib)

    def set_num_threads(self, n: int) -> None:
        self.lib.set_num_threads(n)

    def __repr__(self):
        return f"Jitted({self.func.name!r}, {self.lib.path})"


__all__ = ["executor", "jit", "cuda_program", "CudaJitted", "library", "library_for", "Jitted",
           "STATS", "cache_dir", "clear_memory_cache", "compiler_fingerprint"]

"""Native backends behind `Func.run` / `Func.jit`: compile once, cache, load, call.

    Func (IR hash, signature, bound params)
          │ library(func, device): memory cache ─miss─> disk cache ─miss─> compile_cpu
          │   key = sha256(IR hash, device, cpu, opt, threads, compiler fingerprint)
          ▼
    runtime.cpu.CpuLibrary (loaded .so)
          ├─ executor(func, device).run(arrays in signature order)    (Func.run path)
          └─ jit(func, device) -> Jitted.run(*inputs, **inputs)        (no cache lookup)

`device` is a CPU-family target (runtime/targets.py).  The backend registry
(rlxc/registry.py) calls these for its CPU backends, and `cuda_program` /
CudaJitted for "cuda"; this module never imports the registry.  Calls go
through runtime/call.py.

Disk cache: rlxc/cache.py (backend-agnostic; the CPU stores the .so, the GPU the
program container).  An entry is checksummed JSON plus a content-addressed
payload; it is cross-checked against the Func (its signature and output shapes)
and against what the loaded program itself reports, and rebuilt (with one
CacheWarning) when anything disagrees.  The key holds the IR hash, the device
and its options and the compiler fingerprint (every source file of lowering/
and dialect/), so editing the compiler invalidates old entries.  `STATS`
counts compiles and hits (tests use it to prove that a second lookup compiles
nothing).
"""
from __future__ import annotations

import contextlib
import gc
import hashlib
import os
import threading

import numpy as np

from rlxc import cache
from rlxc.cache import STATS, cache_dir, compiler_fingerprint  # noqa: F401 (public names)
from rlxc.runtime.cpu import ABI, NP_DTYPES, CpuCaller, CpuExecutor, CpuLibrary
from rlxc.runtime.call import fast_runner
from rlxc.runtime.errors import ArtifactError
from rlxc.runtime.signature import coerce
from rlxc.runtime.targets import target as runtime_target
from rlxc.runtime.targets import target_names

_libs: dict = {}
_executors: dict = {}
_lock = threading.Lock()
_key_locks: dict = {}
_compile_lock = threading.Lock()


def clear_memory_cache() -> None:
    """Forget loaded libraries (the next lookup goes to disk)."""
    with _lock:
        _libs.clear()
        _executors.clear()
        _cuda_programs.clear()


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


cpu_key = _cpu_key   # public: rlxc/dynone.py keys the one library's cache entry the same way

_gc_depth = 0
_gc_was_enabled = False
_gc_lock = threading.Lock()


@contextlib.contextmanager
def gc_paused():
    """Python's cyclic garbage collector off while a program is traced, transformed and
    compiled: that builds tens of thousands of IR objects which all live until the
    compile ends, and the collector scanned them ~100 times per cold compile of W4
    (~5% of it; a raised threshold saved a quarter of that: gen-0 scans dominate).
    Little cyclic garbage is left meanwhile (~1,400 objects after a 20-layer MLP's
    value_and_grad).  Nested and concurrent pauses share one counter; the last one out
    turns the collector back on if it was on when the first one came in."""
    global _gc_depth, _gc_was_enabled
    with _gc_lock:
        if _gc_depth == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_depth += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_depth -= 1
            if _gc_depth == 0 and _gc_was_enabled:
                gc.enable()


def _options(options: dict) -> tuple:
    from rlxc.lowering.cpu.driver import default_threads

    cpu = options.get("cpu", "native")
    opt = int(options.get("opt", 3))
    threads = int(options.get("max_threads") or default_threads())
    unknown = set(options) - {"cpu", "opt", "max_threads"}
    if unknown:
        raise TypeError(f"unknown backend options {sorted(unknown)}; valid: cpu, opt, "
                        "max_threads")
    return cpu, opt, threads


def _check_device(device: str) -> None:
    """`device` must name a CPU-family target (runtime/targets.py): its code is a shared
    library.  (The registry, rlxc/registry.py, routes every other device elsewhere.)"""
    if runtime_target(device).family != "cpu":
        raise ValueError(f"{device!r} is not a CPU target (its code is not a shared library); "
                         f"CPU targets: {[t for t in target_names() if _is_cpu(t)]}")


def _is_cpu(name: str) -> bool:
    return runtime_target(name).family == "cpu"


def _entry_key(name: str, device: str, cpu: str, opt: int, threads: int) -> str:
    return cache.entry_key(name, device, _cpu_key(cpu), f"O{opt}", f"t{threads}", f"abi{ABI}")


def _key_lock(mkey) -> threading.Lock:
    with _lock:
        return _key_locks.setdefault(mkey, threading.Lock())


def _signature_check(func):
    """check(meta): the entry describes `func` (its arguments, output count and shapes;
    dtypes and the rest are checked against the program itself when it is loaded)."""
    want_args = [(a.name, a.kind, [int(d) for d in a.shape], a.dtype)
                 for a in func.signature()]
    want_outs = None

    def check(meta):
        nonlocal want_outs
        args = [(a["name"], a["kind"], list(a["shape"]), a["dtype"]) for a in meta["args"]]
        if args != want_args:
            raise cache.BadEntry(f"arguments {args} differ from the Func's {want_args}")
        if want_outs is None:
            want_outs = [[int(d) for d in s] for s in func.output_shapes()]
        outs = [list(o["shape"]) for o in meta["outputs"]]
        if outs != want_outs:
            raise cache.BadEntry(f"output shapes {outs} differ from the Func's {want_outs}")
    return check


def _open_cpu(path: str, meta: dict) -> CpuLibrary:
    return CpuLibrary(path, meta, require_signature=True)


def library(func, device: str = "cpu", **options) -> CpuLibrary:
    """The loaded library for `func` (memory cache, then disk cache, then compile)."""
    _check_device(device)
    cpu, opt, threads = _options(options)
    ident = func.ir_hash()
    return _memoized((ident, device, cpu, opt, threads),
                     lambda: _load_or_compile(func, ident, device, cpu, opt, threads))


def _load_or_compile(func, ident: str, device, cpu, opt, threads) -> CpuLibrary:
    """The disk cache's entry named by `ident` (what determines `func`'s IR: its IR hash,
    or a step alias), else `func` compiled and stored under that name."""
    key = _entry_key(ident, device, cpu, opt, threads)
    lib = cache.load(key, "cpu", _open_cpu, _signature_check(func))
    if lib is not None:
        STATS["disk_hits"] += 1
    else:
        with gc_paused():
            lib = _compile_entry(key, func, cpu, opt, threads)
    lib.cache_key = key
    return lib


def _memoized(mkey, build) -> CpuLibrary:
    """`_libs[mkey]`, made by `build()` on a miss; one builder per key at a time (a
    second thread asking for the same key waits for the first one's library)."""
    lib = _libs.get(mkey)
    if lib is None:
        with _key_lock(mkey):
            lib = _libs.get(mkey)
            if lib is None:
                lib = _libs[mkey] = build()
                return lib
    STATS["memory_hits"] += 1
    return lib


def library_for(alias: str, make_func, device: str = "cpu", check=None,
                **options) -> CpuLibrary:
    """The library of the Func that `make_func()` returns, looked up by `alias`.

    `alias` must determine that Func's IR (e.g. the model's IR hash plus how a
    train step is built from it, with the sources that build it).  A disk file
    ALIAS_KEY.alias names the entry it resolved to last time (checksummed, with the
    alias itself and a digest of that entry's signature: rlxc/cache.py), so a warm
    process loads the library without tracing or transforming anything.  `check(meta)`
    (optional) raises ValueError when the entry's metadata does not fit the caller.
    On a miss, or a stale, altered or mismatched alias (dropped with a CacheWarning),
    the Func is built and looked up (compiled on a miss) as `library` does, but in the
    entry named by the alias rather than by its IR hash (no MLIR print), and the alias
    is (re)written."""
    _check_device(device)
    cpu, opt, threads = _options(options)
    akey = _entry_key("alias:" + alias, device, cpu, opt, threads)

    def resolve():
        hit = cache.read_alias(akey)
        if hit is not None:
            target, sig = hit
            lib = cache.load(target, "cpu", _open_cpu)
            if lib is not None:
                try:
                    if cache.signature_digest(lib.meta) != sig:
                        raise cache.BadEntry("it names an entry with another signature")
                    if check is not None:
                        check(lib.meta)
                except (ValueError, KeyError, TypeError) as e:
                    cache.drop_alias(akey, str(e))
                    lib = None
            if lib is not None:
                STATS["disk_hits"] += 1
                lib.cache_key = target
                return lib
        with gc_paused():   # trace and transforms (make_func), then the compile
            # the alias determines the IR, so it names the entry too: the step's MLIR is
            # never printed for an IR hash (~20 ms of a cold compile, with the op formats)
            lib = _load_or_compile(make_func(), "step:" + alias, device, cpu, opt, threads)
        if check is not None:
            check(lib.meta)
        if os.path.isfile(os.path.join(cache_dir(), lib.cache_key + ".json")):
            cache.write_alias(akey, lib.cache_key, lib.meta)
        return lib

    return _memoized(("alias", akey), resolve)


def _compile_entry(key, func, cpu, opt, threads) -> CpuLibrary:
    from rlxc.lowering.cpu.driver import compile_cpu
    from rlxc.lowering.cpu.target import link_shared

    with _compile_lock:  # LLVM's global context is not thread-safe
        art = compile_cpu(func.module, func.symbol, cpu=cpu, opt=opt, link=False,
                          max_threads=threads, combine=False)
    STATS["compiles"] += 1
    entry = cache.store(key, "cpu", lambda path: link_shared(art.parts, path, cpu=cpu),
                        art.metadata(), ".so")
    return CpuLibrary(entry.path, entry.meta, require_signature=True)


_cuda_programs: dict = {}


def cuda_program(func, arch: str | None = None):
    """The loaded GPU program for `func` (memory cache, then the disk cache, then compile;
    per IR hash and arch).

    Raises runtime.cuda.CudaUnavailable (a clear RlxError) when no GPU/driver is present,
    before anything is compiled."""
    from rlxc.runtime import cuda as rt

    ctx = rt.context(0)
    arch = arch or ctx.arch
    mkey = (func.ir_hash(), arch)
    prog = _cuda_programs.get(mkey)
    if prog is not None:
        STATS["memory_hits"] += 1
        return prog
    with _key_lock(("cuda",) + mkey):
        prog = _cuda_programs.get(mkey)
        if prog is not None:
            return prog
        key = cache.entry_key(func.ir_hash(), "cuda", arch, rt.FORMAT)
        prog = cache.load(key, "cuda", _open_cuda, _signature_check(func))
        if prog is not None:
            STATS["disk_hits"] += 1
        else:
            from rlxc.lowering.gpu.driver import compile_cuda

            with _compile_lock:
                art = compile_cuda(func.module, func.symbol, arch=arch)
            STATS["compiles"] += 1
            data = art.to_bytes()
            meta = {k: art.meta[k] for k in ("format", "name", "arch", "args", "outputs")}
            entry = cache.store(key, "cuda", lambda path: _write_file(path, data), meta,
                                ".rlxgpu")
            prog = _open_cuda(entry.path, entry.meta)
        _cuda_programs[mkey] = prog
        return prog


def _write_file(path: str, data: bytes) -> None:
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _open_cuda(path: str, meta: dict):
    """Load a cached GPU program container, cross-checked against the entry's metadata."""
    from rlxc.runtime import cuda as rt

    with open(path, "rb") as f:
        full, blobs = rt.load_artifact(f.read())
    for k in ("format", "name", "arch"):
        if full.get(k) != meta.get(k):
            raise ArtifactError(f"{path}: {k} {full.get(k)!r} differs from the cache "
                                f"entry's {meta.get(k)!r}")
    if cache.signature_digest(full) != cache.signature_digest(meta):
        raise ArtifactError(f"{path}: the program's signature differs from the cache entry's")
    return rt.CudaProgram(full, blobs)


def executor(func, device: str = "cpu", **options) -> CpuExecutor:
    """The CpuExecutor of `func`'s library (one per loaded library): `.run(arrays)` with
    every argument in signature order."""
    lib = library(func, device, **options)
    ex = _executors.get(id(lib))
    if ex is None or ex.lib is not lib:
        ex = _executors[id(lib)] = CpuExecutor(lib)
    return ex


def jit(func, device: str = "cpu", **options) -> "Jitted":
    """Compile (or fetch) `func` once and return a Jitted bound to its params."""
    return Jitted(func, library(func, device, **options))


class CudaJitted:
    """A GPU program with the Func's params bound (they stay resident on the device)."""

    def __init__(self, func, program):
        self.func, self.program = func, program

    def run(self, *args, **inputs) -> list:
        return self.program.run(self.func.bind_call(args, inputs, f"{self.func.name}.run"))

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
        # the common call (inputs by position, already as declared) as one generated
        # function (runtime/call.py fast_runner); None where it does not apply
        self._fast = fast_runner(self._caller, [(s[1], s[3]) for s in self._ins])

    def run(self, *args, **inputs) -> list:
        fast = self._fast
        if fast is not None and not inputs:
            outs = fast(args)
            if outs is not None:
                return outs
        if not inputs and self._bound and len(args) == len(self._ins):
            # the common call: every input by position, already as declared (the same
            # test as below; anything else takes the general path with its checks)
            for (_, shape, _, npdt), a in zip(self._ins, args):
                if not (type(a) is np.ndarray and a.dtype == npdt and a.shape == shape and
                        a.flags.c_contiguous):
                    break
            else:
                return self._caller.call(args)
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
        full = self.func.bind_call((), inputs, f"{self.func.name}.run")
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
           "STATS", "cache_dir", "clear_memory_cache", "compiler_fingerprint", "cache"]

"""Load a compiled artifact (`rlxc compile -o OUTDIR`) without the compiler.

Purpose
-------
`load(OUTDIR)` returns a `CompiledModule` whose `.run(**inputs)` calls the
native library through its C ABI (`NAME_create`, `NAME_run`, ...) and returns
a list of NumPy arrays, like `Func.run`.  The generated `import NAME` package
is a thin wrapper over the same object (one per artifact and process).  Only NumPy, ctypes and the standard library are
used: importing this module never imports xdsl or llvmlite.

Algorithm (check everything before handing the .so to the dynamic loader)
-------------------------------------------------------------------------
1. Find `NAME.json` in OUTDIR (or the one given), parse it and validate its
   schema field by field: format marker, ABI version, names/shapes/dtypes of
   every input, output and param, the library file name, size and sha256,
   the CPU features its code uses.
2. Compare the library's size with the JSON, check that its ELF header and
   every loadable segment lie inside the file, then hash it: a truncated,
   replaced or foreign `.so` is rejected here, before `dlopen` could crash
   the process (a truncated mapping dies of SIGBUS).
3. Compare the CPU features with this CPU's (runtime/cpufeatures.py): a
   library built for a newer CPU refuses, naming the missing features,
   instead of dying of SIGILL at its first call.
4. `dlopen` it, look up every ABI symbol, compare `NAME_abi_version()` with
   ours, ask the library's own cpuid check (`NAME_check_cpu`), and compare
   its metadata tables (counts, names, ranks, dims) with the JSON.  Any
   mismatch raises `ArtifactError`.
5. Create one C context per `CompiledModule` (its own workspace and params).
   Calls into the library release the GIL (ctypes), so two modules can run
   concurrently from two threads; calls on one module are serialized by a lock.

Dynamic dims: a JSON with "dims" (symbol names, which the inputs' and outputs'
shapes may use) describes ONE library for every size.  The loader checks its
NAME_num_dims / NAME_dim_name against the JSON and its shapes at two sample
sizes; each call binds the sizes from the arrays (runtime/dims.py: the checks
of Func.run), calls NAME_set_dims and sizes the outputs from them.

The JSON's `target` names a runtime target (runtime/targets.py); its family
picks the implementation from `_IMPLS` ("cpu": the C ABI above; "cuda": no C
library, its "library" is NAME.rlxcuda, runtime/cuda.py's container of PTX,
cubin and launch plan plus a "params" blob of the baked params, loaded on the
GPU, CudaUnavailable where there is none; steps 1-2, less the ELF check, are
the same).  A CPU-family artifact built for another machine (a cross target
such as aarch64-linux-gnu) is refused before any check that reads the library.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import math
import os
import re
import shutil
import struct
import tempfile
import threading
from dataclasses import dataclass

import numpy as np

from .cpufeatures import missing_features
from .dims import bind_sizes, label, resolve
from .errors import ArtifactError, NameLookupError, RlxError, ShapeError
from .signature import NP_DTYPES, coerce
from .targets import target as runtime_target
from .targets import target_names

ABI_VERSION = 2  # 2: NAME_check_cpu, RLX_ERR_CPU
ARTIFACT_FORMAT = "rlxc-artifact"

# C error codes (the same table is written into every NAME.h).
RLX_OK = 0
ERROR_CODES = {
    "RLX_ERR_NULL": 1,
    "RLX_ERR_UNKNOWN_NAME": 2,
    "RLX_ERR_COUNT": 3,
    "RLX_ERR_PARAM_UNSET": 4,
    "RLX_ERR_NOMEM": 5,
    "RLX_ERR_KERNEL": 6,
    "RLX_ERR_ARG": 7,
    "RLX_ERR_CPU": 8,
}
ERROR_DOCS = {
    "RLX_ERR_NULL": "a required pointer argument is NULL",
    "RLX_ERR_UNKNOWN_NAME": "no param with that name",
    "RLX_ERR_COUNT": "element count differs from the declared shape",
    "RLX_ERR_PARAM_UNSET": "a param was neither baked nor set",
    "RLX_ERR_NOMEM": "out of memory",
    "RLX_ERR_KERNEL": "the compiled code reported a failure (e.g. index out of range)",
    "RLX_ERR_ARG": "invalid argument value (lr < 0 or NaN; ABI/header mismatch)",
    "RLX_ERR_CPU": "this CPU lacks an instruction-set feature the library was built for",
}
_CODE_NAMES = {v: k for k, v in ERROR_CODES.items()}

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class TensorSpec:
    """One input, output or param of a compiled module."""

    name: str
    kind: str  # "input" | "output" | "param"
    shape: tuple
    dtype: str = "f32"
    baked: bool = False  # params only: data embedded in the library

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


# -- JSON schema ---------------------------------------------------------------
def _fail(path: str, msg: str):
    raise ArtifactError(f"{path}: {msg}")


def _req(d: dict, key: str, typ, path: str, where: str = ""):
    if key not in d:
        _fail(path, f"missing field {where}{key!r} (not an rlxc artifact, or a damaged one)")
    v = d[key]
    if typ is int and isinstance(v, bool) or not isinstance(v, typ):
        tn = typ.__name__ if isinstance(typ, type) else "/".join(t.__name__ for t in typ)
        _fail(path, f"field {where}{key!r} must be {tn}, got {type(v).__name__}")
    return v


def _tensor_list(meta: dict, key: str, kind: str, path: str) -> list[TensorSpec]:
    out = []
    syms = meta.get("dims") or []   # dynamic dims: a shape may name them (not params)
    for i, e in enumerate(_req(meta, key, list, path)):
        where = f"{key}[{i}]."
        if not isinstance(e, dict):
            _fail(path, f"{key}[{i}] must be an object")
        name = _req(e, "name", str, path, where)
        shape = _req(e, "shape", list, path, where)
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 or
                   kind != "param" and isinstance(d, str) and d in syms for d in shape):
            _fail(path, f"{where}shape must be a list of non-negative ints"
                        f"{' or dims ' + str(syms) if syms else ''}, got {shape}")
        dtype = _req(e, "dtype", str, path, where)
        if dtype not in NP_DTYPES:
            _fail(path, f"{where}dtype {dtype!r} is not one of {sorted(NP_DTYPES)}")
        baked = bool(e.get("baked", False))
        out.append(TensorSpec(name, kind, tuple(shape), dtype, baked))
    names = [t.name for t in out]
    if len(set(names)) != len(names):
        _fail(path, f"duplicate names in {key}: {names}")
    return out


def validate_metadata(meta, path: str = "<metadata>") -> dict:
    """Check an artifact's JSON object; returns it or raises ArtifactError."""
    if not isinstance(meta, dict):
        _fail(path, "top level must be a JSON object")
    fmt = meta.get("format")
    if fmt != ARTIFACT_FORMAT:
        _fail(path, f"not an rlxc artifact (format {fmt!r}, expected {ARTIFACT_FORMAT!r})")
    abi = _req(meta, "abi_version", int, path)
    if abi != ABI_VERSION:
        _fail(path, f"artifact ABI version {abi}, this runtime supports {ABI_VERSION}; "
                    "recompile it with this rlxc (`rlxc compile ...`)")
    name = _req(meta, "name", str, path)
    if not _IDENT.match(name):
        _fail(path, f"name {name!r} is not a C identifier")
    target = _req(meta, "target", str, path)
    if target not in target_names():
        _fail(path, f"target {target!r} is not one of {target_names()}")
    _req(meta, "rlxc_version", str, path)
    _req(meta, "ir_hash", str, path)
    lib = _req(meta, "library", str, path)
    if os.path.basename(lib) != lib or not lib:
        _fail(path, f"library {lib!r} must be a plain file name")
    sha = _req(meta, "library_sha256", str, path)
    if not _HEX64.match(sha):
        _fail(path, "library_sha256 must be 64 lowercase hex digits")
    if _req(meta, "library_size", int, path) < 0:
        _fail(path, "library_size must be >= 0")
    dims = meta.get("dims")
    if dims is not None and (not isinstance(dims, list) or not dims or len(set(dims)) != len(dims)
                             or not all(isinstance(d, str) and d for d in dims)):
        _fail(path, f"dims must be a list of distinct dimension names, got {dims!r}")
    feats = _req(meta, "cpu_features", list, path)
    if not all(isinstance(f, str) for f in feats):
        _fail(path, "cpu_features must be a list of strings")
    _tensor_list(meta, "inputs", "input", path)
    _tensor_list(meta, "outputs", "output", path)
    _tensor_list(meta, "params", "param", path)
    _IMPLS[runtime_target(target).family].validate(meta, path)
    train = meta.get("train")
    if train is not None:
        if not isinstance(train, dict):
            _fail(path, "train must be an object or null")
        _req(train, "optimizer", str, path, "train.")
        _req(train, "lr", (int, float), path, "train.")
    return meta


def find_metadata(outdir: str, name: str | None = None) -> str:
    """The path of NAME.json in `outdir` (the only artifact there when name is None)."""
    outdir = os.fspath(outdir)
    if os.path.isfile(outdir) and outdir.endswith(".json"):
        return outdir
    if not os.path.isdir(outdir):
        raise ArtifactError(f"artifact directory {outdir!r} does not exist")
    if name is not None:
        p = os.path.join(outdir, f"{name}.json")
        if not os.path.isfile(p):
            raise ArtifactError(f"{outdir!r} holds no artifact named {name!r} "
                                f"({name}.json missing)")
        return p
    cands = sorted(f for f in os.listdir(outdir) if f.endswith(".json")
                   and os.path.isfile(os.path.join(outdir, f"lib{f[:-5]}.so")))
    if not cands:
        cands = sorted(f for f in os.listdir(outdir) if f.endswith(".json"))
    if len(cands) != 1:
        raise ArtifactError(f"{outdir!r}: expected one NAME.json next to libNAME.so, found "
                            f"{cands or 'none'}; pass name=")
    return os.path.join(outdir, cands[0])


def read_metadata(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ArtifactError(f"cannot read {path!r}: {e}") from None
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ArtifactError(f"{path}: not valid JSON (truncated or foreign file?): {e}") from None
    return validate_metadata(meta, path)


def check_elf(path: str, size: int) -> None:
    """Raise ArtifactError unless `path` is a 64-bit little-endian ELF shared object whose
    header tables and loadable segments all lie within its `size` bytes."""
    with open(path, "rb") as f:
        hdr = f.read(64)
        if len(hdr) < 64 or hdr[:4] != b"\x7fELF":
            _fail(path, "not an ELF file (truncated or foreign)")
        if hdr[4] != 2 or hdr[5] != 1 or struct.unpack_from("<H", hdr, 16)[0] != 3:
            _fail(path, "not a 64-bit little-endian ELF shared object")
        phoff, shoff = struct.unpack_from("<QQ", hdr, 32)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", hdr, 54)
        if phentsize != 56 or phoff + phnum * phentsize > size or \
                (shnum and shoff + shnum * shentsize > size):
            _fail(path, f"ELF header tables extend past the end of the file ({size} bytes): "
                        "truncated")
        f.seek(phoff)
        table = f.read(phnum * phentsize)
    for i in range(phnum):
        ptype, _, off, _, _, filesz = struct.unpack_from("<IIQQQQ", table, i * phentsize)
        if ptype == 1 and off + filesz > size:  # PT_LOAD
            _fail(path, f"loadable segment {i} ends at byte {off + filesz}, past the end of "
                        f"the file ({size} bytes): truncated")


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# -- the C library ---------------------------------------------------------------
_P = ctypes.c_void_p
_SIGS = {  # symbol suffix -> (restype, argtypes)
    "abi_version": (ctypes.c_uint32, []),
    "ir_hash": (ctypes.c_char_p, []),
    "create": (_P, []),
    "destroy": (None, [_P]),
    "run": (ctypes.c_int, [_P, _P, _P]),
    "last_error": (ctypes.c_char_p, [_P]),
    "set_param": (ctypes.c_int, [_P, ctypes.c_char_p, _P, ctypes.c_size_t]),
    "get_param": (ctypes.c_int, [_P, ctypes.c_char_p, _P, ctypes.c_size_t]),
    "param_is_set": (ctypes.c_int, [_P, ctypes.c_int]),
    "set_num_threads": (None, [ctypes.c_int]),
    "check_cpu": (ctypes.c_int, []),
    "num_inputs": (ctypes.c_int, []),
    "num_outputs": (ctypes.c_int, []),
    "num_params": (ctypes.c_int, []),
}
for _k in ("input", "output", "param"):
    _SIGS[f"{_k}_name"] = (ctypes.c_char_p, [ctypes.c_int])
    _SIGS[f"{_k}_dtype"] = (ctypes.c_char_p, [ctypes.c_int])
    _SIGS[f"{_k}_rank"] = (ctypes.c_int, [ctypes.c_int])
    _SIGS[f"{_k}_shape"] = (ctypes.POINTER(ctypes.c_int64), [ctypes.c_int])
_TRAIN_SIG = (ctypes.c_int, [_P, _P, ctypes.c_float, ctypes.POINTER(ctypes.c_float)])


_DYN_SIGS = {  # a library for every size (lowering/artifact/dynglue.py)
    "set_dims": (ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_int64)]),
    "num_dims": (ctypes.c_int, []),
    "dim_name": (ctypes.c_char_p, [ctypes.c_int]),
    "input_shape": (ctypes.POINTER(ctypes.c_int64), [_P, ctypes.c_int]),
    "output_shape": (ctypes.POINTER(ctypes.c_int64), [_P, ctypes.c_int]),
    "input_numel": (ctypes.c_int64, [_P, ctypes.c_int]),
    "output_numel": (ctypes.c_int64, [_P, ctypes.c_int]),
}


def _bind(lib, name: str, path: str, train: bool, dynamic: bool = False):
    fns = {}
    sigs = dict(_SIGS)
    if dynamic:
        sigs.update(_DYN_SIGS)
    if train:
        sigs["train_step"] = _TRAIN_SIG
    for suffix, (res, args) in sigs.items():
        try:
            fn = getattr(lib, f"{name}_{suffix}")
        except AttributeError:
            raise ArtifactError(f"{path}: symbol {name}_{suffix} missing (foreign library, or "
                                "one built by another rlxc)") from None
        fn.restype, fn.argtypes = res, args
        fns[suffix] = fn
    return fns


def _check_tables(fns, specs: dict, path: str, ctx=None, env=None) -> None:
    """The library's tables against the JSON; a dynamic library (ctx, env: sizes just
    set on ctx) is compared at those sizes."""
    for kind, lst in specs.items():
        n = fns[f"num_{kind}s"]()
        if n != len(lst):
            raise ArtifactError(f"{path}: library has {n} {kind}s, the JSON {len(lst)}")
        for i, t in enumerate(lst):
            got_name = (fns[f"{kind}_name"](i) or b"").decode()
            rank = fns[f"{kind}_rank"](i)
            dyn = env is not None and kind != "param"
            dims = fns[f"{kind}_shape"](ctx, i) if dyn else fns[f"{kind}_shape"](i)
            if dyn and not dims and rank > 0:
                raise ArtifactError(f"{path}: {kind} #{i} has no shape after set_dims")
            want = resolve(t.shape, env) if dyn else t.shape
            shape = tuple(dims[j] for j in range(rank)) if rank > 0 else ()
            dtype = (fns[f"{kind}_dtype"](i) or b"").decode()
            if (got_name, shape, dtype) != (t.name, want, t.dtype):
                raise ArtifactError(f"{path}: {kind} #{i} is {got_name!r} {shape} {dtype} in the "
                                    f"library but {t.name!r} {want} {t.dtype} in the JSON")


def _error_for(code: int, msg: str) -> Exception:
    kind = _CODE_NAMES.get(code, f"error {code}")
    if code == ERROR_CODES["RLX_ERR_KERNEL"]:
        return IndexError(msg)  # the kernels' only failure: an index out of range
    if code in (ERROR_CODES["RLX_ERR_UNKNOWN_NAME"], ERROR_CODES["RLX_ERR_PARAM_UNSET"]):
        return NameLookupError(msg)
    if code == ERROR_CODES["RLX_ERR_COUNT"]:
        return ShapeError(msg)
    return RlxError(f"{kind}: {msg}")


_LOADED: dict[str, str] = {}  # real path -> sha256 of the library dlopen'ed from it
_LOADED_LOCK = threading.Lock()


def _dlopen(lib_path: str, sha: str) -> ctypes.CDLL:
    """dlopen `lib_path`; if this process already loaded *another* build from the same path
    (dlopen would hand back the old code), load a private copy of the new file instead."""
    real = os.path.realpath(lib_path)
    with _LOADED_LOCK:
        prev = _LOADED.setdefault(real, sha)
    path = lib_path
    if prev != sha:
        d = tempfile.mkdtemp(prefix="rlxc-load-")
        path = os.path.join(d, f"{sha[:16]}-{os.path.basename(lib_path)}")
        shutil.copyfile(lib_path, path)
        if sha256_file(path) != sha:
            raise ArtifactError(f"{lib_path}: changed while loading it")
    try:
        return ctypes.CDLL(path)
    except OSError as e:
        raise ArtifactError(f"cannot load {lib_path!r}: {e}") from None
    finally:
        if path != lib_path:  # the mapping stays valid once unlinked
            shutil.rmtree(os.path.dirname(path), ignore_errors=True)


class _CpuImpl:
    """The C ABI of libNAME.so: one context (workspace + params) per loaded module."""

    @staticmethod
    def validate(meta: dict, path: str) -> None:
        """Family-specific JSON fields (none beyond the common schema)."""

    def __init__(self, mod: "CompiledModule", lib_path: str):
        name = mod.name
        why = runtime_target(mod.target).unavailable_reason()
        if why:  # e.g. a cross-compiled library: dlopen would fail or crash
            raise ArtifactError(f"{lib_path}: cannot run here: {why}")
        self.lib = _dlopen(lib_path, mod.metadata["library_sha256"])
        try:  # the ABI version first: it is the one symbol every version keeps
            abi_fn = getattr(self.lib, f"{name}_abi_version")
        except AttributeError:
            raise ArtifactError(f"{lib_path}: symbol {name}_abi_version missing (not an "
                                "rlxc library, or one of another model)") from None
        abi_fn.restype, abi_fn.argtypes = ctypes.c_uint32, []
        abi = abi_fn()
        if abi != ABI_VERSION:
            raise ArtifactError(f"{lib_path}: library ABI version {abi}, this runtime supports "
                                f"{ABI_VERSION}; recompile it")
        self.dims = list(mod.dims)
        self.fns = _bind(self.lib, name, lib_path, mod.trainable, bool(self.dims))
        if self.fns["check_cpu"]() != RLX_OK:
            msg = (self.fns["last_error"](None) or b"").decode(errors="replace")
            raise ArtifactError(f"{lib_path}: {msg}")
        ir = (self.fns["ir_hash"]() or b"").decode(errors="replace")
        if ir != mod.metadata["ir_hash"]:
            raise ArtifactError(f"{lib_path}: library built from IR {ir[:16]}..., the JSON "
                                f"describes {mod.metadata['ir_hash'][:16]}...; recompile it")
        if not self.dims:
            _check_tables(self.fns, {"input": mod.inputs, "output": mod.outputs,
                                     "param": mod.params}, lib_path)
        threads = os.environ.get("RLXC_NUM_THREADS", "").strip()
        if threads.isdigit():
            self.fns["set_num_threads"](int(threads))
        self.lock = threading.Lock()
        self.ctx = self.fns["create"]()
        if not self.ctx:
            msg = (self.fns["last_error"](None) or b"").decode(errors="replace")
            raise MemoryError(f"{name}_create() failed: {msg or 'out of memory'}")
        self._destroy = self.fns["destroy"]
        if self.dims:   # names in order, and the shapes at two sizes per dim
            got = [(self.fns["dim_name"](j) or b"").decode() for j in
                   range(self.fns["num_dims"]())]
            if got != [label(d) for d in self.dims] and got != self.dims:   # (older: "?1")
                raise ArtifactError(f"{lib_path}: library has dims {got}, the JSON {self.dims}")
            for base in (2, 5):
                env = {d: base + j for j, d in enumerate(self.dims)}
                self._check(self._set_dims(env))
                _check_tables(self.fns, {"input": mod.inputs, "output": mod.outputs,
                                         "param": mod.params}, lib_path, self.ctx, env)

    def __del__(self):
        ctx, self.ctx = getattr(self, "ctx", None), None
        if ctx:
            self._destroy(ctx)

    def _check(self, rc: int) -> None:
        if rc:
            msg = (self.fns["last_error"](self.ctx) or b"").decode(errors="replace")
            raise _error_for(rc, msg)

    @staticmethod
    def _ptrs(arrays):
        return (ctypes.c_void_p * max(1, len(arrays)))(*[a.ctypes.data for a in arrays])

    def is_set(self, i: int) -> bool:
        with self.lock:
            return bool(self.fns["param_is_set"](self.ctx, i))

    def set_param(self, i: int, t: TensorSpec, a: np.ndarray) -> None:
        with self.lock:
            self._check(self.fns["set_param"](self.ctx, t.name.encode(), a.ctypes.data, a.size))

    def get_param(self, i: int, t: TensorSpec) -> np.ndarray:
        out = np.empty(t.shape, NP_DTYPES[t.dtype])
        with self.lock:
            self._check(self.fns["get_param"](self.ctx, t.name.encode(), out.ctypes.data,
                                              out.size))
        return out

    def _set_dims(self, env: dict) -> int:
        sizes = (ctypes.c_int64 * len(self.dims))(*[env[d] for d in self.dims])
        return self.fns["set_dims"](self.ctx, sizes)

    def run(self, arrays: list, outs: list, env: dict | None = None) -> list:
        with self.lock:
            if env is not None:   # a library for every size: this call's sizes first
                self._check(self._set_dims(env))
            self._check(self.fns["run"](self.ctx, self._ptrs(arrays), self._ptrs(outs)))
        return outs

    def train_step(self, arrays: list, lr: float, env: dict | None = None) -> float:
        loss = ctypes.c_float()
        with self.lock:
            if env is not None:
                self._check(self._set_dims(env))
            self._check(self.fns["train_step"](self.ctx, self._ptrs(arrays), lr,
                                               ctypes.byref(loss)))
        return float(loss.value)


class _CudaImpl:
    """A CUDA artifact (runtime/cuda.py's container) run through the driver API."""

    @staticmethod
    def validate(meta: dict, path: str) -> None:
        cp = meta.get("cuda_params") or {}
        if not isinstance(cp, dict) or not all(
                isinstance(v, list) and len(v) == 2 and all(
                    isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)
                for v in cp.values()):
            _fail(path, "cuda_params must map param names to [offset, nbytes]")

    def __init__(self, mod: "CompiledModule", path: str):
        from . import cuda

        with open(path, "rb") as f:
            data = f.read()
        meta, blobs = cuda.load_artifact(data)
        self.mod = mod
        self.args = meta["args"]
        self.program = cuda.CudaProgram(meta, blobs)  # CudaUnavailable without a GPU
        self.values: dict = {}
        offsets = mod.metadata.get("cuda_params") or {}
        blob = blobs.get("params", b"")
        for t in mod.params:
            if t.name in offsets:
                off, nbytes = offsets[t.name]
                if nbytes != t.numel * np.dtype(NP_DTYPES[t.dtype]).itemsize or \
                        off + nbytes > len(blob):
                    raise ArtifactError(f"{path}: baked param {t.name!r} does not fit the "
                                        "params blob (truncated artifact?)")
                a = np.frombuffer(blob, NP_DTYPES[t.dtype], t.numel, off).reshape(t.shape)
                self.values[t.name] = a
        self.lock = threading.Lock()

    def is_set(self, i: int) -> bool:
        return self.mod.params[i].name in self.values

    def set_param(self, i: int, t: TensorSpec, a: np.ndarray) -> None:
        a = a.copy()
        a.flags.writeable = False
        self.values[t.name] = a

    def get_param(self, i: int, t: TensorSpec) -> np.ndarray:
        if t.name not in self.values:
            raise NameLookupError(f"get_param: param {t.name!r} is not set")
        return np.array(self.values[t.name])

    def run(self, arrays: list, outs: list) -> list:
        by_name = dict(zip((t.name for t in self.mod.inputs), arrays))
        args = []
        for a in self.args:
            if a["kind"] == "input":
                args.append(by_name[a["name"]])
            elif a["name"] in self.values:
                args.append(self.values[a["name"]])
            else:
                raise NameLookupError(f"param {a['name']!r} is not set: call set_param")
        with self.lock:
            return self.program.run(args)

    def train_step(self, arrays, lr):  # pragma: no cover - rejected at compile time
        raise RlxError("train_step needs a cpu artifact")


# runtime family (runtime/targets.py) -> the implementation that loads and calls it
_IMPLS = {"cpu": _CpuImpl, "cuda": _CudaImpl}


class CompiledModule:
    """A loaded artifact: `.run(**inputs)`, `.set_param`, `.get_param`, metadata.

    Attributes: `name`, `target`, `metadata` (the JSON dict), `inputs`,
    `outputs`, `params` (lists of TensorSpec), `path` (the artifact directory)."""

    def __init__(self, json_path: str):
        meta = read_metadata(json_path)
        self.path = os.path.dirname(os.path.abspath(json_path))
        self.metadata = meta
        self.name: str = meta["name"]
        self.target: str = meta["target"]
        self.inputs = _tensor_list(meta, "inputs", "input", json_path)
        self.outputs = _tensor_list(meta, "outputs", "output", json_path)
        self.params = _tensor_list(meta, "params", "param", json_path)
        self.trainable = meta.get("train") is not None
        self.dims = list(meta.get("dims") or [])   # dynamic dims: one library, any size
        if self.dims and runtime_target(self.target).family != "cpu":
            raise ArtifactError(f"{json_path}: dynamic dims need a cpu artifact")
        lib_path = os.path.join(self.path, meta["library"])
        if not os.path.isfile(lib_path):
            raise ArtifactError(f"{json_path}: library {lib_path!r} is missing")
        rt = runtime_target(self.target)
        if rt.family == "cpu" and rt.machines and rt.unavailable_reason():
            # a cross-compiled library (--target aarch64-linux-gnu): dlopen would fail
            raise ArtifactError(f"{lib_path}: cannot run here: {rt.unavailable_reason()}")
        size = os.path.getsize(lib_path)
        if size != meta["library_size"]:
            raise ArtifactError(f"{lib_path}: {size} bytes, the JSON records "
                                f"{meta['library_size']}: truncated, modified or from another "
                                "build; recompile it")
        if rt.family == "cpu":
            check_elf(lib_path, size)
        digest = sha256_file(lib_path)
        if digest != meta["library_sha256"]:
            raise ArtifactError(f"{lib_path}: sha256 {digest[:16]}... does not match the JSON "
                                f"({meta['library_sha256'][:16]}...): truncated, modified or "
                                "from another build; recompile it")
        missing = missing_features(meta["cpu_features"])
        if missing:
            raise ArtifactError(f"{lib_path}: built for CPU {meta.get('cpu_name') or meta['cpu']} "
                                f"and uses {', '.join(missing)}, which this CPU lacks; rebuild "
                                "it with rlxc compile --cpu native (or --cpu portable)")
        self._impl = _IMPLS[runtime_target(self.target).family](self, lib_path)

    # -- metadata ------------------------------------------------------------
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    def param_names(self) -> list[str]:
        return [t.name for t in self.params]

    def output_count(self) -> int:
        return len(self.outputs)

    def output_shapes(self) -> list[tuple]:
        return [t.shape for t in self.outputs]

    def _param(self, name: str) -> tuple[int, TensorSpec]:
        for i, t in enumerate(self.params):
            if t.name == name:
                return i, t
        raise NameLookupError(f"{self.name}: unknown param {name!r}; valid params: "
                              f"{self.param_names()}")

    def unset_params(self) -> list[str]:
        """Params that are neither baked nor set (run fails until they are)."""
        return [t.name for i, t in enumerate(self.params) if not self._impl.is_set(i)]

    # -- calls ---------------------------------------------------------------
    def set_param(self, name: str, data) -> None:
        """Copy `data` (the declared shape, or flat) into this module's param `name`."""
        i, t = self._param(name)
        self._impl.set_param(i, t, coerce("param", name, data, t.shape, t.dtype))

    def set_params(self, params: dict) -> None:
        """set_param for each entry; every name, shape and dtype is checked first, so a bad
        entry leaves all params as they were."""
        ready = []
        for k, v in params.items():
            i, t = self._param(k)
            ready.append((i, t, coerce("param", k, v, t.shape, t.dtype)))
        for i, t, a in ready:
            self._impl.set_param(i, t, a)

    def get_param(self, name: str) -> np.ndarray:
        """A copy of param `name` as held by this module (after training steps, too)."""
        i, t = self._param(name)
        return self._impl.get_param(i, t)

    def _inputs(self, args, inputs: dict, what: str) -> list[np.ndarray]:
        if args:
            if len(args) != 1 or not isinstance(args[0], dict):
                raise TypeError(f"{what}: pass inputs by name, run(x=...) or run({{'x': ...}})")
            inputs = {**args[0], **inputs}
        valid = self.input_names()
        for k in inputs:
            if k not in valid:
                hint = (" (params are set with set_param)" if k in self.param_names() else "")
                raise NameLookupError(f"{what}: unknown input {k!r}{hint}; valid inputs: {valid}")
        missing = [n for n in valid if n not in inputs]
        if missing:
            raise NameLookupError(f"{what}: missing input {missing[0]!r}; expected inputs: "
                                  f"{valid}, missing: {missing}")
        return [coerce("input", t.name, inputs[t.name], t.shape, t.dtype) for t in self.inputs]

    def _sizes(self, arrays: list, what: str) -> dict | None:
        """Each dynamic dim's size in this call (every use agrees, >= 1), or None."""
        if not self.dims:
            return None
        return bind_sizes(self.inputs, [a.shape for a in arrays], what)

    def run(self, *args, **inputs) -> list[np.ndarray]:
        """Run the compiled function; returns a list of arrays shaped like the outputs.
        With dynamic dims, any size >= 1 (the same checks as Func.run)."""
        arrays = self._inputs(args, inputs, f"{self.name}.run")
        env = self._sizes(arrays, f"{self.name}.run")
        if env is None:
            outs = [np.empty(t.shape, NP_DTYPES[t.dtype]) for t in self.outputs]
            return self._impl.run(arrays, outs)
        outs = [np.empty(resolve(t.shape, env), NP_DTYPES[t.dtype]) for t in self.outputs]
        return self._impl.run(arrays, outs, env)

    def train_step(self, *args, lr: float | None = None, **inputs) -> float:
        """One optimizer step on the params held by this module; returns the loss
        (of the params before the update).  `lr` defaults to the compiled one."""
        if not self.trainable:
            raise RlxError(f"{self.name} was compiled without --train; no train_step")
        lr = float(self.metadata["train"]["lr"] if lr is None else lr)
        arrays = self._inputs(args, inputs, f"{self.name}.train_step")
        env = self._sizes(arrays, f"{self.name}.train_step")
        if env is None:
            return self._impl.train_step(arrays, lr)
        return self._impl.train_step(arrays, lr, env)

    def __repr__(self):
        sig = ", ".join([f"input {t.name}: {t.shape}" for t in self.inputs]
                        + [f"param {t.name}: {t.shape}" for t in self.params])
        return f"CompiledModule({self.name!r}, {self.target}, [{sig}], " \
               f"outputs={len(self.outputs)})"


_SHARED: dict[str, CompiledModule] = {}  # real path of NAME.json -> the module loaded from it
_SHARED_LOCK = threading.Lock()


def load(outdir, name: str | None = None, *, new: bool = False) -> CompiledModule:
    """Load the artifact in `outdir` (a directory written by `rlxc compile -o`, or
    its NAME.json).  Raises ArtifactError for anything missing, damaged or foreign.

    Like `import NAME`, it gives one module per artifact and process: the same
    object as the package's `NAME.module` (same params, same context), until
    the artifact is rebuilt.  `new=True` gives a module of its own (a fresh
    context: params set on it do not show elsewhere)."""
    path = find_metadata(outdir, name)
    if new:
        return CompiledModule(path)
    key = os.path.realpath(path)
    with _SHARED_LOCK:
        mod = _SHARED.get(key)
        if mod is not None and read_metadata(path)["library_sha256"] == \
                mod.metadata["library_sha256"]:
            return mod
        mod = _SHARED[key] = CompiledModule(path)
        return mod

"""CUDA driver API through ctypes, and the loader/executor of compiled GPU programs.

    libcuda.so.1 (ctypes; NumPy + stdlib only — never the compiler)
      Driver       every cu* call checked: a failure raises CudaError carrying the
                   driver's error name and string (cuGetErrorName/String)
      Context      primary context of a device, made current per call
      CudaProgram  an artifact (meta JSON + blobs) loaded on a device:
                     module  cubin when it fits the device, else PTX (driver JIT)
                     memory  one allocation per region: input | param | const | work;
                             buffer = region base + offset (from the buffer plan)
                     params  resident: uploaded when first seen or changed
                     run(args) → H2D inputs, launch plan (memset / cuLaunchKernel with
                             pre-packed argument arrays) on one stream, D2H outputs
      available() / unavailable_reason(): no libcuda or no device is a clear
                   CudaUnavailable, never a crash

The artifact container (`dump_artifact`/`load_artifact`): b"RLXCUDA1", a u32
length, the JSON meta (with a "blobs" table of [offset, size]), then the blob
bytes (ptx, cubin, consts).  Kernel arguments are packed as the driver wants
them: an array of void* pointing at one ctypes value per argument
(`pack_args`); device pointers are u64.
"""
from __future__ import annotations

import ctypes
import json
import os
import struct
import threading

import numpy as np

from . import cuda_steps
from .errors import ArtifactError, NameLookupError, RlxError
from .signature import NP_DTYPES, coerce

__all__ = ["CudaError", "CudaUnavailable", "available", "unavailable_reason", "driver",
           "Driver", "Context", "context", "CudaProgram", "pack_args", "dump_artifact",
           "load_artifact", "DeviceBuffer", "arch_fits", "LoadedProgram"]


class CudaUnavailable(RlxError, RuntimeError):
    """No CUDA driver library or no CUDA device on this machine."""


class CudaError(RlxError, RuntimeError):
    """A CUDA driver call failed: `.code`, `.name` (CUDA_ERROR_...), `.call`."""

    def __init__(self, code: int, name: str, message: str, call: str):
        self.code, self.name, self.message, self.call = code, name, message, call
        super().__init__(f"{call} failed: {name} ({code}): {message}")


# ---------------------------------------------------------------- the library

_P = ctypes.POINTER
_u64, _i32, _u32, _vp = ctypes.c_uint64, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p
_SIGS = {
    "cuInit": [_u32],
    "cuDriverGetVersion": [_P(_i32)],
    "cuDeviceGetCount": [_P(_i32)],
    "cuDeviceGet": [_P(_i32), _i32],
    "cuDeviceGetName": [ctypes.c_char_p, _i32, _i32],
    "cuDeviceGetAttribute": [_P(_i32), _i32, _i32],
    "cuDeviceTotalMem_v2": [_P(ctypes.c_size_t), _i32],
    "cuDevicePrimaryCtxRetain": [_P(_vp), _i32],
    "cuDevicePrimaryCtxRelease_v2": [_i32],
    "cuCtxSetCurrent": [_vp],
    "cuCtxSynchronize": [],
    "cuMemAlloc_v2": [_P(_u64), ctypes.c_size_t],
    "cuMemFree_v2": [_u64],
    "cuMemAllocHost_v2": [_P(_vp), ctypes.c_size_t],
    "cuMemFreeHost": [_vp],
    "cuMemGetInfo_v2": [_P(ctypes.c_size_t), _P(ctypes.c_size_t)],
    "cuMemcpyHtoD_v2": [_u64, _vp, ctypes.c_size_t],
    "cuMemcpyDtoH_v2": [_vp, _u64, ctypes.c_size_t],
    "cuMemcpyHtoDAsync_v2": [_u64, _vp, ctypes.c_size_t, _vp],
    "cuMemcpyDtoHAsync_v2": [_vp, _u64, ctypes.c_size_t, _vp],
    "cuMemcpyDtoDAsync_v2": [_u64, _u64, ctypes.c_size_t, _vp],
    "cuMemsetD8Async": [_u64, ctypes.c_ubyte, ctypes.c_size_t, _vp],
    "cuModuleLoadDataEx": [_P(_vp), _vp, _u32, _P(_i32), _P(_vp)],
    "cuModuleUnload": [_vp],
    "cuModuleGetFunction": [_P(_vp), _vp, ctypes.c_char_p],
    "cuFuncGetAttribute": [_P(_i32), _i32, _vp],
    "cuFuncSetAttribute": [_vp, _i32, _i32],
    "cuLaunchKernel": [_vp, _u32, _u32, _u32, _u32, _u32, _u32, _u32, _vp, _P(_vp), _P(_vp)],
    "cuStreamCreate": [_P(_vp), _u32],
    "cuStreamSynchronize": [_vp],
    "cuStreamDestroy_v2": [_vp],
    "cuEventCreate": [_P(_vp), _u32],
    "cuEventRecord": [_vp, _vp],
    "cuEventSynchronize": [_vp],
    "cuEventElapsedTime": [_P(ctypes.c_float), _vp, _vp],
    "cuEventDestroy_v2": [_vp],
    "cuGetErrorName": [_i32, _P(ctypes.c_char_p)],
    "cuGetErrorString": [_i32, _P(ctypes.c_char_p)],
}

# CUdevice_attribute / CUjit_option / CUfunction_attribute values used here
ATTR_CC_MAJOR, ATTR_CC_MINOR, ATTR_SM_COUNT = 75, 76, 16
JIT_INFO_LOG, JIT_INFO_LOG_SIZE, JIT_ERROR_LOG, JIT_ERROR_LOG_SIZE = 3, 4, 5, 6
FUNC_NUM_REGS, FUNC_MAX_DYNAMIC_SMEM = 4, 8

_lock = threading.Lock()
_state: dict = {}


def _load_library():
    """(ctypes lib, None) or (None, reason)."""
    name = os.environ.get("RLXC_LIBCUDA", "libcuda.so.1")
    try:
        lib = ctypes.CDLL(name)
    except OSError as e:
        return None, f"cannot load the CUDA driver library {name!r} ({e}); " \
                     "is an NVIDIA driver installed?"
    for fname, argtypes in _SIGS.items():
        fn = getattr(lib, fname, None)
        if fn is None:
            if fname in ("cuInit", "cuDeviceGetCount", "cuGetErrorName"):
                return None, f"{name} lacks {fname}: not a CUDA driver library"
            continue
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int
    return lib, None


def _probe():
    """Load the library, cuInit and count devices once; remember the outcome."""
    with _lock:
        if "probed" in _state:
            return
        _state["probed"] = True
        lib, why = _load_library()
        if lib is None:
            _state["reason"] = why
            return
        drv = Driver(lib)
        try:
            drv.call("cuInit", 0)
            n = drv.device_count()
        except CudaError as e:
            _state["reason"] = f"the CUDA driver did not initialize: {e}"
            return
        if n < 1:
            _state["reason"] = "the CUDA driver reports no CUDA device"
            return
        _state["driver"] = drv


def available() -> bool:
    """True when libcuda loads, initializes and sees at least one device."""
    _probe()
    return "driver" in _state


def unavailable_reason() -> str | None:
    """Why CUDA is unavailable (None when it is available)."""
    _probe()
    return _state.get("reason")


def driver() -> "Driver":
    """The process's initialized Driver; raises CudaUnavailable (with the reason)."""
    if not available():
        raise CudaUnavailable(f"CUDA is not available: {unavailable_reason()}")
    return _state["driver"]


class Driver:
    """Checked wrappers over the driver API (one method per call the runtime needs).

    Anything with the same methods (tests use a fake) can stand in for it."""

    def __init__(self, lib):
        self.lib = lib

    def _error(self, rc: int, call: str) -> CudaError:
        name, msg = ctypes.c_char_p(), ctypes.c_char_p()
        try:
            if self.lib.cuGetErrorName(rc, ctypes.byref(name)) != 0 or not name.value:
                name.value = b"CUDA_ERROR_UNKNOWN"
            if self.lib.cuGetErrorString(rc, ctypes.byref(msg)) != 0 or not msg.value:
                msg.value = b"unknown error"
            return CudaError(rc, name.value.decode(), msg.value.decode(), call)
        except Exception:  # noqa: BLE001 - the error path must not raise something else
            return CudaError(rc, "CUDA_ERROR_UNKNOWN", "unknown error", call)

    def call(self, fname: str, *args) -> None:
        fn = getattr(self.lib, fname, None)
        if fn is None:
            raise CudaUnavailable(f"the CUDA driver library has no {fname}")
        rc = fn(*args)
        if rc != 0:
            raise self._error(int(rc), fname)

    # -- devices and contexts
    def driver_version(self) -> int:
        v = _i32()
        self.call("cuDriverGetVersion", ctypes.byref(v))
        return v.value

    def device_count(self) -> int:
        n = _i32()
        self.call("cuDeviceGetCount", ctypes.byref(n))
        return n.value

    def device(self, ordinal: int) -> int:
        d = _i32()
        self.call("cuDeviceGet", ctypes.byref(d), int(ordinal))
        return d.value

    def device_name(self, dev: int) -> str:
        buf = ctypes.create_string_buffer(256)
        self.call("cuDeviceGetName", buf, 256, dev)
        return buf.value.decode(errors="replace")

    def attribute(self, dev: int, attr: int) -> int:
        v = _i32()
        self.call("cuDeviceGetAttribute", ctypes.byref(v), attr, dev)
        return v.value

    def compute_capability(self, dev: int) -> tuple[int, int]:
        return self.attribute(dev, ATTR_CC_MAJOR), self.attribute(dev, ATTR_CC_MINOR)

    def total_memory(self, dev: int) -> int:
        v = ctypes.c_size_t()
        self.call("cuDeviceTotalMem_v2", ctypes.byref(v), dev)
        return v.value

    def primary_context(self, dev: int) -> int:
        c = _vp()
        self.call("cuDevicePrimaryCtxRetain", ctypes.byref(c), dev)
        return c.value

    def set_current(self, ctx: int) -> None:
        self.call("cuCtxSetCurrent", ctx)

    def synchronize(self) -> None:
        self.call("cuCtxSynchronize")

    # -- memory
    def mem_alloc(self, nbytes: int) -> int:
        p = _u64()
        self.call("cuMemAlloc_v2", ctypes.byref(p), max(1, int(nbytes)))
        return p.value

    def mem_free(self, ptr: int) -> None:
        self.call("cuMemFree_v2", ptr)

    def host_alloc(self, nbytes: int) -> int:
        p = _vp()
        self.call("cuMemAllocHost_v2", ctypes.byref(p), max(1, int(nbytes)))
        return p.value

    def host_free(self, ptr: int) -> None:
        self.call("cuMemFreeHost", ptr)

    def memcpy_htod(self, dst: int, src: int, nbytes: int, stream=None) -> None:
        if stream is None:
            self.call("cuMemcpyHtoD_v2", dst, src, nbytes)
        else:
            self.call("cuMemcpyHtoDAsync_v2", dst, src, nbytes, stream)

    def memcpy_dtoh(self, dst: int, src: int, nbytes: int, stream=None) -> None:
        if stream is None:
            self.call("cuMemcpyDtoH_v2", dst, src, nbytes)
        else:
            self.call("cuMemcpyDtoHAsync_v2", dst, src, nbytes, stream)

    def memset(self, dst: int, value: int, nbytes: int, stream=None) -> None:
        self.call("cuMemsetD8Async", dst, value, nbytes, stream)

    def memcpy_dtod(self, dst: int, src: int, nbytes: int, stream=None) -> None:
        self.call("cuMemcpyDtoDAsync_v2", dst, src, nbytes, stream)

    # -- modules and launches
    def module_load(self, image: bytes) -> int:
        """Load a cubin, or PTX (NUL-terminated; the driver JITs it; its log is in errors)."""
        mod = _vp()
        size = 1 << 16
        err = ctypes.create_string_buffer(size)
        info = ctypes.create_string_buffer(size)
        opts = (_i32 * 4)(JIT_ERROR_LOG, JIT_ERROR_LOG_SIZE, JIT_INFO_LOG, JIT_INFO_LOG_SIZE)
        vals = (_vp * 4)(ctypes.cast(err, _vp), _vp(size), ctypes.cast(info, _vp), _vp(size))
        data = ctypes.create_string_buffer(bytes(image) + b"\0")
        try:
            self.call("cuModuleLoadDataEx", ctypes.byref(mod), ctypes.cast(data, _vp), 4,
                      opts, vals)
        except CudaError as e:
            log = err.value.decode(errors="replace").strip()
            if log:
                e.args = (f"{e.args[0]}\nJIT log:\n{log}",)
            raise
        return mod.value

    def module_unload(self, mod: int) -> None:
        self.call("cuModuleUnload", mod)

    def function(self, mod: int, name: str) -> int:
        f = _vp()
        self.call("cuModuleGetFunction", ctypes.byref(f), mod, name.encode())
        return f.value

    def function_attribute(self, fn: int, attr: int) -> int:
        v = _i32()
        self.call("cuFuncGetAttribute", ctypes.byref(v), attr, fn)
        return v.value

    def launch(self, fn: int, grid, block, smem: int, stream, params) -> None:
        gx, gy, gz = (list(grid) + [1, 1])[:3]
        bx, by, bz = (list(block) + [1, 1])[:3]
        self.call("cuLaunchKernel", fn, gx, gy, gz, bx, by, bz, smem, stream, params, None)

    # -- streams and events
    def stream_create(self) -> int:
        s = _vp()
        self.call("cuStreamCreate", ctypes.byref(s), 1)   # CU_STREAM_NON_BLOCKING
        return s.value

    def stream_synchronize(self, s) -> None:
        self.call("cuStreamSynchronize", s)

    def stream_destroy(self, s) -> None:
        self.call("cuStreamDestroy_v2", s)

    def event_create(self) -> int:
        e = _vp()
        self.call("cuEventCreate", ctypes.byref(e), 0)
        return e.value

    def event_record(self, e, stream) -> None:
        self.call("cuEventRecord", e, stream)

    def event_synchronize(self, e) -> None:
        self.call("cuEventSynchronize", e)

    def event_elapsed_ms(self, start, end) -> float:
        ms = ctypes.c_float()
        self.call("cuEventElapsedTime", ctypes.byref(ms), start, end)
        return ms.value

    def event_destroy(self, e) -> None:
        self.call("cuEventDestroy_v2", e)


class Context:
    """A device's primary context (retained once per process and device)."""

    def __init__(self, drv, ordinal: int = 0):
        n = drv.device_count()
        if not 0 <= ordinal < n:
            raise CudaUnavailable(f"CUDA device {ordinal} does not exist ({n} device(s))")
        self.driver, self.ordinal = drv, ordinal
        self.device = drv.device(ordinal)
        self.handle = drv.primary_context(self.device)
        self.capability = drv.compute_capability(self.device)
        self.name = drv.device_name(self.device)
        self.activate()

    @property
    def arch(self) -> str:
        return f"sm_{self.capability[0]}{self.capability[1]}"

    def activate(self) -> None:
        self.driver.set_current(self.handle)


_contexts: dict = {}


def context(ordinal: int = 0, drv=None) -> Context:
    """The primary context of device `ordinal` (cached per process for the real driver;
    a Driver stand-in gets a fresh one); CudaUnavailable without CUDA."""
    if drv is not None:
        return Context(drv, ordinal)
    drv = driver()
    with _lock:
        ctx = _contexts.get(ordinal)
        if ctx is None:
            ctx = _contexts[ordinal] = Context(drv, ordinal)
    ctx.activate()
    return ctx


class DeviceBuffer:
    """A device allocation, freed by close() or when collected."""

    def __init__(self, drv, nbytes: int):
        self.driver, self.nbytes = drv, int(nbytes)
        self.ptr = drv.mem_alloc(self.nbytes)

    def close(self):
        if self.ptr:
            p, self.ptr = self.ptr, 0
            try:
                self.driver.mem_free(p)
            except Exception:  # noqa: BLE001 - freeing at exit must not raise
                pass

    def __del__(self):
        self.close()


# ---------------------------------------------------------------- argument packing

ARG_CTYPES = {"ptr": ctypes.c_uint64, "i32": ctypes.c_int32, "i64": ctypes.c_int64,
              "u32": ctypes.c_uint32, "f32": ctypes.c_float, "f64": ctypes.c_double}


def pack_args(values, kinds=None):
    """The `void **kernelParams` array for cuLaunchKernel: one pointer per argument,
    pointing at a ctypes value of its kind ("ptr" = u64 device pointer by default).
    Returns (array, keepalive); keep both alive until the launch is issued."""
    kinds = list(kinds) if kinds is not None else ["ptr"] * len(values)
    if len(kinds) != len(values):
        raise ValueError(f"pack_args: {len(values)} values for {len(kinds)} kinds")
    cells = []
    for v, k in zip(values, kinds):
        try:
            cells.append(ARG_CTYPES[k](v))
        except KeyError:
            raise ValueError(f"pack_args: unknown kind {k!r}; valid: {sorted(ARG_CTYPES)}") \
                from None
    arr = (_vp * max(1, len(cells)))(*[ctypes.cast(ctypes.pointer(c), _vp) for c in cells])
    return arr, cells


def unpack_args(arr, kinds) -> list:
    """The values a packed parameter array points at (the inverse of pack_args)."""
    out = []
    for i, k in enumerate(kinds):
        out.append(ctypes.cast(arr[i], ctypes.POINTER(ARG_CTYPES[k])).contents.value)
    return out


# ---------------------------------------------------------------- artifact container

MAGIC = b"RLXCUDA1"
FORMAT = "rlxc-cuda-1"


def dump_artifact(meta: dict, blobs: dict) -> bytes:
    table, data = {}, bytearray()
    for name, blob in blobs.items():
        table[name] = [len(data), len(blob)]
        data += blob
    head = json.dumps({**meta, "blobs": table}, sort_keys=True).encode()
    return MAGIC + struct.pack("<I", len(head)) + head + bytes(data)


def load_artifact(data: bytes, fmt: str = FORMAT) -> tuple[dict, dict]:
    """(meta, blobs) of a container written by dump_artifact whose format is `fmt`."""
    if not data.startswith(MAGIC) or len(data) < 12:
        raise ArtifactError("not an rlxc CUDA artifact (bad magic)")
    (n,) = struct.unpack("<I", data[8:12])
    try:
        meta = json.loads(data[12:12 + n].decode())
    except ValueError as e:
        raise ArtifactError(f"rlxc CUDA artifact: corrupt metadata ({e})") from None
    if meta.get("format") != fmt:
        raise ArtifactError(f"rlxc CUDA artifact format {meta.get('format')!r}, "
                            f"this runtime reads {fmt!r}")
    body = data[12 + n:]
    blobs = {}
    for name, (off, size) in meta.pop("blobs").items():
        if off + size > len(body):
            raise ArtifactError(f"rlxc CUDA artifact: blob {name!r} is truncated")
        blobs[name] = bytes(body[off:off + size])
    return meta, blobs


def arch_fits(arch: str, capability: tuple[int, int]) -> str | None:
    """How code for `arch` runs on a device of `capability`: "cubin" (same major,
    minor at least the arch's), "ptx" (newer device: the driver JITs), or None."""
    digits = arch.removeprefix("sm_").rstrip("a")
    major, minor = int(digits[:-1]), int(digits[-1])
    if capability[0] == major and capability[1] >= minor and \
            (not arch.endswith("a") or capability == (major, minor)):
        return "cubin"
    if capability >= (major, minor) and not arch.endswith("a"):
        return "ptx"
    return None


# ---------------------------------------------------------------- programs

class LoadedProgram:
    """close(), __del__ and `with` of a program loaded on a device (CudaProgram, and
    runtime/dyncuda.py's DynCudaProgram): once, and best effort (closing at exit must not
    raise), its stream is synchronized and destroyed, its memory (`_mem`, a list or a
    dict of DeviceBuffers and ("host", ptr) pinned buffers) freed, its module unloaded."""

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        drv = self.driver
        try:
            drv.stream_synchronize(self.stream)
            drv.stream_destroy(self.stream)
        except Exception:  # noqa: BLE001
            pass
        for m in (self._mem.values() if isinstance(self._mem, dict) else self._mem):
            if isinstance(m, tuple):
                try:
                    drv.host_free(m[1])
                except Exception:  # noqa: BLE001
                    pass
            else:
                m.close()
        self._mem = type(self._mem)()
        try:
            drv.module_unload(self.module)
        except Exception:  # noqa: BLE001
            pass

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class CudaProgram(LoadedProgram):
    """A compiled program loaded on a device: `run(args) -> outputs`.

    `args` are arrays for every argument in signature order (inputs and params,
    as Func binds them); params stay resident on the device and are uploaded
    again only when a different or writeable array is passed.  Inputs are
    copied in and outputs out once per call."""

    def __init__(self, meta: dict, blobs: dict, device: int = 0, drv=None,
                 pinned: bool = False):
        if meta.get("format") != FORMAT:
            raise ArtifactError(f"CudaProgram: artifact format {meta.get('format')!r}")
        self.meta, self.blobs = meta, blobs
        self.driver = drv or driver()
        self.ctx = context(device, self.driver)
        self.name = meta["name"]
        self._closed = False
        self._mem: list = []
        kind = arch_fits(meta["arch"], self.ctx.capability)
        if kind is None:
            raise ArtifactError(f"{self.name}: compiled for {meta['arch']}, but device "
                                f"{self.ctx.ordinal} ({self.ctx.name}) is {self.ctx.arch}")
        if kind == "cubin" and blobs.get("cubin"):
            image, self.image_kind = blobs["cubin"], "cubin"
        else:
            image, self.image_kind = blobs["ptx"], "ptx"
        self.module = self.driver.module_load(image)
        self.functions = {}
        for st in meta["steps"]:
            if st["op"] == "launch" and st["kernel"] not in self.functions:
                self.functions[st["kernel"]] = self.driver.function(self.module, st["kernel"])
        # memory: one allocation per region
        self.regions = {}
        for region, size in meta["regions"].items():
            buf = DeviceBuffer(self.driver, size)
            self._mem.append(buf)
            self.regions[region] = buf.ptr
        self.ptr = {b["id"]: self.regions[b["region"]] + b["offset"] for b in meta["buffers"]}
        self.nbytes = {b["id"]: b["nbytes"] for b in meta["buffers"]}
        self.stream = self.driver.stream_create()
        consts = blobs.get("consts", b"")
        if meta["consts"]:
            host = np.frombuffer(consts, dtype=np.uint8)
            for c in meta["consts"]:
                view = host[c["blob_offset"]:c["blob_offset"] + c["nbytes"]]
                self.driver.memcpy_htod(self.ptr[c["buffer"]], view.ctypes.data, c["nbytes"])
        # launches with their parameter arrays packed once (pointers never move)
        self._steps = []
        for st in meta["steps"]:
            if st["op"] == "launch":
                params, keep = pack_args([self.ptr[i] for i in st["args"]])
                self._steps.append(("launch", self.functions[st["kernel"]], st["grid"],
                                    st["block"], st.get("smem", 0), params, keep))
            elif st["op"] == "memset":
                self._steps.append(("memset", self.ptr[st["buffer"]],
                                    self.nbytes[st["buffer"]]))
            elif st["op"] in cuda_steps.CONTROL:   # loops and branches (rlx.scan/while/if)
                self._steps.append(("control", [cuda_steps.prepare(self, st)]))
            else:
                raise ArtifactError(f"{self.name}: unknown step {st['op']!r}")
        self._resident: dict = {}
        self._pinned = None
        if pinned:
            self._setup_pinned()
        errs = meta.get("errors")   # the index checks' flag (lowering/gpu/plan.py step 6)
        self._error_flag = (self.ptr[errs["buffer"]], errs["codes"]) if errs else None

    # -- host staging
    def _setup_pinned(self):
        """Pinned host buffers for every input/output (async copies at full speed)."""
        self._pinned = {}
        for i, a in enumerate(self.meta["args"]):
            n = self.nbytes[a["buffer"]]
            self._pinned[("arg", i)] = self._host_array(n, a["dtype"], a["shape"])
        for i, o in enumerate(self.meta["outputs"]):
            self._pinned[("out", i)] = self._host_array(self.nbytes[o["buffer"]], o["dtype"],
                                                        o["shape"])

    def _host_array(self, nbytes, dtype, shape):
        ptr = self.driver.host_alloc(nbytes)
        self._mem.append(("host", ptr))
        raw = (ctypes.c_char * max(1, nbytes)).from_address(ptr)
        return np.frombuffer(raw, dtype=np.uint8, count=nbytes).view(NP_DTYPES[dtype]) \
            .reshape(shape)

    # -- running
    def _check_args(self, args) -> list:
        want = self.meta["args"]
        if len(args) != len(want):
            raise TypeError(f"{self.name}: expected {len(want)} arrays "
                            f"({[a['name'] for a in want]}), got {len(args)}")
        return [coerce(a["kind"], a["name"], x, tuple(a["shape"]), a["dtype"])
                for a, x in zip(want, args)]

    def upload(self, args) -> None:
        """Copy inputs (and changed params) to the device, on the program's stream."""
        drv, s = self.driver, self.stream
        for i, (a, x) in enumerate(zip(self.meta["args"], args)):
            if a["kind"] == "param":
                prev = self._resident.get(i)
                if prev is not None and prev is x and not x.flags.writeable:
                    continue
                self._resident[i] = x
            if not x.nbytes:
                continue
            src = x
            if self._pinned is not None:
                src = self._pinned[("arg", i)]
                np.copyto(src, x)
            drv.memcpy_htod(self.ptr[a["buffer"]], src.ctypes.data, x.nbytes, s)

    def set_params(self, params: dict) -> None:
        """Upload params by name now (they stay resident); every entry is checked first,
        so a bad one uploads none."""
        names = {a["name"]: i for i, a in enumerate(self.meta["args"]) if a["kind"] == "param"}
        ready = []
        for k, v in params.items():
            if k not in names:
                raise NameLookupError(f"{self.name}: unknown param {k!r}; valid: "
                                      f"{sorted(names)}")
            a = self.meta["args"][names[k]]
            ready.append((k, a, coerce("param", k, v, tuple(a["shape"]), a["dtype"])))
        for k, a, x in ready:
            self.driver.memcpy_htod(self.ptr[a["buffer"]], x.ctypes.data, x.nbytes, self.stream)
            self._resident[names[k]] = x
        self.driver.stream_synchronize(self.stream)

    def launch_all(self) -> None:
        """Issue the launch plan on the stream (no copies, no synchronization)."""
        drv, s = self.driver, self.stream
        for st in self._steps:
            if st[0] == "launch":
                _, fn, grid, block, smem, params, _keep = st
                drv.launch(fn, grid, block, smem, s, params)
            elif st[0] == "control":
                cuda_steps.run(self, st[1])
            else:
                drv.memset(st[1], 0, st[2], s)

    def download(self) -> list[np.ndarray]:
        drv, s = self.driver, self.stream
        outs = []
        for i, o in enumerate(self.meta["outputs"]):
            if self._pinned is not None:
                dst = self._pinned[("out", i)]
            else:
                dst = np.empty(tuple(o["shape"]), dtype=NP_DTYPES[o["dtype"]])
            if dst.nbytes:
                drv.memcpy_dtoh(dst.ctypes.data, self.ptr[o["buffer"]], dst.nbytes, s)
            outs.append(dst)
        drv.stream_synchronize(s)
        self._raise_kernel_error()
        return [o.copy() for o in outs] if self._pinned is not None else outs

    def _raise_kernel_error(self) -> None:
        """Raise what a kernel flagged (an index out of range), as the CPU library does."""
        if self._error_flag is None:
            return
        ptr, codes = self._error_flag
        flag = np.zeros(1, np.int32)
        self.driver.memcpy_dtoh(flag.ctypes.data, ptr, 4)
        code = int(flag[0])
        if code:
            exc, msg = codes.get(str(code), ("RuntimeError", f"kernel error code {code}"))
            raise {"IndexError": IndexError}.get(exc, RlxError)(msg)

    def run(self, args) -> list[np.ndarray]:
        """Arrays for every argument (signature order) → output arrays."""
        if self._closed:
            raise RlxError(f"{self.name}: program is closed")
        self.ctx.activate()
        args = self._check_args(args)
        self.upload(args)
        self.launch_all()
        return self.download()

    __call__ = run

    def time(self, args, iters: int = 20, warmup: int = 3) -> dict:
        """Mean time per call with CUDA events: {"kernels_ms": the launch plan alone
        (inputs already on the device), "run_ms": run() with its copies (host clock)}."""
        import time as _t

        self.ctx.activate()
        args = self._check_args(args)
        self.upload(args)
        for _ in range(warmup):
            self.launch_all()
        drv, s = self.driver, self.stream
        e0, e1 = drv.event_create(), drv.event_create()
        try:
            drv.event_record(e0, s)
            for _ in range(iters):
                self.launch_all()
            drv.event_record(e1, s)
            drv.event_synchronize(e1)
            kern = drv.event_elapsed_ms(e0, e1) / iters
        finally:
            drv.event_destroy(e0)
            drv.event_destroy(e1)
        t0 = _t.perf_counter()
        for _ in range(max(1, iters // 4)):
            self.run(args)
        full = (_t.perf_counter() - t0) * 1e3 / max(1, iters // 4)
        return {"kernels_ms": kern, "run_ms": full}

    def profile(self, args, iters: int = 10) -> list[tuple[str, float]]:
        """Mean milliseconds of each step of the launch plan (events between steps)."""
        self.ctx.activate()
        self.upload(self._check_args(args))
        self.launch_all()
        drv, s = self.driver, self.stream
        evs = [drv.event_create() for _ in range(len(self._steps) + 1)]
        tot = [0.0] * len(self._steps)
        try:
            for _ in range(iters):
                drv.event_record(evs[0], s)
                for i, st in enumerate(self._steps):
                    if st[0] == "launch":
                        drv.launch(st[1], st[2], st[3], st[4], s, st[5])
                    elif st[0] == "control":
                        cuda_steps.run(self, st[1])
                    else:
                        drv.memset(st[1], 0, st[2], s)
                    drv.event_record(evs[i + 1], s)
                drv.event_synchronize(evs[-1])
                for i in range(len(self._steps)):
                    tot[i] += drv.event_elapsed_ms(evs[i], evs[i + 1])
        finally:
            for e in evs:
                drv.event_destroy(e)
        names = [st.get("kernel", "memset") for st in self.meta["steps"]]
        return [(n, t / iters) for n, t in zip(names, tot)]


def load_program(data: bytes, device: int = 0, **kw) -> CudaProgram:
    """Load an artifact container (bytes from CudaArtifact.to_bytes())."""
    meta, blobs = load_artifact(data)
    return CudaProgram(meta, blobs, device=device, **kw)

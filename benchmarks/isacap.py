"""Cap what `cpuid` reports to this process at AVX2 (benchmarks/compare.py --peer-isa avx2).

Libraries pick their kernels from cpuid, and some cannot be told otherwise (XLA's dots run
through YNNPACK, which ignores --xla_cpu_max_isa).  isacap.c traps every cpuid of this
process's threads (Linux CPUID faulting) and answers it with the AVX-512, AMX and
AVX-VNNI bits cleared; see its header for how and for what stays as the CPU says.

Use: `enable()` before NumPy, torch or jax load their native libraries and before any
thread starts (threads created later inherit the trap; threads that exist do not, and
a child process starts uncapped).  `reinstall()` after the imports puts the SIGSEGV
handler back if a library replaced it.  The shim is built with the system C compiler
into a per-user cache directory, keyed by the hash of its source.  Stdlib only.
"""
from __future__ import annotations

import ctypes
import os
import platform
import shutil
import sys

__all__ = ["IsacapError", "unavailable", "build", "enable", "reinstall", "state", "cpuid", "avx512f",
           "ENV"]

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "isacap.c")
if HERE not in sys.path:   # cshim.py beside this file (also when loaded by path)
    sys.path.insert(0, HERE)
from cshim import build_shared  # noqa: E402
ENV = "RLXC_BENCH_ISACAP"   # "avx2" in a child's environment: enable() at its start
_lib = None


class IsacapError(RuntimeError):
    """The cap cannot be set up here (the message says why)."""


def unavailable(cpuinfo: str = "/proc/cpuinfo") -> str | None:
    """Why the cap cannot work on this machine, or None when it can."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"needs Linux on x86-64 (this is {platform.system()} {platform.machine()})"
    try:
        with open(cpuinfo) as f:
            flags = next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")),
                         [])
    except OSError as e:
        return f"cannot read {cpuinfo} ({e})"
    if "cpuid_fault" not in flags:
        return ("the CPU (or hypervisor) offers no CPUID faulting: /proc/cpuinfo has no "
                "cpuid_fault flag")
    if shutil.which(os.environ.get("CC", "cc")) is None:
        return "no C compiler (cc) to build benchmarks/isacap.c"
    return None


def build() -> str:
    """The path of the shared library, built from isacap.c if this source is not built yet."""
    return build_shared(SOURCE, 'isacap', IsacapError)


def _load():
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(build())
        for name in ("isacap_enable", "isacap_reinstall", "isacap_handler_installed",
                     "isacap_faulting"):
            getattr(lib, name).restype = ctypes.c_int
        lib.isacap_emulated.restype = ctypes.c_long
        lib.isacap_cpuid.argtypes = [ctypes.c_uint32, ctypes.c_uint32,
                                     ctypes.POINTER(ctypes.c_uint32 * 4)]
        lib.isacap_cpuid.restype = None
        _lib = lib
    return _lib


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def enable() -> None:
    """Trap cpuid in this thread and every thread it creates from now on.  Raises
    IsacapError with the reason when this machine cannot, or when other threads already
    run (they would keep seeing the real CPU)."""
    why = unavailable()
    if why:
        raise IsacapError(why)
    lib = _load()
    if lib.isacap_faulting() == 1:
        lib.isacap_reinstall()
        return
    n = _threads()
    if n != 1:
        raise IsacapError(f"{n} threads already run in this process: CPUID faulting is per "
                          "thread, so enable it before any library starts threads")
    rc = lib.isacap_enable()
    if rc < 0:
        raise IsacapError(f"arch_prctl(ARCH_SET_CPUID) failed: {os.strerror(-rc)}")
    os.environ[ENV] = "avx2"


def reinstall() -> bool:
    """Put the SIGSEGV handler back if a library replaced it; True if it had to."""
    return _lib is not None and _lib.isacap_reinstall() == 1


def state() -> dict:
    """{"faulting": this thread traps cpuid, "handler": our SIGSEGV handler is installed,
    "emulated": cpuid instructions answered so far (all threads)}."""
    if _lib is None:
        return {"faulting": False, "handler": False, "emulated": 0}
    return {"faulting": _lib.isacap_faulting() == 1,
            "handler": _lib.isacap_handler_installed() == 1,
            "emulated": int(_lib.isacap_emulated())}


def cpuid(leaf: int, sub: int = 0) -> tuple:
    """(eax, ebx, ecx, edx) of cpuid as this thread sees it (capped when enabled)."""
    out = (ctypes.c_uint32 * 4)()
    _load().isacap_cpuid(leaf, sub, ctypes.byref(out))
    return tuple(out)


def avx512f() -> bool:
    """Whether cpuid leaf 7 reports AVX512F to this thread."""
    return bool(cpuid(7, 0)[1] >> 16 & 1)


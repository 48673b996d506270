"""Which x86 instruction-set features this CPU has, and which an artifact needs.

An artifact built for a newer CPU than the one that loads it must refuse, not
die of SIGILL on its first call.  `rlxc compile` records in NAME.json the
features its code may use (lowering/artifact/isa.py asks LLVM which of the
features below the target CPU implies); the loader compares them with the
host's before dlopen, and the library's glue checks them again from C with
cpuid/xgetbv (NAME_check_cpu, NAME_create).

FEATURES maps LLVM's feature name to how the two probes see it:
  cpuinfo:  the Linux /proc/cpuinfo flag (the kernel clears flags whose state
            the OS does not save, e.g. AVX-512 without XSAVE support);
  cpuid:    (leaf, subleaf, register 0-3 = eax ebx ecx edx, bit);
  xcr0:     XCR0 bits the OS must enable for the feature's registers
            (0x6 SSE+AVX state, 0xe6 also the AVX-512 state, 0x60000 AMX tiles).
NumPy-free, stdlib only.
"""
from __future__ import annotations

import functools
import os

__all__ = ["FEATURES", "host_features", "missing_features"]

_AVX, _AVX512, _AMX = 0x6, 0xE6, 0x60000
_EAX, _EBX, _ECX, _EDX = 0, 1, 2, 3

#          llvm name          cpuinfo flag         (leaf, sub, reg, bit)      xcr0
FEATURES = {
    "sse3":            ("pni",              (1, 0, _ECX, 0), 0),
    "pclmul":          ("pclmulqdq",        (1, 0, _ECX, 1), 0),
    "ssse3":           ("ssse3",            (1, 0, _ECX, 9), 0),
    "fma":             ("fma",              (1, 0, _ECX, 12), _AVX),
    "cx16":            ("cx16",             (1, 0, _ECX, 13), 0),
    "sse4.1":          ("sse4_1",           (1, 0, _ECX, 19), 0),
    "sse4.2":          ("sse4_2",           (1, 0, _ECX, 20), 0),
    "movbe":           ("movbe",            (1, 0, _ECX, 22), 0),
    "popcnt":          ("popcnt",           (1, 0, _ECX, 23), 0),
    "aes":             ("aes",              (1, 0, _ECX, 25), 0),
    "avx":             ("avx",              (1, 0, _ECX, 28), _AVX),
    "f16c":            ("f16c",             (1, 0, _ECX, 29), _AVX),
    "bmi":             ("bmi1",             (7, 0, _EBX, 3), 0),
    "avx2":            ("avx2",             (7, 0, _EBX, 5), _AVX),
    "bmi2":            ("bmi2",             (7, 0, _EBX, 8), 0),
    "avx512f":         ("avx512f",          (7, 0, _EBX, 16), _AVX512),
    "avx512dq":        ("avx512dq",         (7, 0, _EBX, 17), _AVX512),
    "avx512ifma":      ("avx512ifma",       (7, 0, _EBX, 21), _AVX512),
    "avx512cd":        ("avx512cd",         (7, 0, _EBX, 28), _AVX512),
    "sha":             ("sha_ni",           (7, 0, _EBX, 29), 0),
    "avx512bw":        ("avx512bw",         (7, 0, _EBX, 30), _AVX512),
    "avx512vl":        ("avx512vl",         (7, 0, _EBX, 31), _AVX512),
    "avx512vbmi":      ("avx512vbmi",       (7, 0, _ECX, 1), _AVX512),
    "avx512vbmi2":     ("avx512_vbmi2",     (7, 0, _ECX, 6), _AVX512),
    "gfni":            ("gfni",             (7, 0, _ECX, 8), 0),
    "vaes":            ("vaes",             (7, 0, _ECX, 9), _AVX),
    "vpclmulqdq":      ("vpclmulqdq",       (7, 0, _ECX, 10), _AVX),
    "avx512vnni":      ("avx512_vnni",      (7, 0, _ECX, 11), _AVX512),
    "avx512bitalg":    ("avx512_bitalg",    (7, 0, _ECX, 12), _AVX512),
    "avx512vpopcntdq": ("avx512_vpopcntdq", (7, 0, _ECX, 14), _AVX512),
    "amx-bf16":        ("amx_bf16",         (7, 0, _EDX, 22), _AMX),
    "avx512fp16":      ("avx512_fp16",      (7, 0, _EDX, 23), _AVX512),
    "amx-tile":        ("amx_tile",         (7, 0, _EDX, 24), _AMX),
    "amx-int8":        ("amx_int8",         (7, 0, _EDX, 25), _AMX),
    "avxvnni":         ("avx_vnni",         (7, 1, _EAX, 4), _AVX),
    "avx512bf16":      ("avx512_bf16",      (7, 1, _EAX, 5), _AVX512),
    "amx-fp16":        ("amx_fp16",         (7, 1, _EAX, 21), _AMX),
    "lzcnt":           ("abm",              (0x80000001, 0, _ECX, 5), 0),
    "sse4a":           ("sse4a",            (0x80000001, 0, _ECX, 6), 0),
    "xop":             ("xop",              (0x80000001, 0, _ECX, 11), _AVX),
    "fma4":            ("fma4",             (0x80000001, 0, _ECX, 16), _AVX),
}


@functools.lru_cache(maxsize=None)
def _cpuinfo_flags(path: str = "/proc/cpuinfo") -> frozenset | None:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def host_features() -> frozenset | None:
    """The FEATURES this CPU has (LLVM names), or None where the OS does not say
    (then only the library's own cpuid check in NAME_create guards the load)."""
    if os.uname().machine not in ("x86_64", "AMD64", "i686"):
        return None
    flags = _cpuinfo_flags()
    if flags is None:
        return None
    return frozenset(k for k, (flag, _, _) in FEATURES.items() if flag in flags)


def missing_features(required, host=None) -> list[str]:
    """The features in `required` that `host` (default: this CPU) lacks; [] if unknown."""
    host = host_features() if host is None else host
    if host is None:
        return []
    return [f for f in required if f in FEATURES and f not in host]

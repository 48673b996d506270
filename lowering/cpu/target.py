"""LLVM target handling for the CPU backend: target machines, O3, objects, .so.

    llvmlite.ir.Module / LLVM IR text
          │ compile_ir: parse → verify → optimize (new PM, O3, loop-vec + SLP)
          ▼
    llvmlite.binding.ModuleRef (optimized)
          │ emit_object / emit_asm (TargetMachine for cpu="native" or a named CPU)
          ▼
    ELF relocatable object bytes
          │ link_shared: cc -shared -fopenmp (libgomp) -lm, written atomically
          ▼
    libNAME.so (plain C ABI, loadable with ctypes)

Target machines are cached per (triple, cpu, features, opt).  ``cpu="native"``
means the host CPU name plus the host feature string (so AVX-512 is used where
the machine has it); any other name (``"x86-64-v3"``, ``"skylake-avx512"``) takes
LLVM's features for that CPU.  All objects are position independent (they go
into shared libraries).

CPU targets: one ``CpuTarget`` entry per architecture in ``TARGETS`` (LLVM
triple, the C compiler that links for it, the sysroot an emulator needs).  A
``cpu`` string names a target and a CPU of it: ``"native"`` (the host), an
x86-64 CPU name (``"x86-64-v3"``: the host's x86-64 target), a target name
(``"aarch64-linux-gnu"``: that target's baseline CPU) or ``"TARGET:CPU"``
(``"aarch64-linux-gnu:neoverse-n1"``).  ``resolve_target(cpu)`` does the parsing,
so every stage (target machine, sgemm blocking, linking) agrees on it.

Cache sizes (``cache_info(cpu)``), from which the sgemm blocking is derived:
for the host (``"native"``) they are read from sysfs
(/sys/devices/system/cpu/cpu0/cache/index*: level, type, size, ways, and how
many CPUs share the cache, so L3 is counted per core); for a named CPU that
is not the host, or a host without sysfs, they come from ``CACHE_TABLE``:
typical per-core sizes of that CPU family, from the vendors' optimization
manuals (a VM or a part with a cut L3 may differ; only the blocking depends
on them, never correctness).

llvmlite 0.50 notes: ``llvm.initialize()`` raises, so only the
``initialize_all_*`` calls are made; O3 runs through the new pass manager
(``create_pipeline_tuning_options`` + ``create_pass_builder``).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import platform
import shutil
import subprocess
import tempfile
import threading

import llvmlite.binding as llvm
import llvmlite.ir as ir

__all__ = [
    "host_cpu_name",
    "host_cpu_features",
    "host_has_avx512",
    "CacheInfo",
    "CACHE_TABLE",
    "cache_info",
    "CpuTarget",
    "TARGETS",
    "host_target",
    "resolve_target",
    "is_host",
    "target_machine",
    "tuning_features",
    "optimize",
    "parse_module",
    "compile_ir",
    "emit_object",
    "emit_asm",
    "link_shared",
    "build_shared",
    "ir_module",
]

_init_lock = threading.Lock()
_initialized = False


def _ensure_init() -> None:
    global _initialized
    if _initialized:
        return
    with _init_lock:
        if not _initialized:
            llvm.initialize_all_targets()
            llvm.initialize_all_asmprinters()
            _initialized = True


def host_cpu_name() -> str:
    """LLVM's name for the host CPU (e.g. "sapphirerapids", "znver4")."""
    _ensure_init()
    return llvm.get_host_cpu_name()


@functools.lru_cache(maxsize=None)
def host_cpu_features() -> str:
    """The host feature string ("+avx2,+fma,-avx512f,...")."""
    _ensure_init()
    try:
        return llvm.get_host_cpu_features().flatten()
    except RuntimeError:  # some hosts cannot report features
        return ""


@functools.lru_cache(maxsize=None)
def host_has_avx512() -> bool:
    """True when the host can run AVX-512F code.

    Read from /proc/cpuinfo (what the kernel lets us use), falling back to
    LLVM's host feature string elsewhere."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return "avx512f" in line.split()
    except OSError:
        pass
    return "+avx512f" in host_cpu_features().split(",")


@dataclasses.dataclass(frozen=True)
class CpuTarget:
    """One CPU architecture the backend can generate code for."""
    name: str            # what --target / a cpu string names: "aarch64-linux-gnu"
    triple: str          # LLVM target triple
    arch: str            # "x86_64" | "aarch64" (picks ISA-specific code: sgemm tile, sfence)
    cc: str              # C compiler driver that links for this target ($CC for the host)
    baseline_cpu: str    # the CPU used when only the target is named
    sysroot: str = ""    # where an emulator finds the target's libc (qemu -L)
    emulator: str = ""   # user-mode emulator that runs its programs on another host


TARGETS: dict[str, CpuTarget] = {
    t.name: t for t in (
        CpuTarget("x86_64-linux-gnu", "x86_64-unknown-linux-gnu", "x86_64", "cc", "x86-64-v3"),
        CpuTarget("aarch64-linux-gnu", "aarch64-unknown-linux-gnu", "aarch64",
                  "aarch64-linux-gnu-gcc", "generic", sysroot="/usr/aarch64-linux-gnu",
                  emulator="qemu-aarch64"),
    )
}


@dataclasses.dataclass(frozen=True)
class CacheInfo:
    """Per-core data cache sizes of a CPU, in bytes (L3: this core's share)."""
    l1d: int
    l1d_ways: int
    l2: int
    l3: int
    source: str   # "sysfs" | "table:<family>"

    def describe(self) -> str:
        return (f"L1d {self.l1d >> 10} KiB/{self.l1d_ways}-way, L2 {self.l2 >> 10} KiB, "
                f"L3 {self.l3 >> 10} KiB per core ({self.source})")


_K, _M = 1 << 10, 1 << 20
# Typical per-core caches of x86-64 and AArch64 CPU families: (L1d, its ways, L2, L3 share),
# keyed by family, then LLVM CPU names -> family.  The generic ISA levels take the most
# common part of their class (x86-64-v3: Haswell/Skylake client, the smallest L2 of the
# AVX2 parts; x86-64-v4: Skylake-SP).
CACHE_TABLE: dict[str, tuple[int, int, int, int]] = {
    "haswell":        (32 * _K, 8, 256 * _K, 2560 * _K),   # also broadwell
    "skylake":        (32 * _K, 8, 256 * _K, 2 * _M),      # client: kaby/coffee/comet lake
    "skylake-server": (32 * _K, 8, 1 * _M, 1408 * _K),     # skylake-avx512, cascade/cooper lake
    "icelake-client": (48 * _K, 12, 512 * _K, 2 * _M),
    "icelake-server": (48 * _K, 12, 1280 * _K, 1536 * _K),
    "tigerlake":      (48 * _K, 12, 1280 * _K, 3 * _M),    # also rocketlake
    "alderlake":      (48 * _K, 12, 1280 * _K, 3 * _M),    # P-cores; raptorlake: 2 MiB L2
    "raptorlake":     (48 * _K, 12, 2 * _M, 3 * _M),
    "sapphirerapids": (48 * _K, 12, 2 * _M, 1920 * _K),    # also emerald/granite rapids
    "znver1":         (32 * _K, 8, 512 * _K, 2 * _M),      # 8 MiB per 4-core CCX
    "znver2":         (32 * _K, 8, 512 * _K, 4 * _M),      # 16 MiB per 4-core CCX
    "znver3":         (32 * _K, 8, 512 * _K, 4 * _M),      # 32 MiB per 8-core CCD
    "znver4":         (32 * _K, 8, 1 * _M, 4 * _M),
    "znver5":         (48 * _K, 12, 1 * _M, 4 * _M),
    "neoverse-n1":    (64 * _K, 4, 1 * _M, 1 * _M),
    "neoverse-v1":    (64 * _K, 4, 1 * _M, 1 * _M),
    "neoverse-n2":    (64 * _K, 4, 1 * _M, 1 * _M),
    "apple-m1":       (64 * _K, 8, 4 * _M, 2 * _M),        # P-core L1d is 128 KiB; shared L2
    "generic-aarch64": (32 * _K, 4, 512 * _K, 1 * _M),     # Cortex-A5x/A7x class
}
_CPU_FAMILY = {   # x86-64 LLVM CPU names -> family
    "x86-64": "haswell", "x86-64-v2": "haswell", "x86-64-v3": "haswell", "generic": "haswell",
    "core2": "haswell", "nehalem": "haswell", "westmere": "haswell", "sandybridge": "haswell",
    "ivybridge": "haswell", "broadwell": "haswell", "btver2": "haswell", "bdver4": "haswell",
    "kabylake": "skylake", "coffeelake": "skylake", "cometlake": "skylake",
    "cannonlake": "icelake-client", "x86-64-v4": "skylake-server",
    "skylake-avx512": "skylake-server", "skx": "skylake-server", "cascadelake": "skylake-server",
    "cooperlake": "skylake-server", "rocketlake": "tigerlake", "gracemont": "alderlake",
    "meteorlake": "alderlake", "arrowlake": "alderlake", "lunarlake": "alderlake",
    "sierraforest": "alderlake", "grandridge": "alderlake",
    "emeraldrapids": "sapphirerapids", "graniterapids": "sapphirerapids",
    "graniterapids-d": "sapphirerapids", "diamondrapids": "sapphirerapids",
}
_AARCH64_FAMILY = {   # AArch64 LLVM CPU names -> family
    "neoverse-v2": "neoverse-n2", "ampere1": "neoverse-n1", "a64fx": "neoverse-n1",
    "cortex-x1": "neoverse-n1", "apple-m2": "apple-m1", "apple-m3": "apple-m1",
}


def _family(name: str, arch: str) -> str:
    if arch == "aarch64":
        fam = _AARCH64_FAMILY.get(name, name)
        return fam if fam in CACHE_TABLE else "generic-aarch64"
    if name in CACHE_TABLE:
        return name
    if name in _CPU_FAMILY:
        return _CPU_FAMILY[name]
    if "avx512" in name:
        return "skylake-server"
    return "haswell"   # an unknown x86-64 part: the small caches of the AVX2 baseline


def _sysfs_size(text: str) -> int:
    text = text.strip().upper()
    mult = {"K": _K, "M": _M, "G": 1 << 30}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * mult


def _cpu_count(cpulist: str) -> int:
    n = 0
    for part in cpulist.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            n += int(hi or lo) - int(lo) + 1
    return max(n, 1)


def sysfs_caches(root: str = "/sys/devices/system/cpu/cpu0/cache") -> CacheInfo | None:
    """The host's per-core caches from sysfs, or None when it does not say (no sysfs, or
    no L1d/L2 listed).  An L3 shared by n CPUs counts size/n; no L3 counts as 0."""
    found = {}
    try:
        for entry in sorted(os.listdir(root)):
            if not entry.startswith("index"):
                continue
            d = os.path.join(root, entry)

            def rd(n, d=d):
                with open(os.path.join(d, n)) as f:
                    return f.read().strip()
            kind, level = rd("type"), int(rd("level"))
            if kind == "Instruction":
                continue
            size = _sysfs_size(rd("size"))
            try:
                ways = int(rd("ways_of_associativity"))
            except (OSError, ValueError):
                ways = 8
            try:
                share = _cpu_count(rd("shared_cpu_list"))
            except (OSError, ValueError):
                share = 1
            found[level] = (size, ways, share)
    except (OSError, ValueError):
        return None
    if 1 not in found or 2 not in found:
        return None
    l1, ways, _ = found[1]
    l2, _, l2share = found[2]
    l3 = found[3][0] // found[3][2] if 3 in found else 0
    return CacheInfo(l1, max(ways, 1), l2 // max(l2share, 1), l3, "sysfs")


@functools.lru_cache(maxsize=None)
def cache_info(cpu: str = "native") -> CacheInfo:
    """Per-core cache sizes of ``cpu`` (a cpu string): sysfs for the host, else the
    typical sizes of its family (CACHE_TABLE)."""
    tgt, name, _ = resolve_target(cpu)
    if cpu in ("native", "host", ""):
        got = sysfs_caches()
        if got is not None:
            return got
    fam = _family(name, tgt.arch)
    l1, ways, l2, l3 = CACHE_TABLE[fam]
    return CacheInfo(l1, ways, l2, l3, f"table:{fam}")


def host_target() -> CpuTarget:
    """The entry of TARGETS this process runs on."""
    arch = platform.machine().lower()
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(arch, arch)
    for t in TARGETS.values():
        if t.arch == arch:
            return t
    raise RuntimeError(f"rlxc: no CPU target for this host's architecture {arch!r}; "
                       f"known: {', '.join(TARGETS)}")


@functools.lru_cache(maxsize=None)
def resolve_target(cpu: str = "native") -> tuple[CpuTarget, str, str]:
    """(target, LLVM CPU name, feature string) for a cpu string (see the header)."""
    if cpu in ("native", "host", ""):
        return host_target(), host_cpu_name(), host_cpu_features()
    tname, sep, cname = cpu.partition(":")
    if tname in TARGETS:
        t = TARGETS[tname]
        return t, (cname if sep and cname else t.baseline_cpu), ""
    if sep:
        raise ValueError(f"unknown CPU target {tname!r} in {cpu!r}: no lowering description "
                         f"in lowering/cpu/target.py TARGETS; known: {', '.join(TARGETS)}")
    return host_target(), cpu, ""   # a bare name is a CPU of the host architecture


def is_host(cpu: str = "native") -> bool:
    """True when code for ``cpu`` runs in this process (same architecture)."""
    return resolve_target(cpu)[0].arch == host_target().arch


# Tuning features added to the generated code's target machine, per CPU family (LLVM
# CPU name prefix).  AMD's vgatherdps/vscatterdps are microcoded (Zen 4: ~1 element
# per cycle or worse), and LLVM's cost model for znver3/znver4 still vectorizes a
# strided or indexed loop (a 2x2 max-pool window, its backward select) with them;
# with prefer-no-gather/-scatter it uses interleaved loads and shuffles, or scalar
# code.  The shared sgemm object is built without them (sgemm_object.py: tuned=False),
# so the packed GEMMs are the same code either way.
TUNING_FEATURES = {"znver": "+prefer-no-gather,+prefer-no-scatter"}


def tuning_features(cpu: str = "native") -> str:
    """The TUNING_FEATURES of ``cpu``'s LLVM CPU name ("" when none apply)."""
    name = resolve_target(cpu)[1]
    return ",".join(f for pre, f in TUNING_FEATURES.items() if name.startswith(pre))


def resolve_cpu(cpu: str) -> tuple[str, str]:
    _, name, features = resolve_target(cpu)
    return name, features


_tm_cache: dict[tuple[str, str, str, int], llvm.TargetMachine] = {}   # features incl. tuning
_tm_lock = threading.Lock()


def target_machine(cpu: str = "native", opt: int = 3, tuned: bool = True) -> llvm.TargetMachine:
    """A cached TargetMachine for ``cpu`` (a cpu string, see the header).

    ``cpu="native"`` → host triple, CPU name and features; otherwise the named
    target's triple with that CPU's default features.  ``tuned`` adds the CPU's
    TUNING_FEATURES (they change code generation choices, never the ISA)."""
    key = _machine_spec(cpu, opt, tuned)
    with _tm_lock:
        tm = _tm_cache.get(key)
        if tm is None:
            tm = _tm_cache[key] = _new_target_machine(*key)
        return tm


def _machine_spec(cpu: str, opt: int, tuned: bool) -> tuple[str, str, str, int]:
    """(triple, CPU name, features, opt) of target_machine(cpu, opt, tuned)."""
    _ensure_init()
    tgt, name, features = resolve_target(cpu)
    extra = tuning_features(cpu) if tuned else ""
    if extra:
        features = f"{features},{extra}" if features else extra
    return tgt.triple, name, features, int(opt)


def _new_target_machine(triple: str, name: str, features: str, opt: int):
    return llvm.Target.from_triple(triple).create_target_machine(
        cpu=name, features=features, opt=int(opt), reloc="pic", codemodel="default")


def _pass_builder(tm: llvm.TargetMachine, level: int):
    """The new pass manager's O`level` pipeline: loop and SLP vectorizer, loop unrolling
    and interleaving on."""
    pto = llvm.create_pipeline_tuning_options(speed_level=int(level))
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pto.loop_unrolling = True
    pto.loop_interleaving = True
    return llvm.create_pass_builder(tm, pto)


def optimize(mod: llvm.ModuleRef, tm: llvm.TargetMachine, level: int = 3) -> llvm.ModuleRef:
    """Run the new-pass-manager pipeline at ``level`` (_pass_builder) in place."""
    pb = _pass_builder(tm, level)
    pb.getModulePassManager().run(mod, pb)
    return mod


def parse_module(ir_text_or_module, cpu: str = "native") -> llvm.ModuleRef:
    """Parse ``ir_text_or_module`` (IR text, an llvmlite.ir.Module or a
    ModuleRef) into a verified ModuleRef carrying the target triple and data
    layout of ``cpu``'s target machine."""
    _ensure_init()
    if isinstance(ir_text_or_module, llvm.ModuleRef):
        mod = ir_text_or_module
    else:
        mod = llvm.parse_assembly(str(ir_text_or_module))
    tm = target_machine(cpu)
    mod.triple = tm.triple
    mod.data_layout = str(tm.target_data)
    mod.verify()
    _hide_internal_state(mod)
    return mod


# Library-internal mutable state: references bind inside the .so (hidden
# visibility; llvmlite.ir cannot say so), so two libraries loaded with
# RTLD_GLOBAL never share, say, their thread count through interposition.
HIDDEN_GLOBALS = ("rlxc_num_threads",)


def _hide_internal_state(mod: llvm.ModuleRef) -> None:
    for name in HIDDEN_GLOBALS:
        try:
            gv = mod.get_global_variable(name)
        except NameError:
            continue
        if not gv.is_declaration:
            gv.visibility = "hidden"


def compile_ir(ir_text_or_module, cpu: str = "native", opt: int = 3,
               tuned: bool = True) -> llvm.ModuleRef:
    """Parse, verify and optimize IR for ``cpu``; returns the ModuleRef."""
    mod = parse_module(ir_text_or_module, cpu)
    if opt > 0:
        optimize(mod, target_machine(cpu, opt, tuned), opt)
        mod.verify()
    return mod


def _as_moduleref(m, cpu: str, opt: int, tuned: bool = True) -> llvm.ModuleRef:
    if isinstance(m, llvm.ModuleRef):
        return m
    return compile_ir(m, cpu, opt, tuned)


def emit_object(m, cpu: str = "native", opt: int = 3, tuned: bool = True) -> bytes:
    """Object file bytes for ``m`` (an optimized ModuleRef is used as is;
    IR text or an llvmlite.ir.Module is compiled first)."""
    mod = _as_moduleref(m, cpu, opt, tuned)
    return target_machine(cpu, opt, tuned).emit_object(mod)


def emit_asm(m, cpu: str = "native", opt: int = 3, tuned: bool = True) -> str:
    """Assembly text for ``m`` (same input rules as :func:`emit_object`)."""
    mod = _as_moduleref(m, cpu, opt, tuned)
    return target_machine(cpu, opt, tuned).emit_assembly(mod)


def cc_for(cpu: str = "native") -> str:
    """The C compiler driver that links for ``cpu``'s target ($CC/cc for the host)."""
    tgt = resolve_target(cpu)[0]
    if tgt.arch != host_target().arch:
        cc = shutil.which(tgt.cc)
        if not cc:
            raise RuntimeError(f"no C compiler for target {tgt.name}: {tgt.cc!r} not found "
                               f"(Debian: apt-get install gcc-{tgt.name})")
        return cc
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise RuntimeError("link_shared: no C compiler found (looked for $CC, cc, gcc, clang)")
    return cc


def write_objects(folder: str, objects: list[bytes]) -> list[str]:
    """Write object files into `folder` (part0.o, part1.o, ...); returns their paths."""
    paths = []
    for i, obj in enumerate(objects):
        p = os.path.join(folder, f"part{i}.o")
        with open(p, "wb") as f:
            f.write(obj)
        paths.append(p)
    return paths


@functools.lru_cache(maxsize=None)
def fast_linker_flags(cpu: str = "native") -> tuple:
    """cc flags that pick a faster linker than the default ld.bfd for ``cpu``'s target:
    ``-fuse-ld=gold`` on the host when ``ld.gold`` is installed (RLXC_LINKER=default
    turns it off).  link_shared falls back to the plain command if that link fails."""
    if os.environ.get("RLXC_LINKER", "") == "default" or not is_host(cpu):
        return ()
    return ("-fuse-ld=gold",) if shutil.which("ld.gold") else ()


def _soname(out_path: str, objects: list[bytes]) -> str:
    """The library's DT_SONAME: its file name, or for a temporary one (the compile cache
    builds under `.tmp-pPID-*`) a digest of the objects.  Without one the linker names
    the base version definition after the output path, here a random temporary file, so
    two builds of the same code differed and concurrent compiles of one Func left one
    content-addressed payload each in the cache."""
    base = os.path.basename(out_path)
    if not base.startswith(".tmp"):
        return base
    import hashlib

    h = hashlib.sha256()
    for o in objects:
        h.update(hashlib.sha256(o).digest())
    return f"rlxc-{h.hexdigest()[:16]}.so"


def link_shared(objects: list[bytes], out_path: str, extra_libs=("gomp",),
                cpu: str = "native", extra_flags=()) -> str:
    """Link object-file bytes into the shared library ``out_path``.

    Uses the system ``cc -shared``; ``"gomp"`` in ``extra_libs`` adds
    ``-fopenmp`` (which links libgomp and its dependencies), other names become
    ``-lNAME``; ``-lm`` is always added, then ``extra_flags`` (e.g. a version
    script for the artifact writer) and the soname (_soname, so that builds are
    reproducible).  The library is written to a temporary
    file next to ``out_path`` and renamed into place, so a concurrent loader
    never sees a half-written file.  Raises RuntimeError with cc's stderr on
    failure.  Returns the absolute output path."""
    out_path = os.path.abspath(out_path)
    out_dir = os.path.dirname(out_path) or "."
    os.makedirs(out_dir, exist_ok=True)
    cc = cc_for(cpu)
    with tempfile.TemporaryDirectory(prefix="rlxc-link-") as tmp:
        obj_paths = write_objects(tmp, objects)
        libs = []
        for lib in extra_libs:
            if lib in ("gomp", "omp", "openmp"):
                libs.append("-fopenmp")
            else:
                libs.append(f"-l{lib}")
        fd, tmp_out = tempfile.mkstemp(prefix=".tmp-" + os.path.basename(out_path), dir=out_dir)
        os.close(fd)
        cmd = [cc, "-shared", "-fPIC", "-o", tmp_out, *obj_paths, *libs, "-lm", *extra_flags,
               f"-Wl,-soname,{_soname(out_path, objects)}"]
        try:
            proc = None
            fast = fast_linker_flags(cpu)
            if fast:   # gold: ~20 ms less per link (a cold compile links once); else cc's ld
                proc = subprocess.run([cmd[0], *fast, *cmd[1:]], capture_output=True, text=True)
            if proc is None or proc.returncode != 0:
                proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(
                    f"link_shared: `{' '.join(cmd)}` failed (exit {proc.returncode}):\n"
                    f"{proc.stderr.strip() or proc.stdout.strip()}")
            os.chmod(tmp_out, 0o755)
            os.replace(tmp_out, out_path)
        finally:
            if os.path.exists(tmp_out):
                os.unlink(tmp_out)
    return out_path


def _unlocked():
    """llvmlite's C functions without its process-wide lock (which serializes every LLVM
    call, so threads would take turns): safe for a module, context and target machine
    that only one thread touches.  None when this llvmlite has no such handle."""
    from llvmlite.binding import ffi

    raw = getattr(ffi.lib, "_lib", None)
    need = ("LLVMPY_ParseAssembly", "LLVMPY_VerifyModule", "LLVMPY_RunNewModulePassManager",
            "LLVMPY_TargetMachineEmitToMemory")
    if raw is None or not all(hasattr(raw, n) for n in need):
        return None
    return raw


def _compile_part(text: str, cpu: str, opt: int, tuned: bool) -> bytes:
    """Object bytes of one part, in a context and target machine of its own (a worker
    thread of compile_objects)."""
    from ctypes import c_char_p, string_at

    from llvmlite.binding import ffi
    from llvmlite.binding.module import ModuleRef

    raw = _unlocked()
    ctx = llvm.create_context()
    with ffi.OutputString() as err:
        mod = ModuleRef(raw.LLVMPY_ParseAssembly(ctx, c_char_p(text.encode()), err), ctx)
        if err:
            mod.close()
            raise RuntimeError(f"LLVM IR parsing error\n{err}")
    tm = _new_target_machine(*_machine_spec(cpu, opt, tuned))   # this thread's own
    mod.triple = tm.triple
    mod.data_layout = str(tm.target_data)

    def verify():
        with ffi.OutputString() as err:
            if raw.LLVMPY_VerifyModule(mod, err):
                raise RuntimeError(str(err))
    verify()
    _hide_internal_state(mod)
    if opt > 0:
        pb = _pass_builder(tm, opt)
        raw.LLVMPY_RunNewModulePassManager(pb.getModulePassManager(), mod, pb)
        verify()
    with ffi.OutputString() as err:
        mb = raw.LLVMPY_TargetMachineEmitToMemory(tm, mod, 1, err)
        if not mb:
            raise RuntimeError(str(err))
    try:
        return string_at(ffi.lib.LLVMPY_GetBufferStart(mb), ffi.lib.LLVMPY_GetBufferSize(mb))
    finally:
        ffi.lib.LLVMPY_DisposeMemoryBuffer(mb)
        mod.close()


def compile_objects(text: str, cpu: str = "native", opt: int = 3, tuned: bool = True,
                    shared: bool = False) -> list[bytes]:
    """The objects of generated IR `text`: one, or one per part of a large module
    (partition.split_module; `shared` as there), compiled on up to as many threads as
    this process may use cores (at most RLXC_NUM_THREADS when set).  Link them all."""
    from rlxc.lowering.cpu.partition import split_module

    texts = split_module(text, hidden_globals=HIDDEN_GLOBALS, shared=shared)
    if len(texts) == 1 or _unlocked() is None:
        return [emit_object(compile_ir(text, cpu, opt, tuned), cpu, opt, tuned)]
    from rlxc.runtime.cpu import env_threads, usable_cores

    _ensure_init()
    cap = env_threads()   # the user's cap on rlxc's threads holds here too (0: none)
    workers = max(1, min(len(texts), usable_cores(), cap or len(texts)))
    if workers == 1:
        return [_compile_part(t, cpu, opt, tuned) for t in texts]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rlxc-llvm") as ex:
        return list(ex.map(lambda t: _compile_part(t, cpu, opt, tuned), texts))


def build_shared(modules, out_path: str, cpu: str = "native", opt: int = 3,
                 extra_libs=("gomp",)) -> str:
    """compile_ir + emit_object each of ``modules`` (IR text, llvmlite.ir
    Modules or ModuleRefs) and link_shared them into ``out_path``."""
    if not isinstance(modules, (list, tuple)):
        modules = [modules]
    objs = [emit_object(compile_ir(m, cpu, opt) if not isinstance(m, llvm.ModuleRef) else m,
                        cpu, opt) for m in modules]
    return link_shared(objs, out_path, extra_libs, cpu)


def ir_module(name: str = "rlxc", cpu: str = "native") -> ir.Module:
    """A fresh llvmlite.ir.Module with ``cpu``'s target triple set."""
    _ensure_init()
    m = ir.Module(name=name)
    m.triple = resolve_target(cpu)[0].triple if cpu not in ("native", "host", "") \
        else llvm.get_process_triple()
    return m

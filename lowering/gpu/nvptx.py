"""NVPTX target: llvmlite IR → PTX text → cubin (ptxas), with resource reports.

    llvmlite.ir.Module (kernels: `ptx_kernel` calling convention,
                        global memory = addrspace(1), shared = addrspace(3))
          │ check_intrinsics: every declared callee must have an NVPTX lowering
          │ (LLVM aborts the whole process on e.g. @llvm.exp.f32 otherwise)
          ▼
    verified ModuleRef (triple nvptx64-nvidia-cuda, NVPTX data layout)
          │ O3 (new pass manager) → TargetMachine(cpu=sm_XX, +ptxNN).emit_assembly
          ▼
    PTX text (.version N.M, .target sm_XX)
          │ assemble: `ptxas -arch=sm_XX -v` (when find_ptxas() finds one)
          ▼
    cubin bytes + {kernel: registers, spills, shared memory, stack}   or
    None + {} : the PTX ships as is and the CUDA driver JITs it at load

The PTX ISA version defaults to the lowest one that knows the arch (PTX 8.0
for sm_90, the CUDA 12.0 level, so an older driver can still JIT it);
`ptx_version=` asks for a newer one.  ptxas is looked up in $RLXC_PTXAS, PATH,
$CUDA_HOME/bin, $CUDA_PATH/bin, /usr/local/cuda/bin and the bin folder of an
installed `nvidia-cuda-nvcc` wheel.  A ptxas failure raises PtxasError carrying
ptxas's stderr; the compiler never hides it.
"""
from __future__ import annotations

import functools
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading

import llvmlite.binding as llvm
import llvmlite.ir as ir

__all__ = [
    "TRIPLE", "DEFAULT_ARCH", "NvptxError", "PtxasError", "ptx_features", "new_module",
    "check_intrinsics", "emit_ptx", "find_ptxas", "ptxas_version", "assemble",
    "parse_ptxas_info",
]

TRIPLE = "nvptx64-nvidia-cuda"
DATA_LAYOUT = "e-p6:32:32-i64:64-i128:128-i256:256-v16:16-v32:32-n16:32:64"
DEFAULT_ARCH = "sm_90"

# lowest PTX ISA (x10) that knows each arch; sm_90 asks for 8.0 (CUDA 12.0).
_MIN_PTX = {"sm_70": 60, "sm_75": 63, "sm_80": 70, "sm_86": 71, "sm_87": 74, "sm_89": 78,
            "sm_90": 80, "sm_90a": 80, "sm_100": 86, "sm_100a": 86, "sm_101": 86,
            "sm_120": 87, "sm_120a": 87}


class NvptxError(RuntimeError):
    """The IR cannot be turned into PTX (names the kernel or intrinsic at fault)."""


class PtxasError(RuntimeError):
    """ptxas rejected the PTX; the message carries its command line and stderr."""


_init_lock = threading.Lock()
_initialized = False


def _ensure_init() -> None:
    global _initialized
    with _init_lock:
        if not _initialized:
            llvm.initialize_all_targets()
            llvm.initialize_all_asmprinters()
            _initialized = True


def ptx_features(arch: str = DEFAULT_ARCH, ptx_version: int | None = None) -> str:
    """The LLVM feature string (`+ptx80`) for `arch`: the arch's minimum unless asked."""
    if not re.fullmatch(r"sm_\d+a?", arch):
        raise ValueError(f"gpu arch must look like 'sm_90', got {arch!r}")
    want = _MIN_PTX.get(arch, 80)
    if ptx_version is not None:
        if ptx_version < want:
            raise ValueError(f"{arch} needs PTX ISA >= {want / 10:.1f}, asked for "
                             f"{ptx_version / 10:.1f}")
        want = ptx_version
    return f"+ptx{want}"


def new_module(name: str = "rlxc_gpu") -> ir.Module:
    """A fresh llvmlite module for NVPTX (triple and data layout set)."""
    m = ir.Module(name=name)
    m.triple = TRIPLE
    m.data_layout = DATA_LAYOUT
    return m


@functools.lru_cache(maxsize=None)
def _target_machine(arch: str, features: str, opt: int):
    _ensure_init()
    target = llvm.Target.from_triple(TRIPLE)
    return target.create_target_machine(cpu=arch, features=features, opt=opt)


# Declared callees the NVPTX backend lowers (checked before codegen, because
# an unsupported one, e.g. @llvm.exp.f32 or @llvm.log.f32, makes LLVM abort
# the process with "no libcall available").  The math in mathlib.py is
# built from these.
_ALLOWED = re.compile(
    r"llvm\.nvvm\..*"
    r"|llvm\.(fma|fmuladd|sqrt|fabs|copysign|floor|ceil|trunc|rint|nearbyint|roundeven"
    r"|minnum|maxnum|minimum|maximum|exp2|ldexp|abs|smax|smin|umax|umin|ctpop|ctlz|cttz"
    r"|fptosi\.sat|fptoui\.sat"
    r"|assume|expect|lifetime\.start|lifetime\.end|memcpy|memset|fshl|fshr)(\..*)?")


def check_intrinsics(module: ir.Module | str) -> None:
    """Raise NvptxError naming any declared function NVPTX cannot lower."""
    text = str(module)
    for m in re.finditer(r'^declare [^@]*@"?([\w.$]+)"?\(', text, re.M):
        name = m.group(1)
        if not _ALLOWED.fullmatch(name):
            raise NvptxError(
                f"NVPTX: no lowering for @{name} (no libm on the GPU); build it from "
                "rlxc.lowering.gpu.mathlib or an @llvm.nvvm.* intrinsic")


def emit_ptx(module: ir.Module | str, arch: str = DEFAULT_ARCH, opt: int = 3,
             ptx_version: int | None = None) -> str:
    """PTX text for an llvmlite module (or IR text) holding `ptx_kernel` functions."""
    features = ptx_features(arch, ptx_version)
    check_intrinsics(module)
    _ensure_init()
    text = str(module)
    try:
        mod = llvm.parse_assembly(text)
        mod.triple = TRIPLE
        mod.data_layout = DATA_LAYOUT
        mod.verify()
    except RuntimeError as e:
        raise NvptxError(f"NVPTX: invalid LLVM IR: {e}") from e
    tm = _target_machine(arch, features, opt)
    if opt > 0:
        pto = llvm.create_pipeline_tuning_options(speed_level=opt)
        pb = llvm.create_pass_builder(tm, pto)
        pb.getModulePassManager().run(mod, pb)
        mod.verify()
    return tm.emit_assembly(mod)


# ------------------------------------------------------------------ ptxas

def _wheel_ptxas() -> list[str]:
    """ptxas inside an installed nvidia-cuda-nvcc wheel (its layout varies by CUDA major)."""
    out = []
    for base in sys.path:
        if not base or not os.path.isdir(os.path.join(base, "nvidia")):
            continue
        for pat in ("nvidia/cuda_nvcc/bin/ptxas", "nvidia/*/bin/ptxas", "nvidia/*/*/bin/ptxas"):
            out.extend(sorted(glob.glob(os.path.join(base, pat))))
    return out


def find_ptxas() -> str | None:
    """Path of a runnable ptxas, or None (then PTX ships for the driver to JIT)."""
    cands = []
    env = os.environ.get("RLXC_PTXAS")
    if env:
        if env.lower() in ("0", "none", "off"):
            return None
        cands.append(env)
    w = shutil.which("ptxas")
    if w:
        cands.append(w)
    for var in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"):
        if os.environ.get(var):
            cands.append(os.path.join(os.environ[var], "bin", "ptxas"))
    cands.append("/usr/local/cuda/bin/ptxas")
    cands.extend(_wheel_ptxas())
    for c in cands:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.abspath(c)
    return None


@functools.lru_cache(maxsize=None)
def ptxas_version(ptxas: str) -> str:
    """'13.0' for ptxas from CUDA 13.0 ('' when it cannot say)."""
    try:
        out = subprocess.run([ptxas, "--version"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    m = re.search(r"release (\d+\.\d+)", out)
    return m.group(1) if m else ""


_FUNC = re.compile(r"(?:Compiling entry function|Function properties for) '?([\w$.]+)'?")


def parse_ptxas_info(text: str) -> dict[str, dict]:
    """Per-kernel resources from `ptxas -v` output:
    {kernel: {registers, spill_stores, spill_loads, stack, smem, cmem, barriers}}."""
    info: dict[str, dict] = {}
    cur = None
    for line in text.splitlines():
        m = _FUNC.search(line)
        if m:
            cur = info.setdefault(m.group(1), {"registers": 0, "spill_stores": 0,
                                               "spill_loads": 0, "stack": 0, "smem": 0,
                                               "cmem": 0, "barriers": 0})
            continue
        if cur is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                      line)
        if m:
            cur["stack"], cur["spill_stores"], cur["spill_loads"] = map(int, m.groups())
        m = re.search(r"Used (\d+) registers", line)
        if m:
            cur["registers"] = int(m.group(1))
            b = re.search(r"used (\d+) barriers", line)
            s = re.search(r"(\d+) bytes smem", line)
            c = re.findall(r"(\d+) bytes cmem\[\d+\]", line)
            cur["barriers"] = int(b.group(1)) if b else 0
            cur["smem"] = int(s.group(1)) if s else 0
            cur["cmem"] = sum(int(x) for x in c)
    return info


def assemble(ptx: str, arch: str = DEFAULT_ARCH, ptxas: str | None = None,
             opt_level: int = 3, timeout: float = 300) -> tuple[bytes | None, dict]:
    """`ptxas -arch=ARCH -v` on `ptx` → (cubin bytes, {kernel: resources}).

    Returns (None, {}) when no ptxas is found (the driver JITs the PTX).
    Raises PtxasError with ptxas's stderr when it rejects the PTX."""
    ptxas = ptxas or find_ptxas()
    if ptxas is None:
        return None, {}
    with tempfile.TemporaryDirectory(prefix="rlxc-ptxas-") as tmp:
        src = os.path.join(tmp, "k.ptx")
        out = os.path.join(tmp, "k.cubin")
        with open(src, "w") as f:
            f.write(ptx)
        cmd = [ptxas, f"-arch={arch}", f"-O{opt_level}", "-v", src, "-o", out]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise PtxasError(f"`{' '.join(cmd)}` timed out after {timeout} s") from e
        log = (p.stdout or "") + (p.stderr or "")
        if p.returncode != 0:
            raise PtxasError(f"`{' '.join(cmd)}` failed (exit {p.returncode}):\n{log.strip()}")
        with open(out, "rb") as f:
            cubin = f.read()
    return cubin, parse_ptxas_info(log)

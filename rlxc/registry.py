"""The backend registry: every device rlxc runs on or compiles for is one entry here.

    name ──► Backend                                   (who reads it)
               .target        runtime half: family, LLVM triple, machines
                              (runtime/targets.py; the artifact loader reads that)
               .stages        its `--emit` stages besides "rlx"    (rlxc compile --emit)
               .priority      `run()` with no device takes the     (default_device)
                              available backend with the highest
               .compile(module, name, **options)  code in memory   (a cache's compile step)
               .emit(stage, module, name, cpu)                     (rlxc compile --emit)
               .write_artifact(spec, outdir, progress)             (rlxc compile -o)
               .load(outdir)                a loaded artifact      (runtime/loader.py)
               .executor(func, **options)   `.run(arrays)`         (Func.run_on, train_step)
               .jit(func, **options)        a Jitted               (Func.jit_on)
               .step_engine(prog, args, state_pos)                 (Trainer)
               .unavailable_reason()        None when it runs here

Registered here: "cpu" (this host; priority 10), "cuda" (NVIDIA GPUs; 20, so a
usable GPU wins) and "interp" (the NumPy reference interpreter; 0: it runs but
compiles nothing).  `RLXC_DEVICE` overrides the automatic choice.

Cross targets "aarch64-linux-gnu" and "x86_64-linux-gnu" (priority -10: chosen
only by name) compile for another architecture.  A new target is one
`register` call: a CPU for another LLVM triple is
`CpuBackend(Target(name, "cpu", triple, machines), default_cpu=...)` plus its
lowering description (triple, cross compiler, sysroot) under the same name in
lowering/cpu/target.py TARGETS
(its runtime half registered with runtime.targets.register_target, so that
artifacts built for it load, or are refused with a clear error, without the
compiler).  Importing this module is cheap: every hook imports the lowering
or the compile caches (rlxc/backends.py) on first use.
"""
from __future__ import annotations

import inspect
import os

from rlxc.runtime.call import ExecutorLoop, ResidentCall
from rlxc.runtime.targets import Target, register_target, unregister_target
from rlxc.runtime.targets import target as runtime_target

__all__ = ["Backend", "CpuBackend", "CudaBackend", "InterpBackend", "register", "unregister",
           "backend", "devices", "native_devices", "artifact_targets", "emit_stages",
           "default_device"]


class Backend:
    """One device: what it is, and the hooks that compile for it and run on it."""

    stages: tuple = ()          # --emit stages besides "rlx"
    native = True               # compiles to native code (jit_on, a compile cache)
    writes_artifacts = True     # `rlxc compile --target NAME`
    train_artifact = False      # `rlxc compile --train` (a C train step)

    def __init__(self, name: str, target: Target | None, priority: int = 0,
                 description: str = ""):
        self.name = name
        self.target = target
        self.priority = priority
        self.description = description or (target.description if target else "")

    def unavailable_reason(self) -> str | None:
        return self.target.unavailable_reason() if self.target is not None else None

    def available(self) -> bool:
        return self.unavailable_reason() is None

    def _none(self, what: str):
        raise ValueError(f"backend {self.name!r} has no {what}")

    # -- compiler half (each imports the lowering on first use)
    def compile(self, module, name: str | None = None, **options):
        """The lowering of an rlx module to this target's code (an artifact object)."""
        self._none("compiler")

    def emit(self, stage: str, module, name: str, cpu: str) -> str:
        """The text of one --emit stage (one of `stages`)."""
        self._none(f"--emit stage {stage!r}")

    def write_artifact(self, spec, outdir: str, progress=None) -> dict:
        """Build `rlxc compile`'s artifact for `spec` (lowering/aot.py) into `outdir`."""
        self._none("artifact writer")

    # -- runtime half
    def load(self, outdir, name: str | None = None):
        """Load an artifact that `rlxc compile --target NAME` wrote (runtime/loader.py,
        whose implementation is keyed by this backend's runtime target family);
        ArtifactError for an artifact of another target."""
        from rlxc.runtime.errors import ArtifactError
        from rlxc.runtime.loader import CompiledModule, find_metadata, read_metadata

        path = find_metadata(outdir, name)
        target = read_metadata(path)["target"]
        if target != self.name:
            raise ArtifactError(f"{path}: built for --target {target}, not {self.name}")
        return CompiledModule(path)

    def executor(self, func, **options):
        """An object with `.run(arrays in signature order) -> outputs` for `func`."""
        self._none("executor")

    def jit(self, func, **options):
        """`func` compiled once, its params bound (Func.jit_on)."""
        raise ValueError(f"jit_on: {self.name!r} is not a native backend; valid: "
                         f"{native_devices()}")

    def step_engine(self, prog, args: list, state_pos: list[int]):
        """The Trainer's engine for a step program (rlxc/train.py StepProgram): the
        runtime.call.ResidentCall interface (set_arg, run, get_arg, read)."""
        return ExecutorLoop(prog.executor(self.name), args, state_pos)

    def __repr__(self):
        return f"{type(self).__name__}({self.name!r})"


class CpuBackend(Backend):
    """Native CPU code for `target.triple` (the host's when empty): a shared library with
    the C ABI, cached on disk (rlxc/backends.py), called through runtime/call.py."""

    stages = ("loops", "llvm", "asm")
    train_artifact = True

    def __init__(self, target: Target, priority: int = 10, default_cpu: str = "native",
                 description: str = ""):
        super().__init__(target.name, target, priority, description)
        self.default_cpu = default_cpu

    def arch(self) -> str:
        """The CPU architecture its code is for ("x86_64", "aarch64")."""
        from rlxc.runtime.targets import host_machine

        m = self.target.machines[0] if self.target.machines else host_machine()
        return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)

    def cpu_string(self, cpu: str | None = None) -> str:
        """The lowering's cpu string (lowering/cpu/target.py resolve_target): a CPU name
        for the host target; "TARGET" or "TARGET:CPU" for a cross target, whose
        description (triple, cross compiler, sysroot) the lowering keeps under the
        same name."""
        cpu = cpu or self.default_cpu
        if not self.target.triple or cpu.split(":")[0] == self.name:
            return cpu
        return self.name if cpu in ("native", "host", "") else f"{self.name}:{cpu}"

    def codegen_options(self, cpu: str | None = None) -> dict:
        """The lowering's target options: the cpu string."""
        return {"cpu": self.cpu_string(cpu)}

    def _lower(self, fn, module, name, cpu, **options):
        """Call a lowering entry point with this target's codegen options."""
        return fn(module, name, **self.codegen_options(cpu), **options)

    def compile(self, module, name=None, cpu=None, **options):
        from rlxc.lowering.cpu.driver import compile_cpu

        return self._lower(compile_cpu, module, name, cpu, **options)

    def emit(self, stage, module, name, cpu):
        from rlxc.lowering.cpu import driver as low

        fn = {"loops": low.emit_loops, "llvm": low.emit_llvm, "asm": low.emit_asm}.get(stage)
        if fn is None:
            return super().emit(stage, module, name, cpu)
        return self._lower(fn, module, name, cpu)

    def write_artifact(self, spec, outdir, progress=None):
        from rlxc.lowering.artifact.writer import build_artifact

        return build_artifact(spec, outdir, progress)

    def _run_options(self, options: dict) -> dict:
        """Options of the compile cache (rlxc/backends.py) with this target's cpu string."""
        out = dict(options)
        out["cpu"] = self.cpu_string(out.get("cpu"))
        return out

    def executor(self, func, **options):
        from rlxc.backends import executor

        self.target.require()  # a cross target: refuse before compiling anything
        return executor(func, self.name, **self._run_options(options))

    def jit(self, func, **options):
        from rlxc.backends import jit

        self.target.require()
        return jit(func, self.name, **self._run_options(options))

    def step_engine(self, prog, args, state_pos):
        from rlxc.backends import library_for

        self.target.require()
        if getattr(prog, "dynamic", False):   # dynamic dims: one library for every size
            from rlxc.dynone import one_library

            one = one_library(prog.func, self)
            if one is not None:
                from rlxc.runtime.call import ExecutorLoop

                return ExecutorLoop(one, args, state_pos)
            from rlxc.backends import library
            from rlxc.dynamic import SizedEngine

            opts = self._run_options({})
            return SizedEngine(prog, lambda g, a: ResidentCall(library(g, self.name, **opts), a,
                                                               state_pos), args, state_pos)
        # found by the step's alias when compiled before: no trace, no transform
        lib = library_for(prog.cache_alias(), lambda: prog.func, self.name,
                          **self._run_options({}))
        return ResidentCall(lib, args, state_pos)


class CudaBackend(Backend):
    """NVIDIA GPUs: PTX (and a cubin when ptxas is found) run through the CUDA driver."""

    stages = ("ptx",)

    def compile(self, module, name=None, arch=None, **options):
        from rlxc.lowering.gpu.driver import compile_cuda

        if arch is not None:
            options["arch"] = arch
        return compile_cuda(module, name, **options)

    def emit(self, stage, module, name, cpu):
        if stage == "ptx":
            from rlxc.lowering.gpu.driver import emit_ptx

            return emit_ptx(module)
        return super().emit(stage, module, name, cpu)

    def write_artifact(self, spec, outdir, progress=None):
        from rlxc.lowering.artifact.writer import build_cuda_artifact

        return build_cuda_artifact(spec, outdir, progress)

    def executor(self, func, **options):
        from rlxc.backends import cuda_program

        return cuda_program(func, options.get("arch"))

    def jit(self, func, **options):
        from rlxc.backends import CudaJitted, cuda_program

        return CudaJitted(func, cuda_program(func, options.get("arch")))


class InterpBackend(Backend):
    """The NumPy reference interpreter (dialect/interpreter.py): runs any module."""

    native = False
    writes_artifacts = False

    def executor(self, func, **options):
        if options:
            raise TypeError(f"the interpreter takes no options, got {sorted(options)}")
        return _InterpExecutor(func.module)


class _InterpExecutor:
    def __init__(self, module):
        self.module = module

    def run(self, arrays):
        from rlxc.dialect.interpreter import interpret

        return interpret(self.module, arrays)


# -- the table ---------------------------------------------------------------------------
_BACKENDS: dict[str, Backend] = {}
_auto: list = []  # the automatic choice, once made (cleared by register)


def register(b: Backend) -> Backend:
    """Add (or replace) a backend, and its runtime target; returns it."""
    if b.target is not None:
        register_target(b.target)
    _BACKENDS[b.name] = b
    _auto.clear()
    return b


def unregister(name: str) -> None:
    """Remove a backend (and its runtime target)."""
    b = _BACKENDS.pop(name, None)
    if b is not None and b.target is not None:
        unregister_target(b.target.name)
    _auto.clear()


def backend(name: str) -> Backend:
    """The registered backend `name`, or a ValueError listing the valid ones."""
    b = _BACKENDS.get(name)
    if b is None:
        raise ValueError(f"unknown device {name!r}; valid: {devices()}")
    return b


def devices() -> list[str]:
    """Every name `Func.run_on` accepts, in registration order."""
    return list(_BACKENDS)


def native_devices() -> list[str]:
    """The names `Func.jit_on` accepts."""
    return [n for n, b in _BACKENDS.items() if b.native]


def artifact_targets() -> list[str]:
    """The names `rlxc compile --target` accepts."""
    return [n for n, b in _BACKENDS.items() if b.writes_artifacts]


def emit_stages() -> list[str]:
    """Every `rlxc compile --emit` stage: "rlx", then each backend's, in order."""
    out = ["rlx"]
    for b in _BACKENDS.values():
        out += [s for s in b.stages if s not in out]
    return out


def default_device() -> str:
    """RLXC_DEVICE if set, else the available backend with the highest priority
    (cuda when a GPU is usable, else cpu)."""
    env = os.environ.get("RLXC_DEVICE")
    if env:
        if env not in _BACKENDS:
            raise ValueError(f"RLXC_DEVICE={env!r}; valid: {devices()}")
        return env
    if not _auto:
        best = sorted(_BACKENDS.values(), key=lambda b: -b.priority)
        _auto.append(next(b.name for b in best if b.available()))
    return _auto[0]


register(CpuBackend(runtime_target("cpu")))
register(CudaBackend("cuda", runtime_target("cuda"), priority=20))
register(InterpBackend("interp", None, priority=0,
                       description="the NumPy reference interpreter (runs, compiles nothing)"))
# Cross targets: code for another architecture, compiled here and run there (their
# lowering description, with the cross compiler, is lowering/cpu/target.py TARGETS).
register(CpuBackend(runtime_target("aarch64-linux-gnu"), priority=-10,
                    default_cpu="aarch64-linux-gnu"))
register(CpuBackend(runtime_target("x86_64-linux-gnu"), priority=-10,
                    default_cpu="x86_64-linux-gnu"))

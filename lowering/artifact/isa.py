"""Which instruction-set features code compiled for an LLVM CPU may use, asked of LLVM.

    cpu ("native", "x86-64-v3", "skylake-avx512", ...)
          │ one probe module: for each feature F in runtime/cpufeatures.FEATURES,
          │   an internal function with "target-features"="+F" called from a
          │   caller with "target-cpu"=cpu; run the O2 inliner
          ▼
    the features whose callee got inlined (sorted): recorded in NAME.json and
    checked by the loader and by the library's glue (cpuid) before any call

Why the inliner: LLVM inlines a callee only when its target features are a
subset of the caller's (X86 TTI areInlineCompatible), so the probe reads
LLVM's own CPU definitions, the same ones that chose the instructions, with
no hand-kept table of CPUs.  The callee stores to a volatile global so the
call cannot be deleted as dead instead of inlined.  About 50 ms, cached.
"""
from __future__ import annotations

import functools

import llvmlite.binding as llvm

from rlxc.lowering.cpu.target import host_cpu_name, resolve_target
from rlxc.runtime.cpufeatures import FEATURES

__all__ = ["required_features", "PORTABLE_CPU"]

# `--cpu portable`: the x86-64-v3 psABI level (AVX2, FMA, F16C, BMI1/2, LZCNT,
# MOVBE).  Every x86-64 server and desktop CPU since 2013 (Haswell) / 2017 (Zen 1)
# has it, and it is the level the AVX2 sgemm microkernel is written for; v2
# would halve the vector width for the few pre-2013 machines left.
PORTABLE_CPU = "x86-64-v3"


def _probe_ir(cpu: str, features: str, names: list[str]) -> str:
    lines = ["@g = global i32 0"]
    for i in range(len(names)):
        lines.append(f"define internal void @p{i}() #{i + 1} {{\n"
                     f"  store volatile i32 {i}, ptr @g\n  ret void\n}}")
    calls = "".join(f"  call void @p{i}()\n" for i in range(len(names)))
    lines.append(f"define void @probe() #0 {{\n{calls}  ret void\n}}")
    lines.append(f'attributes #0 = {{ "target-cpu"="{cpu}" "target-features"="{features}" }}')
    for i, f in enumerate(names):
        lines.append(f'attributes #{i + 1} = {{ "target-cpu"="x86-64" "target-features"="+{f}" }}')
    return "\n".join(lines) + "\n"


@functools.lru_cache(maxsize=None)
def required_features(cpu: str = "native") -> tuple[str, ...]:
    """The FEATURES that code built for `cpu` may use (LLVM's definition of `cpu`)."""
    host_cpu_name()  # initializes LLVM's targets
    tgt, name, feats = resolve_target(cpu)
    triple = tgt.triple if cpu not in ("native", "host", "") else llvm.get_process_triple()
    if tgt.arch != "x86_64" or not triple.startswith(("x86_64", "i686", "i386")):
        return ()   # the cpuid check is x86-64's; other targets record no features
    names = sorted(FEATURES)
    mod = llvm.parse_assembly(_probe_ir(name, feats, names))
    mod.triple = triple
    tm = llvm.Target.from_triple(triple).create_target_machine(cpu="x86-64", opt=2,
                                                               reloc="pic")
    mod.data_layout = str(tm.target_data)
    pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=2))
    pb.getModulePassManager().run(mod, pb)
    body = str(mod.get_function("probe"))
    return tuple(f for i, f in enumerate(names) if f"@p{i}()" not in body)

"""The native CPU backend driver: rlx module -> loops -> LLVM -> object -> .so.

    rlx module (one func.func)
          │ schedule.build_program   fusion groups -> loop kernels      (--emit loops)
          │ matmul_chain.form_chains, operand_prologue.operand_prologue
          │ buffers.plan             workspace offsets, liveness reuse
          │ llvmgen.generate         llvmlite module                    (--emit llvm)
          │ dedup.merge_identical    one copy of each repeated kernel
          │ target.compile_objects   O3, loop + SLP vectorizer, then    (--emit llvm, optimized;
          │                          x86-64 ELF objects: a large module  --emit asm: one
          │                          in parts side by side (partition)   module)
          │ target.link_shared       cc -shared -fopenmp
          ▼
    libNAME.so exporting
        int32_t rlx_NAME(void **inputs, void **outputs, void **params, void *workspace);
        int64_t rlx_NAME_workspace_size(void);
        void    rlxc_set_num_threads(int32_t);    int32_t rlxc_get_num_threads(void);

C ABI of the entry.  `inputs`, `params` and `outputs` are arrays of data
pointers in declaration order (inputs and params counted separately, as
signature order filtered by kind), each a C-contiguous array of the declared
shape: f32 -> float, i32 -> int32_t, i64 -> int64_t, i1 -> one byte 0/1.
`workspace` points to rlx_NAME_workspace_size() bytes, 64-byte aligned, used
by one call at a time (concurrent calls need one workspace each).  Inputs and
params are only read; outputs are fully written and must not overlap inputs.
Returns 0, or an error code listed in the artifact's `errors` (an index out of
range in gather/scatter_add, detected before any memory is touched).
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field

ABI = 1


@dataclass
class CompiledArtifact:
    """A compiled function: object bytes, the linked .so and what a loader needs."""

    name: str
    entry: str                 # "rlx_<name>"
    workspace_symbol: str      # "rlx_<name>_workspace_size"
    workspace_size: int        # bytes (also returned by the workspace symbol)
    object: bytes
    so_path: str | None
    args: list                 # [{"name", "kind", "shape", "dtype"}] in signature order
    outputs: list              # [{"shape", "dtype"}]
    errors: dict               # {code: [exception name, message]}
    cpu: str
    timings: dict = field(default_factory=dict)
    parallel: bool = True      # some kernel may split over threads (else one thread always)
    error_args: dict = field(default_factory=dict)  # {code: [kind, index, bound]} (Program)
    batch_split: dict | None = None   # batchsplit_static.py: {"symbol", "reason", "rows"}
    parts: list = field(default_factory=list)   # the objects `object` combines (see below)
    prepack: list = field(default_factory=list)  # weights the prepacked entry takes packed
    #                                              (runtime/prepack.py layouts, slot order)

    @property
    def inputs(self) -> list:
        return [a for a in self.args if a["kind"] == "input"]

    @property
    def params(self) -> list:
        return [a for a in self.args if a["kind"] == "param"]

    def metadata(self) -> dict:
        """JSON-serializable description for runtime/cpu.py (and, under "sgemm", the
        blocking the target's sgemm was derived with: sgemm_kernels.sgemm_params)."""
        from rlxc.lowering.cpu.sgemm_kernels import sgemm_params

        return {"abi": ABI, "name": self.name, "entry": self.entry,
                "workspace_symbol": self.workspace_symbol,
                "workspace_size": self.workspace_size, "args": self.args,
                "outputs": self.outputs,
                "errors": {str(k): list(v) for k, v in self.errors.items()}, "cpu": self.cpu,
                "parallel": self.parallel, "sgemm": sgemm_params(self.cpu),
                "error_args": {str(k): list(v) for k, v in self.error_args.items()},
                **({"batch_split": self.batch_split} if self.batch_split is not None else {}),
                **({"prepack": self.prepack, "prepack_entry": self.entry + "_prepacked"}
                   if self.prepack else {})}


def default_threads() -> int:
    """Threads the sgemm workspace is sized for (RLXC_MAX_THREADS, else cores, at most 32)."""
    env = os.environ.get("RLXC_MAX_THREADS")
    if env:
        return max(1, int(env))
    return max(1, min(os.cpu_count() or 1, 32))


def _name(module, name):
    from rlxc.dialect.module import get_func

    name = name or get_func(module).sym_name.data
    if not name.isidentifier():
        raise ValueError(f"compile_cpu: name must be a C identifier, got {name!r}")
    return name


def lower(module, name: str | None = None, cpu: str = "native", max_threads: int | None = None):
    """The planned loop program of an rlx module."""
    from rlxc.lowering.cpu import buffers
    from rlxc.lowering.cpu.schedule import build_program

    prog = build_program(module, _name(module, name), max_threads or default_threads(), cpu)
    from rlxc.lowering.cpu.matmul_chain import form_chains

    form_chains(prog, cpu)   # chained small-batch GEMMs: one team (matmul_chain.py)
    from rlxc.lowering.cpu.operand_prologue import operand_prologue

    operand_prologue(prog, cpu)   # big per-image operands built per image (its header)
    from rlxc.lowering.cpu.rowfuse import fuse_rows

    fuse_rows(prog)   # after operand_prologue, whose producers are single loop nests
    from rlxc.lowering.cpu.rowlocal import localize

    localize(prog)    # temps that live in one row block: a block per thread (rowlocal.py)
    buffers.plan(prog)
    return prog


def emit_loops(module, name: str | None = None, cpu: str = "native") -> str:
    """The loop IR as text (`rlxc compile --emit loops`)."""
    from rlxc.lowering.cpu.loops import format_program
    from rlxc.lowering.cpu.regions import emit_region_loops, has_regions

    if has_regions(module):
        return emit_region_loops(module, _name(module, name), cpu)
    return format_program(lower(module, name, cpu))


def llvm_module(module, name: str | None = None, cpu: str = "native",
                max_threads: int | None = None):
    from rlxc.lowering.cpu.codegen import generate
    from rlxc.lowering.cpu.regions import generate_regions, has_regions

    if has_regions(module):   # rlx.scan/while/if: native loops around sub-programs
        return generate_regions(module, _name(module, name), cpu, max_threads or
                                default_threads())
    prog = lower(module, name, cpu, max_threads)
    from rlxc.lowering.cpu.batchsplit_static import NotSplit, split_static

    try:   # a batch-separable program: one region over row chunks (batchsplit_static.py)
        return split_static(module, prog, prog.name, cpu, max_threads or default_threads())
    except NotSplit as e:
        prog.batch_split_json = {"symbol": None, "reason": str(e)}
    return generate(prog, cpu), prog


def emit_llvm(module, name: str | None = None, optimized: bool = False, cpu: str = "native",
              opt: int = 3) -> str:
    """LLVM IR text, as generated (default) or after the O`opt` pipeline."""
    m, _ = llvm_module(module, name, cpu)
    if not optimized:
        return str(m)
    from rlxc.lowering.cpu.target import compile_ir

    return str(compile_ir(m, cpu, opt))


def emit_asm(module, name: str | None = None, cpu: str = "native", opt: int = 3) -> str:
    from rlxc.lowering.cpu.target import compile_ir
    from rlxc.lowering.cpu.target import emit_asm as _asm

    m, _ = llvm_module(module, name, cpu)
    return _asm(compile_ir(m, cpu, opt), cpu, opt)


def compile_cpu(func_module, name: str | None = None, cpu: str = "native", opt: int = 3,
                so_path: str | None = None, link: bool = True,
                max_threads: int | None = None, combine: bool = True) -> CompiledArtifact:
    """Compile an rlx module to an object and (unless link=False) a shared library.

    The library goes to `so_path` (written atomically), or to a fresh temporary
    directory when it is None.  `parts` holds the objects the library is made of
    (the generated code, in one object or one per part of a large module:
    partition.py; then the shared sgemm objects it calls); `object` is them combined
    into one relocatable object (`cc -r`), unless combine=False: then it is the first
    part alone and a caller that links links `parts` (one linker run fewer on a cold
    compile: rlxc/backends.py)."""
    from rlxc.lowering.cpu.dedup import merge_identical
    from rlxc.lowering.cpu.loops import MatmulKernel
    from rlxc.lowering.cpu.sgemm_object import relocatable_link, sgemm_object
    from rlxc.lowering.cpu.target import compile_objects, link_shared

    t = {}
    t0 = time.perf_counter()
    name = _name(func_module, name)
    m, prog = llvm_module(func_module, name, cpu, max_threads)
    text, _ = merge_identical(str(m))   # repeated layers: one copy of each kernel
    t["lower"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    parts = compile_objects(text, cpu, opt)   # LLVM O3 + codegen, large modules in parts
    t["llvm"] = time.perf_counter() - t0
    t["llvm parts"] = len(parts)
    obj = parts[0]
    variants = sorted({"plain" if k.epilogue is None else "cb" for kk in prog.kernels
                       for k in getattr(kk, "steps", [kk]) if isinstance(k, MatmulKernel)})
    if variants:  # the shared sgemm entry points it calls (sgemm_object.py)
        parts += [sgemm_object(cpu, v) for v in variants]
    if len(parts) > 1 and combine:
        t0 = time.perf_counter()
        obj = relocatable_link(parts, cpu)
        t["ld -r"] = time.perf_counter() - t0
    path = None
    if link:
        t0 = time.perf_counter()
        if so_path is None:  # a private folder of this process, removed at exit
            tmp = tempfile.mkdtemp(prefix=f"rlxc-p{os.getpid()}-")
            atexit.register(shutil.rmtree, tmp, True)
            so_path = os.path.join(tmp, f"lib{name}.so")
        path = link_shared(parts, so_path, cpu=cpu)
        t["link"] = time.perf_counter() - t0
    args = [{"name": a.name, "kind": a.kind, "shape": list(a.shape), "dtype": a.dtype}
            for a in prog.args]
    outs = [{"shape": list(s), "dtype": d} for s, d in prog.outputs]
    split = getattr(prog, "batch_split_json", None) or {}   # none: a program with regions
    return CompiledArtifact(name, f"rlx_{name}", f"rlx_{name}_workspace_size",
                            prog.workspace_size, obj, path, args, outs,
                            {int(k): list(v) for k, v in prog.errors.items()}, cpu, t,
                            split.get("symbol") is not None or
                            has_parallel_kernels(prog, cpu),
                            {int(k): list(v) for k, v in prog.error_args.items()},
                            split or None, parts, list(getattr(prog, "prepack", None) or []))


def has_parallel_kernels(prog, cpu: str = "native") -> bool:
    """Can any kernel of `prog` run on more than one thread?  (A loop nest marked
    parallel with enough work, or an sgemm given workspace for a team.)  The runtime
    does not tune the thread count of a program that never forks."""
    from rlxc.lowering.cpu.loops import For, LoopKernel, MatmulKernel
    from rlxc.lowering.cpu.tuning import PAR_MIN_WORK
    from rlxc.lowering.cpu.sgemm_kernels import sgemm_workspace_floats

    for k in prog.kernels:
        if isinstance(k, LoopKernel) and k.body and isinstance(k.body[0], For) and \
                k.body[0].parallel and k.work >= PAR_MIN_WORK:
            return True
        if (getattr(k, "parallel", False) is True or getattr(k, "forks", False)) and \
                k.work >= PAR_MIN_WORK:
            return True   # a kernel with its own codegen (attention_kernel.py, matmul_chain.py)
        if isinstance(k, MatmulKernel) and \
                k.scratch.numel > sgemm_workspace_floats(k.m, k.n, k.k, 1, cpu=cpu):
            return True
    return False

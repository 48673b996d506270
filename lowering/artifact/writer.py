"""Artifact writer: a compiled model as libNAME.so + NAME.h + NAME.json + NAME/.

    ArtifactSpec (rlxc/export.py: spec_from_func [+ train_spec for --train])
          │ lowering/cpu/driver.py compile_cpu per function: kernel object with
          │   int32_t rlx_<sym>(void **inputs, void **outputs, void **params, void *ws)
          ▼
    objects:  kernel.o [step.o]  +  glue.o (glue.py fills templates/glue.c.in; cc.py)
              +  blob.o (baked params, .incbin)
          │ cc.link_library (cc -shared)
          ▼
    OUTDIR/libNAME.so   NAME.h (header.py)   NAME.json (metadata.py)   NAME/ (package.py)

A Func with dynamic dims (spec.dims) takes the size-generic path instead
(dynglue.py): every kernel is compiled once for all sizes by
lowering/cpu/dynsizes.py (entry `rlx_<sym>(..., const int64_t *dims)`; a kernel
without symbols, such as the optimizer update, stays static), and the glue adds
NAME_set_dims and per-context shapes; a graph no single program serves raises
NotSizeGeneric (`rlxc compile` then asks for --sizes).

Purpose
-------
One compile serves three users: a C/C++ program (`NAME.h` + `libNAME.so`),
`import NAME`, and `rlxc.runtime.load(OUTDIR)`.  The C ABI is the one
documented in templates/header.h.in (and in examples/embed_c/README.md).
This module only orders the steps and writes the files: every text comes from
a template filler, every cc call from cc.py.

Every file is written to a temporary name and renamed into place; the JSON,
which holds the .so's sha256, is written last.
"""
from __future__ import annotations

import os
import tempfile

from rlxc.runtime.loader import sha256_file

from . import cc, isa
from .dynglue import NotSizeGeneric, compile_kernel
from .glue import emit_blob_asm, emit_glue, exported_symbols
from .header import emit_header
from .metadata import dump_metadata, emit_metadata
from .package import emit_package, runtime_files
from .progress import NoProgress, Progress
from .spec import ArtifactSpec, blob_layout

__all__ = ["build_artifact", "build_cuda_artifact", "write_atomic"]


def write_atomic(path: str, data: bytes | str) -> None:
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-" + os.path.basename(path), dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _compile_kernel(module, sym: str, cpu: str, progress: Progress):
    """lowering/cpu/driver.py's CompiledArtifact (object bytes, no .so) of `module` as `rlx_<sym>`."""
    from rlxc.lowering.cpu import driver as backend

    with progress.stage(f"backend {sym}"):
        art = backend.compile_cpu(module, sym, cpu=cpu, link=False)
    for stage, secs in (art.timings or {}).items():
        progress.record(f"  {sym}: {stage}", secs)
    return art


def _blob_bytes(spec: ArtifactSpec) -> bytes:
    layout, size = blob_layout(spec)
    out = bytearray(size)
    for name, off in layout.items():
        data = spec.baked[name].tobytes()
        out[off:off + len(data)] = data
    return bytes(out)


def _write_package(spec: ArtifactSpec, outdir: str) -> None:
    """NAME/__init__.py and NAME/_runtime/ (stale runtime files of an older build removed)."""
    pkg = os.path.join(outdir, spec.name)
    rt = os.path.join(pkg, "_runtime")
    os.makedirs(rt, exist_ok=True)
    files = runtime_files()
    for f in os.listdir(rt):
        if f.endswith(".py") and f not in files:
            os.unlink(os.path.join(rt, f))
    for f, data in files.items():
        write_atomic(os.path.join(rt, f), data)
    write_atomic(os.path.join(pkg, "__init__.py"), emit_package(spec))


def build_artifact(spec: ArtifactSpec, outdir: str, progress: Progress | None = None) -> dict:
    """Compile `spec` and write the artifact into `outdir`; returns the JSON dict."""
    progress = progress or NoProgress()
    from rlxc.runtime.targets import target as runtime_target

    family = runtime_target(spec.target).family   # ValueError naming the valid targets
    if spec.dims and family != "cpu":
        raise NotSizeGeneric(f"the Func {spec.func.name!r} has dynamic dimensions {spec.dims}: "
                             f"a library for every size is built for the CPU targets only; pass "
                             + " ".join(f"--sizes {d}=SIZE" for d in spec.dims)
                             + f" to build a --target {spec.target} library for one size")
    if family == "cuda":
        return build_cuda_artifact(spec, outdir, progress)
    n = spec.name
    os.makedirs(outdir, exist_ok=True)
    features = isa.required_features(spec.cpu)
    label = spec.cpu
    if spec.cpu in ("native", "host", ""):
        from rlxc.lowering.cpu.target import host_cpu_name

        label = f"native ({host_cpu_name()})"
    step_sym = None
    split = {}
    mods = [(0, spec.func.module, n, "model")]
    if spec.train is not None:
        step_sym = f"{n}_train_step_kernel"
        mods.append((1, spec.train.program.func.module, step_sym, "train step"))
        if spec.train.grads_program is not None:  # NAME_train_grads / NAME_train_apply
            for k, kind in ((2, "grads"), (3, "apply")):
                sym = split[kind] = f"{n}_train_{kind}_kernel"
                prog = getattr(spec.train, f"{kind}_program")
                mods.append((k, prog.func.module, sym, f"train {kind} step"))
    objects, errors, kernels = [], {}, None
    if spec.dims:   # one library for every size (dynglue.py)
        kernels = {}
        for k, mod, sym, what in mods:
            with progress.stage(f"backend {sym} (size-generic)"):
                obj, errs, kernels[k] = compile_kernel(mod, sym, spec.cpu, what, spec)
            objects.append(obj)
            for code, (_, msg) in errs.items():
                errors[(sym, int(code))] = msg
    else:
        for _, mod, sym, _ in mods:
            a = _compile_kernel(mod, sym, spec.cpu, progress)
            objects.append(a.object)
            for code, (_, msg) in a.errors.items():
                errors[(a.name, int(code))] = msg
    with tempfile.TemporaryDirectory(prefix="rlxc-aot-") as tmp:
        with progress.stage("header + glue (cc)"):
            header = emit_header(spec)
            with open(os.path.join(tmp, f"{n}.h"), "w") as f:
                f.write(header)
            glue = emit_glue(spec, n, step_sym, errors, features, label,
                             split.get("grads"), split.get("apply"), kernels)
            with open(os.path.join(tmp, "glue.c"), "w") as f:
                f.write(glue)
            objects.append(cc.compile_glue(os.path.join(tmp, "glue.c"), tmp,
                                           os.path.join(tmp, "glue.o"), spec.cpu))
        layout, size = blob_layout(spec)
        if layout:
            with progress.stage("baked params (.incbin)"):
                blob = os.path.join(tmp, "params.bin")
                with open(blob, "wb") as f:
                    f.write(_blob_bytes(spec))
                with open(os.path.join(tmp, "blob.s"), "w") as f:
                    f.write(emit_blob_asm(f"rlx_{n}_blob", blob, size))
                objects.append(cc.assemble(os.path.join(tmp, "blob.s"),
                                           os.path.join(tmp, "blob.o"), spec.cpu))
        with progress.stage("link"):
            lib = os.path.join(outdir, f"lib{n}.so")
            cc.link_library(objects, lib, exported_symbols(glue, n), spec.cpu)
        with progress.stage("write header, package, json"):
            write_atomic(os.path.join(outdir, f"{n}.h"), header)
            _write_package(spec, outdir)
            meta = emit_metadata(spec, sha256_file(lib), os.path.getsize(lib), features)
            write_atomic(os.path.join(outdir, f"{n}.json"), dump_metadata(meta))
    return meta


def build_cuda_artifact(spec: ArtifactSpec, outdir: str, progress: Progress | None = None
                        ) -> dict:
    """A CUDA artifact: NAME.rlxcuda (runtime/cuda.py's container: PTX, cubin when ptxas
    is found, launch plan, plus the baked params as blob "params"), NAME.json and NAME/.
    No C ABI: the GPU program is driven by rlxc.runtime (the driver API via ctypes)."""
    from rlxc.runtime.cuda import dump_artifact

    from rlxc.lowering.gpu.driver import compile_cuda

    progress = progress or NoProgress()
    if spec.train is not None:
        raise ValueError("--train builds a C train step: use --target cpu")
    n = spec.name
    os.makedirs(outdir, exist_ok=True)
    with progress.stage("backend cuda (PTX, ptxas)"):
        art = compile_cuda(spec.func.module, n)
    with progress.stage("write container, package, json"):
        layout, _ = blob_layout(spec)
        blobs = dict(art.blobs)
        blobs["params"] = _blob_bytes(spec)
        lib = os.path.join(outdir, f"{n}.rlxcuda")
        write_atomic(lib, dump_artifact(art.meta, blobs))
        _write_package(spec, outdir)
        meta = emit_metadata(spec, sha256_file(lib), os.path.getsize(lib))
        meta.update(library=f"{n}.rlxcuda", header=None, cpu=None, cpu_name=None,
                    arch=art.meta.get("arch"), cubin=art.cubin is not None,
                    cuda_params={k: [off, spec.baked[k].nbytes] for k, off in layout.items()})
        write_atomic(os.path.join(outdir, f"{n}.json"), dump_metadata(meta))
    return meta

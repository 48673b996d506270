"""glue.c: fills templates/glue.c.in, the C implementation of NAME.h over the kernels.

    ArtifactSpec + kernel symbols + kernel error table
          │ tables (names, dtypes, dims, blob offsets), optimizer scalar recipe
          ▼
    glue.c.in ─► glue.c (compiled by cc.py against NAME.h)

The context struct holds a workspace, a pointer per param (NULL = unset;
baked params point into the read-only blob until set) and, with --train,
owned double buffers for params and optimizer slots.  The per-step optimizer
scalars are computed in C exactly as `Optimizer.step_scalars`: float64 from
the hyperparameters (t-dependent ones such as 1 - b1**t with pow()), rounded
to float32 once; constants are written as hex floats.  The baked params are
one binary blob assembled with `.incbin` (blob.s), never a C literal.
"""
from __future__ import annotations

import math
import re

import numpy as np

from rlxc.runtime.cpufeatures import FEATURES
from rlxc.runtime.loader import ABI_VERSION
from rlxc.runtime.signature import NP_DTYPES

from .ctext import c_string, comment, hexd, hexf
from .spec import BLOB_ALIGN, ArtifactSpec, blob_layout
from .template import fill

__all__ = ["emit_glue", "emit_blob_asm", "exported_symbols", "tensor_table", "encode_dim"]


def encode_dim(d, dims) -> int:
    """A dim in the C tables: the int itself, or -1 - the index of its symbol in `dims`."""
    return d if isinstance(d, int) else -1 - dims.index(d)


def tensor_table(prefix: str, lst: list, dims=(), blob: dict | None = None) -> str:
    """glue.c.in's tensor_info table (name, dtype, rank, dims, numel, item size, blob
    offset) of the inputs, outputs or params `lst`.  A dynamic axis (a symbol of the
    artifact's `dims`) is stored as encode_dim's -1 - index and counts 1 in numel, so
    numel is 0 iff the tensor is empty at every size (sizes are >= 1); `blob` maps a
    baked param to its byte offset in the blob (-1: not baked)."""
    lines = []
    for i, t in enumerate(lst):
        enc = ", ".join(str(encode_dim(d, dims)) for d in t.shape) or "0"
        lines.append(f"static const int64_t {prefix}_dims{i}[] = {{{enc}}};")
    rows = []
    for i, t in enumerate(lst):
        off = blob.get(t.name, -1) if blob is not None else -1
        esz = np.dtype(NP_DTYPES[t.dtype]).itemsize
        numel = math.prod(d if isinstance(d, int) else 1 for d in t.shape)
        rows.append(f"    {{{c_string(t.name)}, {c_string(t.dtype)}, {len(t.shape)}, "
                    f"{prefix}_dims{i}, {numel}u, {esz}u, {off}}},")
    if not rows:
        rows.append("    {\"\", \"\", 0, NULL, 0u, 0u, -1},")
    lines.append(f"static const tensor_info {prefix}[] = {{\n" + "\n".join(rows) + "\n};")
    return "\n".join(lines)


def _train_values(spec: ArtifactSpec) -> dict:
    train = spec.train
    prog = train.program
    par_idx = {t.name: i for i, t in enumerate(spec.params)}
    hp = "\n".join(f"static const double hp_{re.sub(r'[^0-9A-Za-z_]', '_', k)} = "
                   f"{hexd(v)}; /* {v!r} */" for k, v in train.hp.items()
                   if any(f"hp_{k}" in src[1] for src in train.scalar_src if src[0] == "expr"))
    sc = []
    for i, (nm, src) in enumerate(zip(train.scalar_names, train.scalar_src)):
        if src[0] == "lr":
            sc.append(f"    s[{i}] = (float)(double)lr; /* {nm} */")
        elif src[0] == "const":
            sc.append(f"    s[{i}] = {hexf(src[1])}; /* {nm} */")
        else:
            sc.append(f"    s[{i}] = (float)({src[1]}); /* {nm} */")
    return {"nslot": len(prog.slot_args), "nscal": len(train.scalar_names),
            "slot_par": ", ".join(str(par_idx[p]) for p, _ in prog.slot_args) or "0",
            "hp_lines": hp, "scalar_lines": "\n".join(sc), "nw": len(prog.wrt)}


def _cpu_rows(features) -> str:
    rows = []
    for f in features:
        _, (leaf, sub, reg, bit), xcr0 = FEATURES[f]
        rows.append(f"    {{{c_string(f)}, {leaf:#x}u, {sub}u, {reg}, {bit}, {xcr0:#x}u}},")
    return "\n".join(rows)


def emit_glue(spec: ArtifactSpec, kernel_sym: str, step_sym: str | None = None,
              errors: dict | None = None, cpu_features=(), cpu_label: str | None = None,
              grads_sym: str | None = None, apply_sym: str | None = None,
              dyn_kernels: dict | None = None) -> str:
    """The C glue implementing NAME.h on top of the kernel entry points.

    `errors` maps (kernel symbol, return code) to the message of that code;
    `cpu_features` (runtime/cpufeatures.py names) are checked with cpuid before
    any kernel runs, and `cpu_label` names the CPU in the refusal.  `grads_sym` /
    `apply_sym` (--train, rlxc/train_split.py) add NAME_train_grads / _apply.  A spec
    with dynamic dims (spec.dims) needs `dyn_kernels` ({0 run, 1 step, 2 grads, 3 apply:
    dynglue.DynKernel}) and gets NAME_set_dims and the size-generic calls (dynglue.py)."""
    n = spec.name
    unknown = [f for f in cpu_features if f not in FEATURES]
    if unknown:
        raise ValueError(f"emit_glue: unknown CPU features {unknown}")
    layout, _ = blob_layout(spec)
    dims = list(getattr(spec, "dims", None) or [])
    ke = []
    kernels = {step_sym: 1, grads_sym: 2, apply_sym: 3}
    for (sym, code), msg in sorted((errors or {}).items()):
        which = 0 if sym == kernel_sym else kernels.get(sym, 1)
        ke.append(f"    if (which == {which} && rc == {code})\n        return {c_string(msg)};\n")
    values = {
        "name": n, "title": comment(n), "version": spec.version, "kernel": kernel_sym,
        "nin": len(spec.inputs), "nout": len(spec.outputs), "npar": len(spec.params),
        "in_table": tensor_table("IN", spec.inputs, dims),
        "out_table": tensor_table("OUT", spec.outputs, dims),
        "par_table": tensor_table("PAR", spec.params, blob=layout),
        "blob_ptr": f"rlx_{n}_blob + PAR[i].blob_off" if layout else "NULL",
        "kernel_errors": "".join(ke), "abi": ABI_VERSION, "ir_hash": c_string(spec.ir_hash()),
        "cpu_name": c_string(cpu_label or spec.cpu),
    }
    if cpu_features:
        values["cpu_rows"] = _cpu_rows(cpu_features)
    split = spec.train is not None and grads_sym is not None and apply_sym is not None
    if spec.train is not None:
        values.update(_train_values(spec), step=step_sym)
    if split:
        values.update(grads=grads_sym, apply=apply_sym,
                      ngrad=spec.train.grads_program.grad_numel)
    dyn = bool(dims)
    if dyn:
        from .dynglue import dyn_values

        values.update(dyn_values(spec, dyn_kernels or {}))
    return fill("glue.c.in", values, {"blob": bool(layout), "train": spec.train is not None,
                                      "split": split, "cpu_check": bool(cpu_features),
                                      "dyn": dyn})


def exported_symbols(glue: str, name: str) -> list[str]:
    """The functions the glue text marks `API` (the documented ABI), in order."""
    return re.findall(rf"^API [^(\n]*?\b({re.escape(name)}_\w+)\(", glue, re.M)


def emit_blob_asm(sym: str, blob_path: str, size: int) -> str:
    """GNU assembler source that embeds `blob_path` as the hidden symbol `sym`."""
    if '"' in blob_path or "\\" in blob_path or "\n" in blob_path:
        raise ValueError(f"cannot .incbin a path with quotes or backslashes: {blob_path!r}")
    return f"""    .section .rodata.{sym},"a",@progbits
    .balign {BLOB_ALIGN}
    .globl {sym}
    .hidden {sym}
    .type {sym},@object
{sym}:
    .incbin "{blob_path}"
    .size {sym}, {size}
    .section .note.GNU-stack,"",@progbits
"""

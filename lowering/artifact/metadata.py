"""NAME.json: the artifact's metadata (signature, versions, checksums, CPU features).

The runtime loader (runtime/loader.py) validates every field before it opens
the library; `dump_metadata` writes one line per tensor so that the file
diffs well and stays plain JSON.
"""
from __future__ import annotations

import json
import re

from rlxc.runtime.loader import ABI_VERSION, ARTIFACT_FORMAT

from .spec import ArtifactSpec

__all__ = ["emit_metadata", "dump_metadata"]


def _tensors(lst, baked=False):
    out = []
    for t in lst:
        d = {"name": t.name, "shape": list(t.shape), "dtype": t.dtype}
        if baked:
            d["baked"] = t.baked
        out.append(d)
    return out


def emit_metadata(spec: ArtifactSpec, lib_sha256: str, lib_size: int = 0,
                  cpu_features=()) -> dict:
    """The JSON object of NAME.json; `lib_size` and `lib_sha256` describe the library
    file, `cpu_features` the instruction-set features its code may use."""
    train = None
    if spec.train is not None:
        tr = spec.train
        train = {"optimizer": tr.optimizer.kind, "lr": tr.lr, "hyperparams": tr.hp,
                 "slots": list(tr.program.slots), "scalars": tr.scalar_names,
                 "max_grad_norm": tr.program.max_grad_norm,
                 "step_ir_hash": tr.program.func.ir_hash()}
    cpu_name, arch = spec.cpu, None
    try:
        from rlxc.lowering.cpu.target import resolve_target

        tgt, cpu_name, _ = resolve_target(spec.cpu)
        arch = tgt.arch
    except Exception:  # pragma: no cover
        pass
    n = spec.name
    meta = {
        "format": ARTIFACT_FORMAT,
        "abi_version": ABI_VERSION,
        "rlxc_version": spec.version,
        "name": n,
        "target": spec.target,
        "cpu": spec.cpu,
        "cpu_name": cpu_name,
        "cpu_arch": arch,
        "sgemm": _sgemm_params(spec.cpu),
        "ir_hash": spec.ir_hash(),
        "library": f"lib{n}.so",
        "library_sha256": lib_sha256,
        "library_size": lib_size,
        "cpu_features": list(cpu_features),
        "header": f"{n}.h",
        "package": n,
        "inputs": _tensors(spec.inputs),
        "outputs": _tensors(spec.outputs),
        "params": _tensors(spec.params, True),
        "train": train,
        "transforms": list(spec.transforms),
        "source": spec.source,
    }
    if getattr(spec, "dims", None):   # one library for every size: NAME_set_dims
        meta["dims"] = list(spec.dims)
    return meta


def _sgemm_params(cpu: str) -> dict | None:
    """The CPU sgemm's derived tile and blocking (lowering/cpu/sgemm_kernels.py)."""
    try:
        from rlxc.lowering.cpu.sgemm_kernels import sgemm_params

        return sgemm_params(cpu)
    except (ValueError, NotImplementedError):
        return None


def dump_metadata(meta: dict) -> str:
    """JSON text with one line per tensor (diff-friendly, still plain JSON)."""
    text = json.dumps(meta, indent=2)
    # collapse the innermost objects and int lists onto one line
    text = re.sub(r"\{\n\s+(\"name\"[^{}]*?)\n\s+\}",
                  lambda m: "{" + re.sub(r"\s*\n\s*", " ", m.group(1)) + "}", text)
    text = re.sub(r"\[\s+([-\d,\s]*?)\s+\]",
                  lambda m: "[" + re.sub(r"\s*,\s*", ", ", m.group(1).strip()) + "]", text)
    # a dynamic shape (dim names and ints) in a collapsed tensor: only its padding goes
    text = re.sub(r'"shape": \[ ([^\[\]\n]*?) \]', r'"shape": [\1]', text)
    return text + "\n"

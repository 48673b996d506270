"""The GPU backend driver: rlx module -> kernels -> PTX -> cubin, as a CudaArtifact.

    rlx module ──kernels.build_kernels──► llvmlite module + GpuPlan + launch steps
          │ nvptx.emit_ptx (sm_90, +ptx80), nvptx.assemble (ptxas) when available
          ▼
    CudaArtifact: PTX, cubin or None, launch plan, buffers, constants, signature;
    to_bytes()/from_bytes() = the runtime's container (runtime/cuda.py).
"""
from __future__ import annotations

import json

from rlxc.dialect.types import dtype_of, shape_of

from rlxc.lowering.gpu import nvptx
from rlxc.lowering.gpu.kernels import build_kernels
from rlxc.lowering.gpu.plan import GpuPlan

__all__ = ["compile_cuda", "emit_ptx", "CudaArtifact", "plan_meta"]


class CudaArtifact:
    """A compiled GPU program: PTX (+ cubin), launch plan, buffer plan, signature.

    `meta` is JSON-able; `blobs` holds "ptx", "cubin" (when ptxas ran) and
    "consts".  `to_bytes()` is the container runtime.cuda.load_artifact reads."""

    def __init__(self, meta: dict, blobs: dict):
        self.meta, self.blobs = meta, blobs

    @property
    def ptx(self) -> str:
        return self.blobs["ptx"].decode()

    @property
    def cubin(self) -> bytes | None:
        return self.blobs.get("cubin")

    @property
    def kernels(self) -> dict:
        return self.meta["kernels"]

    def to_json(self) -> str:
        return json.dumps(self.meta, indent=1)

    def to_bytes(self) -> bytes:
        from rlxc.runtime.cuda import dump_artifact

        return dump_artifact(self.meta, self.blobs)

    @classmethod
    def from_bytes(cls, data: bytes) -> "CudaArtifact":
        from rlxc.runtime.cuda import load_artifact

        return cls(*load_artifact(data))

    def program(self, device: int = 0, **kw):
        """Load on the GPU: a runtime.cuda.CudaProgram."""
        from rlxc.runtime.cuda import CudaProgram

        return CudaProgram(self.meta, self.blobs, device=device, **kw)


def M_name(module) -> str:
    from rlxc.dialect.module import get_func

    return get_func(getattr(module, "module", module)).sym_name.data


def plan_meta(plan: GpuPlan, steps: list, name: str, arch: str) -> tuple[dict, bytes]:
    """The JSON side of the artifact and the packed constant bytes."""
    consts = bytearray()
    const_list = []
    for bf in plan.buffers:
        if bf.region == "const":
            const_list.append({"buffer": bf.id, "blob_offset": len(consts),
                               "nbytes": len(bf.data)})
            consts += bf.data
    args = [{"name": a.name, "kind": a.kind, "shape": list(a.shape), "dtype": a.dtype,
             "buffer": plan.buffer_of[v].id} for a, v in zip(plan.args, plan.arg_values)]
    outs = [{"shape": list(shape_of(v.type)), "dtype": dtype_of(v.type),
             "buffer": plan.buffer_of[v].id} for v in plan.outputs]
    meta = {
        "format": "rlxc-cuda-1", "name": name, "arch": arch,
        "args": args, "outputs": outs,
        "buffers": [{"id": b.id, "region": b.region, "offset": b.offset, "nbytes": b.nbytes}
                    for b in plan.buffers],
        "regions": dict(plan.regions),
        "consts": const_list,
        "steps": steps,
    }
    if plan.errors:   # the index checks' flag: {"buffer": id, "codes": {code: [exc, msg]}}
        meta["errors"] = {"buffer": plan.error_buffer.id,
                          "codes": {str(k): list(v) for k, v in plan.errors.items()}}
    return meta, bytes(consts)


def compile_cuda(module, name: str | None = None, arch: str = nvptx.DEFAULT_ARCH,
                 ptxas: bool | str = True, ptx_version: int | None = None) -> CudaArtifact:
    """Compile an rlx module (or Func) for NVIDIA GPUs.

    ptxas=True assembles a cubin with the ptxas find_ptxas() finds (PTX only when
    none); False skips it; a path names the ptxas to use."""
    from rlxc.lowering.gpu import regions as R

    if R.has_regions(module):   # rlx.scan/while/if: a host-side loop of launches
        ir_text, meta, consts = R.build_regions(module, "gpu")
        mod, steps = ir_text, meta["steps"]
        name = name or M_name(module)
        meta = {"format": "rlxc-cuda-1", "name": name, "arch": arch, **meta}
    else:
        mod, plan, steps = build_kernels(module, "gpu")
        name = name or plan.func.sym_name.data
        meta, consts = plan_meta(plan, steps, name, arch)
    ptx = nvptx.emit_ptx(mod, arch, ptx_version=ptx_version)
    cubin, info = None, {}
    if ptxas:
        cubin, info = nvptx.assemble(ptx, arch, ptxas if isinstance(ptxas, str) else None)
    kernels = {}
    for st in R.launches(steps):
        kernels[st["kernel"]] = info.get(st["kernel"], {})
    meta["kernels"] = kernels
    meta["ptx_version"] = next((ln.split()[1] for ln in ptx.splitlines()
                                if ln.startswith(".version")), "")
    blobs = {"ptx": ptx.encode(), "consts": consts}
    if cubin is not None:
        blobs["cubin"] = cubin
    return CudaArtifact(meta, blobs)


def emit_ptx(module, arch: str = nvptx.DEFAULT_ARCH) -> str:
    """All kernels' PTX for an rlx module (`rlxc compile --emit ptx --target cuda`)."""
    from rlxc.lowering.gpu import regions as R

    if R.has_regions(module):
        return nvptx.emit_ptx(R.build_regions(module, "gpu")[0], arch)
    mod, plan, steps = build_kernels(module, "gpu")
    return nvptx.emit_ptx(mod, arch)

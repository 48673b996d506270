"""NAME.h: fills templates/header.h.in from an ArtifactSpec.

    ArtifactSpec ─► values (signature comment, size macros, error codes) ─► header.h.in

The header is the documented C ABI; the glue is compiled against it, so the
two cannot disagree.
"""
from __future__ import annotations

from rlxc.runtime.dims import label
from rlxc.runtime.loader import ABI_VERSION, ERROR_CODES, ERROR_DOCS, RLX_OK

from .ctext import c_string, comment, fmt_shape, macro
from .spec import ArtifactSpec
from .template import fill

__all__ = ["emit_header", "error_block"]

_KINDS = (("input", "INPUT"), ("output", "OUTPUT"), ("param", "PARAM"))


def error_block() -> str:
    """The RLX_* return codes, guarded so that several headers can be included together."""
    lines = ["#ifndef RLXC_ABI_ERRORS", "#define RLXC_ABI_ERRORS",
             "/* Return codes shared by every rlxc-generated header. */",
             f"#define RLX_OK {RLX_OK}"]
    lines += [f"#define {k} {v}  /* {ERROR_DOCS[k]} */" for k, v in ERROR_CODES.items()]
    lines.append("#endif")
    return "\n".join(lines)


def _tensors(spec: ArtifactSpec):
    return (("input", spec.inputs), ("output", spec.outputs), ("param", spec.params))


def emit_header(spec: ArtifactSpec) -> str:
    n, m = spec.name, macro(spec.name)
    sig, sizes = [], []
    for kind, lst in _tensors(spec):
        for i, t in enumerate(lst):
            extra = " (baked)" if t.baked else ""
            sig.append(f" *   {kind:<6} {i:>2}  {comment(t.name):<16} {t.dtype} "
                       f"{fmt_shape(t.shape)}{extra}")
    for (kind, upper), (_, lst) in zip(_KINDS, _tensors(spec)):
        for i, t in enumerate(lst):
            if any(isinstance(d, str) for d in t.shape):   # dynamic: NAME_KIND_numel(ctx, i)
                sizes.append(f"/* {m}_{upper}{i}_NUMEL: dynamic {comment(fmt_shape(t.shape))}, "
                             f"{n}_{kind}_numel(ctx, {i}) */")
                continue
            sizes.append(f"#define {m}_{upper}{i}_NUMEL {t.numel}u  /* {comment(t.name)} */")
    train = spec.train
    values = {
        "name": n, "title": comment(n), "version": spec.version, "abi": ABI_VERSION,
        "target": spec.target, "cpu": comment(spec.cpu), "ir_short": spec.ir_hash()[:16],
        "signature": "\n".join(sig) if sig else " *   (no arguments)",
        "guard": f"RLXC_{m}_H", "error_block": error_block(), "macro": m,
        "ir_hash": c_string(spec.ir_hash()), "num_inputs": len(spec.inputs),
        "num_outputs": len(spec.outputs), "num_params": len(spec.params),
        "has_train": 1 if train else 0, "sizes": "\n".join(sizes),
        "ctx_train": ", optimizer state" if train else "",
    }
    split = train is not None and train.grads_program is not None
    if train:
        values.update(optimizer=train.optimizer.kind, lr=f"{train.lr:g}")
    if split:
        values.update(num_grads=train.grads_program.grad_numel)
    dims = list(getattr(spec, "dims", None) or [])
    if dims:
        names = [label(d) for d in dims]      # an anonymous dim: "x.0" (input x, axis 0)
        values.update(num_dims=len(dims), dim_names=", ".join(c_string(d) for d in names),
                      dim_list=comment(", ".join(names)))
    return fill("header.h.in", values, {"train": train is not None, "split": split,
                                        "dyn": bool(dims)})

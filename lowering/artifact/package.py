"""NAME/__init__.py: fills templates/package.py.in, the `import NAME` stub.

The stub loads the artifact next to it (the package directory sits in the
artifact directory) through the runtime loader.
"""
from __future__ import annotations

from .spec import ArtifactSpec
from .template import fill

__all__ = ["emit_package"]


def emit_package(spec: ArtifactSpec) -> str:
    n = spec.name
    train = spec.train is not None
    sig = "\n".join(f"    {k} {t.name!r}: {t.dtype} {list(t.shape)}"
                    for k, lst in (("input ", spec.inputs), ("output", spec.outputs),
                                   ("param ", spec.params)) for t in lst)
    return fill("package.py.in", {
        "name": n, "name_repr": repr(n), "json_repr": repr(f"{n}.json"),
        "run_args": ", ".join(f"{t.name}=..." for t in spec.inputs if t.name.isidentifier()),
        "train_doc": ", train_step" if train else "", "signature": sig,
        "train_line": "train_step = module.train_step" if train else "",
        "train_all": ', "train_step"' if train else "",
    })

"""NAME/: the `import NAME` package: templates/package.py.in plus a copy of the runtime.

    NAME/__init__.py     the stub: loads the artifact next to it (the package
                         directory sits in the artifact directory)
    NAME/_runtime/*.py   rlxc/runtime's modules, verbatim (NumPy + stdlib only)

The copy makes `import NAME` work where only NumPy is installed; where rlxc is
installed with the same artifact ABI, the stub uses rlxc.runtime instead, so
that `rlxc.runtime.load(OUTDIR)` and `import NAME` share one module.
"""
from __future__ import annotations

from importlib import resources

from rlxc.runtime.loader import ABI_VERSION

from .spec import ArtifactSpec
from .template import fill

__all__ = ["emit_package", "runtime_files"]


def runtime_files() -> dict[str, bytes]:
    """{file name: bytes} of every module of rlxc.runtime (what NAME/_runtime/ holds)."""
    root = resources.files("rlxc.runtime")
    return {f.name: f.read_bytes() for f in sorted(root.iterdir(), key=lambda f: f.name)
            if f.name.endswith(".py")}


def emit_package(spec: ArtifactSpec) -> str:
    n = spec.name
    train = spec.train is not None
    sig = "\n".join(f"    {k} {t.name!r}: {t.dtype} {list(t.shape)}"
                    for k, lst in (("input ", spec.inputs), ("output", spec.outputs),
                                   ("param ", spec.params)) for t in lst)
    return fill("package.py.in", {
        "name": n, "name_repr": repr(n), "json_repr": repr(f"{n}.json"), "abi": ABI_VERSION,
        "run_args": ", ".join(f"{t.name}=..." for t in spec.inputs if t.name.isidentifier()),
        "train_doc": ", train_step" if train else "", "signature": sig,
        "train_line": "train_step = module.train_step" if train else "",
        "train_all": ', "train_step"' if train else "",
    })

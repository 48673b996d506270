"""What goes into an artifact: ArtifactSpec (+ TrainSpec for --train), as plain data.

The specs are built on the rlxc/ side (rlxc/export.py: `spec_from_func`,
`train_spec`) and consumed here by the fillers and the writer, which never
import rlxc's API layer.  `blob_layout` places the baked params in the read-only blob.
"""
from __future__ import annotations

import hashlib
import keyword
import re
import sys
from dataclasses import dataclass, field

__all__ = ["ArtifactSpec", "TrainSpec", "BLOB_ALIGN", "blob_layout",
           "check_name"]

# Package names an artifact must not take: `import NAME` would find the module
# instead, or hide it from everything else on the path (the standard library,
# and what the package itself imports).
SHADOWED = frozenset(sys.stdlib_module_names) | {"numpy", "rlxc"}

BLOB_ALIGN = 64

@dataclass
class TrainSpec:
    """The --train part: the step function and how its arguments map to the context."""

    program: object              # rlxc.train.StepProgram
    optimizer: object            # rlxc.optim.Optimizer (its hyperparameters)
    lr: float
    scalar_names: list           # names in opt_scalars, in order
    scalar_src: list             # per scalar: ("lr",) | ("const", float32) | ("expr", C text)
    hp: dict                     # hyperparameters (floats) used by the expressions
    grads_program: object = None  # rlxc.train_split.SplitProgram "grads" (NAME_train_grads)
    apply_program: object = None  # ... "apply" (NAME_train_apply); both or neither


@dataclass
class ArtifactSpec:
    name: str                    # the artifact's C symbol prefix and package name
    func: object                 # the forward Func
    inputs: list                 # TensorSpec
    outputs: list
    params: list
    baked: dict = field(default_factory=dict)   # param name -> array (declared dtype)
    train: TrainSpec | None = None
    target: str = "cpu"
    cpu: str = "native"
    transforms: list = field(default_factory=list)
    source: str = ""
    version: str = "unknown"     # the rlxc that builds it (rlxc.__version__)
    dims: list = field(default_factory=list)   # dynamic dims (symbols), NAME_set_dims order

    def ir_hash(self) -> str:
        h = hashlib.sha256(self.func.mlir().encode())
        if self.train is not None:
            h.update(b"\0train\0" + self.train.program.func.mlir().encode())
            for p in (self.train.grads_program, self.train.apply_program):
                if p is not None:
                    h.update(b"\0split\0" + p.func.mlir().encode())
        return h.hexdigest()


def check_name(name: str) -> str:
    """`name` if it can prefix the C symbols and name the Python package; else ValueError."""
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ValueError(f"artifact name {name!r} is not a C identifier ([A-Za-z_][A-Za-z0-9_]*); "
                         "it prefixes every C symbol and names the Python package")
    if keyword.iskeyword(name):
        raise ValueError(f"artifact name {name!r} is a Python keyword: `import {name}` could "
                         "never work; choose another name (rlxc compile --name)")
    if name in SHADOWED:
        raise ValueError(f"artifact name {name!r} is the name of the module {name!r} (standard "
                         "library or numpy/rlxc): the package would shadow it or be shadowed; "
                         "choose another name (rlxc compile --name)")
    return name


def blob_layout(spec: ArtifactSpec) -> tuple[dict, int]:
    """(param name -> byte offset in the blob, blob size): baked params, each BLOB_ALIGN-aligned."""
    off, layout = 0, {}
    for t in spec.params:
        if t.baked:
            off = -(-off // BLOB_ALIGN) * BLOB_ALIGN
            layout[t.name] = off
            off += spec.baked[t.name].nbytes
    return layout, off

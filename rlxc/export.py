"""Func-level orchestration of AOT artifacts: what a Func's artifact holds.

    Func (transformed, params bound or baked)  [+ optimizer for --train]
          │ spec_from_func: signature → TensorSpecs, baked params checked and cast
          │ train_spec: rlxc/train.py's step program + the C recipe of its scalars
          ▼
    ArtifactSpec ─► rlxc.lowering.artifact.writer.build_artifact(spec, outdir)

This is the API side of `rlxc compile`; lowering/artifact/ only fills
templates and runs cc from the plain-data spec, and never imports rlxc's API.
"""
from __future__ import annotations

import math

import numpy as np

from rlxc.lowering.artifact.isa import PORTABLE_CPU
from rlxc.lowering.artifact.progress import Progress
from rlxc.lowering.artifact.spec import ArtifactSpec, TrainSpec, check_name
from rlxc.lowering.artifact.writer import build_artifact
from rlxc.runtime.loader import TensorSpec
from rlxc.runtime.signature import NP_DTYPES

__all__ = ["spec_from_func", "train_spec", "build_artifact", "Progress", "ArtifactSpec",
           "TrainSpec"]


def spec_from_func(func, name: str | None = None, baked: dict | None = None, *,
                   cpu: str = "native", target: str = "cpu", transforms=(),
                   source: str = "") -> ArtifactSpec:
    """Describe `func`'s artifact named `name` (default: the Func's C-safe symbol, so a
    Func named "my-model" gives my_model; names that are Python keywords or that would
    shadow a module raise ValueError); `baked` (default: the Func's bound params) is
    checked against the declared shapes and converted to the declared dtypes.  `cpu` is an
    LLVM CPU name, "native" (this machine) or "portable" (PORTABLE_CPU, x86-64-v3)."""
    import rlxc
    from rlxc.dialect import module as M
    from rlxc.dialect.types import dtype_of, shape_of

    name = check_name(func.symbol if name is None else name)
    if cpu == "portable":
        cpu = PORTABLE_CPU
    sig = func.signature()
    inputs = [TensorSpec(a.name, "input", tuple(a.shape), a.dtype)
              for a in sig if a.kind == "input"]
    outs = M.outputs(M.get_func(func.module))
    outputs = [TensorSpec(f"out{i}", "output", shape_of(v.type), dtype_of(v.type))
               for i, v in enumerate(outs)]
    baked = dict(func.params() if baked is None else baked)
    params = []
    for a in sig:
        if a.kind != "param":
            continue
        if a.name in baked:
            arr = np.ascontiguousarray(np.asarray(baked[a.name]), NP_DTYPES[a.dtype])
            if arr.size != math.prod(a.shape):
                raise ValueError(f"baked param {a.name!r}: {arr.size} elements, declared "
                                 f"shape {tuple(a.shape)}")
            baked[a.name] = arr.reshape(tuple(a.shape))
        params.append(TensorSpec(a.name, "param", tuple(a.shape), a.dtype, a.name in baked))
    unknown = [k for k in baked if k not in {p.name for p in params}]
    if unknown:
        raise ValueError(f"baked params {unknown} are not params of {func.name}; "
                         f"params: {[p.name for p in params]}")
    dims = []   # dynamic dims in order of first use (lowering/cpu/dynsizes.module_symbols)
    for d in (d for a in sig for d in a.shape):
        if isinstance(d, str) and d not in dims:
            dims.append(d)
    return ArtifactSpec(name, func, inputs, outputs, params, baked, None, target, cpu,
                        list(transforms), source, rlxc.__version__, dims)


def train_spec(func, optimizer, max_grad_norm: float = 0.0) -> TrainSpec:
    """Build the step program of rlxc/train.py for `func` and the scalar recipe."""
    from rlxc.train import step_program
    from rlxc.train_split import split_programs

    outs = func.output_shapes()
    if math.prod(outs[0]) != 1:
        raise ValueError(f"--train: the first output of {func.name} is the loss and must have "
                         f"one element, got shape {outs[0]}")
    prog = step_program(func, optimizer, None, max_grad_norm)
    lr = float(optimizer.lr)
    recipe = optimizer.scalar_recipe()  # C expressions of t and lr (rlxc/optim.py)
    src = [recipe[n] for n in prog.scalar_names]
    gprog, aprog = split_programs(func, optimizer, None, max_grad_norm)
    return TrainSpec(prog, optimizer, lr, list(prog.scalar_names), src,
                     dict(optimizer.hyperparams()), gprog, aprog)

"""The pass registry and pipeline runner (what `rlxc opt -p ...` and Func use).

A pipeline is a flat, comma-separated list of named passes in mlir-opt
syntax, each with optional `{key=value ...}` options (values comma-separated
for lists): `rlx-grad{wrt=w,b},cse` or `rlx-vmap{batched=x size=4},cleanup`.
Parsing is xDSL's (`xdsl.utils.arg_spec.parse_pipeline`); options map onto the
fields of the pass dataclass. PASSES maps a name to a thunk returning the pass
class, so importing this module imports no pass (autodiff and jvp may not even
exist yet); DESCRIPTIONS holds the one-line help shown by `--list-passes`.

`cleanup(module)` runs canonicalize, constant-fold, cse and dce in turn until
none of them changes anything (at most CLEANUP_ROUNDS rounds).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.utils.arg_spec import parse_pipeline as _xdsl_parse_pipeline
from xdsl.utils.exceptions import ArgSpecParseError

from rlxc.runtime.errors import NameLookupError

CLEANUP_ROUNDS = 8


def _lazy(module: str, cls: str) -> Callable[[], type[ModulePass]]:
    def load():
        return getattr(importlib.import_module(f"rlxc.dialect.{module}"), cls)
    load.__qualname__ = f"{module}.{cls}"
    return load


PASSES: dict[str, Callable[[], type[ModulePass]]] = {
    "rlx-grad": _lazy("autodiff", "GradPass"),
    "rlx-value-and-grad": _lazy("autodiff", "ValueAndGradPass"),
    "rlx-jvp": _lazy("jvp", "JvpPass"),
    "rlx-hvp": _lazy("jvp", "HvpPass"),
    "rlx-vmap": _lazy("vmap", "VmapPass"),
    "canonicalize": _lazy("canonicalize", "CanonicalizePass"),
    "constant-fold": _lazy("fold", "ConstantFoldPass"),
    "cse": _lazy("cse", "CSEPass"),
    "dce": _lazy("dce", "DCEPass"),
    "cleanup": lambda: CleanupPass,
    "rlx-decompose-conv": _lazy("conv_decompose", "DecomposeConvPass"),
    "regions": _lazy("control_cleanup", "RegionsPass"),
}

DESCRIPTIONS: dict[str, str] = {
    "rlx-grad": "reverse mode: gradients of the first output w.r.t. {wrt=names}",
    "rlx-value-and-grad": "reverse mode: outputs [loss, grads...] w.r.t. {wrt=names}",
    "rlx-jvp": "forward mode: tangent inputs for {wrt=names}; outputs primals then tangents",
    "rlx-hvp": "forward-over-reverse Hessian-vector product w.r.t. {wrt=names}",
    "rlx-vmap": "add a leading batch axis of {size=N} to the inputs {batched=names}",
    "canonicalize": "algebraic simplifications: x*1, x+0, neg(neg x), shape-op chains",
    "constant-fold": "evaluate ops on constants (small or splat results only)",
    "cse": "common subexpression elimination of pure ops; equal constants merged",
    "dce": "remove ops whose results are unused",
    "cleanup": "canonicalize, constant-fold, cse, dce to a fixed point",
    "rlx-decompose-conv": "convolutions as pad/slice/concat/reshape/matmul (before lowering)",
    "regions": "across region ops: fold if on a constant, sink constants, hoist invariants",
}


class PipelineError(ValueError):
    """A pipeline string that does not parse, names an unknown pass or has bad options."""


def parse_pipeline(text: str) -> list[ModulePass]:
    """Parse `name{opt=v ...},name2,...` into pass instances (unknown names list the valid)."""
    try:
        specs = list(_xdsl_parse_pipeline(text.strip()))
    except ArgSpecParseError as e:
        raise PipelineError(f"cannot parse pipeline {text!r}: {e}") from None
    passes = []
    for spec in specs:
        load = PASSES.get(spec.name)
        if load is None:
            raise NameLookupError(f"unknown pass {spec.name!r}; valid: {', '.join(PASSES)}")
        try:
            cls = load()
        except (ImportError, AttributeError) as e:
            raise PipelineError(f"pass {spec.name!r} is not available: {e}") from None
        try:
            passes.append(cls.from_spec(spec))
        except (ValueError, TypeError) as e:
            raise PipelineError(f"{spec.name}: bad options: {e}") from None
    return passes


def run_pipeline(module: ModuleOp, text: str, *, in_place: bool = False) -> ModuleOp:
    """Run the named passes over a clone of `module` (or `module` itself) and return it."""
    passes = parse_pipeline(text)
    if not in_place:
        module = module.clone()
    ctx = _context()
    for p in passes:
        p.apply(ctx, module)
    return module


def cleanup(module: ModuleOp) -> ModuleOp:
    """canonicalize, constant-fold, cse, dce until nothing changes; mutates and returns `module`."""
    from .canonicalize import canonicalize
    from .control_cleanup import simplify_regions
    from .cse import cse
    from .dce import dce
    from .fold import constant_fold

    for _ in range(CLEANUP_ROUNDS):
        changed = canonicalize(module) + constant_fold(module) + cse(module) + dce(module)
        changed += simplify_regions(module)
        if not changed:
            break
    return module


@dataclass(frozen=True)
class CleanupPass(ModulePass):
    """canonicalize, constant-fold, cse, dce to a fixed point."""

    name = "cleanup"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        cleanup(op)


def _context() -> Context:
    from .module import context

    return context()

"""The train step split in two programs, so that gradients can be reduced in between.

Purpose
-------
Data-parallel training (rlxc/distributed.py, a Trainer with `comm=`) and the
C API's `NAME_train_grads` / `NAME_train_apply` (`rlxc compile --train`) run
the fused step of rlxc/train.py as two compiled calls with an all-reduce of
the gradients between them:

    grads:  args  <data inputs of f> | grad_scale f32[1] | fwd_<param> (callable
                  quant only) | <params of f> (kind param)
            w_p  = fake_quant(p) / fwd_p / p          (as in the fused step)
            loss, g_p... = inline(value_and_grad(f, wrt))(data, w_p, frozen params)
            outputs: loss * s  (f32[1]),  concat(g_p.flatten() * s)  f32[N]
                     (s = grad_scale[0]; N = the trained params' element count)
    apply:  args  opt_<slot>_<param> | opt_scalars f32[k] | grads f32[N]
                  | <trained params> (kind param, wrt order)
            g_p  = grads[off_p : off_p + numel_p].reshape(shape_p)
            clip (max > 0): the fused step's clipping (rlxc/train.py `clip_grads`), on
                  these grads: with the averaged gradient this is the global norm
            update: opt.checked_update, exactly as the fused step
            outputs: new p (wrt order)..., new slots (param-major, slot order)

With grad_scale = n_local / n_total on every rank and a SUM all-reduce of the
flat buffer, the reduced grads (and loss) are the weighted average over all
ranks, equal to one process on the whole batch when the loss is a mean over
the batch axis.  grad_scale = 1 gives the plain local grads; the composition
apply(grads(x)) is the fused step up to float rounding of the scale by 1.

`split_programs` caches the pair like `step_program` (same key + a tag);
rlxc/split_engine.py runs them over resident state.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

from .optim import Optimizer
from .registry import backend
from .train import (NORM_DTYPES, call_value_and_grad, clip_and_update, optimizer_structure,
                    quant_key, resolve_wrt, safe_name, transform_fingerprint, unique_name)

__all__ = ["SplitProgram", "split_programs"]


@dataclass
class SplitProgram:
    """One of the two programs (`kind` "grads" or "apply") with the StepProgram
    interface the backends use (`func`, `cache_alias`, `executor`)."""

    kind: str
    make: object
    key: tuple
    data: list                   # grads: data input names (signature order)
    params: list                 # grads: every param of f; apply: the trained params
    wrt: list
    slot_args: list              # apply: (param, slot), param-major
    scalar_names: list
    quant: object                # as StepProgram.quant
    numels: list                 # element count of each trained param (wrt order)
    shapes: list
    executors: dict = field(default_factory=dict)
    data_specs: list | None = None
    _func: object = None

    @property
    def func(self):
        if self._func is None:
            self._func = self.make()
        return self._func

    @property
    def grad_numel(self) -> int:
        return sum(self.numels)

    def cache_alias(self) -> str:
        return hashlib.sha256(f"{self.kind}|{self.key!r}|{transform_fingerprint()}"
                              .encode()).hexdigest()

    def executor(self, device: str):
        ex = self.executors.get(device)
        if ex is None:
            ex = backend(device).executor(self.func)
            self.executors[device] = ex
        return ex

    def scalar_vector(self, opt, t, lr, out=None):
        from .train import StepProgram

        return StepProgram.scalar_vector(self, opt, t, lr, out)


_CACHE: dict = {}
_CACHE_MAX = 32


def split_programs(f, opt: Optimizer, wrt=None, max_grad_norm: float = 0.0, quant=None,
                   norm_dtype: str | None = None, device: str | None = None):
    """(grads program, apply program) of `f` for this optimizer and options (cached)."""
    if norm_dtype is None:
        norm_dtype = NORM_DTYPES.get(device, "f32")
    wrt = resolve_wrt(f, wrt)
    max_grad_norm = max(float(max_grad_norm), 0.0)
    qkey = quant_key(quant)
    key = (f.trace_hash(), optimizer_structure(opt), tuple(wrt), max_grad_norm, qkey,
           norm_dtype, tuple(opt.step_scalars(1, opt.lr)))
    pair = _CACHE.get(key)
    if pair is None:
        pair = (_grads(f, wrt, qkey, key), _apply(f, opt, wrt, max_grad_norm, norm_dtype, key))
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = pair
    return pair


def _layout(f, wrt):
    shapes = [tuple(f.param_shape_of(n)) for n in wrt]
    return shapes, [math.prod(s) for s in shapes]


def _grads(f, wrt, qkey, key) -> SplitProgram:
    Func = type(f)
    sig = f.signature()
    used = {a.name for a in sig}
    scale_name = unique_name("grad_scale", used)
    fwd_names = [unique_name(safe_name(f"fwd_{p}"), used) for p in wrt] if qkey == "callable" else []
    shapes, numels = _layout(f, wrt)

    def build(sc, vg):
        data = {a.name: sc.input(a.name, a.shape, a.dtype) for a in sig if a.kind == "input"}
        scale = sc.input(scale_name, (1,), "f32")[0]
        fwd = {p: sc.input(n, s, "f32") for p, n, s in zip(wrt, fwd_names, shapes)}
        params = {a.name: sc._arg(a.name, a.shape, a.dtype, "param")
                  for a in sig if a.kind == "param"}
        loss, grads = call_value_and_grad(sc, vg, data, params, wrt, qkey, fwd)
        if loss.size != 1:
            raise ValueError(f"distributed step: the loss of {f.name} must have one element, "
                             f"got shape {loss.shape}")
        flat = [g.reshape(-1) for g in grads]
        flat = flat[0] if len(flat) == 1 else sc.concat(flat, 0)
        return [loss.reshape(1) * scale, flat * scale]

    def make():
        from rlxc.dialect.passes import cleanup

        vg = f.value_and_grad(wrt)
        fn = Func(f"{f.name}_train_grads", lambda sc: build(sc, vg))
        return fn.with_module(cleanup(fn.module))

    return SplitProgram("grads", make, key, [a.name for a in sig if a.kind == "input"],
                        [a.name for a in sig if a.kind == "param"], list(wrt), [], [],
                        None if qkey is None else ("callable" if qkey == "callable" else qkey[1]),
                        numels, shapes)


def _apply(f, opt, wrt, max_grad_norm, norm_dtype, key) -> SplitProgram:
    Func = type(f)
    slots = opt.slots()
    scalar_names = list(opt.step_scalars(1, opt.lr).keys())
    shapes, numels = _layout(f, wrt)
    used = set(wrt)
    slot_args = [(p, s) for p in wrt for s in slots]
    slot_names = [unique_name(safe_name(f"opt_{s}_{p}"), used) for p, s in slot_args]
    scal_name = unique_name("opt_scalars", used)
    grads_name = unique_name("grads", used)
    total = sum(numels)

    def build(sc):
        st = {}
        for (p, s), n in zip(slot_args, slot_names):
            st.setdefault(p, {})[s] = sc.input(n, opt.slot_shape(s, shapes[wrt.index(p)]), "f32")
        vec = sc.input(scal_name, (len(scalar_names),), "f32")
        flat = sc.input(grads_name, (total,), "f32")
        params = {n: sc.param(n, s) for n, s in zip(wrt, shapes)}
        scal = {n: vec[i] for i, n in enumerate(scalar_names)}
        grads, off = [], 0
        for s, k in zip(shapes, numels):
            grads.append(flat.slice([off], [off + k]).reshape(s))
            off += k
        new_p, new_s = clip_and_update(sc, opt, params, grads, wrt, st, scal,
                                       max_grad_norm, norm_dtype)
        return [*new_p, *new_s]

    def make():
        from rlxc.dialect.passes import cleanup

        fn = Func(f"{f.name}_train_apply", build)
        return fn.with_module(cleanup(fn.module))

    return SplitProgram("apply", make, key, [], list(wrt), list(wrt), slot_args, scalar_names,
                        None, numels, shapes)

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
            clip (max > 0): the fused step's clipping (rlxc/train.py `_clip`), on
                  these grads: with the averaged gradient this is the global norm
            update: opt.checked_update, exactly as the fused step
            outputs: new p (wrt order)..., new slots (param-major, slot order)

With grad_scale = n_local / n_total on every rank and a SUM all-reduce of the
flat buffer, the reduced grads (and loss) are the weighted average over all
ranks, equal to one process on the whole batch when the loss is a mean over
the batch axis.  grad_scale = 1 gives the plain local grads; the composition
apply(grads(x)) is the fused step up to float rounding of the scale by 1.

`split_programs` caches the pair like `step_program` (same key + a tag).
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

import numpy as np

from .optim import Optimizer
from .registry import backend
from .train import NORM_DTYPES, optimizer_structure, resolve_wrt
from .train import clip_grads as _clip
from .train import quant_key as _quant_key
from .train import safe_name as _safe
from .train import transform_fingerprint as _transform_fingerprint
from .train import unique_name as _unique

__all__ = ["SplitProgram", "split_programs", "SplitEngine"]


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
        return hashlib.sha256(f"{self.kind}|{self.key!r}|{_transform_fingerprint()}"
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
    qkey = _quant_key(quant)
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
    scale_name = _unique("grad_scale", used)
    fwd_names = [_unique(_safe(f"fwd_{p}"), used) for p in wrt] if qkey == "callable" else []
    shapes, numels = _layout(f, wrt)

    def build(sc, vg):
        data = {a.name: sc.input(a.name, a.shape, a.dtype) for a in sig if a.kind == "input"}
        scale = sc.input(scale_name, (1,), "f32")[0]
        fwd = {p: sc.input(n, s, "f32") for p, n, s in zip(wrt, fwd_names, shapes)}
        params = {a.name: sc._arg(a.name, a.shape, a.dtype, "param")
                  for a in sig if a.kind == "param"}
        call_args = dict(data)
        for name, t in params.items():
            if name in fwd:
                t = fwd[name]
            elif qkey is not None and name in wrt:
                t = t.fake_quant(qkey[1])
            call_args[name] = t
        loss, *grads = sc.call(vg, call_args)
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
    slot_names = [_unique(_safe(f"opt_{s}_{p}"), used) for p, s in slot_args]
    scal_name = _unique("opt_scalars", used)
    grads_name = _unique("grads", used)
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
        if max_grad_norm > 0:
            grads = _clip(sc, grads, max_grad_norm, norm_dtype)
        new_p, new_s = [], []
        for name, g in zip(wrt, grads):
            p2, s2 = opt.checked_update(sc, params[name], g, st.get(name, {}), scal)
            new_p.append(p2)
            new_s.extend(s2[s] for s in slots)
        return [*new_p, *new_s]

    def make():
        from rlxc.dialect.passes import cleanup

        fn = Func(f"{f.name}_train_apply", build)
        return fn.with_module(cleanup(fn.module))

    return SplitProgram("apply", make, key, [], list(wrt), list(wrt), slot_args, scalar_names,
                        None, numels, shapes)


# -- the engine: both programs over resident state ---------------------------------

class SplitEngine:
    """Runs grads, then (after the caller reduced `flat`) apply, over resident state.

    State = the trained params (wrt order) and the slots, in two buffer sets like
    runtime.call.ResidentCall: apply reads set k and writes set 1-k, then k flips;
    grads reads the params of set k.  `flat` = [grads (N) | loss (1)] is one
    64-byte aligned float32 buffer: the grads call writes it (outputs 1 and 0 point
    into it), the caller reduces it in place, the apply call reads it.  Natively
    ("cpu" backends) both are CallFrames whose pointer tables are built once; other
    devices run the programs' executors and copy into the same buffers."""

    def __init__(self, device, gprog, aprog, params: dict, frozen: dict, slots: list,
                 scale: float):
        from rlxc.runtime.call import aligned_empty

        from .registry import CpuBackend

        self.gprog, self.aprog = gprog, aprog
        n = gprog.grad_numel
        self.flat = aligned_empty((n + 1,), np.float32)
        self.flat[:] = 0
        self.grads, self.loss = self.flat[:n], self.flat[n:]
        self.scale = np.array([scale], np.float32)
        init = [params[p] for p in aprog.wrt] + list(slots)
        self.bufs = []
        for _ in range(2):
            self.bufs.append([_aligned_copy(a) for a in init])
        self.k = 0
        self.frozen = frozen
        self.nw = len(aprog.wrt)
        self._data = [None] * len(gprog.data)
        self._fwd = [None] * (len(gprog.wrt) if gprog.quant == "callable" else 0)
        self.scal = None
        b = backend(device)
        self.native = isinstance(b, CpuBackend)
        if self.native:
            from rlxc.backends import library_for

            b.target.require()
            opts = b._run_options({})
            self._glib = library_for(gprog.cache_alias(), lambda: gprog.func, device, **opts)
            self._alib = library_for(aprog.cache_alias(), lambda: aprog.func, device, **opts)
            self._frames()
        else:
            self._gex = gprog.executor(device)
            self._aex = aprog.executor(device)

    def _frames(self):
        from rlxc.runtime.call import CallFrame, data_address

        g, a = self._glib, self._alib
        gp, ap = self.gprog, self.aprog
        _expect(g, [*gp.data, None, *([None] * len(self._fwd))], gp.params)
        _expect(a, [None] * (len(ap.slot_args) + 2), ap.wrt)
        self._gf = [CallFrame(g)]
        self._gf.append(CallFrame(g, workspace=self._gf[0]))
        self._af = [CallFrame(a)]
        self._af.append(CallFrame(a, workspace=self._af[0]))
        widx = {p: j for j, p in enumerate(self.gprog.wrt)}
        nd = len(self.gprog.data)
        for k in range(2):
            fr = self._gf[k]
            fr.ins[nd] = data_address(self.scale)
            for i, name in enumerate(self.gprog.params):
                arr = self.bufs[k][widx[name]] if name in widx else self.frozen[name]
                fr.pars[i] = data_address(arr)
            fr.outs[0] = data_address(self.loss)
            fr.outs[1] = data_address(self.grads)
            fa = self._af[k]
            ns = len(self.aprog.slot_args)
            for j in range(ns):
                fa.ins[j] = data_address(self.bufs[k][self.nw + j])
                fa.outs[self.nw + j] = data_address(self.bufs[1 - k][self.nw + j])
            fa.ins[ns + 1] = data_address(self.grads)
            for j in range(self.nw):
                fa.pars[j] = data_address(self.bufs[k][j])
                fa.outs[j] = data_address(self.bufs[1 - k][j])

    def set_scalars(self, scal: np.ndarray) -> None:
        """The optimizer scalar vector (kept; rewritten in place by the caller)."""
        self.scal = scal
        if self.native:
            from rlxc.runtime.call import data_address

            ns = len(self.aprog.slot_args)
            for fa in self._af:
                fa.ins[ns] = data_address(scal)

    def set_data(self, i: int, a: np.ndarray) -> None:
        self._data[i] = a
        if self.native:
            from rlxc.runtime.call import data_address

            addr = data_address(a)
            self._gf[0].ins[i] = addr
            self._gf[1].ins[i] = addr

    def set_fwd(self, j: int, a: np.ndarray) -> None:
        self._fwd[j] = a
        if self.native:
            from rlxc.runtime.call import data_address

            pos = len(self.gprog.data) + 1 + j
            addr = data_address(a)
            self._gf[0].ins[pos] = addr
            self._gf[1].ins[pos] = addr

    def run_grads(self) -> np.ndarray:
        """Writes flat = [scaled grads | scaled loss]; returns flat."""
        if any(a is None for a in self._data):
            raise ValueError("distributed step: data inputs are not set")
        if self.native:
            self._gf[self.k].invoke()
        else:
            cur = self.bufs[self.k]
            widx = {p: j for j, p in enumerate(self.gprog.wrt)}
            pars = [cur[widx[n]] if n in widx else self.frozen[n] for n in self.gprog.params]
            loss, g = self._gex.run([*self._data, self.scale, *self._fwd, *pars])
            self.loss[...] = np.asarray(loss, np.float32).reshape(1)
            self.grads[...] = np.asarray(g, np.float32).reshape(-1)
        return self.flat

    def run_apply(self) -> None:
        """The update from `grads` (already reduced) into the other buffer set."""
        k = self.k
        if self.native:
            self._af[k].invoke()
        else:
            cur = self.bufs[k]
            outs = self._aex.run([*cur[self.nw:], self.scal, self.grads, *cur[:self.nw]])
            for dst, o in zip(self.bufs[1 - k], outs):
                dst[...] = np.asarray(o).reshape(dst.shape)
        self.k = 1 - k

    def param_view(self, j: int) -> np.ndarray:
        """The current value of trained param j (a view: valid until the next apply)."""
        return self.bufs[self.k][j]

    def get_arg(self, j: int) -> np.ndarray:
        """A copy of state j (trained params in wrt order, then the slots)."""
        return self.bufs[self.k][j].copy()

    def read(self) -> list[np.ndarray]:
        """Copies of the state: trained params (wrt order), then the slots."""
        return [b.copy() for b in self.bufs[self.k]]


def _expect(lib, inputs: list, params: list) -> None:
    """The library's argument tables have the layout the frames assume."""
    have_in = [a["name"] for a in lib.inputs]
    have_par = [a["name"] for a in lib.params]
    ok = len(have_in) == len(inputs) and all(w is None or w == h
                                             for w, h in zip(inputs, have_in))
    if not ok or have_par != list(params):
        raise RuntimeError(f"{lib.meta['entry']}: argument layout {have_in} / {have_par} "
                           f"differs from the split step's {inputs} / {params}")


def _aligned_copy(a) -> np.ndarray:
    from rlxc.runtime.call import aligned_empty

    a = np.asarray(a)
    b = aligned_empty(a.shape, np.float32)
    b[...] = a
    return b

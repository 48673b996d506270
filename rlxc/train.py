"""Training: one traced step function = forward + backward + clipping + update.

Purpose
-------
`Func.train_step` and `Trainer` (rlxc/trainer.py) both run the same rlx
function, built here once per (model IR, optimizer structure, wrt, clipping,
quantization): it takes the data, the params, the optimizer slots and a small
vector of per-step float32 scalars, and returns the loss before the update,
the updated params and the updated slots.  Compiled natively it is one call
per training step; through the interpreter it is the reference.

Step graph
----------
    args:  <data inputs of f> | <params of f> (kind param) | opt_<slot>_<param>
           for every trained param and slot | opt_scalars f32[k]
           | fwd_<param> (only with a callable quantizer)
      w_p  = fake_quant(p)  (quant = a format name: straight-through),
             fwd_p           (quant = a callable run on the host), else p
      loss, g_p... = inline(value_and_grad(f, wrt))(data, w_p / frozen params)
      clip (max > 0):  ss = sum_p sum((f64)g_p * (f64)g_p);  n = sqrt(ss)   (f64)
             scale = (f32)max / (f32)n   (RLX's f32 division)  if  max < n <= FLT_MAX
                     (f32)(max / n)                             if  FLT_MAX < n < inf
                     1                                          otherwise (NaN, inf)
             g_p = g_p * scale        (exact when scale = 1)
      update: opt.update(b, p, g, state, s) of rlxc/optim.py (the NumPy formulas,
             op by op in the same order), with the scalars read from
             opt_scalars (opt.step_scalars(t, lr), which rounds the float64
             values to float32 once)
    outputs: loss, new p (wrt order)..., new slots (param-major, slot order)

Quantization applies to the trained params (their float32 values are the
master weights); frozen params enter the forward as they are.

The optimizer's `structure()` (class, kind, slot set, weight decay on/off,
Nesterov, ...) is part of the cache key;
everything numeric (lr from a schedule, betas, eps, bias corrections, the
weight-decay value) travels in opt_scalars, so a schedule never recompiles.

Norm precision: the clip norm is accumulated in float64 ("f64" casts in the
graph), so it cannot overflow: a sum of squares of float32 values stays far
below DBL_MAX.  The interpreter and the native CPU backend compute f64
exactly (the CPU sums blocks of 4096 elements, so the f64 sum may differ from
NumPy's in its last bits, which the f32 rounding of the norm absorbs).  Where
a device computes f32 only (`NORM_DTYPES`: "cuda"), the norm is
m * sqrt(sum((g / m)**2)) with m = max |g| over all grads: no term exceeds 1,
so nothing overflows either, at f32 accuracy.

Also here: `save_params` / `load_params` (params as a safetensors file, names
and declared shapes checked strictly by rlxc.checkpoint).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from rlxc.runtime.errors import NameLookupError
from rlxc.runtime.signature import coerce

from .optim import Optimizer
from .registry import backend, default_device
from .tensor import GraphScope, where

__all__ = ["StepProgram", "step_program", "train_step", "save_params", "load_params",
           "clip_reference", "qat_hook", "check_call_shape", "optimizer_structure",
           "bound_params", "loss_value", "coerce_data"]

_FLT_MAX = float(np.finfo(np.float32).max)
_DBL_MAX = float(np.finfo(np.float64).max)

# dtype of the clip-norm accumulation per device (None: an AOT build for the CPU)
NORM_DTYPES = {"interp": "f64", "cpu": "f64", "cuda": "f32", None: "f64"}


def optimizer_structure(opt: Optimizer) -> tuple:
    """What of an optimizer shapes the step graph (kind, slots, switches): the cache key."""
    return opt.structure()


# -- clipping reference (NumPy), the contract the graph follows ---------------

def clip_reference(grads: dict, max_norm: float) -> tuple[dict, float]:
    """Clip like the step graph: float64 norm, RLX's float32 scale, one multiply.

    Returns (grads, norm); the grads are scaled by (f32)max / (f32)norm when
    max < norm <= FLT_MAX, by (f32)(max / norm) when FLT_MAX < norm < inf, and
    left alone otherwise (norm within max, NaN or inf: RLX's scale 1)."""
    if not max_norm > 0:
        return grads, float("nan")
    ss = 0.0
    for g in grads.values():
        g64 = np.asarray(g, np.float64)
        ss += float(np.sum(g64 * g64))
    norm = float(np.sqrt(ss))
    if math.isfinite(norm) and norm > max_norm:
        if norm <= _FLT_MAX:
            scale = np.float32(max_norm) / np.float32(norm)
        else:
            scale = np.float32(max_norm / norm)
        grads = {k: (np.asarray(g, np.float32) * scale).astype(np.float32)
                 for k, g in grads.items()}
    return grads, norm


# -- the step program ----------------------------------------------------------

@dataclass
class StepProgram:
    """The step function and where each group of its args/outputs sits.

    The layout (names, slots, scalars) is known without tracing; `func` (the traced
    step Func, nothing bound) is built on first use, so a Trainer whose compiled
    step is already in the disk cache never builds it (`cache_alias`)."""

    make: object                 # () -> the step Func
    data: list                   # data input names of the model, signature order
    params: list                 # every param of the model, signature order
    wrt: list                    # trained params (a subset of `params`, model order)
    slots: list                  # slot names of the optimizer, in order
    slot_args: list              # (param, slot) for each slot arg, param-major
    scalar_names: list           # names in opt_scalars
    quant: object                # None, (exp_bits, man_bits, max_normal), or "callable"
    structure: tuple
    max_grad_norm: float
    key: tuple = ()              # what decides the step IR (model trace_hash, structure, ...)
    executors: dict = field(default_factory=dict)
    data_specs: list | None = None  # filled on first use by coerce_data
    _func: object = None
    dynamic: bool = False        # the model has dynamic dims (rlxc/dynamic.py runs the step)

    @property
    def func(self):
        """The traced step Func (built once, on first use)."""
        if self._func is None:
            self._func = self.make()
        return self._func

    def cache_alias(self) -> str:
        """A name of the step's compiled library computable without tracing it: the
        step key plus a hash of the sources that turn a model into its step IR."""
        import hashlib

        return hashlib.sha256(f"{self.key!r}|{transform_fingerprint()}".encode()).hexdigest()

    def arg_layout(self):
        """(data, params, slots, scalars, fwd) index ranges in the signature."""
        a = len(self.data)
        b = a + len(self.params)
        c = b + len(self.slot_args)
        d = c + 1
        e = d + (len(self.wrt) if self.quant == "callable" else 0)
        return (0, a), (a, b), (b, c), (c, d), (d, e)

    def scalar_vector(self, opt: Optimizer, t: int, lr: float, out=None) -> np.ndarray:
        vals = opt.step_scalars(t, lr)
        if list(vals) != self.scalar_names:
            raise ValueError(f"train step: optimizer scalars changed: {list(vals)} vs "
                             f"{self.scalar_names}")
        out = np.empty(len(vals), np.float32) if out is None else out
        out[:] = list(vals.values())
        return out

    def executor(self, device: str):
        ex = self.executors.get(device)
        if ex is None:
            from .dynamic import executor_for

            ex = executor_for(backend(device), self.func)   # dynamic dims: per-sizes programs
            self.executors[device] = ex
        return ex


def safe_name(name: str) -> str:
    s = re.sub(r"\W", "_", name)
    return s if s and not s[0].isdigit() else "_" + s


def unique_name(base: str, used: set) -> str:
    n = base
    while n in used:
        n += "_"
    used.add(n)
    return n


def quant_key(quant):
    if quant is None:
        return None
    if isinstance(quant, str):
        from .lowp import parse_format, quantize_named

        quantize_named(quant)  # raises a clear error for an unknown name
        return ("fmt", parse_format(quant))
    if callable(quant):
        return "callable"
    raise TypeError(f"quant must be a format name or a callable (name, array) -> array, "
                    f"got {type(quant).__name__}")


def resolve_wrt(f, wrt) -> list[str]:
    names = f.param_names()
    if wrt is None:
        wrt = names
    elif isinstance(wrt, str):
        wrt = [wrt]
    wrt = list(wrt)
    bad = [w for w in wrt if w not in names]
    if bad:
        raise NameLookupError(f"train step: {bad[0]!r} is not a param of {f.name}; "
                              f"params: {names}")
    if not wrt:
        raise ValueError(f"train step: no params to train in {f.name}")
    for w in wrt:
        dt = next(a.dtype for a in f.signature() if a.name == w)
        if dt != "f32":
            raise TypeError(f"train step: param {w!r} is {dt}; optimizers update f32 params")
    return [n for n in names if n in set(wrt)]


_CACHE: dict = {}
_CACHE_MAX = 64
_TRANSFORM_FP = None


def transform_fingerprint() -> str:
    """Hash of what builds a step graph from a model: the sources of rlxc/ and the
    dialect (tracer, IR builder, transforms, cleanup, optimizer rules), and the
    versions of xDSL (IR objects, rewriting) and NumPy (constant folding), read
    without importing xDSL.  Part of StepProgram.cache_alias."""
    global _TRANSFORM_FP
    if _TRANSFORM_FP is None:
        import hashlib
        import os

        import rlxc.dialect as dialect_pkg

        h = hashlib.sha256()
        dirs = [os.path.dirname(os.path.abspath(__file__)),
                os.path.dirname(os.path.abspath(dialect_pkg.__file__))]
        for d in dirs:
            for n in sorted(os.listdir(d)):
                if n.endswith(".py"):
                    with open(os.path.join(d, n), "rb") as fh:
                        h.update(n.encode() + b"\0" + fh.read())
        h.update(f"\0xdsl {_dist_version('xdsl')}\0numpy {np.__version__}".encode())
        _TRANSFORM_FP = h.hexdigest()[:16]
    return _TRANSFORM_FP


def _dist_version(pkg: str) -> str:
    """The installed distribution of `pkg`, from its .dist-info folder name (cheap: no
    import of the package, no importlib.metadata); else a hash of its __init__.py."""
    import os
    from importlib.util import find_spec

    spec = find_spec(pkg)
    if spec is None or not spec.origin:
        return "missing"
    pkg_dir = os.path.dirname(spec.origin)
    try:
        found = sorted(n for n in os.listdir(os.path.dirname(pkg_dir))
                       if n.startswith(pkg + "-") and n.endswith(".dist-info"))
    except OSError:
        found = []
    if found:
        return ",".join(found)
    import hashlib

    with open(spec.origin, "rb") as fh:
        return "src-" + hashlib.sha256(fh.read()).hexdigest()[:16]


def step_program(f, opt: Optimizer, wrt=None, max_grad_norm: float = 0.0, quant=None,
                 norm_dtype: str | None = None, device: str | None = None) -> StepProgram:
    """The (cached) step program of `f` with this optimizer structure and options.

    `norm_dtype` (default: `NORM_DTYPES[device]`) is the clip-norm accumulation type."""
    if norm_dtype is None:
        norm_dtype = NORM_DTYPES.get(device, "f32")
    wrt = resolve_wrt(f, wrt)
    max_grad_norm = float(max_grad_norm)
    qkey = quant_key(quant)
    key = (f.trace_hash(), optimizer_structure(opt), tuple(wrt), max(max_grad_norm, 0.0), qkey,
           norm_dtype, tuple(opt.step_scalars(1, opt.lr)))
    prog = _CACHE.get(key)
    if prog is None:
        prog = _build(f, opt, wrt, max_grad_norm, qkey, norm_dtype)
        prog.key = key
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = prog
    return prog


def _build(f, opt, wrt, max_grad_norm, qkey, norm_dtype) -> StepProgram:
    Func = type(f)  # rlxc.func.Func, taken from `f`: this module never imports func.py

    slots = opt.slots()
    scalar_names = list(opt.step_scalars(1, opt.lr).keys())
    sig = f.signature()
    used = {a.name for a in sig}
    slot_args = [(p, s) for p in wrt for s in slots]
    slot_arg_names = [unique_name(safe_name(f"opt_{s}_{p}"), used) for p, s in slot_args]
    scal_name = unique_name("opt_scalars", used)
    fwd_names = [unique_name(safe_name(f"fwd_{p}"), used) for p in wrt] if qkey == "callable" else []

    def build(sc: GraphScope, vg):
        data = {a.name: sc.input(a.name, a.shape, a.dtype) for a in sig if a.kind == "input"}
        # frozen params keep their dtype: an imported model may hold integer params,
        # which GraphScope.param (the tracing API) does not declare
        params = {a.name: sc._arg(a.name, a.shape, a.dtype, "param")
                  for a in sig if a.kind == "param"}
        st = {}
        for (p, s), n in zip(slot_args, slot_arg_names):
            st.setdefault(p, {})[s] = sc.input(n, opt.slot_shape(s, params[p].shape), "f32")
        vec = sc.input(scal_name, (len(scalar_names),), "f32")
        fwd = {p: sc.input(n, params[p].shape, "f32") for p, n in zip(wrt, fwd_names)}
        scal = {n: vec[i] for i, n in enumerate(scalar_names)}

        loss, grads = call_value_and_grad(sc, vg, data, params, wrt, qkey, fwd)
        if len(grads) != len(wrt):
            raise ValueError(f"train step: value_and_grad of {f.name} returned "
                             f"{len(grads)} grads for {len(wrt)} params")
        new_p, new_s = clip_and_update(sc, opt, params, grads, wrt, st, scal,
                                       max_grad_norm, norm_dtype)
        return [loss, *new_p, *new_s]

    def make():
        from rlxc.dialect.passes import cleanup

        vg = f.value_and_grad(wrt)
        step = Func(f"{f.name}_train_step", lambda sc: build(sc, vg))
        return step.with_module(cleanup(step.module))  # drops unused scalar slices

    prog = StepProgram(make, [a.name for a in sig if a.kind == "input"],
                       [a.name for a in sig if a.kind == "param"], list(wrt), slots, slot_args,
                       scalar_names, None if qkey is None else
                       ("callable" if qkey == "callable" else qkey[1]),
                       optimizer_structure(opt), max_grad_norm)
    prog.dynamic = any(isinstance(d, str) for a in sig for d in a.shape)   # known untraced
    return prog


def call_value_and_grad(sc: GraphScope, vg, data: dict, params: dict, wrt, qkey, fwd: dict):
    """Call the value_and_grad Func `vg` on the traced `data` and `params`: a param in `fwd`
    is replaced by that input (a callable quantizer's forward value), the other `wrt` params
    go through fake_quant when `qkey` names a format.  Returns (loss, grads)."""
    call_args = dict(data)
    for name, t in params.items():
        if name in fwd:
            t = fwd[name]
        elif qkey is not None and name in wrt:
            t = t.fake_quant(qkey[1])
        call_args[name] = t
    loss, *grads = sc.call(vg, call_args)
    return loss, grads


def clip_and_update(sc: GraphScope, opt: Optimizer, params: dict, grads, wrt, state: dict,
                    scal: dict, max_grad_norm: float, norm_dtype: str):
    """Global-norm clipping (when max_grad_norm > 0), then the optimizer's graph update of
    each `wrt` param.  Returns (new params, new slots in wrt x opt.slots() order)."""
    if max_grad_norm > 0:
        grads = clip_grads(sc, grads, max_grad_norm, norm_dtype)
    new_p, new_s = [], []
    for name, g in zip(wrt, grads):
        p2, s2 = opt.checked_update(sc, params[name], g, state.get(name, {}), scal)
        new_p.append(p2)
        new_s.extend(s2[k] for k in opt.slots())
    return new_p, new_s


def clip_grads(sc: GraphScope, grads, max_norm: float, nd: str):
    """The scaled grads (see the module docstring: clip, and Norm precision)."""
    one = sc.scalar(1.0, "f32")
    mx32 = sc.scalar(max_norm, "f32")
    if nd == "f64":
        total = None
        for g in grads:
            g2 = g.cast("f64")
            ss = (g2 * g2).sum()
            total = ss if total is None else total + ss
        norm = total.sqrt()
        mx = sc.scalar(max_norm, "f64")
        ratio = where(norm.le(sc.scalar(_FLT_MAX, "f64")), mx32 / norm.cast("f32"),
                      (mx / norm).cast("f32"))
        # NaN compares false and inf fails `<= DBL_MAX`, so neither scales
        scale = where(norm.le(sc.scalar(_DBL_MAX, "f64")), where(norm.gt(mx), ratio, one), one)
        return [g * scale for g in grads]
    # f32 only: scale by m = max |g| first, so no square exceeds 1
    m = None
    for g in grads:
        a = g.abs().max()
        m = a if m is None else m.maximum(a)
    total = None
    for g in grads:
        q = g / m
        ss = (q * q).sum()
        total = ss if total is None else total + ss
    rn = total.sqrt()          # norm / m, in [1, sqrt(size)]
    norm = m * rn              # inf when the norm exceeds FLT_MAX
    ratio = where(norm.le(sc.scalar(_FLT_MAX, "f32")), mx32 / norm, (mx32 / m) / rn)
    # m = 0 gives rn = NaN, NaN grads give NaN: both compare false, scale 1
    scale = where(m.le(sc.scalar(_FLT_MAX, "f32")), where(norm.gt(mx32), ratio, one), one)
    return [g * scale for g in grads]


# -- Func.train_step -----------------------------------------------------------

def bound_params(f) -> dict:
    bound = f.params()
    missing = [n for n in f.param_names() if n not in bound]
    if missing:
        raise NameLookupError(f"train step: params {missing} of {f.name} are not bound "
                              "(bind with with_param / init_randn / init_params)")
    return bound


def coerce_data(prog: StepProgram, f, inputs) -> list:
    """The data inputs in signature order, as the contiguous arrays the step expects."""
    specs = prog.data_specs
    if specs is None:
        from rlxc.runtime.signature import NP_DTYPES

        specs = prog.data_specs = [(a.name, tuple(a.shape), a.dtype, np.dtype(NP_DTYPES[a.dtype]))
                                   for a in f.signature() if a.kind == "input"]
    if not isinstance(inputs, dict):
        raise TypeError(f"train step: inputs must be a dict name -> array, got "
                        f"{type(inputs).__name__}")
    if len(inputs) != len(specs) or any(k not in inputs for k in prog.data):
        unknown = [k for k in inputs if k not in prog.data]
        if unknown:
            raise NameLookupError(f"train step: unknown input {unknown[0]!r}; inputs of "
                                  f"{f.name}: {prog.data}")
        missing = [k for k in prog.data if k not in inputs]
        raise NameLookupError(f"train step: missing input {missing[0]!r}; inputs of "
                              f"{f.name}: {prog.data}")
    out = []
    for name, shape, dt, npdt in specs:
        a = inputs[name]
        if not (type(a) is np.ndarray and a.dtype == npdt and a.shape == shape
                and a.flags.c_contiguous):
            a = coerce("input", name, a, shape, dt)
        out.append(a)
    return out


def loss_value(x):
    a = np.asarray(x)
    return float(a.reshape(())) if a.size == 1 else a.copy()


_SIGNATURE = ("f.train_step(opt, inputs, wrt=None, schedule=None, step=0, device=None, "
              "max_grad_norm=0.0, quant=None)")


def check_schedule(schedule, what: str = "train_step") -> None:
    if schedule is not None and not callable(getattr(schedule, "lr_at", None)):
        raise TypeError(f"{what}: schedule must be an rlxc.LrSchedule (with lr_at(step)), got "
                        f"{type(schedule).__name__}")


def check_call_shape(inputs, wrt, schedule=None) -> None:
    """Refuse RLX's argument order `train_step(opt, wrt, inputs)` with the signature."""
    check_schedule(schedule)
    names = isinstance(inputs, str) or (isinstance(inputs, (list, tuple)) and inputs
                                        and all(isinstance(x, str) for x in inputs))
    if names or isinstance(wrt, dict):
        got = (f"the list of names {list(inputs) if not isinstance(inputs, str) else inputs!r} "
               f"where the inputs belong" if names else "a dict as wrt")
        raise TypeError(f"train_step: got {got}; the signature is {_SIGNATURE}: the inputs "
                        f"dict comes second and the params to train go in wrt=[...] "
                        f"(RLX's order train_step(opt, wrt, inputs) is not accepted)")


def _positional_arity(fn) -> int:
    """How many positional arguments `fn` requires (2 when it cannot be told)."""
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 2
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return 2
    return sum(1 for p in params if p.default is p.empty
               and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


def qat_hook(quant):
    """The `(name, array) -> float32 array` quantizer of a train step's `quant`.

    `quant` is a format name, a callable `fn(name, arr) -> arr`, or RLX's
    in-place form `fn(arr)` that rewrites `arr` and returns None.  A callable
    gets a float32 copy of the master weights (they are never modified); when
    it returns None the copy, as it left it, is the quantized value."""
    from .lowp import quantize_named

    if isinstance(quant, str) or not callable(quant):
        return quantize_named(quant)
    user = quant
    one_arg = _positional_arity(user) == 1

    def hook(name, arr):
        a = np.array(arr, np.float32, copy=True)
        out = user(a) if one_arg else user(name, a)
        return a if out is None else out

    return quantize_named(hook)


def train_step(f, opt: Optimizer, inputs, wrt=None, schedule=None, step: int = 0,
               device=None, max_grad_norm: float = 0.0, quant=None):
    """One update of `f`'s params; returns (new Func, loss before the update).

    The optimizer's state (opt.state, opt.t) is read and advanced, exactly as
    `opt.step` would; with a `schedule`, `opt.set_lr(schedule.lr_at(step))`
    sets the optimizer's lr first (it persists, as in RLX's `_at` variants)."""
    check_call_shape(inputs, wrt, schedule)
    device = device or default_device()
    prog = step_program(f, opt, wrt, max_grad_norm, quant, device=device)
    if schedule is not None:
        opt.set_lr(schedule.lr_at(step))
    lr = opt.lr
    t = opt.t + 1
    scal = prog.scalar_vector(opt, t, lr)
    bound = bound_params(f)
    args = coerce_data(prog, f, inputs)
    args += [bound[n] for n in prog.params]
    for p, s in prog.slot_args:
        buf = opt.state.get(p, {}).get(s)
        shape = opt.slot_shape(s, bound[p].shape)
        if buf is None:
            buf = np.zeros(shape, np.float32)
        elif buf.shape != shape:
            raise ValueError(f"train step: optimizer state {s!r} of {p!r} has shape "
                             f"{buf.shape}, expected {shape} (the param has "
                             f"{bound[p].shape})")
        args.append(np.ascontiguousarray(buf, np.float32))
    args.append(scal)
    if prog.quant == "callable":
        qf = qat_hook(quant)
        args += [qf(n, bound[n]) for n in prog.wrt]
    outs = prog.executor(device).run(args)
    nw = len(prog.wrt)
    new_params = dict(zip(prog.wrt, outs[1:1 + nw]))  # with_params copies them
    slots = outs[1 + nw:]
    for (p, s), a in zip(prog.slot_args, slots):
        opt.state.setdefault(p, {})[s] = np.array(a, np.float32, copy=True)
    opt._t = t  # the counter Optimizer.step advances
    return f.with_params(new_params), loss_value(outs[0])


# -- params as a safetensors file ------------------------------------------------

def save_params(f, path, metadata=None) -> None:
    """Write every param of `f` (all must be bound) to `path`."""
    from .checkpoint import save_tensors

    bound = bound_params(f)
    meta = {"rlxc.kind": "params", "rlxc.func": f.name}
    meta.update(metadata or {})
    save_tensors(path, {n: np.asarray(bound[n]) for n in f.param_names()}, meta)


def load_params(f, path, strict: bool = True):
    """A new Func with params read from `path` (names and declared shapes checked;
    a tensor whose conversion to its param's dtype changes values warns)."""
    from rlxc.runtime.signature import NP_DTYPES

    from .checkpoint import load_tensors, to_param_dtype

    expected = {n: f.param_shape_of(n) for n in f.param_names()}
    arrays = load_tensors(path, expected, strict=strict)
    dtypes = {a.name: NP_DTYPES[a.dtype] for a in f.signature() if a.kind == "param"}
    return f.with_params({n: to_param_dtype(f"load_params({str(path)!r})", n, a, dtypes[n])
                          for n, a in arrays.items()})

"""Trainer: the fast training loop, one call of the compiled step per step.

Purpose
-------
`f.trainer(opt, ...)` compiles the step function of rlxc/train.py once and
keeps params and optimizer slots resident between steps, so `step(inputs)`
does no Python work per parameter: it writes the data inputs and the per-step
scalar vector (lr from the schedule, bias corrections from
`opt.step_scalars`) and makes one call.  `func` / `state_dict()` copy the
state out; `load_state_dict()` / `load()` put it back (bit-exact resume).

Engines
-------
The device's backend (rlxc/registry.py `Backend.step_engine`) makes the
engine; every engine has the interface of runtime.call.ResidentCall.
* native ("cpu"): a ResidentCall (runtime/call.py, the native call path that
  Jitted uses too) around the step's library: trained params and slots live
  in two buffer sets, the pointer tables of both phases are built once, and
  steps alternate between them, so the outputs of one step are the inputs of
  the next.  Per step only the data pointers are stored, the scalar vector is
  rewritten in place, and one foreign call is made.
* otherwise ("interp", "cuda"): runtime.call.ExecutorLoop runs the same step
  function through the device's executor, and its outputs become the next
  step's state arrays.

The Trainer owns `opt` while it trains: `opt.t` advances every step (it
drives bias correction, and `opt.set_lr(schedule.lr_at(opt.t))` sets the lr,
which persists and is saved in `state_dict`), while the
slots live in the engine; `opt.state` is refreshed by `state_dict()` and
`sync_optimizer()`.

Distributed (`comm=`, rlxc/distributed.py): the step is the two programs of
rlxc/train_split.py run by rlxc/split_engine.py: grads on this rank's shard
(scaled by n_local / n_total) into one flat float32 buffer, summed over ranks
once (`comm.grad_buffer`: an in-place Allreduce, or a shared-memory window on
one node; rlxc/reduce_buffer.py), then the same update on every rank.  At creation
every param and slot (and opt.t) is broadcast from rank 0; `step` returns the
global mean loss; `save` / `save_params` write on rank 0 only (atomically),
then all ranks pass a barrier.  Without `comm` nothing of this runs.

Threads: one Trainer runs one step at a time.  `step`, and everything that
reads or replaces the state (`func`, `state_dict`, `load_state_dict`,
`sync_optimizer`, `save`, `load`), hold the Trainer's lock, so steps from
several threads are applied one after the other, each exactly once (the
engine's buffers, the scalar vector and `opt.t` are shared).
"""
from __future__ import annotations

import threading

import numpy as np

from rlxc.runtime.errors import NameLookupError
from rlxc.runtime.signature import coerce

from .optim import Optimizer
from .registry import backend, default_device
from .train import bound_params, coerce_data, loss_value, optimizer_structure, step_program

__all__ = ["Trainer"]

_PARAM = "params."
_OPTIM = "optim."


class Trainer:
    """Compiled training loop for a Func; see the module docstring."""

    def __init__(self, func, opt: Optimizer, schedule=None, max_grad_norm: float = 0.0,
                 quant=None, device=None, wrt=None, comm=None, batch_size=None):
        if not isinstance(opt, Optimizer):
            raise TypeError(f"trainer: opt must be an rlxc.optim optimizer, got "
                            f"{type(opt).__name__}")
        from .train import check_schedule

        check_schedule(schedule, "trainer")
        self._f = func
        self.opt = opt
        self.schedule = schedule
        self.max_grad_norm = float(max_grad_norm)
        self.quant = quant
        self.device = device or default_device()
        self._backend = backend(self.device)
        self._wrt = wrt
        self._lock = threading.Lock()  # one step (or state read/write) at a time
        self.comm = comm
        bound = bound_params(func)
        slots = {p: dict(st) for p, st in opt.state.items()}
        if comm is not None:
            from .trainer_dist import setup

            bound, slots = setup(self, bound, slots, batch_size)
        self._build(bound, slots)

    # -- construction -----------------------------------------------------------
    def _build(self, params: dict, slots: dict) -> None:
        if self.comm is not None:
            from .trainer_dist import build

            return build(self, params, slots)
        f = self._f
        prog = step_program(f, self.opt, self._wrt, self.max_grad_norm, self.quant,
                            device=self.device)
        self._prog = prog
        self._structure = optimizer_structure(self.opt)
        (d0, d1), (p0, p1), (s0, s1), (c0, _), (q0, q1) = prog.arg_layout()
        self._data_pos = list(range(d0, d1))
        self._fwd_pos = list(range(q0, q1))
        if self._fwd_pos:
            from .train import qat_hook

            self._qf = qat_hook(self.quant)
        self._scal = np.zeros(len(prog.scalar_names), np.float32)
        args = [None] * q1
        dtypes = self._param_dtypes()
        for i, n in zip(range(p0, p1), prog.params):
            args[i] = np.array(params[n], dtypes[n], copy=True)  # f64 frozen params stay f64
        self._frozen = {n: args[i] for i, n in zip(range(p0, p1), prog.params)
                        if n not in prog.wrt}
        for i, (p, s) in zip(range(s0, s1), prog.slot_args):
            buf = slots.get(p, {}).get(s)
            shape = self.opt.slot_shape(s, args[p0 + prog.params.index(p)].shape)
            if buf is None:
                buf = np.zeros(shape, np.float32)
            elif buf.shape != shape:
                raise ValueError(f"trainer: optimizer state {s!r} of {p!r} has shape "
                                 f"{buf.shape}, expected {shape}")
            args[i] = np.array(buf, np.float32, copy=True)
        args[c0] = self._scal
        state_pos = [p0 + prog.params.index(n) for n in prog.wrt] + list(range(s0, s1))
        self._param_pos = {n: p0 + i for i, n in enumerate(prog.params)}
        self._engine = self._backend.step_engine(prog, args, state_pos)

    # -- the step ----------------------------------------------------------------
    @property
    def step_func(self):
        """The traced step Func (its MLIR shows the whole fused step)."""
        return self._prog.func

    @property
    def step_count(self) -> int:
        """Updates applied so far (the optimizer's t)."""
        return self.opt.t

    def step(self, inputs) -> float:
        """One update; returns the loss computed before it.  Thread-safe: concurrent
        calls run one after the other (the Trainer's lock), each applied once."""
        with self._lock:
            return self._step(inputs)

    def _step(self, inputs) -> float:
        if self.comm is not None:
            from .trainer_dist import step

            return step(self, inputs)
        opt = self.opt
        if optimizer_structure(opt) != self._structure:  # e.g. weight decay switched on
            self._rebuild()
        prog = self._prog
        t = opt.t + 1
        if self.schedule is not None:  # persists, as RLX's `_at` variants do
            opt.set_lr(self.schedule.lr_at(opt.t))
        prog.scalar_vector(opt, t, opt.lr, out=self._scal)
        eng = self._engine
        for i, a in zip(self._data_pos, coerce_data(prog, self._f, inputs)):
            eng.set_arg(i, a)
        if self._fwd_pos:
            qf = self._qf
            cur = self._read_params()
            for i, n in zip(self._fwd_pos, prog.wrt):
                # the quantizer is user code: its result is validated like any input
                eng.set_arg(i, coerce("input", f"quant({n})", qf(n, cur[n]), cur[n].shape,
                                      "f32"))
        loss = eng.run()
        opt._t = t  # the counter Optimizer.step advances
        return loss_value(loss)

    # -- state out / in --------------------------------------------------------------
    def _read_all(self):
        prog = self._prog
        arrays = self._engine.read()
        nw = len(prog.wrt)
        params = dict(zip(prog.wrt, arrays[:nw]))
        slots: dict = {}
        for (p, s), a in zip(prog.slot_args, arrays[nw:]):
            slots.setdefault(p, {})[s] = a
        return params, slots

    def _param_dtypes(self) -> dict:
        from rlxc.runtime.signature import NP_DTYPES

        return {a.name: NP_DTYPES[a.dtype] for a in self._f.signature() if a.kind == "param"}

    def _read_params(self) -> dict:
        """Copies of every param: trained ones from the engine, frozen ones as bound
        (in their declared dtype)."""
        return {n: self._frozen[n].copy() if n in self._frozen else self._engine.get_arg(i)
                for n, i in self._param_pos.items()}

    def _rebuild(self):
        params = self._read_params()
        _, slots = self._read_all()
        self._build(params, slots)

    @property
    def func(self):
        """The model Func with the current params bound."""
        with self._lock:
            return self._f.with_params(self._read_params())

    def sync_optimizer(self) -> Optimizer:
        """Copy the slots from the engine into `opt.state`; returns opt."""
        with self._lock:
            return self._sync_optimizer()

    def _sync_optimizer(self) -> Optimizer:
        _, slots = self._read_all()
        for p, st in slots.items():
            self.opt.state[p] = st
        return self.opt

    def state_dict(self) -> dict[str, np.ndarray]:
        """Flat and safetensors-ready: "params.<name>" and "optim.<key>" entries."""
        with self._lock:
            out = {_PARAM + n: a for n, a in self._read_params().items()}
            for k, v in self._sync_optimizer().state_dict().items():
                out[_OPTIM + k] = v
            return out

    def load_state_dict(self, state) -> None:
        """Restore a `state_dict()`: every param (declared shapes) and the optimizer."""
        with self._lock:
            self._load_state_dict(state)

    def _load_state_dict(self, state) -> None:
        f = self._f
        params = {k[len(_PARAM):]: v for k, v in state.items() if k.startswith(_PARAM)}
        optim = {k[len(_OPTIM):]: v for k, v in state.items() if k.startswith(_OPTIM)}
        other = [k for k in state if not k.startswith((_PARAM, _OPTIM))]
        names = f.param_names()
        missing = [n for n in names if n not in params]
        extra = [n for n in params if n not in names]
        if other or missing or extra:
            raise NameLookupError(f"trainer.load_state_dict: missing params {missing}, "
                                  f"unexpected params {extra}, unexpected entries {other}; "
                                  f"params of {f.name}: {names}")
        for n in names:
            want = f.param_shape_of(n)
            if tuple(np.shape(params[n])) != want:
                raise ValueError(f"trainer.load_state_dict: param {n!r} expects shape "
                                 f"{want}, got {tuple(np.shape(params[n]))}")
        from .checkpoint import to_param_dtype

        dtypes = self._param_dtypes()
        params = {n: to_param_dtype("trainer.load_state_dict", n, params[n], dtypes[n])
                  for n in names}
        self.opt.load_state_dict(optim, params=params)
        self._build(params, self.opt.state)

    def save(self, path) -> None:
        """Write `state_dict()` to a safetensors file (distributed: rank 0 writes)."""
        from .checkpoint import save_tensors

        state = self.state_dict()
        if self._writer():
            save_tensors(path, state, {"rlxc.kind": "trainer", "rlxc.func": self._f.name,
                                       "rlxc.optim": self.opt.kind})
        self._written()

    def save_params(self, path, metadata=None) -> None:
        """Write the current params (as `func.save_params`; distributed: rank 0 writes,
        atomically, then every rank passes a barrier so the file exists for all)."""
        from .train import save_params

        f = self.func
        if self._writer():
            save_params(f, path, metadata)
        self._written()

    def _writer(self) -> bool:
        return self.comm is None or self.comm.rank == 0

    def _written(self) -> None:
        if self.comm is not None:
            self.comm.barrier()

    def load(self, path) -> None:
        """Restore from a file written by `save`."""
        from .checkpoint import load_tensors

        self.load_state_dict(load_tensors(path))

    def __repr__(self):
        return (f"Trainer({self._f.name}, {self.opt!r}, device={self.device!r}, "
                f"t={self.opt.t})")

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
* native ("cpu"): the backend's library for the step function is called
  directly, `entry(inputs**, outputs**, params**, workspace*)`.  Trained
  params and slots live in two buffer sets A and B; the pointer tables
  (inputs [data | slots(A) | scalars], params [params(A)], outputs
  [loss | params(B) | slots(B)]) and their mirror (B -> A) are built once,
  and steps alternate between them, so the outputs of one step are the
  inputs of the next.  Per step only the data pointers are stored, the
  scalar vector is rewritten in place, and one foreign call is made.
* otherwise ("interp", or a device without the native engine): any executor
  with `.run(arrays)` runs the same step function, and its outputs become the
  next step's state arrays.

The Trainer owns `opt` while it trains: `opt.t` advances every step (it
drives bias correction, and `opt.set_lr(schedule.lr_at(opt.t))` sets the lr,
which persists and is saved in `state_dict`), while the
slots live in the engine; `opt.state` is refreshed by `state_dict()` and
`sync_optimizer()`.
"""
from __future__ import annotations

import ctypes

import numpy as np

from rlxc.runtime.errors import NameLookupError

from .optim import Optimizer
from .train import _bound_params, _loss_value, _structure, coerce_data, step_program

__all__ = ["Trainer"]

_PARAM = "params."
_OPTIM = "optim."


class _ArrayEngine:
    """Runs the step through any executor with `.run(arrays) -> outputs`.

    `args` is the full argument list in signature order; the state part of it
    (params being trained, then slots) is replaced by the matching outputs
    after every call."""

    def __init__(self, executor, args: list, state_pos: list[int]):
        self.ex = executor
        self.args = args
        self.state_pos = state_pos

    def run(self) -> object:
        outs = self.ex.run(self.args)
        args = self.args
        for i, o in zip(self.state_pos, outs[1:]):
            args[i] = o
        return outs[0]

    def read(self) -> list[np.ndarray]:
        return [np.array(self.args[i], np.float32, copy=True) for i in self.state_pos]

    def set_arg(self, i: int, a) -> None:
        self.args[i] = a

    def get_arg(self, i: int) -> np.ndarray:
        return np.array(self.args[i], np.float32, copy=True)


class _NativeEngine:
    """Resident double buffers and pre-built pointer tables around one compiled step.

    The library's entry is `rc = entry(inputs**, outputs**, params**, workspace*)`.
    Phase k (0 or 1) reads the state from buffer set k and writes set 1-k, so
    tables[k] point the state inputs/params at set k and the state outputs at
    set 1-k; after the call k flips.  Constant arguments (frozen params, the
    scalar vector, written in place by the Trainer) are pointed at once; data
    inputs are re-pointed per step (one store per data input, in both tables)."""

    def __init__(self, lib, args: list, state_pos: list[int]):
        from rlxc.runtime.cpu import _addr

        self.lib = lib
        self._entry = lib.entry
        self._gov = lib.governor  # threads per step (runtime/cpu.py ThreadGovernor)
        kinds = [a["kind"] for a in lib.args]
        if len(kinds) != len(args):
            raise ValueError(f"trainer: the compiled step has {len(kinds)} arguments, "
                             f"the step program {len(args)}")
        # signature position -> ("in" | "par", index in that table)
        where, ni, npar = [], 0, 0
        for k in kinds:
            if k == "input":
                where.append(("in", ni))
                ni += 1
            else:
                where.append(("par", npar))
                npar += 1
        self._where = where
        self._state_of = {p: j for j, p in enumerate(state_pos)}
        self.bufs = [[_aligned_copy(args[p]) for p in state_pos]]
        self.bufs.append([_aligned_copy(b) for b in self.bufs[0]])
        self._keep = list(args)  # constant args and the current data stay alive here
        shape, dt = lib.outputs[0]
        self._loss = np.empty(shape, dt)
        n_out = len(lib.outputs)
        if n_out != 1 + len(state_pos):
            raise ValueError(f"trainer: the compiled step has {n_out} outputs, expected "
                             f"{1 + len(state_pos)}")
        self._ins = [(ctypes.c_void_p * max(1, ni))() for _ in range(2)]
        self._pars = [(ctypes.c_void_p * max(1, npar))() for _ in range(2)]
        self._outs = [(ctypes.c_void_p * n_out)() for _ in range(2)]
        for k in range(2):
            for p, (tab, i) in enumerate(where):
                table = self._ins[k] if tab == "in" else self._pars[k]
                j = self._state_of.get(p)
                if j is not None:
                    table[i] = _addr(self.bufs[k][j])
                elif args[p] is not None:
                    table[i] = _addr(args[p])
            self._outs[k][0] = _addr(self._loss)
            for j in range(len(state_pos)):
                self._outs[k][1 + j] = _addr(self.bufs[1 - k][j])
        self._ws = np.empty(lib.workspace_size + 64, np.uint8)
        base = _addr(self._ws)
        self._ws_ptr = ctypes.c_void_p(base + (-base % 64))
        self._addr = _addr
        self.k = 0

    def set_arg(self, p: int, a: np.ndarray) -> None:
        tab, i = self._where[p]
        self._keep[p] = a
        addr = self._addr(a)
        t = self._ins if tab == "in" else self._pars
        t[0][i] = addr
        t[1][i] = addr

    def run(self):
        k = self.k
        gov = self._gov
        tok = gov.begin()
        rc = self._entry(self._ins[k], self._outs[k], self._pars[k], self._ws_ptr)
        gov.end(tok)
        if rc:
            raise self.lib.error(rc)
        self.k = 1 - k
        return self._loss

    def get_arg(self, p: int) -> np.ndarray:
        j = self._state_of.get(p)
        src = self.bufs[self.k][j] if j is not None else self._keep[p]
        return np.array(src, np.float32, copy=True)

    def read(self) -> list[np.ndarray]:
        return [b.copy() for b in self.bufs[self.k]]


def _aligned_copy(a) -> np.ndarray:
    """A float32 copy of `a` whose data starts on a 64-byte boundary (cache line, AVX-512)."""
    a = np.asarray(a, np.float32)
    raw = np.empty(a.size + 16, np.float32)
    off = (-raw.__array_interface__["data"][0] % 64) // 4
    out = raw[off:off + a.size].reshape(a.shape)
    out[...] = a
    return out


def _native_engine(prog, device, args, state_pos):
    """The resident-buffer engine for the native CPU backend (None elsewhere)."""
    if device != "cpu":
        return None
    from rlxc.backends import library_for

    # found by the step's alias when compiled before: no trace, no transform
    return _NativeEngine(library_for(prog.cache_alias(), lambda: prog.func, device), args,
                         state_pos)


class Trainer:
    """Compiled training loop for a Func; see the module docstring."""

    def __init__(self, func, opt: Optimizer, schedule=None, max_grad_norm: float = 0.0,
                 quant=None, device=None, wrt=None):
        from .func import default_device

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
        self._wrt = wrt
        bound = _bound_params(func)
        self._build(bound, {p: dict(st) for p, st in opt.state.items()})

    # -- construction -----------------------------------------------------------
    def _build(self, params: dict, slots: dict) -> None:
        f = self._f
        prog = step_program(f, self.opt, self._wrt, self.max_grad_norm, self.quant,
                            device=self.device)
        self._prog = prog
        self._structure = _structure(self.opt)
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
        self._engine = self._make_engine(prog, args, state_pos)

    def _make_engine(self, prog, args, state_pos):
        if self.device != "interp":
            eng = _native_engine(prog, self.device, args, state_pos)
            if eng is not None:
                return eng
        return _ArrayEngine(prog.executor(self.device), args, state_pos)

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
        """One update; returns the loss computed before it."""
        opt = self.opt
        if _structure(opt) != self._structure:  # e.g. weight decay switched on
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
                eng.set_arg(i, qf(n, cur[n]))
        loss = eng.run()
        opt._t = t  # the counter Optimizer.step advances
        return _loss_value(loss)

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
        params = self._read_params()
        for a in params.values():
            a.flags.writeable = False
        return self._f._derive(params=params)

    def sync_optimizer(self) -> Optimizer:
        """Copy the slots from the engine into `opt.state`; returns opt."""
        _, slots = self._read_all()
        for p, st in slots.items():
            self.opt.state[p] = st
        return self.opt

    def state_dict(self) -> dict[str, np.ndarray]:
        """Flat and safetensors-ready: "params.<name>" and "optim.<key>" entries."""
        out = {_PARAM + n: a for n, a in self._read_params().items()}
        for k, v in self.sync_optimizer().state_dict().items():
            out[_OPTIM + k] = v
        return out

    def load_state_dict(self, state) -> None:
        """Restore a `state_dict()`: every param (declared shapes) and the optimizer."""
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
        """Write `state_dict()` to a safetensors file."""
        from .checkpoint import save_tensors

        save_tensors(path, self.state_dict(),
                     {"rlxc.kind": "trainer", "rlxc.func": self._f.name,
                      "rlxc.optim": self.opt.kind})

    def load(self, path) -> None:
        """Restore from a file written by `save`."""
        from .checkpoint import load_tensors

        self.load_state_dict(load_tensors(path))

    def __repr__(self):
        return (f"Trainer({self._f.name}, {self.opt!r}, device={self.device!r}, "
                f"t={self.opt.t})")

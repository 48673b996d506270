"""SplitEngine: the grads and apply programs of rlxc/train_split.py over resident state.

    state (trained params, slots): two buffer sets, apply reads set k, writes 1-k
    flat = [grads (N) | loss (1)]: one 64-byte aligned float32 buffer
      grads call  --writes-->  flat  --(caller: sum over ranks)-->  reduced  -->  apply call
    (reduced is flat itself for an in-place allreduce, or the shared result of a
    shared-memory window, rlxc/reduce_buffer.py)
    native ("cpu" backends): CallFrames (runtime/call.py) whose pointer tables are
    built once; other devices: the programs' executors, copying into the same buffers.

Used by the distributed Trainer (rlxc/trainer_dist.py).
"""
from __future__ import annotations

import numpy as np

from .registry import backend

__all__ = ["SplitEngine"]


class SplitEngine:
    """Runs grads, then (after the caller reduced `flat`) apply, over resident state.

    State = the trained params (wrt order) and the slots, in two buffer sets like
    runtime.call.ResidentCall: apply reads set k and writes set 1-k, then k flips;
    grads reads the params of set k.  `flat` = [grads (N) | loss (1)] is one
    64-byte aligned float32 buffer: the grads call writes it (outputs 1 and 0 point
    into it), the caller sums it over ranks into `reduced` (by default `flat`
    itself: an in-place allreduce), the apply call reads that.  Natively
    ("cpu" backends) both are CallFrames whose pointer tables are built once; other
    devices run the programs' executors and copy into the same buffers."""

    def __init__(self, device, gprog, aprog, params: dict, frozen: dict, slots: list,
                 scale: float, flat=None, reduced=None):
        from rlxc.runtime.call import aligned_empty

        from .registry import CpuBackend

        self.gprog, self.aprog = gprog, aprog
        n = gprog.grad_numel
        if flat is None:
            flat = aligned_empty((n + 1,), np.float32)
            flat[:] = 0
        for name, a in (("flat", flat), ("reduced", reduced)):
            if a is not None and not (isinstance(a, np.ndarray) and a.dtype == np.float32
                                      and a.shape == (n + 1,) and a.flags.c_contiguous):
                raise ValueError(f"SplitEngine: {name} must be a C-contiguous float32 "
                                 f"array of shape ({n + 1},)")
        # grads call writes flat; the caller sums it over ranks into reduced (flat
        # itself unless given), which the apply call and `loss` read
        self.flat = flat
        self.reduced = flat if reduced is None else reduced
        self.grads, self._loss_out = self.flat[:n], self.flat[n:]
        self.rgrads, self.loss = self.reduced[:n], self.reduced[n:]
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
            fr.outs[0] = data_address(self._loss_out)
            fr.outs[1] = data_address(self.grads)
            fa = self._af[k]
            ns = len(self.aprog.slot_args)
            for j in range(ns):
                fa.ins[j] = data_address(self.bufs[k][self.nw + j])
                fa.outs[self.nw + j] = data_address(self.bufs[1 - k][self.nw + j])
            fa.ins[ns + 1] = data_address(self.rgrads)
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
            self._loss_out[...] = np.asarray(loss, np.float32).reshape(1)
            self.grads[...] = np.asarray(g, np.float32).reshape(-1)
        return self.flat

    def run_apply(self) -> None:
        """The update from `reduced` (the summed grads) into the other buffer set."""
        k = self.k
        if self.native:
            self._af[k].invoke()
        else:
            cur = self.bufs[k]
            outs = self._aex.run([*cur[self.nw:], self.scal, self.rgrads, *cur[:self.nw]])
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

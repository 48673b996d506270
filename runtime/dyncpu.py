"""Calling a size-generic CPU library: one .so serves every size of its symbols.

    DynLibrary(so, meta)    entry(ins, outs, pars, ws, dims), workspace_size(dims)
    DynLibrary.set_batch_split(min_work), last_split()   the one-region row split of a
                            batch-separable program (RLXC_BATCH_SPLIT=0: off)
    DynExecutor.run(arrays) per call: sizes from the arrays (runtime/dims.py: agreement,
                            >= 1), output shapes evaluated from the sizes, the
                            workspace of this thread grown when the sizes need more
                            (one allocation, reused while the sizes do not grow)
    DynExecutor.bound(arrays) -> BoundCall: for a caller whose params never change (a
                            Jitted with every param bound): .run(inputs) passes only the
                            inputs; the params' table is built once, as CpuCaller's is

A size in the metadata is an int or [c0, [[symbol, k], ...]] (c0 + sum k * symbol,
lowering/cpu/symint.py).  NumPy, ctypes and the standard library only.
"""
from __future__ import annotations

import ctypes
import os
import threading
from collections import namedtuple

import numpy as np

from .call import aligned_empty, checked_array, data_address
from .dims import bind_sizes
from .errors import ArtifactError, RlxError
from .cpu import GovernorTable, SplitControl, env_threads
from .signature import NP_DTYPES

_ERRORS = {"IndexError": IndexError, "ValueError": ValueError, "RuntimeError": RuntimeError}
_Spec = namedtuple("_Spec", "name kind shape dtype")


def size_of(j, env: dict) -> int:
    if isinstance(j, int):
        return j
    return j[0] + sum(k * env[s] for s, k in j[1])


class DynLibrary(SplitControl):
    """A loaded size-generic library and its metadata (lowering/cpu/dynsizes.py)."""

    def __init__(self, so_path: str, meta: dict):
        if meta.get("abi") != 1 or "dims" not in meta:
            raise ArtifactError(f"{so_path}: not a size-generic CPU library")
        self.meta, self.path = meta, so_path
        try:
            self.lib = ctypes.CDLL(os.path.abspath(so_path))
            fn = getattr(self.lib, meta["entry"])
            wsf = getattr(self.lib, meta["workspace_symbol"])
        except (OSError, AttributeError) as e:
            raise ArtifactError(f"cannot load {so_path}: {e}") from None
        fn.restype, fn.argtypes = ctypes.c_int32, [ctypes.c_void_p] * 5
        wsf.restype, wsf.argtypes = ctypes.c_int64, [ctypes.c_void_p]
        self.entry, self.wsf = fn, wsf
        # a second handle without argtypes for callers that always pass their own ctypes
        # arrays and a c_void_p (BoundCall): no per-argument conversion on the call
        self.entry_fast = self.lib[meta["entry"]]
        self.entry_fast.restype = ctypes.c_int32
        self.dims = list(meta["dims"])
        self.args = meta["args"]
        self.specs = [_Spec(a["name"], a["kind"], tuple(a["shape"]), a["dtype"])
                      for a in self.args]
        self.inputs = [a for a in self.args if a["kind"] == "input"]
        self.params = [a for a in self.args if a["kind"] == "param"]
        self.outputs = [(o["shape"], NP_DTYPES[o["dtype"]]) for o in meta["outputs"]]
        self.errors = {int(k): tuple(v) for k, v in meta.get("errors", {}).items()}
        st = getattr(self.lib, "rlxc_set_num_threads", None)
        if st is not None:
            st.argtypes, st.restype = [ctypes.c_int32], None
        # one thread-count governor per size class (a call plan holds its class's)
        self.governor = GovernorTable(st, env_threads(), bool(meta.get("parallel", True)))
        # batch split (lowering/cpu/batchsplit_entry.py): RLXC_BATCH_SPLIT=0 turns it off
        self._bind_split(self.lib, meta["entry"])
        for n in (1, 1000):   # the library's size function agrees with the metadata's
            env = {d: n + j for j, d in enumerate(self.dims)}
            arr = (ctypes.c_int64 * max(1, len(self.dims)))(*[env[d] for d in self.dims])
            if wsf(arr) != self.workspace_size(env):
                raise ArtifactError(f"{so_path}: workspace size {wsf(arr)} at {env} differs "
                                    f"from its metadata ({self.workspace_size(env)})")

    def set_num_threads(self, n: int) -> None:
        self.governor.configure(int(n))

    def workspace_size(self, env: dict) -> int:
        """Bytes of workspace at sizes `env` (the library's own size function, checked
        against the metadata's)."""
        return max(size_of(e, env) for e in self.meta["workspace"])

    def error(self, rc: int) -> Exception:
        kind, msg = self.errors.get(rc, ("RlxError", f"{self.meta['entry']} failed with "
                                                     f"error code {rc}"))
        return _ERRORS.get(kind, RlxError)(msg)


class DynExecutor:
    """`run(arrays)`, every argument in signature order (what Func.run passes)."""

    def __init__(self, lib: DynLibrary):
        self.lib = lib
        self._local = threading.local()
        self._plans: dict = {}   # argument shapes -> checked call plan (_plan)
        self._np_dtypes = [np.dtype(NP_DTYPES[a["dtype"]]) for a in lib.args]
        self._pcache = None   # (param arrays, their ctypes table): the last call's params
        self._in_pos = [i for i, a in enumerate(lib.args) if a["kind"] == "input"]
        self._par_pos = [i for i, a in enumerate(lib.args) if a["kind"] == "param"]
        n = max(1, len(lib.dims))
        self._ctypes = (ctypes.c_void_p * max(1, len(self._in_pos)),
                        ctypes.c_void_p * max(1, len(lib.outputs)),
                        ctypes.c_void_p * max(1, len(self._par_pos)), ctypes.c_int64 * n)

    def bound(self, arrays):
        """A BoundCall for `arrays` (signature order; the params are the ones every call
        will use, the inputs' entries are ignored), or None when a param is not already
        a C-contiguous ndarray of its dtype (run's conversions are then needed)."""
        for i in self._par_pos:
            a = arrays[i]
            if type(a) is not np.ndarray or a.dtype != self._np_dtypes[i] or \
                    not a.flags.c_contiguous:
                return None
        return BoundCall(self, arrays)

    def _workspace(self, nbytes: int):
        """The c_void_p of this thread's workspace (`_local.ws`), >= nbytes."""
        loc = self._local
        ws = getattr(loc, "ws", None)
        if ws is None or ws.size < nbytes:   # grow only: reused while the sizes fit
            ws = loc.ws = aligned_empty((max(nbytes, 64),), np.uint8)
            loc.ptr = ctypes.c_void_p(data_address(ws))
        return loc.ptr

    def _plan(self, arrays, key):
        """What a call at shapes `key` needs, checked once: the sizes (bind_sizes: every
        use of a symbol agrees, none is 0, static dims match), each argument's element
        count, the output shapes, the dims array and the workspace bytes."""
        lib = self.lib
        env = bind_sizes(lib.specs, key, f"{lib.meta['name']}.run")
        spec = [dict(a, shape=[env[d] if isinstance(d, str) else d for d in a["shape"]])
                for a in lib.args]
        for a, s in zip(arrays, spec):
            checked_array(a, s)   # ShapeError when an element count differs
        plan = (spec, [(tuple(size_of(d, env) for d in s), dt) for s, dt in lib.outputs],
                self._ctypes[3](*[env[s] for s in lib.dims]), lib.workspace_size(env),
                lib.governor.for_sizes([env[s] for s in lib.dims]))
        if len(self._plans) >= 64:   # a caller cycling through many sizes: start over
            self._plans.clear()
        self._plans[key] = plan
        return plan

    def run(self, arrays) -> list:
        lib = self.lib
        if len(arrays) != len(lib.args):
            raise ValueError(f"{lib.meta['name']}: expected {len(lib.args)} arrays "
                             f"(inputs and params in signature order), got {len(arrays)}")
        arrays = [a if type(a) is np.ndarray else np.asarray(a) for a in arrays]
        key = tuple([a.shape for a in arrays])
        plan = self._plans.get(key)     # the checks of these shapes already passed
        if plan is None:
            plan = self._plan(arrays, key)
        spec, tpar = plan[0], self._ctypes[2]
        dts, par_pos, pc = self._np_dtypes, self._par_pos, self._pcache
        if pc is not None and all([arrays[i] is q and q.dtype is dts[i]
                                   for i, q in zip(par_pos, pc[0])]):
            # the same param arrays as the last call (bound params): they passed the
            # checks then and the table holds their addresses (shapes are in `key`)
            pars, check = pc[1], self._in_pos
        else:
            pars, check = None, range(len(arrays))
        for i in check:
            a = arrays[i]
            if a.dtype != dts[i] or not a.flags.c_contiguous:
                arrays[i] = checked_array(a, spec[i])
        if pars is None:
            pars = tpar(*[data_address(arrays[i]) for i in par_pos])
            self._pcache = (tuple([arrays[i] for i in par_pos]), pars)
        return self._invoke(lib.entry, [arrays[i] for i in self._in_pos], pars, plan)

    def _invoke(self, entry, ins, pars, plan) -> list:
        """One native call at `plan`'s sizes: fresh outputs, this thread's workspace,
        the governor around the call; `ins` are checked input arrays, `pars` the params'
        ctypes table."""
        _, out_shapes, dims, nbytes, gov = plan
        tin, tout = self._ctypes[0], self._ctypes[1]
        outs = [np.empty(s, dt) for s, dt in out_shapes]
        lib = self.lib
        tok = gov.begin()
        rc = entry(tin(*[data_address(a) for a in ins]), tout(*[data_address(o) for o in outs]),
                   pars, self._workspace(nbytes), dims)
        gov.end(tok)
        if rc:
            raise lib.error(rc)
        return outs


class BoundCall:
    """`run(inputs)` (the inputs in signature order) of a DynExecutor whose params are
    fixed: the same contract as CpuCaller with bound params (runtime/cpu.py), whose
    pointers are taken once.  A call at input shapes seen before skips the checks that
    passed then (the plan also holds the param checks: DynExecutor._plan checked every
    argument) and re-checks only each input's dtype and layout; anything new or unusual
    goes through DynExecutor.run with its checks and conversions."""

    __slots__ = ("ex", "full", "pars", "plans")

    def __init__(self, ex: DynExecutor, arrays):
        self.ex = ex
        self.full = list(arrays)
        self.pars = ex._ctypes[2](*[data_address(arrays[i]) for i in ex._par_pos])
        self.plans: dict = {}   # input shapes -> DynExecutor plan

    def _general(self, ins) -> list:
        ex, full = self.ex, list(self.full)
        for p, a in zip(ex._in_pos, ins):
            full[p] = a
        outs = ex.run(full)
        plan = ex._plans.get(tuple([a.shape for a in full]))
        if plan is not None and all([type(a) is np.ndarray for a in ins]):
            if len(self.plans) >= 64:
                self.plans.clear()
            self.plans[tuple([a.shape for a in ins])] = plan
        return outs

    def run(self, ins) -> list:
        ex = self.ex
        plan = self.plans.get(tuple([a.shape for a in ins]))
        if plan is None:
            return self._general(ins)
        dts = ex._np_dtypes
        for a, p in zip(ins, ex._in_pos):
            if a.dtype != dts[p] or not a.flags.c_contiguous:
                return self._general(ins)
        return ex._invoke(ex.lib.entry_fast, ins, self.pars, plan)

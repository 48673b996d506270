"""ctypes loader for rlxc CPU libraries (NumPy and the standard library only).

    libNAME.so + metadata dict (CompiledArtifact.metadata(), or the cache's JSON)
          │ CpuLibrary: dlopen, bind rlx_NAME / rlx_NAME_workspace_size,
          │             rlxc_set_num_threads(RLXC_NUM_THREADS)
          ▼
    CpuCaller(lib, params=None).call(inputs[, params]) -> outputs
          per Python thread, created once: ctypes pointer arrays for inputs,
          outputs and params, and a 64-byte aligned workspace
          per call: write the data pointers, np.empty the outputs, one foreign call

Contract.  Arrays handed to `call` must already be C-contiguous with the
declared dtype and element count (`runtime.signature.coerce` makes them so;
it copies only when the array is not already like that), so no data is copied.
Outputs are allocated fresh on every call: a returned array is never
overwritten by a later call.  The foreign call releases the GIL.

Thread safety: every Python thread gets its own pointer arrays and its own
workspace (threading.local), so concurrent calls of one library from several
threads do not share mutable state and run in parallel; no lock is taken on
the call path.  A bound caller (`params=` given) writes the param pointers
into each thread's array once, when that thread first calls.

Errors: a non-zero return code is looked up in the metadata's `errors` table
(e.g. {"1": ["IndexError", "rlx.gather: index out of range [0, 5) along axis
0"]}) and raised as that exception; unknown codes raise RlxError.
"""
from __future__ import annotations

import ctypes
import os
import threading

import numpy as np

from .errors import ArtifactError, RlxError

NP_DTYPES = {"f32": np.float32, "f64": np.float64, "i1": np.bool_, "i32": np.int32,
             "i64": np.int64}
_EXC = {"IndexError": IndexError, "ValueError": ValueError, "RuntimeError": RuntimeError}
ABI = 1


def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def env_threads() -> int:
    """RLXC_NUM_THREADS as an int (0 = all cores)."""
    v = os.environ.get("RLXC_NUM_THREADS", "").strip()
    try:
        return max(0, int(v)) if v else 0
    except ValueError:
        raise ValueError(f"RLXC_NUM_THREADS={v!r} is not an integer") from None


class CpuLibrary:
    """One loaded shared library and the description of its entry point."""

    def __init__(self, so_path: str, meta: dict):
        if meta.get("abi") != ABI:
            raise ArtifactError(f"{so_path}: metadata ABI {meta.get('abi')!r}, runtime {ABI}")
        self.path = so_path
        self.meta = meta
        try:
            self.lib = ctypes.CDLL(os.path.abspath(so_path))
        except OSError as e:
            raise ArtifactError(f"cannot load {so_path}: {e}") from None
        try:
            fn = getattr(self.lib, meta["entry"])
            wsf = getattr(self.lib, meta["workspace_symbol"])
        except AttributeError as e:
            raise ArtifactError(f"{so_path}: missing symbol ({e})") from None
        fn.restype = ctypes.c_int32
        fn.argtypes = [ctypes.c_void_p] * 4
        wsf.restype = ctypes.c_int64
        wsf.argtypes = []
        self.entry = fn
        self.workspace_size = int(wsf())
        if self.workspace_size != int(meta["workspace_size"]):
            raise ArtifactError(f"{so_path}: workspace size {self.workspace_size} differs "
                                f"from its metadata ({meta['workspace_size']})")
        self.args = meta["args"]
        self.inputs = [a for a in self.args if a["kind"] == "input"]
        self.params = [a for a in self.args if a["kind"] == "param"]
        self.outputs = [(tuple(o["shape"]), NP_DTYPES[o["dtype"]]) for o in meta["outputs"]]
        self.errors = {int(k): tuple(v) for k, v in meta.get("errors", {}).items()}
        self._set_threads = getattr(self.lib, "rlxc_set_num_threads", None)
        if self._set_threads is not None:
            self._set_threads.argtypes = [ctypes.c_int32]
            self._set_threads.restype = None
            self.set_num_threads(env_threads())

    def set_num_threads(self, n: int) -> None:
        """Threads for this library's parallel loops and sgemm (0 = all cores)."""
        if self._set_threads is not None:
            self._set_threads(int(n))

    def error(self, rc: int) -> Exception:
        kind, msg = self.errors.get(rc, ("RlxError", f"{self.meta['entry']} failed with "
                                                     f"error code {rc}"))
        return _EXC.get(kind, RlxError)(msg)


class _ThreadState:
    __slots__ = ("ins", "outs", "pars", "ws", "ws_ptr", "bound")

    def __init__(self, lib: CpuLibrary):
        self.ins = (ctypes.c_void_p * max(1, len(lib.inputs)))()
        self.outs = (ctypes.c_void_p * max(1, len(lib.outputs)))()
        self.pars = (ctypes.c_void_p * max(1, len(lib.params)))()
        n = lib.workspace_size
        self.ws = np.empty(n + 64, dtype=np.uint8)
        base = _addr(self.ws)
        self.ws_ptr = ctypes.c_void_p(base + (-base % 64))
        self.bound = False


class CpuCaller:
    """Calls one library; optionally with params bound once (their pointers pre-written).

    `call(inputs, params=None)`: `inputs` in input order, `params` in param order
    (required unless bound).  Returns the outputs as new arrays."""

    def __init__(self, lib: CpuLibrary, params: list | None = None):
        self.lib = lib
        self._params = None if params is None else list(params)
        self._local = threading.local()
        self._out_specs = lib.outputs
        self._entry = lib.entry

    def _state(self) -> _ThreadState:
        st = getattr(self._local, "st", None)
        if st is None:
            st = self._local.st = _ThreadState(self.lib)
            if self._params is not None:
                for i, p in enumerate(self._params):
                    st.pars[i] = _addr(p)
                st.bound = True
        return st

    def call(self, inputs, params=None) -> list:
        st = self._state()
        ins = st.ins
        for i, a in enumerate(inputs):
            ins[i] = _addr(a)
        if params is not None:
            pars = st.pars
            for i, a in enumerate(params):
                pars[i] = _addr(a)
            st.bound = False
        elif not st.bound:
            raise RlxError(f"{self.lib.meta['entry']}: params not bound")
        outs = [np.empty(s, d) for s, d in self._out_specs]
        optr = st.outs
        for i, o in enumerate(outs):
            optr[i] = _addr(o)
        rc = self._entry(ins, optr, st.pars, st.ws_ptr)
        if params is not None and self._params is not None:
            for i, p in enumerate(self._params):  # restore the bound pointers
                st.pars[i] = _addr(p)
            st.bound = True
        if rc:
            raise self.lib.error(rc)
        return outs


class CpuExecutor:
    """`run(arrays)` with every argument in signature order (what Func.run passes)."""

    def __init__(self, lib: CpuLibrary):
        self.lib = lib
        self._in_pos = [i for i, a in enumerate(lib.args) if a["kind"] == "input"]
        self._par_pos = [i for i, a in enumerate(lib.args) if a["kind"] == "param"]
        self._caller = CpuCaller(lib)

    def run(self, arrays) -> list:
        if len(arrays) != len(self.lib.args):
            raise ValueError(f"{self.lib.meta['name']}: expected {len(self.lib.args)} arrays "
                             f"(inputs and params in signature order), got {len(arrays)}")
        return self._caller.call([_checked(arrays[i], self.lib.args[i]) for i in self._in_pos],
                                 [_checked(arrays[i], self.lib.args[i]) for i in self._par_pos])


def _checked(a, spec) -> np.ndarray:
    """`a` as the C-contiguous array the entry expects (converted once if needed)."""
    want = NP_DTYPES[spec["dtype"]]
    n = 1
    for d in spec["shape"]:
        n *= d
    if not (isinstance(a, np.ndarray) and a.dtype == want and a.flags.c_contiguous):
        a = np.ascontiguousarray(a, dtype=want)
    if a.size != n:
        from .errors import ShapeError

        raise ShapeError(f"{spec['kind']} {spec['name']!r} expects shape "
                         f"{tuple(spec['shape'])}, got {a.shape}")
    return a

"""The one native call path: every call of a compiled CPU function goes through a CallFrame.

    CallFrame(lib)             pointer tables  ins[] outs[] pars[]  (ctypes void* arrays)
                               workspace       64-byte aligned, lib.workspace_size bytes
          .invoke()            governor.begin -> rc = entry(ins, outs, pars, ws) -> governor.end
                               rc != 0 -> the exception the library's error table names
    users
      CpuCaller (runtime/cpu.py)   one frame per Python thread; Jitted and Func.run call it
      fast_runner (here)           Jitted.run's common call as one generated function over
                                   CpuCaller's per-thread frame (no loops, no helper calls)
      ResidentCall (here)          two frames over two state buffer sets: the Trainer's step

Contract of the pointer tables: an array whose address is written into a
table must already be C-contiguous with the argument's dtype and element count
(`checked_array`, or runtime.signature.coerce at the API's front door: arrays
are validated once, where they enter), and must stay alive while the table
points at it.  A frame (and its workspace) serves one call at a time.

NumPy, ctypes and the standard library only.
"""
from __future__ import annotations

import ctypes

import numpy as np

from .errors import ShapeError
from .signature import NP_DTYPES

__all__ = ["data_address", "checked_array", "aligned_empty", "CallFrame", "ResidentCall",
           "ExecutorLoop", "fast_runner"]


def _address_slow(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def _fast_address():
    """The data pointer of an ndarray read from its object struct (PyArrayObject: the
    PyObject header, then `char *data`), ~0.2 us instead of ~1.6 us for
    __array_interface__.  Used only if it agrees with __array_interface__ here (CPython,
    NumPy's layout); otherwise the slow path.  Returns (function, the data field's offset
    in the object or None for the slow path)."""
    try:
        off = object.__basicsize__  # the PyObject header: data is the next field
        read = ctypes.c_void_p.from_address
        base = np.arange(64, dtype=np.float32)
        probes = [base, base[3:], base[5:9].reshape(2, 2), np.zeros((), np.int32),
                  np.empty((3, 0), np.float64), np.ones(7, np.bool_)[1:]]
        if all((read(id(a) + off).value or 0) == _address_slow(a) for a in probes):
            return (lambda a: read(id(a) + off).value or 0), off
    except Exception:  # noqa: BLE001
        pass
    return _address_slow, None


data_address, DATA_OFFSET = _fast_address()
data_address.__doc__ = "The address of an ndarray's first element (an int)."


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def checked_array(a, spec: dict) -> np.ndarray:
    """`a` as the C-contiguous array the entry expects for argument `spec` (a dict with
    name, kind, shape, dtype), converted once if needed; ShapeError when the element
    count differs."""
    want = NP_DTYPES[spec["dtype"]]
    if not (isinstance(a, np.ndarray) and a.dtype == want and a.flags.c_contiguous):
        a = np.ascontiguousarray(a, dtype=want)
    if a.size != _numel(spec["shape"]):
        raise ShapeError(f"{spec['kind']} {spec['name']!r} expects shape "
                         f"{tuple(spec['shape'])}, got {a.shape}")
    return a


def aligned_empty(shape, dtype, align: int = 64) -> np.ndarray:
    """An uninitialized array whose data starts on an `align`-byte boundary."""
    dt = np.dtype(dtype)
    nbytes = dt.itemsize * _numel(shape)
    raw = np.empty(nbytes + align, np.uint8)
    off = -data_address(raw) % align
    return raw[off:off + nbytes].view(dt).reshape(shape)


class CallFrame:
    """Pointer tables and a workspace for calls of one library (see the header).

    `lib` is a runtime.cpu.CpuLibrary (entry, governor, error, inputs, outputs, params,
    workspace_size).  `workspace` shares another frame's workspace (frames that are
    never called at the same time).  `packed`: the library's prepacked weights
    (runtime/prepack.py, one array or None per slot of lib.prepack): the frame calls
    the prepacked entry, whose params table continues with their pointers
    (pars[n_params + slot]; a NULL slot is packed per call, as the plain entry does)."""

    __slots__ = ("lib", "ins", "outs", "pars", "ws", "ws_ptr", "_entry", "_gov", "packed")

    def __init__(self, lib, workspace: "CallFrame | None" = None, packed: list | None = None):
        self.lib = lib
        self._entry = getattr(lib, "entry_fast", None) or lib.entry
        self._gov = lib.governor
        self.ins = (ctypes.c_void_p * max(1, len(lib.inputs)))()
        self.outs = (ctypes.c_void_p * max(1, len(lib.outputs)))()
        npar = len(lib.params)
        self.packed = packed or None
        self.pars = (ctypes.c_void_p * max(1, npar + len(packed or ())))()
        if packed:
            self._entry = lib.entry_prepacked
            for j, a in enumerate(packed):
                self.pars[npar + j] = None if a is None else data_address(a)
        if workspace is not None:
            self.ws, self.ws_ptr = workspace.ws, workspace.ws_ptr
        else:
            self.ws = aligned_empty((lib.workspace_size,), np.uint8)
            self.ws_ptr = ctypes.c_void_p(data_address(self.ws))

    def invoke(self) -> None:
        """One foreign call with the tables as they are (the GIL is released)."""
        gov = self._gov
        if gov._fixed:  # nothing to time or choose (a library that never forks, or fixed)
            rc = self._entry(self.ins, self.outs, self.pars, self.ws_ptr)
        else:
            tok = gov.begin()
            rc = self._entry(self.ins, self.outs, self.pars, self.ws_ptr)
            gov.end(tok)
        if rc:
            raise self.lib.error(rc, self)


class ResidentCall:
    """Repeated calls of one library whose outputs 1.. are the next call's state arguments.

    `args`: every argument in signature order (validated here, once); `state_pos`: the
    signature positions of the state arguments, where output 1+j is the next value of
    argument state_pos[j] (same shape and dtype: checked).  The state lives in two
    64-byte aligned buffer sets; frame k reads set k and writes set 1-k, and `k` flips
    after each call, so a call stores no pointer and copies nothing.  Output 0 (the
    result) is one resident array, overwritten by every call.  `set_arg` re-points a
    non-state argument (in both frames).  One call at a time: the frames share one
    workspace and the state, so callers serialize (the Trainer holds a lock)."""

    def __init__(self, lib, args: list, state_pos: list[int]):
        specs = lib.args
        if len(specs) != len(args):
            raise ValueError(f"{lib.meta['entry']}: {len(specs)} arguments, given "
                             f"{len(args)}")
        n_out = len(lib.outputs)
        if n_out != 1 + len(state_pos):
            raise ValueError(f"{lib.meta['entry']}: {n_out} outputs, a resident call of "
                             f"{len(state_pos)} state arguments needs {1 + len(state_pos)}")
        for j, p in enumerate(state_pos):
            spec = specs[p]
            shape, dt = lib.outputs[1 + j]
            if tuple(shape) != tuple(spec["shape"]) or np.dtype(dt) != NP_DTYPES[spec["dtype"]]:
                raise ValueError(f"{lib.meta['entry']}: output {1 + j} is {np.dtype(dt)} "
                                 f"{tuple(shape)}, but it feeds {spec['kind']} "
                                 f"{spec['name']!r} ({spec['dtype']} {tuple(spec['shape'])})")
        self.lib = lib
        # signature position -> ("in" | "par", index in that table)
        where, ni, npar = [], 0, 0
        for s in specs:
            if s["kind"] == "input":
                where.append(("in", ni))
                ni += 1
            else:
                where.append(("par", npar))
                npar += 1
        self._where = where
        self._state_of = {p: j for j, p in enumerate(state_pos)}
        self._keep = [None if p in self._state_of or a is None else checked_array(a, specs[p])
                      for p, a in enumerate(args)]
        # arguments given as None must be set (set_arg) before a call: no NULL pointers
        self._unset = {p for p, a in enumerate(args) if a is None and p not in self._state_of}
        self.bufs = []
        for _ in range(2):
            bufs = []
            for p in state_pos:
                b = aligned_empty(tuple(specs[p]["shape"]), NP_DTYPES[specs[p]["dtype"]])
                b[...] = checked_array(args[p], specs[p]).reshape(b.shape)
                bufs.append(b)
            self.bufs.append(bufs)
        shape, dt = lib.outputs[0]
        self._result = np.empty(shape, dt)
        self.frames = [CallFrame(lib)]
        self.frames.append(CallFrame(lib, workspace=self.frames[0]))
        for k, fr in enumerate(self.frames):
            for p, (tab, i) in enumerate(where):
                j = self._state_of.get(p)
                if j is not None:
                    a = self.bufs[k][j]
                elif self._keep[p] is not None:
                    a = self._keep[p]
                else:
                    continue  # pointed by set_arg before the first call
                (fr.ins if tab == "in" else fr.pars)[i] = data_address(a)
            fr.outs[0] = data_address(self._result)
            for j in range(len(state_pos)):
                fr.outs[1 + j] = data_address(self.bufs[1 - k][j])
        self.k = 0

    def set_arg(self, p: int, a: np.ndarray) -> None:
        """Point non-state argument `p` at `a` (validated by the caller; kept alive here)."""
        tab, i = self._where[p]
        if p in self._state_of:
            raise ValueError(f"argument {p} is state: it is written by the calls")
        self._keep[p] = a
        self._unset.discard(p)
        addr = data_address(a)
        f0, f1 = self.frames
        if tab == "in":
            f0.ins[i] = addr
            f1.ins[i] = addr
        else:
            f0.pars[i] = addr
            f1.pars[i] = addr

    def run(self) -> np.ndarray:
        """One call; returns output 0 (the resident result array)."""
        if self._unset:
            names = [self.lib.args[p]["name"] for p in sorted(self._unset)]
            raise ValueError(f"{self.lib.meta['entry']}: arguments {names} are not set")
        k = self.k
        self.frames[k].invoke()
        self.k = 1 - k
        return self._result

    def get_arg(self, p: int) -> np.ndarray:
        """A copy of argument `p`'s current value."""
        j = self._state_of.get(p)
        src = self.bufs[self.k][j] if j is not None else self._keep[p]
        return np.array(src, copy=True)

    def read(self) -> list[np.ndarray]:
        """Copies of the state arguments (state_pos order)."""
        return [b.copy() for b in self.bufs[self.k]]


class ExecutorLoop:
    """The ResidentCall interface over any executor with `.run(arrays) -> outputs`.

    `args` is the full argument list in signature order; after every call its state
    part (`state_pos`) is replaced by outputs 1.. (the interpreter, the GPU)."""

    def __init__(self, executor, args: list, state_pos: list[int]):
        self.ex = executor
        self.args = list(args)
        self.state_pos = list(state_pos)
        self._state = set(state_pos)

    def set_arg(self, p: int, a) -> None:
        if p in self._state:
            raise ValueError(f"argument {p} is state: it is written by the calls")
        self.args[p] = a

    def run(self):
        outs = self.ex.run(self.args)
        args = self.args
        for i, o in zip(self.state_pos, outs[1:]):
            args[i] = o
        return outs[0]

    def get_arg(self, p: int) -> np.ndarray:
        return np.array(self.args[p], copy=True)

    def read(self) -> list[np.ndarray]:
        return [np.array(self.args[i], copy=True) for i in self.state_pos]


# --------------------------------------------------------------------------
# the small-op call path: one generated function per (library, bound params)

_FAST_SRC = '''\
def fast(args):
    if len(args) != {n_in}:
        return None
{unpack}    if not ({checks}):
        return None
    try:
        st = local.st
    except AttributeError:
        st = state()
    if not st.bound:
        return None
    ins = st.ins
{ins}{outs}    gov = st._gov
    if gov._fixed:
        rc = st._entry(ins, optr, st.pars, st.ws_ptr)
    else:
        tok = gov.begin()
        rc = st._entry(ins, optr, st.pars, st.ws_ptr)
        gov.end(tok)
    if rc:
        raise lib.error(rc, st)
    return [{olist}]
'''


def fast_runner(caller, in_specs):
    """`fast(args) -> outputs | None`: the common call of a CpuCaller with bound params
    (runtime/cpu.py), as one straight-line function generated for this signature.

    `in_specs`: (shape tuple, np.dtype) per input.  `fast` takes the inputs as a tuple;
    when every one is an ndarray of exactly that shape and dtype (the dtype object
    itself: NumPy's builtin dtypes are singletons) and C-contiguous, it writes their
    addresses into the calling thread's frame, allocates the outputs, calls the entry
    (through the governor when it is not fixed) and returns the outputs.  Otherwise it
    returns None and does nothing: the caller's general path (conversions, named
    inputs, clear errors) takes over.  Unrolled and with every constant bound as a
    global, a W6-sized call costs ~2-3 us of Python instead of ~5 (loops, per-input
    tuple unpacking, the address helper's extra call).  Returns None (no fast path)
    when params are not bound or outputs are reused (RLXC_REUSE_OUTPUTS)."""
    if caller._params is None or getattr(caller, "_reuse", False):
        return None
    n_in = len(in_specs)
    names = [f"a{i}" for i in range(n_in)]
    env = {"ND": np.ndarray, "local": caller._local, "state": caller._state,
           "lib": caller.lib, "empty": np.empty}
    if DATA_OFFSET is not None:
        env["read"], env["OFF"] = ctypes.c_void_p.from_address, DATA_OFFSET
        addr = "read(id({0}) + OFF).value"
    else:
        env["addr"] = data_address
        addr = "addr({0})"
    checks = []
    for i, (shape, dt) in enumerate(in_specs):
        env[f"S{i}"], env[f"D{i}"] = tuple(shape), np.dtype(dt)
        a = names[i]
        checks.append(f"type({a}) is ND and {a}.dtype is D{i} and {a}.shape == S{i} "
                      f"and {a}.flags.c_contiguous")
    if n_in == 0:
        unpack = ""
    else:
        unpack = f"    {', '.join(names)}{',' if n_in == 1 else ''} = args\n"
    ins = "".join(f"    ins[{i}] = {addr.format(a)}\n" for i, a in enumerate(names))
    outs = "    optr = st.outs\n"
    olist = []
    for k, (shape, dt) in enumerate(caller._out_specs):
        env[f"OS{k}"], env[f"OD{k}"] = tuple(shape), np.dtype(dt)
        outs += f"    o{k} = empty(OS{k}, OD{k})\n    optr[{k}] = {addr.format(f'o{k}')}\n"
        olist.append(f"o{k}")
    src = _FAST_SRC.format(n_in=n_in, unpack=unpack, checks=" and ".join(checks) or "True",
                           ins=ins, outs=outs, olist=", ".join(olist))
    exec(compile(src, f"<rlxc fast call {caller.lib.meta.get('entry', '?')}>", "exec"), env)
    fast = env["fast"]
    fast.source = src
    return fast

"""Running a Func with dynamic dims (symbols) on a native backend.

    Func with ("B", 784) inputs
          │ bind_sizes(signature, the call's array shapes)   {"B": 32}: checked per call
          │ specialized(func, sizes): dialect/specialize.py + cleanup, memoised per sizes
          ▼
    a static Func at those sizes -> the backend's executor / jit (compile cache as usual)

The NumPy interpreter runs dynamic modules directly.  A native backend first gets
ONE program for every size from rlxc/dynone.py (`one_library`): on the host CPU a
size-generic library (lowering/cpu/dynsizes.py, runtime/dyncpu.py), on CUDA a
size-generic GPU program (lowering/gpu/dynplan.py, runtime/dyncuda.py).  Only
when that path refuses the graph (a lowering decision that depends on a size;
dynone.FALLBACKS says why), or the call passes backend options, does the path
drawn above run: one static program per distinct set of sizes, the first call at
a new size compiling it (then memory and disk caches serve it, like any Func).
"""
from __future__ import annotations

import threading

import numpy as np

from rlxc.runtime.dims import bind_sizes, is_dynamic

_specs: dict = {}
_lock = threading.Lock()
MAX_SPECS = 256


def is_dynamic_func(func) -> bool:
    return any(is_dynamic(a.shape) for a in func.signature())


def sizes_of(func, arrays, what: str = "run") -> dict:
    """Each symbol's size in this call (arrays in signature order), checked."""
    return bind_sizes(func.signature(), [a.shape for a in arrays], what)


def specialized(func, sizes: dict, params: bool = True):
    """`func` with its symbols fixed to `sizes`: a static Func, params carried over.
    Memoised per (IR, sizes): the static Func (and so its IR hash) is made once.
    `params=False`: without `func`'s bindings (for callers that pass every param)."""
    key = (func.trace_hash(), tuple(sorted(sizes.items())))
    g = _specs.get(key)
    if g is None:
        from rlxc.dialect.passes import cleanup
        from rlxc.dialect.specialize import specialize

        g = func.with_module(cleanup(specialize(func.module, sizes)))
        g.ir_hash()
        with _lock:
            if len(_specs) >= MAX_SPECS:
                _specs.pop(next(iter(_specs)))
            _specs[key] = g
    return g.with_params(func.params()) if params and func.params() else g


def executor_for(backend, func, **options):
    """`backend.executor(func)`, or a SizedExecutor when `func` has dynamic dims and the
    backend compiles native code (the interpreter runs symbols itself)."""
    if backend.native and is_dynamic_func(func):
        if not options:
            from .dynone import one_library

            one = one_library(func, backend)   # one library for every size (dynone.py)
            if one is not None:
                return one
        return SizedExecutor(func, backend, options)
    return backend.executor(func, **options)


class SizedExecutor:
    """`.run(arrays)` for a dynamic Func on a native backend, one program per sizes (the
    fallback when rlxc/dynone.py's one program for every size refuses the graph)."""

    def __init__(self, func, backend, options: dict):
        self.func, self.backend, self.options = func, backend, options
        self._ex: dict = {}

    def run(self, arrays):
        sizes = sizes_of(self.func, arrays, f"{self.func.name}.run")
        key = tuple(sorted(sizes.items()))
        ex = self._ex.get(key)
        if ex is None:   # arrays carry the params: the static Func's own bindings are unused
            ex = self._ex[key] = self.backend.executor(specialized(self.func, sizes, False),
                                                       **self.options)
        return ex.run(arrays)


class SizedJitted:
    """`Func.jit()` of a dynamic Func: `.run(**inputs)` at any sizes."""

    def __init__(self, func, backend, options: dict):
        self.func, self.backend, self.options = func, backend, options
        self._jits: dict = {}
        self._threads = None
        self._dyn = [a for a in func.signature() if a.kind == "input" and is_dynamic(a.shape)]
        from .dynone import one_library

        self._one = None if options else one_library(func, backend)  # every size: dynone.py
        self._fast = None   # (input names, [(name, position, dtype)], arrays with params)
        self._bcall = None
        sig = func.signature()
        bound = {a.name: func.param_binding(a.name) for a in sig if a.kind == "param"}
        if self._one is not None and all(v is not None for v in bound.values()):
            from rlxc.runtime.signature import NP_DTYPES

            slots = [(a.name, i, NP_DTYPES[a.dtype]) for i, a in enumerate(sig)
                     if a.kind == "input"]
            self._fast = ({n for n, _, _ in slots}, slots,
                          [bound.get(a.name) for a in sig])
            # the params never change: a BoundCall passes only the inputs (runtime/dyncpu.py)
            mk = getattr(self._one, "bound", None)
            self._bcall = mk(self._fast[2]) if mk is not None else None

    def run(self, *args, **inputs) -> list:
        if args and not (len(args) == 1 and isinstance(args[0], dict)):
            args, inputs = (), self._by_name(args, inputs)   # by position, as Jitted.run
        if self._one is not None:
            if not args and self._fast is not None and len(inputs) == len(self._fast[0]):
                # the common call: every input by name, an ndarray of its dtype; the
                # executor checks every shape (DynExecutor._plan), anything else takes
                # bind_call with its conversions and messages
                names, slots, arrays = self._fast
                ins = []
                for name, pos, npdt in slots:
                    a = inputs.get(name)
                    if type(a) is not np.ndarray or a.dtype != npdt:
                        break
                    ins.append(a)
                else:
                    if self._bcall is not None:
                        return self._bcall.run(ins)
                    arrays = list(arrays)
                    for (_, pos, _), a in zip(slots, ins):
                        arrays[pos] = a
                    return self._one.run(arrays)
            return self._one.run(self.func.bind_call(args, inputs, f"{self.func.name}.run"))
        if not args and self._dyn is not None:   # fast path: sizes from the dynamic inputs
            try:
                shapes = [getattr(inputs[a.name], "shape", None) for a in self._dyn]
            except KeyError:
                shapes = None                         # the full path names what is missing
            if shapes is not None and None not in shapes:
                sizes = bind_sizes(self._dyn, shapes, f"{self.func.name}.run")
                j = self._jits.get(tuple(sorted(sizes.items())))
                if j is not None:                     # it checks every other shape itself
                    return j.run(**inputs)
        arrays = self.func.bind_call(args, inputs, f"{self.func.name}.run")
        sizes = sizes_of(self.func, arrays, f"{self.func.name}.run")
        key = tuple(sorted(sizes.items()))
        j = self._jits.get(key)
        if j is None:
            j = self._jits[key] = self.backend.jit(specialized(self.func, sizes),
                                                   **self.options)
            if self._threads is not None:
                j.set_num_threads(self._threads)
        given = set(inputs) | (set(args[0]) if args else set())  # params given override
        return j.run(**{a.name: x for a, x in zip(self.func.signature(), arrays)
                        if a.kind == "input" or a.name in given})

    __call__ = run

    def _by_name(self, args, inputs: dict) -> dict:
        names = [a.name for a in self.func.signature() if a.kind == "input"]
        if len(args) > len(names):
            raise TypeError(f"{self.func.name}.run: {len(args)} positional inputs, expected "
                            f"at most {len(names)} ({names})")
        inputs = dict(inputs)
        for n, a in zip(names, args):
            if n in inputs:
                raise TypeError(f"{self.func.name}.run: input {n!r} given twice")
            inputs[n] = a
        return inputs

    def set_num_threads(self, n: int) -> None:
        """Threads of every program built so far and of those built later."""
        self._threads = int(n)
        if self._one is not None:
            self._one.lib.set_num_threads(self._threads)
        for j in self._jits.values():
            j.set_num_threads(self._threads)

    def with_param(self, name: str, data) -> "SizedJitted":
        return SizedJitted(self.func.with_param(name, data), self.backend, self.options)

    def with_params(self, params: dict) -> "SizedJitted":
        return SizedJitted(self.func.with_params(params), self.backend, self.options)

    def __repr__(self):
        return f"SizedJitted({self.func.name!r}, {self.backend.name!r})"


class SizedEngine:
    """The Trainer's engine (runtime.call.ResidentCall's interface: set_arg, run, get_arg,
    read) for a step with dynamic dims on the CPU: one ResidentCall per set of sizes,
    params and optimizer state resident; when the sizes change, the state moves into
    the engine of the new sizes (a copy of the params and slots, once per change)."""

    def __init__(self, prog, make_engine, args: list, state_pos: list[int]):
        self.prog = prog
        self.make_engine = make_engine       # (static step Func, args) -> ResidentCall
        self.args = list(args)
        self.state_pos = list(state_pos)
        self._state = set(state_pos)
        self.engines: dict = {}
        self.cur = None
        self.cur_key = None

    def set_arg(self, p: int, a) -> None:
        if p in self._state:
            raise ValueError(f"argument {p} is state: it is written by the calls")
        self.args[p] = a

    def _engine(self):
        sizes = sizes_of(self.prog.func, self.args, "train step")
        key = tuple(sorted(sizes.items()))
        if key == self.cur_key:
            return self.cur
        state = self.cur.read() if self.cur is not None else \
            [self.args[i] for i in self.state_pos]
        eng = self.engines.get(key)
        args = list(self.args)
        for i, s in zip(self.state_pos, state):
            args[i] = s
        if eng is None:
            eng = self.engines[key] = self.make_engine(
                specialized(self.prog.func, sizes, False), args)
        else:
            for j, s in enumerate(state):       # the resident buffers of the next call
                eng.bufs[eng.k][j][...] = s.reshape(eng.bufs[eng.k][j].shape)
        self.cur, self.cur_key = eng, key
        return eng

    def run(self):
        eng = self._engine()
        for p, a in enumerate(self.args):
            if p not in self._state and a is not None:
                eng.set_arg(p, a)
        return eng.run()

    def get_arg(self, p: int):
        import numpy as np

        if self.cur is not None:
            return self.cur.get_arg(p)
        return np.array(self.args[p], copy=True)

    def read(self) -> list:
        import numpy as np

        if self.cur is not None:
            return self.cur.read()
        return [np.array(self.args[i], copy=True) for i in self.state_pos]

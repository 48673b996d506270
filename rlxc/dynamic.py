"""Running a Func with dynamic dims (symbols) on a native backend.

    Func with ("B", 784) inputs
          │ bind_sizes(signature, the call's array shapes)   {"B": 32}: checked per call
          │ specialized(func, sizes): dialect/specialize.py + cleanup, memoised per sizes
          ▼
    a static Func at those sizes -> the backend's executor / jit (compile cache as usual)

The NumPy interpreter runs dynamic modules directly; the CPU and CUDA backends
get one static program per distinct set of sizes: the first call at a new size
compiles (then memory and disk caches serve it, like any Func).  Native code
whose loop bounds come from the call's sizes (one library for every size,
issue 14) replaces this path when it lands; the interface stays the same.
"""
from __future__ import annotations

import threading

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
        return SizedExecutor(func, backend, options)
    return backend.executor(func, **options)


class SizedExecutor:
    """`.run(arrays)` for a dynamic Func on a native backend (one program per sizes)."""

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

    def run(self, *args, **inputs) -> list:
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

    def set_num_threads(self, n: int) -> None:
        """Threads of every program built so far and of those built later."""
        self._threads = int(n)
        for j in self._jits.values():
            j.set_num_threads(self._threads)

    def with_param(self, name: str, data) -> "SizedJitted":
        return SizedJitted(self.func.with_param(name, data), self.backend, self.options)

    def with_params(self, params: dict) -> "SizedJitted":
        return SizedJitted(self.func.with_params(params), self.backend, self.options)

    def __repr__(self):
        return f"SizedJitted({self.func.name!r}, {self.backend.name!r})"

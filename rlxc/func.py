"""`Func`: an immutable traced function of named inputs and params.

A Func holds an rlx module (one `func.func`) and the arrays bound to its
params. Every builder (`with_param`, `init_randn`, a transform) returns a new
Func; the IR of a Func is never mutated in place, so clones share it and its
compiled artifacts.

A traced Func starts as a light trace (dialect/trace.py): its signature is
known at once, its module is built on first use (`module`, `mlir`,
`ir_hash`, a transform, a compile), and `trace_hash` names its IR without
building it, so a process whose compiled code is in the disk cache (a
Trainer's step, rlxc/train.py) never imports xDSL.
"""
from __future__ import annotations

import hashlib
import threading

import numpy as np

from rlxc.runtime.call import aligned_empty, data_address
from rlxc.runtime.errors import NameLookupError
from rlxc.runtime.signature import bind_args, coerce

from .registry import backend, default_device
from .tensor import GraphScope, Tensor

PARAM_ALIGN = 64   # bytes: where every bound param starts (a cache line; _coerce_param)

__all__ = ["Func", "default_device"]


class Func:
    """A pure function traced once into the rlx dialect.

    `Func(name, build)` calls `build(scope)` with a GraphScope; it returns a
    Tensor or a tuple/list of Tensors (several outputs)."""

    def __init__(self, name: str, build=None, *, module=None, params=None):
        if not isinstance(name, str) or not name:
            raise ValueError(f"Func name must be a non-empty string, got {name!r}")
        if (build is None) == (module is None):
            raise TypeError("Func(name, build): give a build function")
        self.name = name
        if module is None:
            self._src = _Traced(_trace(name, build))
            self._mod = None
            self._args = list(self._src.trace.args)
        else:
            from rlxc.dialect import module as M

            self._src = None
            self._mod = module
            self._args = M.signature(M.get_func(module))
        self._bound: dict[str, np.ndarray] = {}
        self._hash = None
        for k, v in (params or {}).items():
            self._bound[k] = self._coerce_param(k, v)

    @property
    def symbol(self) -> str:
        """The C-safe symbol of this Func's compiled code and artifacts (`c_symbol(name)`)."""
        return c_symbol(self.name)

    # -- construction ------------------------------------------------------
    @classmethod
    def from_module(cls, module, params=None) -> "Func":
        """Wrap an existing rlx module (verified; its function name becomes the Func name)."""
        from rlxc.dialect import module as M

        module.verify()
        f = M.get_func(module)
        return cls(f.sym_name.data, module=module, params=params)

    @classmethod
    def from_mlir(cls, text: str, params=None) -> "Func":
        """Parse rlx-dialect MLIR text (as printed by `mlir()`)."""
        from rlxc.dialect import module as M

        return cls.from_module(M.parse(text), params)

    def mlir(self) -> str:
        """The module as MLIR text; `Func.from_mlir(f.mlir())` round-trips."""
        from rlxc.dialect import module as M

        return M.to_text(self._module)

    @property
    def module(self):
        """The rlx module. Treat as read-only: passes work on clones."""
        return self._module

    @property
    def _module(self):
        return self._mod if self._mod is not None else self._src.module()

    def ir_hash(self) -> str:
        """sha256 of the MLIR text."""
        if self._hash is None:
            self._hash = hashlib.sha256(self.mlir().encode()).hexdigest()
        return self._hash

    def trace_hash(self) -> str:
        """A hash that determines this Func's IR, computed without building the IR when
        the Func was traced: "trace:" + the trace's digest (which, with the tracer and
        dialect sources and the xDSL version, decides the module); otherwise
        ir_hash().  For cache keys that include those sources (rlxc/train.py)."""
        if self._src is not None:
            return "trace:" + self._src.trace.digest()
        return self.ir_hash()

    def with_module(self, module) -> "Func":
        """A new Func of the same name on `module` (an rlx module, e.g. this one after
        more passes); params carried over where the new signature has them."""
        return self._derive(module=module)

    def _derive(self, module=None, params=None, name=None) -> "Func":
        """A new Func: same IR unless `module` is given; params carried over where they fit."""
        g = Func.__new__(Func)
        g.name = name or self.name
        if module is not None:
            from rlxc.dialect import module as M

            g._src, g._mod = None, module
            g._args = M.signature(M.get_func(module))
        else:
            g._src, g._mod, g._args = self._src, self._mod, self._args
        g._hash = self._hash if module is None else None
        keep = {a.name: a for a in g._args if a.kind == "param"}
        g._bound = {k: v for k, v in self._bound.items()
                    if k in keep and v.shape == tuple(keep[k].shape)}
        if params:
            g._bound.update(params)
        return g

    # -- signature ---------------------------------------------------------
    def input_names(self) -> list[str]:
        return [a.name for a in self._args if a.kind == "input"]

    def param_names(self) -> list[str]:
        """Params in declaration order."""
        return [a.name for a in self._args if a.kind == "param"]

    def signature(self) -> list:
        """Every argument (name, kind, shape, dtype) in declaration order."""
        return list(self._args)

    def _arg(self, name: str, kind: str | None = None):
        for a in self._args:
            if a.name == name and (kind is None or a.kind == kind):
                return a
        valid = [a.name for a in self._args if kind is None or a.kind == kind]
        raise NameLookupError(f"unknown {kind or 'name'} {name!r}; valid: {valid}")

    def param_shape_of(self, name: str) -> tuple:
        return tuple(self._arg(name, "param").shape)

    def input_shape_of(self, name: str) -> tuple:
        return tuple(self._arg(name, "input").shape)

    def output_count(self) -> int:
        if self._mod is None:
            return len(self._src.trace.outputs)
        from rlxc.dialect import module as M

        return len(M.outputs(M.get_func(self._module)))

    def output_shapes(self) -> list[tuple]:
        if self._mod is None:
            return [v.type.shape for v in self._src.trace.outputs]
        from rlxc.dialect import module as M
        from rlxc.dialect.types import shape_of

        return [shape_of(v.type) for v in M.outputs(M.get_func(self._module))]

    # -- params ------------------------------------------------------------
    def _coerce_param(self, name, data) -> np.ndarray:
        a = self._arg(name, "param")
        arr = coerce("param", name, data, a.shape, a.dtype)
        if arr is data or data_address(arr) % PARAM_ALIGN:
            # the Func owns its bound data, on a 64-byte boundary: NumPy aligns to 16
            # bytes, and a matrix whose rows straddle cache lines makes every other AVX2
            # load and every AVX-512 load of a matvec touch two lines (W6's HVP, W 256x256:
            # 11.0 -> 6.2 us per call on AVX-512, 12.9 -> 9.4 us with AVX2)
            out = aligned_empty(arr.shape, arr.dtype, PARAM_ALIGN)
            out[...] = arr
            arr = out
        arr.flags.writeable = False
        return arr

    def with_param(self, name: str, data) -> "Func":
        """A new Func with `name` bound to `data` (declared shape, or flat)."""
        return self._derive(params={name: self._coerce_param(name, data)})

    def with_params(self, params: dict) -> "Func":
        return self._derive(params={k: self._coerce_param(k, v) for k, v in params.items()})

    def param_binding(self, name: str) -> np.ndarray | None:
        """The array bound to param `name`, or None when unbound."""
        self._arg(name, "param")
        return self._bound.get(name)

    def params(self) -> dict[str, np.ndarray]:
        """All bound params, by name, in declaration order."""
        return {n: self._bound[n] for n in self.param_names() if n in self._bound}

    def init_params(self, fn) -> "Func":
        """Bind every param to `fn(name, dims)` (to bind arrays you have, with_params)."""
        if not callable(fn):
            raise TypeError(f"init_params: expects a function fn(name, dims) -> array, got "
                            f"{type(fn).__name__}; bind a dict of arrays with with_params")
        return self.with_params({n: fn(n, self.param_shape_of(n)) for n in self.param_names()})

    def init_randn(self, seed: int, stddev: float) -> "Func":
        """Bind every param from RLX's SplitMix64/Box-Muller stream (bit-identical to RLX)."""
        from .randn import randn_stream

        names = self.param_names()
        vals = randn_stream(seed, [self.param_shape_of(n) for n in names], stddev)
        return self.with_params(dict(zip(names, vals)))

    # -- transforms (each one a dialect pass, then cleanup) --------------------
    def _transformed(self, fn, *args) -> "Func":
        from rlxc.dialect.passes import cleanup

        return self._derive(module=cleanup(fn(self._module, *args)))

    def grad(self, wrt) -> "Func":
        """Gradients of the first output (summed if not scalar) w.r.t. `wrt` (inputs or params)."""
        from rlxc.dialect.autodiff import grad_module

        return self._transformed(grad_module, _names(wrt), False)

    def value_and_grad(self, wrt) -> "Func":
        """Outputs [loss, grads...]; the forward runs once."""
        from rlxc.dialect.autodiff import grad_module

        return self._transformed(grad_module, _names(wrt), True)

    def grad_all(self) -> "Func":
        return self.grad(self.param_names())

    def value_and_grad_all(self) -> "Func":
        return self.value_and_grad(self.param_names())

    def jvp(self, tangent_for) -> "Func":
        """Forward mode: adds inputs `tangent_<name>`; outputs [primals..., tangents...]."""
        from rlxc.dialect.jvp import jvp_module

        return self._transformed(jvp_module, _names(tangent_for))

    def hvp(self, wrt) -> "Func":
        """Forward-over-reverse: adds `tangent_<name>`; outputs [loss, grads..., <grad, v>, Hv...]."""
        from rlxc.dialect.jvp import hvp_module

        return self._transformed(hvp_module, _names(wrt))

    def vmap(self, batched, batch_size: int) -> "Func":
        """Map over a new leading axis of the `batched` inputs; params and other inputs are shared."""
        from rlxc.dialect.vmap import vmap_module

        return self._transformed(vmap_module, _names(batched), int(batch_size))

    # -- training (rlxc/train.py, rlxc/trainer.py) ------------------------------
    def train_step(self, opt, inputs, wrt=None, schedule=None, step: int = 0, device=None,
                   max_grad_norm: float = 0.0, quant=None):
        """One optimizer update: returns (new Func, loss before the update).

        `wrt=None` trains every param; `opt` keeps its own state and count;
        `step` only picks the lr of `schedule`; `max_grad_norm > 0` clips the
        global L2 norm; `quant` (format name or callable) trains through a
        straight-through quantizer with float32 master weights."""
        from .train import train_step

        return train_step(self, opt, inputs, wrt=wrt, schedule=schedule, step=step,
                          device=device, max_grad_norm=max_grad_norm, quant=quant)

    def trainer(self, opt, schedule=None, max_grad_norm: float = 0.0, quant=None, device=None,
                wrt=None, comm=None, batch_size=None):
        """A `Trainer`: the fused step compiled once, params and state kept resident.
        `comm` (rlxc.distributed.init()) trains data-parallel over MPI ranks."""
        from .trainer import Trainer

        return Trainer(self, opt, schedule=schedule, max_grad_norm=max_grad_norm, quant=quant,
                       device=device, wrt=wrt, comm=comm, batch_size=batch_size)

    def save_params(self, path, metadata=None) -> None:
        """Write every (bound) param to a safetensors file."""
        from .train import save_params

        save_params(self, path, metadata)

    def load_params(self, path, strict: bool = True) -> "Func":
        """A new Func with params from `path`; strict: extra tensors are an error too."""
        from .train import load_params

        return load_params(self, path, strict)

    # -- running (devices come from the backend registry, rlxc/registry.py) ----------
    def bind_call(self, args, inputs: dict, what: str = "run") -> list[np.ndarray]:
        """Every argument in signature order for one call: `args` is () or a single dict
        of inputs, `inputs` names inputs (or params, overriding their binding); each
        array validated (runtime.signature.bind_args), bound params filled in."""
        if args:
            if len(args) != 1 or not isinstance(args[0], dict):
                raise TypeError(f"{what}: pass inputs by name, run(x=...) or run({{'x': ...}})")
            inputs = {**args[0], **inputs}
        return bind_args(self._args, inputs, self._bound, what)

    def run(self, *args, **inputs) -> list[np.ndarray]:
        """Run on the default device (`default_device()`: RLXC_DEVICE, else the best
        available backend); returns a list of arrays shaped like the outputs."""
        return self.run_on(default_device(), *args, **inputs)

    def run_on(self, device: str, *args, **inputs) -> list[np.ndarray]:
        """Run on a registered device: "cpu" (native), "cuda" or "interp" (the NumPy
        reference), see `rlxc.registry.devices()`."""
        b = backend(device)
        arrays = self.bind_call(args, inputs, f"{self.name}.run")
        from .dynamic import executor_for   # dynamic dims: one program per sizes

        return executor_for(b, self).run(arrays)

    def jit(self):
        """A `Jitted` for the default device: compiled once, `.run` does no cache lookup."""
        return self.jit_on(default_device())

    def jit_on(self, device: str):
        """A `Jitted` for a native device ("cpu", "cuda", see rlxc.registry.native_devices)."""
        b = backend(device)
        if b.native and self.is_dynamic():
            from .dynamic import SizedJitted

            return SizedJitted(self, b, {})
        return b.jit(self)

    def is_dynamic(self) -> bool:
        """Does some input have a dynamic dimension (a symbol, dialect/symdims.py)?"""
        return any(isinstance(d, str) for a in self._args for d in a.shape)

    def specialize(self, **sizes) -> "Func":
        """This Func with its dimension symbols fixed (`f.specialize(B=32)`): static shapes,
        params carried over; an anonymous dim by its label: `f.specialize(**{"x.0": 4})`."""
        from rlxc.runtime.dims import label

        from .dynamic import specialized

        names = {label(d): d for a in self._args for d in a.shape if isinstance(d, str)}
        sizes = {names.get(k, k): v for k, v in sizes.items()}
        missing = set(names.values()) - set(sizes)
        if missing:
            raise ValueError(f"specialize: give a size for {sorted(map(label, missing))}")
        for k, v in sizes.items():
            if int(v) < 1:
                raise ValueError(f"specialize: dimension {label(k)!r} must be >= 1, got {v}")
        return specialized(self, {k: int(v) for k, v in sizes.items()})

    def __repr__(self):
        sig = ", ".join(f"{a.kind} {a.name}: {a.shape}" for a in self._args)
        return f"Func({self.name!r}, [{sig}], outputs={self.output_count()})"


def _names(names) -> list[str]:
    if isinstance(names, str):
        return [names]
    names = list(names)
    if not all(isinstance(n, str) for n in names):
        raise TypeError(f"expected a list of names, got {names!r}")
    return names


class _Traced:
    """A finished trace and the module built from it once, on first use.

    Shared by every Func derived from the traced one (`with_param`, ...), so
    they share one module object, as Funcs built from a module do."""

    def __init__(self, trace):
        self.trace = trace
        self._module = None
        self._lock = threading.Lock()

    def module(self):
        m = self._module
        if m is None:
            with self._lock:
                if self._module is None:
                    from rlxc.dialect import module as M

                    self._module = M.from_trace(self.trace)
                m = self._module
        return m


def c_symbol(name: str) -> str:
    """A C identifier for any Func name: every character outside [A-Za-z0-9_] becomes
    "_", and a leading digit gets a "_" prefix ("my-model" -> "my_model", "layer.0" ->
    "layer_0")."""
    sym = "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in name)
    return "_" + sym if not sym or sym[0].isdigit() else sym


def _trace(name: str, build):
    """Run `build` on a new GraphScope; the finished light trace (no IR yet)."""
    scope = GraphScope()
    out = build(scope)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    if not outs:
        raise ValueError(f"Func {name!r}: build returned no outputs")
    for i, o in enumerate(outs):
        if not isinstance(o, Tensor):
            raise TypeError(f"Func {name!r}: output #{i} is {type(o).__name__}, not a Tensor")
        if o.scope is not scope:
            raise ValueError(f"Func {name!r}: output #{i} comes from another scope")
    return scope.trace.finish(name, [o.value for o in outs])

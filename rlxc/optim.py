"""Optimizers: the base class (the extension point) and SGD, Adam, AdamW, Lion.

Purpose
-------
``opt.step(params, grads)`` updates float32 parameter arrays in place from
their gradients.  The same update is emitted as graph ops inside a compiled
train step (`Func.train_step`, `Trainer`, `rlxc compile --train`) by the
public method ``update(b, p, g, state, s)``, so every optimizer describes
itself declaratively: ``kind``, ``slots()`` (the per-parameter state buffers,
e.g. ["m", "v"]), ``slot_shape()``, ``hyperparams()`` (floats), ``t``
(updates done), ``scalars(t, lr)`` (the float64 per-step constants, rounded
to float32 once by ``step_scalars``) and ``structure()`` (what decides the
emitted graph).  The NumPy code (``_update``) is the oracle the compiled step
must match bit for bit.  NAdamW, RAdam, LAMB, Adafactor and Muon live in
rlxc/optim_more.py and are re-exported here.

Writing an optimizer
--------------------
Subclass ``Optimizer``, set ``kind`` and ``slot_names``, pass the
hyperparameters (numbers or bools; ``lr`` required) to ``__init__``, return
the per-step constants from ``scalars(t, lr)`` and emit the update with graph
ops in ``update``; see the ``Optimizer`` docstring for a complete example.
Without a NumPy ``_update``, ``opt.step`` runs ``update`` through rlxc's
interpreter.  For ``rlxc compile --train`` the scalars are turned into C:
``scalars`` is called once with symbolic ``t`` and ``lr`` (``scalar_recipe``),
so it may use arithmetic, ``**`` and ``select(cond, a, b)`` on them, but no
``if``/``math.*``/``float()`` of a value that depends on t or lr.

Numerics (the contract the native code follows)
-----------------------------------------------
* Per-step scalar constants (lr, beta, 1 - beta, the bias corrections
  1 - beta**t, eps, weight decay) are computed in float64 from the Python
  hyperparameters and rounded to float32 once (``step_scalars``).
* Every elementwise operation is float32 with one IEEE rounding per
  operation, in exactly the order written below; no fused multiply-add and
  no reassociation (compiled code must not use ``contract``/fast-math here).
* ``t`` counts updates: the update being applied is number
  ``t = updates done before + 1``, shared by all params of the optimizer.

Update rules (formulas of RLX; p param, g grad, wd weight decay)
----------------------------------------------------------------
SGD(lr, momentum=mu, nesterov, wd):
    d = g + wd*p
    momentum:  v = mu*v + d;  p -= lr*(d + mu*v) if nesterov else lr*v
    otherwise: p -= lr*d
Adam(lr, betas=(b1, b2), eps, wd)  (L2 folded into the gradient):
    g = g + wd*p;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*(g*g)
    m_hat = m/(1-b1**t);  v_hat = v/(1-b2**t)
    p -= lr * (m_hat / (sqrt(v_hat) + eps))
AdamW: as Adam without the L2 term, decoupled decay:
    p -= lr * (m_hat / (sqrt(v_hat) + eps) + wd*p)
Lion(lr, betas=(b1, b2), wd):
    p -= lr * (sign(b1*m + (1-b1)*g) + wd*p);  m = b2*m + (1-b2)*g
The weight-decay term is skipped when wd == 0 (it is an exact no-op then).

State dict
----------
A flat ``dict[str, np.ndarray]`` that safetensors can store:
``"kind"`` (uint8 ASCII bytes of the kind), ``"t"`` (int64, shape (1,)),
``"hp.<name>"`` (float64, shape (1,)) for every hyperparameter, and
``"<slot>.<param>"`` (float32 copy) for every slot of every param that has
state.  Loading it into a fresh optimizer of the same kind resumes bit-exactly.
"""
from __future__ import annotations

import math
import weakref
from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from .optim_recipe import Sym, code_fingerprint, select

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "Lion", "NAdamW", "RAdam", "LAMB",
           "Adafactor", "Muon", "BUILTINS", "select"]

_F32 = np.float32


def check_nonneg(owner: str, name: str, value) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{owner}: {name} must be a number, got {value!r}") from None
    if not (math.isfinite(value) and value >= 0.0):
        raise ValueError(f"{owner}: {name} must be finite and >= 0, got {value!r}")
    return value


def check_unit(owner: str, name: str, value) -> float:
    value = check_nonneg(owner, name, value)
    if not value < 1.0:
        raise ValueError(f"{owner}: {name} must be in [0, 1), got {value!r}")
    return value


def check_betas(owner: str, betas) -> tuple[float, float]:
    try:
        b1, b2 = betas
    except (TypeError, ValueError):
        raise ValueError(f"{owner}: betas must be a pair (b1, b2), got {betas!r}") from None
    return check_unit(owner, "beta1", b1), check_unit(owner, "beta2", b2)


def _hp_property(name: str, doc: str) -> property:
    return property(lambda self: self._hp[name], doc=doc)


# class -> (qualified name, code fingerprints): computed once per class
_CLASS_IDENT: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class Optimizer:
    """Base class: hyperparameters, the update counter, state (de)serialization,
    and the public extension point ``update`` that emits the rule as graph ops.

    A subclass sets ``kind`` (stored in state dicts), ``slot_names`` (or
    overrides ``_slots_for``), calls ``super().__init__(lr, **hyperparams)``
    and defines ``scalars(t, lr)`` and ``update(b, p, g, state, s)``:

    >>> class SignMomentum(Optimizer):
    ...     kind = "signmomentum"
    ...     slot_names = ("m",)
    ...     numeric_hps = ("beta",)       # enters the graph only through scalars()
    ...
    ...     def __init__(self, lr, beta=0.9):
    ...         super().__init__(lr=lr, beta=beta)
    ...
    ...     def scalars(self, t, lr):     # float64 values; rounded to float32 once
    ...         beta = self.hyperparams()["beta"]
    ...         return {"lr": lr, "beta": beta, "omb": 1.0 - beta}
    ...
    ...     def update(self, b, p, g, state, s):
    ...         m = state["m"] * s["beta"] + s["omb"] * g
    ...         return p - s["lr"] * m.sign(), {"m": m}

    ``b`` is the GraphScope (``b.where``, ``b.scalar``, ...), ``p``/``g`` the
    float32 param and gradient Tensors, ``state`` maps each slot name to its
    Tensor (shaped ``slot_shape(slot, p.shape)``) and ``s`` maps each name of
    ``scalars`` to a rank-0 float32 Tensor.  Return the new param and a dict
    with every slot.  Such a class works in ``opt.step`` (through the
    interpreter unless it defines the NumPy ``_update``), ``Func.train_step``,
    ``Trainer`` and ``rlxc compile --train --optimizer file.py:SignMomentum``.
    """

    kind: ClassVar[str] = ""
    slot_names: ClassVar[tuple] = ()
    # hyperparameters that reach `update` only through `scalars` (their value does
    # not change the emitted graph; only zero / non-zero may, e.g. weight decay)
    numeric_hps: ClassVar[tuple] = ()

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if not cls.kind:
            cls.kind = cls.__name__.lower()

    def __init__(self, lr, **hp):
        self._hp: dict[str, float] = self._validate_hp({"lr": lr, **hp})
        self._t = 0
        # param name -> slot name -> float32 array shaped slot_shape(slot, param shape)
        self.state: dict[str, dict[str, np.ndarray]] = {}
        self._interp: dict = {}

    # -- declarative description --------------------------------------------
    @classmethod
    def _validate_hp(cls, hp: dict) -> dict[str, float]:
        """Check and normalize a full hyperparameter dict (ValueError if bad).

        The default: ``lr`` >= 0 is required, bools become 0.0/1.0 and every
        other value must be a finite number."""
        name = cls.__name__
        if "lr" not in hp:
            raise ValueError(f"{name}: pass lr=... to Optimizer.__init__")
        out = {}
        for k, v in hp.items():
            if k == "lr":
                out[k] = check_nonneg(name, "lr", v)
            elif isinstance(v, (bool, np.bool_)):
                out[k] = 1.0 if v else 0.0
            else:
                try:
                    f = float(v)
                except (TypeError, ValueError):
                    raise ValueError(f"{name}: hyperparameter {k} must be a number or a "
                                     f"bool, got {v!r}") from None
                if not math.isfinite(f):
                    raise ValueError(f"{name}: hyperparameter {k} must be finite, got {v!r}")
                out[k] = f
        return out

    @classmethod
    def _slots_for(cls, hp: dict[str, float]) -> list[str]:
        """The slot names implied by a (validated) hyperparameter dict."""
        return list(cls.slot_names)

    def slots(self) -> list[str]:
        """Names of the per-parameter state buffers, in a fixed order."""
        return self._slots_for(self._hp)

    def slot_shape(self, slot: str, shape: tuple) -> tuple:
        """The shape of `slot` for a param of `shape` (default: the param's shape).
        A slot a param does not use (e.g. Adafactor's full second moment of a
        factored matrix) is shape (1,) and passes through unchanged."""
        return tuple(shape)

    def hyperparams(self) -> dict[str, float]:
        """All hyperparameters (lr included) as floats; booleans are 0.0/1.0."""
        return dict(self._hp)

    @property
    def t(self) -> int:
        """Number of updates applied so far."""
        return self._t

    @property
    def lr(self) -> float:
        """The learning rate (a schedule in train_step / Trainer sets it every step)."""
        return self._hp["lr"]

    @lr.setter
    def lr(self, value: float) -> None:
        self.set_lr(value)

    def set_lr(self, lr: float) -> None:
        """Set the learning rate; it persists and is saved by `state_dict`."""
        self._hp["lr"] = check_nonneg(type(self).__name__, "lr", lr)

    def describe(self) -> dict:
        """Everything the native compiler needs to emit this update."""
        return {"kind": self.kind, "slots": self.slots(),
                "hyperparams": self.hyperparams(), "t": self._t}

    def structure(self) -> tuple:
        """What decides the graph `update` emits (part of the compile cache key):
        the class and its code, kind, slots, and every hyperparameter but lr (of
        those in `numeric_hps` only whether it is zero).  Hyperparameters not
        listed in `numeric_hps` may be read as Python values by `update`."""
        cls = type(self)
        hp = tuple((k, (v != 0.0) if k in cls.numeric_hps else v)
                   for k, v in self._hp.items() if k != "lr")
        ident = _CLASS_IDENT.get(cls)
        if ident is None:  # once per class: Trainer.step asks every step
            ident = _CLASS_IDENT[cls] = (
                f"{cls.__module__}.{cls.__qualname__}",
                tuple(code_fingerprint(getattr(cls, m, None))
                      for m in ("update", "slot_shape", "_slots_for")))
        return (*ident, self.kind, tuple(self.slots()), hp)

    def scalars(self, t, lr) -> dict:
        """The per-step constants of update number `t` (>= 1) at learning rate
        `lr`, in float64 (Python floats), by name; `update` reads them as rank-0
        float32 tensors.  Default: {"lr": lr}."""
        return {"lr": lr}

    def step_scalars(self, t: int | None = None,
                     lr: float | None = None) -> dict[str, np.float32]:
        """The float32 constants of update number ``t`` (default: the next one)."""
        t = self._t + 1 if t is None else int(t)
        if t < 1:
            raise ValueError(f"{type(self).__name__}: update number t must be >= 1, got {t}")
        lr = self.lr if lr is None else check_nonneg(type(self).__name__, "lr", lr)
        return {k: _F32(v) for k, v in self.scalars(t, lr).items()}

    def scalar_recipe(self) -> dict[str, tuple]:
        """How a C train step computes each scalar from `t` (int64) and `lr`
        (float): ("lr",), ("const", float32 value) or ("expr", C double
        expression).  Found by calling `scalars` on symbolic t and lr, and
        checked against `step_scalars` for a few (t, lr)."""
        name = type(self).__name__
        T = Sym("((double)t)", lambda t, lr: t)
        LR = Sym("((double)lr)", lambda t, lr: lr)
        try:
            sym = self.scalars(T, LR)
        except TypeError as e:
            raise ValueError(f"{name}.scalars(t, lr) cannot be computed in C: {e}") from None
        out = {}
        for n, v in sym.items():
            if v is LR:
                out[n] = ("lr",)
            elif isinstance(v, Sym):
                out[n] = ("expr", v.c)
            else:
                out[n] = ("const", float(_F32(v)))
        for t, lr in ((1, 1e-3), (2, 0.5), (7, 0.1), (1000, 3.0)):
            want = self.step_scalars(t, lr)
            for n, v in sym.items():
                got = _F32(v.ev(t, lr) if isinstance(v, Sym) else v)
                if not (got == want[n] or (np.isnan(got) and np.isnan(want[n]))):
                    raise ValueError(f"{name}.scalars: {n!r} is not a function of t and lr "
                                     f"alone (at t={t}: {want[n]!r}, recipe {got!r})")
        return out

    def update(self, b, p, g, state: dict, s: dict):
        """Emit one param's update as graph ops; returns (new p, {slot: new value}).
        See the class docstring for the arguments and an example."""
        raise NotImplementedError(
            f"{type(self).__name__}: define update(b, p, g, state, s) returning "
            f"(new_param, {{slot: new_state}}) to use this optimizer (see the "
            f"rlxc.optim.Optimizer docstring)")

    def _update(self, p: np.ndarray, g: np.ndarray, st: dict[str, np.ndarray],
                s: dict[str, np.float32]) -> None:
        """NumPy update of one param in place.  The default runs `update` through
        rlxc's interpreter (float32, one rounding per op)."""
        names = list(st)
        key = (p.shape, tuple(st[k].shape for k in names), tuple(s), self.structure())
        fn = self._interp.get(key)
        if fn is None:
            fn = self._interp_update(p.shape, {k: st[k].shape for k in names}, list(s))
            self._interp[key] = fn
        vec = np.array([s[k] for k in s], _F32)
        outs = fn.run_on("interp", {"p": p, "g": g, "scalars": vec,
                                    **{f"state_{i}": st[k] for i, k in enumerate(names)}})
        p[...] = outs[0]
        for k, o in zip(names, outs[1:]):
            st[k][...] = o

    def _interp_update(self, shape, slot_shapes: dict, scalar_names: list):
        from .func import Func

        def build(sc):
            P, G = sc.input("p", shape), sc.input("g", shape)
            S = {k: sc.input(f"state_{i}", sh) for i, (k, sh) in enumerate(slot_shapes.items())}
            vec = sc.input("scalars", (len(scalar_names),))
            new_p, new_s = self.checked_update(sc, P, G, S, {n: vec[i] for i, n in
                                                            enumerate(scalar_names)})
            return [new_p] + [new_s[k] for k in slot_shapes]

        return Func("optimizer_update", build)

    def checked_update(self, b, p, g, state: dict, s: dict):
        """`update`, with its result checked: a float32 param of p's shape and
        every slot, shaped as its input."""
        name = type(self).__name__
        res = self.update(b, p, g, state, s)
        try:
            new_p, new_s = res
        except (TypeError, ValueError):
            raise TypeError(f"{name}.update must return (new_param, {{slot: state}}), got "
                            f"{type(res).__name__}") from None
        if getattr(new_p, "shape", None) != p.shape or getattr(new_p, "dtype", None) != "f32":
            raise ValueError(f"{name}.update returned a param of shape "
                             f"{getattr(new_p, 'shape', None)} "
                             f"{getattr(new_p, 'dtype', type(new_p).__name__)}, expected "
                             f"{p.shape} f32")
        if not isinstance(new_s, dict) or set(new_s) != set(state):
            raise ValueError(f"{name}.update must return a dict with the slots "
                             f"{sorted(state)}, got {sorted(new_s) if isinstance(new_s, dict) else new_s!r}")
        for k, v in new_s.items():
            if getattr(v, "shape", None) != state[k].shape or v.dtype != "f32":
                raise ValueError(f"{name}.update: slot {k!r} came back as "
                                 f"{getattr(v, 'shape', None)} {getattr(v, 'dtype', '?')}, "
                                 f"expected {state[k].shape} f32")
        return new_p, new_s

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={bool(v) if k == 'nesterov' else v!r}"
                         for k, v in self._hp.items())
        return f"{type(self).__name__}({args})"

    # -- the update ---------------------------------------------------------
    def step(self, params: Mapping[str, np.ndarray], grads: Mapping[str, np.ndarray],
             lr: float | None = None) -> None:
        """Apply one update in place to every param that has a grad.

        ``params`` maps names to float32 arrays (modified in place); ``grads``
        maps a subset of those names to same-shaped arrays (cast to float32).
        ``lr`` overrides the stored learning rate for this update only.
        Everything is checked before anything is modified.
        """
        owner = type(self).__name__
        if not isinstance(params, Mapping) or not isinstance(grads, Mapping):
            raise ValueError(f"{owner}.step: params and grads must be dicts of arrays")
        work = []
        for name, grad in grads.items():
            if name not in params:
                raise ValueError(f"{owner}.step: grad given for unknown param {name!r}")
            p = params[name]
            if not isinstance(p, np.ndarray) or p.dtype != np.float32:
                got = p.dtype if isinstance(p, np.ndarray) else type(p).__name__
                raise ValueError(
                    f"{owner}.step: param {name!r} must be a float32 numpy array "
                    f"(it is updated in place), got {got}")
            if not p.flags.writeable:
                raise ValueError(f"{owner}.step: param {name!r} is read-only")
            g = np.asarray(grad)
            if g.dtype.kind not in "fiu":
                raise ValueError(
                    f"{owner}.step: grad of {name!r} must be numeric, got {g.dtype}")
            if g.shape != p.shape:
                raise ValueError(
                    f"{owner}.step: param {name!r} has shape {p.shape}, "
                    f"its grad has shape {g.shape}")
            for slot, buf in self.state.get(name, {}).items():
                want = self.slot_shape(slot, p.shape)
                if buf.shape != want:
                    raise ValueError(
                        f"{owner}.step: param {name!r} has shape {p.shape}, its "
                        f"optimizer state {slot!r} has shape {buf.shape} (expected {want})")
            work.append((name, p, g.astype(_F32, copy=False)))
        scalars = self.step_scalars(self._t + 1, lr)
        self._t += 1
        for name, p, g in work:
            st = self.state.get(name)
            if st is None:
                st = {slot: np.zeros(self.slot_shape(slot, p.shape), _F32)
                      for slot in self.slots()}
                self.state[name] = st
            self._update(p, g, st, scalars)

    # -- state (de)serialization --------------------------------------------
    def state_dict(self) -> dict[str, np.ndarray]:
        """A flat, safetensors-ready snapshot (copies) of counter, hyperparams, slots."""
        out: dict[str, np.ndarray] = {
            "kind": np.frombuffer(self.kind.encode("ascii"), dtype=np.uint8).copy(),
            "t": np.array([self._t], dtype=np.int64),
        }
        for k, v in self._hp.items():
            out[f"hp.{k}"] = np.array([v], dtype=np.float64)
        for pname, st in self.state.items():
            for slot in self.slots():
                out[f"{slot}.{pname}"] = st[slot].copy()
        return out

    def load_state_dict(self, state: Mapping[str, np.ndarray],
                        params: Mapping[str, np.ndarray] | None = None) -> None:
        """Restore a ``state_dict()`` snapshot (replacing counter, hyperparams, slots).

        Checks the kind, the counter, the exact set of hyperparameters, that
        every param has every slot with one shape and float32 dtype, and, when
        ``params`` is given, that each param with state exists there with the
        same shape.  Nothing changes unless every check passes.
        """
        owner = f"{type(self).__name__}.load_state_dict"
        if not isinstance(state, Mapping):
            raise ValueError(f"{owner}: expected a dict of arrays, got {type(state).__name__}")
        for key in ("kind", "t"):
            if key not in state:
                raise ValueError(f"{owner}: missing entry {key!r}")
        kind_arr = np.asarray(state["kind"])
        kind = kind_arr.astype(np.uint8).tobytes().decode("ascii", "replace") \
            if kind_arr.dtype == np.uint8 else repr(kind_arr)
        if kind != self.kind:
            raise ValueError(f"{owner}: state is for optimizer kind {kind!r}, "
                             f"this is {self.kind!r}")
        t_arr = np.asarray(state["t"])
        if t_arr.shape != (1,) or t_arr.dtype.kind not in "iu" or int(t_arr[0]) < 0:
            raise ValueError(f"{owner}: 't' must be a non-negative integer array of "
                             f"shape (1,), got dtype {t_arr.dtype} shape {t_arr.shape}")

        hp_in = {k[3:]: v for k, v in state.items() if k.startswith("hp.")}
        missing = sorted(set(self._hp) - set(hp_in))
        extra = sorted(set(hp_in) - set(self._hp))
        if missing or extra:
            raise ValueError(f"{owner}: hyperparameters do not match {self.kind}: "
                             f"missing {missing}, unexpected {extra}")
        hp = {}
        for k, v in hp_in.items():
            v = np.asarray(v)
            if v.shape != (1,):
                raise ValueError(f"{owner}: 'hp.{k}' must have shape (1,), got {v.shape}")
            hp[k] = float(v[0])
        hp = self._validate_hp(hp)

        # The slot set can depend on hyperparameters (SGD momentum), so use the new ones.
        slots = type(self)._slots_for(hp)
        new_state: dict[str, dict[str, np.ndarray]] = {}
        for key, arr in state.items():
            if key in ("kind", "t") or key.startswith("hp."):
                continue
            slot, dot, pname = key.partition(".")
            if not dot or not pname or slot not in slots:
                raise ValueError(f"{owner}: unexpected entry {key!r} (slots of "
                                 f"{self.kind} with these hyperparameters: {slots})")
            arr = np.asarray(arr)
            if arr.dtype != np.float32:
                raise ValueError(f"{owner}: state {key!r} of param {pname!r} must be "
                                 f"float32, got {arr.dtype}")
            new_state.setdefault(pname, {})[slot] = arr.copy()
        for pname, st in new_state.items():
            lacking = [s for s in slots if s not in st]
            if lacking:
                raise ValueError(f"{owner}: param {pname!r} lacks state {lacking}")
            shapes = {st[s].shape for s in slots}
            uniform = type(self).slot_shape is Optimizer.slot_shape
            if uniform and len(shapes) != 1:
                raise ValueError(f"{owner}: state of param {pname!r} has mixed shapes "
                                 f"{ {s: st[s].shape for s in slots} }")
            if params is not None:
                if pname not in params:
                    raise ValueError(f"{owner}: state for unknown param {pname!r}")
                want = np.shape(params[pname])
                for s in slots:
                    if st[s].shape != self.slot_shape(s, want):
                        raise ValueError(f"{owner}: param {pname!r} has shape {want}, its "
                                         f"state {s!r} has shape {st[s].shape}")
        self._hp = hp
        self._t = int(t_arr[0])
        self.state = {p: {s: st[s] for s in slots} for p, st in new_state.items()}




class SGD(Optimizer):
    """SGD with optional (Nesterov) momentum and L2 weight decay."""

    kind = "sgd"
    numeric_hps = ("momentum", "weight_decay")

    def __init__(self, lr: float, momentum: float = 0.0, nesterov: bool = False,
                 weight_decay: float = 0.0):
        super().__init__(lr=lr, momentum=momentum, nesterov=nesterov,
                         weight_decay=weight_decay)

    @classmethod
    def _validate_hp(cls, hp: dict) -> dict[str, float]:
        out = {
            "lr": check_nonneg("SGD", "lr", hp["lr"]),
            "momentum": check_unit("SGD", "momentum", hp["momentum"]),
            "nesterov": 1.0 if hp["nesterov"] else 0.0,
            "weight_decay": check_nonneg("SGD", "weight_decay", hp["weight_decay"]),
        }
        if out["nesterov"] and out["momentum"] == 0.0:
            raise ValueError("SGD: nesterov=True needs momentum > 0")
        return out

    momentum = _hp_property("momentum", "momentum coefficient mu")
    weight_decay = _hp_property("weight_decay", "L2 coefficient added to the grad")
    nesterov = property(lambda self: bool(self._hp["nesterov"]))

    @classmethod
    def _slots_for(cls, hp):
        return ["v"] if hp["momentum"] != 0.0 else []

    def scalars(self, t, lr):
        return {"lr": lr, "mu": self._hp["momentum"], "wd": self._hp["weight_decay"]}

    def _update(self, p, g, st, s):
        d = g + s["wd"] * p if self._hp["weight_decay"] else g
        if "v" in st:
            v = st["v"]
            np.multiply(v, s["mu"], out=v)
            np.add(v, d, out=v)
            upd = d + s["mu"] * v if self._hp["nesterov"] else v
        else:
            upd = d
        np.subtract(p, s["lr"] * upd, out=p)

    def update(self, b, p, g, st, s):
        d = g + s["wd"] * p if self._hp["weight_decay"] else g
        out = {}
        if "v" in st:
            v = st["v"] * s["mu"]
            v = v + d
            out["v"] = v
            upd = d + s["mu"] * v if self._hp["nesterov"] else v
        else:
            upd = d
        return p - s["lr"] * upd, out


class Adam(Optimizer):
    """Adam with bias correction; weight decay is L2 folded into the gradient."""

    kind = "adam"
    _decoupled = False
    numeric_hps = ("beta1", "beta2", "eps", "weight_decay")

    def __init__(self, lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0):
        b1, b2 = check_betas(type(self).__name__, betas)
        super().__init__(lr=lr, beta1=b1, beta2=b2, eps=eps, weight_decay=weight_decay)

    @classmethod
    def _validate_hp(cls, hp: dict) -> dict[str, float]:
        name = cls.__name__
        return {
            "lr": check_nonneg(name, "lr", hp["lr"]),
            "beta1": check_unit(name, "beta1", hp["beta1"]),
            "beta2": check_unit(name, "beta2", hp["beta2"]),
            "eps": check_nonneg(name, "eps", hp["eps"]),
            "weight_decay": check_nonneg(name, "weight_decay", hp["weight_decay"]),
        }

    betas = property(lambda self: (self._hp["beta1"], self._hp["beta2"]))
    eps = _hp_property("eps", "added to sqrt(v_hat)")
    weight_decay = _hp_property("weight_decay", "weight-decay coefficient")

    @classmethod
    def _slots_for(cls, hp):
        return ["m", "v"]

    def scalars(self, t, lr):
        b1, b2 = self._hp["beta1"], self._hp["beta2"]
        return {"lr": lr, "b1": b1, "omb1": 1.0 - b1, "b2": b2, "omb2": 1.0 - b2,
                "bc1": 1.0 - b1 ** t, "bc2": 1.0 - b2 ** t,
                "eps": self._hp["eps"], "wd": self._hp["weight_decay"]}

    def _update(self, p, g, st, s):
        wd = self._hp["weight_decay"]
        if wd and not self._decoupled:
            g = g + s["wd"] * p
        m, v = st["m"], st["v"]
        np.multiply(m, s["b1"], out=m)
        np.add(m, s["omb1"] * g, out=m)
        np.multiply(v, s["b2"], out=v)
        np.add(v, s["omb2"] * (g * g), out=v)
        m_hat = m / s["bc1"]
        v_hat = v / s["bc2"]
        u = m_hat / (np.sqrt(v_hat) + s["eps"])
        if wd and self._decoupled:
            u = u + s["wd"] * p
        np.subtract(p, s["lr"] * u, out=p)

    def update(self, b, p, g, st, s):
        wd = self._hp["weight_decay"]
        if wd and not self._decoupled:
            g = g + s["wd"] * p
        m = st["m"] * s["b1"]
        m = m + s["omb1"] * g
        v = st["v"] * s["b2"]
        v = v + s["omb2"] * (g * g)
        m_hat = m / s["bc1"]
        v_hat = v / s["bc2"]
        u = m_hat / (v_hat.sqrt() + s["eps"])
        if wd and self._decoupled:
            u = u + s["wd"] * p
        return p - s["lr"] * u, {"m": m, "v": v}


class AdamW(Adam):
    """Adam with decoupled weight decay (default 0.01)."""

    kind = "adamw"
    _decoupled = True

    def __init__(self, lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01):
        super().__init__(lr, betas=betas, eps=eps, weight_decay=weight_decay)


class Lion(Optimizer):
    """Lion: sign of an interpolated momentum, decoupled weight decay."""

    kind = "lion"
    numeric_hps = ("beta1", "beta2", "weight_decay")

    def __init__(self, lr: float, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0):
        b1, b2 = check_betas("Lion", betas)
        super().__init__(lr=lr, beta1=b1, beta2=b2, weight_decay=weight_decay)

    @classmethod
    def _validate_hp(cls, hp: dict) -> dict[str, float]:
        return {
            "lr": check_nonneg("Lion", "lr", hp["lr"]),
            "beta1": check_unit("Lion", "beta1", hp["beta1"]),
            "beta2": check_unit("Lion", "beta2", hp["beta2"]),
            "weight_decay": check_nonneg("Lion", "weight_decay", hp["weight_decay"]),
        }

    betas = property(lambda self: (self._hp["beta1"], self._hp["beta2"]))
    weight_decay = _hp_property("weight_decay", "decoupled weight-decay coefficient")

    @classmethod
    def _slots_for(cls, hp):
        return ["m"]

    def scalars(self, t, lr):
        b1, b2 = self._hp["beta1"], self._hp["beta2"]
        return {"lr": lr, "b1": b1, "omb1": 1.0 - b1, "b2": b2, "omb2": 1.0 - b2,
                "wd": self._hp["weight_decay"]}

    def _update(self, p, g, st, s):
        m = st["m"]
        u = np.sign(s["b1"] * m + s["omb1"] * g)
        if self._hp["weight_decay"]:
            u = u + s["wd"] * p
        np.subtract(p, s["lr"] * u, out=p)
        np.multiply(m, s["b2"], out=m)
        np.add(m, s["omb2"] * g, out=m)

    def update(self, b, p, g, st, s):
        m = st["m"]
        u = (s["b1"] * m + s["omb1"] * g).sign()
        if self._hp["weight_decay"]:
            u = u + s["wd"] * p
        new_p = p - s["lr"] * u
        m = m * s["b2"]
        m = m + s["omb2"] * g
        return new_p, {"m": m}


from .optim_more import LAMB, Adafactor, Muon, NAdamW, RAdam  # noqa: E402  (they subclass Optimizer)

BUILTINS = {c.kind: c for c in (SGD, Adam, AdamW, Lion, NAdamW, RAdam, LAMB, Adafactor, Muon)}

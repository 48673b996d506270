"""Learning-rate schedules: a pure function from step number to learning rate.

Purpose
-------
A schedule is a small immutable value (a kind plus its numeric parameters)
with ``lr_at(step)``; a training loop passes ``sched.lr_at(opt.t)`` as the
``lr`` override of ``Optimizer.step``.  Because it is plain data (``kind`` and
``params``), the native compiler can also evaluate it on the host before each
compiled step.  Steps count from 0; values are computed in float64 and
returned as Python floats.

Formulas (same as RLX)
----------------------
* constant(lr):                       lr
* step(base, step_size, gamma):       base * gamma ** (step // step_size)
* cosine(base, min, total):           min + (base - min) * 0.5 *
                                      (1 + cos(pi * min(step, total) / total)),
                                      or min when total == 0
* warmup(base, warmup):               base * (step + 1) / warmup while
                                      step < warmup, then base
* warmup_cosine(base, min, warmup, total):
                                      the warmup ramp for step < warmup, then
                                      cosine(base, min, total - warmup) at
                                      step - warmup
"""
from __future__ import annotations

import math
from numbers import Integral, Real
from types import MappingProxyType

__all__ = ["LrSchedule"]


def _check_rate(kind: str, name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"LrSchedule.{kind}: {name} must be a number, got {value!r}")
    value = float(value)
    if not (math.isfinite(value) and value >= 0.0):
        raise ValueError(
            f"LrSchedule.{kind}: {name} must be finite and >= 0, got {value!r}")
    return value


def _check_count(kind: str, name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"LrSchedule.{kind}: {name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(
            f"LrSchedule.{kind}: {name} must be >= {minimum}, got {value!r}")
    return int(value)


class LrSchedule:
    """A learning-rate schedule; build one with the classmethod constructors.

    ``kind`` is one of "constant", "step", "cosine", "warmup",
    "warmup_cosine"; ``params`` is a read-only mapping of its parameters.
    """

    __slots__ = ("kind", "params")

    def __init__(self, kind: str, params: dict):
        # Private: use the constructors, which validate their arguments.
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "params", MappingProxyType(dict(params)))

    def __setattr__(self, name, value):
        raise AttributeError("LrSchedule is immutable")

    # -- constructors ------------------------------------------------------
    @classmethod
    def constant(cls, lr: float) -> "LrSchedule":
        return cls("constant", {"lr": _check_rate("constant", "lr", lr)})

    @classmethod
    def step(cls, base: float, step_size: int, gamma: float) -> "LrSchedule":
        """Multiply by ``gamma`` every ``step_size`` steps."""
        base = _check_rate("step", "base", base)
        step_size = _check_count("step", "step_size", step_size, 1)
        gamma = _check_rate("step", "gamma", gamma)
        return cls("step", {"base": base, "step_size": step_size, "gamma": gamma})

    @classmethod
    def cosine(cls, base: float, min: float, total: int) -> "LrSchedule":
        """Half-cosine from ``base`` at step 0 to ``min`` at step ``total``."""
        base = _check_rate("cosine", "base", base)
        min_lr = _check_rate("cosine", "min", min)
        total = _check_count("cosine", "total", total, 0)
        return cls("cosine", {"base": base, "min": min_lr, "total": total})

    @classmethod
    def warmup(cls, base: float, warmup: int) -> "LrSchedule":
        """Linear ramp ``base*(step+1)/warmup`` for ``warmup`` steps, then base."""
        base = _check_rate("warmup", "base", base)
        warmup = _check_count("warmup", "warmup", warmup, 0)
        return cls("warmup", {"base": base, "warmup": warmup})

    @classmethod
    def warmup_cosine(cls, base: float, min: float, warmup: int,
                      total: int) -> "LrSchedule":
        """Linear warmup, then cosine decay to ``min`` at step ``total``."""
        base = _check_rate("warmup_cosine", "base", base)
        min_lr = _check_rate("warmup_cosine", "min", min)
        warmup = _check_count("warmup_cosine", "warmup", warmup, 0)
        total = _check_count("warmup_cosine", "total", total, 0)
        if warmup > total:
            raise ValueError(
                f"LrSchedule.warmup_cosine: warmup ({warmup}) must be <= total ({total})")
        return cls("warmup_cosine",
                   {"base": base, "min": min_lr, "warmup": warmup, "total": total})

    # -- evaluation --------------------------------------------------------
    def lr_at(self, step: int) -> float:
        """The learning rate for 0-based ``step``."""
        if isinstance(step, bool) or not isinstance(step, Integral):
            raise TypeError(f"{self!r}.lr_at: step must be an integer, got {step!r}")
        if step < 0:
            raise ValueError(f"{self!r}.lr_at: step must be >= 0, got {step}")
        step = int(step)
        p = self.params
        if self.kind == "constant":
            return p["lr"]
        if self.kind == "step":
            return p["base"] * p["gamma"] ** (step // p["step_size"])
        if self.kind == "cosine":
            return _cosine(p["base"], p["min"], p["total"], step)
        if self.kind == "warmup":
            return _warmup(p["base"], p["warmup"], step)
        if self.kind == "warmup_cosine":
            if step < p["warmup"]:
                return _warmup(p["base"], p["warmup"], step)
            return _cosine(p["base"], p["min"], p["total"] - p["warmup"],
                           step - p["warmup"])
        raise AssertionError(f"unknown LrSchedule kind {self.kind!r}")

    __call__ = lr_at

    def __reduce__(self):
        return (LrSchedule, (self.kind, dict(self.params)))

    def __eq__(self, other) -> bool:
        if not isinstance(other, LrSchedule):
            return NotImplemented
        return self.kind == other.kind and dict(self.params) == dict(other.params)

    def __hash__(self) -> int:
        return hash((self.kind, tuple(self.params.items())))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"LrSchedule.{self.kind}({args})"


def _cosine(base: float, min_lr: float, total: int, step: int) -> float:
    if total == 0:
        return min_lr
    t = step if step < total else total
    return min_lr + (base - min_lr) * 0.5 * (1.0 + math.cos(math.pi * t / total))


def _warmup(base: float, warmup: int, step: int) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    return base

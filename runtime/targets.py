"""The runtime half of the backend registry: which targets compiled code can be for.

    name ("cpu", "cuda", a cross target such as "aarch64-linux-gnu")
      └─ Target(name, family, triple, machines)
           family "cpu":   a shared library with rlxc's C ABI
                           (runtime/cpu.py for the JIT cache, runtime/loader.py for artifacts)
           family "cuda":  runtime/cuda.py's container, run through the CUDA driver
           triple:         the LLVM target triple the code is for ("" = this host)
           machines:       platform.machine() values that can run it (() = this host)

Loaders dispatch on `family` through their own tables (runtime/loader.py
`_IMPLS`), never on a target's name, so a new CPU target (another LLVM triple
or CPU name) is one `register_target` call here plus one `register` on the
compiler side (rlxc/registry.py, which adds compile, --emit stages and the
artifact writer under the same name).  A target built for another machine is
refused at load time with a clear error instead of being handed to dlopen.

NumPy and the standard library only: importing this never imports the compiler.
"""
from __future__ import annotations

import platform
from dataclasses import dataclass

from .errors import RlxError

FAMILIES = ("cpu", "cuda")


class TargetUnavailable(RlxError, RuntimeError):
    """Code for this target cannot run in this process (another machine, no GPU)."""


@dataclass(frozen=True)
class Target:
    """What the runtime needs to know to load code built for `name`."""

    name: str
    family: str                 # "cpu" | "cuda": which runtime code loads it
    triple: str = ""            # LLVM target triple ("" = the host's)
    machines: tuple = ()        # platform.machine() values that run it (() = the host)
    description: str = ""

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"target {self.name!r}: unknown family {self.family!r}; "
                             f"valid: {list(FAMILIES)}")

    def unavailable_reason(self) -> str | None:
        """Why code for this target cannot run in this process (None when it can)."""
        if self.machines and host_machine() not in self.machines:
            return (f"target {self.name!r} builds code for {'/'.join(self.machines)}, "
                    f"this machine is {host_machine()}")
        if self.family == "cuda":
            from . import cuda

            return cuda.unavailable_reason()
        return None

    def available(self) -> bool:
        return self.unavailable_reason() is None

    def require(self) -> None:
        """Raise TargetUnavailable (with the reason) unless code for it runs here."""
        why = self.unavailable_reason()
        if why:
            raise TargetUnavailable(f"cannot run {self.name!r} code here: {why}")


_TARGETS: dict[str, Target] = {}


def host_machine() -> str:
    return platform.machine().lower()


def register_target(t: Target) -> Target:
    """Add (or replace) a target; returns it."""
    _TARGETS[t.name] = t
    return t


def unregister_target(name: str) -> None:
    _TARGETS.pop(name, None)


def target(name: str) -> Target:
    """The registered target `name`, or a ValueError listing the valid ones."""
    t = _TARGETS.get(name)
    if t is None:
        raise ValueError(f"unknown target {name!r}; valid: {target_names()}")
    return t


def target_names() -> list[str]:
    return list(_TARGETS)


register_target(Target("cpu", "cpu", description="this host's CPU: a shared library with "
                                                 "the C ABI"))
register_target(Target("cuda", "cuda", description="NVIDIA GPUs: PTX/cubin run through the "
                                                   "CUDA driver"))
register_target(Target("aarch64-linux-gnu", "cpu", "aarch64-unknown-linux-gnu",
                       ("aarch64", "arm64"), "64-bit ARM Linux (cross-compiled; NEON)"))
register_target(Target("x86_64-linux-gnu", "cpu", "x86_64-unknown-linux-gnu",
                       ("x86_64", "amd64"), "x86-64 Linux (cross-compiled from another host)"))

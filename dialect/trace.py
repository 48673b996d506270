"""The light trace: what the tracer records before any IR exists (no xDSL).

    GraphScope / Tensor (rlxc/tensor.py)
          │ args, ops with inferred types (dialect/shapes.py), constants, calls
          ▼
    Trace ──digest()──> sha256 that determines the module (a cache key, no IR built)
          │ module.from_trace (dialect/module.py), on first use of Func.module
          ▼
    builtin.module { func.func @name(...) { rlx ops } }

A Trace is a flat list of events in call order: argument declarations and op
nodes.  Values are numbered in creation order.  A node holds its op name, its
operands, its parameters as the IR stores them (SHAPES[op].canonical), its
result types and, for a constant, its (shape, dtype, bytes) (splats stored
once), for an inlined call, the callee's module and IR hash (for a Func, its
`ir_hash` method, called only when the digest is taken: hashing prints the
IR).  `from_trace` replays the events into an xDSL block in the same order
the eager tracer used to build it, so the module (and its text) is the same.

`digest()` hashes every event: names, kinds, shapes, dtypes, op names,
operand numbers, parameters, result types, constant bytes, the callee's IR
hash and the outputs.  Together with the sources of the tracer and the
dialect (rlxc/train.py's fingerprint) and the xDSL version, that decides the
module, so a digest can stand for the IR in a cache key.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from .shapes import TType

KINDS = ("input", "param")
FORMAT = b"rlx-trace-1"


@dataclass(frozen=True)
class Arg:
    """One argument of a traced function."""

    name: str
    kind: str  # "input" | "param"
    shape: tuple
    dtype: str = "f32"


class Value:
    """A value of the trace: its type and its creation number."""

    __slots__ = ("type", "index", "trace")

    def __init__(self, type: TType, index: int, trace=None):
        self.type = type
        self.index = index
        self.trace = trace    # the Trace that made it: operands never cross traces

    def __repr__(self):
        return f"Value(%{self.index}: {self.type})"


class Node:
    """One op: name, operand values, canonical parameters, result values, extra data.

    `data` is (shape, dtype, bytes) for rlx.constant and (callee func.func, the
    callee's output SSA values for `results`, callee IR hash) for a call."""

    __slots__ = ("op", "operands", "params", "results", "data")

    def __init__(self, op, operands, params, results, data=None):
        self.op, self.operands, self.params, self.results, self.data = \
            op, operands, params, results, data


class Trace:
    """Events of one traced function; `finish` names it and sets its outputs."""

    def __init__(self):
        self.events: list = []        # Arg (with its Value in arg_values) or Node
        self.args: list[Arg] = []
        self.arg_values: list[Value] = []
        self.name: str | None = None
        self.outputs: list[Value] = []
        self._count = 0
        self._digest = None
        self.inner: list = []         # control-flow bodies being traced (dialect/control_trace.py)

    def _value(self, t: TType) -> Value:
        v = Value(t, self._count, self)
        self._count += 1
        return v

    def _open(self, what: str) -> None:
        if self.name is not None:
            raise RuntimeError(f"{what}: the function {self.name!r} is already built from this "
                               f"GraphScope; trace further ops inside its build function")

    def add_arg(self, a: Arg) -> Value:
        self._open(f"argument {a.name!r}")
        if self.inner:
            return self.inner[-1].add_arg(a)
        v = self._value(TType(tuple(a.shape), a.dtype))
        self.args.append(a)
        self.arg_values.append(v)
        self.events.append(a)
        return v

    def add(self, op: str, operands, params: dict, result_types, data=None) -> list[Value]:
        self._open(op)
        if self.inner:   # inside rlxc.scan/while_loop/cond: record in the innermost body
            return self.inner[-1].add(op, operands, params, result_types, data)
        for i, v in enumerate(operands):
            if v.trace is not self and getattr(v.trace, "parent", None) is not None:
                raise ValueError(f"{op}: operand #{i} was computed inside a scan/while_loop/"
                                 f"cond body that has finished; return it from the body")
            if v.trace is not self:
                raise ValueError(f"{op}: operand #{i} is a Tensor of another traced function "
                                 f"(another GraphScope); pass it in as an input instead")
        res = [self._value(t) for t in result_types]
        self.events.append(Node(op, list(operands), params, res, data))
        return res

    def finish(self, name: str, outputs) -> "Trace":
        for i, v in enumerate(outputs):
            if v.trace is not self:
                raise ValueError(f"Func {name!r}: output #{i} comes from another scope")
        self.name = name
        self.outputs = list(outputs)
        return self

    def digest(self) -> str:
        """sha256 of every event and the outputs (see the module docstring)."""
        if self._digest is None:
            h = hashlib.sha256(FORMAT + b"\0" + self.name.encode() + b"\0")
            for e in self.events:
                if isinstance(e, Arg):
                    h.update(repr(("arg", e.name, e.kind, tuple(e.shape), e.dtype)).encode())
                    continue
                h.update(repr((e.op, [v.index for v in e.operands], sorted(e.params.items()),
                               [(v.index, tuple(v.type)) for v in e.results])).encode())
                if e.op == "rlx.constant":
                    shape, dtype, raw = e.data
                    h.update(repr((shape, dtype, len(raw))).encode() + b"\0" + raw)
                elif e.op == "call":   # the callee's IR hash (or a method giving it)
                    ir = e.data[2]
                    h.update(b"\0callee\0" + (ir() if callable(ir) else ir).encode())
                elif e.op in ("rlx.scan", "rlx.while", "rlx.if"):
                    from .control_trace import region_digest
                    region_digest(h, e)
                h.update(b"\n")
            h.update(repr(("out", [v.index for v in self.outputs])).encode())
            self._digest = h.hexdigest()
        return self._digest

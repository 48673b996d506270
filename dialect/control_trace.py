"""Region bodies in the light trace (no xDSL): what `rlxc.scan/while_loop/cond` record.

    root Trace ──add()──> while a body is being traced, redirected to the innermost Body
        │ inner = [Body, Body, ...]   (nesting: a scan body holding a cond)
        ▼
    Body(Trace): block arguments (carries, slices, operands) + captures
        │ an operand from an enclosing trace becomes a new block argument (a capture);
        │ the enclosing region op passes the outer value as an explicit operand
        ▼
    Node("rlx.scan" | "rlx.while" | "rlx.if", operands, params, results, data=(Body, ...))

Regions are isolated from above (MLIR's IsolatedFromAbove): a body refers only
to its block arguments, so every transform can treat a body as a function of
its arguments.  `Body.localize(v)` is the capture: a value of an enclosing
trace is first localized in the parent body (so nested regions thread it
through each level), then given a block argument here, once per value.
"""
from __future__ import annotations

import hashlib

from .trace import Trace, Value

REGION_OPS = ("rlx.scan", "rlx.while", "rlx.if")


class Body(Trace):
    """The trace of one region: block arguments, captured outer values, ops, yields."""

    def __init__(self, parent: Trace):
        super().__init__()
        self.parent = parent
        self.block_args: list[Value] = []   # in region-argument order
        self.captures: list[Value] = []     # outer values (of `parent`), one per capture arg
        self.capture_args: list[Value] = []
        self._cap: dict = {}

    def add_block_arg(self, t) -> Value:
        v = self._value(t)
        self.block_args.append(v)
        return v

    def localize(self, v: Value) -> Value:
        """`v` as a value of this body: itself, or the block argument capturing it."""
        if v.trace is self:
            return v
        hit = self._cap.get(id(v))
        if hit is not None:
            return hit[1]
        if isinstance(self.parent, Body):
            outer = self.parent.localize(v)
        elif v.trace is self.parent:
            outer = v
        else:
            raise ValueError("a Tensor from a finished control-flow body (or another traced "
                             "function) is used here; return it from the body instead")
        arg = self.add_block_arg(outer.type)
        self.captures.append(outer)
        self.capture_args.append(arg)
        self._cap[id(v)] = (v, arg)
        return arg

    def add(self, op, operands, params, result_types, data=None):
        return Trace.add(self, op, [self.localize(v) for v in operands], params, result_types,
                         data)

    def add_arg(self, a):
        raise ValueError(f"input/param {a.name!r} declared inside a control-flow body; "
                         "declare it before the scan/while_loop/cond and capture it")

    def digest(self) -> str:
        if self._digest is None:
            base = Trace.digest(self)
            h = hashlib.sha256(b"rlx-body-1\0" + base.encode())
            h.update(repr([(a.index, tuple(a.type)) for a in self.block_args]).encode())
            self._digest = h.hexdigest()
        return self._digest


def region_digest(h, node) -> None:
    """Hash the bodies of a region node into `h` (Trace.digest calls this)."""
    for body in node.data:
        h.update(b"\0region\0" + body.digest().encode())

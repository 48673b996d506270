"""An elementwise map with sin, cos or tan as an explicit vector loop (not the loop vectorizer).

    for v in [start, stop): out[off(v)] = e(v)          e contains sin/cos/tan (f32 or f64)
          │ map_loop
          ▼
    for v in [start, vend) step L:  out[off(v) .. +L] = e(<L x T> of v .. v+L-1)
    for v in [vend, stop):          the scalar loop (the loop vectorizer takes it as usual)

L is two vector registers of T (16 floats or 8 doubles on AVX2, twice that on AVX-512): two
independent chains per iteration.  Why: the argument reduction of sin/cos/tan has a rare
block for |x| >= 2^14 (f32) or 2^19 (f64) (Payne-Hanek, mathlib.if_any) that runs only when
some lane needs it, a uniform branch.  The loop vectorizer cannot keep that branch: it
if-converts it, so every element pays for the 64-bit integer reduction (f32, 1M elements,
Zen 3: 3.36 ms vectorized that way against 1.00 ms for explicit vectors and NumPy's 1.74 ms),
and for float64, whose rare block reads a table of 2/pi's bits (a gather), the AVX2 cost
model does not vectorize the loop at all (11.2 ms scalar against 2.9 ms, NumPy 12.6 ms).

Applies to an innermost loop whose body is one plain Store (no combine) of dtype T in {f32,
f64}, contiguous along the loop (offset coefficient 1, linear in v), whose expression
contains one of UNIFORM_BRANCH (or a float32 pow that is exp(y*log|x|) in float64:
scalar.pow_exp_log_path; the loop vectorizer ran it one register per iteration, one long
dependency chain: x**y over 1M floats, Zen 3, 1 thread, 6.9 ms against 5.5 ms with two
registers, 6.1 with four) and whose every node is T: loads contiguous along the loop
or invariant in it, constants, ops on T with T operands.  A load of the stored buffer must
read the very element it stores (an in-place map), so vector iterations read nothing a
previous one wrote.
"""
from __future__ import annotations

import llvmlite.ir as ir

from rlxc.lowering.cpu import indexing as ix
from rlxc.lowering.cpu.loops import Const, For, Load, Op, Store, walk_expr
from rlxc.lowering.cpu.schedule import coeff_along, linear_in
from rlxc.lowering.shared.mathlib import UNIFORM_BRANCH
from rlxc.lowering.shared.scalar import pow_exp_log_path

REGISTERS = 2       # vector registers per iteration (independent chains)


def applies(s: For, rules=None) -> str | None:
    """The element dtype of `s` if map_loop emits it (under the scalar rule table `rules`),
    else None."""
    if len(s.body) != 1 or not isinstance(s.body[0], Store) or s.body[0].combine:
        return None
    st, v = s.body[0], s.var
    dt = st.buf.dtype
    if dt not in ("f32", "f64") or coeff_along(st.off, v) != 1 or not linear_in(st.off, v):
        return None
    branchy = False
    for x in walk_expr(st.value):
        if isinstance(x, Load):
            c = coeff_along(x.off, v)
            if x.buf.dtype != dt or not linear_in(x.off, v) or c not in (0, 1):
                return None
            if x.buf is st.buf and ix.of(x.off) != ix.of(st.off):
                return None
        elif isinstance(x, Op):
            if x.dtype != dt or any(a.dtype != dt for a in x.args):
                return None
            branchy = branchy or x.op in UNIFORM_BRANCH or (x.op == "pow" and pow_exp_log_path(
                dt, x.args[1].value if isinstance(x.args[1], Const) else None, rules))
        elif not (isinstance(x, Const) and x.dtype == dt):
            return None
    return dt if branchy else None


def map_loop(body, b: ir.IRBuilder, s: For, vars_, lohi=None) -> None:
    """Emit `s` (applies(s)) for `body` (a codegen.Body) as described in the header."""
    st, v = s.body[0], s.var
    per_reg = body.lanes if st.buf.dtype == "f32" else body.lanes // 2
    lanes = per_reg * REGISTERS
    start, stop = body.bounds(b, s, vars_, lohi)
    vend = body.vector_end(b, start, stop, lanes)

    def store(b, inner):
        val = body.vexpr(b, st.value, inner, v, {}, lanes)
        p = b.gep(body.ptrs[id(st.buf)], [body.index(b, st.off, inner)], inbounds=True)
        b.store(val, b.bitcast(p, val.type.as_pointer()), align=4 if st.buf.dtype == "f32" else 8)
    body.loop(b, s, vars_, lohi=(start, vend), body_fn=store, step=lanes, tag="m")
    body.loop(b, s, vars_, lohi=(vend, stop))

"""An elementwise map with a transcendental as an explicit vector loop (not the loop vectorizer).

    for v in [start, stop): out[off(v)] = e(v)          e contains a mathlib function
          │ map_loop                                      (exp, tanh, gelu, sin, ...; f32 or
          ▼                                               f64) or a float32 pow via exp/log
    for v in [start, vend) step L:  out[off(v) .. +L] = e(<L x T> of v .. v+L-1)
    for v in [vend, stop):          the scalar loop (the loop vectorizer takes it as usual)

L is REGISTERS[T] vector registers of T (float32: 4, 32 floats on AVX2; float64: 2, 8
doubles; twice that on AVX-512; a map with a pow: 2): independent chains per iteration.  Why:
- sin/cos/tan (UNIFORM_BRANCH): the argument reduction has a rare block for |x| >= 2^14
  (f32) or 2^19 (f64) (Payne-Hanek, mathlib.if_any) that runs only when some lane needs it,
  a uniform branch.  The loop vectorizer cannot keep that branch: it if-converts it, so every
  element pays for the 64-bit integer reduction (f32, 1M elements, Zen 3: 3.36 ms vectorized
  that way against 1.00 ms for explicit vectors and NumPy's 1.74 ms), and for float64, whose
  rare block reads a table of 2/pi's bits (a gather), the AVX2 cost model does not vectorize
  the loop at all (11.2 ms scalar against 2.9 ms, NumPy 12.6 ms).
- every other mathlib kernel is one long dependency chain per vector (polynomials, an exp,
  a division), and the loop vectorizer runs one vector per iteration (no interleave at this
  size), so the core waits on the chain's latency.  Two chains per iteration, 64K elements,
  1 thread, in-process alternation (Zen 3, native / x86-64-v3 builds): float32 exp 0.86-0.89,
  tanh 0.83-0.90, silu 0.85-0.93, gelu 0.91-0.97, gelu_tanh 0.89, erf 0.82-0.87, log
  0.88-0.89, softplus 0.78-0.79, expm1 0.80-0.83, sigmoid, asin, log1p 0.96-1.02 of the
  loop vectorizer's time; float64 0.62 (softplus) to 1.02 (asin).  None slower beyond noise.
- the float32 pow of exp(y*log|x|) in float64 (scalar.pow_exp_log_path): x**y over 1M floats
  6.9 ms with the loop vectorizer, 5.5 ms with two registers (6.1 with four).
- float32, four chains instead of two (Zen 4, 1M elements, 1 thread, benchmarks/bench_math.py;
  x86-64-v3 / AVX-512 builds): gelu 1798 -> 1627 / 1182 -> 1045 us, erf 1427 -> 1347 /
  1011 -> 874, exp 393 -> 367 / 260 -> 246, silu 446 -> 404 / 320 -> 308, log 677 -> 601 /
  459 -> 422, tanh and sigmoid 1-5% faster; at 64K and 4K elements the same or better.
  float64 stays at two: exp gained 10-14% with four but log lost 9-12% and tanh and gelu
  moved within noise; the float32 pow too (-8% native, +5% x86-64-v3).

Applies to an innermost loop whose body is one plain Store (no combine) of dtype T in {f32,
f64}, contiguous along the loop (offset coefficient 1, linear in v), whose expression
contains one of CHAINED (or such a pow) and whose every node is T: loads contiguous along the
loop or invariant in it, constants, ops on T with T operands.  A load of the stored buffer
must read the very element it stores (an in-place map), so vector iterations read nothing a
previous one wrote.
"""
from __future__ import annotations

import llvmlite.ir as ir

from rlxc.lowering.cpu import indexing as ix
from rlxc.lowering.cpu.loops import Const, For, Load, Op, Store, walk_expr
from rlxc.lowering.cpu.schedule import coeff_along, linear_in
from rlxc.dialect.shapes import SHAPES
from rlxc.lowering.shared.scalar import pow_exp_log_path

REGISTERS = {"f32": 4, "f64": 2}   # vector registers per iteration (independent chains)
POW_REGISTERS = 2                   # ... for a map with a pow (x**y through exp/log in
                                    # float64 among them: measured best at two)
# the ops whose rows are mathlib kernels (their `math` property), sin/cos/tan included
CHAINED = frozenset(name[len("rlx."):] for name, sh in SHAPES.items() if sh.math)


def applies(s: For, rules=None) -> str | None:
    """The element dtype of `s` if map_loop emits it (under the scalar rule table `rules`),
    else None."""
    if len(s.body) != 1 or not isinstance(s.body[0], Store) or s.body[0].combine:
        return None
    st, v = s.body[0], s.var
    dt = st.buf.dtype
    if dt not in ("f32", "f64") or coeff_along(st.off, v) != 1 or not linear_in(st.off, v):
        return None
    chained = False
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
            chained = chained or x.op in CHAINED or (x.op == "pow" and pow_exp_log_path(
                dt, x.args[1].value if isinstance(x.args[1], Const) else None, rules))
        elif not (isinstance(x, Const) and x.dtype == dt):
            return None
    return dt if chained else None


def map_loop(body, b: ir.IRBuilder, s: For, vars_, lohi=None) -> None:
    """Emit `s` (applies(s)) for `body` (a codegen.Body) as described in the header."""
    st, v = s.body[0], s.var
    per_reg = body.lanes if st.buf.dtype == "f32" else body.lanes // 2
    pow_ = any(isinstance(x, Op) and x.op == "pow" for x in walk_expr(st.value))
    lanes = per_reg * (POW_REGISTERS if pow_ else REGISTERS[st.buf.dtype])
    start, stop = body.bounds(b, s, vars_, lohi)
    vend = body.vector_end(b, start, stop, lanes)

    def store(b, inner):
        val = body.vexpr(b, st.value, inner, v, {}, lanes)
        p = b.gep(body.ptrs[id(st.buf)], [body.index(b, st.off, inner)], inbounds=True)
        b.store(val, b.bitcast(p, val.type.as_pointer()), align=4 if st.buf.dtype == "f32" else 8)
    body.loop(b, s, vars_, lohi=(start, vend), body_fn=store, step=lanes, tag="m")
    body.loop(b, s, vars_, lohi=(vend, stop))

"""A float sum of a ratio-form product as an explicit vector loop (W1 of benchmarks/compare.py).

    for v in [start, stop):                      vend = start + (n / UL)*UL
        acc = add(acc, mul(tanh(e1), sigmoid(e2)))
          │ ratio_sum_loop
          ▼
    one <UL x float> partial sum (L = lanes of one vector register, U = lut.unroll or UNROLL),
    each iteration adding q(v .. v+UL-1) (mathlib_ratio.fused_parts with the target's
    instructions, lut_for: one division per register); the backend splits every op into U
    adjacent register ops: U chains interleaved instruction by instruction;
    then acc += hsum(part) * (scale, or left to the sum's reads: Body.acc_scale);
    then the scalar loop over [vend, stop) (the loop vectorizer takes it as usual)

Why not the loop vectorizer: the fused body is ~60 vector instructions with 16 live constants;
on AVX2 (16 ymm registers) its register-pressure estimate flips between one and two
interleaved vectors per iteration on small changes of the body (one FMA replaced by an integer
and a float add), and with one the loop ran 5-10% slower (a single dependency chain of ~90
cycles per iteration fills the scheduler).  Here UNROLL independent chains are interleaved
in program order on every target (two whole chains one after the other measured as slow as
one).  W1, 1 thread, CPU time against the loop vectorizer's loop: UNROLL 1: 0.98, 2: 0.88,
4: 0.83, 8: 0.89 (--cpu znver3, with the tables); native AVX-512: 4: 0.96.  On AVX-512
(32 zmm) with Avx512Ops one register per iteration is fastest: 4 chains spilled and copied
registers (23 register moves per iteration) for 2 ports that are busy anyway (0.89-0.90x
the CPU time of the previous table-free 4-chain loop, against 0.92-0.93x with 4 chains).

Applies to an innermost loop whose body is one f32 `add` update of a product of two
elementwise ratio functions that qualify (mathlib_ratio.RATIO/qualifies), whose leaves are f32
loads contiguous along the loop (coefficient 1) or invariant in it, and constants, every
operation on f32 (what `Body.vexpr` emits on vectors).
"""
from __future__ import annotations

import llvmlite.ir as ir

from rlxc.lowering.cpu import indexing as ix
from rlxc.lowering.cpu.loops import Const, For, Load, Op, Update, walk_expr
from rlxc.lowering.shared.mathlib_ratio import RATIO, fused_parts, qualifies
from rlxc.lowering.shared.scalar import F32, I32, I64, const

UNROLL = 4      # vector registers per partial sum (independent chains per iteration; AVX-512:
                # Avx512Ops.unroll)


def applies(s: For) -> bool:
    """Is `s` an innermost loop `acc += f(a) * g(b)` that ratio_sum_loop emits?"""
    if len(s.body) != 1 or not isinstance(s.body[0], Update):
        return False
    up = s.body[0]
    e = up.value
    if up.op != "add" or up.acc.dtype != "f32" or not isinstance(e, Op) or e.op != "mul" \
            or e.dtype != "f32" or len(e.args) != 2:
        return False
    f, g = e.args
    if not all(isinstance(a, Op) and a.op in RATIO and len(a.args) == 1 for a in (f, g)) \
            or not qualifies(f.op, g.op):
        return False
    v = s.var
    for x in walk_expr(e):
        if isinstance(x, Load):
            off = ix.of(x.off)
            linear = all(isinstance(a, ix.Var) or v not in ix.variables(ix.of(a))
                         for a, _ in off.terms)
            if x.buf.dtype != "f32" or not linear or off.coeffs().get(v, 0) not in (0, 1):
                return False
        elif isinstance(x, Op):
            if x.dtype != "f32":
                return False
        elif not (isinstance(x, Const) and x.dtype == "f32"):
            return False
    return True


def ratio_sum_loop(body, b: ir.IRBuilder, s: For, vars_, lohi=None) -> None:
    """Emit `s` (applies(s)) for `body` (a codegen.Body) as described in the header."""
    from rlxc.lowering.cpu.codegen import c64

    up = s.body[0]
    lut = getattr(body, "lut", None)          # one <U*L x float>: the backend splits each
    v, lanes = s.var, body.lanes * getattr(lut, "unroll", UNROLL)   # op into U register ops
    start, stop = body.bounds(b, s, vars_, lohi)
    vend = body.vector_end(b, start, stop, lanes)
    vt = ir.VectorType(F32, lanes)
    fn = body.fn
    head = fn.append_basic_block(f"{v.name}.rhead")
    loop = fn.append_basic_block(f"{v.name}.rbody")
    done = fn.append_basic_block(f"{v.name}.rdone")
    pre = b.block
    b.branch(head)
    b.position_at_end(head)
    iv = b.phi(I64, name=v.name + ".r")
    iv.add_incoming(start, pre)
    acc = b.phi(vt, name=f"{v.name}.part")
    acc.add_incoming(const(vt, 0.0), pre)
    b.cbranch(b.icmp_signed("<", iv, vend), loop, done)
    b.position_at_end(loop)
    inner = dict(vars_)
    inner[v] = iv
    memo: dict = {}
    x, y = (body.vexpr(b, arg, inner, v, memo, lanes) for arg in up.value.args)
    q, scale = fused_parts(b, x, y, lut)
    nxt = b.fadd(acc, q)
    end = b.block
    iv.add_incoming(b.add(iv, c64(lanes), flags=["nsw"]), end)
    acc.add_incoming(nxt, end)
    b.branch(head)
    b.position_at_end(done)
    tot = _hsum(b, acc, lanes, body.lanes)
    aid = id(up.acc)
    if scale != 1.0:
        if aid in body.unscaled_ok and (aid in body.acc_scale or aid not in body.acc_read) \
                and 2.0 ** -64 <= scale < 1.0:
            body.acc_scale[aid] = scale       # the sum's reads scale (Body.acc_value)
        else:
            tot = b.fmul(tot, const(F32, scale))
    slot = body.accs[aid]
    b.store(b.fadd(b.load(slot), tot, flags=["reassoc"]), slot)
    body.loop(b, s, vars_, lohi=(vend, stop))


def _by_register(b, fn, w: int, lanes: int, *vecs):
    """fn(*slices) on each `lanes`-wide slice of the w-lane vectors `vecs` (an intrinsic of
    one register), the results concatenated back to w lanes."""
    def part(x, k):
        return x if w == lanes else b.shuffle_vector(
            x, x, ir.Constant(ir.VectorType(I32, lanes), list(range(k, k + lanes))))
    parts = [fn(*(part(x, k) for x in vecs)) for k in range(0, w, lanes)]
    while len(parts) > 1:
        h = parts[0].type.count
        parts = [b.shuffle_vector(x, y, ir.Constant(ir.VectorType(I32, 2 * h),
                                                    list(range(2 * h))))
                 for x, y in zip(parts[::2], parts[1::2])]
    return parts[0]


def _declare(b, name: str, ret, args):
    fn = b.module.globals.get(name)
    if fn is None:
        fn = ir.Function(b.module, ir.FunctionType(ret, args), name)
    return fn


class Avx2Lut:
    """lut(o, entries, idx): entries[idx & 7] per lane (`entries` 8 int32 values, `idx` a
    vector of i32 of a multiple of 8 lanes) by llvm.x86.avx2.permps (vpermps: one shuffle
    uop per 8 lanes), for mathlib_ratio's table-driven exponentials (both: tanh_table)."""
    n = 8
    tanh_table = True
    unroll = UNROLL

    def __call__(self, o, entries, idx):
        b, w = o.b, idx.type.count
        v8, i8 = ir.VectorType(F32, 8), ir.VectorType(I32, 8)
        tab = b.bitcast(ir.Constant(i8, list(entries)), v8)
        fn = _declare(b, "llvm.x86.avx2.permps", v8, [v8, i8])
        return b.bitcast(_by_register(b, lambda i: b.call(fn, [tab, i]), w, 8, idx), idx.type)


class Avx512Ops:
    """The AVX-512 (F + DQ) instructions mathlib_ratio's sum path uses, each one uop on
    <16 x float> registers (split per register; `o` an Ops of a multiple of 16 lanes):
      lut(o, entries, idx)  entries[idx & 15] (16 int32 values) by vpermps (permvar.sf.512);
                            sigmoid's 2^(j/16) table (tanh keeps its table-free form: its
                            delta table would cost what the shorter polynomial saves;
                            tanh_table False)
      scalef(o, x, e)       x * 2^floor(e) by vscalefps: exact, with over/underflow (and
                            the subnormals) rounded as one multiply; NaN in either gives NaN
    """
    n = 16
    tanh_table = False
    unroll = 1      # W1, 1 thread, CPU time: 1: 0.96x of 4's, 2: 0.98x (no spills, no moves)
                    # on a quiet core (1.08x with its other hyperthread busy); 2 threads
                    # (RLXC_ADAPTIVE_THREADS=0, wall median): 0.78x of 4's

    def __call__(self, o, entries, idx):
        b, w = o.b, idx.type.count
        v16, i16 = ir.VectorType(F32, 16), ir.VectorType(I32, 16)
        tab = b.bitcast(ir.Constant(i16, list(entries)), v16)
        fn = _declare(b, "llvm.x86.avx512.permvar.sf.512", v16, [v16, i16])
        return b.bitcast(_by_register(b, lambda i: b.call(fn, [tab, i]), w, 16, idx),
                         idx.type)

    def scalef(self, o, x, e):
        b, w = o.b, x.type.count
        v16 = ir.VectorType(F32, 16)
        fn = _declare(b, "llvm.x86.avx512.mask.scalef.ps.512", v16,
                      [v16, v16, v16, ir.IntType(16), I32])
        return _by_register(b, lambda xi, ei: b.call(fn, [xi, ei, xi, ir.Constant(
            ir.IntType(16), -1), ir.Constant(I32, 4)]), w, 16, x, e)


def lut_for(cpu: str):
    """The target instructions ratio_sum_loop gives mathlib_ratio on `cpu`: vpermps tables on
    AVX2 targets (Avx2Lut), vpermps/vrangeps/vscalefps on AVX-512 (Avx512Ops); None elsewhere
    (NEON, SSE: no such lookup)."""
    from rlxc.lowering.cpu.sgemm_kernels import sgemm_config

    isa = sgemm_config(cpu).isa
    return Avx2Lut() if isa == "avx2" else Avx512Ops() if isa == "avx512" else None


def unroll_for(cpu: str) -> int:
    """Vector registers per iteration of ratio_sum_loop on `cpu`."""
    return getattr(lut_for(cpu), "unroll", UNROLL)


def _hsum(b, x, w: int, reg: int):
    """The sum of the w lanes of x: its register-sized slices (reg lanes, a power of two)
    added, then a tree of halves."""
    def part(lo, k):
        return b.shuffle_vector(x, x, ir.Constant(ir.VectorType(I32, k), list(range(lo, lo + k))))
    acc = part(0, reg) if w > reg else x
    for lo in range(reg, w, reg):
        acc = b.fadd(acc, part(lo, reg))
    x, w = acc, min(w, reg)
    while w > 1:
        h = w // 2
        lo = b.shuffle_vector(x, x, ir.Constant(ir.VectorType(I32, h), list(range(h))))
        hi = b.shuffle_vector(x, x, ir.Constant(ir.VectorType(I32, h), list(range(h, w))))
        x, w = b.fadd(lo, hi), h
    return b.extract_element(x, ir.Constant(I32, 0))

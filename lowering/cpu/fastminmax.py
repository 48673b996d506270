"""Float max/min reductions: a fast pass, and the exact one only where it could differ.

    for v in [start, stop):                    (innermost; every statement a float
        acc_j = maximum(acc_j, e_j(v))          max/min update, no accumulator read)
          │ applies / minmax_loop
          ▼
    pre_j = acc_j;  nan_j = pre_j is NaN ? NaN : 0
    for v in [start, stop):
        acc_j = maxnum(acc_j, e_j) [nnan nsz]   one vmaxps per vector
        nan_j += e_j - e_j                      NaN after a NaN or an infinity
    if any j: nan_j is NaN or acc_j == 0:       (rare: a NaN, an infinity, a zero result)
        acc_j = pre_j;  the loop again with llvm.maximum (exact)

Why: the rlx max/min reductions propagate NaN and order -0 < +0 (llvm.maximum/minimum,
lowering/shared/scalar.py); x86 has no such instruction, and LLVM expands each vector
step into six (a sign test, two blends, an unordered compare, the max, a masked move),
a dependency chain of about eight cycles per accumulator.  A maximum that is neither
NaN nor zero is the one element whose bits are the largest: maxnum (vmaxps) finds it
exactly, whatever the order; only a NaN (which maxnum drops, so `nan_j` notes it: a sum
of e - e, two vector ops, which an infinity sets too; the nnan flag makes a step with a
NaN operand poison, which the re-run replaces, and `redo` is built with selects so that
the poison never reaches the branch) or a zero result (whose sign maxnum may get wrong)
needs the exact pass, which then runs from the accumulators' values before the loop (a
NaN there, left by an enclosing loop's earlier pass, starts `nan_j` at NaN).

Zen 4, 1024 x 1024 float32, one thread: max(1) 85 -> 62 us (AVX-512; NumPy 126), argmax(1)
(whose first pass this is) 157 -> 134 us; AVX2 build (x86-64-v3) argmax 127 -> 121 us, two
threads 72-73 -> 67-69 us, softmax 333-336 -> 327-329 us (benchmarks/bench_rows.py).
"""
from __future__ import annotations

import llvmlite.ir as ir

from rlxc.lowering.cpu.loops import AccRef, For, Update, walk_expr
from rlxc.lowering.shared.scalar import I1, const, intrinsic, vtype

FLOATS = ("f32", "f64")
MIN_TRIP = 64   # shorter loops (a 2x2 max-pool window, a row of 10 logits) stay exact: the
                # check costs a few instructions per loop, and a ReLU'd window whose max is
                # 0 would run twice


def applies(s: For) -> bool:
    """Is `s` an innermost loop of float max/min updates only (no accumulator read), of at
    least MIN_TRIP iterations when its count is static?"""
    if not s.body or not all(isinstance(u, Update) for u in s.body):
        return False
    # a symbolic size (dynsizes.py: a dynamic sequence or batch axis) is not compared (the
    # size-generic lowering refuses comparisons of sizes): it takes the fast loop, which is
    # exact at any trip count
    n = s.var.extent
    if isinstance(n, int) and n < MIN_TRIP:
        return False
    for u in s.body:
        if u.op not in ("max", "min") or u.acc.dtype not in FLOATS:
            return False
        if any(isinstance(x, AccRef) for x in walk_expr(u.value)):
            return False
    return len({id(u.acc) for u in s.body}) == len(s.body)


def minmax_loop(body, b, s: For, vars_, lohi=None) -> None:
    """Emit `s` (applies(s)) as the fast loop, then the exact one where needed (header)."""
    slots = [body.accs[id(u.acc)] for u in s.body]
    first = body.fn.entry_basic_block
    entry = ir.IRBuilder(first)
    entry.position_at_start(first)       # allocas in the entry block (SROA makes them phis)
    flags = [entry.alloca(vtype(u.acc.dtype), name=f"{u.acc.name}.nan") for u in s.body]
    if b.block is first:   # IRBuilder anchors are indices: b's moved with the insertions
        b.position_at_end(first)
    pre = [b.load(p) for p in slots]
    for f, v in zip(flags, pre):   # NaN already (an outer loop's earlier pass): re-run
        b.store(b.select(b.fcmp_unordered("uno", v, v), v, const(v.type, 0.0)), f)

    def fast(b, inner):
        for u, p, f in zip(s.body, slots, flags):
            v, _ = body.acc_value(b, u.op, u.value, inner)
            fn = intrinsic(b, "llvm.maxnum" if u.op == "max" else "llvm.minnum", v.type, 2)
            b.store(b.call(fn, [b.load(p), v], fastmath=("nnan", "nsz")), p)
            b.store(b.fadd(b.load(f), b.fsub(v, v), flags=["reassoc"]), f)

    body.loop(b, s, vars_, lohi, body_fn=fast)
    redo = ir.Constant(I1, 0)
    for u, p, f in zip(s.body, slots, flags):
        r = b.load(p)
        zero = b.fcmp_ordered("==", r, const(r.type, 0.0))
        # a select, not an or: with a NaN the fast result is poison, and so is `zero`
        nan = b.load(f)
        nan = b.fcmp_unordered("uno", nan, nan)
        redo = b.select(redo, ir.Constant(I1, 1), b.select(nan, ir.Constant(I1, 1), zero))
    with b.if_then(redo, likely=False):
        for p, v in zip(slots, pre):
            b.store(v, p)
        body.loop(b, s, vars_, lohi)

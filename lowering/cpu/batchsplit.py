"""Batch-separable dynamic programs: is every row along a symbol N computed on its own?

    dynamic rlx module (symbols N, ...)
          │ decide(module): for each symbol N (signature order), walk every op through
          │ RULES (one row per op, keyed by name) and check every value's shape
          ▼
    Decision(symbol=N, inputs/outputs: which are split and their row shapes)
    or Decision(symbol=None, reason="...")      (the first thing that mixes rows)
          │ lowering/cpu/batchsplit_entry.py: the C entry runs ONE OpenMP region in
          │ which thread t calls the size-generic body on its rows [lo_t, hi_t)
          ▼

Why: the size-generic body forks a team per large kernel (conv GEMMs, a big
elementwise loop) and runs the small ones serially; on a 2-core VM each fork/join
costs 13-55 us and the serial kernels were ~27% of the ONNX CNN at batch 64.  When
the program is separable over N, the body evaluated at a chunk of N_t rows with its
inputs and outputs offset by the chunk's first row computes exactly those rows of
the result, so the whole call is one region with no inner fork.

The program is separable over N when (all checked, anything else says no):
  * every value's shape (arguments, op results, outputs) mentions N at most once,
    and only as axis 0 (a plain symbol: symdims keeps every dim a symbol or an int);
    no unnamed `?` dim; no param mentions N; every output mentions N;
  * every op has a row here whose predicate accepts it: elementwise families
    (broadcasting aligns on the right, so N of an operand stays axis 0 of the result
    by the shape check), reductions not over axis 0, matmul with N in the lhs rows or
    in a batch axis of both sides (never contracted), transpose keeping axis 0,
    reshape keeping N as axis 0 (same element count per row), slice/pad/concat not
    touching axis 0, gather along another axis of a batched table or along axis 0 of
    a shared table with batched indices (embedding lookup), conv with batched images
    and a shared kernel, attention with batch axis 0;
  * an op whose operands mention N gives a result that mentions N (nothing reduces
    over the batch: a mean, a loss); an op that creates N from shared operands is a
    broadcast_to (identical rows) and nothing else (rlx.iota counts rows: no).
Ops without a row (RNG, scatter_add, region ops scan/while/if, iota, attention
backward, conv filter gradients) are not separable: a wrong "separable" would be
silently wrong results, a wrong "no" only a slower call.  Values that do not mention
N (constants, computations on params) are recomputed identically by every thread.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from rlxc.dialect.shapes import SHAPES


@dataclass
class Decision:
    """The split of a dynamic program: `symbol` None when not separable (`reason`);
    `inputs`/`outputs`: per input argument / output, the row shape (shape[1:]) when it
    is split along `symbol`, None for a shared (unsplit) input."""

    symbol: str | None
    reason: str = ""
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)

    def to_json(self) -> dict:
        return {"symbol": self.symbol, "reason": self.reason}


# ---------------------------------------------------------------- rules
# rule(params, operand shapes, result shape, has_n(shape) -> bool) -> reason | None.
# The shape checks (N only at axis 0, no row loss, no row creation) run before.

def _elementwise(p, ins, out, has):
    return None


def _reduce(p, ins, out, has):
    if has(ins[0]) and 0 in p["axes"]:
        return "reduces over the batch axis"
    return None


def _matmul(p, ins, out, has):
    (a, b) = ins
    if has(a) and not (len(a) >= 2 and len(a) == len(out)):
        return "the batch axis of the lhs is contracted or broadcast away"
    if has(b) and not (len(b) >= 3 and len(b) == len(out)):
        return "the batch axis of the rhs is not a batch axis of the product"
    return None


def _transpose(p, ins, out, has):
    if has(ins[0]) and p["perm"][0] != 0:
        return f"perm {tuple(p['perm'])} moves axis 0"
    return None


def _reshape(p, ins, out, has):
    return None   # N at axis 0 of both (shape check): same elements per row, same order


def _broadcast_to(p, ins, out, has):
    if has(ins[0]) and len(ins[0]) != len(out):
        return "broadcast_to moves the batch axis"
    return None


def _slice(p, ins, out, has):
    n = ins[0][0] if ins[0] else None
    if has(ins[0]) and (p["starts"][0] != 0 or p["strides"][0] != 1 or p["limits"][0] != n):
        return "slices the batch axis"
    return None


def _pad(p, ins, out, has):
    if has(ins[0]) and (p["low"][0] != 0 or p["high"][0] != 0):
        return "pads the batch axis"
    return None


def _concat(p, ins, out, has):
    if any(has(s) for s in ins) and p["axis"] % len(out) == 0:
        return "concatenates along the batch axis"
    return None


def _gather(p, ins, out, has):
    table, idx = ins
    axis = p["axis"] % len(table)
    if has(table) and axis != 0 and not has(idx):
        return None   # rows of a batched table, shared indices
    if not has(table) and has(idx) and axis == 0:
        return None   # embedding lookup: batched indices into a shared table
    if not has(table) and not has(idx):
        return None
    return "gathers along the batch axis"


def _conv(p, ins, out, has):
    if any(has(s) for s in ins[1:]):
        return "the kernel depends on the batch"
    return None


def _attention(p, ins, out, has):
    if any(len(s) != 4 for s in ins):
        return "attention operands are not (B, H, S, D)"
    return None


_ELEMENTWISE_FAMILIES = ("unary", "binary", "compare", "select", "cast", "constant")  # per element
RULES: dict = {name: _elementwise for name, s in SHAPES.items()
               if s.family in _ELEMENTWISE_FAMILIES}
RULES.update({name: _reduce for name, s in SHAPES.items() if s.family == "reduce"})
RULES.update({
    "rlx.matmul": _matmul,
    "rlx.transpose": _transpose,
    "rlx.reshape": _reshape,
    "rlx.broadcast_to": _broadcast_to,
    "rlx.slice": _slice,
    "rlx.pad": _pad,
    "rlx.concat": _concat,
    "rlx.gather": _gather,
    "rlx.conv2d": _conv,
    "rlx.conv_transpose2d": _conv,
    "rlx.attention": _attention,
    "rlx.attention_lse": _attention,
})
CREATES_ROWS = {"rlx.broadcast_to"}   # may give N-rows from shared operands (identical rows)


# ---------------------------------------------------------------- analysis

class _No(Exception):
    pass


def _checker(n: str):
    def has(shape) -> bool:
        if any(d == "?" for d in shape):
            raise _No("a dynamic dim has no symbol name")
        if n not in shape:
            return False
        if shape[0] != n or n in shape[1:]:
            raise _No(f"a value of shape {tuple(shape)} has {n} off axis 0")
        return True
    return has


def decide_for(module, n: str) -> Decision:
    """The Decision for splitting `module` (one func) along symbol `n`."""
    from xdsl.dialects import func

    from rlxc.dialect.module import get_func, outputs, signature
    from rlxc.dialect.types import shape_of

    has = _checker(n)
    f = get_func(module)
    try:
        ins = []
        for a in signature(f):
            h = has(a.shape)
            if a.kind == "param":
                if h:
                    raise _No(f"param {a.name!r} has the batch axis")
                continue
            ins.append(tuple(a.shape[1:]) if h else None)
        if not any(r is not None for r in ins):
            raise _No(f"no input has {n} as axis 0")
        for op in f.body.block.ops:
            if isinstance(op, func.ReturnOp):
                continue
            rule = RULES.get(op.name)
            if rule is None:
                raise _No(f"{op.name} has no batch-split rule")
            shapes = [shape_of(v.type) for v in op.operands]
            if len(op.results) != 1:
                raise _No(f"{op.name} has {len(op.results)} results")
            out = shape_of(op.results[0].type)
            hin, hout = [has(s) for s in shapes], has(out)
            if any(hin) and not hout:
                raise _No(f"{op.name} reduces the batch axis {n} away")
            if hout and not any(hin) and op.name not in CREATES_ROWS:
                raise _No(f"{op.name} creates the batch axis {n}")
            why = rule(op.params(), shapes, out, has)
            if why:
                raise _No(f"{op.name}: {why}")
        outs = []
        for i, v in enumerate(outputs(f)):
            s = shape_of(v.type)
            if not has(s):
                raise _No(f"output {i} has no batch axis {n}")
            outs.append(tuple(s[1:]))
    except _No as e:
        return Decision(None, f"not separable over {n}: {e}")
    return Decision(n, "", ins, outs)


def decide(module, symbols: list | None = None) -> Decision:
    """The first symbol `module` is batch-separable over, else why not (the reason for
    the first symbol).  RLXC_BATCH_SPLIT does not enter here: it is a run-time switch."""
    from rlxc.lowering.cpu.dynsizes import module_symbols

    symbols = module_symbols(module) if symbols is None else list(symbols)
    first = None
    for n in symbols:
        d = decide_for(module, n)
        if d.symbol is not None:
            return d
        first = first or d
    return first or Decision(None, "no dimension symbols")


def split_ends(ends: list, n: str, tcap: int, ws_align: int = 64) -> list:
    """Workspace ends (linear forms, bytes) that bound `t` per-thread workspaces, each the
    body's workspace at ceil(N / t) rows, for every team t <= tcap.

    Each end e = a + k N (a linear in the other sizes, coefficients >= 0): t copies at
    c = ceil(N / t) rows take t a + k t c <= t a + k (N + t - 1) <= tcap (a + k) + k (N - 1)
    bytes; plus tcap * ws_align for rounding each slice up."""
    from rlxc.lowering.cpu.symint import SymInt

    out = []
    for e in ends:
        c, coef = SymInt.parts(e)
        k = coef.pop(n, 0)
        a = SymInt(0, ()) + (c + k) + sum((SymInt(0, ((s, v),)) for s, v in coef.items()), 0)
        out.append(a * tcap + k * (SymInt(0, ((n, 1),)) - 1) + tcap * ws_align)
    return out


__all__ = ["Decision", "RULES", "decide", "decide_for", "split_ends"]

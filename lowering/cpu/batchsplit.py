"""Batch-separable programs: is every row along a batch axis computed on its own?

    rlx module, dynamic (symbols N, ...) or static (inputs of leading size B)
          │ walk every op through RULES (one row per op, keyed by name): from the batch
          │ axis of each operand (an int, or none: a shared value) the rule gives the
          │ batch axis of the result and where each operand must have it
          ▼
    Decision(symbol=N, inputs/outputs: which are split and their row shapes, axes: the
    batch axis of every value), or Decision(symbol=None, reason="...")  (the first thing
    that mixes rows)
          │ dynamic: lowering/cpu/batchsplit_entry.py: the C entry runs ONE OpenMP region
          │ in which thread t calls the size-generic body on its rows [lo_t, hi_t)
          │ static:  batchsplit_static.py rewrites the module with the batch axis of every
          │ value as a symbol (generalize) and wraps its split entry in the static ABI
          ▼

Why: the size-generic body forks a team per large kernel (conv GEMMs, a big
elementwise loop) and runs the small ones serially; on a 2-core VM each fork/join
costs 13-55 us and the serial kernels were ~27% of the ONNX CNN at batch 64.  When
the program is separable over N, the body evaluated at a chunk of N_t rows with its
inputs and outputs offset by the chunk's first row computes exactly those rows of
the result, so the whole call is one region with no inner fork.

The batch axis of a value may be any of its axes (the encoder's QKV reshape/transpose
puts it on axis 1 of an intermediate); inputs and outputs must have it on axis 0 (a
chunk of rows is then a contiguous block).  Separable when (all checked, anything
else says no):
  * dynamic: every value mentions N at most once, no unnamed `?` dim, no param
    mentions N, and N sits where the rules put the batch axis; static: a value the
    rules give a batch axis has size B there;
  * every op has a row here whose rule accepts it: elementwise families (operands of
    one shape: one batch axis), reductions not over the batch axis, matmul with the
    batch axis in a batch dim, the lhs rows or the rhs columns (never contracted),
    transpose (moves it to perm.index(axis)), reshape keeping the product of the dims
    before and after the batch axis (no row mixed with another: (N, 6, 96) -> (N, 6, 3,
    4, 8) yes, (N, 4) -> (2, N, 2) no), slice/pad/concat not touching it, gather along
    another axis of a batched table or from a shared table with batched indices, conv
    with batched images (axis 0) and a shared kernel, attention batched on axis 0 or 1;
  * an operand without the batch axis is shared: where it lines up with the batch
    axis it has size 1 or no dim (a static shared value of size B there varies along
    the rows: no);
  * an op whose operands have the batch axis gives a result with it (nothing reduces
    over the batch: a mean, a loss); an op that creates it from shared operands is a
    broadcast_to (identical rows) and nothing else (rlx.iota counts rows: no).  In a
    static program the created axis is the one its users line up with the batch (a
    bias broadcast to (B, 6, 96)); used also as a shared value: no.
Ops without a row (RNG, scatter_add, region ops scan/while/if, iota, attention
backward, conv filter gradients) are not separable: a wrong "separable" would be
silently wrong results, a wrong "no" only a slower call.  Values without the batch
axis (constants, computations on params) are recomputed identically by every thread.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from rlxc.dialect.shapes import SHAPES


@dataclass
class Decision:
    """The split of a program: `symbol` None when not separable (`reason`);
    `inputs`/`outputs`: per input argument / output, the row shape (shape[1:]) when it
    is split along `symbol`, None for a shared (unsplit) input; `axes`: the batch axis
    of every SSA value that has one; `rows`: the batch size of a static program."""

    symbol: str | None
    reason: str = ""
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    axes: dict = field(default_factory=dict, repr=False)
    rows: int | None = None

    def to_json(self) -> dict:
        out = {"symbol": self.symbol, "reason": self.reason}
        if self.rows is not None:
            out["rows"] = self.rows
        return out


class _No(Exception):
    pass


FLEX = "flex"   # a rule's result: rows created from shared operands (broadcast_to)


def _mono(dims) -> tuple:
    """The element count of `dims` as (static factor, sorted symbols)."""
    n, syms = 1, []
    for d in dims:
        if isinstance(d, str):
            syms.append(d)
        else:
            n *= int(d)
    return n, tuple(sorted(syms))


# ---------------------------------------------------------------- rules
# rule(params, operand shapes, operand batch axes (int | None), result shape, tok) ->
#   (batch axis of the result: int | None | FLEX,
#    per operand: the axis of it that lines up with the result's batch axis, or None).
# tok is the batch dim (the symbol N, or the static size B).

def _elementwise(p, ins, axs, out, tok):
    got = [a for a in axs if a is not None]
    pos = got[0] if got else None
    return pos, [pos] * len(ins)


def _reduce(p, ins, axs, out, tok):
    a = axs[0]
    if a is None:
        return None, [None]
    axes = [x % len(ins[0]) for x in p["axes"]]
    if a in axes:
        raise _No(f"reduces the batch axis {tok} away (axis {a})")
    return (a if p["keepdims"] else a - sum(1 for x in axes if x < a)), [a]


def _matmul(p, ins, axs, out, tok):
    (sa, sb), ro = ins, len(out)
    nb = ro - 2                      # batch dims of the product
    sides = ((len(sa), ro - 2, None), (len(sb), None, ro - 1))   # (rank, M ->, P ->)

    def to_out(r, m, c, ax):         # an operand's axis -> the product's (None: contracted)
        if ax < r - 2:
            return ax + nb - (r - 2)
        return m if ax == r - 2 else c

    def back(r, m, c, o):            # the product's axis -> the operand's (None: not there)
        if o == ro - 2:
            return r - 2 if m is not None else None
        if o == ro - 1:
            return r - 1 if c is not None else None
        j = o - (nb - (r - 2))
        return j if j >= 0 else None

    got = None
    for side, ((r, m, c), a) in enumerate(zip(sides, axs)):
        if a is None:
            continue
        o = to_out(r, m, c, a)
        if o is None:
            raise _No(f"contracts the batch axis of the {('lhs', 'rhs')[side]}")
        got = o if got is None else got
    if got is None:
        return None, [None, None]
    return got, [back(r, m, c, got) for (r, m, c) in sides]


def _transpose(p, ins, axs, out, tok):
    a = axs[0]
    return (None if a is None else tuple(p["perm"]).index(a)), [a]


def _reshape(p, ins, axs, out, tok):
    a = axs[0]
    if a is None:
        return None, [None]
    src = ins[0]
    before, after = _mono(src[:a]), _mono(src[a + 1:])
    for b, d in enumerate(out):
        if d == tok and _mono(out[:b]) == before and _mono(out[b + 1:]) == after:
            return b, [a]
    raise _No(f"{tuple(src)} -> {tuple(out)} does not keep the batch axis whole (it "
              "merges it with or moves it across another axis)")


def _broadcast_to(p, ins, axs, out, tok):
    a = axs[0]
    if a is None:
        return FLEX, [None]
    return a + len(out) - len(ins[0]), [a]


def _slice(p, ins, axs, out, tok):
    a = axs[0]
    if a is not None and (p["starts"][a] != 0 or p["strides"][a] != 1
                          or p["limits"][a] != ins[0][a]):
        raise _No("slices the batch axis")
    return a, [a]


def _pad(p, ins, axs, out, tok):
    a = axs[0]
    if a is not None and (p["low"][a] != 0 or p["high"][a] != 0):
        raise _No("pads the batch axis")
    return a, [a]


def _concat(p, ins, axs, out, tok):
    got = [a for a in axs if a is not None]
    if not got:
        return None, [None] * len(ins)
    if p["axis"] % len(out) == got[0]:
        raise _No("concatenates along the batch axis")
    return got[0], [got[0]] * len(ins)


def _gather(p, ins, axs, out, tok):
    (table, idx), (at, ai) = ins, axs
    axis = p["axis"] % len(table)
    if at is not None and ai is not None:
        raise _No("gathers from a batched table with batched indices")
    if at is not None:
        if at == axis:
            raise _No("gathers along the batch axis")
        return (at if at < axis else at + len(idx) - 1), [at, None]
    if ai is not None:
        return axis + ai, [None, ai]   # batched indices into a shared table (embedding)
    return None, [None, None]


def _conv(p, ins, axs, out, tok):
    if axs[0] not in (None, 0):
        raise _No("the batch axis of the images is not axis 0")
    return axs[0], [axs[0]] + [None] * (len(ins) - 1)


def _attention(p, ins, axs, out, tok):
    got = [a for a in axs if a is not None]
    if not got:
        return None, [None] * len(ins)
    if got[0] not in (0, 1):
        raise _No("the batch axis of attention is not B or H of (B, H, S, D)")
    return got[0], [got[0]] * len(ins)


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
CREATES_ROWS = {"rlx.broadcast_to"}   # may give rows from shared operands (identical rows)


# ---------------------------------------------------------------- analysis

class _Flex:
    """A static broadcast_to of shared operands to a shape with size B on axes it
    creates: batched on the axis its users line it up with, else shared."""

    def __init__(self, shape, cands):
        self.shape, self.cands, self.axis, self.shared = shape, cands, None, False


class _Walk:
    """The batch axis of every value of one func, for batch dim `tok`: a symbol
    (dynamic: its position in each shape is checked against the rules) or an int B."""

    def __init__(self, tok):
        self.tok, self.static = tok, not isinstance(tok, str)
        self.axes: dict = {}

    def where(self, shape):
        """Dynamic: the position of the symbol in `shape` (None: absent)."""
        if any(d == "?" for d in shape):
            raise _No("a dynamic dim has no symbol name")
        n = sum(1 for d in shape if d == self.tok)
        if n > 1:
            raise _No(f"a value of shape {tuple(shape)} mentions {self.tok} twice")
        return list(shape).index(self.tok) if n else None

    def axis(self, v):
        a = self.axes.get(v)
        if isinstance(a, _Flex):
            return a.axis
        return a

    def line_up(self, v, shape, at, i, name):
        """Shared operand `v` (#i of `name`) lined up with the batch axis at its axis `at`."""
        a = self.axes.get(v)
        flex = a if isinstance(a, _Flex) else None
        if at is None or shape[at] == 1:
            if flex is not None:
                if flex.axis is not None:
                    raise _No(f"{name}: a broadcast is used both per row and shared")
                flex.shared = True
            return
        if flex is not None and at in flex.cands and not flex.shared and \
                flex.axis in (None, at):
            flex.axis = at
            return
        raise _No(f"{name}: operand {i} is shared but spans the batch axis "
                  f"(shape {tuple(shape)}, axis {at})")

    def op(self, op) -> None:
        from rlxc.dialect.types import shape_of

        rule = RULES.get(op.name)
        if rule is None:
            raise _No(f"{op.name} has no batch-split rule")
        if len(op.results) != 1:
            raise _No(f"{op.name} has {len(op.results)} results")
        ins = [shape_of(v.type) for v in op.operands]
        out = shape_of(op.results[0].type)
        axs = [self.axis(v) for v in op.operands]
        r, align = rule(op.params(), ins, axs, out, self.tok)
        for i, (v, s, a, want) in enumerate(zip(op.operands, ins, axs, align)):
            if a is not None and a != want:
                raise _No(f"{op.name}: operand {i} has the batch axis at {a}, "
                          f"the op lines it up at {want}")
            if a is None:
                self.line_up(v, s, want, i, op.name)
        batched = any(a is not None for a in axs)
        if self.static:
            if r == FLEX:
                k = len(out) - len(ins[0])
                cands = {j for j, d in enumerate(out) if d == self.tok and
                         (j < k or ins[0][j - k] == 1)}
                self.axes[op.results[0]] = _Flex(out, cands) if cands else None
                return
            if r is not None and out[r] != self.tok:
                raise _No(f"{op.name}: the batch axis {r} of {tuple(out)} is not {self.tok}")
        else:
            at = self.where(out)
            if r == FLEX:
                r = at
            elif r != at:
                raise _No(f"{op.name}: a value of shape {tuple(out)} has {self.tok} off "
                          f"the batch axis {r}")
        if batched and r is None:
            raise _No(f"{op.name} reduces the batch axis {self.tok} away")
        if r is not None and not batched and op.name not in CREATES_ROWS:
            raise _No(f"{op.name} creates the batch axis {self.tok}")
        self.axes[op.results[0]] = r

    def output(self, i, v, shape) -> None:
        a = self.axes.get(v)
        if isinstance(a, _Flex):
            self.line_up(v, shape, 0 if 0 in a.cands else None, i, f"output {i}")
            a = a.axis
        if a is None:
            raise _No(f"output {i} has no batch axis {self.tok}")
        if a != 0:
            raise _No(f"output {i} of shape {tuple(shape)} has {self.tok} off axis 0")

    def final_axes(self) -> dict:
        return {v: (a.axis if isinstance(a, _Flex) else a) for v, a in self.axes.items()
                if (a.axis if isinstance(a, _Flex) else a) is not None}


def _walk(module, tok) -> Decision:
    from xdsl.dialects import func

    from rlxc.dialect.module import get_func, outputs, signature
    from rlxc.dialect.types import shape_of

    w = _Walk(tok)
    f = get_func(module)
    try:
        ins = []
        for a, v in zip(signature(f), f.args):
            if w.static:
                at = 0 if a.kind == "input" and a.shape and a.shape[0] == tok else None
            else:
                at = w.where(a.shape)
                if at is not None and a.kind == "param":
                    raise _No(f"param {a.name!r} has the batch axis")
                if at not in (None, 0):
                    raise _No(f"input {a.name!r} of shape {tuple(a.shape)} has {tok} "
                              "off axis 0")
            w.axes[v] = at
            if a.kind == "input":
                ins.append(tuple(a.shape[1:]) if at == 0 else None)
        if not any(r is not None for r in ins):
            raise _No(f"no input has {tok} as axis 0")
        for op in f.body.block.ops:
            if not isinstance(op, func.ReturnOp):
                w.op(op)
        outs = []
        for i, v in enumerate(outputs(f)):
            s = shape_of(v.type)
            w.output(i, v, s)
            outs.append(tuple(s[1:]))
    except _No as e:
        return Decision(None, f"not separable over {tok}: {e}")
    return Decision(tok if not w.static else None, "", ins, outs, w.final_axes(),
                    tok if w.static else None)


def decide_for(module, n: str) -> Decision:
    """The Decision for splitting `module` (one func) along symbol `n`."""
    return _walk(module, n)


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


def decide_static(module) -> Decision:
    """The Decision for a static module along the leading axis of its first input
    (`rows` = that size B, `symbol` None): separable when `reason` is empty."""
    from rlxc.dialect.module import get_func, signature

    for a in signature(get_func(module)):
        if a.kind == "input" and a.shape:
            b = a.shape[0]
            if isinstance(b, str) or b < 2:
                return Decision(None, f"the first input's leading size is {b}")
            return _walk(module, int(b))
    return Decision(None, "no input with a leading axis")


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


__all__ = ["Decision", "RULES", "decide", "decide_for", "decide_static", "split_ends"]

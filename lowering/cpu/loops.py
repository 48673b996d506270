"""The loop IR: kernels as loop nests over flat buffers (what `--emit loops` prints).

    fused rlx groups (fusion.py + schedule.py)
          │ one Kernel per group
          ▼
    Program
      buffers:  input/param/output arrays, workspace temps, constants (flat, typed)
      kernels:  LoopKernel   for-loops, scalar accumulators, stores
                MatmulKernel one sgemm call per batch element (+ fused epilogue)
                CheckKernel  bounds check of an index buffer (error code on failure)
          │ codegen.py
          ▼
    LLVM IR

A buffer is a flat typed array; every access is `buf[Affine]` (indexing.py),
so broadcasts, transposes, slices and reshapes are index maps, not copies.
Statements: `For` (i64 induction over [start, stop), optionally the kernel's
one parallel loop, which must be its first statement, or a `stream` loop: the
innermost loop of a map writing a large output, emitted as aligned vector
non-temporal stores, see codegen.py), `Acc` (declare a scalar
accumulator), `Update` (acc = acc <op> value), `Store` (buf[off] = value, or
`buf[off] = buf[off] <op> value`).  Expressions are trees of `Const`,
`Load`, `Op` (an rlx elementwise op name, or one of the helper ops listed in
scalar.py), `InRange` (lo <= index < hi as i1) and `AccRef`.  Masks (i1)
are stored one byte per element, as NumPy's bool.  A `MatmulKernel` epilogue
is an expression tree in which `EpiValue` stands for the matmul result.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from rlxc.lowering.cpu import indexing as ix

from rlxc.dialect.shapes import DTYPE_BYTES  # noqa: E402,F401  (re-exported)


@dataclass(eq=False)
class Buffer:
    """A flat array: an argument, an output, a workspace temp or a constant."""

    name: str
    kind: str  # "input" | "param" | "output" | "temp" | "const" | "local" (rowlocal.py)
    dtype: str
    numel: int
    index: int = -1            # position among inputs / params / outputs
    data: bytes | None = None  # constants
    offset: int = -1           # byte offset in the workspace (temps; buffers.py)
    first: int = -1            # first and last kernel that touch it (buffers.py)
    last: int = -1

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]

    def __hash__(self):
        return id(self)

    def __repr__(self):
        return f"%{self.name}"

    def describe(self) -> str:
        where = {"input": f"inputs[{self.index}]", "param": f"params[{self.index}]",
                 "output": f"outputs[{self.index}]", "const": "constant",
                 "temp": f"workspace+{self.offset}" if self.offset >= 0 else
                 "nowhere (unused: fused away)", "local": "a row block per thread"}
        return f"%{self.name}: {self.dtype}[{self.numel}] @ {where[self.kind]}"


# ---------------------------------------------------------------- expressions

class Expr:
    __slots__ = ()
    dtype = "f32"


@dataclass(frozen=True, eq=False)
class Const(Expr):
    value: float | int | bool
    dtype: str = "f32"


@dataclass(frozen=True, eq=False)
class Load(Expr):
    buf: Buffer
    off: ix.Affine

    @property
    def dtype(self):
        return self.buf.dtype


@dataclass(frozen=True, eq=False)
class Op(Expr):
    op: str             # "add", "exp", "lt", "select", "cast", "fake_quant", "and", ...
    args: tuple
    dtype: str
    params: tuple = ()  # ((name, value), ...)


@dataclass(frozen=True, eq=False)
class InRange(Expr):
    idx: ix.Affine
    lo: int
    hi: int
    dtype: str = "i1"


@dataclass(frozen=True, eq=False)
class IndexValue(Expr):
    """The index `idx` itself as a number of `dtype` (rlx.iota: a size-generic program's
    element counters, computed instead of read from a constant of the call's size)."""
    idx: ix.Affine
    dtype: str = "i32"


@dataclass(eq=False)
class Acc:
    name: str
    dtype: str


@dataclass(frozen=True, eq=False)
class AccRef(Expr):
    acc: Acc

    @property
    def dtype(self):
        return self.acc.dtype


@dataclass(frozen=True, eq=False)
class EpiValue(Expr):
    """The matmul result inside a MatmulKernel epilogue."""

    dtype: str = "f32"


# ---------------------------------------------------------------- statements

@dataclass(eq=False)
class For:
    var: ix.Var
    start: ix.Affine
    stop: ix.Affine
    body: list
    parallel: bool = False
    stream: bool = False  # innermost loop of a large output map: vector non-temporal stores


@dataclass(eq=False)
class AccDecl:
    acc: Acc
    init: Expr


@dataclass(eq=False)
class Update:
    acc: Acc
    op: str  # "add" | "mul" | "max" | "min" | "or" | "and"
    value: Expr


@dataclass(eq=False)
class Store:
    buf: Buffer
    off: ix.Affine
    value: Expr
    combine: str | None = None  # None: plain store; else buf[off] = buf[off] <combine> value


# ---------------------------------------------------------------- kernels

@dataclass(eq=False)
class LoopKernel:
    name: str
    what: str           # the rlx value(s) it computes, for printing
    body: list
    work: int = 0       # estimated cost units (elements x op weight) for threading
    outputs: list = field(default_factory=list)  # buffers written
    dynamic: bool = False  # parallel chunks claimed one by one (openmp.py dynamic), not static

    def buffers(self) -> list:
        seen: dict = {}
        for s in walk(self.body):
            for b in stmt_buffers(s):
                seen.setdefault(id(b), b)
        return list(seen.values())


@dataclass(eq=False)
class MatOperand:
    buf: Buffer
    off: ix.Affine      # offset of element (0, 0) of each batch element (batch vars only)
    rs: int             # row stride
    cs: int             # column stride


@dataclass(eq=False)
class MatmulKernel:
    name: str
    what: str
    batch: list         # list of ix.Var for the batch dims of the result
    m: int
    n: int
    k: int
    a: MatOperand
    b: MatOperand
    out: Buffer         # written contiguously, ldc = n, batch-major
    scratch: Buffer     # packing workspace (floats)
    epilogue: Expr | None = None  # in terms of EpiValue, loads with offsets in (batch, row, col)
    row: ix.Var | None = None
    col: ix.Var | None = None
    work: int = 0
    par_batch: int = 1  # > 1: the batch loop splits over up to this many threads, each with
    #                     its own 1/par_batch of scratch (matmul_schedule.batch_team)
    prologue: list = field(default_factory=list)  # statements run before each element's
    #                     sgemm, in terms of the batch vars (operand_prologue.py)
    slice_floats: int = 0  # ... writing a slice buffer of this many floats per thread

    @property
    def outputs(self):
        return [self.out]

    def buffers(self) -> list:
        bufs = [self.a.buf, self.b.buf, self.out, self.scratch]
        if self.epilogue is not None:
            bufs += [b for e in walk_expr(self.epilogue) for b in expr_buffers(e)]
        for s in walk(self.prologue):
            bufs += stmt_buffers(s)
        seen: dict = {}
        for b in bufs:
            seen.setdefault(id(b), b)
        return list(seen.values())


@dataclass(eq=False)
class CheckKernel:
    """Return error `code` unless every buf[i] (i < numel) lies in [0, bound)."""

    name: str
    what: str
    buf: Buffer
    numel: int
    bound: int
    code: int
    work: int = 0

    @property
    def outputs(self):
        return []

    def buffers(self) -> list:
        return [self.buf]


@dataclass(eq=False)
class Program:
    name: str
    args: list            # module.Arg in signature order
    outputs: list         # [(shape, dtype)]
    buffers: list
    kernels: list
    errors: dict = field(default_factory=dict)  # code -> (exception name, message)
    workspace_size: int = 0
    sgemm_threads: int = 1
    # code -> (arg kind "input" | "param", index, bound): an index check on an argument,
    # which the runtime reads back on the error path to name the offending value
    error_args: dict = field(default_factory=dict)


# ---------------------------------------------------------------- traversal

def walk(stmts):
    for s in stmts:
        yield s
        if isinstance(s, For):
            yield from walk(s.body)


def walk_expr(e):
    stack, seen = [e], set()
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        yield x
        if isinstance(x, Op):
            stack.extend(x.args)


def expr_buffers(e) -> list:
    out = []
    if isinstance(e, Load):
        out.append(e.buf)
        out += affine_buffers(e.off)
    elif isinstance(e, (InRange, IndexValue)):
        out += affine_buffers(e.idx)
    return out


def affine_buffers(a) -> list:
    out = []
    for atom, _ in ix.of(a).terms:
        if isinstance(atom, ix.LoadIdx):
            out.append(atom.buf)
            out += affine_buffers(atom.off)
        elif isinstance(atom, (ix.FloorDiv, ix.Mod, ix.Clamp)):
            out += affine_buffers(atom.x)
        elif isinstance(atom, ix.Min):
            out += affine_buffers(atom.a) + affine_buffers(atom.b)
    return out


def stmt_exprs(s) -> list:
    if isinstance(s, AccDecl):
        return [s.init]
    if isinstance(s, Update):
        return [s.value]
    if isinstance(s, Store):
        return [s.value]
    return []


def stmt_buffers(s) -> list:
    out = []
    if isinstance(s, Store):
        out.append(s.buf)
        out += affine_buffers(s.off)
    if isinstance(s, For):
        out += affine_buffers(s.start) + affine_buffers(s.stop)
    for e in stmt_exprs(s):
        for x in walk_expr(e):
            out += expr_buffers(x)
    return out


# ---------------------------------------------------------------- printer

def format_expr(e, names=None) -> str:
    """Expression as text; shared subexpressions are printed inline (it is a tree view)."""
    if isinstance(e, Const):
        return repr(e.value) if e.dtype != "f32" else f"{float(e.value)!r}"
    if isinstance(e, Load):
        return f"{e.buf!r}[{e.off}]"
    if isinstance(e, AccRef):
        return e.acc.name
    if isinstance(e, EpiValue):
        return "acc"
    if isinstance(e, InRange):
        return f"({e.lo} <= {e.idx} < {e.hi})"
    if isinstance(e, IndexValue):
        return f"{e.dtype}({e.idx})"
    if isinstance(e, Op):
        args = ", ".join(format_expr(a) for a in e.args)
        ps = "".join(f", {k}={v}" for k, v in e.params)
        return f"{e.op}({args}{ps})"
    raise TypeError(e)


def _fmt_stmts(stmts, depth, lines):
    pad = "  " * depth
    for s in stmts:
        if isinstance(s, For):
            kw = "parallel for" if s.parallel else "for"
            tail = "  // streaming stores" if s.stream else ""
            lines.append(f"{pad}{kw} {s.var} in [{s.start}, {s.stop}):{tail}")
            _fmt_stmts(s.body, depth + 1, lines)
        elif isinstance(s, AccDecl):
            lines.append(f"{pad}{s.acc.name}: {s.acc.dtype} = {format_expr(s.init)}")
        elif isinstance(s, Update):
            lines.append(f"{pad}{s.acc.name} = {s.op}({s.acc.name}, {format_expr(s.value)})")
        elif isinstance(s, Store):
            tgt = f"{s.buf!r}[{s.off}]"
            if s.combine:
                lines.append(f"{pad}{tgt} = {s.combine}({tgt}, {format_expr(s.value)})")
            else:
                lines.append(f"{pad}{tgt} = {format_expr(s.value)}")
        else:
            raise TypeError(s)


def format_kernel(k) -> str:
    if isinstance(k, LoopKernel):
        lines = [f"kernel {k.name}  // {k.what}  (work {k.work})"]
        _fmt_stmts(k.body, 1, lines)
        return "\n".join(lines)
    if isinstance(k, MatmulKernel):
        bvars = ", ".join(f"{v} in [0, {v.extent})" for v in k.batch)
        lines = [f"kernel {k.name}  // {k.what}  (work {k.work})"]
        pad = "  "
        if bvars:
            lines.append(f"  for {bvars}:")
            pad = "    "
        if k.prologue:
            lines.append(f"{pad}prologue:")
            _fmt_stmts(k.prologue, len(pad) // 2 + 1, lines)
        lines.append(f"{pad}sgemm(M={k.m}, N={k.n}, K={k.k},")
        lines.append(f"{pad}      A={k.a.buf!r}+[{k.a.off}] rs={k.a.rs} cs={k.a.cs},")
        lines.append(f"{pad}      B={k.b.buf!r}+[{k.b.off}] rs={k.b.rs} cs={k.b.cs},")
        off = ix.linearize(k.batch, [v.extent for v in k.batch])
        lines.append(f"{pad}      C={k.out!r}+[{ix.scale(off, k.m * k.n)}] ldc={k.n}, "
                     f"workspace={k.scratch!r})")
        if k.epilogue is not None:
            lines.append(f"{pad}  epilogue ({k.row}, {k.col}): {format_expr(k.epilogue)}")
        return "\n".join(lines)
    if hasattr(k, "format"):   # a kernel with its own printer (attention_kernel.py)
        return k.format()
    if isinstance(k, CheckKernel):
        return (f"kernel {k.name}  // {k.what}\n  for i in [0, {k.numel}): "
                f"if not 0 <= {k.buf!r}[i] < {k.bound}: return {k.code}")
    raise TypeError(k)


def format_program(p: Program) -> str:
    head = [f"// rlxc loops: @{p.name}, workspace {p.workspace_size} bytes"]
    for b in p.buffers:
        head.append(f"//   {b.describe()}")
    body = [format_kernel(k) for k in p.kernels]
    return "\n".join(head) + "\n\n" + "\n\n".join(body) + "\n"

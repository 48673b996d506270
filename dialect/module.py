"""Modules of the rlx dialect: building, printing, parsing, and the signature.

A traced function is one `func.func` in a `builtin.module`. Its arguments are
the inputs and params in declaration order, each carrying
`{rlx.kind = "input" | "param", rlx.name = "..."}`; its results are the outputs.
"""
from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects import builtin, func
from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, ModuleOp, StringAttr
from xdsl.ir import Block, Region
from xdsl.parser import Parser
from xdsl.printer import Printer

from .ops import OPS, RLX, SYMBOLIC_OPS, CastOp, ConstantOp, create_op
from .trace import KINDS, Arg, Trace  # noqa: F401  (Arg, KINDS re-exported)
from .types import dense_value, hex_form
from .types import (
    BytesAttr,
    DenseIntOrFPElementsAttr,
    dims_attr,
    dtype_of,
    shape_of,
    tensor_type,
)


def context() -> Context:
    ctx = Context()
    ctx.load_dialect(builtin.Builtin)
    ctx.load_dialect(func.Func)
    ctx.load_dialect(RLX)
    return ctx


def arg_attr(a: Arg) -> DictionaryAttr:
    d = {"rlx.kind": StringAttr(a.kind), "rlx.name": StringAttr(a.name)}
    if any(isinstance(x, str) for x in a.shape):   # dynamic dims: their symbol names
        d["rlx.dims"] = dims_attr(a.shape)
    return DictionaryAttr(d)


def new_function(name: str, args: list[Arg], block: Block | None = None
                 ) -> tuple[ModuleOp, func.FuncOp, Block]:
    """A function with the given signature around `block` (a new empty one by default,
    whose args are created from `args`); the caller fills it and calls finish_function."""
    types = [tensor_type(a.shape, a.dtype) for a in args]
    if block is None:
        block = Block(arg_types=types)
        for a, v in zip(args, block.args):
            v.name_hint = _hint(a.name)
    f = func.FuncOp(name, (types, []), Region(block),
                    arg_attrs=ArrayAttr([arg_attr(a) for a in args]))
    return ModuleOp([f]), f, block


def _hint(name: str) -> str | None:
    ok = name.replace("_", "a").replace(".", "a").isalnum() and not name[0].isdigit()
    return name.replace(".", "_") if ok else None


def finish_function(f: func.FuncOp, block: Block, outputs) -> None:
    """Append the return and fix the function type to the outputs."""
    block.add_op(func.ReturnOp(*outputs))
    f.function_type = builtin.FunctionType.from_lists(
        [a.type for a in block.args], [o.type for o in outputs])


def get_func(module: ModuleOp) -> func.FuncOp:
    fs = [op for op in module.ops if isinstance(op, func.FuncOp)]
    if len(fs) != 1:
        raise ValueError(f"an rlx module holds exactly one func.func, found {len(fs)}")
    return fs[0]


def signature(f: func.FuncOp) -> list[Arg]:
    """The named inputs and params of a traced function, in declaration order."""
    out = []
    attrs = f.arg_attrs.data if f.arg_attrs is not None else [None] * len(f.args)
    for i, (v, d) in enumerate(zip(f.args, attrs)):
        if d is None or "rlx.name" not in d.data or "rlx.kind" not in d.data:
            raise ValueError(f"argument #{i} of @{f.sym_name.data} lacks rlx.name / rlx.kind")
        kind = d.data["rlx.kind"].data
        if kind not in KINDS:
            raise ValueError(f"argument #{i}: rlx.kind must be input or param, got {kind!r}")
        out.append(Arg(d.data["rlx.name"].data, kind, shape_of(v.type), dtype_of(v.type)))
    names = [a.name for a in out]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"duplicate argument names: {sorted(dup)}")
    return out


def outputs(f: func.FuncOp):
    ret = f.body.block.last_op
    if not isinstance(ret, func.ReturnOp):
        raise ValueError(f"@{f.sym_name.data} must end with func.return")
    return list(ret.arguments)


def from_trace(tr: Trace) -> ModuleOp:
    """The module of a finished light trace (dialect/trace.py), verified.

    Replays its events in order: arguments (with the tracer's name hints), ops
    with the result types the tracer inferred (checked again by the verifier,
    which runs each op's shape function on xDSL types), calls by cloning the
    callee."""
    block = Block()
    vals: dict = {}
    for a, v in zip(tr.args, tr.arg_values):
        x = block.insert_arg(tensor_type(a.shape, a.dtype), len(block.args))
        if a.name.replace("_", "a").isalnum() and not a.name[0].isdigit():
            x.name_hint = a.name
        vals[v.index] = x
    replay(tr.events, block, vals)
    mod, f, block = new_function(tr.name, tr.args, block)
    finish_function(f, block, [vals[v.index] for v in tr.outputs])
    mod.verify()
    return mod


def replay(events, block: Block, vals: dict) -> None:
    """Append the ops of trace `events` to `block`; `vals` maps value numbers to SSA values
    (the arguments on entry).  Region ops build their bodies the same way, recursively."""
    for e in events:
        if isinstance(e, Arg):
            continue
        operands = [vals[v.index] for v in e.operands]
        if e.op in ("rlx.scan", "rlx.while", "rlx.if"):
            from .control import from_trace_node
            op = from_trace_node(e, operands, replay)
            block.add_op(op)
            for r, x in zip(e.results, op.results):
                vals[r.index] = x
            continue
        if e.op == "call":
            f, outs, _ = e.data
            mapping = dict(zip(f.args, operands))
            for op in f.body.block.ops:
                if op is f.body.block.last_op:
                    break
                block.add_op(op.clone(value_mapper=mapping))
            for r, o in zip(e.results, outs):
                vals[r.index] = mapping.get(o, o)
            continue
        (r,) = e.results
        typ = tensor_type(r.type.shape, r.type.dtype)
        if e.op == "rlx.constant":
            op = ConstantOp.create(result_types=[typ], properties={
                "value": DenseIntOrFPElementsAttr(typ, BytesAttr(e.data[2]))})
        elif e.op == "rlx.cast":
            op = CastOp.create(operands=operands, result_types=[typ])
        else:
            op = create_op(OPS[e.op] if e.op in OPS else SYMBOLIC_OPS[e.op], operands, typ,
                           **e.params)
        block.add_op(op)
        vals[r.index] = op.results[0]


def parse(text: str) -> ModuleOp:
    m = Parser(context(), text).parse_module()
    m.verify()
    get_func(m)
    return m


def parse_any(text: str) -> ModuleOp:
    """Parse a module of one or more func.funcs (e.g. `--emit rlx --train`'s model and
    train step), verified; generic (`"rlx.add"(...)`) and custom op forms both parse."""
    m = Parser(context(), text).parse_module()
    m.verify()
    if not functions(m):
        raise ValueError("the module holds no func.func")
    return m


def functions(module: ModuleOp) -> list[func.FuncOp]:
    return [op for op in module.ops if isinstance(op, func.FuncOp)]


def split(module: ModuleOp) -> list[ModuleOp]:
    """One single-function module per func.func of `module` (clones), in order."""
    return [ModuleOp([f.clone()]) for f in functions(module)]


def join(modules: list[ModuleOp]) -> ModuleOp:
    """One module holding the functions of `modules` in order (clones); names must differ."""
    fs = [f.clone() for m in modules for f in functions(m)]
    names = [f.sym_name.data for f in fs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"cannot join modules: function @{dup[0]} is defined twice")
    return ModuleOp(fs)


def looks_like_mlir(text: str) -> bool:
    """Whether `text` (a file's start) is MLIR module text rather than something else
    (used to accept MLIR by content whatever the file's suffix)."""
    import re

    t = re.sub(r"^(\s*//[^\n]*\n|\s+)*", "", text[:4096])
    return t.startswith(("builtin.module", "module", '"builtin.module"', "func.func",
                         '"func.func"'))


def to_text(module: ModuleOp) -> str:
    return str(module)


def to_generic_text(module: ModuleOp) -> str:
    """MLIR's generic op form (`"rlx.add"(%0, %1) : (...) -> ...`, properties as
    `<{...}>`): the text upstream MLIR parses with unregistered dialects allowed, and that
    `parse` reads back."""
    import io

    out = io.StringIO()
    _GenericPrinter(stream=out, print_generic_format=True).print_op(module)
    return out.getvalue()


class _GenericPrinter(Printer):
    """xDSL's generic printer, with float constants that are non-finite or large in MLIR's
    hex form `dense<"0x...">` (xDSL prints inf as its bit pattern read as an integer; hex is
    exact, and it is what rlx.constant's custom form prints too)."""

    def print_attribute(self, attribute) -> None:
        if isinstance(attribute, DenseIntOrFPElementsAttr):
            if hex_form(dense_value(attribute)):
                self.print_string(f'dense<"0x{attribute.data.data.hex().upper()}"> : ')
                return super().print_attribute(attribute.type)
        return super().print_attribute(attribute)


def clone(module: ModuleOp) -> ModuleOp:
    return module.clone()

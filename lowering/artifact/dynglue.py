"""The size-generic C glue of a Func with dynamic dims (issue 14): one library, any size.

    ArtifactSpec.dims ["B", ...]  +  one DynKernel per compiled kernel
          │ tensor tables (glue.tensor_table): a dynamic axis is stored as -1 - (its dim's index)
          │ per kernel: workspace bytes as linear forms {c0, k_0, ..., k_n} over the
          │   sizes (lowering/cpu/dynsizes.py's plan; a static kernel: {bytes, 0, ...})
          │ kernel_call(k, sizes, ...): each dynamic kernel takes the sizes in its own
          │   symbol order (rlx_K(in, out, par, ws, d)); a static one takes none
          ▼
    the values of glue.c.in's `dyn` sections (set_dims, ensure_ws, kernel_call)

NAME_set_dims validates the sizes (>= 1; every input, output and workspace size
computed with overflow checks) and only then makes them current; the calls grow
each kernel's workspace when the sizes need more (runtime/dyncpu.py's rule).
"""
from __future__ import annotations

from dataclasses import dataclass

from rlxc.runtime.dims import label

from .ctext import c_string, comment

__all__ = ["DynKernel", "NotSizeGeneric", "dyn_values", "compile_kernel"]

KERNEL_NAMES = ("run", "train_step", "train_grads", "train_apply")


@dataclass
class DynKernel:
    """One kernel of a size-generic artifact: its symbol, the symbols of its `dims`
    argument in order (None: a static kernel, no sizes) and its workspace forms
    (ints, or [c0, [[symbol, k], ...]] as lowering/cpu/dynsizes.py writes them)."""

    sym: str
    dims: list | None
    workspace: list


class NotSizeGeneric(ValueError):
    """A Func with dynamic dims whose graph no single library serves (the message says
    why and that `rlxc compile --sizes NAME=SIZE` builds one library per size)."""


def compile_kernel(module, sym: str, cpu: str, what: str, spec):
    """(object bytes, errors {code: [kind, msg]}, DynKernel) of one kernel of a dynamic
    artifact: size-generic when its module has symbols (lowering/cpu/dynsizes.py),
    else the static lowering."""
    from rlxc.lowering.cpu.dynsizes import compile_dynamic, module_symbols
    from rlxc.lowering.cpu.symint import DynamicSizeError

    syms = module_symbols(module)
    if not syms:
        from rlxc.lowering.cpu.driver import compile_cpu

        art = compile_cpu(module, sym, cpu=cpu, link=False)
        return art.object, art.errors, DynKernel(sym, None, [int(art.workspace_size)])
    try:
        meta = compile_dynamic(module, sym, cpu, link=False)
    except DynamicSizeError as e:
        dims = [label(d) for d in spec.dims]
        raise NotSizeGeneric(
            f"the Func {spec.func.name!r} has dynamic dimensions {dims}, but its {what} is "
            f"not size-generic under the CPU lowering ({e}); pass "
            + " ".join(f"--sizes {d}=SIZE" for d in dims)
            + " to build a library for one size") from None
    unknown = [s for s in meta["dims"] if s not in spec.dims]
    if unknown:   # pragma: no cover - a kernel's symbols come from the model's inputs
        raise NotSizeGeneric(f"{what}: dimensions {unknown} are not inputs' dimensions")
    return meta["object"], meta["errors"], DynKernel(sym, list(meta["dims"]),
                                                     list(meta["workspace"]))


def _form(w, dims: list) -> list[int]:
    """A workspace form as {c0, k per dim (dims order)}."""
    if isinstance(w, int):
        return [w] + [0] * len(dims)
    c0, terms = w
    row = [int(c0)] + [0] * len(dims)
    for s, k in terms:
        row[1 + dims.index(s)] += int(k)
    return row


def _offsets(lst, start: int) -> tuple[list[int], int]:
    out = []
    for t in lst:
        out.append(start)
        start += len(t.shape)
    return out, start


def _externs(kernels: dict) -> str:
    lines = []
    for k in sorted(kernels):
        kern = kernels[k]
        if kern.dims is None:
            lines.append(f"extern int32_t rlx_{kern.sym}(void **inputs, void **outputs, "
                         "void **params, void *workspace);")
        else:
            lines.append(f"extern int32_t rlx_{kern.sym}(void **inputs, void **outputs, "
                         "void **params, void *workspace,\n"
                         "                                const int64_t *dims);")
    return "\n".join(lines)


def _call(kernels: dict, dims: list) -> str:
    cases = []
    for k in sorted(kernels):
        kern = kernels[k]
        if kern.dims is None:
            cases.append(f"    case {k}:\n        return rlx_{kern.sym}(in, out, par, ws);")
        else:
            d = ", ".join(f"dims[{dims.index(s)}]" for s in kern.dims) or "0"
            sizes = comment(", ".join(map(label, kern.dims)))
            cases.append(f"    case {k}: {{ /* sizes {sizes} */\n"
                         f"        const int64_t d[] = {{{d}}};\n"
                         f"        return rlx_{kern.sym}(in, out, par, ws, d);\n    }}")
    return ("/* Kernel k (0 run, 1 train_step, 2 train_grads, 3 train_apply) at the sizes "
            "`dims`\n * (DIM_NAMES order): each dynamic kernel takes them in its own order. "
            "*/\nstatic int32_t kernel_call(int k, const int64_t *dims, void **in, void **out, "
            "void **par,\n                           void *ws)\n{\n    (void)dims;\n"
            "    switch (k) {\n" + "\n".join(cases) +
            "\n    default:\n        return -1;\n    }\n}")


def dyn_values(spec, kernels: dict) -> dict:
    """The holes of glue.c.in's dyn sections: size tables, kernel externs and kernel_call
    (the tensor tables are glue.tensor_table's, with the dynamic axes encoded)."""
    dims = list(spec.dims)
    in_off, end = _offsets(spec.inputs, 0)
    out_off, end = _offsets(spec.outputs, end)
    ws, counts = [], []
    for k in range(4):   # a kernel the artifact lacks: one zero form (never called)
        kern = kernels.get(k)
        rows = [_form(w, dims) for w in (kern.workspace if kern else [])]
        rows = rows or [[0] * (1 + len(dims))]
        counts.append(len(rows))
        body = ", ".join("{" + ", ".join(str(v) for v in r) + "}" for r in rows)
        ws.append(f"static const int64_t WS{k}[][1 + NDIM] = {{{body}}}; "
                  f"/* {KERNEL_NAMES[k]} */")
    names = ", ".join(c_string(label(d)) for d in dims)   # header.py's DIM_NAMES
    listing = ", ".join(label(d) for d in dims)
    tables = "\n".join([
        f"#define NDIM {len(dims)}",
        f"static const char *const DIM_NAMES[] = {{{names}}};",
        f"#define DIM_LIST {c_string(listing)}",
        "/* where each input's and output's current shape starts in ctx->shp */",
        f"#define NSHP {max(1, end)}",
        f"static const int IN_SHP[] = {{{', '.join(map(str, in_off)) or '0'}}};",
        f"static const int OUT_SHP[] = {{{', '.join(map(str, out_off)) or '0'}}};",
        "/* workspace bytes of each kernel: the max over its forms of c0 + sum_j k_j * size_j */",
        *ws,
        "static const struct {\n    const int64_t (*f)[1 + NDIM];\n    int n;\n} WS[4] = {"
        + ", ".join(f"{{WS{k}, {n}}}" for k, n in enumerate(counts)) + "};",
        "",
        _call(kernels, dims),
    ])
    return {"dyn_tables": tables, "dyn_externs": _externs(kernels)}

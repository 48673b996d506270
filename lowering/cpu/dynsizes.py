"""One loop program for every size: a dynamic rlx module -> a Program over SymInts.

    module with symbols (B, ...)
          │ lower the static specialization at sample sizes: a base point, one step
          │ per symbol, and a check point (dialect/specialize.py + schedule.build_program)
          │ merge: walk the programs in parallel; every structure must be identical and
          │ every int that differs is fitted as c0 + sum k_s * s (symint.SymInt),
          │ then must reproduce the check point
          ▼
    Program whose trip counts, strides, sgemm M/N/K and buffer sizes are SymInts
          │ plan: workspace offsets as linear functions, placed so that no two live
          │ temps overlap at ANY sizes >= 1 (pairwise linear inequalities)
          ▼
    codegen (codegen.py with p.dims): sizes are i64 arguments of the entry and kernels

A lowering that decides something from a size (a comparison, a division, a product
of two sizes, a different fusion or kernel choice) makes the programs differ in
structure or the fit fail: `DynamicSizeError` names why, and the caller keeps one
program per size for that graph.  The samples are large (>= 1021) so that choices
that saturate (sgemm blocking, packing space) are already at their general form;
index simplifications proven at a large extent stay valid at a smaller one.
"""
from __future__ import annotations

import dataclasses

from rlxc.lowering.cpu.loops import Const, Op
from rlxc.lowering.cpu.symint import DynamicSizeError, SymInt, always_le, upper64


def x0dt(xs) -> str:
    return xs[0].dtype


def samples(symbols: list) -> list[dict]:
    base = {s: 1021 + 50 * j for j, s in enumerate(symbols)}
    envs = [base]
    for s in symbols:
        envs.append({**base, s: base[s] + 12})
    envs.append({s: 2003 + 71 * j for j, s in enumerate(symbols)})   # the check point
    return envs


class _Merger:
    def __init__(self, envs: list[dict]):
        self.envs = envs
        self.syms = list(envs[0])
        self.memo: dict = {}

    def fit(self, xs, where):
        base, check = self.envs[0], self.envs[-1]
        coef = {}
        for j, s in enumerate(self.syms):
            d = xs[1 + j] - xs[0]
            step = self.envs[1 + j][s] - base[s]
            if d % step:
                raise DynamicSizeError(f"{where}: {xs[0]}, {xs[1 + j]} is not linear in {s}")
            coef[s] = d // step
        c0 = xs[0] - sum(k * base[s] for s, k in coef.items())
        v = SymInt(0, ()) + c0 + sum((SymInt(0, ((s, k),)) for s, k in coef.items() if k), 0)
        if (v.eval(check) if isinstance(v, SymInt) else v) != xs[-1]:
            raise DynamicSizeError(f"{where}: {xs} is not a linear function of the sizes")
        return v

    def reciprocal(self, xs, where):
        """A float constant c / s (a mean's 1/B): c / float(size) computed per call."""
        for s in self.syms:
            c = xs[0].value * self.envs[0][s]
            if all(abs(c / env[s] - x.value) <= 1e-6 * abs(x.value)
                   for env, x in zip(self.envs, xs)):
                n = Op("cast", (Const(SymInt(0, ((s, 1),)), "i64"),), x0dt(xs))
                return Op("div", (Const(c, x0dt(xs)), n), x0dt(xs))
            k = (xs[1 + self.syms.index(s)].value - xs[0].value) / \
                (self.envs[1 + self.syms.index(s)][s] - self.envs[0][s])
            a = xs[0].value - k * self.envs[0][s]
            if all(abs(a + k * env[s] - x.value) <= 1e-6 * abs(x.value)
                   for env, x in zip(self.envs, xs)):   # a float size: c * s (+ a)
                n = Op("cast", (Const(SymInt(0, ((s, 1),)), "i64"),), x0dt(xs))
                if k != 1:
                    n = Op("mul", (Const(k, x0dt(xs)), n), x0dt(xs))
                return Op("add", (Const(a, x0dt(xs)), n), x0dt(xs)) if a else n
        raise DynamicSizeError(f"{where}: a float constant depends on the sizes "
                               f"({[x.value for x in xs]})")

    def m(self, xs, where="program"):
        x0 = xs[0]
        t = type(x0)
        if any(type(x) is not t for x in xs):
            raise DynamicSizeError(f"{where}: {[type(x).__name__ for x in xs]}")
        if t is bool and any(x != x0 for x in xs) and where.endswith((".parallel", ".stream")):
            # a loop split over threads at some size: the split is a runtime decision
            # (work vs min_work per call); streaming stores are only an optimization
            return where.endswith(".parallel")
        if x0 is None or t in (bool, str, float, bytes, bytearray):
            if any(x != x0 for x in xs):
                raise DynamicSizeError(f"{where}: {t.__name__} differs between sizes")
            return x0
        if t is int:
            return x0 if all(x == x0 for x in xs) else self.fit(xs, where)
        key = id(x0)
        if key in self.memo:
            got, ids = self.memo[key]
            if ids == tuple(id(x) for x in xs):
                return got
            if not (dataclasses.is_dataclass(x0) and x0.__dataclass_params__.frozen):
                raise DynamicSizeError(f"{where}: shared object differs between sizes")
            key = None   # a value object shared differently: merge this use afresh
        if t is Const and isinstance(x0.value, float) and any(x.value != x0.value for x in xs):
            out = self.reciprocal(xs, where)
        elif t in (list, tuple):
            if any(len(x) != len(x0) for x in xs):
                raise DynamicSizeError(f"{where}: lengths differ between sizes")
            out = t(self.m([x[i] for x in xs], where) for i in range(len(x0)))
        elif t is dict:
            if any(len(x) != len(x0) for x in xs):
                raise DynamicSizeError(f"{where}: dict sizes differ")
            items = [list(x.items()) for x in xs]
            out = {self.m([it[i][0] for it in items], where):
                   self.m([it[i][1] for it in items], where) for i in range(len(x0))}
        elif dataclasses.is_dataclass(x0):
            out = object.__new__(t)
            if key is not None:
                self.memo[key] = (out, tuple(id(x) for x in xs))
            for f in dataclasses.fields(x0):
                object.__setattr__(out, f.name, self.m([getattr(x, f.name) for x in xs],
                                                       f"{where}.{f.name}"))
            return out
        else:
            raise DynamicSizeError(f"{where}: cannot merge {t.__name__}")
        if key is not None:
            self.memo[key] = (out, tuple(id(x) for x in xs))
        return out


Merger = _Merger   # public: the GPU's size-generic build merges its plans with it (gpu/dynplan.py)


def plan(program) -> list:
    """Workspace offsets (linear) for the merged program's temps, no two live temps
    overlapping at any sizes; returns the candidate workspace ends (size = their max)."""
    from rlxc.lowering.cpu.buffers import liveness
    from rlxc.lowering.cpu.loops import DTYPE_BYTES

    liveness(program)
    temps = [b for b in program.buffers if b.kind == "temp" and b.first >= 0]
    need = {id(b): upper64(max_one(b.numel * DTYPE_BYTES[b.dtype])) for b in temps}
    ones = {s: 1 for s in program.dims}
    big = {s: 4096 for s in program.dims}
    temps.sort(key=lambda b: (-_at(need[id(b)], big), b.first))
    placed, ends = [], []
    for b in temps:
        live = [p for p in placed if not (p.last < b.first or b.last < p.first)]
        cands = [0] + [p.offset + need[id(p)] for p in live]
        cands.sort(key=lambda o: (_at(o, big), _at(o, ones)))
        cands.append(_upper_all(cands))   # above every live end at every size: always fits
        for off in cands:
            end = off + need[id(b)]
            if all(always_le(end, p.offset) or always_le(p.offset + need[id(p)], off)
                   for p in live):
                break
        else:  # pragma: no cover - _upper_all of the live ends always fits
            raise DynamicSizeError(f"no workspace offset for temp {b.name}")
        b.offset = off
        placed.append(b)
        ends.append(end)
    for b in program.buffers:
        if b.kind == "temp" and b.first < 0:
            b.offset = -1
    uniq = []
    for e in ends:   # drop ends that another end bounds at every size
        if e not in uniq:
            uniq.append(e)
    keep = [e for e in uniq if not any(f != e and always_le(e, f) for f in uniq)]
    return keep or [0]


def _upper_all(xs):
    """A linear bound >= every x of xs at every size >= 0: the coefficient-wise max
    (linear ends are not totally ordered: 4608*B + 1152 vs 5632*B + 64 cross)."""
    const, coef = 0, {}
    for x in xs:
        c, k = SymInt.parts(x)
        const = max(const, c)
        for s, v in k.items():
            coef[s] = max(coef.get(s, 0), v)
    return SymInt(const, ()) + sum((SymInt(0, ((s, k),)) for s, k in coef.items() if k), 0)


def max_one(x):
    return x if isinstance(x, SymInt) else max(int(x), 1)


def _at(x, env):
    return x.eval(env) if isinstance(x, SymInt) else x


def lower_dynamic(module, symbols: list, name: str, cpu: str = "native",
                  max_threads: int | None = None):
    """The merged (size-generic) Program of a dynamic rlx module, planned; raises
    DynamicSizeError when no single program serves every size."""
    from rlxc.dialect.passes import cleanup
    from rlxc.dialect.specialize import specialize
    from rlxc.lowering.cpu.driver import default_threads
    from rlxc.lowering.cpu.rowfuse import fuse_rows
    from rlxc.lowering.cpu.rowlocal import common, local_plan, localize
    from rlxc.lowering.cpu.schedule import build_program
    from rlxc.lowering.shared.segments import has_regions

    if has_regions(module):   # regions.py lowers control flow per static program only
        raise DynamicSizeError("control flow (rlx.scan/while/if) in a size-generic CPU "
                               "program: one program per size")
    envs = samples(symbols)
    sizes = frozenset(v for env in envs for v in env.values())
    progs = []
    for env in envs:
        try:
            mod = cleanup(specialize(module, env, keep_iota=True))   # iota: computed
        except NotImplementedError as e:
            raise DynamicSizeError(str(e)) from None
        progs.append(fuse_rows(build_program(mod, name, max_threads or default_threads(), cpu,
                                             sizes)))
    shared = common([local_plan(p) for p in progs])   # the same per-thread blocks at every size
    for p in progs:
        localize(p, shared)
    merged = _Merger(envs).m(progs)
    merged.dims = list(symbols)
    from rlxc.dialect.module import get_func, signature

    merged.args = signature(get_func(module))   # the symbolic shapes
    merged.sample = progs[0]
    merged.workspace_ends = plan(merged)
    merged.workspace_size = -1
    _batch_split(merged, module, symbols, max_threads or default_threads())
    return merged


def _batch_split(merged, module, symbols, tcap: int) -> None:
    """Decide whether the entry runs one region over row chunks (batchsplit.py); when it
    does, the workspace also holds tcap per-thread slices."""
    from rlxc.lowering.cpu.batchsplit import Decision, decide, split_ends

    d = decide(module, symbols) if tcap > 1 else Decision(None, "compiled for one thread")
    merged.batch_split, merged.split_threads = d, tcap
    merged.body_workspace_ends = list(merged.workspace_ends)
    if d.symbol is not None:
        merged.workspace_ends = merged.workspace_ends + split_ends(merged.workspace_ends,
                                                                   d.symbol, tcap)


def module_symbols(module) -> list:
    """The module's dimension symbols in order of first use by its arguments."""
    from rlxc.dialect.module import get_func, signature

    out = []
    for a in signature(get_func(module)):
        for d in a.shape:
            if isinstance(d, str) and d not in out:
                out.append(d)
    return out


def compile_dynamic(module, name: str, cpu: str = "native", opt: int = 3,
                    so_path: str | None = None, max_threads: int | None = None,
                    link: bool = True) -> dict:
    """Compile a dynamic rlx module to ONE shared library for every size.  Returns the
    metadata runtime/dyncpu.py loads (with "so_path", and the kernel "object"; with
    link=False no library is linked and "so_path" is None: the AOT writer links the
    object with its C glue); DynamicSizeError if the graph is not size-generic."""
    import os
    import shutil
    import tempfile
    import atexit

    from rlxc.lowering.cpu.codegen import generate
    from rlxc.lowering.cpu.dedup import merge_identical
    from rlxc.lowering.cpu.driver import has_parallel_kernels
    from rlxc.lowering.cpu.dynentry import shape_json, symint_json
    from rlxc.lowering.cpu.loops import MatmulKernel
    from rlxc.lowering.cpu.sgemm_object import relocatable_link, sgemm_object
    from rlxc.lowering.cpu.target import compile_objects, link_shared
    prog = lower_dynamic(module, module_symbols(module), name, cpu, max_threads)
    m = generate(prog, cpu)   # a size used as a number there raises DynamicSizeError (symint)
    if prog.batch_split.symbol is not None:
        from rlxc.lowering.cpu.batchsplit_entry import emit_split_entry
        from rlxc.lowering.cpu.tuning import PAR_MIN_WORK

        emit_split_entry(m, prog, prog.split_threads, PAR_MIN_WORK)
    text, _ = merge_identical(str(m))
    try:
        objs = compile_objects(text, cpu, opt)
    except RuntimeError as e:
        raise DynamicSizeError(f"LLVM rejected the size-generic program: {e}") from None
    variants = sorted({"plain" if k.epilogue is None else "cb" for k in prog.kernels
                       if isinstance(k, MatmulKernel)})
    objs += [sgemm_object(cpu, v) for v in variants]
    obj = relocatable_link(objs, cpu) if len(objs) > 1 else objs[0]
    if not link:
        so_path = None
    elif so_path is None:
        tmp = tempfile.mkdtemp(prefix=f"rlxc-p{os.getpid()}-")
        atexit.register(shutil.rmtree, tmp, True)
        so_path = os.path.join(tmp, f"lib{name}.so")
    if link:
        link_shared([obj], so_path, cpu=cpu)
    return {"abi": 1, "name": name, "entry": f"rlx_{name}", "dims": list(prog.dims),
            "workspace_symbol": f"rlx_{name}_workspace_size",
            "workspace": [symint_json(e) for e in prog.workspace_ends],
            "args": [{"name": a.name, "kind": a.kind, "shape": list(a.shape),
                      "dtype": a.dtype} for a in prog.args],
            "outputs": [{"shape": shape_json(s), "dtype": d} for s, d in prog.outputs],
            "errors": {str(k): list(v) for k, v in prog.errors.items()},
            "error_args": {str(k): list(v) for k, v in prog.error_args.items()},
            "parallel": has_parallel_kernels(prog.sample, cpu) or
            prog.batch_split.symbol is not None, "cpu": cpu,
            "batch_split": prog.batch_split.to_json(),
            "so_path": so_path, "object": obj}

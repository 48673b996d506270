"""One GPU program for every size: a dynamic rlx module -> size-generic kernels + size functions.

    module with symbols (B, ...)
          │ build the kernels of the static specialization at the CPU path's sample
          │ sizes (lowering/cpu/dynsizes.samples: a base, one step per symbol, a check
          │ point), in size-generic mode (kernels.build_kernels(dims=...)): every kernel
          │ takes one i64 per symbol, grid-stride steps and round counts come from the
          │ launch's grid (nctaid), each launch records its grid rule, the reduction
          │ strategies are chosen once (at the first sample) and the matmul tile
          │ config does not depend on the sizes
          │ merge the LLVM IR texts token by token: everything must be identical except
          │ integer/float literals, and each literal that differs is fitted as
          │ c0 + sum k_s * s (symint.SymInt, checked at the check point) and replaced by
          │ a value computed from the size arguments at the top of its function
          │ merge the plans (dynsizes.Merger): buffer sizes, grid rules, shapes linear
          │ place buffers: offsets are linear functions, no two live work buffers
          │ overlap at ANY sizes >= 1 (the CPU's pairwise linear test, symint.always_le)
          ▼
    (IR text, meta "rlxc-cuda-dyn-1", consts): runtime/dyncuda.py evaluates grids,
    offsets, region sizes and output shapes per call

A lowering that decides something from a size (a different fusion, strategy or
literal that is not linear) makes the texts or plans differ: `DynamicSizeError`
names why, and the caller keeps one program per size (rlxc/dynamic.py).  Index
arithmetic stays 32-bit where the samples chose it; the runtime refuses a call
whose tensors outgrow it.  Control flow (rlx.scan/while/if) is refused.
"""
from __future__ import annotations

import re
import struct

from rlxc.lowering.cpu.dynsizes import Merger, max_one, module_symbols, samples
from rlxc.lowering.cpu.symint import DynamicSizeError, SymInt, always_le

ALIGN = 256
VEC = 16                         # bytes of the widest vector load/store (<4 x float>)
INDEX_LIMIT = 2 ** 31 - 1024     # elements per tensor with 32-bit index arithmetic
FORMAT = "rlxc-cuda-dyn-1"

_TOK = re.compile(r'%"[^"]*"|@"[^"]*"|!"[^"]*"|c"[^"]*"|"[^"]*"|[%@!][-\w.$]+'
                  r'|0x[0-9A-Fa-f]+|-?\d+(?:\.\d+)?(?:e[+-]?\d+)?|[A-Za-z_.$][\w.$]*|\s+|.')
_NUM = re.compile(r'0x[0-9A-Fa-f]+|-?\d+')
_TYPE = re.compile(r'i\d+|float|double|half')


def up(x):
    """An upper bound of x for every size >= 1, still linear: the constant rounded up
    to 256 bytes, each size's coefficient to 16 (the widest vector access), so every
    offset is 16-byte aligned at any size (and 256-aligned where no size enters)."""
    if not isinstance(x, SymInt):
        return max(ALIGN, (int(x) + ALIGN - 1) // ALIGN * ALIGN)
    return SymInt(0, ()) + ((x.const + ALIGN - 1) // ALIGN * ALIGN) + \
        sum((SymInt(0, ((s, (k + VEC - 1) // VEC * VEC),)) for s, k in x.coef), 0)


def js(x):
    return x.to_json() if isinstance(x, SymInt) else int(x)


# ---------------------------------------------------------------- the IR text merge

def _float_of(tok: str) -> float:
    return struct.unpack(">d", int(tok, 16).to_bytes(8, "big"))[0]


class _TextMerge:
    """Merge the IR texts of the samples; differing literals become size values."""

    def __init__(self, merger: Merger, dims: list):
        self.mg, self.dims = merger, dims

    def run(self, texts: list[str]) -> str:
        lines = [t.splitlines() for t in texts]
        if any(len(x) != len(lines[0]) for x in lines):
            raise DynamicSizeError("GPU kernels: the IR differs in length between sizes")
        out, fn_start, fn_vals = [], None, {}
        for n, row in enumerate(zip(*lines)):
            ln = row[0]
            if ln.startswith("define "):
                fn_start, fn_vals = len(out), {}
            if all(r == ln for r in row):
                out.append(ln)
            else:
                out.append(self._line(row, fn_vals, n))
            if ln.startswith("}") and fn_vals:
                self._emit(out, fn_start, fn_vals)
                fn_vals = {}
        return "\n".join(out) + "\n"

    def _line(self, row, vals, n) -> str:
        toks = [_TOK.findall(r) for r in row]
        if any(len(t) != len(toks[0]) for t in toks):
            raise DynamicSizeError(f"GPU kernels: IR line {n} differs between sizes: "
                                   f"{row[0].strip()[:80]}")
        res = []
        for j, group in enumerate(zip(*toks)):
            t0 = group[0]
            if all(t == t0 for t in group):
                res.append(t0)
                continue
            if not all(_NUM.fullmatch(t) for t in group):
                raise DynamicSizeError(f"GPU kernels: IR line {n} differs between sizes "
                                       f"({t0!r} vs {group[-1]!r})")
            nxt = next((t for t in toks[0][j + 1:] if not t.isspace()), "")
            if nxt == "x":
                raise DynamicSizeError(f"GPU kernels: a type's extent depends on the sizes "
                                       f"({row[0].strip()[:80]})")
            ty = next((t for t in reversed(toks[0][:j]) if _TYPE.fullmatch(t)), None)
            if ty is None:
                raise DynamicSizeError(f"GPU kernels: a size literal without a type "
                                       f"({row[0].strip()[:80]})")
            if t0.startswith("0x"):
                fl = [_float_of(t) for t in group]
                if any(f != int(f) for f in fl):   # c / size (a mean's gradient: -1/B)
                    key = (self._reciprocal(fl, n), ty)
                    if key not in vals:
                        vals[key] = f'%"sz.{len(vals)}"'
                    res.append(vals[key])
                    continue
                xs = [int(f) for f in fl]
            else:
                xs = [int(t) for t in group]
            v = self.mg.fit(xs, f"GPU kernels line {n}")
            if not isinstance(v, SymInt):   # pragma: no cover - differing xs are never constant
                raise DynamicSizeError(f"GPU kernels line {n}: {xs}")
            key = (v, ty)
            if key not in vals:
                vals[key] = f'%"sz.{len(vals)}"'
            res.append(vals[key])
        return "".join(res)

    def _reciprocal(self, fl: list, n: int) -> tuple:
        """("recip", c, symbol) when every sample's constant is c / size of symbol."""
        for s in self.dims:
            c = fl[0] * self.mg.envs[0][s]
            if round(c) and abs(c - round(c)) <= 1e-5 * abs(c):
                c = float(round(c))
            if all(abs(c / env[s] - x) <= 1e-6 * abs(x) for env, x in zip(self.mg.envs, fl)):
                return ("recip", c, s)
        raise DynamicSizeError(f"GPU kernels line {n}: a float constant depends on the "
                               f"sizes ({fl})")

    def _emit(self, out: list, start: int, vals: dict) -> None:
        """Size computations at the top of the function's entry block."""
        head = out[start]
        for j in range(len(self.dims)):
            if f'%"dim.{j}"' not in head:
                raise DynamicSizeError("GPU kernels: a size literal in a function without "
                                       f"size arguments ({head[:80]})")
        at = next(i for i in range(start, len(out)) if out[i].rstrip().endswith(":")) + 1
        code = []
        for (v, ty), name in vals.items():
            base = name[:-1]
            if isinstance(v, tuple):        # c / float(size)
                _, c, sym = v
                lit = "0x%016X" % struct.unpack(">Q", struct.pack(
                    ">d", struct.unpack("f", struct.pack("f", c))[0] if ty == "float" else c))[0]
                code.append(f'  {base}.f" = sitofp i64 %"dim.{self.dims.index(sym)}" to {ty}')
                code.append(f'  {name} = fdiv {ty} {lit}, {base}.f"')
                continue
            acc, k = str(v.const), 0
            for s, c in v.coef:
                d = f'%"dim.{self.dims.index(s)}"'
                code.append(f'  {base}.m{k}" = mul i64 {d}, {c}')
                code.append(f'  {base}.a{k}" = add i64 {acc}, {base}.m{k}"')
                acc, k = f'{base}.a{k}"', k + 1
            if ty == "i64":
                code.append(f"  {name} = add i64 {acc}, 0")
            elif ty.startswith("i"):
                code.append(f"  {name} = trunc i64 {acc} to {ty}")
            else:
                code.append(f"  {name} = sitofp i64 {acc} to {ty}")
        out[at:at] = code


# ---------------------------------------------------------------- the plan merge

def _records(plan, steps) -> dict:
    from rlxc.dialect.types import dtype_of

    from rlxc.lowering.gpu.plan import DTYPE_BYTES

    esize = {}
    for v, b in plan.buffer_of.items():
        if b.region == "const":
            dt = dtype_of(v.type)
            esize[b.id] = 1 if dt == "i1" else DTYPE_BYTES[dt]
    bufs = [{"id": b.id, "region": b.region, "nbytes": b.nbytes, "first": b.first,
             "last": b.last, "data": b.data, "esize": esize.get(b.id, 0)}
            for b in plan.buffers]
    st = []
    for s in steps:
        s = dict(s)
        s.pop("grid", None)        # per call, from grid_rule
        st.append(s)
    from rlxc.dialect.types import dtype_of, shape_of

    outs = [{"shape": list(shape_of(v.type)), "dtype": dtype_of(v.type),
             "buffer": plan.buffer_of[v].id} for v in plan.outputs]
    errors = {str(k): list(v) for k, v in plan.errors.items()}
    return {"buffers": bufs, "steps": st, "outputs": outs, "errors": errors,
            "error_buffer": plan.error_buffer.id if plan.error_buffer is not None else -1,
            "args": [plan.buffer_of[v].id for v in plan.arg_values]}


def _fills(recs: list) -> None:
    """A constant whose bytes differ between the samples must be a splat (a splat read
    in place by a matmul, sized by a symbol): region "fill", its element kept."""
    for j, b0 in enumerate(recs[0]["buffers"]):
        if b0["region"] != "const" or all(r["buffers"][j]["data"] == b0["data"] for r in recs):
            continue
        first = b0["data"][:b0["esize"]]
        for r in recs:
            b = r["buffers"][j]
            d, e = b["data"], b["esize"]
            if not d or d != d[:e] * (len(d) // e) or d[:e] != first:
                raise DynamicSizeError("a constant of the GPU program depends on the sizes")
            b.update(region="fill", data=None, fill=d[:e].hex())


def place(buffers: list) -> dict:
    """Offsets (linear) per region; work buffers with overlapping live ranges never share
    bytes at any sizes.  Returns {region: [candidate ends]} (its size = their max)."""
    ends: dict = {r: [0] for r in ("input", "param", "const", "work", "fill")}
    cur: dict = {}
    for b in buffers:
        if b["region"] != "work":
            r = b["region"]
            b["offset"] = cur.get(r, 0)
            cur[r] = b["offset"] + up(max_one(b["nbytes"]))
            ends[r] = [cur[r]]
    big = {s: 4096 for s in _syms(buffers)}
    ones = {s: 1 for s in big}
    work = [b for b in buffers if b["region"] == "work"]
    for b in work:
        b["last"] = max(b["last"], b["first"])
    work.sort(key=lambda b: (b["first"], -_at(up(max_one(b["nbytes"])), big)))
    placed, wends = [], []
    for b in work:
        need = up(max_one(b["nbytes"]))
        live = [p for p in placed if not (p["last"] < b["first"] or b["last"] < p["first"])]
        cands = [0] + [p["offset"] + up(max_one(p["nbytes"])) for p in live]
        cands.sort(key=lambda o: (_at(o, big), _at(o, ones)))
        for off in cands:
            end = off + need
            if all(always_le(end, p["offset"]) or
                   always_le(p["offset"] + up(max_one(p["nbytes"])), off) for p in live):
                break
        else:  # pragma: no cover - the largest end of the live buffers always fits
            raise DynamicSizeError(f"no offset for GPU buffer {b['id']}")
        b["offset"] = off
        placed.append(b)
        wends.append(end)
    uniq = []
    for e in wends:
        if e not in uniq:
            uniq.append(e)
    ends["work"] = [e for e in uniq if not any(f != e and always_le(e, f) for f in uniq)] \
        or [0]
    if any(b["region"] == "error" for b in buffers):
        ends["error"] = [cur["error"]]
    return ends


def _syms(buffers) -> set:
    return {s for b in buffers if isinstance(b["nbytes"], SymInt) for s, _ in b["nbytes"].coef}


def _at(x, env):
    return x.eval(env) if isinstance(x, SymInt) else x


def build_dynamic(module, name: str, arch: str = "sm_90", target: str = "gpu"):
    """(merged IR text, meta, consts bytes) of ONE program for every size of a dynamic
    rlx module; DynamicSizeError when no single program serves every size."""
    import llvmlite.binding as llvm

    from rlxc.dialect.module import get_func, signature
    from rlxc.dialect.passes import cleanup
    from rlxc.dialect.specialize import specialize
    from rlxc.lowering.gpu import regions as R
    from rlxc.lowering.gpu.kernels import build_kernels

    module = getattr(module, "module", module)
    if R.has_regions(module):
        raise DynamicSizeError("control flow (rlx.scan/while/if) on the GPU")
    syms = module_symbols(module)
    if not syms:
        raise DynamicSizeError("the module has no size symbols")
    envs = samples(syms)
    texts, recs, consts, decisions = [], [], [], {}
    for env in envs:
        try:
            mod = cleanup(specialize(module, env))
            m, plan, steps = build_kernels(mod, target, dims=syms, decisions=decisions)
        except NotImplementedError as e:
            raise DynamicSizeError(str(e)) from None
        if target == "host":
            m.triple = llvm.get_process_triple()
        texts.append(str(m))
        recs.append(_records(plan, steps))
        consts.append(b"".join(b.data for b in plan.buffers if b.region == "const"))
    _fills(recs)
    mg = Merger(envs)
    rec = mg.m(recs, "gpu plan")
    text = _TextMerge(mg, syms).run(texts)
    bufs = rec["buffers"]
    ends = place(bufs)
    blob, const_list = bytearray(), []
    for b in bufs:
        if b["region"] == "fill":   # a splat sized by the call: filled per size
            const_list.append({"buffer": b["id"], "fill": b["fill"]})
        elif b["region"] == "const":
            const_list.append({"buffer": b["id"], "blob_offset": len(blob),
                               "nbytes": len(b["data"])})
            blob += b["data"]
    args = signature(get_func(module))
    steps = []
    for s in rec["steps"]:
        if "grid_rule" in s:
            s = dict(s, grid_rule=[[js(g[0])] + [int(x) for x in g[1:]] for g in s["grid_rule"]])
        steps.append(s)
    meta = {
        "format": FORMAT, "name": name, "arch": arch, "dims": list(syms),
        "args": [{"name": a.name, "kind": a.kind, "shape": list(a.shape), "dtype": a.dtype,
                  "buffer": bid} for a, bid in zip(args, rec["args"])],
        "outputs": [{"shape": [js(d) for d in o["shape"]], "dtype": o["dtype"],
                     "buffer": o["buffer"]} for o in rec["outputs"]],
        "buffers": [{"id": b["id"], "region": b["region"], "offset": js(b["offset"]),
                     "nbytes": js(b["nbytes"])} for b in bufs],
        "regions": {r: [js(e) for e in es] for r, es in ends.items()},
        "consts": const_list, "steps": steps, "index_limit": INDEX_LIMIT,
    }
    if rec["errors"]:
        meta["errors"] = {"buffer": rec["error_buffer"], "codes": rec["errors"]}
    return text, meta, bytes(blob)


def compile_dynamic_cuda(module, name: str, arch: str = "sm_90", ptxas: bool | str = True,
                         target: str = "gpu") -> tuple[dict, dict]:
    """(meta, blobs) of the size-generic GPU program: "ptx" (PTX, or host LLVM IR for
    the emulator when target="host"), "cubin" when ptxas ran, "consts"."""
    from rlxc.lowering.gpu import nvptx

    text, meta, consts = build_dynamic(module, name, arch, target)
    blobs = {"consts": consts}
    meta["kernels"] = {}
    if target == "host":
        import llvmlite.binding as llvm

        try:
            llvm.parse_assembly(text).verify()
        except RuntimeError as e:
            raise DynamicSizeError(f"LLVM rejected the size-generic kernels: {e}") from None
        blobs["ptx"] = text.encode()
        return meta, blobs
    try:
        ptx = nvptx.emit_ptx(text, arch)
    except Exception as e:   # noqa: BLE001 - NvptxError: the LLVM text is invalid
        raise DynamicSizeError(f"LLVM rejected the size-generic kernels: {e}") from None
    blobs["ptx"] = ptx.encode()
    if ptxas:
        cubin, info = nvptx.assemble(ptx, arch, ptxas if isinstance(ptxas, str) else None)
        if cubin is not None:
            blobs["cubin"] = cubin
        meta["kernels"] = {st["kernel"]: info.get(st["kernel"], {})
                           for st in meta["steps"] if st["op"] == "launch"}
    return meta, blobs

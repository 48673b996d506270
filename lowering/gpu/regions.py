"""GPU lowering of control flow: a host-side loop of kernel launches.

    func with rlx.scan / rlx.while / rlx.if at the top level
          │ split into straight-line segments and region ops (as lowering/cpu/regions.py)
          ▼
    every segment and every region body: its own GpuPlan + kernels (build_kernels),
    kernel names prefixed by the sub-program, buffers renumbered, regions renamed
    "<sub>.<region>"; the llvmlite modules linked into one PTX (or emulation) image
          ▼
    launch plan steps (runtime/cuda_steps.py runs them on the host):
      copy  {src, dst, nbytes, src_step, dst_step}     device-to-device; *_step bytes
                                                       per iteration of the loop around
      loop  {count, reverse, steps}                    scan: copy row t of each xs in,
                                                       body steps, carries out -> in,
                                                       row t of each y out
      while {cond, flag, body}                         cond steps, read the i1 flag back
      if    {pred, pred_bytes, then, else}             read the predicate back

A sub-program reads its own argument buffers: the parent copies values in
(captures once before a loop, carries and rows every iteration) and results
out (carries through the result buffer, so a body that swaps its carries is
safe).  Values crossing between segments live in the "slots" region.  The
index checks of all sub-programs share one error flag, zeroed once per run;
their codes restart at 1 in every sub-program, so one code may name the checks
of several (the message lists them all).
"""
from __future__ import annotations

from rlxc.dialect.module import get_func, outputs, signature
from rlxc.dialect.types import dtype_of, numel, shape_of
from rlxc.lowering.shared.segments import has_regions, segment_module

from rlxc.dialect.shapes import DTYPE_BYTES as _BYTES  # noqa: E402


def _nbytes(v) -> int:
    return numel(shape_of(v.type)) * _BYTES[dtype_of(v.type)]


def _round(n: int) -> int:
    return (max(n, 1) + 255) // 256 * 256


class GpuRegions:
    """Collects the buffers, regions, constants, kernels and errors of every sub-program."""

    def __init__(self, name: str, target: str):
        self.name, self.target = name, target
        self.buffers: list = []          # meta dicts
        self.regions: dict = {"slots": 0}
        self.consts = bytearray()
        self.const_list: list = []
        self.modules: list = []          # llvmlite modules to link
        self.errors: dict = {}
        self.error_id = None
        self._n = 0

    def fresh(self, tag):
        self._n += 1
        return f"{self.name}_{tag}{self._n}"

    def slot(self, nbytes: int) -> int:
        off = self.regions["slots"]
        self.regions["slots"] += _round(nbytes)
        return self._buffer("slots", off, nbytes)

    def _buffer(self, region, offset, nbytes) -> int:
        i = len(self.buffers)
        self.buffers.append({"id": i, "region": region, "offset": offset, "nbytes": nbytes})
        return i

    # ------------------------------------------------------------ one sub-program
    def sub(self, module, name):
        """Lower a function without region ops; (steps, arg buffer ids, output buffer ids)."""
        from rlxc.lowering.gpu.kernels import build_kernels

        f = get_func(module)
        f.sym_name = type(f.sym_name)(name)
        mod, plan, steps = build_kernels(module, self.target)
        self.modules.append(mod)
        ids = {}
        for b in plan.buffers:
            if b.region == "error":
                if self.error_id is None:
                    self.error_id = self._buffer("error", 0, 4)
                    self.regions["error"] = 4
                ids[b.id] = self.error_id
                continue
            region = f"{name}.{b.region}"
            ids[b.id] = self._buffer(region, b.offset, b.nbytes)
        for region, size in plan.regions.items():
            if region != "error":
                self.regions[f"{name}.{region}"] = size
        for b in plan.buffers:
            if b.region == "const":
                self.const_list.append({"buffer": ids[b.id], "blob_offset": len(self.consts),
                                        "nbytes": len(b.data)})
                self.consts += b.data
        for code, v in plan.errors.items():   # codes restart at 1 in every sub-program
            old = self.errors.get(code)
            if old is not None and old[1] != v[1] and v[1] not in old[1]:
                v = (old[0], f"{old[1]} (or: {v[1]})")
            self.errors[code] = v if old is None or old[1] != v[1] else old
        out = []
        for st in steps:
            if st["op"] == "memset":
                if plan.error_buffer is not None and st["buffer"] == plan.error_buffer.id:
                    continue            # zeroed once per run, by the top level
                out.append({**st, "buffer": ids[st["buffer"]]})
            else:
                out.append({**st, "args": [ids[i] for i in st["args"]]})
        return (out, [ids[plan.buffer_of[v].id] for v in plan.arg_values],
                [ids[plan.buffer_of[v].id] for v in plan.outputs])

    def function(self, module, name):
        if has_regions(module):
            return self.segmented(module, name, None)
        return self.sub(module, name)

    # ------------------------------------------------------------ segmented functions
    def segmented(self, module, name, arg_ids):
        """Steps of a function with region ops; its argument buffers are `arg_ids` (made
        here when None); returns (steps, arg ids, output ids)."""
        from rlxc.dialect.control import is_control

        f = get_func(module)
        ops = [op for op in f.body.block.ops if op is not f.body.block.last_op]
        if arg_ids is None:
            arg_ids = [self.slot(_nbytes(v)) for v in f.args]
        where = dict(zip(f.args, arg_ids))
        steps = []
        cur: list = []

        def flush():
            if not cur:
                return
            ins = []
            for op in cur:
                for o in op.operands:
                    if o in where and o not in ins:
                        ins.append(o)
            defined = {r for op in cur for r in op.results}
            later = set(outputs(f))
            after = False
            for op in ops:
                if op is cur[-1]:
                    after = True
                    continue
                if after:
                    later.update(op.operands)
            res = [r for r in defined if r in later]
            res.sort(key=lambda r: [x for op in cur for x in op.results].index(r))
            if res:
                sub_steps, a_ids, o_ids = self.function(segment_module(cur, ins, res),
                                                        self.fresh("seg"))
                steps.extend(_copy(where[v], a, _nbytes(v)) for v, a in zip(ins, a_ids))
                steps.extend(sub_steps)
                for r, o in zip(res, o_ids):
                    where[r] = self.slot(_nbytes(r))
                    steps.append(_copy(o, where[r], _nbytes(r)))
            cur.clear()
        for op in ops:
            if is_control(op):
                flush()
                for r in op.results:
                    where[r] = self.slot(_nbytes(r))
                steps.extend(self.region(op, [where[o] for o in op.operands],
                                         [where[r] for r in op.results]))
            else:
                cur.append(op)
        flush()
        return steps, arg_ids, [where[v] for v in outputs(f)]

    def region(self, op, ins, res):
        from rlxc.dialect.control_ad import body_module

        tag = op.name[4:]
        subs = [self.function(body_module(r), self.fresh(tag)) for r in op.regions]
        nb = [_nbytes(o) for o in op.operands]
        p = op.params()
        if op.name == "rlx.if":
            (ts, ta, to), (es, ea, eo) = subs
            branch = []
            for s, a, o in ((ts, ta, to), (es, ea, eo)):
                body = [_copy(i, x, n) for i, x, n in zip(ins[1:], a, nb[1:])] + s
                body += [_copy(x, r, _nbytes(v)) for x, r, v in zip(o, res, op.results)]
                branch.append(body)
            return [{"op": "if", "pred": ins[0], "pred_bytes": nb[0], "then": branch[0],
                     "else": branch[1]}]
        nc = p["num_carry"]
        out = [_copy(i, r, n) for i, r, n in zip(ins[:nc], res[:nc], nb[:nc])]  # init
        if op.name == "rlx.scan":
            n, nx = p["length"], p["num_xs"]
            (bs, ba, bo), = subs
            out += [_copy(i, a, nb[k]) for k, (i, a) in enumerate(zip(ins, ba))
                    if k >= nc + nx]                                              # captures
            rows = [nb[k] // max(n, 1) for k in range(nc, nc + nx)]
            yrow = [_nbytes(r) // max(n, 1) for r in op.results[nc:]]
            it = [_copy(r, a, nb[k]) for k, (r, a) in enumerate(zip(res[:nc], ba))]
            it += [_copy(ins[nc + j], ba[nc + j], rows[j], src_step=rows[j])
                   for j in range(nx)]
            it += bs
            it += [_copy(o, r, nb[k]) for k, (o, r) in enumerate(zip(bo[:nc], res[:nc]))]
            it += [_copy(o, r, yrow[j], dst_step=yrow[j])
                   for j, (o, r) in enumerate(zip(bo[nc:], res[nc:]))]
            out.append({"op": "loop", "count": n, "reverse": p["reverse"], "steps": it})
            return out
        (cs, ca, co), (bs, ba, bo) = subs
        out += [_copy(i, a, nb[k]) for k, (i, a) in enumerate(zip(ins, ca)) if k >= nc]
        out += [_copy(i, a, nb[k]) for k, (i, a) in enumerate(zip(ins, ba)) if k >= nc]
        cond = [_copy(r, a, nb[k]) for k, (r, a) in enumerate(zip(res[:nc], ca))] + cs
        body = [_copy(r, a, nb[k]) for k, (r, a) in enumerate(zip(res[:nc], ba))] + bs
        body += [_copy(o, r, nb[k]) for k, (o, r) in enumerate(zip(bo, res[:nc]))]
        out.append({"op": "while", "cond": cond, "flag": co[0], "body": body})
        return out


def _copy(src, dst, nbytes, src_step=0, dst_step=0):
    return {"op": "copy", "src": src, "dst": dst, "nbytes": nbytes, "src_step": src_step,
            "dst_step": dst_step}


def link_text(modules) -> str:
    """One LLVM IR text of the sub-programs' kernel modules (LLVM's linker)."""
    import llvmlite.binding as llvm

    from rlxc.lowering.gpu import nvptx
    nvptx._ensure_init()
    main = llvm.parse_assembly(str(modules[0]))
    for m in modules[1:]:
        main.link_in(llvm.parse_assembly(str(m)))
    return str(main)


def build_regions(module, target: str):
    """(IR text of every kernel, meta fields: args, outputs, buffers, regions, consts,
    steps, errors, consts blob) for a module whose function holds region ops."""
    module = getattr(module, "module", module)
    f = get_func(module)
    name = f.sym_name.data
    g = GpuRegions(name, target)
    sig = signature(f)
    arg_ids = []
    for a, v in zip(sig, f.args):
        region = a.kind
        off = g.regions.get(region, 0)
        g.regions[region] = off + _round(_nbytes(v))
        arg_ids.append(g._buffer(region, off, _nbytes(v)))
    steps, _, out_ids = g.segmented(module.clone(), name, arg_ids)
    if g.error_id is not None:
        steps.insert(0, {"op": "memset", "buffer": g.error_id})
    meta = {
        "args": [{"name": a.name, "kind": a.kind, "shape": list(a.shape), "dtype": a.dtype,
                  "buffer": i} for a, i in zip(sig, arg_ids)],
        "outputs": [{"shape": list(shape_of(v.type)), "dtype": dtype_of(v.type), "buffer": i}
                    for v, i in zip(outputs(f), out_ids)],
        "buffers": g.buffers, "regions": g.regions, "consts": g.const_list, "steps": steps,
    }
    if g.error_id is not None:
        meta["errors"] = {"buffer": g.error_id,
                          "codes": {str(k): list(v) for k, v in g.errors.items()}}
    return link_text(g.modules), meta, bytes(g.consts)


def launches(steps):
    """Every launch step, also inside loops and branches."""
    for st in steps:
        if st["op"] == "launch":
            yield st
        for k in ("steps", "cond", "body", "then", "else"):
            if k in st:
                yield from launches(st[k])

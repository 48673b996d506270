"""CPU lowering of control flow: a region op becomes a native loop in the same library.

    func with rlx.scan / rlx.while / rlx.if at the top level
          │ split into straight-line segments and region ops
          ▼
    i32 rlx_NAME(inputs, outputs, params, ws)              (the C entry, unchanged ABI)
        seg0(ins, outs: slots, ws+scratch)                 each segment: one ordinary
        scan:  memcpy init -> A                            program (fusion, kernels,
               for t in 0..n-1:                            buffer plan) compiled into
                 body(ins:  [cur carries, xs + t*row, captures],      the same module
                      outs: [next carries, ys + t*row], ws+scratch')
                 (cur, next) = (A, B) or (B, A) by the parity of t
               odd n: memcpy B -> A                        A = the result slots
        while: cond(cur.., caps) -> flag; while flag: body(cur -> next); swap
        if:    then(ops -> results) or else(ops -> results)
        seg1(...)
        memcpy result values -> outputs

Values that cross from one segment or region op to another live in *slots* at
fixed workspace offsets; after the slots comes one scratch area that every
segment and loop uses in turn (they run one after another), so the workspace is
slots + the largest scratch need.  A loop's scratch holds the second carry
buffer (double-buffered carries: a body's outputs never alias its inputs), the
while flag and the body's own workspace.  Bodies are lowered recursively the
same way (body_module), so nested control flow nests loops.  Every sub-program
is an internal function; error codes of their index checks are renumbered into
one table and an error returns through every level.
"""
from __future__ import annotations

import llvmlite.ir as ir

from rlxc.dialect.module import get_func, outputs, signature
from rlxc.dialect.types import dtype_of, numel, shape_of
from rlxc.lowering.cpu.loops import DTYPE_BYTES, CheckKernel, Program
from rlxc.lowering.shared.segments import has_regions, segment_module

I8 = ir.IntType(8)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
I8P = I8.as_pointer()
I8PP = I8P.as_pointer()
ALIGN = 64


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _nbytes(v) -> int:
    return numel(shape_of(v.type)) * DTYPE_BYTES[dtype_of(v.type)]


def c64(v: int):
    return ir.Constant(I64, int(v))


class RegionLowering:
    """Lowers functions (recursively) into one llvmlite module; collects kernels/errors."""

    def __init__(self, m, name: str, cpu: str, threads: int):
        self.m, self.name, self.cpu, self.threads = m, name, cpu, threads
        self.errors: dict = {}
        self.kernels: list = []
        self.listing: list = []   # --emit loops: every sub-program and loop, in order
        self._n = 0

    def fresh(self, tag: str) -> str:
        self._n += 1
        return f"{self.name}__{tag}{self._n}"

    # ------------------------------------------------------------ functions
    def function(self, module, name):
        """(entry function `i32 (i8**, i8**, i8**, i8*)`, workspace bytes) of `module`."""
        if has_regions(module):
            return self.segmented(module, name)
        return self.plain(module, name)

    def plain(self, module, name):
        from rlxc.lowering.cpu import buffers
        from rlxc.lowering.cpu.codegen import ModuleGen
        from rlxc.lowering.cpu.rowfuse import fuse_rows
        from rlxc.lowering.cpu.rowlocal import localize
        from rlxc.lowering.cpu.schedule import build_program

        prog = localize(fuse_rows(build_program(module, name, self.threads, self.cpu)))
        buffers.plan(prog)
        off = len(self.errors)
        for k in prog.kernels:
            if isinstance(k, CheckKernel):
                k.code += off
        self.errors.update({c + off: v for c, v in prog.errors.items()})
        prog.errors, prog.error_args = {}, {}
        self.kernels += prog.kernels
        from rlxc.lowering.cpu.loops import format_program
        self.listing.append(format_program(prog))
        ModuleGen(prog, self.cpu, module=self.m).generate()
        sym = f"rlx_{name}"
        for s in (sym, f"{sym}_workspace_size", f"{sym}_signature"):
            self.m.get_global(s).linkage = "internal"
        return self.m.get_global(sym), prog.workspace_size

    def segmented(self, module, name, entry=None):
        from rlxc.dialect.control import is_control

        f = get_func(module)
        sig = signature(f)
        ops = [op for op in f.body.block.ops if op is not f.body.block.last_op]
        groups, cur = [], []
        for op in ops:
            if is_control(op):
                if cur:
                    groups.append(("seg", cur))
                    cur = []
                groups.append(("region", [op]))
            else:
                cur.append(op)
        if cur:
            groups.append(("seg", cur))
        owner = {}
        for gi, (_, gops) in enumerate(groups):
            for op in gops:
                for r in op.results:
                    owner[r] = gi
        outs = outputs(f)
        exported = set(v for v in outs if v in owner)
        for gi, (_, gops) in enumerate(groups):
            for op in gops:
                for o in op.operands:
                    if o in owner and owner[o] != gi:
                        exported.add(o)
        slots, size = {}, 0
        for gi, (_, gops) in enumerate(groups):      # definition order: deterministic
            for op in gops:
                for r in op.results:
                    if r in exported:
                        slots[r] = size
                        size += _align(max(_nbytes(r), 1))
        base = size

        steps, scratch = [], 0
        for gi, (kind, gops) in enumerate(groups):
            if kind == "seg":
                ins = []
                for op in gops:
                    for o in op.operands:
                        if (o not in owner or owner[o] != gi) and o not in ins:
                            ins.append(o)
                res = [r for op in gops for r in op.results if r in exported]
                if not res:
                    continue
                fn, ws = self.function(segment_module(gops, ins, res), self.fresh("seg"))
                steps.append(("call", fn, ins, res))
                scratch = max(scratch, ws)
            else:
                (op,) = gops
                emit, ws = self.region(op, exported)
                steps.append(("region", emit, op))
                scratch = max(scratch, ws)
        total = base + _align(scratch)

        fn = entry or ir.Function(self.m, ir.FunctionType(I32, [I8PP, I8PP, I8PP, I8P]),
                                  f"rlx_{name}")
        if entry is None:
            fn.linkage = "internal"
        allocas = fn.append_basic_block("entry")       # the Emitter's allocas only
        b = ir.IRBuilder(fn.append_basic_block("start"))
        em = Emitter(self, fn, b, allocas)
        arrays = {"input": fn.args[0], "param": fn.args[2]}
        counts = {"input": 0, "param": 0}
        ptrs = {}
        for a, v in zip(sig, f.args):
            k = counts[a.kind]
            counts[a.kind] += 1
            ptrs[v] = b.load(b.gep(arrays[a.kind], [ir.Constant(I32, k)], inbounds=True))
        for v, off in slots.items():
            ptrs[v] = b.gep(fn.args[3], [c64(off)], inbounds=True)
        ws = b.gep(fn.args[3], [c64(base)], inbounds=True)
        for st in steps:
            if st[0] == "call":
                _, sub, ins, res = st
                em.call(sub, [ptrs[v] for v in ins], [ptrs[v] for v in res], ws)
            else:
                _, emit, op = st
                emit(em, [ptrs[o] for o in op.operands], [ptrs.get(r) for r in op.results], ws)
        for k, v in enumerate(outs):
            dst = em.b.load(em.b.gep(fn.args[1], [ir.Constant(I32, k)], inbounds=True))
            em.memcpy(dst, ptrs[v], _nbytes(v))
        em.b.ret(ir.Constant(I32, 0))
        ir.IRBuilder(allocas).branch(fn.blocks[1])
        return fn, total

    # ------------------------------------------------------------ region ops
    def region(self, op, exported):
        """(emit(em, operand ptrs, result ptrs, scratch ptr), scratch bytes) of a region op.
        Results without a slot (unused) get scratch space of their own."""
        from rlxc.dialect.control_ad import body_module

        tag = op.name[4:]
        names = [self.fresh(tag) for _ in op.regions]
        regions = [self.function(body_module(r), n) for r, n in zip(op.regions, names)]
        self.listing.append(f"// {op.name} {op.params()}: a native loop calling "
                            f"{', '.join('rlx_' + n for n in names)} (double-buffered "
                            f"carries)")
        own = 0
        layout = {}
        for r in op.results:          # unused results: written to scratch
            if r in exported:
                continue
            layout[r] = own
            own += _align(max(_nbytes(r), 1))
        p = op.params()
        nc = p.get("num_carry", 0)
        bbuf = []
        for r in list(op.results)[:nc]:
            bbuf.append(own)
            own += _align(max(_nbytes(r), 1))
        flag = own
        own += ALIGN
        inner = own
        need = own + max(ws for _, ws in regions)

        def res_ptrs(em, rp, scratch):
            return [q if q is not None else em.b.gep(scratch, [c64(layout[r])], inbounds=True)
                    for q, r in zip(rp, op.results)]

        def emit(em, ops, rp, scratch):
            rp = res_ptrs(em, rp, scratch)
            ws = em.b.gep(scratch, [c64(inner)], inbounds=True)
            B = [em.b.gep(scratch, [c64(o)], inbounds=True) for o in bbuf]
            if op.name == "rlx.scan":
                em.scan(op, regions[0][0], ops, rp, B, ws)
            elif op.name == "rlx.while":
                em.while_(op, regions[0][0], regions[1][0], ops, rp, B,
                          em.b.gep(scratch, [c64(flag)], inbounds=True), ws)
            else:
                em.if_(op, regions[0][0], regions[1][0], ops, rp, ws)
        return emit, need


class Emitter:
    """Builds the body of a segmented function: calls, loops, copies."""

    def __init__(self, low: RegionLowering, fn, b, allocas):
        self.low, self.fn, self.b = low, fn, b
        self.ab = ir.IRBuilder(allocas)    # allocas in the entry block, out of every loop

    def _array(self, n):
        return self.ab.alloca(ir.ArrayType(I8P, max(n, 1)))

    def _fill(self, arr, ptrs):
        for i, q in enumerate(ptrs):
            slot = self.b.gep(arr, [ir.Constant(I32, 0), ir.Constant(I32, i)], inbounds=True)
            self.b.store(self.b.bitcast(q, I8P), slot)
        return self.b.bitcast(arr, I8PP)

    def call(self, fn, ins, outs, ws):
        """rc = fn(ins, outs, {}, ws); return rc from this function when it is not 0."""
        a_in, a_out = self._array(len(ins)), self._array(len(outs))
        rc = self.b.call(fn, [self._fill(a_in, ins), self._fill(a_out, outs),
                              ir.Constant(I8PP, None), self.b.bitcast(ws, I8P)])
        with self.b.if_then(self.b.icmp_signed("!=", rc, ir.Constant(I32, 0)), likely=False):
            self.b.ret(rc)

    def memcpy(self, dst, src, n: int):
        if n == 0:
            return
        fn = self.low.m.globals.get("memcpy")
        if fn is None:
            fn = ir.Function(self.low.m, ir.FunctionType(I8P, [I8P, I8P, I64]), "memcpy")
        self.b.call(fn, [self.b.bitcast(dst, I8P), self.b.bitcast(src, I8P), c64(n)])

    def _loop(self, n, body):
        """for (i64 t = 0; t < n; ++t) body(t)."""
        b = self.b
        pre = b.block
        head = self.fn.append_basic_block("loop")
        step = self.fn.append_basic_block("body")
        done = self.fn.append_basic_block("done")
        b.branch(head)
        b.position_at_end(head)
        t = b.phi(I64)
        t.add_incoming(c64(0), pre)
        b.cbranch(b.icmp_signed("<", t, n), step, done)
        b.position_at_end(step)
        body(t)
        t.add_incoming(b.add(t, c64(1)), b.block)
        b.branch(head)
        b.position_at_end(done)

    def scan(self, op, body_fn, ops, rp, B, ws):
        b = self.b
        p = op.params()
        n, nc, nx = p["length"], p["num_carry"], p["num_xs"]
        A = rp[:nc]
        for k in range(nc):
            self.memcpy(A[k], ops[k], _nbytes(op.results[k]))
        xrow = [_nbytes(o) // max(n, 1) for o in list(op.operands)[nc:nc + nx]]
        yrow = [_nbytes(r) // max(n, 1) for r in list(op.results)[nc:]]

        def body(t):
            idx = b.sub(c64(n - 1), t) if p["reverse"] else t
            even = b.icmp_signed("==", b.and_(t, c64(1)), c64(0))
            cur = [b.select(even, a, bb) for a, bb in zip(A, B)]
            nxt = [b.select(even, bb, a) for a, bb in zip(A, B)]
            xs = [b.gep(b.bitcast(x, I8P), [b.mul(idx, c64(r))], inbounds=True)
                  for x, r in zip(ops[nc:nc + nx], xrow)]
            ys = [b.gep(b.bitcast(y, I8P), [b.mul(idx, c64(r))], inbounds=True)
                  for y, r in zip(rp[nc:], yrow)]
            self.call(body_fn, cur + xs + list(ops[nc + nx:]), nxt + ys, ws)
        self._loop(c64(n), body)
        if n % 2:
            for k in range(nc):
                self.memcpy(A[k], B[k], _nbytes(op.results[k]))

    def while_(self, op, cond_fn, body_fn, ops, rp, B, flag, ws):
        b = self.b
        nc = op.params()["num_carry"]
        A = rp[:nc]
        for k in range(nc):
            self.memcpy(A[k], ops[k], _nbytes(op.results[k]))
        caps = list(ops[nc:])
        ph = self.ab.alloca(I8)   # 1 when the current carries are in B
        b.store(ir.Constant(I8, 0), ph)
        head = self.fn.append_basic_block("while")
        step = self.fn.append_basic_block("while_body")
        done = self.fn.append_basic_block("while_done")
        b.branch(head)
        b.position_at_end(head)
        odd = b.icmp_unsigned("!=", b.load(ph), ir.Constant(I8, 0))
        cur = [b.select(odd, bb, a) for a, bb in zip(A, B)]
        self.call(cond_fn, cur + caps, [flag], ws)
        go = b.icmp_unsigned("!=", b.load(b.bitcast(flag, I8P)), ir.Constant(I8, 0))
        b.cbranch(go, step, done)
        b.position_at_end(step)
        nxt = [b.select(odd, a, bb) for a, bb in zip(A, B)]
        self.call(body_fn, cur + caps, nxt, ws)
        b.store(b.select(odd, ir.Constant(I8, 0), ir.Constant(I8, 1)), ph)
        b.branch(head)
        b.position_at_end(done)
        with b.if_then(odd):
            for k in range(nc):
                self.memcpy(A[k], B[k], _nbytes(op.results[k]))

    def if_(self, op, then_fn, else_fn, ops, rp, ws):
        b = self.b
        pdt = dtype_of(op.operands[0].type)
        ty = {"i1": I8, "i32": I32, "i64": I64}[pdt]
        pv = b.load(b.bitcast(ops[0], ty.as_pointer()))
        taken = b.icmp_unsigned("!=", pv, ir.Constant(ty, 0))
        with b.if_else(taken) as (then, orelse):
            with then:
                self.call(then_fn, list(ops[1:]), list(rp), ws)
            with orelse:
                self.call(else_fn, list(ops[1:]), list(rp), ws)


def generate_regions(module, name: str, cpu: str, threads: int):
    """(llvmlite module, Program) for a module whose function holds region ops: the C
    entry `rlx_NAME` and its workspace/signature symbols, as codegen.generate makes them."""
    from rlxc.lowering.cpu.codegen import ModuleGen
    from rlxc.lowering.cpu.target import ir_module

    m = ir_module(name, cpu)
    low = RegionLowering(m, name, cpu, threads)
    f = get_func(module)
    entry = ir.Function(m, ir.FunctionType(I32, [I8PP, I8PP, I8PP, I8P]), f"rlx_{name}")
    entry.attributes.add("nounwind")
    for a, n in zip(entry.args, ("inputs", "outputs", "params", "workspace")):
        a.name = n
    _, ws = low.segmented(module, name, entry=entry)
    prog = Program(name, signature(f), [(shape_of(v.type), dtype_of(v.type))
                                        for v in outputs(f)],
                   [], low.kernels, dict(low.errors), _align(ws), sgemm_threads=threads)
    gen = ModuleGen(prog, cpu, module=m)
    wsfn = ir.Function(m, ir.FunctionType(I64, []), f"rlx_{name}_workspace_size")
    ir.IRBuilder(wsfn.append_basic_block("entry")).ret(c64(prog.workspace_size))
    gen.signature_symbol(prog)
    return m, prog


def emit_region_loops(module, name: str, cpu: str = "native") -> str:
    """`--emit loops` of a module with region ops: each sub-program's loop IR, and one line
    per region op naming the sub-programs its native loop calls."""
    from rlxc.lowering.cpu.driver import default_threads
    from rlxc.lowering.cpu.target import ir_module

    low = RegionLowering(ir_module(name, cpu), name, cpu, default_threads())
    low.segmented(module, name)
    return "\n".join(low.listing)

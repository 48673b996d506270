"""Loop IR -> LLVM IR (llvmlite): one internal function per kernel, one C entry.

    loops.Program (buffers with workspace offsets, kernels in order)
          │ generate
          ▼
    i64 rlx_NAME_workspace_size()
    i32 rlx_NAME(i8** inputs, i8** outputs, i8** params, i8* workspace)
        pointers: inputs[k] / outputs[k] / params[k] / workspace + offset / @constants
        CheckKernel   rc = NAME.kN(idx*); if rc: return rc        (bounds of gather/scatter)
        LoopKernel    NAME.kN(T* noalias buf..., [i64 lo, i64 hi])
                      called directly, or over [0, n) of its parallel loop through
                      parallel.emit_parallel_ranges (libgomp; inline below PAR_MIN_WORK
                      work units or with one thread)
        MatmulKernel  for batch...: NAME.sgemmK(M, N, K, A+a, rsa, csa, B+b, rsb, csb,
                                                C+c, N, 0, ws, ws_floats, epilogue ptrs...)
        return 0
    i32 rlx_NAME_prepacked(inputs, outputs, params, workspace)   only when a matmul chain
        multiplies by a whole param (matmul_chain.prepack_spec): params[n_params + s] is
        slot s's weight packed once (runtime/prepack.py), which the chain reads in place;
        rlx_NAME passes NULL slots (pack per call).  Both call one internal body.

Loops are emitted as `for (i64 i = start; i < stop; ++i)` with the loop body
inline, buffer pointers as `noalias` arguments of the kernel function, all
addressing as `getelementptr inbounds T, T* buf, i64 offset` on i64 index
arithmetic (`nsw`): no ptrtoint, so LLVM's loop vectorizer sees unit-stride
accesses on the innermost loop and vectorizes it; accumulators are allocas that
SROA turns into phis.  Accumulator updates of float sums/products carry the
`reassoc` flag so the vectorizer may keep vector partial sums (the reduction
order changes; see reduce.py for the blocked f64 accumulation that bounds the
error); a sum of products also carries `contract` on the multiply and the add
(one FMA per term, as in sgemm); everything else is plain IEEE arithmetic.
Elementwise ops come from the shared rule table, lowering/shared/scalar.py
(LOWER_RULES, through emit_op; transcendentals from mathlib, no libm
calls).  An sgemm epilogue is
the same expression tree emitted on <VL x float> vectors inside sgemm's store
hook; one sgemm function is emitted per distinct epilogue structure.  On
AVX-512 targets every function gets "prefer-vector-width"="512".

A library whose kernels may fork first binds the OpenMP team's worker
threads to CPUs (pinning.py; once per team size, again when the caller lands on a worker's CPU).

Streaming stores.  The innermost loop of a map that writes a large output
row by row (For.stream, chosen by schedule.streamable) is not left to the
vectorizer: it is emitted as scalar iterations up to the first 64-byte
aligned element, then explicit <VL x float> iterations (leaves contiguous
along the loop become vector loads, invariant ones a splat, ops the same
width-generic shared rules) whose stores carry !nontemporal and align 64
(MOVNTPS: no read-for-ownership of lines that are only written), then the
scalar rest; the kernel ends with an sfence.

A map whose expression holds a transcendental (mathlib: exp, tanh, gelu, sin, ...) or a
float32 pow computed as exp(y*log|x|) in float64 is emitted as explicit vectors too (vmap.py):
two independent dependency chains per iteration, and sin/cos/tan keep their Payne-Hanek block
a uniform branch instead of an if-converted path.
"""
from __future__ import annotations

import llvmlite.ir as ir

from rlxc.lowering.cpu import indexing as ix
from rlxc.lowering.cpu import openmp as parallel
from rlxc.lowering.cpu import fastminmax, symint, tiles, vmap, vsum
from rlxc.lowering.shared.scalar import (F32, I8, I32, I64, LOWER_RULES, MEM_TYPES, combine, const,
                                         cpu_rules, emit_op, vtype)
from rlxc.lowering.shared.mathlib_ratio import fused_parts
from rlxc.lowering.cpu.loops import (AccDecl, AccRef, CheckKernel, Const, For, InRange,
                    IndexValue, Load, LoopKernel, MatmulKernel, Op, Program, Store, Update,
                    walk, walk_expr)
from rlxc.lowering.cpu.tuning import PAR_MIN_WORK

VOID = ir.VoidType()
I8P = I8.as_pointer()
I8PP = I8P.as_pointer()
F32P = F32.as_pointer()


def c64(v: int):
    if hasattr(v, "coef"):   # a size of a dynamic program (symint.py)
        return symint.value(v)
    return ir.Constant(I64, int(v))


class Body:
    """Emits statements and expressions of one kernel function."""

    def __init__(self, fn: ir.Function, ptrs: dict, lanes: int = 16):
        self.fn = fn
        self.ptrs = ptrs  # id(buffer) -> pointer value
        self.accs: dict = {}
        self.entry = fn.entry_basic_block
        self.lanes = lanes      # vector width of streaming stores
        self.rules = LOWER_RULES  # the scalar rule table of the target (scalar.cpu_rules)
        # sums whose one update adds a fused product q*scale (mathlib_ratio.fused_parts):
        # they add q and their reads scale once (one multiply per element less in W1)
        self.unscaled_ok: set = set()     # id(acc): float sum, zero init, one update
        self.acc_scale: dict = {}         # id(acc) -> the scale its reads apply
        self.acc_read: set = set()        # id(acc) read so far (a read before the update
                                          # would miss the scale: such a sum keeps it)
        self.streamed = False   # a streaming loop was emitted (the kernel ends in sfence)

    # -------------------------------------------------------- indices
    def index(self, b, a, vars_):
        a = ix.of(a)
        acc = None
        for atom, k in a.terms:
            v = self.atom(b, atom, vars_)
            if k != 1:
                v = b.mul(v, c64(k), flags=["nsw"])
            acc = v if acc is None else b.add(acc, v, flags=["nsw"])
        if acc is None:
            return c64(a.const)
        return b.add(acc, c64(a.const), flags=["nsw"]) if a.const else acc

    def atom(self, b, a, vars_):
        if isinstance(a, ix.Var):
            return vars_[a]
        if isinstance(a, ix.FloorDiv):
            return b.udiv(self.index(b, a.x, vars_), c64(a.c))
        if isinstance(a, ix.Mod):
            return b.urem(self.index(b, a.x, vars_), c64(a.c))
        if isinstance(a, ix.Clamp):
            x = self.index(b, a.x, vars_)
            x = b.select(b.icmp_signed("<", x, c64(a.lo)), c64(a.lo), x)
            return b.select(b.icmp_signed(">", x, c64(a.hi)), c64(a.hi), x)
        if isinstance(a, ix.Min):
            x, y = self.index(b, a.a, vars_), self.index(b, a.b, vars_)
            return b.select(b.icmp_signed("<", x, y), x, y)
        if isinstance(a, ix.LoadIdx):
            v = self.load(b, a.buf, self.index(b, a.off, vars_))
            return v if v.type == I64 else b.sext(v, I64)
        raise TypeError(a)

    def load(self, b, buf, off):
        p = b.gep(self.ptrs[id(buf)], [off], inbounds=True)
        v = b.load(p, align=_align(buf.dtype))
        if buf.dtype == "i1":
            v = b.icmp_unsigned("!=", v, ir.Constant(I8, 0))
        return v

    def store(self, b, buf, off, v):
        p = b.gep(self.ptrs[id(buf)], [off], inbounds=True)
        if buf.dtype == "i1":
            v = b.zext(v, I8)
        b.store(v, p, align=_align(buf.dtype))

    # -------------------------------------------------------- expressions
    def expr(self, b, e, vars_, memo):
        r = memo.get(id(e))
        if r is not None:
            return r
        if isinstance(e, Const):
            r = c64(e.value) if hasattr(e.value, "coef") else const(vtype(e.dtype), e.value)
        elif isinstance(e, Load):
            r = self.load(b, e.buf, self.index(b, e.off, vars_))
        elif isinstance(e, AccRef):
            self.acc_read.add(id(e.acc))
            r = b.load(self.accs[id(e.acc)])
            scale = self.acc_scale.get(id(e.acc))
            return r if scale is None else b.fmul(r, const(r.type, scale))
        elif isinstance(e, InRange):
            i = self.index(b, e.idx, vars_)
            r = b.and_(b.icmp_signed(">=", i, c64(e.lo)), b.icmp_signed("<", i, c64(e.hi)))
        elif isinstance(e, IndexValue):
            i = self.index(b, e.idx, vars_)
            t = vtype(e.dtype)
            r = i if e.dtype == "i64" else b.trunc(i, t) if e.dtype in ("i32", "u32") else \
                b.sitofp(i, t)
        elif isinstance(e, Op):
            r = emit_op(b, e, [self.expr(b, a, vars_, memo) for a in e.args], self.rules)
        else:
            raise TypeError(e)
        memo[id(e)] = r
        return r

    # -------------------------------------------------------- statements
    def stmts(self, b, stmts, vars_, lohi=None):
        for s in stmts:
            if isinstance(s, For) and s.stream:
                self.stream_loop(b, s, vars_, lohi if s.parallel else None)
            elif isinstance(s, For) and vsum.applies(s):   # sum of tanh(u) * sigmoid(v)
                vsum.ratio_sum_loop(self, b, s, vars_, lohi if s.parallel else None)
            elif isinstance(s, For) and vmap.applies(s, self.rules):  # a map with a transcendental
                vmap.map_loop(self, b, s, vars_, lohi if s.parallel else None)
            elif isinstance(s, For) and tiles.applies(s):     # a map reading across rows
                tiles.tile_loop(self, b, s, vars_, lohi if s.parallel else None)
            elif isinstance(s, For) and fastminmax.applies(s):   # float max/min updates
                fastminmax.minmax_loop(self, b, s, vars_, lohi if s.parallel else None)
            elif isinstance(s, For):
                self.loop(b, s, vars_, lohi if s.parallel else None)
            elif isinstance(s, AccDecl):
                slot = self.accs[id(s.acc)]
                b.store(self.expr(b, s.init, vars_, {}), slot)
            elif isinstance(s, Update):
                slot = self.accs[id(s.acc)]
                aid = id(s.acc)      # once a sum adds unscaled terms, all its updates do
                unscaled = aid in self.unscaled_ok and (aid in self.acc_scale or
                                                        aid not in self.acc_read)
                v, fl = self.acc_value(b, s.op, s.value, vars_, s.acc if unscaled else None)
                old = b.load(slot)
                b.store(combine(b, s.op, old, v, s.acc.dtype, flags=fl), slot)
            elif isinstance(s, Store):
                off = self.index(b, s.off, vars_)
                if s.combine:
                    v, fl = self.acc_value(b, s.combine, s.value, vars_)
                    v = combine(b, s.combine, self.load(b, s.buf, off), v, s.buf.dtype,
                                flags=fl)
                else:
                    v = self.expr(b, s.value, vars_, {})
                self.store(b, s.buf, off, v)
            else:
                raise TypeError(s)

    def acc_value(self, b, op, e, vars_, unscaled=None):
        """The value an accumulation `acc = op(acc, e)` adds, and the flags of that op.

        A float sum of a product (a dot product: matrix-vector reductions, bias
        gradients of a scaled input) is contracted: the multiply and the accumulating
        add carry `contract`, so they become one FMA, rounded once (as sgemm's are).
        A product of ratio-form functions (tanh(u) * sigmoid(v)) takes one division
        (mathlib_ratio.py) and is q * 2^-64: with `unscaled` (the accumulator, when its
        sum may add q itself: Body.unscaled_ok) the q's are added and the reads of the
        sum multiply by 2^-64 (|q| <= 2^64: no sum of fewer than 2^63 terms overflows;
        the scale is exact unless the sum is subnormal, where it rounds once)."""
        if op == "add" and isinstance(e, Op) and e.op == "mul" and e.dtype in ("f32", "f64"):
            memo: dict = {}
            x, y = (self.expr(b, a, vars_, memo) for a in e.args)
            parts = fused_parts(b, x, y) if e.dtype == "f32" else None
            if parts is not None:   # tanh(u) * sigmoid(v): one division (mathlib_ratio.py)
                q, scale = parts
                if scale == 1.0:
                    return q, ("reassoc",)
                if unscaled is not None and 2.0 ** -64 <= scale < 1.0:
                    self.acc_scale[id(unscaled)] = scale
                    return q, ("reassoc",)
                return b.fmul(q, const(q.type, scale)), ("reassoc",)
            return b.fmul(x, y, flags=["contract"]), ("reassoc", "contract")
        v = self.expr(b, e, vars_, {})
        if op in ("max", "min") and isinstance(e, Op) and e.op == "select" and \
                e.dtype in ("f32", "f64"):
            # a masked max (`where(m, x, -inf).max()`): InstCombine would fold
            # maximum(acc, select(c, x, -inf)) into select(c, maximum(acc, x), acc), a
            # conditional update the loop vectorizer does not take for a reduction (a
            # scalar loop, ~50x slower); a freeze of the value keeps the plain form
            v = _freeze(b, v)
        return v, ("reassoc",)

    # -------------------------------------------------------- streaming stores
    def stream_loop(self, b, s: For, vars_, lohi=None):
        """`for v in [start, stop): out[off(v)] = e(v)` (schedule.streamable) as: scalar
        iterations up to the first 64-byte aligned element, then `<lanes x float>`
        iterations storing with !nontemporal (MOVNTPS: the row goes to memory without
        being read into the cache first), then the scalar rest."""
        st = s.body[0]
        v, lanes = s.var, self.lanes
        start, stop = self.bounds(b, s, vars_, lohi)
        first = dict(vars_)
        first[v] = start
        at = b.gep(self.ptrs[id(st.buf)], [self.index(b, st.off, first)], inbounds=True)
        peel = b.lshr(b.and_(b.sub(c64(0), b.ptrtoint(at, I64)), c64(63)), c64(2))
        n = b.sub(stop, start)
        peel = b.select(b.icmp_signed("<", peel, n), peel, n)
        vstart = b.add(start, peel)
        vend = self.vector_end(b, vstart, stop, lanes)
        self.loop(b, s, vars_, lohi=(start, vstart))

        def store(b, inner):
            val = self.vexpr(b, st.value, inner, v, {})
            p = b.gep(self.ptrs[id(st.buf)], [self.index(b, st.off, inner)], inbounds=True)
            ins = b.store(val, b.bitcast(p, val.type.as_pointer()), align=64)
            ins.set_metadata("nontemporal", b.module.add_metadata([ir.Constant(I32, 1)]))
        self.loop(b, s, vars_, lohi=(vstart, vend), body_fn=store, step=lanes, tag="v")
        self.loop(b, s, vars_, lohi=(vend, stop))
        self.streamed = True

    def vexpr(self, b, e, vars_, v, memo, lanes=None):
        """`e` on `lanes` (default self.lanes) consecutive values of loop variable `v`
        (starting at vars_[v])."""
        r = memo.get(id(e))
        if r is not None:
            return r
        lanes = lanes or self.lanes
        if isinstance(e, Const):
            r = const(vtype(e.dtype, lanes), e.value)
        elif isinstance(e, Load) and ix.of(e.off).coeffs().get(v, 0) == 1:
            p = b.gep(self.ptrs[id(e.buf)], [self.index(b, e.off, vars_)], inbounds=True)
            t = MEM_TYPES[e.buf.dtype]
            r = b.load(b.bitcast(p, ir.VectorType(t, lanes).as_pointer()), align=_align(e.buf.dtype))
        elif isinstance(e, (Load, InRange)):  # invariant along v: one scalar, splatted
            r = _splat(b, self.expr(b, e, vars_, {}), lanes)
        elif isinstance(e, Op):
            r = emit_op(b, e, [self.vexpr(b, a, vars_, v, memo, lanes) for a in e.args],
                        self.rules)
        else:
            raise TypeError(e)
        memo[id(e)] = r
        return r

    def bounds(self, b, s: For, vars_, lohi=None):
        """(start, stop) of `s`: `lohi` (a parallel loop's range) or its own bounds."""
        if lohi is not None:
            return lohi
        return self.index(b, s.start, vars_), self.index(b, s.stop, vars_)

    @staticmethod
    def vector_end(b, start, stop, lanes: int):
        """start + the largest multiple of `lanes` that fits in [start, stop)."""
        return b.add(start, b.mul(b.sdiv(b.sub(stop, start), c64(lanes)), c64(lanes)))

    def loop(self, b, s: For, vars_, lohi=None, body_fn=None, step: int = 1, tag: str = ""):
        """Emit `s` over [lohi or its bounds) by `step` (blocks and induction variable named
        with `tag`); `body_fn(builder, vars)` replaces s.body when given."""
        start, stop = self.bounds(b, s, vars_, lohi)
        fn = self.fn
        name = s.var.name
        head = fn.append_basic_block(f"{name}.{tag}head")
        body = fn.append_basic_block(f"{name}.{tag}body")
        done = fn.append_basic_block(f"{name}.{tag}done")
        pre = b.block
        b.branch(head)
        b.position_at_end(head)
        iv = b.phi(I64, name=f"{name}.{tag}" if tag else name)
        iv.add_incoming(start, pre)
        b.cbranch(b.icmp_signed("<", iv, stop), body, done)
        b.position_at_end(body)
        inner = dict(vars_)
        inner[s.var] = iv
        if body_fn is not None:
            body_fn(b, inner)
        else:
            self.stmts(b, s.body, inner)
        iv.add_incoming(b.add(iv, c64(step), flags=["nsw"]), b.block)
        b.branch(head)
        b.position_at_end(done)


def _lone_zero_sums(body) -> set:
    """id(acc) of the f32 accumulators of `body` that are declared with 0 and updated by one
    `add` statement (Body.acc_value may leave a power-of-two scale of that addend to the
    sum's reads)."""
    ups: dict = {}
    zero: dict = {}
    for s in walk(body):
        if isinstance(s, Update):
            ups.setdefault(id(s.acc), []).append(s)
        elif isinstance(s, AccDecl):
            z = isinstance(s.init, Const) and not hasattr(s.init.value, "coef") and \
                float(s.init.value) == 0.0
            zero[id(s.acc)] = zero.get(id(s.acc), True) and z
    return {a for a, us in ups.items()
            if len(us) == 1 and us[0].op == "add" and us[0].acc.dtype == "f32" and zero.get(a)}


def _freeze(b, v):
    """`freeze v` (llvmlite's IRBuilder has no method for it): the same value, opaque to
    InstCombine's select folds."""
    from llvmlite.ir.instructions import Instruction

    ins = Instruction(b.block, v.type, "freeze", [v])
    b._insert(ins)
    return ins


def _splat(b, x, lanes: int):
    vt = ir.VectorType(x.type, lanes)
    v = b.insert_element(ir.Constant(vt, ir.Undefined), x, ir.Constant(I32, 0))
    return b.shuffle_vector(v, ir.Constant(vt, ir.Undefined),
                            ir.Constant(ir.VectorType(I32, lanes), [0] * lanes))


def _sfence(b, cpu: str):
    """Order non-temporal stores before returning: sfence on x86-64, a full fence
    (dmb ish) on other targets."""
    from rlxc.lowering.cpu.target import resolve_target

    if resolve_target(cpu)[0].arch != "x86_64":
        b.fence("seq_cst")
        return
    fn = b.module.globals.get("llvm.x86.sse.sfence") or ir.Function(
        b.module, ir.FunctionType(VOID, []), "llvm.x86.sse.sfence")
    b.call(fn, [])


def _lanes(cpu: str) -> int:
    """f32 lanes of one vector register of ``cpu`` (16 AVX-512, 8 AVX2, 4 NEON)."""
    from rlxc.lowering.cpu.sgemm_kernels import sgemm_config

    return sgemm_config(cpu).vl


def _rules(cpu: str) -> dict:
    """The scalar rule table of ``cpu`` (scalar.cpu_rules: float32 pow without libm where
    the vector ISA has FMA)."""
    from rlxc.lowering.cpu.sgemm_kernels import ISAS, sgemm_config

    return cpu_rules(ISAS[sgemm_config(cpu).isa].fma)


def _align(dt: str) -> int:
    return {"f32": 4, "f64": 8, "i1": 1, "i32": 4, "i64": 8, "u32": 4}[dt]


def ptr_type(dt: str):
    return MEM_TYPES[dt].as_pointer()


class ModuleGen:
    def __init__(self, program: Program, cpu: str = "native", module=None,
                 prepack: bool = False):
        from rlxc.lowering.cpu.target import ir_module

        self.p = program
        # the static entry may take prepacked weights (a second entry, see _prepacked_entry)
        self.prepack = prepack and not getattr(program, "dims", None)
        self.cpu = cpu
        self.sym = f"rlx_{program.name}"
        self.m = module if module is not None else ir_module(program.name, cpu)
        parallel.thread_control(self.m)
        self.globals: dict = {}
        self.uses_sgemm = False  # set by llvmmatmul: link sgemmlib's object
        self.dims = getattr(program, "dims", None)  # symbols of a dynamic program (dynsizes.py)

    def _fn(self, name, ret, argtys):
        n = len(argtys)
        if self.dims:   # a dynamic program: every kernel takes the sizes after its arguments
            argtys = list(argtys) + [I64] * len(self.dims)
        fn = ir.Function(self.m, ir.FunctionType(ret, argtys), f"{self.sym}.{name}")
        if self.dims:
            symint.enter(fn, dict(zip(self.dims, fn.args[n:])))
        fn.linkage = "internal"
        fn.attributes.add("nounwind")
        for a in fn.args:
            if isinstance(a.type, ir.PointerType):
                a.add_attribute("noalias")
        fn.append_basic_block("entry")
        return fn

    # -------------------------------------------------------- kernels
    def loop_kernel(self, k: LoopKernel):
        every = k.buffers()
        bufs = [x for x in every if x.kind != "local"]
        par = k.body[0] if k.body and isinstance(k.body[0], For) and k.body[0].parallel \
            else None
        fn = self._fn(k.name, VOID, [ptr_type(x.dtype) for x in bufs] + ([I64, I64] if par
                                                                          else []))
        body = Body(fn, {id(x): a for x, a in zip(bufs, fn.args)}, _lanes(self.cpu))
        b = ir.IRBuilder(fn.entry_basic_block)
        local = [x for x in every if x.kind == "local"]
        for x in local:   # a row block per call of this function: per thread
            slot = b.alloca(ir.ArrayType(MEM_TYPES[x.dtype], x.numel), name=x.name)
            slot.align = 64
            body.ptrs[id(x)] = b.bitcast(slot, ptr_type(x.dtype))
        if local:
            # a frame of up to rowlocal.LOCAL_MAX_BYTES: touch it page by page, so a thread
            # whose stack is nearly used up faults on its guard page rather than writing
            # past it
            set.add(fn.attributes, '"probe-stack"="inline-asm"')
        for s in walk(k.body):  # accumulators live in entry-block allocas (SROA -> phis)
            if isinstance(s, AccDecl) and id(s.acc) not in body.accs:
                body.accs[id(s.acc)] = b.alloca(vtype(s.acc.dtype), name=s.acc.name)
        body.unscaled_ok = _lone_zero_sums(k.body)
        body.lut = vsum.lut_for(self.cpu)
        body.rules = _rules(self.cpu)
        nb = len(bufs)
        body.stmts(b, k.body, {}, (fn.args[nb], fn.args[nb + 1]) if par else None)
        if body.streamed:  # order the weakly ordered non-temporal stores before returning
            _sfence(b, self.cpu)
        b.ret_void()
        return fn, bufs, par

    def check_kernel(self, k: CheckKernel):
        fn = self._fn(k.name, I32, [ptr_type(k.buf.dtype)])
        b = ir.IRBuilder(fn.entry_basic_block)
        ity = MEM_TYPES[k.buf.dtype]
        bad = b.alloca(ir.IntType(1), name="bad")
        b.store(ir.Constant(ir.IntType(1), 0), bad)
        body = Body(fn, {id(k.buf): fn.args[0]})
        var = ix.Var("i", k.numel)

        def emit(bb, vars_):
            v = bb.load(bb.gep(fn.args[0], [vars_[var]], inbounds=True), align=_align(k.buf.dtype))
            out = bb.icmp_unsigned(">=", v, ir.Constant(ity, k.bound))
            bb.store(bb.or_(bb.load(bad), out), bad)
        body.loop(b, For(var, ix.ZERO, ix.const(k.numel), []), {}, body_fn=emit)
        b.ret(b.select(b.load(bad), ir.Constant(I32, k.code), ir.Constant(I32, 0)))
        return fn

    def matmul_kernel(self, k: MatmulKernel):
        from rlxc.lowering.cpu.matmul_codegen import matmul_kernel

        return matmul_kernel(self, k)

    # -------------------------------------------------------- entry
    def _const_ptr(self, buf):
        g = self.globals.get(id(buf))
        if g is None:
            data = bytearray(buf.data or b"\0")
            g = ir.GlobalVariable(self.m, ir.ArrayType(I8, len(data)), f"{self.sym}.{buf.name}")
            g.initializer = ir.Constant(ir.ArrayType(I8, len(data)), data)
            g.global_constant = True
            g.linkage = "private"
            g.align = 64
            self.globals[id(buf)] = g
        return g

    def signature_symbol(self, p) -> None:
        """`const char *SYM_signature()`: the signature as the library knows it, which
        the runtime compares with the metadata it was given (runtime/cpu.py)."""
        from rlxc.runtime.cpu import signature_text

        data = bytearray(signature_text(
            [{"name": a.name, "kind": a.kind, "shape": list(a.shape), "dtype": a.dtype}
             for a in p.args], [{"shape": list(s), "dtype": d} for s, d in p.outputs],
            p.workspace_size).encode() + b"\0")
        g = ir.GlobalVariable(self.m, ir.ArrayType(I8, len(data)), f"{self.sym}.signature")
        g.initializer = ir.Constant(ir.ArrayType(I8, len(data)), data)
        g.global_constant = True
        g.linkage = "private"
        fn = ir.Function(self.m, ir.FunctionType(I8P, []), f"{self.sym}_signature")
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        b.ret(b.bitcast(g, I8P))

    def _prepack_slots(self) -> list:
        """The prepacked weights' layouts (runtime/prepack.py), in slot order: every
        kernel's `prepacks` (matmul_chain.py), in kernel order; [] without prepack."""
        if not self.prepack:
            return []
        return [spec for k in self.p.kernels if hasattr(k, "prepacks")
                for _, spec in k.prepacks(self.cpu)]

    def _prepacked_entry(self, body, slots: list) -> None:
        """The two exported entries over `body` (which takes a 5th argument, the table of
        prepacked panels, one pointer per slot, NULL = pack per call):
            i32 rlx_NAME(inputs, outputs, params, workspace)              the C ABI: NULLs
            i32 rlx_NAME_prepacked(inputs, outputs, params, workspace)    params holds the
                params, then one pointer per slot (runtime/cpu.py: a Jitted's bound weights)
        The layouts go to the metadata (p.prepack, driver.py)."""
        self.p.prepack = slots
        nulls = ir.GlobalVariable(self.m, ir.ArrayType(I8P, len(slots)), f"{self.sym}.nopack")
        nulls.initializer = ir.Constant(ir.ArrayType(I8P, len(slots)), None)
        nulls.global_constant = True
        nulls.linkage = "private"
        nparams = sum(1 for a in self.p.args if a.kind == "param")
        for name, packed in ((self.sym, None), (f"{self.sym}_prepacked", nparams)):
            fn = ir.Function(self.m, ir.FunctionType(I32, [I8PP, I8PP, I8PP, I8P]), name)
            fn.attributes.add("nounwind")
            b = ir.IRBuilder(fn.append_basic_block("entry"))
            table = (b.gep(nulls, [ir.Constant(I32, 0), ir.Constant(I32, 0)], inbounds=True)
                     if packed is None else b.gep(fn.args[2], [c64(packed)], inbounds=True))
            b.ret(b.call(body, [*fn.args, table]))

    def generate(self) -> ir.Module:
        p = self.p
        slots: list = []
        if self.dims:
            from rlxc.lowering.cpu.dynentry import entry_head

            entry, b, extra = entry_head(self)
        else:
            wsfn = ir.Function(self.m, ir.FunctionType(I64, []), f"{self.sym}_workspace_size")
            b = ir.IRBuilder(wsfn.append_basic_block("entry"))
            b.ret(c64(p.workspace_size))
            self.signature_symbol(p)
            slots = self._prepack_slots()
            if slots:   # the body takes the prepacked panels' table (_prepacked_entry)
                entry = ir.Function(self.m, ir.FunctionType(I32, [I8PP, I8PP, I8PP, I8P, I8PP]),
                                    f"{self.sym}.body")
                entry.linkage = "internal"
                entry.attributes.add("noinline")
            else:
                entry = ir.Function(self.m, ir.FunctionType(I32, [I8PP, I8PP, I8PP, I8P]),
                                    self.sym)
            extra = []
        entry.attributes.add("nounwind")
        for a, n in zip(entry.args, ("inputs", "outputs", "params", "workspace",
                                     "dims" if self.dims else "prepacked")):
            a.name = n
        if not self.dims:
            b = ir.IRBuilder(entry.append_basic_block("entry"))
        at_entry = symint.save()
        slot = 0   # the next prepacked slot (handed out in kernel order, _prepack_slots)
        arrays = {"input": entry.args[0], "output": entry.args[1], "param": entry.args[2]}
        ptrs: dict = {}
        from rlxc.lowering.cpu.driver import has_parallel_kernels

        if has_parallel_kernels(getattr(p, "sample", p), self.cpu):  # bind the team's workers once (pinning.py)
            from rlxc.lowering.cpu.pinning import emit_pin_team

            b.call(emit_pin_team(self.m, self.sym), [])

        def ptr(buf):
            q = ptrs.get(id(buf))
            if q is None:
                pt = ptr_type(buf.dtype)
                if buf.kind in arrays:
                    raw = b.load(b.gep(arrays[buf.kind], [ir.Constant(I32, buf.index)],
                                       inbounds=True))
                elif buf.kind == "temp":
                    raw = b.gep(entry.args[3], [c64(buf.offset)], inbounds=True)
                else:
                    raw = self._const_ptr(buf)
                q = b.bitcast(raw, pt)
                ptrs[id(buf)] = q
            return q

        for k in p.kernels:
            if isinstance(k, CheckKernel):
                fn = self.check_kernel(k)
                symint.restore(at_entry)
                rc = b.call(fn, [ptr(k.buf)] + extra)
                with b.if_then(b.icmp_signed("!=", rc, ir.Constant(I32, 0)), likely=False):
                    b.ret(rc)
            elif isinstance(k, LoopKernel):
                fn, bufs, par = self.loop_kernel(k)
                symint.restore(at_entry)
                args = [ptr(x) for x in bufs]
                if par is None:
                    b.call(fn, args + extra)
                else:
                    n = par.stop.const
                    nb = len(args)
                    args += extra
                    parallel.emit_parallel_ranges(
                        self.m, b, c64(n),
                        lambda wb, lo, hi, *rest, fn=fn, nb=nb: wb.call(
                            fn, list(rest[-1])[:nb] + [lo, hi] + list(rest[-1])[nb:]),
                        args, name=f"{self.sym}.{k.name}.par", work=c64(k.work),
                        min_work=PAR_MIN_WORK, dynamic=int(k.dynamic))
            elif isinstance(k, MatmulKernel):
                fn, bufs = self.matmul_kernel(k)
                symint.restore(at_entry)
                b.call(fn, [ptr(x) for x in bufs] + extra)
            elif hasattr(k, "emit"):   # a kernel with its own codegen (attention_kernel.py)
                if self.dims:   # its code bakes in its sizes: no size-generic form
                    raise symint.DynamicSizeError(f"{k.name}: a self-emitting kernel has no "
                                                  "size-generic form")
                fn, bufs, _ = k.emit(self)
                args = [ptr(x) for x in bufs]
                for _ in (k.prepacks(self.cpu) if self.prepack and hasattr(k, "prepacks")
                          else ()):   # this kernel's prepacked panels (NULL: pack them)
                    args.append(b.bitcast(b.load(b.gep(entry.args[4], [ir.Constant(I32, slot)],
                                                       inbounds=True)), F32.as_pointer()))
                    slot += 1
                if not k.parallel:
                    b.call(fn, args + [c64(0), c64(k.items)])
                else:
                    parallel.emit_parallel_ranges(
                        self.m, b, c64(k.items),
                        lambda wb, lo, hi, *rest, fn=fn: wb.call(fn, list(rest[-1]) + [lo, hi]),
                        args, name=f"{self.sym}.{k.name}.par", work=c64(k.work),
                        min_work=PAR_MIN_WORK)
            else:
                raise TypeError(k)
        b.ret(ir.Constant(I32, 0))
        if slots:
            self._prepacked_entry(entry, slots)
        if self.dims:
            symint.restore(at_entry)
            symint.flush()
        if _lanes(self.cpu) == 16:
            # LLVM defaults to 256-bit loop vectors on AVX-512 cores; 512 bits measured ~15%
            # faster on fused transcendental loops.  Every defined function carries it, or the
            # attribute is lost when kernels are inlined into openmp.py's outlined workers.
            for fn in self.m.functions:
                if fn.blocks:
                    set.add(fn.attributes, '"prefer-vector-width"="512"')
        return self.m


def generate(program: Program, cpu: str = "native") -> ir.Module:
    """The llvmlite module of a planned program (buffers.plan must have run); a static one
    whose matmul chains multiply by params also gets the prepacked entry."""
    return ModuleGen(program, cpu, prepack=True).generate()


__all__ = ["generate", "ModuleGen", "walk_expr"]

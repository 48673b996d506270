"""One kernel body, two targets: NVPTX (one thread's code) or host emulation.

    kernel generator (kernels.py, matmul.py) calls:
      sm.tid()  sm.ctaid(ax)  sm.reg()/get/set  sm.shared()  sm.barrier()
      sm.shfl_xor()  sm.uniform_loop(n)  sm.if_then(cond)
          │
          ├─ target "gpu":  ptx_kernel @NAME(ptr addrspace(1) noalias ...)
          │     tid/ctaid = @llvm.nvvm.read.ptx.sreg.*, registers = scalar allocas
          │     (SROA turns them into SSA values), shared = addrspace(3) globals,
          │     barrier = bar.sync 0, shfl_xor = shfl.sync.bfly.b32
          │
          └─ target "host": @NAME.block(ptr ..., i32 ctaid.x/y/z) runs one block:
                every stretch of code between barriers ("phase") is wrapped in a
                loop over the block's threads; registers live in [threads x T]
                arrays indexed by tid, shared memory is a stack array, a barrier
                ends one thread loop and opens the next, shfl_xor copies a
                register of thread tid^m into one of tid in a phase of its own.
                @NAME.grid(ptr ...) loops over the grid.  Sequential threads are a
                legal schedule, so a missing barrier shows up as a wrong result.

Rules the generators follow so both targets are right: a value computed in one
phase reaches the next only through a register; loops that contain a barrier
or a shuffle are uniform (`uniform_loop`, a Python-int trip count, or a uniform
i32 value); block sizes are compile-time constants (sm.block), and so are grid
sizes (sm.grid) except in size-generic kernels (`dims`), which read the launch's
grid (`nctaid`; host blocks get it as arguments).
"""
from __future__ import annotations

from contextlib import contextmanager

import llvmlite.ir as ir

I1 = ir.IntType(1)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
F32 = ir.FloatType()
F64 = ir.DoubleType()
VOID = ir.VoidType()


def c32(v: int) -> ir.Constant:
    return ir.Constant(I32, int(v))


class Reg:
    """A per-thread register (scalar of `ty`)."""

    def __init__(self, slot, ty, name):
        self.slot, self.ty, self.name = slot, ty, name


class Simt:
    def __init__(self, module: ir.Module, name: str, nbuffers: int, block: int,
                 grid: tuple, target: str = "gpu", min_blocks_per_sm: int = 0,
                 dims: list | None = None):
        assert target in ("gpu", "host")
        # dims (size-generic kernels, dynplan.py): one i64 size argument per symbol after
        # the buffers; the grid is the launch's (nctaid), host blocks get it as arguments
        self.dyn = len(dims) if dims is not None else None
        self.module, self.name, self.target = module, name, target
        self.block = int(block)
        self.grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
        self.addrspace = 1 if target == "gpu" else 0
        self.gptr = ir.PointerType(addrspace=self.addrspace)
        argtys = [self.gptr] * nbuffers + [I64] * (self.dyn or 0)
        if target == "host":
            argtys = argtys + [I32, I32, I32] * (2 if self.dyn is not None else 1)
            fname = name + ".block"
        else:
            fname = name
        self.fn = ir.Function(module, ir.FunctionType(VOID, argtys), fname)
        if target == "gpu":
            self.fn.calling_convention = "ptx_kernel"
        for i in range(nbuffers):
            a = self.fn.args[i]
            a.add_attribute("noalias")
            a.name = f"buf{i}"
        self.buffers = list(self.fn.args[:nbuffers])
        for j in range(self.dyn or 0):
            self.fn.args[nbuffers + j].name = f"dim.{j}"
        self._nfixed = nbuffers + (self.dyn or 0)   # args before ctaid (host)
        self._entry = self.fn.append_basic_block("entry")
        self._allocas = ir.IRBuilder(self._entry)
        body = self.fn.append_basic_block("body")
        self.b = ir.IRBuilder(body)
        self._tid = None
        self._phase_exit = None
        self._nshared = 0
        self.min_blocks_per_sm = min_blocks_per_sm
        if target == "host":
            self._open_phase()

    # ---------------------------------------------------------------- indices
    def _sreg(self, name):
        fn = self.module.globals.get(name)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(I32, []), name)
        return self.b.call(fn, [])

    def tid(self) -> ir.Value:
        """This thread's index in the block (i32, 1-D blocks)."""
        if self.target == "host":
            return self._tid
        return self._sreg("llvm.nvvm.read.ptx.sreg.tid.x")

    def ctaid(self, axis: int = 0) -> ir.Value:
        """This block's index along grid axis 0/1/2 (i32; uniform)."""
        if self.grid[axis] == 1:
            return c32(0)
        if self.target == "host":
            return self.fn.args[self._nfixed + axis]
        return self._sreg("llvm.nvvm.read.ptx.sreg.ctaid." + "xyz"[axis])

    def nctaid(self, axis: int = 0) -> ir.Value:
        """The grid's size along axis 0/1/2 (i32): the launch's, in size-generic kernels."""
        if self.dyn is None:
            return c32(self.grid[axis])
        if self.target == "host":
            return self.fn.args[self._nfixed + 3 + axis]
        return self._sreg("llvm.nvvm.read.ptx.sreg.nctaid." + "xyz"[axis])

    # ---------------------------------------------------------------- registers
    def reg(self, ty, name="r", init=None) -> Reg:
        if self.target == "gpu":
            slot = self._allocas.alloca(ty, name=name)
        else:
            slot = self._allocas.alloca(ir.ArrayType(ty, self.block), name=name)
        slot.type = ir.PointerType()   # opaque: LLVM >= 17 text has no typed pointers
        r = Reg(slot, ty, name)
        if init is not None:
            self.set(r, init)
        return r

    def _addr(self, r: Reg):
        if self.target == "gpu":
            return r.slot
        return self.b.gep(r.slot, [c32(0), self.tid()], source_etype=r.slot.allocated_type)

    def get(self, r: Reg):
        return self.b.load(self._addr(r), typ=r.ty)

    def set(self, r: Reg, v):
        self.b.store(v, self._addr(r))

    # ---------------------------------------------------------------- shared memory
    def shared(self, ty, count: int, name="smem"):
        """A block-shared array of `count` elements; returns its base pointer."""
        arr = ir.ArrayType(ty, int(count))
        self._nshared += arr.count * _sizeof(ty)
        if self.target == "gpu":
            gv = ir.GlobalVariable(self.module, arr, f"{self.name}.{name}", addrspace=3)
            gv.type = ir.PointerType(addrspace=3)  # opaque pointer in LLVM >= 17 text
            gv.linkage = "internal"
            gv.align = 16
            gv.initializer = ir.Constant(arr, ir.Undefined)
            return gv
        a = self._allocas.alloca(arr, name=name)
        a.type = ir.PointerType()
        a.align = 16
        return a

    @property
    def shared_bytes(self) -> int:
        return self._nshared

    # ---------------------------------------------------------------- phases
    def _open_phase(self):
        """Host: start a loop over the block's threads at the builder's position."""
        b = self.b
        pre = b.block
        head = self.fn.append_basic_block("phase")
        body = self.fn.append_basic_block("phase.body")
        exit_ = self.fn.append_basic_block("phase.exit")
        b.branch(head)
        b.position_at_end(head)
        t = b.phi(I32, name="tid")
        t.add_incoming(c32(0), pre)
        b.cbranch(b.icmp_unsigned("<", t, c32(self.block)), body, exit_)
        b.position_at_end(body)
        self._tid = t
        self._phase = (head, t, exit_)

    def _close_phase(self):
        head, t, exit_ = self._phase
        b = self.b
        nxt = b.add(t, c32(1))
        t.add_incoming(nxt, b.block)
        b.branch(head)
        b.position_at_end(exit_)
        self._tid = None

    def barrier(self):
        """All threads of the block reach this point before any goes on (bar.sync 0)."""
        if self.target == "gpu":
            fn = self.module.globals.get("llvm.nvvm.barrier0")
            if fn is None:
                fn = ir.Function(self.module, ir.FunctionType(VOID, []), "llvm.nvvm.barrier0")
            self.b.call(fn, [])
        else:
            self._close_phase()
            self._open_phase()

    def shfl_xor(self, src: Reg, mask: int, dst: Reg):
        """dst = src of lane (lane ^ mask) in this warp; every lane of the warp takes part."""
        assert src is not dst and src.ty in (F32, I32, F64, I64)
        if self.target == "gpu":
            wide = src.ty in (F64, I64)      # 64 bits: two 32-bit shuffles
            ty = I32 if wide else src.ty
            suffix = "f32" if ty == F32 else "i32"
            name = f"llvm.nvvm.shfl.sync.bfly.{suffix}"
            fn = self.module.globals.get(name)
            if fn is None:
                fn = ir.Function(self.module, ir.FunctionType(ty, [I32, ty, I32, I32]), name)
            b = self.b
            if not wide:
                self.set(dst, b.call(fn, [c32(-1), self.get(src), c32(mask), c32(31)]))
                return
            x = b.bitcast(self.get(src), I64)
            lo = b.call(fn, [c32(-1), b.trunc(x, I32), c32(mask), c32(31)])
            hi = b.call(fn, [c32(-1), b.trunc(b.lshr(x, ir.Constant(I64, 32)), I32),
                             c32(mask), c32(31)])
            v = b.or_(b.shl(b.zext(hi, I64), ir.Constant(I64, 32)), b.zext(lo, I64))
            self.set(dst, b.bitcast(v, src.ty))
        else:
            self._close_phase()
            self._open_phase()
            other = self.b.xor(self.tid(), c32(mask))
            v = self.b.load(self.b.gep(src.slot, [c32(0), other],
                                       source_etype=src.slot.allocated_type), typ=src.ty)
            self.set(dst, v)
            self._close_phase()
            self._open_phase()

    # ---------------------------------------------------------------- control flow
    @contextmanager
    def uniform_loop(self, n: int, name="u"):
        """`for i in range(n)` executed by every thread alike; may hold barriers.
        Yields the i32 induction variable."""
        with self.uniform_range(lambda b: (c32(0), c32(n) if isinstance(n, int) else n),
                                name) as i:
            yield i

    @contextmanager
    def uniform_range(self, bounds, name="u"):
        """`for i in range(lo, hi)` with (lo, hi) = bounds(builder): i32 values computed
        from block-uniform inputs only (ctaid, constants; no tid, no registers), so every
        thread of the block runs the same trips; may hold barriers.  Yields i (i32)."""
        b = self.b
        if self.target == "host":
            self._close_phase()    # the bounds are computed once per block, between phases
        lo, hi = bounds(b)
        pre = b.block
        head = self.fn.append_basic_block(name + ".head")
        body = self.fn.append_basic_block(name + ".body")
        exit_ = self.fn.append_basic_block(name + ".exit")
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(I32, name=name)
        i.add_incoming(lo, pre)
        b.cbranch(b.icmp_signed("<", i, hi), body, exit_)
        b.position_at_end(body)
        if self.target == "host":
            self._open_phase()
        yield i
        if self.target == "host":
            self._close_phase()
        nxt = b.add(i, c32(1))
        i.add_incoming(nxt, b.block)
        b.branch(head)
        b.position_at_end(exit_)
        if self.target == "host":
            self._open_phase()

    @contextmanager
    def if_then(self, cond, name="if"):
        """Per-thread `if cond:` (no barriers or shuffles inside)."""
        with self.b.if_then(cond):
            yield

    def loop(self, start, stop, step, ty=I32, name="i"):
        """Per-thread `for i in range(start, stop, step)` (no barriers inside); a context
        manager yielding i."""
        return _Loop(self, start, stop, step, ty, name)

    # ---------------------------------------------------------------- finish
    def finish(self):
        if self.target == "host":
            self._close_phase()
        self.b.ret_void()
        self._allocas.branch(self.fn.blocks[1])
        if self.target == "host":
            self._grid_wrapper()
        else:   # launch bounds: .maxntid (and .minnctapersm, which caps registers)
            ann = [("maxntidx", self.block)]
            if self.min_blocks_per_sm:
                ann.append(("minctasm", self.min_blocks_per_sm))
            for key, val in ann:
                self.module.add_named_metadata("nvvm.annotations", [
                    self.fn, ir.MetaDataString(self.module, key), c32(val)])
        return self.fn

    def _grid_wrapper(self):
        """Host: @NAME.grid(ptr...) runs every block of the grid in order."""
        dyn = self.dyn is not None
        tys = [self.gptr] * len(self.buffers) + [I64] * (self.dyn or 0) + [I32] * (3 * dyn)
        fn = ir.Function(self.module, ir.FunctionType(VOID, tys), self.name + ".grid")
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        idx = []
        fixed = list(fn.args[:self._nfixed])
        grid = list(fn.args[self._nfixed:]) if dyn else []

        def nest(axis):
            if axis < 0:
                b.call(self.fn, fixed + [idx[2], idx[1], idx[0]] + grid)
                return
            n = grid[axis] if dyn else c32(self.grid[axis])
            with _Loop(None, c32(0), n, c32(1), I32, "g" + "xyz"[axis], builder=b,
                       fn=fn) as i:
                idx.append(i)
                nest(axis - 1)
                idx.pop()
        nest(2)
        b.ret_void()


class _Loop:
    def __init__(self, sm, start, stop, step, ty, name, builder=None, fn=None):
        self.b = builder if builder is not None else sm.b
        self.fn = fn if fn is not None else sm.fn
        self.start, self.stop, self.step, self.ty, self.name = start, stop, step, ty, name

    def __enter__(self):
        b = self.b
        self.pre = b.block
        self.head = self.fn.append_basic_block(self.name + ".head")
        self.body = self.fn.append_basic_block(self.name + ".body")
        self.exit = self.fn.append_basic_block(self.name + ".exit")
        b.branch(self.head)
        b.position_at_end(self.head)
        self.i = b.phi(self.ty, name=self.name)
        self.i.add_incoming(self.start, self.pre)
        b.cbranch(b.icmp_signed("<", self.i, self.stop), self.body, self.exit)
        b.position_at_end(self.body)
        return self.i

    def __exit__(self, *exc):
        if exc[0] is not None:
            return False
        b = self.b
        nxt = b.add(self.i, self.step)
        self.i.add_incoming(nxt, b.block)
        b.branch(self.head)
        b.position_at_end(self.exit)
        return False


def _sizeof(ty) -> int:
    if isinstance(ty, ir.IntType):
        return max(1, ty.width // 8)
    if isinstance(ty, ir.FloatType):
        return 4
    if isinstance(ty, ir.DoubleType):
        return 8
    if isinstance(ty, ir.VectorType):
        return ty.count * _sizeof(ty.element)
    raise TypeError(ty)

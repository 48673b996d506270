"""The shared sgemm object: compiled once per CPU, cached, linked into every module.

    sgemm.emit_sgemm, one object per variant:
        "plain"  rlxc_sgemm_plain_TAG  (C = A@B)                          ~0.35 s
        "cb"     rlxc_sgemm_cb_TAG     (C = epi(A@B), epi a callback)     ~0.55 s
          │ O3 + codegen once per (cpu, sgemm config, sources, variant)
          ▼
    object bytes: memory cache, then runtime_dir()/sgemm-KEY-VARIANT.o
          │ relocatable_link([module object, the variants its matmuls call])  (cc -r)
          ▼
    one self-contained object per compiled function (what cpu.py links / writer.py embeds)

Why: an sgemm is large (packing, a 14x32 register-tiled microkernel, edge
cases, threading) and costs far more LLVM time than a typical fused graph, so
emitting it into every module would make every function with a matmul take
about a second to compile.  The two entry points are `weak_odr` and `hidden`:
several objects carrying them link into one library (AOT kernel + train
step), and they are not exported from the .so.

Callback epilogue.  `rlxc_sgemm_cb_TAG` takes two extra arguments, a function
`void epi(i8* ctx, i64 row, i64 col, float* c, i64 ldc, i64 rows, i64 n)` and its
`ctx`; epi rewrites in place the rows x n block at c (row stride ldc), whose first
element is C's (row, col).  The register tiles of the packed path store a finished
tile to C and call epi once on it (rows <= MR, n <= NR): its vectors are independent,
so a costly epilogue (gelu, tanh) runs several dependency chains at once instead of
one per call.  The other kernels (skinny, tall, narrow) call it per row-vector of C
(VL floats, the first n valid) on a stack slot (rows = 1), then store the slot.
Built-in epilogues: an `epi` below BUILTIN_MAX is not called but a code for
one inlined in the kernel (a linear layer's bias, with or without ReLU:
BUILTIN_BIAS / BUILTIN_BIAS_RELU; ctx[0] is then the bias row, read at C's
column), so the commonest epilogues pay no call per vector (matmul_codegen
.builtin_epilogue picks them).
The disk entry is checked against its sha256 sidecar before use.  It lives
in runtime_dir() ($RLXC_RUNTIME_DIR, default ~/.cache/rlxc-runtime), not in
the function cache: it is toolchain, not a compiled user function.

Built ahead of time.  Building both variants takes 2-4 s of LLVM time, which a
first run on a fresh machine would pay before its first result.  `make` (the
install step) therefore runs `python -m rlxc.lowering.cpu.sgemm_object`, which
builds them for the host and the x86-64-v3 baseline into prebuilt_dir() (next
to this file; $RLXC_PREBUILT_DIR overrides it, empty turns it off).  Lookup
order: memory, runtime_dir(), prebuilt_dir(), build (into runtime_dir()).  The
key covers the CPU, its derived blocking, llvmlite and these sources, so a
stale or foreign prebuilt object is never picked up.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
import threading

import llvmlite.ir as ir

F32 = ir.FloatType()
I8P = ir.IntType(8).as_pointer()
I32 = ir.IntType(32)
I64 = ir.IntType(64)
VOID = ir.VoidType()
# epi(ctx, row, col, c, ldc, rows, n): rewrite the rows x n block at c (row stride ldc),
# whose element (0, 0) is C's (row, col), in place
EPI_FN = ir.FunctionType(VOID, [I8P, I64, I64, F32.as_pointer(), I64, I64, I64])

_lock = threading.Lock()
_objects: dict = {}
SOURCES = ("sgemm_kernels.py", "openmp.py", "target.py", "partition.py", "sgemm_object.py",
           "sgemm_tall.py", "sgemm_dyn.py")


def _key(cpu: str) -> tuple[str, str]:
    """(disk key, symbol tag) of `cpu`'s sgemm: computed once per process and cpu (it
    reads and hashes the sources, and every matmul of a module asks for it)."""
    got = _keys.get(cpu)
    if got is None:
        got = _keys[cpu] = _compute_key(cpu)
    return got


_keys: dict = {}


def _compute_key(cpu: str) -> tuple[str, str]:
    from llvmlite import __version__ as llvmlite_version   # not importlib.metadata: ~20 ms

    from rlxc.lowering.cpu.sgemm_kernels import sgemm_config
    from rlxc.lowering.cpu.target import resolve_cpu

    from rlxc.lowering.cpu.target import resolve_target

    name, feats = resolve_cpu(cpu)
    triple = resolve_target(cpu)[0].triple
    h = hashlib.sha256(f"{triple}|{name}|{feats}|{sgemm_config(cpu)}|{llvmlite_version}"
                       .encode())
    d = os.path.dirname(__file__)
    for n in SOURCES:
        with open(os.path.join(d, n), "rb") as f:
            h.update(f.read())
    k = h.hexdigest()
    return k[:32], k[:10]


def symbols(cpu: str = "native") -> tuple[str, str]:
    """(plain sgemm, callback sgemm) symbol names for `cpu`."""
    tag = _key(cpu)[1]
    return f"rlxc_sgemm_plain_{tag}", f"rlxc_sgemm_cb_{tag}"


def vector_width(cpu: str = "native") -> int:
    from rlxc.lowering.cpu.sgemm_kernels import sgemm_config

    return sgemm_config(cpu).vl


_slots: dict = {}


def _at_entry(b: ir.IRBuilder, key, make):
    """make(t), emitted once per function at the start of its entry block (t: a builder
    there) and cached under `key`: the hooks are emitted at every store of C, what they
    need once is computed once.  A value (or a tuple's first) of another function is
    stale."""
    key = (id(b.function), *key)
    got = _slots.get(key)
    first = got[0] if isinstance(got, tuple) else got
    if got is None or first.parent.parent is not b.function:
        entry = b.function.entry_basic_block
        t = ir.IRBuilder(entry)
        if entry.instructions:
            t.position_before(entry.instructions[0])
        got = _slots[key] = make(t)
    return got


def _entry_slot(b: ir.IRBuilder, ty):
    """One stack slot per function for the epilogue vector (the hook is emitted many times)."""
    return _at_entry(b, (str(ty),), lambda t: t.alloca(ty))


BUILTIN_BIAS, BUILTIN_BIAS_RELU = 1, 2   # epi "function pointers" that are built-in epilogues
BUILTIN_MAX = 16


def _callback_hook(b, row, col, vec, lanes, mask, args):
    """The cb variant's epilogue: a built-in one when `epi` is a small code, else the call."""
    from rlxc.lowering.cpu.sgemm_kernels import masked_load

    fnp, ctx = args
    is_builtin, bias, lov = _builtin_setup(b, fnp, ctx, vec.type)
    with b.if_else(is_builtin, likely=True) as (builtin, other):
        with builtin:   # v + bias[col..] (ctx[0] = bias), then relu for BUILTIN_BIAS_RELU
            x = b.fadd(vec, masked_load(b, b.gep(bias, [col], inbounds=True), lanes, mask))
            # relu as rlx.relu: NaN passes, -0 -> +0; with lo = -inf it is the identity
            x = b.select(b.fcmp_unordered(">", x, lov), x, lov)
            x_builtin, blk_builtin = x, b.block
        with other:
            x_call = _call_hook(b, vec, lanes, mask, fnp, ctx, row, col)
            blk_call = b.block
    out = b.phi(vec.type)
    out.add_incoming(x_builtin, blk_builtin)
    out.add_incoming(x_call, blk_call)
    return out


def _tile_use(b, args):
    """i1: the tile form of the epilogue applies (a real callback, not a built-in code)."""
    return _at_entry(b, ("called",), lambda t: t.icmp_unsigned(
        ">=", t.ptrtoint(args[0], I64), ir.Constant(I64, BUILTIN_MAX)))


def _tile_call(b, row0, col0, c, ldc, rows, n, args):
    """The callback on a whole register tile of C (stored as computed): one call per tile."""
    fnp, ctx = args
    b.call(b.bitcast(fnp, EPI_FN.as_pointer()), [ctx, row0, col0, c, ldc, rows, n])


_callback_hook.tile = (_tile_use, _tile_call)


def _builtin_setup(b, fnp, ctx, vt):
    """(is a built-in code, the bias row, the splat lower bound) for the function being
    emitted, computed once at its entry (the hook is emitted at every store of C).
    ctx[0] is read even for a real callback (ctx has at least one slot), never used."""
    def make(t):
        code = t.ptrtoint(fnp, I64)
        is_builtin = t.icmp_unsigned("<", code, ir.Constant(I64, BUILTIN_MAX))
        bias = t.load(t.bitcast(ctx, F32.as_pointer().as_pointer()))
        lo = t.select(t.icmp_unsigned("==", code, ir.Constant(I64, BUILTIN_BIAS_RELU)),
                      ir.Constant(F32, 0.0), ir.Constant(F32, float("-inf")))
        lov = t.shuffle_vector(
            t.insert_element(ir.Constant(vt, ir.Undefined), lo, ir.Constant(I32, 0)),
            ir.Constant(vt, ir.Undefined), ir.Constant(ir.VectorType(I32, vt.count),
                                                       [0] * vt.count))
        return is_builtin, bias, lov
    return _at_entry(b, ("builtin", str(vt)), make)


def _call_hook(b, vec, lanes, mask, fnp, ctx, row, col):
    slot = _entry_slot(b, vec.type)
    b.store(vec, slot, align=4)
    if mask is None:
        n = ir.Constant(I64, lanes)
    else:
        bits = b.bitcast(mask, ir.IntType(lanes))
        pc = b.module.globals.get(f"llvm.ctpop.i{lanes}") or ir.Function(
            b.module, ir.FunctionType(ir.IntType(lanes), [ir.IntType(lanes)]),
            f"llvm.ctpop.i{lanes}")
        n = b.zext(b.call(pc, [bits]), I64)
    fn = b.bitcast(fnp, EPI_FN.as_pointer())
    b.call(fn, [ctx, row, col, b.bitcast(slot, F32.as_pointer()), ir.Constant(I64, lanes),
                ir.Constant(I64, 1), n])
    return b.load(slot, align=4)


VARIANTS = ("plain", "cb")


def _build(cpu: str, variant: str) -> bytes:
    from rlxc.lowering.cpu.sgemm_kernels import emit_sgemm
    from rlxc.lowering.cpu.target import compile_objects, ir_module

    name = symbols(cpu)[VARIANTS.index(variant)]
    hook, extra = (None, ()) if variant == "plain" else (_callback_hook, (I8P, I8P))
    _slots.clear()
    m = ir_module(f"rlxc_sgemm_{variant}", cpu)
    fn = emit_sgemm(m, name, cpu=cpu, epilogue=hook, epilogue_arg_types=extra)
    fn.linkage = "weak_odr"
    text = str(m).replace(f'define weak_odr void @"{name}"',
                          f'define weak_odr hidden void @"{name}"')
    # untuned (target.TUNING_FEATURES): the GEMM kernels were tuned without them; in
    # parts on several cores (partition.py), weak_odr across parts as the entry is: every
    # program's object holds a copy of this one
    objs = compile_objects(text, cpu, 3, tuned=False, shared=True)
    return objs[0] if len(objs) == 1 else relocatable_link(objs, cpu)


def runtime_dir() -> str:
    """Where built runtime objects live: $RLXC_RUNTIME_DIR, else ~/.cache/rlxc-runtime.

    Not under RLXC_CACHE_DIR: the sgemm depends only on the CPU and the compiler's
    sources, never on a user function, so it is part of the installed toolchain
    (like libgomp), built once per machine, not once per function cache."""
    return os.environ.get("RLXC_RUNTIME_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "rlxc-runtime")


def prebuilt_dir() -> str:
    """Where objects built at install time live ($RLXC_PREBUILT_DIR; "" = none)."""
    env = os.environ.get("RLXC_PREBUILT_DIR")
    if env is not None:
        return env
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "prebuilt")


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            data = f.read()
        with open(path + ".sha256") as f:
            want = f.read().strip()
    except OSError:
        return None
    return data if hashlib.sha256(data).hexdigest() == want else None


def _write_atomic(path: str, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def sgemm_object(cpu: str = "native", variant: str = "cb") -> bytes:
    """The object defining one sgemm entry point for `cpu`: "plain" (C = A@B) or "cb"
    (with the epilogue callback).  Built at most once per process and runtime dir;
    each variant is its own object so a function links (and a first run builds)
    only the one its matmuls call."""
    if variant not in VARIANTS:
        raise ValueError(f"sgemm_object: variant {variant!r}; valid: {VARIANTS}")
    key = _key(cpu)[0]
    d = runtime_dir()
    mkey = (key, variant, d)
    obj = _objects.get(mkey)
    if obj is not None:
        return obj
    with _lock:
        obj = _objects.get(mkey)
        if obj is None:
            path = os.path.join(d, f"sgemm-{key}-{variant}.o")
            obj = _read(path)
            pre = prebuilt_dir()
            if obj is None and pre:
                obj = _read(os.path.join(pre, os.path.basename(path)))
            if obj is None:
                obj = _build(cpu, variant)
                try:
                    os.makedirs(d, exist_ok=True)
                    _write_atomic(path + ".sha256", hashlib.sha256(obj).hexdigest().encode())
                    _write_atomic(path, obj)
                except OSError:
                    pass  # read-only location: keep it in memory only
            _objects[mkey] = obj
    return obj


def relocatable_link(objects: list[bytes], cpu: str = "native") -> bytes:
    """Combine object files into one relocatable object (`cc -nostdlib -r`, with the
    C compiler of `cpu`'s target)."""
    import subprocess

    from rlxc.lowering.cpu.target import cc_for, write_objects

    with tempfile.TemporaryDirectory(prefix="rlxc-r-") as tmp:
        paths = write_objects(tmp, objects)
        out = os.path.join(tmp, "all.o")
        proc = subprocess.run([cc_for(cpu), "-nostdlib", "-r", "-o", out, *paths],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"relocatable link failed: {proc.stderr.strip()}")
        with open(out, "rb") as f:
            return f.read()


def prebuild(cpus=("native", "x86-64-v3"), out: str | None = None) -> list[str]:
    """Build both variants for each of `cpus` into `out` (default prebuilt_dir());
    returns the paths written (an existing, intact object is kept)."""
    out = out or prebuilt_dir()
    if not out:
        raise ValueError("prebuild: no output folder ($RLXC_PREBUILT_DIR is empty)")
    os.makedirs(out, exist_ok=True)
    paths = []
    for cpu in cpus:
        key = _key(cpu)[0]
        for variant in VARIANTS:
            path = os.path.join(out, f"sgemm-{key}-{variant}.o")
            if _read(path) is None:
                obj = _build(cpu, variant)
                _write_atomic(path + ".sha256", hashlib.sha256(obj).hexdigest().encode())
                _write_atomic(path, obj)
            paths.append(path)
    return paths


def main(argv=None) -> int:
    import argparse
    import time

    ap = argparse.ArgumentParser(description="Build the shared sgemm objects ahead of time.")
    ap.add_argument("cpus", nargs="*", default=["native", "x86-64-v3"],
                    help="cpu strings (default: native x86-64-v3)")
    ap.add_argument("--out", default=None, help="folder (default: prebuilt_dir())")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    paths = prebuild(args.cpus, args.out)
    print(f"rlxc: {len(paths)} sgemm objects for {', '.join(args.cpus)} in "
          f"{os.path.dirname(paths[0]) if paths else args.out} ({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

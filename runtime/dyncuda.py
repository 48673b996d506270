"""Running a size-generic GPU program: one module serves every size of its symbols.

    DynCudaProgram(meta "rlxc-cuda-dyn-1", blobs, drv)   (lowering/gpu/dynplan.py)
      load     the module once (cubin when it fits the device, else PTX), static
               constants uploaded once
      run(args) per call: sizes from the arrays (runtime/dims.py: agreement, >= 1);
               buffer offsets, region sizes, output shapes and each launch's grid
               (max(1, min(ceil(n / per), cap)), n linear in the sizes) evaluated from
               them; a region is reallocated only when the sizes need more (reused while
               they fit); splat constants sized by a symbol refilled when the sizes
               change; kernels get the buffer pointers and one i64 per symbol
               (the emulator's host kernels also get the grid)

A size in the metadata is an int or [c0, [[symbol, k], ...]] (runtime/dyncpu.size_of).
NumPy, ctypes and the standard library only.
"""
from __future__ import annotations

from collections import namedtuple

import numpy as np

from . import cuda as rt
from .dims import bind_sizes
from .dyncpu import size_of
from .errors import ArtifactError, RlxError
from .signature import NP_DTYPES, coerce

FORMAT = "rlxc-cuda-dyn-1"
_Spec = namedtuple("_Spec", "name kind shape dtype")   # what runtime/dims.bind_sizes reads


def load_artifact(data: bytes) -> tuple[dict, dict]:
    """(meta, blobs) of a size-generic program container (runtime.cuda's container,
    format "rlxc-cuda-dyn-1")."""
    return rt.load_artifact(data, FORMAT)


class DynCudaProgram(rt.LoadedProgram):
    """A size-generic GPU program loaded on a device: `run(args) -> outputs` (close / with:
    cuda.LoadedProgram)."""

    def __init__(self, meta: dict, blobs: dict, device: int = 0, drv=None):
        if meta.get("format") != FORMAT:
            raise ArtifactError(f"DynCudaProgram: artifact format {meta.get('format')!r}")
        self.meta, self.blobs = meta, blobs
        self.driver = drv or rt.driver()
        self.ctx = rt.context(device, self.driver)
        self.name = meta["name"]
        self.dims = list(meta["dims"])
        self.emulated = bool(getattr(self.driver, "emulated", False))
        kind = rt.arch_fits(meta["arch"], self.ctx.capability)
        if kind is None:
            raise ArtifactError(f"{self.name}: compiled for {meta['arch']}, but device "
                                f"{self.ctx.ordinal} ({self.ctx.name}) is {self.ctx.arch}")
        use_cubin = kind == "cubin" and blobs.get("cubin")
        self.image_kind = "cubin" if use_cubin else "ptx"
        self.module = self.driver.module_load(blobs["cubin"] if use_cubin else blobs["ptx"])
        self.functions = {st["kernel"]: self.driver.function(self.module, st["kernel"])
                          for st in meta["steps"] if st["op"] == "launch"}
        self.specs = [_Spec(a["name"], a["kind"], tuple(a["shape"]), a["dtype"])
                      for a in meta["args"]]
        self.buffers = {b["id"]: b for b in meta["buffers"]}
        self._mem: dict = {}            # region -> DeviceBuffer (grown only)
        self._fill_env = None
        self._plans: dict = {}           # sizes -> (pointers, prepared steps)
        self._resident: dict = {}
        self.stream = self.driver.stream_create()
        self._closed = False
        self.allocations = 0             # region (re)allocations, for tests and tuning
        self._region("param", self._region_size("param", {}))
        self._region("const", self._region_size("const", {}))
        host = np.frombuffer(blobs.get("consts", b""), dtype=np.uint8)
        for c in meta["consts"]:
            if "fill" not in c:
                view = np.ascontiguousarray(host[c["blob_offset"]:c["blob_offset"] + c["nbytes"]])
                self.driver.memcpy_htod(self._ptr(c["buffer"], {}), view.ctypes.data,
                                        c["nbytes"])
        errs = meta.get("errors")
        self._errors = errs

    # -- sizes
    def _region_size(self, region: str, env: dict) -> int:
        return max(size_of(e, env) for e in self.meta["regions"].get(region, [0]))

    def _region(self, region: str, nbytes: int):
        buf = self._mem.get(region)
        if buf is None or buf.nbytes < nbytes:   # grow only: reused while the sizes fit
            if buf is not None:
                self.driver.stream_synchronize(self.stream)
                buf.close()
            buf = self._mem[region] = rt.DeviceBuffer(self.driver, max(nbytes, 256))
            self.allocations += 1
            self._plans.clear()
            if region == "fill":
                self._fill_env = None
        return buf

    def _ptr(self, bid: int, env: dict) -> int:
        b = self.buffers[bid]
        return self._mem[b["region"]].ptr + size_of(b["offset"], env)

    def _nbytes(self, bid: int, env: dict) -> int:
        return size_of(self.buffers[bid]["nbytes"], env)

    def _plan(self, env: dict):
        key = tuple(env[s] for s in self.dims)
        got = self._plans.get(key)
        if got is not None:
            return got
        limit = self.meta.get("index_limit", 2 ** 31 - 1024)
        for b in self.meta["buffers"]:   # 32-bit index arithmetic (the samples chose it)
            if size_of(b["nbytes"], env) > limit:
                raise ValueError(f"{self.name}: a tensor of {size_of(b['nbytes'], env)} bytes "
                                 f"at sizes {env} is too large for this GPU program")
        for r in self.meta["regions"]:
            if r not in ("param", "const"):
                self._region(r, self._region_size(r, env))
        dims = [env[s] for s in self.dims]
        steps = []
        for st in self.meta["steps"]:
            if st["op"] == "launch":
                grid = []
                for n, per, cap, hard in st["grid_rule"]:
                    g = -(-size_of(n, env) // per)
                    if g > cap and hard:
                        raise ValueError(f"{self.name}: kernel {st['kernel']} needs a grid of "
                                         f"{g} blocks at sizes {env} (at most {cap})")
                    grid.append(max(1, min(g, cap)))
                vals = [self._ptr(i, env) for i in st["args"]] + dims
                kinds = ["ptr"] * len(st["args"]) + ["i64"] * len(dims)
                if self.emulated:   # host kernels run the grid themselves
                    vals, kinds = vals + grid, kinds + ["i64"] * 3
                params, keep = rt.pack_args(vals, kinds)
                steps.append(("launch", self.functions[st["kernel"]], grid, st["block"],
                              st.get("smem", 0), params, keep))
            elif st["op"] == "memset":
                steps.append(("memset", self._ptr(st["buffer"], env),
                              self._nbytes(st["buffer"], env)))
            else:
                raise ArtifactError(f"{self.name}: unknown step {st['op']!r}")
        if len(self._plans) >= 64:
            self._plans.pop(next(iter(self._plans)))
        got = self._plans[key] = (dims, steps)
        return got

    def _fill(self, env: dict) -> None:
        """Splat constants sized by a symbol, written at the call's sizes."""
        key = tuple(env[s] for s in self.dims)
        if self._fill_env == key:
            return
        for c in self.meta["consts"]:
            if "fill" in c:
                n = self._nbytes(c["buffer"], env)
                elem = np.frombuffer(bytes.fromhex(c["fill"]), np.uint8)
                data = np.ascontiguousarray(np.tile(elem, -(-n // elem.size))[:n])
                self.driver.memcpy_htod(self._ptr(c["buffer"], env), data.ctypes.data, n,
                                        self.stream)
                self._keep_fill = data
        self._fill_env = key

    # -- running
    def run(self, args) -> list[np.ndarray]:
        """Arrays for every argument (signature order) -> output arrays."""
        if self._closed:
            raise RlxError(f"{self.name}: program is closed")
        want = self.meta["args"]
        if len(args) != len(want):
            raise TypeError(f"{self.name}: expected {len(want)} arrays "
                            f"({[a['name'] for a in want]}), got {len(args)}")
        shapes = [np.shape(x) for x in args]
        env = bind_sizes(self.specs, shapes, f"{self.name}.run")
        args = [coerce(a["kind"], a["name"], x,
                       tuple(env[d] if isinstance(d, str) else d for d in a["shape"]),
                       a["dtype"]) for a, x in zip(want, args)]
        self.ctx.activate()
        dims, steps = self._plan(env)
        drv, s = self.driver, self.stream
        self._fill(env)
        for i, (a, x) in enumerate(zip(want, args)):
            if a["kind"] == "param":
                prev = self._resident.get(i)
                if prev is not None and prev is x and not x.flags.writeable:
                    continue
                self._resident[i] = x
            if x.nbytes:
                drv.memcpy_htod(self._ptr(a["buffer"], env), x.ctypes.data, x.nbytes, s)
        for st in steps:
            if st[0] == "launch":
                drv.launch(st[1], st[2], st[3], st[4], s, st[5])
            else:
                drv.memset(st[1], 0, st[2], s)
        outs = []
        for o in self.meta["outputs"]:
            dst = np.empty(tuple(size_of(d, env) for d in o["shape"]), NP_DTYPES[o["dtype"]])
            if dst.nbytes:
                drv.memcpy_dtoh(dst.ctypes.data, self._ptr(o["buffer"], env), dst.nbytes, s)
            outs.append(dst)
        drv.stream_synchronize(s)
        self._raise_kernel_error(env)
        return outs

    __call__ = run

    def _raise_kernel_error(self, env) -> None:
        if not self._errors:
            return
        flag = np.zeros(1, np.int32)
        self.driver.memcpy_dtoh(flag.ctypes.data, self._ptr(self._errors["buffer"], env), 4)
        code = int(flag[0])
        if code:
            exc, msg = self._errors["codes"].get(str(code),
                                                 ("RuntimeError", f"kernel error code {code}"))
            raise {"IndexError": IndexError}.get(exc, RlxError)(msg)

"""Control-flow steps of a GPU launch plan, run on the host (lowering/gpu/regions.py).

    copy  {src, dst, nbytes, src_step, dst_step}   cuMemcpyDtoDAsync at offsets
                                                   step * (the enclosing loop's row)
    loop  {count, reverse, steps}                  rlx.scan: the steps count times
    while {cond, flag, body}                       rlx.while: cond steps, the 1-byte flag
                                                   read back (a synchronization), body
    if    {pred, pred_bytes, then, else}           rlx.if: the predicate read back

`prepare` turns the JSON steps into tuples once (pointers resolved, launch
parameters packed); `run` issues them on the program's stream.  NumPy and the
driver interface only, like runtime/cuda.py.
"""
from __future__ import annotations

import numpy as np

CONTROL = ("copy", "loop", "while", "if")


def prepare(prog, st):
    """One control step as a tuple for `run` (nested steps prepared recursively)."""
    op = st["op"]
    if op == "copy":
        return ("copy", prog.ptr[st["src"]], prog.ptr[st["dst"]], st["nbytes"],
                st.get("src_step", 0), st.get("dst_step", 0))
    if op == "loop":
        return ("loop", st["count"], bool(st.get("reverse")), _prepare_all(prog, st["steps"]))
    if op == "while":
        return ("while", _prepare_all(prog, st["cond"]), prog.ptr[st["flag"]],
                _prepare_all(prog, st["body"]))
    if op == "if":
        return ("if", prog.ptr[st["pred"]], st["pred_bytes"], _prepare_all(prog, st["then"]),
                _prepare_all(prog, st["else"]))
    raise KeyError(op)


def _prepare_all(prog, steps):
    from .cuda import pack_args

    out = []
    for st in steps:
        if st["op"] == "launch":
            fn = prog.functions.get(st["kernel"])
            if fn is None:
                fn = prog.functions[st["kernel"]] = prog.driver.function(prog.module,
                                                                         st["kernel"])
            params, keep = pack_args([prog.ptr[i] for i in st["args"]])
            out.append(("launch", fn, st["grid"], st["block"], st.get("smem", 0), params, keep))
        elif st["op"] == "memset":
            out.append(("memset", prog.ptr[st["buffer"]], prog.nbytes[st["buffer"]]))
        else:
            out.append(prepare(prog, st))
    return out


def _read(drv, ptr, nbytes, stream) -> bool:
    buf = np.zeros(1, {1: np.uint8, 4: np.int32, 8: np.int64}[nbytes])
    drv.memcpy_dtoh(buf.ctypes.data, ptr, nbytes, stream)
    drv.stream_synchronize(stream)
    return bool(buf[0])


def run(prog, steps, row: int = 0) -> None:
    """Issue prepared steps on the program's stream; `row` is the enclosing loop's index."""
    drv, s = prog.driver, prog.stream
    for st in steps:
        kind = st[0]
        if kind == "launch":
            _, fn, grid, block, smem, params, _keep = st
            drv.launch(fn, grid, block, smem, s, params)
        elif kind == "memset":
            drv.memset(st[1], 0, st[2], s)
        elif kind == "copy":
            _, src, dst, n, ss, ds = st
            if n and (src + ss * row) != (dst + ds * row):
                drv.memcpy_dtod(dst + ds * row, src + ss * row, n, s)
        elif kind == "loop":
            _, count, reverse, body = st
            for t in range(count):
                run(prog, body, count - 1 - t if reverse else t)
        elif kind == "while":
            _, cond, flag, body = st
            while True:
                run(prog, cond, row)
                if not _read(drv, flag, 1, s):
                    break
                run(prog, body, row)
        elif kind == "if":
            _, pred, nbytes, then, orelse = st
            run(prog, then if _read(drv, pred, nbytes, s) else orelse, row)
        else:
            raise KeyError(kind)

"""Releasing a loaded GPU program (runtime/cuda.py LoadedProgram), on the emulated driver.

CudaProgram and the size-generic DynCudaProgram share one close(): the stream is
destroyed, every device and pinned host allocation freed and the module unloaded,
once (a second close, `with` and the collector's __del__ do nothing more).  The
emulator's driver keeps its live allocations and modules, so the test sees the leak
a missing release would be.
"""
from __future__ import annotations

import numpy as np

import rlxc
from rlxc.lowering.gpu import emu as gpu_emu
from rlxc.runtime import cuda as rt


def _f(shape):
    return rlxc.Func("rel", lambda s: (s.input("x", shape) * 2.0).tanh().sum(-1))


class _Counting(gpu_emu.EmuDriver):
    """The emulator, counting destroyed streams."""

    def __init__(self):
        super().__init__()
        self.destroyed = 0

    def stream_destroy(self, s):
        self.destroyed += 1
        return super().stream_destroy(s)


def _released(drv, prog):
    assert prog._closed and not prog._mem
    assert not drv._mem and not drv._engines and drv.destroyed == 1


def test_static_program_releases_everything_once():
    drv = _Counting()
    f = _f((4, 3))
    art = gpu_emu.emulation_artifact(f.module)
    prog = rt.CudaProgram(art.meta, art.blobs, drv=drv, pinned=True)
    x = np.ones((4, 3), np.float32)
    np.testing.assert_allclose(prog.run([x])[0], np.tanh(2.0) * 3, rtol=1e-6)
    assert any(isinstance(m, tuple) for m in prog._mem)   # pinned host buffers too
    with prog:
        pass
    _released(drv, prog)
    prog.close()
    prog.__del__()
    assert drv.destroyed == 1


def test_dynamic_program_releases_everything_once():
    from rlxc.dyncuda import cached_build
    from rlxc.runtime.dyncuda import DynCudaProgram

    drv = _Counting()
    meta, blobs = cached_build(_f(("B", 3)), "rel", "sm_90", "host")
    prog = DynCudaProgram(meta, blobs, drv=drv)
    assert isinstance(prog, rt.LoadedProgram)
    for B in (2, 9):
        (out,) = prog.run([np.ones((B, 3), np.float32)])
        np.testing.assert_allclose(out, np.full(B, np.tanh(2.0) * 3), rtol=1e-6)
    assert drv._mem
    with prog:          # `with` (new for the dynamic program: the shared helper)
        pass
    _released(drv, prog)
    prog.close()
    assert drv.destroyed == 1

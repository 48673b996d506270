"""Bound params start on a 64-byte boundary (rlxc/func.py _coerce_param).

NumPy aligns arrays to 16 bytes; a matrix whose rows straddle cache lines makes every
AVX-512 load (every other AVX2 load) of a matrix-vector kernel touch two lines: W6's
HVP (benchmarks/compare.py, W 256x256) took 11.0 us per call instead of 6.2 on
AVX-512 and 12.9 instead of 9.4 with AVX2, depending on where malloc put the copy."""
import numpy as np
import pytest

from rlxc import Func
from rlxc.runtime.call import data_address


def _misaligned(a):
    """A C-contiguous copy of `a` that starts 16 bytes past a 64-byte boundary."""
    raw = np.empty(a.nbytes + 128, np.uint8)
    off = (-data_address(raw) % 64) + 16
    out = raw[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


SHAPES = [(1,), (7,), (255,), (257,), (3, 5), (256, 256), (257, 255)]


@pytest.mark.parametrize("shape", SHAPES)
def test_bound_params_are_64_byte_aligned_owned_and_equal(shape):
    def build(s):
        return (s.param("w", shape) * 2.0).sum()
    rng = np.random.default_rng(len(shape))
    data = rng.standard_normal(shape).astype(np.float32)
    for src in (data, _misaligned(data), data.astype(np.float64), data.tolist()):
        f = Func("w6al", build).with_param("w", src)
        b = f.param_binding("w")
        assert data_address(b) % 64 == 0, (shape, type(src))
        assert b.dtype == np.float32 and b.shape == tuple(f.param_shape_of("w"))
        assert b.flags.c_contiguous
        assert not b.flags.writeable
        np.testing.assert_array_equal(b.reshape(data.shape), data)
        if isinstance(src, np.ndarray):
            assert not np.shares_memory(b, src)     # the Func owns its bound data
    # the other ways of binding go through the same copy
    g = Func("w6al", build, params={"w": _misaligned(data)})
    assert data_address(g.param_binding("w")) % 64 == 0
    h = Func("w6al", build).with_params({"w": _misaligned(data)})
    assert data_address(h.param_binding("w")) % 64 == 0


def test_aligned_param_runs_the_same_numbers():
    n = 257
    rng = np.random.default_rng(5)
    W = _misaligned((rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32))
    x = rng.standard_normal(n).astype(np.float32)

    def build(s):
        return s.param("W", (n, n)) @ s.input("x", (n,))
    j = Func("w6al_mv", build).with_param("W", W).jit()
    assert data_address(j._caller._params[0]) % 64 == 0
    np.testing.assert_allclose(j.run(x)[0], W.astype(np.float64) @ x, rtol=1e-4, atol=1e-4)

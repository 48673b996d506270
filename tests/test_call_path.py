"""The Python call path of a jitted CPU function (rlxc/backends.py Jitted.run ->
runtime/cpu.py CpuCaller.call -> runtime/call.py CallFrame.invoke): its shortcuts
(positional inputs already as declared, no ctypes argument conversion, no timing for
a library whose thread count is fixed) must keep every check of the general path."""
import numpy as np
import pytest

from rlxc import Func


def _scale():
    return Func("cp_scale", lambda s: s.input("x", (2, 3)) * s.input("a", ())).jit()


def test_frame_calls_entry_without_argtype_conversion():
    j = _scale()
    st = j._caller._state()
    assert st._entry is not j.lib.entry and st._entry.argtypes is None
    out = j.run(np.arange(6, dtype=np.float32).reshape(2, 3), np.float32(2))[0]
    np.testing.assert_array_equal(out, 2 * np.arange(6).reshape(2, 3))


def test_fixed_governor_is_not_consulted():
    j = _scale()
    gov = j.lib.governor
    assert gov._fixed  # a program without parallel loops: one thread count
    calls = []
    orig = type(gov).begin

    def begin(self):
        calls.append(1)
        return orig(self)
    type(gov).begin = begin
    try:
        j.run(np.ones((2, 3), np.float32), np.ones((), np.float32))
    finally:
        type(gov).begin = orig
    assert not calls


def test_positional_shortcut_keeps_conversions_and_errors():
    j = _scale()
    want = 3 * np.arange(6, dtype=np.float32).reshape(2, 3)
    a = np.float32(3)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(j.run(x, np.array(3, np.float32))[0], want)
    np.testing.assert_array_equal(j.run(x, a)[0], want)                       # numpy scalar
    np.testing.assert_array_equal(j.run(x.astype(np.float64), 3.0)[0], want)  # f64, float
    np.testing.assert_array_equal(j.run(np.asfortranarray(x), a)[0], want)    # not C order
    np.testing.assert_array_equal(j.run(x.ravel(), a)[0], want)               # flat
    np.testing.assert_array_equal(j.run(x.tolist(), 3)[0], want)              # lists, int
    np.testing.assert_array_equal(j.run({"x": x, "a": a})[0], want)           # one dict
    wide = np.zeros((2, 6), np.float32)
    wide[:, ::2] = x
    np.testing.assert_array_equal(j.run(wide[:, ::2], a)[0], want)            # strided
    with pytest.raises(Exception, match=r"input 'x' expects shape \(2, 3\)"):
        j.run(np.zeros((3, 2, 1), np.float32), a)
    with pytest.raises(Exception, match="'x'.*expects shape"):
        j.run(np.zeros(5, np.float32), a)
    with pytest.raises(TypeError, match="expects numbers"):
        j.run(np.array([["a"] * 3] * 2), a)
    with pytest.raises(TypeError, match="3 positional inputs"):
        j.run(x, a, a)
    with pytest.raises(Exception, match="missing input"):
        j.run(x)
    with pytest.raises(TypeError, match="given twice"):
        j.run(x, a, x=x)
    # the returned arrays are fresh every call
    r1 = j.run(x, a)[0]
    r2 = j.run(x, np.float32(1))[0]
    np.testing.assert_array_equal(r1, want)
    np.testing.assert_array_equal(r2, x)


def test_int_input_range_still_checked_on_the_shortcut():
    j = Func("cp_take", lambda s: s.input("x", (4,))[s.input("i", (2,), "i32")]).jit()
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(j.run(x, np.array([3, 0], np.int32))[0], [3, 0])
    with pytest.raises(IndexError):
        j.run(x, np.array([4, 0], np.int32))
    with pytest.raises(ValueError, match="do not fit in i32"):
        j.run(x, np.array([2 ** 40, 0], np.int64))
    with pytest.raises(TypeError, match="expects integers"):
        j.run(x, np.array([1.0, 0.0], np.float32))

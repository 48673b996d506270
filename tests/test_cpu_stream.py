"""Large output maps written with non-temporal vector stores (schedule.streamable).

The streaming loop peels scalar iterations up to a 64-byte boundary, stores
aligned vectors, then finishes with scalars; these tests cover rows that start
at every alignment, a row length that is not a multiple of the vector width,
invariant (splatted) operands, a parallel 1-D map and the runtime's reuse of
large output buffers."""
import numpy as np

from rlxc import Func
from rlxc.lowering.cpu.driver import emit_loops

RNG = np.random.default_rng(7)


def test_outer_product_rows_at_every_alignment():
    # 16 x 1031 x 1037 floats = 68 MB; rows of 1037 floats start at every 4-byte offset mod 64
    b, m, n = 16, 1031, 1037

    def build(s):
        x, y = s.input("x", (b, m, 1)), s.input("y", (b, 1, n))
        return (x @ y) * 2.0 + s.input("c", ())
    f = Func("outer", build)
    assert "streaming stores" in emit_loops(f.module)
    x = RNG.standard_normal((b, m, 1)).astype(np.float32)
    y = RNG.standard_normal((b, 1, n)).astype(np.float32)
    c = np.float32(0.25)
    want = (x * y) * np.float32(2.0) + c
    j = f.jit()
    for _ in range(3):  # the second and third calls may reuse the released output buffer
        got = j.run(x=x, y=y, c=c)[0]
        np.testing.assert_array_equal(got, want)
        del got


def test_parallel_flat_map_streams():
    n = (1 << 22) + 5  # 16 MB + 20 bytes: a flat, parallel loop with a scalar tail

    def build(s):
        x = s.input("x", (n,))
        return x.tanh() * x + 1.0
    f = Func("flat", build)
    text = emit_loops(f.module)
    assert "parallel for" in text and "streaming stores" in text
    x = RNG.standard_normal(n).astype(np.float32)
    j = f.jit()
    want = f.run_on("interp", x=x)[0]
    for t in (1, 2):
        j.set_num_threads(t)
        np.testing.assert_allclose(j.run(x=x)[0], want, rtol=3e-6, atol=1e-7)


def test_reused_output_is_never_one_the_caller_still_holds():
    n = 1 << 20  # 4 MB output: above the runtime's reuse threshold
    j = Func("keep", lambda s: s.input("x", (n,)) + 1.0).jit()
    x = np.zeros(n, np.float32)
    a = j.run(x=x)[0]
    view = a[10:20]          # a view keeps the buffer alive even after `a` is dropped
    del a
    b = j.run(x=x + 1)[0]
    np.testing.assert_array_equal(view, 1.0)
    np.testing.assert_array_equal(b, 2.0)
    c = j.run(x=x + 2)[0]    # `b` is still held: a third buffer
    np.testing.assert_array_equal(b, 2.0)
    np.testing.assert_array_equal(c, 3.0)
    del b
    d = j.run(x=x + 3)[0]    # `b` was released: its memory may be written again
    np.testing.assert_array_equal(c, 3.0)
    np.testing.assert_array_equal(d, 4.0)
    keep = d[:5]             # the array and a view of it both held
    e = j.run(x=x + 4)[0]
    f = j.run(x=x + 5)[0]
    np.testing.assert_array_equal(d, 4.0)
    np.testing.assert_array_equal(keep, 4.0)
    np.testing.assert_array_equal(e, 5.0)
    np.testing.assert_array_equal(f, 6.0)
    mv = memoryview(f)       # a buffer export keeps it too
    del f
    g = j.run(x=x + 6)[0]
    np.testing.assert_array_equal(np.asarray(mv), 6.0)
    np.testing.assert_array_equal(g, 7.0)


def test_large_outputs_are_reused_once_released():
    n = 1 << 20
    j = Func("reuse", lambda s: s.input("x", (n,)) * 3.0).jit()
    x = np.ones(n, np.float32)
    addr = j.run(x=x)[0].__array_interface__["data"][0]
    assert addr % 64 == 0
    assert j.run(x=x)[0].__array_interface__["data"][0] == addr  # released, so reused


def test_reuse_never_overwrites_an_array_a_weakref_can_still_reach():
    """A WeakValueDictionary memo of an output (issue 13 item 20): the runtime keeps only
    the raw buffer, so when the caller drops the array it dies (its weak references are
    cleared) before its memory is written again; a weak reference to the buffer itself
    stops reuse."""
    import weakref

    n = 1 << 20
    j = Func("memo", lambda s: s.input("x", (n,)) + 1.0).jit()
    x = np.zeros(n, np.float32)
    memo = weakref.WeakValueDictionary()
    memo["a"] = j.run(x=x)[0]
    b = j.run(x=x + 1)[0]                # `a` was dropped: it is gone, memo["a"] with it
    assert "a" not in memo or np.all(memo["a"] == 1.0)
    assert "a" not in memo
    np.testing.assert_array_equal(b, 2.0)
    r = weakref.ref(b)
    addr = b.__array_interface__["data"][0]
    del b
    assert r() is None                   # nothing but the caller held it
    c = j.run(x=x + 2)[0]
    assert c.__array_interface__["data"][0] == addr  # so its memory is reused
    wbase = weakref.ref(c.base)          # a weak reference to the buffer itself:
    del c
    d = j.run(x=x + 3)[0]                # not reused, but released (the weakref dies)
    assert wbase() is None and d.__array_interface__["data"][0] != addr
    np.testing.assert_array_equal(d, 4.0)

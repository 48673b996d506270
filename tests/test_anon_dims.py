"""Anonymous dynamic dims (`None` in an input's shape) have a name a user can read.

`s.input("x", (None, 3))` makes the symbol "?x.0" (input x, axis 0), shown as x.0
(runtime/dims.label) in Python's errors, the artifact's header (NAME_DIM_NAMES, the
signature comment), NAME_set_dims's errors and `--sizes x.0=N` / `specialize`.  A
named symbol may not take such a label.  A tensor carrying one works with Python
scalars, reshape and broadcast_to (they used to refuse the "?" name).
"""
from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest

import rlxc
from rlxc import export as aot
from rlxc.lowering.artifact.header import emit_header
from rlxc.runtime.dims import describe, label, pretty
from rlxc.runtime.errors import ShapeError

CPU = "x86-64-v3"


def _f():
    def build(s):
        x = s.input("x", (None, 3))
        t = s.input("t", ("T", None))
        h = (x @ s.param("w", (3, 2))).tanh() * 2.0 + 1.0
        return h.reshape(-1, 2), t.sum(0)
    return rlxc.Func("anon", build).init_randn(seed=0, stddev=0.5)


def _lib():
    """The AOT model: sizes that stay linear (a library for every size)."""
    def build(s):
        x = s.input("x", (None, 3))
        return (x @ s.param("w", (3, 2))).tanh() * 2.0, s.input("t", ("T", 2)) + 1.0
    return rlxc.Func("anon", build).init_randn(seed=0, stddev=0.5)


def test_symbol_is_named_after_input_and_axis():
    f = _f()
    assert f.input_shape_of("x") == ("?x.0", 3)
    assert f.input_shape_of("t") == ("T", "?t.1")
    assert f.output_shapes() == [("?x.0", 2), ("?t.1",)]
    assert label("?x.0") == "x.0" and label("B") == "B" and label(3) == 3
    assert label("?") == "?"     # an unnamed `?` dim read from outside MLIR text
    assert pretty(("?x.0", 3)) == "(x.0, 3)"
    assert describe("?x.0") == "anonymous dimension 'x.0' (None at axis 0 of input 'x')"


def test_scalars_reshape_and_broadcast_on_an_anonymous_dim():
    f = _f()
    x = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    t = np.ones((2, 4), np.float32)
    h, s = f.run(x=x, t=t)
    w = f.params()["w"].astype(np.float64)
    np.testing.assert_allclose(h, np.tanh(x @ w) * 2 + 1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(s, t.sum(0))

    def bc(s):
        x = s.input("x", (None, 3))
        return x + s.input("v", (3,)).broadcast_to(x.shape)
    g = rlxc.Func("bc", bc)
    (out,) = g.run(x=np.ones((4, 3), np.float32), v=np.arange(3, dtype=np.float32))
    np.testing.assert_allclose(out, 1 + np.arange(3.0)[None].repeat(4, 0))


def test_python_errors_name_the_label():
    f = _f()
    t = np.ones((2, 4), np.float32)
    with pytest.raises(ShapeError, match=r"input 'x' expects shape \(x\.0, 3\), got \(2, 4\)"):
        f.run(x=np.ones((2, 4), np.float32), t=t)
    with pytest.raises(ValueError, match=r"anonymous dimension 'x\.0' \(None at axis 0 of "
                                         r"input 'x'\) is 0 from input 'x'"):
        f.run(x=np.ones((0, 3), np.float32), t=t)
    with pytest.raises(ShapeError, match=r"shapes \(a\.0,\) and \(b\.0,\) do not broadcast: "
                                         r"anonymous dimension 'a\.0'"):
        rlxc.Func("n2", lambda s: s.input("a", (None,)) + s.input("b", (None,)))
    with pytest.raises(ValueError, match="symbol 'a.0' is also the name of anonymous "
                                         "dimension 'a.0'"):
        rlxc.Func("n3", lambda s: s.input("a", (None,)) + s.input("b", ("a.0",)))
    with pytest.raises(ValueError, match="not a name"):   # "?" stays reserved
        rlxc.Func("n4", lambda s: s.input("a", ("?q", 3)))
    with pytest.raises(ValueError, match=r"give a size for \['T', 't\.1', 'x\.0'\]"):
        f.specialize()
    g = f.specialize(**{"x.0": 4, "T": 2, "t.1": 3})
    assert g.input_shape_of("x") == (4, 3) and g.input_shape_of("t") == (2, 3)


def test_header_names_the_dims():
    spec = aot.spec_from_func(_f(), "anon", cpu=CPU)
    assert spec.dims == ["?x.0", "T", "?t.1"]
    h = emit_header(spec)
    assert 'ANON_DIM_NAMES[ANON_NUM_DIMS] = {"x.0", "T", "t.1"};' in h
    assert re.search(r"input\s+0\s+x\s+f32 \[x\.0, 3\]", h)


def test_set_dims_error_and_dim_name_in_the_library(tmp_path):
    spec = aot.spec_from_func(_lib(), "anon", cpu=CPU)
    aot.build_artifact(spec, str(tmp_path))
    lib = ctypes.CDLL(str(tmp_path / "libanon.so"))
    lib.anon_create.restype = ctypes.c_void_p
    lib.anon_last_error.restype = ctypes.c_char_p
    lib.anon_last_error.argtypes = [ctypes.c_void_p]
    lib.anon_dim_name.restype = ctypes.c_char_p
    lib.anon_set_dims.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64)]
    lib.anon_destroy.argtypes = [ctypes.c_void_p]
    assert [lib.anon_dim_name(i) for i in range(2)] == [b"x.0", b"T"]
    ctx = lib.anon_create()
    try:
        assert lib.anon_set_dims(ctx, (ctypes.c_int64 * 2)(0, 2)) != 0
        assert b"dimension 'x.0' (sizes[0]) is 0" in lib.anon_last_error(ctx)
        assert lib.anon_set_dims(ctx, (ctypes.c_int64 * 2)(5, 2)) == 0
    finally:
        lib.anon_destroy(ctx)
    from rlxc.runtime import load

    m = load(tmp_path, new=True)
    with pytest.raises(ValueError, match=r"anonymous dimension 'x\.0'.* is 0 from input 'x'"):
        m.run(x=np.ones((0, 3), np.float32), t=np.ones((2, 2), np.float32))


def test_cli_sizes_take_the_label(tmp_path):
    from click.testing import CliRunner

    from rlxc.cli.main import main

    src = tmp_path / "m.py"
    src.write_text("import rlxc\n\ndef model():\n    return rlxc.Func('m', lambda s: "
                   "s.input('x', (None, 3)).tanh())\n")
    r = CliRunner().invoke(main, ["compile", f"{src}:model", "-o", str(tmp_path / "out"),
                                  "--sizes", "y.0=2", "--emit", "rlx"])
    assert r.exit_code != 0 and "(its dimensions: ['x.0'])" in r.output
    r = CliRunner().invoke(main, ["compile", f"{src}:model", "-o", str(tmp_path / "out"),
                                  "--sizes", "x.0=2", "--emit", "rlx"])
    assert r.exit_code == 0, r.output
    assert "tensor<2x3xf32>" in r.output

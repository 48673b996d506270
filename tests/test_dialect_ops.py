"""Every op: trace, verify, print, parse, compare; interpreter against NumPy."""
import numpy as np
import pytest

import rlxc
from rlxc.dialect import module as M
from rlxc.dialect.interpreter import EVAL_RULES, interpret
from rlxc.dialect.ops import OPS

from opcases import CASES, make_func


@pytest.mark.parametrize("name", sorted(CASES))
def test_roundtrip_and_interpret(name):
    f, oracle, inputs, names = make_func(name)
    text = f.mlir()
    g = rlxc.Func.from_mlir(text)
    assert g.mlir() == text
    M.get_func(g.module).verify()
    got = f.run_on("interp", **inputs)[0]
    want = oracle(*[inputs[n].astype(np.float64) for n in names])
    assert got.shape == np.shape(want)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    again = g.run_on("interp", **inputs)[0]
    np.testing.assert_array_equal(got, again)


def test_every_op_has_a_case_and_a_rule():
    traced = set()
    for name in CASES:
        f, *_ = make_func(name)
        traced |= {op.name for op in M.get_func(f.module).body.block.ops}
    missing = set(OPS) - traced
    assert not missing, f"ops without a test case: {sorted(missing)}"
    assert set(OPS) - {"rlx.constant", "rlx.cast"} <= set(EVAL_RULES)


def test_op_docstrings_have_summary_and_example():
    for name, cls in OPS.items():
        doc = cls.__doc__ or ""
        assert "Example" in doc and f"{name} " in doc, name


def test_verifier_rejects_wrong_result_type():
    text = """builtin.module {
  func.func @f(%x: tensor<4x3xf32> {rlx.kind = "input", rlx.name = "x"}) -> tensor<4xf32> {
    %0 = rlx.sum %x axes = [0] : tensor<4x3xf32> -> tensor<4xf32>
    func.return %0 : tensor<4xf32>
  }
}"""
    with pytest.raises(Exception, match="result type should be tensor<3xf32>"):
        M.parse(text)


def test_float64_mode():
    f = rlxc.Func("f", lambda s: (s.input("x", (3,)) * 3).sum())
    x = np.array([0.1, 0.2, 0.3])
    (r,) = interpret(f.module, [x], float_dtype=np.float64)
    assert r.dtype == np.float64 and r == pytest.approx(1.8, abs=1e-15)


def test_nan_propagates():
    f = rlxc.Func("f", lambda s: s.input("x", (4,)).relu().tanh().sigmoid().exp())
    (r,) = f.run_on("interp", x=np.array([np.nan, 1, -1, np.inf], np.float32))
    assert np.isnan(r[0]) and np.all(np.isfinite(r[1:]))
    m = rlxc.Func("m", lambda s: s.input("x", (3,)).max())
    assert np.isnan(m.run_on("interp", x=np.array([1, np.nan, 2], np.float32))[0])


def test_full_reduction_is_rank0():
    f = rlxc.Func("f", lambda s: s.input("x", (2, 3)).sum())
    (r,) = f.run_on("interp", x=np.ones((2, 3)))
    assert r.shape == () and r == 6


def test_nonfinite_and_large_constants_round_trip_exactly():
    def build(s):
        x = s.input("x", (2,))
        y = x.maximum(s.constant(np.array([-np.inf, np.nan], np.float32)))
        return y + s.constant(np.full((2,), np.inf)) + s.constant(
            np.arange(600.0).reshape(300, 2)).sum(0)

    f = rlxc.Func("f", build)
    assert 'dense<"0x000080FF0000C07F">' in f.mlir()
    g = rlxc.Func.from_mlir(f.mlir())
    assert g.mlir() == f.mlir()
    a, b = f.run_on("interp", x=[1, 2])[0], g.run_on("interp", x=[1, 2])[0]
    np.testing.assert_array_equal(a, b)
    assert np.isposinf(a[0]) and np.isnan(a[1])


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_float_constants_survive_the_text_exactly(dtype):
    """xDSL prints a float whose 6-digit form does not round-trip and whose %.9g/%.17g has
    no point (1048576.0, 2**24) as an unquoted hex integer, which it parses back as that
    integer's value: such constants print in the quoted hex form (types.hex_form), in the
    custom and in the generic text."""
    vals = [1048576.0, 2097152.0, 16777216.0, 0.1, 1e16, 1.2345678, -3.0, 2.0 ** 60]
    f = rlxc.Func("consts", lambda s: (lambda x: [x * v for v in vals])(s.input("x", (2,), dtype)))
    x = np.ones(2, {"f32": np.float32, "f64": np.float64}[dtype])
    want = f.run_on("interp", x=x)
    for text in (f.mlir(), M.to_generic_text(f.module)):
        got = rlxc.Func.from_mlir(text).run_on("interp", x=x)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)

"""Property: random small graphs survive print -> parse and interpret identically."""
import numpy as np
from hypothesis import given, settings, strategies as st

import rlxc

from randgraph import build_func, inputs, steps


@settings(max_examples=60, deadline=None)
@given(recipe=steps, seed=st.integers(0, 2 ** 16))
def test_print_parse_interpret(recipe, seed):
    f = build_func(recipe)
    text = f.mlir()
    g = rlxc.Func.from_mlir(text)
    assert g.mlir() == text
    args = inputs(seed)
    for a, b in zip(f.run_on("interp", **args), g.run_on("interp", **args)):
        np.testing.assert_array_equal(a, b)
        assert np.all(np.isfinite(a))

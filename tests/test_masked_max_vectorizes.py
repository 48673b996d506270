"""A masked max `where(m, x, -inf).max(axis)` (every masked softmax) must compile to
vector max instructions: without the freeze in codegen.Body.acc_value, LLVM folded
maximum(acc, select(m, x, -inf)) into a conditional update and left a scalar loop."""
from __future__ import annotations

import math

import numpy as np
import pytest

import rlxc
from rlxc.lowering.cpu.driver import emit_asm


def _masked(fill, red, n=256):
    return rlxc.Func(f"mm_{red}", lambda s: getattr(rlxc.where(
        s.input("m", (n, n), "i1"), s.input("x", (n, n)), fill), red)(1))


@pytest.mark.parametrize("cpu", ["native", "x86-64-v3"])
@pytest.mark.parametrize("red,fill", [("max", -math.inf), ("min", math.inf)])
def test_masked_max_is_vector_code(cpu, red, fill):
    asm = emit_asm(_masked(fill, red).module, cpu=cpu)
    assert asm.count(f"v{red}ps") >= 4, f"no vector {red} in the masked reduction"


def test_masked_max_values_with_empty_rows_and_nan():
    n = 256
    r = np.random.default_rng(0)
    x = r.normal(size=(n, n)).astype(np.float32)
    m = r.uniform(size=(n, n)) < 0.3
    m[5] = False                       # an empty row: -inf
    x[7, 3], m[7, 3] = np.nan, True    # NaN propagates (as np.max)
    x[8, 4], m[8, 4] = np.nan, False   # masked NaN does not
    f = _masked(-math.inf, "max")
    (got,) = f.run_on("cpu", m=m, x=x)
    np.testing.assert_array_equal(got, np.where(m, x, -np.inf).max(1))
    assert got[5] == -np.inf and np.isnan(got[7]) and not np.isnan(got[8])

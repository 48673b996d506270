"""Matrix-vector products sharing their matrix run as one pass over it
(lowering/cpu/matvec.py merge_sibling_matvecs)."""

from __future__ import annotations

import numpy as np

from rlxc import Func
from rlxc.dialect.module import get_func
from rlxc.lowering.cpu.matvec import merge_sibling_matvecs

N = 64


def _matmuls(module) -> int:
    return sum(op.name == "rlx.matmul" for op in get_func(module).body.block.ops)


def _merged(module) -> int:
    """The merged passes: sums over a [rows, vectors, cols] product."""
    from rlxc.dialect.types import shape_of

    return sum(op.name == "rlx.sum" and len(shape_of(op.operands[0].type)) == 3
               for op in get_func(module).body.block.ops)


def _hvp(W):
    return Func("hvp_sib", lambda s: (s.param("W", (N, N)) @ s.input("x", (N,))).tanh().sum()) \
        .with_param("W", W).hvp(["x"])


def test_hvp_reads_its_matrix_twice_not_four_times():
    """An HVP of sum(tanh(W@x)): W@x and W@v share W and are independent, so are the two
    W.T@... of the gradient and of Hv: 4 matvecs become 2 merged ones."""
    rng = np.random.default_rng(0)
    W = (rng.standard_normal((N, N)) / 8).astype(np.float32)
    h = _hvp(W)
    m = h.module.clone()
    assert _matmuls(m) == 4
    assert merge_sibling_matvecs(get_func(m).body.block) == 2
    assert _matmuls(m) == 0 and _merged(m) == 2
    x, v = rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)
    got, want = h.run(x=x, tangent_x=v), h.run_on("interp", x=x, tangent_x=v)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)


def test_dependent_products_are_not_merged():
    """W @ tanh(W @ x): the second vector needs the first product; W @ x and W @ y merge."""
    def build(s):
        W = s.param("W", (N, N))
        x, y = s.input("x", (N,)), s.input("y", (N,))
        return (W @ (W @ x).tanh()).sum() + (W @ y).sum()
    rng = np.random.default_rng(1)
    W = (rng.standard_normal((N, N)) / 8).astype(np.float32)
    f = Func("chain_sib", build).with_param("W", W)
    m = f.module.clone()
    assert merge_sibling_matvecs(get_func(m).body.block) == 1
    assert _matmuls(m) == 1 and _merged(m) == 1
    x, y = rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)
    np.testing.assert_allclose(f.run(x=x, y=y)[0], f.run_on("interp", x=x, y=y)[0], rtol=1e-4)

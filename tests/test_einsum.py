"""rlxc.einsum: decomposed at trace time (rlxc/einsum_op.py) into transpose/reshape/slice/
sum/matmul; checked against np.einsum on the interpreter and the CPU backend, its
gradient against finite differences of the interpreter, and its errors."""
from __future__ import annotations

import numpy as np
import pytest

import rlxc
from rlxc.dialect.module import get_func

SPECS = [
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),
    ("bhqk,bhkd->bhqd", [(2, 3, 4, 6), (2, 3, 6, 5)]),
    ("ii->", [(4, 4)]),                 # trace
    ("ii->i", [(4, 4)]),                # diagonal
    ("bii->bi", [(2, 3, 3)]),
    ("iij->j", [(3, 3, 4)]),
    ("iii->i", [(3, 3, 3)]),
    ("ij->ji", [(3, 4)]),
    ("ij->", [(3, 4)]),
    ("i,i->", [(5,), (5,)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("ij,ij->ij", [(3, 4), (3, 4)]),
    ("ijk,ikl->jl", [(2, 3, 4), (2, 4, 5)]),
    ("ij,jk", [(2, 3), (3, 4)]),        # implicit output
    ("bn,bnm->bm", [(2, 3), (2, 3, 4)]),
    ("ij,jk->ki", [(2, 3), (3, 4)]),
]


def _func(spec, shapes):
    return rlxc.Func("ein", lambda s: rlxc.einsum(spec, *[s.input(f"x{i}", sh)
                                                         for i, sh in enumerate(shapes)]))


def test_every_spec_against_numpy_on_interp_and_cpu():
    rng = np.random.default_rng(0)
    arrays = [[rng.normal(size=sh).astype(np.float32) for sh in shapes] for _, shapes in SPECS]

    def build(s):
        return [rlxc.einsum(spec, *[s.input(f"s{j}_{i}", sh) for i, sh in enumerate(shapes)])
                for j, (spec, shapes) in enumerate(SPECS)]
    f = rlxc.Func("einsums", build)
    kw = {f"s{j}_{i}": a for j, xs in enumerate(arrays) for i, a in enumerate(xs)}
    for backend in ("interp", "cpu"):
        for (spec, _), xs, got in zip(SPECS, arrays, f.run_on(backend, **kw)):
            want = np.einsum(spec, *[x.astype(np.float64) for x in xs])
            assert got.shape == want.shape, (backend, spec)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"{backend} {spec}")


def test_matmul_specs_are_one_matmul():
    for spec, shapes in SPECS[:3]:
        ops = [op.name for op in get_func(_func(spec, shapes).module).body.block.ops]
        assert ops.count("rlx.matmul") == 1 and "rlx.sum" not in ops, (spec, ops)


@pytest.mark.parametrize("spec,shapes", [SPECS[1], SPECS[4], SPECS[12], SPECS[14]])
def test_grad_against_finite_differences(spec, shapes):
    from rlxc.dialect.interpreter import interpret

    rng = np.random.default_rng(1)
    xs = [rng.normal(size=sh) for sh in shapes]
    w = rng.normal(size=np.einsum(spec, *xs).shape)
    f = rlxc.Func("eg", lambda s: (rlxc.einsum(spec, *[s.input(f"x{i}", sh) for i, sh in
                                                       enumerate(shapes)]) * w).sum())
    names = [f"x{i}" for i in range(len(shapes))]
    grads = interpret(f.grad(names).module, xs, float_dtype=np.float64)
    for i, g in enumerate(grads):
        fd = np.zeros_like(xs[i])
        for idx in np.ndindex(*xs[i].shape):
            p = [x.copy() for x in xs]
            m = [x.copy() for x in xs]
            p[i][idx] += 1e-6
            m[i][idx] -= 1e-6
            fd[idx] = (interpret(f.module, p, float_dtype=np.float64)[0]
                       - interpret(f.module, m, float_dtype=np.float64)[0]) / 2e-6
        np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("spec,shapes,exc,match", [
    ("ij,jk->ik", [(2, 3), (4, 5)], rlxc.ShapeError, "letter 'j' is 3"),
    ("ij->ik", [(2, 3)], ValueError, "in no operand"),
    ("ij,jk->ik", [(2, 3)], ValueError, "2 operand specs for 1"),
    ("ijk->i", [(2, 3)], rlxc.ShapeError, "spec 'ijk' names 3"),
    ("...ij->ij", [(2, 3)], ValueError, "not supported"),
    ("i1->i", [(2, 3)], ValueError, "is not a letter"),
])
def test_errors_name_the_problem(spec, shapes, exc, match):
    with pytest.raises(exc, match=match):
        _func(spec, shapes)

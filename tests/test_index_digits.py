"""Index simplification (lowering/cpu/indexing.py): floordiv / mod of a mixed-radix
"digit" sum.  (row*W + col) // (2*W) with col < W is row // 2, and its % (2*W) is
(row % 2)*W + col: the max-pool backward's window index has no division by 2W per
element.  Checked by enumeration against Python's // and % over every point."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from rlxc.lowering.cpu import indexing as ix


def _eval(a, env):
    a = ix.of(a)
    v = a.const
    for atom, k in a.terms:
        v += k * _atom(atom, env)
    return v


def _atom(atom, env):
    if isinstance(atom, ix.Var):
        return env[atom]
    if isinstance(atom, ix.FloorDiv):
        return _eval(atom.x, env) // atom.c
    if isinstance(atom, ix.Mod):
        return _eval(atom.x, env) % atom.c
    raise TypeError(atom)


def _check(x, c, vars_):
    q, r = ix.floordiv(x, c), ix.mod(x, c)
    for vals in itertools.product(*(range(v.extent) for v in vars_)):
        env = dict(zip(vars_, vals))
        n = _eval(x, env)
        assert _eval(q, env) == n // c, (str(x), c, vals, str(q))
        assert _eval(r, env) == n % c, (str(x), c, vals, str(r))
    return q, r


def test_pool_window_row():
    i2, i3 = ix.Var("i2", 28), ix.Var("i3", 28)
    x = ix.add(ix.scale(ix.var(i2), 28), ix.var(i3))
    q, r = _check(x, 56, [i2, i3])
    assert str(q) == "(i2 // 2)" and "i3" not in str(q)
    assert "//" not in str(r) and "56" not in str(r)


def test_not_a_digit_keeps_the_division():
    i, j = ix.Var("i", 7), ix.Var("j", 30)   # j reaches past the digit (30 > 28)
    x = ix.add(ix.scale(ix.var(i), 28), ix.var(j))
    q, _ = _check(x, 56, [i, j])
    assert "56" in str(q)


@pytest.mark.parametrize("seed", range(30))
def test_random_digit_sums(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 4))
    vars_ = [ix.Var(f"v{d}", int(rng.integers(1, 7))) for d in range(n)]
    coefs = [int(rng.choice([1, 2, 3, 4, 6, 8, 12, 28])) for _ in vars_]
    x = ix.add(ix.const(int(rng.integers(0, 9))),
               *(ix.scale(ix.var(v), k) for v, k in zip(vars_, coefs)))
    for c in (2, 4, 6, 8, 12, 24, 56):
        _check(x, c, vars_)

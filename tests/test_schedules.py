"""LrSchedule: RLX parity values, formulas, validation, repr."""
import math
import pickle

import pytest

from rlxc.schedules import LrSchedule


def test_rlx_parity_values():
    s = LrSchedule.step(1, 10, 0.5)
    assert [s.lr_at(i) for i in (0, 9, 10, 20)] == [1, 1, 0.5, 0.25]
    c = LrSchedule.cosine(1, 0, 100)
    assert [c.lr_at(i) for i in (0, 50, 100, 200)] == pytest.approx([1, 0.5, 0, 0], abs=1e-12)
    w = LrSchedule.warmup(0.4, 4)
    assert [w.lr_at(i) for i in (0, 3, 99)] == pytest.approx([0.1, 0.4, 0.4], abs=1e-12)


def test_constant():
    s = LrSchedule.constant(0.3)
    assert s.lr_at(0) == s.lr_at(10 ** 9) == 0.3


def test_cosine_formula_and_degenerate_total():
    c = LrSchedule.cosine(0.5, 0.1, 40)
    for step in (0, 7, 13, 40, 41):
        want = 0.1 + 0.4 * 0.5 * (1 + math.cos(math.pi * min(step, 40) / 40))
        assert c.lr_at(step) == pytest.approx(want, rel=1e-15)
    assert LrSchedule.cosine(1.0, 0.2, 0).lr_at(0) == 0.2


def test_warmup_cosine():
    s = LrSchedule.warmup_cosine(1.0, 0.1, 4, 14)
    assert [s.lr_at(i) for i in range(4)] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    cos = LrSchedule.cosine(1.0, 0.1, 10)
    for step in range(4, 20):
        assert s.lr_at(step) == cos.lr_at(step - 4)
    assert s.lr_at(14) == pytest.approx(0.1)
    assert LrSchedule.warmup_cosine(1.0, 0.1, 3, 3).lr_at(3) == 0.1
    assert LrSchedule.warmup(0.7, 0).lr_at(0) == 0.7


def test_callable_eq_hash_pickle_immutable():
    s = LrSchedule.step(0.1, 3, 0.5)
    assert s(3) == s.lr_at(3) == 0.05
    assert s == LrSchedule.step(0.1, 3, 0.5) and hash(s) == hash(LrSchedule.step(0.1, 3, 0.5))
    assert s != LrSchedule.step(0.1, 3, 0.25)
    assert pickle.loads(pickle.dumps(s)) == s
    assert s.kind == "step" and dict(s.params) == {"base": 0.1, "step_size": 3, "gamma": 0.5}
    with pytest.raises(AttributeError):
        s.kind = "cosine"
    with pytest.raises(TypeError):
        s.params["base"] = 1.0


def test_repr():
    assert repr(LrSchedule.cosine(1, 0, 100)) == \
        "LrSchedule.cosine(base=1.0, min=0.0, total=100)"
    assert repr(LrSchedule.warmup_cosine(0.1, 0.01, 5, 50)) == \
        "LrSchedule.warmup_cosine(base=0.1, min=0.01, warmup=5, total=50)"


@pytest.mark.parametrize("make, exc, match", [
    (lambda: LrSchedule.step(1, 0, 0.5), ValueError, "step_size must be >= 1"),
    (lambda: LrSchedule.step(1, 2.5, 0.5), TypeError, "step_size must be an integer"),
    (lambda: LrSchedule.step(1, 2, -0.5), ValueError, "gamma"),
    (lambda: LrSchedule.constant(-1), ValueError, "lr must be finite and >= 0"),
    (lambda: LrSchedule.constant(float("inf")), ValueError, "lr"),
    (lambda: LrSchedule.cosine(1, -0.1, 10), ValueError, "min"),
    (lambda: LrSchedule.cosine(1, 0, -1), ValueError, "total must be >= 0"),
    (lambda: LrSchedule.warmup(1, -2), ValueError, "warmup must be >= 0"),
    (lambda: LrSchedule.warmup_cosine(1, 0, 10, 5), ValueError, r"warmup \(10\) must be <= total \(5\)"),
    (lambda: LrSchedule.constant("0.1"), TypeError, "must be a number"),
])
def test_validation(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


def test_bad_step():
    s = LrSchedule.constant(0.1)
    with pytest.raises(ValueError, match="step must be >= 0"):
        s.lr_at(-1)
    with pytest.raises(TypeError, match="step must be an integer"):
        s.lr_at(1.5)

"""Trainer.step from several threads (issue 13 item 15): steps are serialized by the
Trainer's lock, so none is lost and the result equals a sequential run."""
import threading

import numpy as np
import pytest
from test_train import DEVICES

from rlxc import Func
from rlxc.optim import Adam

F32 = np.float32
N = 4096


def model():
    def build(s):
        d = s.param("w", (N,)) * s.input("x", (N,)) - 1.0
        return (d * d).mean()
    return Func("thr", build).with_param("w", np.linspace(-1, 1, N, dtype=F32))


@pytest.mark.parametrize("device", DEVICES)
def test_concurrent_steps_are_serialized(device):
    steps = 500 if device == "cpu" else 20
    x = {"x": np.linspace(0.5, 1.5, N, dtype=F32)}
    seq = model().trainer(Adam(0.01), device=device)
    for _ in range(2 * steps):
        seq.step(x)

    tr = model().trainer(Adam(0.01), device=device)
    go = threading.Barrier(2)
    errors = []

    def work():
        try:
            go.wait()
            for _ in range(steps):
                tr.step(x)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=work) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    assert tr.step_count == 2 * steps
    np.testing.assert_array_equal(tr.func.params()["w"], seq.func.params()["w"])
    st, ref = tr.state_dict(), seq.state_dict()
    for k in ref:
        np.testing.assert_array_equal(st[k], ref[k], err_msg=k)

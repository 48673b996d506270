"""A Trainer in a warm process finds its compiled step by alias: no step trace, no transform.

The first process compiles the step and records `ALIAS.alias -> entry key`;
the second one loads the library without building the step Func (the slow
part of a warm start: value_and_grad, cleanup, the step trace).  A stale or
broken alias falls back to building and compiling, and is rewritten."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import rlxc
    import rlxc.backends as B
    from rlxc.optim import SGD

    def build(s):
        x = s.input("x", (4, 3))
        h = x.linear(s.param("w", (3, 5)), s.param("b", (5,))).relu()
        return h.linear(s.param("v", (5, 2))).cross_entropy(s.input("y", (4,), "i32"))

    f = rlxc.Func("tc", build).init_randn(1, 0.3)
    tr = f.trainer(SGD(0.1))
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
    y = np.array([0, 1, 1, 0], np.int32)
    losses = [tr.step({"x": x, "y": y}) for _ in range(3)]
    w = tr.func.params()["w"].tolist()
    print(json.dumps({"losses": losses, "w": w, "built": tr._prog._func is not None,
                      "xdsl": "xdsl" in sys.modules, "llvmlite": "llvmlite" in sys.modules,
                      **B.STATS}))
""")


def _run(cache):
    env = {**os.environ, "RLXC_CACHE_DIR": str(cache)}
    p = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture
def cache(tmp_path):
    return tmp_path / "cache"


def test_warm_trainer_builds_no_step_graph(cache):
    """A warm process loads the step from disk without building its graph, and (the
    light trace, dialect/trace.py) without importing xDSL or llvmlite."""
    first = _run(cache)
    assert first["compiles"] == 1 and first["built"] and first["xdsl"]
    assert len(list(cache.glob("*.alias"))) == 1
    second = _run(cache)
    assert second["compiles"] == 0 and second["disk_hits"] == 1 and not second["built"]
    assert not second["xdsl"] and not second["llvmlite"]
    assert second["losses"] == first["losses"] and second["w"] == first["w"]


@pytest.mark.parametrize("damage", ["garbage", "missing_entry"])
def test_broken_alias_rebuilds(cache, damage):
    first = _run(cache)
    (alias,) = cache.glob("*.alias")
    if damage == "garbage":
        alias.write_text("not a key")
    else:
        for js in cache.glob("*.json"):
            js.unlink()
    second = _run(cache)
    assert second["built"] and second["losses"] == first["losses"]
    assert second["compiles"] == (1 if damage == "missing_entry" else 0)
    third = _run(cache)
    assert third["compiles"] == 0 and not third["built"]

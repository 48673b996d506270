"""lowering/cpu/pinning.py: a forking library binds libgomp's worker threads, not the caller."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import json, os, threading
    import numpy as np
    from rlxc import Func

    n = 1 << 21
    j = Func("pin", lambda s: (s.input("x", (n,)).tanh() * 2.0).sum()).jit()
    j.set_num_threads(2)
    x = np.ones(n, np.float32)
    for _ in range(8):
        j.run(x=x)
    main = threading.get_native_id()
    aff = {int(t): sorted(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")}
    print(json.dumps({"main": aff.pop(main), "others": list(aff.values()),
                      "all": sorted(os.sched_getaffinity(0))}))
""")


def _run(**env):
    e = {**os.environ, "RLXC_ADAPTIVE_THREADS": "0", **env}
    for k in ("OMP_PROC_BIND", "GOMP_CPU_AFFINITY"):
        if k not in env:
            e.pop(k, None)
    p = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=e)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_workers_are_bound_and_the_caller_is_not():
    r = _run()
    assert r["main"] == r["all"]
    assert [len(a) for a in r["others"]].count(1) >= 1  # the team's worker


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
@pytest.mark.parametrize("env", [{"RLXC_PIN_THREADS": "0"}, {"OMP_PROC_BIND": "false"}])
def test_pinning_can_be_switched_off(env):
    r = _run(**env)
    assert r["main"] == r["all"]
    assert all(a == r["all"] for a in r["others"])

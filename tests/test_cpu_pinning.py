"""lowering/pinning.py: a forking library binds libgomp's worker threads, not the caller."""
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


SCRIPT_THREADS = textwrap.dedent("""
    import json, os, threading
    import numpy as np
    from rlxc import Func

    n = 1 << 21
    j = Func("pin2", lambda s: (s.input("x", (n,)).tanh() * 2.0).sum()).jit()
    j.set_num_threads(2)
    x = np.ones(n, np.float32)
    go, done = threading.Barrier(3), threading.Event()
    turn = threading.Lock()
    callers = []

    def caller():  # each calling thread gets its own libgomp team (its own workers)
        with turn:  # one after the other: the second finds the first one's state set
            callers.append(threading.get_native_id())
            for _ in range(10):
                j.run(x=x)
        go.wait()
        done.wait()
    ts = [threading.Thread(target=caller) for _ in range(2)]
    for t in ts:
        t.start()
    go.wait()   # both finished calling; their teams' workers are still alive
    me = threading.get_native_id()
    aff = {int(t): sorted(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")}
    done.set()
    for t in ts:
        t.join()
    print(json.dumps({"callers": [aff[c] for c in callers],
                      "workers": [a for t, a in aff.items() if t not in callers and t != me],
                      "all": sorted(os.sched_getaffinity(0))}))
""")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_each_calling_thread_pins_its_own_team():
    """Pinning state is per calling thread (issue 13 item 8): two Python threads calling
    one library each own a libgomp team, and both teams' workers get bound.
    With one shared `pinned_for` global (written unsynchronized) the second team was
    never pinned."""
    e = {**os.environ, "RLXC_ADAPTIVE_THREADS": "0"}
    for k in ("OMP_PROC_BIND", "GOMP_CPU_AFFINITY", "RLXC_PIN_THREADS"):
        e.pop(k, None)
    p = subprocess.run([sys.executable, "-c", SCRIPT_THREADS], capture_output=True, text=True,
                       env=e, timeout=300)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert all(c == r["all"] for c in r["callers"])  # the callers stay free
    assert [len(a) for a in r["workers"]].count(1) >= 2, r


def test_pinning_state_is_thread_local():
    """The emitted state is a thread_local global (no data race between callers)."""
    import llvmlite.ir as ir

    from rlxc.lowering.pinning import emit_pin_team

    m = ir.Module("m")
    emit_pin_team(m, "f")
    text = str(m)
    assert '@"f.pinned_for" = internal thread_local' in text

"""runtime.cpu.ThreadGovernor: one thread or the team, whichever the call times favour."""
import sys
import time

import pytest

from rlxc.runtime.cpu import usable_cores

from rlxc.runtime.cpu import EXPLORE, TEAM_BURST, ThreadGovernor


def _drive(gov, cost, calls):
    """Run `calls` fake calls whose duration is cost[n] at thread count n."""
    used = []
    for _ in range(calls):
        n, _t0, cold = gov.begin()
        used.append(n)
        gov.end((n, time.perf_counter() - cost[n], cold))
    return used


def test_busy_machine_settles_on_one_thread():
    set_to = []
    gov = ThreadGovernor(set_to.append, 2)
    used = _drive(gov, {1: 1e-3, 2: 1e-2}, 600)
    tail = used[100:]
    assert tail.count(1) > 0.98 * len(tail)
    assert 2 in tail  # still re-tried now and then, to follow the load
    assert set_to[-1] in (1, 2) and set_to[0] == 2  # configure applies the maximum


def test_idle_machine_settles_on_the_team():
    gov = ThreadGovernor(lambda n: None, 2)
    used = _drive(gov, {1: 2e-3, 2: 1.1e-3}, 200)
    tail = used[50:]
    assert tail.count(2) >= len(tail) * (EXPLORE - 1) / EXPLORE - 1


def test_a_cold_team_call_is_not_held_against_the_team():
    """A team call right after a one-thread call pays the team's wake-up: not recorded."""
    gov = ThreadGovernor(lambda n: None, 2)
    used, prev = [], None
    for _ in range(300):
        n, _t0, cold = gov.begin()
        cost = 1e-3 if n == 1 else (5e-3 if prev == 1 else 0.5e-3)
        gov.end((n, time.perf_counter() - cost, cold))
        used.append(n)
        prev = n
    assert used[100:].count(2) > 0.9 * 200


def test_calls_after_a_pause_are_judged_cold():
    """A caller that pauses between bursts (the team's threads fall asleep: its first call
    costs 4x) is judged by its warm calls; one that pauses before every call by its cold
    ones (here the team still wins cold)."""
    from rlxc.runtime.cpu import IDLE_COLD

    def drive(pause_every, cold_team):
        gov = ThreadGovernor(lambda n: None, 2)
        used = []
        for i in range(150):
            if i % pause_every == 0:
                time.sleep(1.5 * IDLE_COLD)
            n, _t0, cold = gov.begin()
            cost = 1e-3 if n == 1 else (cold_team if cold else 0.5e-3)
            gov.end((n, time.perf_counter() - cost, cold))
            used.append(n)
        return used[50:]
    bursts = drive(5, 2e-3)
    assert bursts.count(2) > 0.85 * len(bursts)
    always = drive(1, 0.7e-3)
    assert always.count(2) > 0.85 * len(always)


def test_a_team_that_barely_wins_is_not_used():
    gov = ThreadGovernor(lambda n: None, 2)
    used = _drive(gov, {1: 1e-3, 2: 0.95e-3}, 200)
    assert used[50:].count(1) > 0.75 * 150  # the rest: bursts that re-try the team


def test_a_team_in_use_is_kept_while_it_still_wins():
    """Hysteresis: the team is taken up only when it wins by PREFER_TEAM, but once in use it
    stays while it wins at all (a team 8% faster is not dropped: on a noisy machine its
    median swings around any single bar, and every change back costs a cold team call);
    one that loses is dropped."""
    from rlxc.runtime.cpu import KEEP_TEAM, PREFER_TEAM

    assert PREFER_TEAM < 0.92 < KEEP_TEAM
    gov = ThreadGovernor(lambda n: None, 2)
    _drive(gov, {1: 1e-3, 2: 0.5e-3}, 100)
    used = _drive(gov, {1: 1e-3, 2: 0.92e-3}, 300)
    assert used[50:].count(2) > 0.9 * 250, "".join(map(str, used))
    used = _drive(gov, {1: 1e-3, 2: 1.1e-3}, 300)
    assert used[50:].count(1) > 0.75 * 250, "".join(map(str, used))
    # from one thread, the same 8% is not enough to take the team up (as at the start)
    used = _drive(gov, {1: 1e-3, 2: 0.92e-3}, 300)
    assert used[50:].count(1) > 0.75 * 250, "".join(map(str, used))


def test_follows_a_change_of_load():
    gov = ThreadGovernor(lambda n: None, 2)
    _drive(gov, {1: 1e-3, 2: 1e-2}, 300)
    used = _drive(gov, {1: 2e-3, 2: 1e-3}, 600)
    assert used[-100:].count(2) > 80


def test_disabled_or_single_thread_is_fixed(monkeypatch):
    monkeypatch.setenv("RLXC_ADAPTIVE_THREADS", "0")
    gov = ThreadGovernor(lambda n: None, 2)
    assert set(_drive(gov, {1: 1e-3, 2: 1e-2}, 50)) == {2}
    monkeypatch.delenv("RLXC_ADAPTIVE_THREADS")
    gov = ThreadGovernor(lambda n: None, 1)
    assert set(_drive(gov, {1: 1e-3}, 20)) == {1}


def test_tokens_from_many_threads_never_break_the_governor():
    """begin/end from 8 threads at once (what concurrent calls of one library do): the
    shared call-time windows are swapped whole, never mutated while another thread
    reads them, so no `deque mutated during iteration` (issue 13 item 14)."""
    import threading

    gov = ThreadGovernor(lambda n: None, 2)
    errors, stop = [], time.perf_counter() + 1.0

    def worker():
        try:
            while time.perf_counter() < stop:
                tok = gov.begin()
                gov.end(tok)
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    ts = [threading.Thread(target=worker) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors[:1]
    assert gov.calls > 1000


@pytest.mark.slow
def test_concurrent_calls_of_one_library_are_safe_and_exact():
    """8 threads call one compiled (forking, governed) function for 3 s: no exception,
    and every result is bit-identical to the single-threaded one."""
    import threading

    import numpy as np

    from rlxc import Func

    n = 1 << 16
    j = Func("gov_mt", lambda s: ((s.input("x", (n,)) * 1.5).tanh() * 2.0).sum()).jit()
    assert j.lib.governor.adaptive and not j.lib.governor._fixed or usable_cores() < 2
    xs = [np.random.default_rng(i).standard_normal(n).astype(np.float32) for i in range(8)]
    want = [j.run(x=x)[0].copy() for x in xs]
    errors, bad, calls = [], [], [0] * 8
    stop = time.perf_counter() + 3.0

    def worker(i):
        try:
            while time.perf_counter() < stop:
                got = j.run(x=xs[i])[0]
                if got.tobytes() != want[i].tobytes():
                    bad.append((i, got, want[i]))
                calls[i] += 1
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    ts = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often: races show up within seconds
    try:
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert not errors, errors[:1]
    assert not bad, bad[:1]
    assert min(calls) > 0


def test_size_classes_of_a_dynamic_library_are_governed_apart():
    """A caller alternating a cheap size (one thread wins) and a large one (the team wins):
    each size class has its own governor, so each settles on its own count; one governor
    fed both would take its medians over a mix of the two."""
    from rlxc.runtime.cpu import GovernorTable

    set_to = []
    table = GovernorTable(set_to.append, 2)
    small, large = table.for_sizes([1]), table.for_sizes([64])
    assert small is table.for_sizes([1]) and large is table.for_sizes([127])  # 64..127: one class
    assert small is not large
    costs = {small: {1: 1e-5, 2: 2e-4}, large: {1: 2e-3, 2: 1.1e-3}}
    used = {small: [], large: []}
    for i in range(800):
        g = small if i % 2 else large
        n, _t0, cold = g.begin()
        used[g].append(n)
        assert set_to[-1] == n   # the library runs with what this class chose
        g.end((n, time.perf_counter() - costs[g][n], cold))
    assert used[small][100:].count(1) > 0.9 * 300
    assert used[large][100:].count(2) > 0.9 * 300


def test_set_num_threads_reaches_every_size_class():
    """DynLibrary.set_num_threads reconfigures the governors call plans already hold."""
    import numpy as np

    from rlxc import Func

    f = Func("gov_dyn", lambda s: (s.input("x", ("B", 4096)).tanh() * 2.0).sum(-1))
    j = f.jit()
    lib = j._one.lib   # the one size-generic library (rlxc/dynone.py)
    for b in (1, 64, 1, 64):
        out = j.run(x=np.ones((b, 4096), np.float32))[0]
        np.testing.assert_allclose(out, np.full(b, 2 * 4096 * np.tanh(1.0)), rtol=1e-5)
    classes = list(lib.governor._by.values())
    assert len(classes) == 2
    j.set_num_threads(1)
    assert all(g._fixed and g.nmax == 1 for g in classes)
    j.run(x=np.ones((64, 4096), np.float32))
    assert lib.governor._cell[0] == 1


def test_slow_first_team_calls_do_not_lock_the_team_out():
    """The team's first calls pay one-time costs (a split's per-thread workspace pages, a
    stalled region): judged on a window that is not full yet, they used to keep the team
    off for EXPLORE * 16 calls.  Here the first 4 team calls cost 10x, later ones half a
    one-thread call: the team must be the choice within 60 calls."""
    gov = ThreadGovernor(lambda n: None, 2)
    team_calls, used = [0], []
    for _ in range(120):
        n, _t0, cold = gov.begin()
        if n == 2:
            team_calls[0] += 1
            cost = 1e-2 if team_calls[0] <= 4 else 0.5e-3
        else:
            cost = 1e-3
        gov.end((n, time.perf_counter() - cost, cold))
        used.append(n)
    assert used[60:].count(2) > 0.8 * 60, "".join(map(str, used))


@pytest.mark.parametrize("seed", [1, 7, 11])
def test_stalls_on_a_fifth_of_the_team_calls_do_not_keep_the_team_off(seed):
    """Other processes' bursts (another library's spinning threads, a compile) can stall
    a fifth of the team's calls 20x (seen in compare.py: 5-32 ms team calls among 1 ms
    ones).  Judged on a window of 5 with a long exclusion, a short unlucky stretch kept
    the team off for 256 calls: 68% of a 68-call workload ran on one thread at 1.25x the
    team's median (over 40 seeds of this test, the old rule gave the team a median 33%
    of the calls, this one 93%).  The team's median still wins, so it must be the
    choice for most calls."""
    import random

    rng = random.Random(seed)
    gov = ThreadGovernor(lambda n: None, 2)
    used = []
    for _ in range(400):
        n, _t0, cold = gov.begin()
        cost = 1.25e-3 if n == 1 else (2e-2 if rng.random() < 0.2 else 1e-3)
        gov.end((n, time.perf_counter() - cost, cold))
        used.append(n)
    assert used[40:].count(2) > 0.8 * 360, "".join(map(str, used))


def test_a_lost_re_try_doubles_the_wait_for_the_next():
    """On a busy machine the team is re-tried after EXPLORE calls, then 2x, 4x ... as long
    after each re-try it loses, so a first verdict is re-checked soon and a confirmed one
    rarely costs a slow team burst."""
    gov = ThreadGovernor(lambda n: None, 2)
    used = _drive(gov, {1: 1e-3, 2: 1e-2}, 1200)
    starts = [i for i in range(20, len(used)) if used[i] == 2 and used[i - 1] == 1]
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert starts[0] < 20 + 2 * EXPLORE, starts
    assert gaps[:3] == sorted(gaps[:3]) and gaps[2] >= 3 * gaps[0], gaps
    assert max(gaps) <= 16 * EXPLORE + TEAM_BURST, gaps


def test_a_clearly_winning_team_is_re_tried_on_evidence_only():
    """A team 2x faster than one thread is not re-tried against it every EXPLORE-64 calls
    (each re-try costs a whole one-thread call: 3 of W3's 20 compare.py samples), only
    every 16 * EXPLORE calls; when the load changes and the team's warm calls get as slow
    as one thread's median, the re-tries come back and the governor moves to one thread."""
    from rlxc.runtime.cpu import CLEAR_WIN

    assert CLEAR_WIN <= 2
    gov = ThreadGovernor(lambda n: None, 2)
    used = _drive(gov, {1: 2e-3, 2: 1e-3}, 600)
    assert used[40:].count(1) <= 600 // (16 * EXPLORE) + 1, "".join(map(str, used))
    used = _drive(gov, {1: 2e-3, 2: 2e-2}, 200)    # now the team collapses
    first = used.index(1)
    assert first < 2 * EXPLORE, "".join(map(str, used))
    assert used[first + 40:].count(1) > 0.9 * len(used[first + 40:]), "".join(map(str, used))


def test_a_steady_team_records_one_call_in_steady_sample_and_every_slow_one():
    """Once the team wins clearly and shows nothing wrong, an unremarkable call is not
    recorded (the bookkeeping ran 10-45 us after each W3 call, with the kernels' data in
    the caches); one as slow as one thread's median is, at once."""
    from rlxc.runtime.cpu import STEADY_SAMPLE

    gov = ThreadGovernor(lambda n: None, 2)
    _drive(gov, {1: 2e-3, 2: 1e-3}, 400)
    assert gov.alarm > 1.5e-3 and gov.best == 2
    records, last = 0, gov.hist[1][2]
    for _ in range(10 * STEADY_SAMPLE):
        _drive(gov, {1: 2e-3, 2: 1e-3}, 1)
        records += gov.hist[1][2] is not last
        last = gov.hist[1][2]
    assert 8 <= records <= 10 + 2, records   # (+ the re-try's cold team call, if one fell here)
    while True:
        n, _t0, cold = gov.begin()
        if n == 2 and gov.calls % STEADY_SAMPLE:
            break
        gov.end((n, time.perf_counter() - (1e-3 if n == 2 else 2e-3), cold))
    gov.end((2, time.perf_counter() - 2.5e-3, cold))
    assert gov.hist[1][2][-1][0] >= 2.5e-3


def test_a_team_slow_while_it_was_learned_takes_over_once_its_re_try_wins():
    """compare.py's W9 on Zen 4: the team's learning calls ran slow (4.8 ms against one
    thread's 4.3 ms: the machine was busier then), afterwards it took 2.6 ms.
    Those two slow entries out-voted the re-tries that won, and 52-75% of the 48 calls ran
    on one thread.  A narrow first verdict is re-checked after 2 * TEAM_BURST calls, and a
    re-try burst whose calls all win hands the team the lead with a fresh window.  The
    caller pauses before every other call (cold, as in compare.py's samples)."""
    gov = ThreadGovernor(lambda n: None, 2)
    used, team = [], 0
    for i in range(48):
        n, _t0, cold = gov.begin()
        cold = i >= 8 and i % 2 == 0
        team += n == 2
        cost = 4.3e-3 if n == 1 else (4.8e-3 if team <= 3 else 2.6e-3)
        gov.end((n, time.perf_counter() - cost - (0.3e-3 if cold else 0), cold))
        used.append(n)
    assert used.count(1) <= 0.2 * 48, "".join(map(str, used))
    assert used[24:].count(1) <= 1, "".join(map(str, used))

"""runtime.cpu.ThreadGovernor: one thread or the team, whichever the call times favour."""
import time

from rlxc.runtime.cpu import EXPLORE, ThreadGovernor


def _drive(gov, cost, calls):
    """Run `calls` fake calls whose duration is cost[n] at thread count n."""
    used = []
    for _ in range(calls):
        n, _t0 = gov.begin()
        used.append(n)
        gov.end((n, time.perf_counter() - cost[n]))
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
        n, _t0 = gov.begin()
        cost = 1e-3 if n == 1 else (5e-3 if prev == 1 else 0.5e-3)
        gov.end((n, time.perf_counter() - cost))
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
            n, _t0 = gov.begin()
            cost = 1e-3 if n == 1 else (cold_team if gov.cold else 0.5e-3)
            gov.end((n, time.perf_counter() - cost))
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

"""Note [calls first while kernels build] (runtime/machine/threads.py): while background builds are under
way a program's calls keep torch's own thread count and stop the compilers for their duration;
past ``HOLD_CALLS_S`` from the builds' start they run with the cores the compilers leave
instead (the bound), and every count is restored after each call. The builds and the clock are
fakes here (no compiler runs); tests/test_pause.py sees a real compiler stopped."""

from __future__ import annotations

import pytest
import torch

from runtime.backends.at_call import ChosenAtCall
from runtime.machine import pause, threads


class _Program:
    """What ``threads`` knows of a program: an ``entry`` (this one records, per call, torch's
    thread count and whether the compilers are held) and its launches chosen at the call."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, bool]] = []
        self._chosen: dict[int, ChosenAtCall] = {}
        self.entry = self._entry

    def _entry(self, x: torch.Tensor) -> list[torch.Tensor]:
        self.seen.append((torch.get_num_threads(), pause.holding()))
        return [x + 1]


@pytest.fixture
def fake_builds(monkeypatch):
    """A clock of our own for ``threads``, four cores, torch at four threads, the pause on, and no
    build under way before or after."""
    now = [100.0]
    monkeypatch.setattr(threads, "_clock", lambda: now[0])
    monkeypatch.setattr(threads, "cores", lambda: 4)
    monkeypatch.setenv("FUSEG_PAUSE_BUILDS", "1")
    monkeypatch.delenv("FUSEG_BUILD_THREADS", raising=False)
    monkeypatch.setitem(threads._CHOSEN, "policy", None)
    was = torch.get_num_threads()
    torch.set_num_threads(4)
    assert not threads.busy()
    yield now
    threads.builds_ended()
    pause.release_all()
    torch.set_num_threads(was)


def test_the_policy_comes_from_the_environment_unless_chosen(monkeypatch) -> None:
    monkeypatch.setitem(threads._CHOSEN, "policy", None)
    monkeypatch.delenv("FUSEG_BUILD_THREADS", raising=False)
    assert threads.policy() == "calls-first"
    monkeypatch.setenv("FUSEG_BUILD_THREADS", "1")
    assert threads.policy() == "cores" and threads.reserving()
    monkeypatch.setenv("FUSEG_BUILD_THREADS", "0")
    assert threads.policy() == "calls-first" and not threads.reserving()
    threads.use_policy("idle")
    assert threads.policy() == "idle"
    with pytest.raises(ValueError, match="unknown policy"):
        threads.use_policy("fast")
    threads.use_policy(None)
    assert threads.policy() == "calls-first"


def test_the_compilers_share_follows_the_cores_this_process_may_use(monkeypatch) -> None:
    """Cores are the process's affinity (a CPU set or ``taskset`` narrows them), not the machine's."""
    monkeypatch.setitem(threads._CHOSEN, "policy", None)
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 2, 5}, raising=False)
    assert threads.cores() == 3
    monkeypatch.setenv("FUSEG_BUILD_THREADS", "0")
    assert threads.background_jobs() == 3  # (they run only between calls: every core)
    monkeypatch.setenv("FUSEG_BUILD_THREADS", "1")
    assert threads.background_jobs() == 1  # (cores of their own: half, at least one)


def test_calls_beside_builds_keep_their_threads_and_stop_the_compilers(fake_builds) -> None:
    earlier = _Program()
    threads.register(earlier)  # (made before the builds)
    threads.builds_started()
    later = _Program()
    threads.register(later)  # (made while they run)
    x = torch.ones(3)
    for p in (earlier, later):
        torch.testing.assert_close(p.entry(x), [x + 1])
    torch.testing.assert_close(threads.beside_builds(later._entry, (x,)), [x + 1])  # (the checked path)
    assert earlier.seen == [(4, True)] and later.seen == [(4, True), (4, True)]
    assert not pause.holding() and torch.get_num_threads() == 4  # (between calls: the compilers run)
    threads.builds_ended()
    assert earlier.entry == earlier._entry and later.entry == later._entry  # unwrapped
    earlier.entry(x)
    assert earlier.seen[-1] == (4, False)


def test_past_the_bound_calls_leave_the_compilers_cores_and_get_their_threads_back(fake_builds) -> None:
    """The bound: calls back to back give the compilers no time, so from ``HOLD_CALLS_S`` after the
    builds started the calls run with the cores the compilers leave (``"cores"``) until the builds end."""
    now = fake_builds
    p = _Program()
    threads.register(p)
    threads.builds_started()
    x = torch.ones(3)
    now[0] += threads.HOLD_CALLS_S - 0.5
    p.entry(x)
    assert threads.way_now() == "calls-first" and p.seen[-1] == (4, True)
    now[0] += 1.0
    assert threads.overdue() and threads.way_now() == "cores"
    p.entry(x)
    torch.testing.assert_close(threads.beside_builds(p._entry, (x,)), [x + 1])
    assert p.seen[-2:] == [(2, False), (2, False)]
    assert torch.get_num_threads() == 4
    threads.builds_ended()
    assert not threads.overdue()
    p.entry(x)
    assert p.seen[-1] == (4, False)


def test_a_new_period_of_builds_starts_its_own_clock(fake_builds) -> None:
    now = fake_builds
    threads.builds_started()
    now[0] += threads.HOLD_CALLS_S + 1
    assert threads.overdue()
    threads.builds_ended()
    threads.builds_started()
    assert not threads.overdue() and threads.way_now() == "calls-first"


def _chosen_at_call() -> ChosenAtCall:
    launch = ChosenAtCall.__new__(ChosenAtCall)
    launch.table = {(3,): print}
    return launch


def test_choices_at_the_call_are_made_again_only_where_calls_ran_on_fewer_threads(fake_builds) -> None:
    """Note [torch's threads beside background compilers]: a class chosen at a call on fewer
    threads is chosen again once the builds end; calls that kept torch's own count keep theirs."""
    now = fake_builds
    p = _Program()
    p._chosen[0] = _chosen_at_call()
    threads.register(p)
    threads.builds_started()
    p.entry(torch.ones(2))  # (calls first: torch's own count)
    threads.builds_ended()
    assert p._chosen[0].table, "a choice made at torch's own count was dropped"
    threads.builds_started()
    now[0] += threads.HOLD_CALLS_S + 1
    p.entry(torch.ones(2))  # (past the bound: fewer threads)
    threads.builds_ended()
    assert p._chosen[0].table == {}


def test_the_idle_policy_changes_nothing_in_a_call(fake_builds) -> None:
    threads.use_policy("idle")
    try:
        p = _Program()
        threads.register(p)
        threads.builds_started()
        p.entry(torch.ones(2))
        assert p.seen == [(4, False)]
    finally:
        threads.use_policy(None)


def test_the_cores_policy_runs_calls_on_the_cores_the_compilers_leave(fake_builds, monkeypatch) -> None:
    monkeypatch.setenv("FUSEG_BUILD_THREADS", "1")
    p = _Program()
    threads.register(p)
    threads.builds_started()
    p.entry(torch.ones(2))
    assert p.seen == [(2, False)] and torch.get_num_threads() == 4

"""Kernels that ATen beat alone, tried again inside their program (Note [a kernel tried in its
program]); a program against its own ATen path (Note [a program against its ATen path]).

Note [a kernel tried in its program]: Note [choices by measurement] (runtime/autotune.py) times a
kernel's launch alone against the segment on ATen, each called from Python on made-up inputs.
Inside a program the two cost something else: a kernel runs in its chain (Note [one native call
for a chain of kernels]), one native call for many kernels with no Python call of its own, where
an ATen op is a Python call of its own, through torch's dispatcher, and splits the chain it sits
in. The isolated timing misses both. On the AMD EPYC family 25 model 17 (2026-11-28), a tiny
GPT-2's training step lost 10 of its backward's matmuls to ATen by 0.5-5.7 us a call each alone,
while the backward program with every kernel took 513-533 us a call against 562-565 us with the
measured choices, and the optimizer step after it 0.13 against 0.16 ms (scratch, the same in
bert, llama, qwen2 and phi3 tiny). So a program of fixed sizes whose segments ATen beat alone
(kernels built and measured in this process) is tried both ways on its own first calls: the
program as measured (``aten``) and the same program with those kernels back in their chains
(``kernel``), made once each (no kernel is built again). The calls alternate, pair by pair in
either order; the first of each way is not timed (first touches), then ``CALLS`` each are (more
where the two are close: Note [a close trial is timed longer]); the way with the lower median
keeps the program, the other is dropped. Every call runs the plan
exactly, either way. Where the kernels win, each one's verdict is recorded again for the
kernel (the isolated times kept in it), so a later process with the same cache chooses them
without a trial; where ATen wins nothing changes. The trial's own result is appended to the
verdict file too (key ``program ...``), as a record.

Not tried: symbolic plans (their kernels are chosen at each call by size class: Note [choices at
the call]), a program whose kernels are still built in the background (it is tried once they
are in, at its remake), calls while background builds hold cores (not timed: torch then runs on
fewer threads), and calls that do not take the fast entry (not timed). A way that is more than
``GIVE_UP`` times slower than the other on its first timed calls ends the trial early: the few
calls a slow way costs are the trial's only cost, and that bounds them.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .. import autotune
from ..machine import threads

__all__ = ["CALLS", "CLOSE", "CLOSE_CALLS", "DRIFT", "DRIFT_CALLS", "GIVE_UP", "SAMPLE_EVERY", "Steady", "Trial", "against_aten", "aten_way",
           "alternating", "checking", "close", "program_checks", "program_key", "program_name", "start"]

#: calls timed each way
CALLS = 6
#: where the two ways' medians are then within ``CLOSE`` of the faster one, the trial goes on to
#: ``CLOSE_CALLS`` timed calls each way (Note [a close trial is timed longer]): the same rule as a
#: kernel's measurement alone (Note [a close measurement is timed longer] in runtime/autotune.py)
CLOSE, CLOSE_CALLS, close = autotune.CLOSE, autotune.CLOSE_CALLS, autotune.close
#: a way whose first two timed calls both took more than this many times the other's slowest
#: ends the trial (a bound on its cost, not a choice: the slower way loses either way)
GIVE_UP = 2.0
#: (Note [a verdict checked where timings drift]) a decided program times one call in this many
#: (doubled at each trial the drift started again) ...
SAMPLE_EVERY = 8
#: ... and this many timed calls in a row more than ``DRIFT`` times slower or faster than its way
#: took in the trial (its slowest, its fastest) open the decision again (as Note [kernels side by
#: side] in runtime/compiled/chains.py does for a chain's groups)
DRIFT_CALLS = 3
DRIFT = 2.0


def alternating(call: int, ways: tuple[str, str]) -> str:
    """The way of a trial's ``call``-th call: pairs of calls, each pair in the other order."""
    pair, second = divmod(call, 2)
    return ways[(pair + second) % 2]


# Note [a close trial is timed longer]: a trial decides on the medians of ``CALLS`` (6) timed calls
# each way, and its verdict is kept in the verdict file for every later process on the machine.
# Where the two ways are a few percent apart, six calls on a shared two-vCPU VM do not tell them
# apart: bf16 GPT-2 at hidden 768 (AMD EPYC family 25 model 17, 2026-12-07) ran its kernels at
# 13.99 ms a call and its ATen path at 14.64 ms over 30 interleaved rounds (scratch), yet one
# fresh-cache run's trial kept the ATen path on medians of 16.61 against 16.88 ms. So where the
# medians are within ``CLOSE`` (5%) of the faster one, the trial goes on, still alternating, to
# ``CLOSE_CALLS`` (18) timed calls each way and then decides on those medians. The longer trial
# costs little by its own condition: its ways are within 5% of each other, and only its extra
# calls of the slower way pay that. (The median's spread falls with the square root of the calls:
# 18 calls each tell apart about 1.7x closer ways than 6.)


def _timed(way: str, fn: Callable[..., Any], inputs: tuple) -> tuple[Any, float]:
    """``fn(*inputs)`` and the seconds it took (``way``: which way it is, for the tests' clock)."""
    t0 = time.perf_counter()
    out = fn(*inputs)
    return out, time.perf_counter() - t0


class Trial:
    """The two ways of a program, alternated on its calls until one is chosen."""

    def __init__(self, program: Any, ways: dict[str, dict[str, Any]], keys: dict[int, tuple[str, autotune.Verdict]],
                 key: str | None = None, reopened: int = 0) -> None:
        self.program = program
        self.ways = ways  # "aten" / "kernel" -> the program's attributes that way
        self.keys = keys  # segment -> (its verdict's key, its isolated verdict)
        self.key = key  # the whole program's verdict key (Note [a program against its ATen path]), or None
        self.reopened = reopened  # trials of this key that a drift started before this one
        self.times: dict[str, list[float]] = {"aten": [], "kernel": []}
        self.calls = 0

    def entry(self, *inputs: Any) -> list[torch.Tensor] | None:
        way = alternating(self.calls, ("aten", "kernel"))
        fn = self.ways[way]["entry"]
        if threads.busy():  # (torch on fewer threads beside background builds: not a fair timing)
            return fn(*inputs)
        out, elapsed = _timed(way, fn, inputs)
        if out is None:  # not the fast path: nothing ran, nothing learned
            return None
        if self.calls >= 2:
            self.times[way].append(elapsed)
        self.calls += 1
        self._maybe_decide()
        return out

    def _maybe_decide(self) -> None:
        a, k = self.times["aten"], self.times["kernel"]
        if len(a) >= 2 and len(k) >= 2 and (min(k) > GIVE_UP * max(a) or min(a) > GIVE_UP * max(k)):
            self.decide()
        elif len(a) >= CALLS and len(k) >= CALLS and not (min(len(a), len(k)) < CLOSE_CALLS and close(a, k)):
            self.decide()

    def verdict(self) -> autotune.Verdict:
        """The medians of the timed calls, compared (microseconds a call)."""
        a, k = statistics.median(self.times["aten"]), statistics.median(self.times["kernel"])
        return autotune.Verdict(k < a, k * 1e6, a * 1e6)

    def decide(self) -> None:
        v = self.verdict()
        kernels, k, a = v.kernel, v.kernel_us * 1e-6, v.aten_us * 1e-6
        program = self.program
        way = "kernel" if kernels else "aten"
        _become(program, self.ways[way])
        program.trial_result = {"kernels": kernels, "kernel_us": k * 1e6, "aten_us": a * 1e6,
                                "segments": sorted(self.keys), "calls": {w: len(t) for w, t in self.times.items()}}
        if self.key is not None:  # Note [a program against its ATen path]
            program.trial_result.update(against="its ATen path", reopened=self.reopened)
            autotune.record(self.key, v)
            program.entry = threads.entry_now(_steady(program, self.ways, self.key, way, self.times[way], self.reopened))
            return
        program.entry = threads.entry_now(program.entry)
        keys = sorted(key for key, _ in self.keys.values())
        name = hashlib.sha256("\n".join(keys).encode()).hexdigest()[:16]
        autotune.record(f"program {name} ({len(keys)} kernels ATen beat alone); threads {torch.get_num_threads()}",
                        autotune.Verdict(kernels, k * 1e6, a * 1e6))
        if kernels:
            for key, alone in self.keys.values():
                autotune.record(key, autotune.Verdict(True, alone.kernel_us, alone.aten_us))


def _become(program: Any, way: dict[str, Any]) -> None:
    """``program`` made as ``way``: its attributes as ``_finish`` left them that way (what was set
    on the program from outside since stays; what it caches from its launches is made again)."""
    for cached in ("_storage_needs", "_safe", "trial"):
        program.__dict__.pop(cached, None)
    program.__dict__.update(way)


def start(program: Any, chosen: dict[int, Any], lost: dict[int, Any],
          finish: Callable[[dict[int, Any]], None]) -> None:
    """Make ``program`` (just finished with ``chosen``, ATen running the segments of ``lost``'s
    kernel launches) the other way too, and let its calls choose (Note [a kernel tried in its
    program])."""
    aten = dict(program.__dict__)
    with_kernels = dict(chosen)
    with_kernels.update(lost)
    passed_over, backend_of = dict(program.passed_over), dict(program.backend_of)
    for i, launch in lost.items():
        passed_over[i] = tuple(p for p in passed_over.get(i, ()) if p[0] != launch.backend)
        backend_of[i] = launch.backend
    program.passed_over, program.backend_of = passed_over, backend_of
    try:
        finish(with_kernels)
    except Exception:  # noqa: BLE001 - the other way could not be made: the program as measured, untried
        _become(program, aten)
        return
    kernel = dict(program.__dict__)
    for way in (aten, kernel):  # (the trial's entry is set below; each way keeps its own)
        way["entry"] = threads.unwrapped(way["entry"])
    keys = {i: (launch.verdict_key, launch.verdict) for i, launch in lost.items()}
    trial = Trial(program, {"aten": aten, "kernel": kernel}, keys)
    _become(program, aten)
    program.trial = trial
    program.entry = threads.entry_now(trial.entry)


# Note [a program against its ATen path]: every choice of a program can be right and the program
# still lose to eager: a kernel measured alone against its ATen op on made-up inputs (Note
# [choices by measurement]) does not see the threads, caches and launch costs of the program
# around it, and the CPU at hand is not the one its rules were written on. So a CPU program that
# runs any generated kernel is made a second way, the same plan with every segment on torch (the
# ATen ops eager runs, in the plan's order, without the Python between them), and tried against
# it on its first calls: the calls alternate as in Note [a kernel tried in its program] and the
# faster way keeps the program. The verdict is kept beside the kernels' (the verdict file,
# keyed like them: by the program's kernels, whose names hash their sources and layouts, and
# torch's thread count): a later process with the same cache takes the same way without a
# trial. Every call runs the plan exactly, either way; where ATen wins, ``backend_of`` says torch
# and ``passed_over`` why. A symbolic plan (one plan for every size) decides per size class, as
# its kernels do: its key adds the class of each symbol (Note [a program's ATen path per size
# class] in runtime/compiled/class_check.py). A decided way stays watched (Note [a verdict checked where
# timings drift]). Not tried: programs on CUDA (a host timer does not time a stream), a program
# whose kernels ATen beat alone (it has its own trial), while choices are fixed
# (``autotune.fixed``: the tests) and under ``torch.use_deterministic_algorithms(True)``, where
# nothing is chosen by timing: the program keeps its kernels, so its bits do not depend on a
# timing.
#
# Note [a verdict checked where timings drift]: a verdict holds while the conditions it was
# measured in hold (the machine's load, the threads torch has, a cache another process fills).
# So the decided way's calls stay watched, cheaply: one call in ``SAMPLE_EVERY`` is timed (two
# clock reads), and ``DRIFT_CALLS`` timed calls in a row more than ``DRIFT`` times slower than
# the slowest of its way's calls in the trial, or faster than its fastest (a kept verdict: than
# the time it kept), open the decision again: a new trial of both ways, recorded over the old
# verdict. Each trial a drift starts doubles the sampling interval, so a way that keeps drifting
# (sizes that move far within their class, a load that comes and goes) costs a trial ever more
# rarely: over n calls, the trials number O(log n). Calls while background builds hold cores are
# not timed, nor under deterministic algorithms (nothing is measured there).
_CHECKS: contextvars.ContextVar[bool] = contextvars.ContextVar("fuseg_program_checks", default=True)


@contextlib.contextmanager
def program_checks(on: bool) -> Iterator[None]:
    """Within: programs are (``True``, the default) or are not tried against their ATen path."""
    token = _CHECKS.set(on)
    try:
        yield
    finally:
        _CHECKS.reset(token)


def checking(program: Any) -> bool:
    """Whether ``program`` may be tried against its ATen path now (Note [a program against its ATen path])."""
    return (_CHECKS.get() and autotune.policy() == "measure" and not torch.are_deterministic_algorithms_enabled()
            and program.ctx.device.type == "cpu")


def program_name(chosen: dict[int, Any]) -> str:
    """A program against its ATen path, named by its kernels (by name: their sources and layouts)."""
    names = sorted(launch.kernel.name for launch in chosen.values() if hasattr(launch, "kernel"))
    digest = hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]
    return f"program {digest} against its ATen path ({len(names)} kernels)"


def program_key(chosen: dict[int, Any], classes: dict[int, tuple[int, int]] | None = None) -> str:
    """The verdict key of a program against its ATen path: its kernels, torch's threads and, for a
    symbolic plan, the class of each symbol (by its place in the plan's sources), as
    ``autotune.class_key`` writes a kernel's."""
    return autotune.class_key(program_name(chosen), classes or {})


class Steady:
    """A decided way's calls, one in ``every`` timed (Note [a verdict checked where timings drift]):
    ``reopen()`` where they drifted."""

    def __init__(self, way: str, fn: Callable[..., Any], times: list[float], reopen: Callable[[], None],
                 every: int) -> None:
        self.way, self.fn, self.reopen, self.every = way, fn, reopen, every
        self.low, self.high = min(times), max(times)  # seconds a call of the way in its trial
        self.calls = 0
        self.off = 0  # timed calls in a row off the trial's times

    def entry(self, *inputs: Any) -> Any:
        self.calls += 1
        if self.calls % self.every or threads.busy() or torch.are_deterministic_algorithms_enabled():
            return self.fn(*inputs)
        out, elapsed = _timed(self.way, self.fn, inputs)
        if out is None:  # not the fast path: nothing ran
            return None
        off = elapsed > DRIFT * self.high or elapsed * DRIFT < self.low
        self.off = self.off + 1 if off else 0
        if self.off >= DRIFT_CALLS:
            self.reopen()
        return out


def _steady(program: Any, ways: dict[str, dict[str, Any]], key: str, way: str, times: list[float],
            reopened: int) -> Callable[..., Any]:
    """The entry of ``program``, decided for ``way`` (a program of fixed sizes), watched for drift."""
    def reopen() -> None:
        t = Trial(program, ways, {}, key=key, reopened=reopened + 1)
        program.trial = t
        program.entry = threads.entry_now(t.entry)

    return Steady(way, ways[way]["entry"], times, reopen, SAMPLE_EVERY << reopened).entry


def aten_way(program: Any, chosen: dict[int, Any], finish: Callable[[dict[int, Any]], None], why: str,
             ) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """``program`` (just finished with ``chosen``) made again with every generated segment on
    torch; its attributes each way (``kernel``, ``aten``; each with its own unwrapped entry), the
    program left as ``aten``. None where the ATen way could not be made (the program as it was)."""
    from ..backends.torch_backend import TorchLaunch

    kernel = dict(program.__dict__)
    on_torch = dict(chosen)
    passed_over, backend_of = dict(program.passed_over), dict(program.backend_of)
    for i, launch in chosen.items():
        if launch.backend != "torch":
            on_torch[i] = TorchLaunch(program.ctx, launch.segment)
            passed_over[i] = (*passed_over.get(i, ()), (launch.backend, why))
            backend_of[i] = "torch"
    program.passed_over, program.backend_of = passed_over, backend_of
    sizes = program.sizes
    if sizes is not None:
        sizes.unseal()  # (sealed again by ``finish``, as at a remake: Note [kernels built in the background])
    try:
        finish(on_torch)
    except Exception:  # noqa: BLE001 - the ATen way could not be made: the program with its kernels, untried
        _become(program, kernel)
        if sizes is not None:
            sizes.seal()
        return None
    aten = dict(program.__dict__)
    for way in (aten, kernel):  # (the trial's entry is set by the caller; each way keeps its own)
        way["entry"] = threads.unwrapped(way["entry"])
    return kernel, aten


def against_aten(program: Any, chosen: dict[int, Any], finish: Callable[[dict[int, Any]], None],
                 per_class: Callable[[Any, dict[int, Any], dict[str, Any]], Any]) -> None:
    """Try ``program`` (just finished with ``chosen``) against its ATen path, or take the way a
    verdict kept for its kernels says (Note [a program against its ATen path]). ``per_class``
    makes the check of a symbolic program (class_check.ClassCheck, which builds on this module's
    trials, so it is passed in from above)."""
    if not checking(program) or all(launch.backend == "torch" for launch in chosen.values()):
        return
    if program.sizes is not None:  # Note [a program's ATen path per size class]
        made = aten_way(program, chosen, finish, "the program measured slower than its ATen path in this size class "
                        "(Note [a program's ATen path per size class])")
        if made is not None:
            kernel, aten = made
            _become(program, kernel)  # (the checked path runs the kernels; the entry chooses by class)
            check = program.class_check = per_class(program, chosen, {"aten": aten["entry"], "kernel": kernel["entry"]})
            program.entry = threads.entry_now(check.entry)
        return
    key = program_key(chosen)
    known = autotune.lookup(key)
    why = ("the program measured slower on this CPU than its ATen path (Note [a program against its ATen path])"
           if known is None or known.kernel else f"the program's ATen path kept for this CPU: {known.reason()}")
    made = aten_way(program, chosen, finish, why)
    if made is None:
        return
    kernel, aten = made
    ways = {"aten": aten, "kernel": kernel}
    if known is not None:  # decided in an earlier process: the program is that way now, watched
        way = "kernel" if known.kernel else "aten"
        _become(program, ways[way])
        program.trial_result = {"kernels": known.kernel, "kernel_us": known.kernel_us, "aten_us": known.aten_us,
                                "against": "its ATen path", "kept": True}
        kept = (known.kernel_us if known.kernel else known.aten_us) * 1e-6
        program.entry = threads.entry_now(_steady(program, ways, key, way, [kept], 0))
        return
    t = Trial(program, ways, {}, key=key)
    _become(program, kernel)
    program.trial = t
    program.entry = threads.entry_now(t.entry)

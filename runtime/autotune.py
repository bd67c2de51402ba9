"""Speed-driven choices measured on the machine that runs them, and kept on disk (issue 42).

Note [choices by measurement]: whether a generated kernel or ATen's own op is the faster for a
segment (a matmul, an attention, a convolution, a lone softmax; an embedding lookup, its
backward, the nll loss and its backward, on made-up indices of zeros) depends on the CPU: the old
16-float matmul tiles took 3-15x ATen's time on an AVX2 EPYC where they had taken a third of it on
an AVX-512 one, and a size cap measured there (2^20 multiply-adds) was wrong here by a factor of
a hundred. So no constant decides; the cpp backend asks this module, once per shape class:

    lookup(key)                 -> the verdict cached for this machine, if any (a hit: no timing)
    measure(kernel, aten)       -> both run on made-up inputs of the segment's planned layouts,
                                   alternated: about a millisecond where a call is fast (rounds of
                                   a few calls), three calls each where a call is slow; more
                                   where the two are close (Note [a close measurement is timed longer])
    verdict_of(kernel_us, aten_us) -> the verdict of timed calls of each way (their medians)
    record(key, verdict)        -> kept in memory and appended to the machine's verdict file,
                                   next to the kernel cache (Note [the verdict file is a log])

The verdict file is named by what decides speed: the CPU's model and flags, the compiler and its
flags, torch's version, the kernels' prelude (``machine``) and the thresholds the kernels were
generated with (Note [thread thresholds measured here] in codegen/thresholds.py); so a cache dir shared by two
machines keeps a verdict per machine, and new kernel code is measured afresh. A key names the
segment exactly (its kernel's name hashes the kernel's source and layouts) and torch's thread
count. A symbolic plan's kernel is one source for every size: its key adds the power-of-two class
of each size it reads (``size_class``). The program keeps both ways and chooses at each call by
the class of the call's sizes, a new class measured on its own calls, each running one way in
turn (Note [choices at the call] and Note [a class measured on its calls] in
runtime/backends/at_call.py); a kernel that writes an input in
place keeps its class as a condition of the plan instead (a call outside it gets a plan of its
own, which compiles nothing). A program of fixed sizes whose kernels ATen beat alone tries them
again in the program, on its first calls (Note [a kernel tried in its program] in runtime/compiled/trial.py):
alone a kernel pays a Python call that its chain saves, and ATen's op splits the chain.

Costs: a cold process measures each class the first time it builds it, after the kernels are
built (the timing reads the real binary, no other compile), or, chosen at the call, on the
first calls of that class (no call runs more than once); a warm cache measures nothing. Where
the two are close a measurement can come out either way; the cache makes later processes agree
with the first. With ``torch.use_deterministic_algorithms(True)`` nothing is measured and ATen runs
every such segment, as in eager (Note [no choice by timing] in runtime/backends/im2col.py). The
cache is a cache (Note [kernel cache safety] in runtime/machine/compiler.py): a damaged file reads as empty
and is rewritten whole; one that cannot be written leaves the verdicts in memory for the process.

``fixed(policy)`` replaces measuring for a block of code: "kernel" takes every kernel (the tests of
kernels, which must not depend on timings), "aten" none.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from .machine.compiler import cache_dir, machine, write_whole

__all__ = ["CLOSE", "CLOSE_CALLS", "Verdict", "class_key", "close", "class_of_bits", "fixed", "lookup", "machine", "measure", "policy", "record",
           "set_policy", "size_class", "verdict_of", "verdict_path"]

_POLICY: contextvars.ContextVar[str] = contextvars.ContextVar("fuseg_autotune_policy", default="measure")
_POLICIES = ("measure", "kernel", "aten")
#: seconds of alternated rounds a measurement may take once each side has run ``_MIN_ROUNDS`` times
_BUDGET_S = 0.001
_MIN_ROUNDS = 3
#: seconds one round of a side aims at (several calls of a fast op, one of a slow one)
_ROUND_S = 50e-6
#: where the medians are within this fraction of the faster one, the rounds go on to
#: ``CLOSE_CALLS`` a side, or while ``_CLOSE_BUDGET_S`` lasts (Note [a close measurement is timed longer])
CLOSE = 0.05
CLOSE_CALLS = 18
_CLOSE_BUDGET_S = 0.25


@dataclass(frozen=True)
class Verdict:
    """Which was the faster, and the median microseconds a call each took when measured."""

    kernel: bool
    kernel_us: float
    aten_us: float

    def reason(self) -> str:
        return (f"ATen's op measured faster on this CPU ({self.aten_us:.1f} us a call against {self.kernel_us:.1f} us "
                "for the generated kernel; Note [choices by measurement])")


def policy() -> str:
    """"measure" (the default), or what ``fixed`` set."""
    return _POLICY.get()


def set_policy(choice: str) -> None:
    """As ``fixed``, for the rest of the current context (a benchmark's process)."""
    if choice not in _POLICIES:
        raise ValueError(f"unknown choice {choice!r} (one of {', '.join(_POLICIES)})")
    _POLICY.set(choice)


@contextlib.contextmanager
def fixed(choice: str) -> Iterator[None]:
    """Within: no measuring; "kernel" takes every kernel the generator builds, "aten" none."""
    if choice not in _POLICIES:
        raise ValueError(f"unknown choice {choice!r} (one of {', '.join(_POLICIES)})")
    token = _POLICY.set(choice)
    try:
        yield
    finally:
        _POLICY.reset(token)


def class_of_bits(bits: int) -> tuple[int, int]:
    """[lo, hi): the power-of-two class of the sizes of ``bits`` bits (``n.bit_length()``)."""
    return (0, 1) if bits <= 0 else (1 << (bits - 1), 1 << bits)


def class_key(kernel_name: str, classes: dict[int, tuple[int, int]]) -> str:
    """A verdict's key: the kernel, torch's threads now, and the class of each size it reads
    (by the symbol's place in the plan's sources)."""
    parts = [kernel_name, f"threads {torch.get_num_threads()}"]
    parts += [f"s{k} in [{lo}, {hi})" for k, (lo, hi) in classes.items()]
    return "; ".join(parts)


def size_class(n: int | torch.SymInt) -> tuple[int, int]:
    """[lo, hi): the power-of-two class of a size (0 is a class of its own). For a symbolic size,
    the class of its value at the first call, and ``lo <= n < hi`` a condition of the plan."""
    from segmenter.ir.symbolic import size_hint

    h = size_hint(n)
    lo, hi = class_of_bits(max(h, 0).bit_length())
    if isinstance(n, torch.SymInt):
        inside = bool(lo <= n) and bool(n < hi)  # each comparison a recorded condition of the plan
        assert inside, f"size {n} outside its own class [{lo}, {hi})"
    return lo, hi


# -- what decides speed ----------------------------------------------------------------------

#: what the verdicts in a file are (part of its name)
_FORM = "kernels ATen beat alone tried in their programs"


@functools.cache
def _file_name(settings: tuple[int, ...], width: str) -> str:
    from .codegen.source.ctypes_ import prelude

    # (_FORM: a verdict file of before Note [a kernel tried in its program] holds ATen verdicts
    # never tried in a program; a new name measures them again, once. The thresholds the kernels
    # were generated with: Note [thread thresholds measured here] in codegen/thresholds.py; the
    # width their loops prefer, where not the compiler's own: Note [a vector width measured here])
    what = (json.dumps(machine(), sort_keys=True) + hashlib.sha256(prelude("cpu").encode()).hexdigest() + _FORM
            + " thresholds " + " ".join(map(str, settings)) + width)
    return f"autotune-{hashlib.sha256(what.encode()).hexdigest()[:16]}.json"


def verdict_path() -> str:
    """This machine's verdict file for the thread thresholds kernels are generated with now, in
    the kernel cache dir (``FUSEG_CACHE_DIR``)."""
    from .codegen import thresholds
    from .codegen.vector_width import pragma

    t = thresholds.current()
    return os.path.join(cache_dir(), _file_name((t.loop, t.macs, t.costly_call, t.beside_loop, t.beside_macs,
                                                 t.pack_rows, t.nn_pack_rows), pragma("cpu")))


# -- the verdicts ----------------------------------------------------------------------------

#: verdict file -> key -> verdict, as read or recorded in this process
_MEMORY: dict[str, dict[str, Verdict]] = {}
#: verdict files this process may append to (read whole, with this machine's header, not overgrown)
_APPENDABLE: set[str] = set()


# Note [the verdict file is a log]: the file is a line of JSON naming the machine, then a line per
# verdict (a later line for a key wins). ``record`` appends its line with one ``write`` to a
# file opened for appending (16 us a verdict: the median of 200 appends to a file of 200-400,
# a scratch timer around ``record``), where writing the whole file again took 0.8 ms with 200
# verdicts in it (2.4 ms with the Python encoder), on the caller's thread, at a new size
# class (Note [choices at the call] in runtime/backends/at_call.py). A file of another form (an
# older fuseg's), one without the header, or one grown past twice its verdicts (processes
# recording the same keys) is written again whole, from what it and this process know, by a
# rename: a reader sees the old file or the new one. A damaged line (a write cut short) is no
# verdict; the rest read, and the next line appended starts a line of its own.
def _read(path: str) -> dict[str, Verdict]:
    """The file's verdicts; an unreadable file reads as none, a damaged line as no verdict."""
    _APPENDABLE.discard(path)
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, ValueError):
        return {}
    out: dict[str, Verdict] = {}
    for line in lines[1:]:
        try:
            v = json.loads(line)
            out[str(v["key"])] = Verdict(bool(v["kernel"]), float(v["kernel_us"]), float(v["aten_us"]))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    try:
        header = json.loads(lines[0]) if lines else None
    except ValueError:
        header = None
    if header == {"machine": machine()} and len(lines) <= 2 * len(out) + 64:
        _APPENDABLE.add(path)
    return out


def lookup(key: str) -> Verdict | None:
    path = verdict_path()
    known = _MEMORY.get(path)
    if known is None:
        known = _MEMORY[path] = _read(path)
    return known.get(key)


def _line(key: str, v: Verdict) -> str:
    return json.dumps({"key": key, "kernel": v.kernel, "kernel_us": v.kernel_us, "aten_us": v.aten_us}) + "\n"


def record(key: str, verdict: Verdict) -> None:
    """Kept in memory, and appended to the file (Note [the verdict file is a log]); a file that
    cannot be appended to is written again whole, with what other processes recorded."""
    path = verdict_path()
    if path not in _MEMORY:
        _MEMORY[path] = _read(path)
    known = _MEMORY[path]
    known[key] = verdict
    try:
        if path in _APPENDABLE and os.path.isfile(path):
            fd = os.open(path, os.O_RDWR | os.O_APPEND)
            try:
                end = os.fstat(fd).st_size
                cut = end > 0 and os.pread(fd, 1, end - 1) != b"\n"  # (a write cut short: end its line)
                os.write(fd, (("\n" if cut else "") + _line(key, verdict)).encode())
            finally:
                os.close(fd)
            return
        merged = {**_read(path), **known}
        body = json.dumps({"machine": machine()}) + "\n" + "".join(_line(k, v) for k, v in sorted(merged.items()))
        write_whole(path, body, ".autotune-")
        _APPENDABLE.add(path)
    except OSError:
        pass  # an unwritable cache: the verdict holds for this process


def verdict_of(kernel_us: list[float], aten_us: list[float]) -> Verdict:
    """The verdict of timed calls of each way (microseconds a call): their medians compared."""
    k, a = statistics.median(kernel_us), statistics.median(aten_us)
    return Verdict(k <= a, k, a)


def measure(kernel: Callable[[], object], aten: Callable[[], object]) -> Verdict:
    """Both ways once untimed (first calls allocate and set up), then alternated rounds: of a few
    calls each where a call is fast (at least ``_MIN_ROUNDS`` rounds each, then up to ``_BUDGET_S``
    more), of one call where it takes more than a round (three rounds each: a slow op's call is
    costly, and far above the noise of a fast one, but one call another process disturbed must
    not decide); where the two are close, more (Note [a close measurement is timed longer]); the
    medians."""
    kernel()
    aten()
    times: dict[str, list[float]] = {"kernel": [], "aten": []}
    runs = (("aten", aten), ("kernel", kernel))

    def round_of(calls: int, order: tuple) -> None:
        for name, fn in order:
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - t0) / calls * 1e6)

    round_of(1, runs)
    slowest = max(times["kernel"][0], times["aten"][0]) * 1e-6
    if slowest > _ROUND_S:  # three calls each: one another process disturbed (a lone bf16 GELU
        round_of(1, runs[::-1])  # kernel of ~0.3 ms once read 3008 us against ATen's 603, scratch)
        round_of(1, runs)  # moves no median (Note [choices by measurement])
        calls = 1
    else:
        calls = max(1, min(64, int(_ROUND_S / max(slowest, 1e-7))))
        deadline = None
        rounds = 1
        while rounds < _MIN_ROUNDS + 1 or time.perf_counter() < deadline:  # type: ignore[operator]
            round_of(calls, runs if rounds % 2 == 0 else runs[::-1])
            rounds += 1
            if rounds == _MIN_ROUNDS + 1:
                deadline = time.perf_counter() + _BUDGET_S
        del times["kernel"][0], times["aten"][0]  # (one call: a round of the others' length)
    # Note [a close measurement is timed longer]
    until = time.perf_counter() + _CLOSE_BUDGET_S
    while close(times["kernel"], times["aten"]) and len(times["kernel"]) < CLOSE_CALLS \
            and time.perf_counter() < until:
        round_of(calls, runs if len(times["kernel"]) % 2 == 0 else runs[::-1])
    return verdict_of(times["kernel"], times["aten"])


# Note [a close measurement is timed longer]: a slow op's sides are timed three calls each, a fast
# one's in a few rounds, and the verdict is kept for every later process on the machine. Where the
# two are a few percent apart, that does not tell them apart: on an Intel Xeon (family 6 model 167,
# 2 vCPUs; 2026-12-07) ATen's product (MKL) of T5's 128 x 2048 by 2048 x 512 read 1064 us against
# the kernel's 1112 in one fresh-cache process and 1196 in the next, whose verdict kept the kernel:
# MKL took 1.1-1.2x less than the kernel there alone (scratch), and the model's settled call went
# from 7.85 to 8.75 ms between the two processes. So, as a trial in a program does (Note [a close
# trial is timed longer] in runtime/compiled/trial.py), where the medians are within ``CLOSE`` of
# the faster one the rounds go on, still alternating, to ``CLOSE_CALLS`` a side (or while
# ``_CLOSE_BUDGET_S`` lasts: an op of tens of milliseconds stops earlier), and the verdict is of
# those medians. It costs only where the two are close, and then at most the budget.
def close(a: list[float], k: list[float]) -> bool:
    """Whether the medians of two ways' timed calls are within ``CLOSE`` of the faster one's (here
    and in a trial in a program: Note [a close trial is timed longer] in runtime/compiled/trial.py)."""
    ma, mk = statistics.median(a), statistics.median(k)
    return abs(ma - mk) < CLOSE * min(ma, mk)

"""A symbolic program against its ATen path, per size class (issue 64).

Note [a program's ATen path per size class]: a symbolic plan (Note [symbolic plans] in
segmenter/ir/symbolic.py) is one program for every size, and whether its kernels beat the same
plan on torch depends on the sizes, as a measured kernel's verdict does (Note [choices at the
call] in runtime/backends/at_call.py). So such a program, checked against its ATen path (Note [a
program against its ATen path] in runtime/compiled/trial.py), is made both ways once, and its entry
chooses at each call by the class of the call's sizes: the power-of-two class of every symbol
(``autotune.size_class``), read from the inputs as the program reads them:

    bits = (v0.size(0).bit_length(), n0.bit_length(), ...)     # every symbol, in the plan's order
    way = table.get(bits) or choose(bits)

A class is chosen once: a verdict kept for it (the key of the fixed program's, ``program_key``,
with the class of each symbol, as ``autotune.class_key`` writes a kernel's) takes its way at once;
else its own calls alternate the two ways (``trial.Trial``: the first of each untimed, then
``CALLS`` each, or fewer where one way is ``GIVE_UP`` times the other, more where the two are
close: Note [a close trial is timed longer]), the faster keeps the
class and its verdict is recorded. A decided class stays watched (Note [a verdict checked where
timings drift] in runtime/compiled/trial.py). A class's calls differ in size (a prompt or a KV cache that
grows), and the trial alternates pair by pair in either order, so neither way gets the larger
calls. The trial starts once every launch of the kernel way that is itself chosen at the call
has chosen its way for the class (its own trial runs on the kernel way's calls before, untimed
here): the program's times are then those of the kernel way as it will run. Not chosen here, so
the kernel way, untimed and not kept: a class met while background builds hold cores (a
verdict's key names torch's threads, and the builds leave fewer; it is chosen once they end),
under ``autotune.fixed`` and under deterministic algorithms (nothing chosen by timing; the
program keeps its kernels). Calls off the fast entry (with grad, under a dispatch mode) run the
program's checked path, the kernel way: whichever way runs, the plan is run exactly.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from .. import autotune
from ..backends.at_call import ChosenAtCall
from ..emit.wrapper import Code
from ..machine import threads
from . import trial

__all__ = ["ClassCheck"]


class _ClassTrial(trial.Trial):
    """One class of a symbolic program tried against its ATen path on the class's calls."""

    def __init__(self, check: ClassCheck, bits: tuple[int, ...], key: str, reopened: int) -> None:
        super().__init__(check.program, {w: {"entry": fn} for w, fn in check.ways.items()}, {}, key=key,
                         reopened=reopened)
        self.check, self.bits = check, bits

    def decide(self) -> None:
        v = self.verdict()
        autotune.record(self.key, v)  # type: ignore[arg-type]
        way = "kernel" if v.kernel else "aten"
        self.check.settle(self.bits, way, self.times[way], self.reopened,
                          {"kernels": v.kernel, "kernel_us": v.kernel_us, "aten_us": v.aten_us, "kept": False,
                           "calls": {w: len(t) for w, t in self.times.items()}})


class ClassCheck:
    """The entry of a symbolic program made both ways: each size class takes the way it chose."""

    def __init__(self, program: Any, chosen: dict[int, Any], ways: dict[str, Callable[..., Any]]) -> None:
        self.program = program
        self.ways = ways  # "aten" / "kernel" -> that way's entry (unwrapped)
        self.name = trial.program_name(chosen)
        self.at_call = [launch for launch in chosen.values() if isinstance(launch, ChosenAtCall)]
        sizes = program.sizes
        params = [f"v{i}" for i in range(len(program.graph.inputs))] + [f"n{j}" for j in range(program.numbers)]
        reads = [params[src.input] + ("" if src.dim is None else f".size({src.dim})")
                 for src in (program.symbol_sources[s] for s in sizes.sources)]
        bits = "(" + "".join(f"{r}.bit_length(), " for r in reads) + ")"
        #: class -> the entry of its way (or of its trial)
        self.table: dict[tuple[int, ...], Callable[..., Any]] = {}
        #: class -> its verdict: "kernels", "kernel_us", "aten_us", "kept" (read from the cache), "reopened"
        self.results: dict[tuple[int, ...], dict[str, Any]] = {}
        code, args = Code(), ", ".join(params)
        #: the class of a call: each symbol's bit length, in the plan's order
        self.class_of, _ = code.function("fuseg_class", params, [], bits)
        #: the program's entry: the way of the call's class (one generated function: no frame but the way's)
        self.entry, self.source = code.function("fuseg_class_entry", params, [
            "    try:",
            f"        _b = {bits}",
            "    except (AttributeError, TypeError, IndexError, RuntimeError):  # not a call this program takes",
            f"        return {code.const(ways['kernel'])}({args})",
            f"    _w = {code.const(self.table)}.get(_b)",
            "    if _w is None:",
            f"        _w = {code.const(self._choose)}(_b)",
            f"    return _w({args})"], None)

    def key(self, bits: tuple[int, ...]) -> str:
        return autotune.class_key(self.name, {k: autotune.class_of_bits(b) for k, b in enumerate(bits)})

    def _choose(self, bits: tuple[int, ...]) -> Callable[..., Any]:
        """The way of a class met for the first time: kept, tried, or (not chosen now) the kernels'."""
        if (not trial.checking(self.program) or threads.busy()
                or not all(launch.settled(bits) for launch in self.at_call)):
            return self.ways["kernel"]
        key = self.key(bits)
        known = autotune.lookup(key)
        if known is None:
            return self._try(bits, key, 0)
        way = "kernel" if known.kernel else "aten"
        kept = (known.kernel_us if known.kernel else known.aten_us) * 1e-6
        self.settle(bits, way, [kept], 0, {"kernels": known.kernel, "kernel_us": known.kernel_us,
                                           "aten_us": known.aten_us, "kept": True})
        return self.table[bits]

    def _try(self, bits: tuple[int, ...], key: str, reopened: int) -> Callable[..., Any]:
        t = _ClassTrial(self, bits, key, reopened)
        self.table[bits] = t.entry
        return t.entry

    def settle(self, bits: tuple[int, ...], way: str, times: list[float], reopened: int,
               result: dict[str, Any]) -> None:
        """``way`` for the class ``bits``, watched for drift (Note [a verdict checked where timings drift])."""
        reopen = functools.partial(self._try, bits, self.key(bits), reopened + 1)
        self.table[bits] = trial.Steady(way, self.ways[way], times, reopen, trial.SAMPLE_EVERY << reopened).entry
        self.results[bits] = {**result, "reopened": reopened}

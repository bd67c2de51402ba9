"""Kernels compiled off the caller's thread while torch runs their segments (issue 41).

Note [kernels built in the background]: a symbolic plan (Note [symbolic plans]) is made when
dynamo re-traces a graph with symbolic sizes, in the middle of the caller's run (the second
prompt length of a generate); its kernels take sizes as arguments, so they are new sources, and
their compiler runs summed 1.4-2.0 s (two groups in parallel) of the 1.85-2.63 s that fuseg's
part of that call took (qwen2, phi3, both sides of perf/results/amd-epyc-zen3/second_length_parts_cpu.json). With
background builds (the default for inference graphs; ``FusegCompiler(background_builds=...)``
or FUSEG_BACKGROUND_BUILDS=1 / 0 sets them for every graph / none) a program's
``CompiledProgram(..., background=True)`` (a symbolic plan's, or one of fixed sizes: below):
  * asks each backend to start compiling what its launches miss on a thread of its own
    (``Backend.build_later``; the cpp backend's compilers run on idle cores only, below);
  * is made at once with the launches that wait for a build on torch (an interim program:
    the plan's own segments, views and alias decisions, each waiting kernel segment run by
    torch's ops, as a declined build would be; ``passed_over`` says why), no chains;
  * at the first call (``entry``) that finds every build done, is made again from the same
    launches (``rebuild``: ``build_all`` now loads them; the measured choices against ATen
    are timed then, on the caller's thread, or at the call: Note [choices at the call]), and
    runs the kernels from then on.
Nothing is lost where a background build fails: the rebuild builds at once, as without the
background (a compiler that fails there fails the same way). The plan's sizes are unsealed for
the rebuild and sealed again: a condition the kernels' launches add makes a call that breaks it
go to a plan of its own (the caller's list), never run a plan whose conditions it breaks.
``wait_for_builds()`` waits (tests, benchmarks of the steady state).

Programs of fixed sizes (a graph specialized to its call's shapes) take the same path since
2026-11-27 (issue 42, goal 3: a first call within 0.25x Inductor's): their first call is the
one the caller waits for, and their kernel builds were most of fuseg's part of it on the
realistic families (bert-768: about 1.5 s of compilers in a 4.7 s first call, of which dynamo's
trace alone took about 2.6 s; scratch timers). With the builds in the background that call
returns once torch has run the waiting segments; perf.compiled records when the kernels are
built as well (``fuseg_kernels_ready_s``) and times the first call with every build at once
(``fuseg-foreground``) beside it. A program captured into a CUDA graph builds at once (the
capture must hold its kernels).

The compilers run only where a core would be idle: Linux's SCHED_IDLE policy, set in the
compiler's process before it starts so that cc1plus, as and ld inherit it (``_idle_in_child`` in
codegen/build.py; the lowest nice value where there is no such policy), one translation unit per
core. Any thread of the caller's that wakes takes its core at once. Two weaker settings were
measured on a tiny LM's generation first: the compilers at normal priority on all cores but
one, where the generates that ran alongside (the third to sixth prompt lengths) took 3.1-7.8x a
seen length (perf/results/x86-cpu-unrecorded/background_builds_onoff_cpu.json); and nice 19 set on the compiler
after it started, which missed its children: each decode step took 15 ms instead of 0.7 while
a build ran (torch's CPU attention waiting for its second OpenMP thread; scratch runs of that
protocol with timers around each call and torch's profiler, not committed). A caller busy on
every core gives such a compiler no time, so a program whose builds are not done
``WAIT_AFTER_S`` (10 s) after they started waits for them at its next call (the cores are then
idle, and the compilers run), and sooner where their measured share of the cores says they are
starved (Note [the wait follows the builds' share] in runtime/machine/threads.py). A program is made again once, at the first call that finds its
builds done (0.05-0.35 s of Python for a tiny LM's graphs, the launches' source generated
again: a timer around ``rebuild`` in scratch runs of that protocol).

Idle cores are not enough at one point: while the caller's thread traces or plans (dynamo's
compile of a frame, fuseg's making of a program), the background compilers are stopped and
none starts (Note [compilers paused while dynamo traces] in machine/pause.py; dynamo's re-trace
at the second prompt length ran up to 1.75x slower beside them). And while they run, a caller
that runs torch's parallel ops is slowed far more than their priority suggests: on this machine
kind's two vCPUs, phi3-tiny's generates on the interim program took 0.15-0.48 s with the
compilers running against 0.010-0.022 s with them held (scratch timers, 2026-11-27).

Note [interim calls hold the pause]: (from 2026-11-28 only with FUSEG_BUILD_THREADS=0, the
compilers given cores of their own, Note [torch's threads beside background compilers] in
runtime/machine/threads.py; since issue 64 the default again, for every program's calls and with a bound
for all: Note [calls first while kernels build] there; what follows is why this was tried first) so each
call of a program whose builds are under way (its ``entry`` and ``run_checked`` on the interim
program) holds the pause too: the compilers are
stopped for the call and go on between calls. A first try (2026-11-27) left the builds no
sooner done and 300 generates the same in total (8.3 s against 8.1), and was set aside; but what
the caller waits for is each call: in starcoder2-tiny's second generate, 14 of its 23 decode
steps took 8-33 ms beside the compilers, and every one 0.8-2.6 ms with them stopped (one process
each, scratch timers around each forward); its third generate took 0.20-0.37 s against
0.02-0.11 s (four scratch processes before, three after). The builds get the time between
calls, and all of it once a program waits for them (``WAIT_AFTER_S``). Before and after in one
run: perf/results/amd-epyc-zen4/dynamic_shapes_generate_trials_cpu.json ("new" and "steady", the generates
during the builds: 24-74 / 43-86 ms against 88-333 / 58-239 before).

Why it is on for inference graphs only: a training step keeps every core busy, so idle-only
compilers got no time and its steps ran the interim program (6.5-16.3 ms against 4.0-7.1 ms
with the builds on the caller's thread, perf/results/amd-epyc-zen3/train_background_builds_cpu.json); for
generation the README's dynamic shapes section and
perf/results/amd-epyc-zen3/second_length_background_rounds_cpu.json time both. Measured again under calls first with the
wait that follows the builds' share (perf/results/amd-epyc-zen4/train_step_background_builds_cpu.json,
three models whose first step took 0.29-0.39x Inductor's with the builds on the caller's thread,
before Note [one matmul library] in runtime/codegen/gemm_library.py brought them to 0.23-0.30x):
the first step took 0.16-0.21x Inductor's, but the steps run the ATen path until a step waits for
the builds, so the first 30 s of steps took 0.93-1.16x Inductor's against 0.81-0.89x, and
gpt2-256 had made fewer steps by the end of them. A training step's first call stays the longer.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from ..backends import SegmentLaunch
from ..backends.torch_backend import TorchLaunch
from ..machine import threads

if TYPE_CHECKING:
    from .program import CompiledProgram

__all__ = ["interim_launches", "rebuild"]


def interim_launches(program: CompiledProgram, chosen: dict[int, SegmentLaunch]) -> dict[int, SegmentLaunch]:
    """The launches ``program`` runs until the builds it starts here are done: those waiting for
    one on torch. The full set, and what ``backend_of``/``passed_over`` say of it, are kept for
    ``rebuild``; ``chosen`` itself where nothing needs building."""
    futures, waiting = [], []
    for b in program._backends:
        started = b.build_later([launch for launch in chosen.values() if launch.backend == b.name])
        if started is not None:
            futures.append(started[0])
            waiting += started[1]
    if not waiting:
        return chosen
    program._after_build = dict(chosen), dict(program.backend_of), dict(program.passed_over)
    program._building, program._building_since = futures, time.monotonic()
    program._starvation, program._interim_calls = threads.Starvation(), 0
    interim = dict(chosen)
    for launch in waiting:
        i = launch.segment.index
        program.passed_over[i] = (*program.passed_over.get(i, ()), (
            launch.backend, "its kernel is being compiled in the background: torch runs it until then "
                            "(Note [kernels built in the background] in runtime/compiled/background.py)"))
        program.backend_of[i] = "torch"
        interim[i] = TorchLaunch(program.ctx, launch.segment)
    return interim


def rebuild(program: CompiledProgram) -> None:
    """``program`` made again with the launches chosen when it was compiled, now that their
    kernels are built (``build_all`` loads them from the caches, and builds at once whatever the
    background left undone). The plan's sizes are opened for it and sealed again: the kernels'
    launches may ask size questions the interim program did not, and their answers become
    conditions of the program (a call that breaks one gets a plan of its own)."""
    from torch.utils._python_dispatch import _disable_current_modes

    from segmenter.ir.symbolic import symbolic_hashing

    chosen, backend_of, passed_over = program._after_build  # type: ignore[misc]
    program._building, program._after_build = None, None
    program.backend_of, program.passed_over = backend_of, passed_over
    if program.sizes is not None:
        program.sizes.unseal()
    # (Note [torch's threads beside background compilers]: its measurements at torch's own count)
    with _disable_current_modes(), symbolic_hashing(), torch.no_grad(), threads.at_own_threads():  # as when compiled
        program._finish(dict(chosen))

"""What a new shape costs: LLM generation with prompts of several lengths, and training with
varying sequence lengths, under eager, ``aot_eager``, Inductor and fuseg (issue 41).

    python -m perf.dynamic_shapes [--models qwen2 phi3 ...] [--backends eager aot_eager inductor fuseg]
                                  [--repeats 5] [--rounds 1] [--train [--interleaved]] [--before DIR] [--device cuda]
                                  [--protocol [--window 30]]
                                  [--out perf/results/<machine>/dynamic_shapes_cpu.json]

Generation. Per model (a tiny config from ``transformers``, random weights, no download) and
backend, one fresh process with empty Inductor and fuseg caches compiles ``model.forward`` and
calls ``model.generate(ids, max_new_tokens=24, min_new_tokens=24)`` (the library's default cache, greedy;
exactly 24 new tokens, so every generate does the same work) with
prompts of ``LENGTHS`` tokens, each length new, then the third length again ``--repeats`` times
(every length seen: the steady state). Each generate is timed whole (``perf_counter``); its
tokens are compared with eager's. Dynamo compiles the first length's graphs with static sizes,
re-traces them with symbolic sizes at the second (whatever the backend), and from the third on
a backend that plans once for all sizes compiles nothing: ``new`` (the median over the third
length on) against ``steady`` is what a new length costs. fuseg's kernel builds (C++ compiler
runs) are counted per generate. fuseg builds an inference graph's kernels in the background
(its default, Note [kernels built in the background]; programs of fixed sizes too since
2026-11-27): after the protocol it says how many builds were
still under way, waits for them and times the seen length again: after one generate that
remakes the programs, ``--repeats`` generates give ``steady_after_builds`` (a size class's first
calls may still be measuring both ways there: Note [a class measured on its calls]) and
``--repeats`` more ``settled_after_builds`` (since 2026-11-28; earlier records have the first
only); then prompts of ``LATER_LENGTHS``, never seen, each twice: ``new_after_builds`` (a new length
once the kernels exist) against ``seen_after_builds`` (the same lengths again); their builds
counted, their tokens checked. Every timed generate also records its forward calls' host times
(``forward_calls``: the prefill's, the slowest call and which it was, the median, the sum), to tell
a slow generate's prefill from a stalled decode step.
``--backends ... fuseg-foreground`` adds fuseg building on the caller's thread
(FUSEG_BACKGROUND_BUILDS=0) in a process of its own; ``fuseg-unpaused`` adds fuseg with its
background compilers left running while dynamo traces (FUSEG_PAUSE_BUILDS=0: the before of
Note [compilers paused while dynamo traces]). ``--before DIR --backends ... fuseg-before`` adds
fuseg as a checkout of older code has it (its own protocol, on ``PYTHONPATH``), so a change is
timed against the code it changed in one run.

Training (``--train``). One SGD step (forward, backward, update) of a tiny causal LM with labels
on batches whose sequence length changes every step (``TRAIN_LENGTHS``: what a data loader with
dynamic padding does), per backend in a fresh process; each step's loss and every gradient are
compared with an eager copy of the model stepped on the same batches. Steps after every length
was seen once give ``steady``. Then ``SETTLE_PASSES`` more passes over the lengths, unchecked (no
eager step between, as a training loop runs): the last pass gives ``settled`` (since 2026-11-28;
in a fresh process fuseg's size classes measure both ways on their first calls, Note [a class
measured on its calls], and those trials fall among the checked steps).

Training interleaved (``--train --interleaved [--passes 8]``): every backend in one process,
a copy of the model each, the length marked dynamic from the first step, four passes over the
six lengths untimed, then ``--passes`` timed with the backends' steps on each batch one after
another, the order rotating: settled step times compared without the spread between processes
(large on a shared VM), losses against eager's. No first or second step there: those need fresh
processes (the protocol above).

``--device cuda`` runs the same protocols on the GPU (models, prompts and batches on CUDA; a
generate is timed to a ``torch.cuda.synchronize``); fuseg's builds counted there are NVRTC compiles
of its CUDA kernels.

Protocol (``--protocol [--window 30]``): every backend (default eager, Inductor, fuseg) in one
fresh process per model, a copy of the model each, compiled afresh: the first generate, the
generates of the ``--window`` seconds after it over the other prompt lengths in turn (each new
the first time round; every fifth generate of a compiled backend's window an eager copy's, the
window's ratios taken against those), and the settled generate at a seen length, interleaved
(``--repeats`` rounds); the record's ``protocol`` per model has the fields of Note [the protocol]
in perf/compiled.py.

Each backend runs in its own process, one after the other (except ``--interleaved`` and
``--protocol``): compare ratios within one record.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

__all__ = ["GENERATE_MODELS", "LENGTHS", "TRAIN_LENGTHS", "main", "run_generate_protocol"]

#: causal LMs for generation: qwen2 (the model of issue 41's figures) and three the project was never tuned on
GENERATE_MODELS = ("qwen2", "phi3", "olmo", "starcoder2")
LENGTHS = (5, 9, 13, 17, 21, 25)
#: lengths first seen after fuseg's background builds are done (``new_after_builds``)
LATER_LENGTHS = (29, 33, 37)
TRAIN_LENGTHS = (16, 24, 32, 20, 28, 40, 16, 24, 32, 20, 28, 40)
#: unchecked passes over the six lengths after the checked steps; the last one gives ``settled``
SETTLE_PASSES = 3
BACKENDS = ("eager", "aot_eager", "inductor", "fuseg")
#: the contestants of ``--protocol``
PROTOCOL_BACKENDS = ("eager", "inductor", "fuseg")
NEW_TOKENS = 24
#: where a child process runs its protocol (``--device``; set once in the child)
_DEVICE = "cpu"
_ENTRY_POINT_FOUND: bool | None = None

_CONFIGS = {
    "qwen2": "Qwen2Config", "phi3": "Phi3Config", "olmo": "OlmoConfig", "starcoder2": "Starcoder2Config",
    "llama": "LlamaConfig", "mistral": "MistralConfig", "gemma2": "Gemma2Config", "qwen3": "Qwen3Config",
}


def _model(name: str) -> Any:
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = getattr(transformers, _CONFIGS[name])(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=128, max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval().to(_DEVICE)


def _ids(shape: tuple[int, int], seed: int) -> Any:
    """Token ids drawn on the CPU (the same on every device), then moved to ``_DEVICE``."""
    import torch

    return torch.randint(3, 128, shape, generator=torch.Generator().manual_seed(seed)).to(_DEVICE)


def _synchronized() -> None:
    import torch

    if _DEVICE != "cpu":
        torch.cuda.synchronize()


def _named(backend: str) -> str:
    """``backend`` for ``torch.compile``: fuseg by its name, as a user writes it, registered here
    where dynamo does not find setup.py's entry point (``runtime.dynamo.registered_by_name``)."""
    global _ENTRY_POINT_FOUND
    if backend == "fuseg":
        from runtime.dynamo import registered_by_name

        _ENTRY_POINT_FOUND = registered_by_name()
    return backend


def _compiled_forward(model: Any, backend: Any) -> None:
    """``model.forward`` compiled by ``backend`` (a name, or a backend function) as the only compile
    in the process would be (Note [contestants compile alone] in perf/compiled.py): the protocol
    compiles its contestants one after another in one process, right before each one's first call."""
    from perf.compiled import compile_alone

    if backend != "eager":
        model.forward = compile_alone(model.forward, backend=_named(backend) if isinstance(backend, str) else backend)


def _plans(backend: str) -> dict[str, Any]:
    """fuseg's programs in this process: symbolic plans, specialized programs, and refusals;
    whether dynamo found the name "fuseg" by the entry point."""
    if backend != "fuseg":
        return {}
    from runtime.dynamo import STATS

    return {"fuseg_programs": dict(STATS), "fuseg_entry_point_found": _ENTRY_POINT_FOUND}


def _verdicts_by_threads() -> dict[str, int]:
    """The kernel-or-ATen verdicts this process holds (Note [choices by measurement]), counted by
    the torch thread count in their keys: a verdict for fewer threads than torch's own was made
    beside background builds (Note [torch's threads beside background compilers])."""
    from collections import Counter

    from runtime import autotune

    counts: Counter = Counter()
    for verdicts in autotune._MEMORY.values():
        for key in verdicts:
            part = next((p for p in key.split("; ") if p.startswith("threads ")), "threads ?")
            counts[part] += 1
    return dict(counts)


def _builds() -> int:
    from runtime.codegen.build import compilations

    return compilations["cpu" if _DEVICE == "cpu" else "cuda"]


class _FullCollections:
    """Milliseconds the cyclic collector spent in full (generation 2) collections since the last
    ``take()``. One such collection of these processes' heaps (about 0.5M objects: torch,
    transformers and the compiled graphs) took 0.18-0.27 s on the CPU for qwen2-tiny, as long as
    several generates: a generate that one lands in is slow for no reason of the backend's. The
    record keeps it per timed call (``full_gc_ms``) to tell the two apart."""

    def __init__(self) -> None:
        import gc

        self._ms, self._t = 0.0, 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self._ms += (time.perf_counter() - self._t) * 1e3

    def take(self) -> float:
        ms, self._ms = self._ms, 0.0
        return ms


class _ForwardTimes:
    """The host milliseconds of each call of ``model.forward`` (the compiled one) since the last
    ``take()``: a generate's prefill, then one call per decode step. Not synchronized (on a GPU a
    call returns once its launches are queued), so a call that stalls the host (a plan made, a
    measurement, a collection, a synchronization, an allocator's ``cudaMalloc``) stands out
    from the rest. Recorded per timed generate as its slowest call (index, ms) and the sum, to
    tell a slow generate's prefill from its decode steps (the H100's unexplained 17-token
    generate, 0.35 s against 0.05 s, issue 41's notes)."""

    def __init__(self, model: Any) -> None:
        self._ms: list[float] = []
        forward = model.forward

        @functools.wraps(forward)  # (generate reads forward's signature: the compiled one's, the model's)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return forward(*args, **kwargs)
            finally:
                self._ms.append((time.perf_counter() - t) * 1e3)

        model.forward = timed

    def take(self) -> dict[str, Any]:
        ms, self._ms = self._ms, []
        if not ms:
            return {"calls": 0}
        slowest = max(range(len(ms)), key=ms.__getitem__)
        return {"calls": len(ms), "sum_ms": round(sum(ms), 3), "prefill_ms": round(ms[0], 3),
                "slowest": [slowest, round(ms[slowest], 3)], "median_ms": round(statistics.median(ms), 3)}


def _generate(model: Any, ids: Any) -> Any:
    """Greedy, exactly ``NEW_TOKENS`` new tokens: with random weights a model may emit its end
    token early, and a generate that stops early does less work than one that does not (phi3's
    seen prompt made 11 tokens where its new ones made 20-24, olmo's second prompt 7), so every
    generate is held to the same count and new and seen lengths are compared on equal work."""
    return model.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)


#: set (to 1) by ``--profile`` for the children: each generate protocol ends with one profiled generate
_PROFILE_ENV = "FUSEG_DYNAMIC_SHAPES_PROFILE"


def _profiled_generate(model: Any, ids: Any) -> dict[str, Any]:
    """One generate of ``ids`` under torch's profiler (``--profile``), after every timed one: on a
    GPU, where a decode step is bound by its launches, how many kernels ran on the device and for
    how long, how many launch calls the host made (the runtime's and the driver's: CuPy launches
    through the driver), how many ATen calls, and the host's costliest ops. The profiler's own
    cost is in ``wall_ms``: compare it only with another profiled generate."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if _DEVICE != "cpu" else [])
    with profile(activities=activities) as prof:
        t = time.perf_counter()
        with torch.no_grad():
            _generate(model, ids)
        _synchronized()
        wall = time.perf_counter() - t
    rows = prof.key_averages()
    device = [r for r in rows if getattr(r, "self_device_time_total", 0) > 0]
    launch_names = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")
    host = sorted(rows, key=lambda r: r.self_cpu_time_total, reverse=True)[:8]
    return {"wall_ms": wall * 1e3, "device_kernels": sum(r.count for r in device),
            "device_ms": sum(r.self_device_time_total for r in device) / 1e3,
            "launch_calls": sum(r.count for r in rows if r.key in launch_names),
            "aten_calls": sum(r.count for r in rows if r.key.startswith("aten::")),
            "top_host_ops": [[r.key, r.count, round(r.self_cpu_time_total / 1e3, 3)] for r in host]}


def run_generate(name: str, backend: str, repeats: int) -> dict[str, Any]:
    """In this process: every generate of the protocol, timed, with its tokens checked."""
    import torch

    threads_at_start = torch.get_num_threads()
    model, ref = _model(name), _model(name)
    _compiled_forward(model, backend)
    forwards = _ForwardTimes(model)
    prompts = [_ids((1, n), n) for n in LENGTHS]
    order = list(range(len(LENGTHS))) + [2] * repeats
    times, builds, equal, full_gc, forward_calls = [], [], [], [], []
    collections = _FullCollections()
    for k in order:
        before = _builds()
        collections.take()
        forwards.take()
        t = time.perf_counter()
        with torch.no_grad():
            out = _generate(model, prompts[k])
        _synchronized()
        times.append(time.perf_counter() - t)
        full_gc.append(collections.take())
        forward_calls.append(forwards.take())
        builds.append(_builds() - before)
        with torch.no_grad():
            want = _generate(ref, prompts[k])
        equal.append(bool(torch.equal(out, want)))
    n = len(LENGTHS)
    out = {"model": name, "backend": backend, "lengths": [LENGTHS[k] for k in order], "seconds": times,
           "full_gc_ms": full_gc, "forward_calls": forward_calls,
           "kernel_builds": builds if backend == "fuseg" else None, "tokens_equal_eager": equal, **_plans(backend),
           "first": times[0], "second": times[1], "new": statistics.median(times[2:n]),
           "steady": statistics.median(times[n:])}
    if backend == "fuseg":  # Note [kernels built in the background]: the seen length again, every build done
        from runtime.codegen.build import background_builds_under_way, wait_for_background_builds

        out["background_builds_under_way_after_steady"] = background_builds_under_way()
        t = time.perf_counter()
        wait_for_background_builds()
        out["waited_for_builds_s"] = time.perf_counter() - t
        again, again_gc, again_forwards = [], [], []
        # (the first call after the builds makes each program again; the next ``repeats`` give
        # ``steady_after_builds``, where a size class's first calls may still be trials of both
        # ways, Note [a class measured on its calls]; the ``repeats`` after them, ``settled``)
        for _ in range(2 * repeats + 1):
            collections.take()
            forwards.take()
            t = time.perf_counter()
            with torch.no_grad():
                _generate(model, prompts[2])
            _synchronized()
            again.append(time.perf_counter() - t)
            again_gc.append(collections.take())
            again_forwards.append(forwards.take())
        out["seconds_after_builds"] = again
        out["full_gc_ms_after_builds"] = again_gc
        out["forward_calls_after_builds"] = again_forwards
        out["steady_after_builds"] = statistics.median(again[1:repeats + 1])
        out["settled_after_builds"] = statistics.median(again[repeats + 1:])
        # (every build done: torch's own count again, Note [torch's threads beside background compilers];
        # and how many verdicts this process made or read for each thread count)
        out["torch_threads_after_builds"] = [torch.get_num_threads(), threads_at_start]
        out["verdicts_by_threads"] = _verdicts_by_threads()
        # lengths never seen, every build done: what a new length costs once the kernels exist,
        # against the same length generated again right after it (seen)
        fresh, seen, fresh_builds, fresh_equal = [], [], [], []
        for n in LATER_LENGTHS:
            ids = _ids((1, n), n)
            for times_of in (fresh, seen):
                before = _builds()
                t = time.perf_counter()
                with torch.no_grad():
                    got = _generate(model, ids)
                _synchronized()
                times_of.append(time.perf_counter() - t)
                fresh_builds.append(_builds() - before)
            with torch.no_grad():
                fresh_equal.append(bool(torch.equal(got, _generate(ref, ids))))
        out.update(later_lengths=list(LATER_LENGTHS), seconds_later_lengths_new=fresh, seconds_later_lengths_seen=seen,
                   kernel_builds_later_lengths=fresh_builds, tokens_equal_eager_later_lengths=fresh_equal,
                   new_after_builds=statistics.median(fresh), seen_after_builds=statistics.median(seen))
    if os.environ.get(_PROFILE_ENV) == "1":  # (fuseg's: every build done, a seen length)
        out["profile"] = _profiled_generate(model, prompts[2])
    return out


def run_generate_protocol(name: str, backends: list[str], window: float, repeats: int,
                          eager_every: int = 5) -> dict[str, Any]:
    """Note [the protocol] in perf/compiled.py for generation, in this process: per backend (a copy
    of the model each, compiled afresh, in the order given) the first generate (the first prompt
    length), then generates back to back for ``window`` seconds over the other prompt lengths in
    turn (each new the first time round: what a user's loop with varying prompts sees after its
    first call), fuseg's background builds finished before the next backend starts; then settled:
    one untimed pass over every length per backend (every length seen, whatever the window
    reached), the builds finished, and ``repeats`` rounds of one generate per backend at a seen
    length, the order reversed every other round (the median). Tokens are checked against an
    eager copy at the first generate and the settled one; that copy also makes every
    ``eager_every``-th generate of a compiled backend's window (Note [eager at the same moments] in
    perf/compiled.py; 0: none)."""
    import torch

    from perf.compiled import protocol_record, timed_window

    ref = _model(name)
    prompts = [_ids((1, n), n) for n in LENGTHS]
    models: dict[str, Any] = {}
    first: dict[str, float] = {}
    windows: dict[str, list[float]] = {}
    references: dict[str, list[float]] = {}  # eager's generates among a compiled backend's window
    extra: dict[str, dict[str, Any]] = {}
    equal: dict[str, list[bool]] = {}

    def check(b: str, out: Any, ids: Any) -> None:
        with torch.no_grad():
            equal.setdefault(b, []).append(bool(torch.equal(out, _generate(ref, ids))))

    for b in backends:
        model = _model(name)
        _compiled_forward(model, b)
        models[b] = model
        t = time.perf_counter()
        with torch.no_grad():
            out = _generate(model, prompts[0])
        _synchronized()
        first[b] = time.perf_counter() - t
        check(b, out, prompts[0])
        turn = iter(range(10**9))

        def one(model: Any = model, turn: Any = turn) -> None:
            with torch.no_grad():
                _generate(model, prompts[1 + next(turn) % (len(prompts) - 1)])
            _synchronized()

        references[b] = []  # Note [eager at the same moments] (perf/compiled.py)
        ref_turn = iter(range(10**9))
        windows[b] = timed_window(one, window, (lambda t=ref_turn: one(ref, t)) if b != "eager" and eager_every else None,
                                  eager_every, references[b])
        extra[b] = {"window_lengths_new": min(len(windows[b]), len(prompts) - 1)}
        if b == "fuseg":
            from runtime.codegen.build import background_builds_under_way, wait_for_background_builds

            extra[b]["builds_under_way_after_window"] = background_builds_under_way()
            t = time.perf_counter()
            wait_for_background_builds()
            extra[b]["waited_for_builds_s"] = time.perf_counter() - t
    for model in models.values():  # every length seen, untimed
        with torch.no_grad():
            for ids in prompts:
                _generate(model, ids)
    if "fuseg" in models:
        from runtime.codegen.build import wait_for_background_builds

        wait_for_background_builds()
    times: dict[str, list[float]] = {b: [] for b in models}
    for r in range(repeats):
        for b in (backends if r % 2 == 0 else backends[::-1]):
            t = time.perf_counter()
            with torch.no_grad():
                out = _generate(models[b], prompts[2])
            _synchronized()
            times[b].append(time.perf_counter() - t)
    for b, model in models.items():  # (untimed)
        with torch.no_grad():
            check(b, _generate(model, prompts[2]), prompts[2])
    settled = {b: statistics.median(ts) for b, ts in times.items() if ts}
    return {"model": name, "backends": list(backends), "lengths": list(LENGTHS), "tokens_equal_eager": equal,
            "settled_seconds": times, **_plans("fuseg" if "fuseg" in backends else ""),
            "protocol": protocol_record(window, list(backends), first, windows, settled, extra, references, eager_every)}


def _timed_step(step: Any, opt: Any, ids: Any) -> tuple[float, Any]:
    """One SGD step (forward with labels, backward, update) on ``ids``: its seconds (to the
    device's end) and its loss."""
    t = time.perf_counter()
    opt.zero_grad()
    loss = step(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    _synchronized()
    return time.perf_counter() - t, loss


def run_train(name: str, backend: str) -> dict[str, Any]:
    """In this process: one SGD step per batch of ``TRAIN_LENGTHS``, timed, against eager."""
    import copy

    import torch

    from perf.compiled import compile_alone

    model = _model(name).train()
    ref = copy.deepcopy(model)
    step = model if backend == "eager" else compile_alone(model, backend=_named(backend))
    opt, ref_opt = torch.optim.SGD(model.parameters(), lr=0.01), torch.optim.SGD(ref.parameters(), lr=0.01)
    times, loss_diff, grad_diff, builds, full_gc = [], [], [], [], []
    collections = _FullCollections()
    for n in TRAIN_LENGTHS:
        ids = _ids((2, n), n)
        before = _builds()
        collections.take()
        seconds, loss = _timed_step(step, opt, ids)
        times.append(seconds)
        full_gc.append(collections.take())
        builds.append(_builds() - before)
        ref_opt.zero_grad()
        want = ref(input_ids=ids, labels=ids).loss
        want.backward()
        loss_diff.append(abs(loss.item() - want.item()))
        grad_diff.append(max((a.grad - b.grad).abs().max().item() for a, b in zip(model.parameters(), ref.parameters())
                             if a.grad is not None))
        ref_opt.step()
    seen = len(set(TRAIN_LENGTHS))
    # (the same lengths again, SETTLE_PASSES times, no eager step between: a training loop as a
    # user runs it; the checked steps' median may hold a size class's trial calls, Note [a class
    # measured on its calls], which an empty cache makes in every fresh process)
    settle, settle_builds = [], []
    for n in TRAIN_LENGTHS[:seen] * SETTLE_PASSES:
        ids = _ids((2, n), n)
        before = _builds()
        settle.append(_timed_step(step, opt, ids)[0])
        settle_builds.append(_builds() - before)
    return {"model": name, "backend": backend, "lengths": list(TRAIN_LENGTHS), "seconds": times, "full_gc_ms": full_gc,
            "kernel_builds": builds if backend == "fuseg" else None, **_plans(backend), "max_loss_diff": max(loss_diff),
            "max_grad_diff": max(grad_diff), "first": times[0], "second": times[1],
            "new": statistics.median(times[2:seen]), "steady": statistics.median(times[seen:]),
            "seconds_settling": settle, "kernel_builds_settling": settle_builds if backend == "fuseg" else None,
            "settled": statistics.median(settle[-seen:])}


#: passes over the lengths before ``--interleaved`` times any (compiles, size-class trials, builds)
WARM_PASSES = 4


def run_train_interleaved(name: str, backends: list[str], passes: int, warm: int = WARM_PASSES) -> dict[str, Any]:
    """In this process: one copy of the model per backend (the same weights), the sequence length
    marked dynamic from the first step (dynamo's graphs are symbolic from the start, as they are
    from the second length without the mark), ``warm`` passes over the six lengths untimed, then
    ``passes`` timed, the backends' steps on each batch one after another in an order that rotates
    step by step. One process for all, so the step times compare without the spread between
    processes (on this VM one loop's step took 1.5-3.0 ms across 13 fuseg processes, 2.4-4.2 ms
    across four eager ones); each loss is compared with eager's where eager is among
    ``backends``."""
    import torch

    from perf.compiled import compile_alone

    models = {b: _model(name).train() for b in backends}
    steps = {b: m if b == "eager" else compile_alone(m, backend=_named(b)) for b, m in models.items()}
    opts = {b: torch.optim.SGD(m.parameters(), lr=0.01) for b, m in models.items()}
    lengths = TRAIN_LENGTHS[:len(set(TRAIN_LENGTHS))]
    times: dict[str, list[float]] = {b: [] for b in backends}
    loss_diff: dict[str, float] = {b: 0.0 for b in backends if b != "eager"}
    k = 0
    for p in range(warm + passes):
        for n in lengths:
            ids = _ids((2, n), n)
            torch._dynamo.mark_dynamic(ids, 1)
            losses = {}
            for b in backends[k % len(backends):] + backends[:k % len(backends)]:
                seconds, loss = _timed_step(steps[b], opts[b], ids)
                if p >= warm:
                    times[b].append(seconds)
                losses[b] = loss.item()
            k += 1
            if "eager" in losses:
                for b in loss_diff:
                    loss_diff[b] = max(loss_diff[b], abs(losses[b] - losses["eager"]))
    median = {b: statistics.median(v) for b, v in times.items()}
    out: dict[str, Any] = {"model": name, "backends": backends, "warm_passes": warm, "passes": passes,
                           "lengths": list(lengths), "seconds": times, "median": median, **_plans("fuseg" if "fuseg" in backends else "")}
    if "eager" in backends:
        out["max_loss_diff_vs_eager"] = loss_diff
    out["ratios"] = {f"{a}_over_{b}": median[a] / median[b] for a in backends for b in backends
                     if a == "fuseg" and b != a}
    return out


def _child(kind: str, name: str, backend: str, repeats: int, before: str | None = None,
           device: str = "cpu", window: float | None = None) -> dict[str, Any]:
    """Run one (model, backend) in a fresh process with empty compiler caches. ``fuseg-foreground``
    is fuseg with its kernels built on the caller's thread (FUSEG_BACKGROUND_BUILDS=0),
    ``fuseg-unpaused`` fuseg with its background compilers never paused (FUSEG_PAUSE_BUILDS=0),
    ``fuseg-before`` fuseg and this protocol as another checkout has them (``--before DIR``)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, FUSEG_CACHE_DIR=os.path.join(tmp, "fuseg"),
                   TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor"), PYTHONWARNINGS="ignore")
        if backend == "fuseg-foreground":
            env["FUSEG_BACKGROUND_BUILDS"] = "0"
        if backend == "fuseg-unpaused":
            env["FUSEG_PAUSE_BUILDS"] = "0"
        cwd = None
        if backend == "fuseg-before":
            if before is None:
                raise ValueError("the backend fuseg-before needs --before DIR (a checkout of the code to compare with)")
            cwd = env["PYTHONPATH"] = os.path.abspath(before)
        run_as = "fuseg" if backend in ("fuseg-foreground", "fuseg-unpaused", "fuseg-before") else backend
        cmd = [sys.executable, "-m", "perf.dynamic_shapes", "--child", kind, name, run_as, str(repeats)]
        if device != "cpu":  # (not passed on the CPU: an older checkout's --child takes four values)
            cmd.append(device)
        if window is not None:
            cmd += ["--window", str(window)]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600, cwd=cwd)
        if done.returncode != 0:
            return {"model": name, "backend": backend, "error": done.stderr.strip().splitlines()[-1:] or ["?"]}
        return {**json.loads(done.stdout.strip().splitlines()[-1]), "backend": backend}


def _ratios(rows: list[dict[str, Any]]) -> dict[str, Any]:
    by = {r["backend"]: r for r in rows if "error" not in r}
    out: dict[str, Any] = {}
    for backend, key in (("fuseg", "fuseg"), ("fuseg-before", "before"), ("inductor", "inductor"), ("eager", "eager"),
                         ("aot_eager", "aot_eager")):
        r = by.get(backend)  # a training round's slowest step once the graph is dynamic (the medians hide one)
        if r is not None and "tokens_equal_eager" not in r and len(r.get("seconds") or ()) > 2:
            out[f"{key}_slowest_step_after_second"] = max(r["seconds"][2:])
    fg = by.get("fuseg-foreground")
    if fg is not None:
        out["foreground_new_over_steady"] = fg["new"] / fg["steady"]
        if "aot_eager" in by:
            out["foreground_second_over_aot_eager_second"] = fg["second"] / by["aot_eager"]["second"]
    unpaused = by.get("fuseg-unpaused")
    if unpaused is not None and "aot_eager" in by:
        out["unpaused_second_over_aot_eager_second"] = unpaused["second"] / by["aot_eager"]["second"]
    before = by.get("fuseg-before")
    if before is not None:
        if "aot_eager" in by:
            out["before_second_over_aot_eager_second"] = before["second"] / by["aot_eager"]["second"]
        if before.get("new_after_builds"):
            out["before_new_after_builds_over_seen"] = before["new_after_builds"] / before["seen_after_builds"]
    f = by.get("fuseg")
    if f is None:
        return out
    out["fuseg_new_over_steady"] = f["new"] / f["steady"]
    if f.get("steady_after_builds"):
        out["fuseg_steady_after_builds_over_steady"] = f["steady_after_builds"] / f["steady"]
    if f.get("new_after_builds"):
        out["fuseg_new_after_builds_over_seen"] = f["new_after_builds"] / f["seen_after_builds"]
        out["fuseg_builds_at_later_lengths"] = sum(f["kernel_builds_later_lengths"])
    if "aot_eager" in by:
        out["fuseg_second_over_aot_eager_second"] = f["second"] / by["aot_eager"]["second"]
    if "inductor" in by:
        ind = by["inductor"]
        if f.get("steady_after_builds"):
            out["fuseg_steady_after_builds_over_inductor"] = f["steady_after_builds"] / ind["steady"]
        if f.get("settled_after_builds"):
            out["fuseg_settled_after_builds_over_inductor"] = f["settled_after_builds"] / ind["steady"]
        out.update(fuseg_first_over_inductor=f["first"] / ind["first"], fuseg_steady_over_inductor=f["steady"] / ind["steady"],
                   inductor_new_over_steady=ind["new"] / ind["steady"])
        if f.get("settled") and ind.get("settled"):  # (training: the unchecked passes, Note [a class measured on its calls])
            out["fuseg_settled_over_inductor"] = f["settled"] / ind["settled"]
    if "eager" in by:
        out["fuseg_steady_over_eager"] = f["steady"] / by["eager"]["steady"]
        if f.get("settled") and by["eager"].get("settled"):
            out["fuseg_settled_over_eager"] = f["settled"] / by["eager"]["settled"]
    if f.get("kernel_builds") is not None:
        n = len(LENGTHS) if "tokens_equal_eager" in f else len(set(TRAIN_LENGTHS))
        out["fuseg_builds_from_third_length"] = sum(f["kernel_builds"][2:])
        out["fuseg_builds_per_step"] = f["kernel_builds"][:n]
    return out


def protocol_orders(backends: list[str], n: int) -> list[list[str]]:
    """Per model: eager (where asked) first, the others swapping places from one model to the next
    (the backend made second in a process finds its imports and the compiler's files warm)."""
    head = [b for b in backends if b == "eager"]
    rest = [b for b in backends if b != "eager"]
    return [head + (rest if k % 2 == 0 else rest[::-1]) for k in range(n)]


def _protocol_main(args: Any) -> int:
    from perf.compiled import protocol_summary

    from .bench import environment, write_record

    record: dict[str, Any] = {"benchmark": "dynamic_shapes/generate-protocol", "environment": environment(args.device),
                              "lengths": list(LENGTHS), "new_tokens": NEW_TOKENS, "protocol_window_s": args.window,
                              "repeats": args.repeats, "results": {}}
    for name, order in zip(args.models, protocol_orders(args.backends, len(args.models))):
        print(f"protocol {name} {' '.join(order)} ...", file=sys.stderr, flush=True)
        row = _child("protocol", name, ",".join(order), args.repeats, None, args.device, args.window)
        record["results"][name] = row
        print(f"  {json.dumps({t: row['protocol'].get(f'fuseg_vs_{t}') for t in ('eager', 'inductor')} if 'protocol' in row else row.get('error'))}",
              file=sys.stderr, flush=True)
    done = [{"model": name, **row} for name, row in record["results"].items() if "protocol" in row]
    record["summary"] = {"protocol": protocol_summary(done)} if done else {}
    write_record(record, args.out)
    return 0 if len(done) == len(args.models) else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="*", default=list(GENERATE_MODELS))
    p.add_argument("--backends", nargs="*", default=None,
                   help=f"default: {' '.join(BACKENDS)}; with --protocol, {' '.join(PROTOCOL_BACKENDS)}")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rounds", type=int, default=1, help="the backends one after another, this many times per model")
    p.add_argument("--train", action="store_true", help="the training protocol instead of generation")
    p.add_argument("--interleaved", action="store_true",
                   help="with --train: every backend in one process, steps interleaved (settled step times only)")
    p.add_argument("--passes", type=int, default=8, help="timed passes over the lengths with --interleaved")
    p.add_argument("--before", default=None, help="a checkout of the code to compare with: the backend fuseg-before")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where the models run")
    p.add_argument("--profile", action="store_true",
                   help="end each generate protocol with one generate under torch's profiler (kernels, launches, ops)")
    p.add_argument("--protocol", action="store_true",
                   help="generation: every backend in one fresh process per model, its first generate, the --window of "
                        "generates over new prompt lengths after it, the settled generate (Note [the protocol] in "
                        "perf/compiled.py; --repeats settled rounds)")
    p.add_argument("--window", type=float, default=30.0, help="with --protocol: seconds of generates after each first one")
    p.add_argument("--out", default=None)
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.backends is None:
        args.backends = list(PROTOCOL_BACKENDS if args.protocol else BACKENDS)
    if args.window <= 0:
        p.error("--window must be positive")
    if args.profile:
        os.environ[_PROFILE_ENV] = "1"  # (the children inherit it)
    if args.child:
        global _DEVICE
        kind, name, backend, repeats = args.child[:4]
        _DEVICE = args.child[4] if len(args.child) > 4 else "cpu"
        if kind == "train-interleaved":
            result = run_train_interleaved(name, backend.split(","), int(repeats))
        elif kind == "protocol":
            result = run_generate_protocol(name, backend.split(","), args.window, int(repeats))
        else:
            result = run_train(name, backend) if kind == "train" else run_generate(name, backend, int(repeats))
        print(json.dumps(result))
        return 0
    from .bench import environment, write_record

    kind = "train" if args.train else "generate"
    if args.protocol:
        if args.train or args.interleaved or args.before or len(set(args.backends)) != len(args.backends) or any(
                b not in BACKENDS for b in args.backends):
            raise SystemExit(f"--protocol: generation, no --before, distinct backends among {', '.join(BACKENDS)}")
        return _protocol_main(args)
    if args.interleaved:
        if not args.train or args.before or len(set(args.backends)) != len(args.backends) or any(
                b not in BACKENDS for b in args.backends):
            raise SystemExit(f"--interleaved: with --train, no --before, distinct backends among {', '.join(BACKENDS)}")
        kind = "train-interleaved"
    if args.device != "cpu" and args.before:
        raise SystemExit("--before runs on the CPU only (an older checkout's protocol knows no device)")
    record: dict[str, Any] = {"benchmark": f"dynamic_shapes/{kind}", "environment": environment(args.device),
                              "lengths": list(TRAIN_LENGTHS if args.train else LENGTHS), "results": {}}
    for name in args.models:
        rounds = []
        for r in range(args.rounds):
            rows = []
            if args.interleaved:
                print(f"{kind} {name} {' '.join(args.backends)} (round {r + 1}) ...", file=sys.stderr, flush=True)
                row = _child(kind, name, ",".join(args.backends), args.passes, None, args.device)
                print(f"  {json.dumps(row.get('ratios', row.get('error')))}", file=sys.stderr, flush=True)
                rounds.append([row])
                continue
            for backend in args.backends:
                print(f"{kind} {name} {backend} (round {r + 1}) ...", file=sys.stderr, flush=True)
                row = _child(kind, name, backend, args.repeats, args.before, args.device)
                print(f"  {json.dumps({k: v for k, v in row.items() if k in ('first', 'second', 'new', 'steady', 'error')})}",
                      file=sys.stderr, flush=True)
                rows.append(row)
            rounds.append(rows)
        if args.interleaved:  # (one process a round: its own ratios)
            record["results"][name] = {"rounds": [rows[0] for rows in rounds]}
            continue
        if args.rounds == 1:
            record["results"][name] = {"runs": rounds[0], "ratios": _ratios(rounds[0])}
        else:
            record["results"][name] = {"rounds": [{"runs": rows, "ratios": _ratios(rows)} for rows in rounds]}
        done = record["results"][name]
        print(json.dumps({name: done["ratios"] if "ratios" in done else [x["ratios"] for x in done["rounds"]]}, indent=1),
              file=sys.stderr, flush=True)
    write_record(record, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

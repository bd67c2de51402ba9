"""Compiled models: eager against ``torch.compile(backend="inductor")`` and
``torch.compile(backend="fuseg")``, default options, side by side in one run (on the CPU; with
``--device cuda``, on the GPU, with Inductor's ``mode="reduce-overhead"`` and fuseg's
``options={"cuda_graphs": True}`` beside them).

    python -m perf.compiled [MODEL ...] [--set default|unseen|all|gpu] [--rounds 5] [--calls 20] [--first-calls 3] [--no-first-call]
                            [--device cpu|cuda] [--variants V,...] [--out perf/results/<machine>/compiled_cpu.json] [--plot FILE.png]
    python -m perf.compiled MODEL ... --protocol [--window 30] [--rounds 5] [--calls 20] [--out ...]

Models: the zoo's runnable entries and transformer-family models the project never tuned for
(``HELD_OUT``: tiny configs from ``transformers``, random weights, batch 2, sequence 32); with
``--set unseen`` (or ``all``) a second such set, ``UNSEEN`` in perf/models.py, first run after all
the tuning done on the others.

Method. Steady state: every variant of a model is compiled first, then the variants are timed
in ``--rounds`` interleaved rounds (eager, inductor, fuseg, eager, ...) of ``--calls`` calls each
(``perf_counter`` around each call); the record holds each variant's median over all its calls,
and the ratios fuseg/eager and fuseg/inductor of those medians. Two more variants bound what any
backend could do: "dynamo" (``torch.compile(backend="eager")``: the captured ops run as they are)
and "floor" (``torch.compile`` with a backend that does no work: at compile time it runs the graph
once on the example inputs, and each call hands those same outputs back). The floor is dynamo's
per-call cost alone (guards, frames, the module call path) with no compiled code at all: where it
is slower than eager, no torch.compile backend can be faster than eager (the inputs are the same
on every call, so its outputs are eager's too). "dynamo" is no such bound: its ops run one by one
through the GraphModule, which a compiler need not do.
Interleaving puts the machine's
noise on every variant alike: compare ratios within one run, not times across runs. On a GPU
each timed call ends with a ``torch.cuda.synchronize()`` (its time is the host's work and the
device's, one call alone), and each round also times ``--calls`` calls back to back with one
synchronize at the end (``*_pipelined_ms``: what a loop of calls costs a call, where host and
device overlap); the variants there: "inductor_ro" (``mode="reduce-overhead"``: CUDA graphs) and
"fuseg_graphs" (Note [CUDA graphs of a program] in runtime/cudagraphs.py; the record says per
program whether it replayed, and why not). ``--set gpu`` is the six models the GPU runs take
(``GPU``). Before any fuseg variant is timed, the kernels its first call started building in
the background are waited for (Note [kernels built in the background]): its steady state is
its kernels'. First call:
each compiler's first call (trace, compile, kernel builds) in a fresh process with empty
Inductor and fuseg caches, ``--first-calls`` times per compiler (3), the compilers
alternating; the median is kept, every time is recorded. fuseg's first call of an inference
graph returns once torch has run the segments whose kernels are still being compiled, so its
process also records when those kernels are built (``fuseg_kernels_ready_s``, from the call's
start), and a third compiler, ``fuseg-foreground``, times the first call with every build on the
caller's thread (FUSEG_BACKGROUND_BUILDS=0) (one cold start on this shared machine
varied by up to 40% between runs: resnet's fuseg first call took 2.1 s in one run, 3.4 s in the
next; not measured on a GPU). ``--no-first-call`` skips it. Every variant's outputs are compared
with eager's.

``--protocol`` (on the CPU): what a user's loop sees, eager, Inductor and fuseg in one fresh
process per model with empty caches: each contestant's first call, the calls of the ``--window``
seconds after it, and the settled state (Note [the protocol]). The record's rows carry it under
``protocol`` and the settled times under the keys above (``fuseg_vs_eager`` ...); the fresh-process
first calls run only where ``--first-calls`` is given.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

from runtime.codegen.build import wait_for_background_builds

from .bench import environment

__all__ = ["CONTESTANTS", "EAGER_EVERY", "GPU", "HELD_OUT", "MODELS", "UNSEEN", "VARIANTS", "bench_compiled", "bench_protocol", "compile_alone",
           "load_model",
           "main", "protocol_model", "protocol_record", "protocol_summary", "timed_window"]

from .models import DEFAULT, HELD_OUT, MODELS, UNSEEN

#: the models the GPU runs take (issue 44): the zoo's tiny transformers and a vision transformer
GPU = ["llama-tiny", "gpt2-tiny", "bert-tiny", "qwen2-tiny", "mistral-tiny", "vit"]
#: the variants timed beside eager, per device (``--variants`` picks others)
VARIANTS = {"cpu": ("inductor", "fuseg", "dynamo", "floor"),
            "cuda": ("inductor", "inductor_ro", "fuseg", "fuseg_graphs", "floor")}


def _set_of(name: str) -> str:
    return "unseen" if name in UNSEEN else "held_out" if name in HELD_OUT else "zoo"


def _leaves(x: Any) -> list[torch.Tensor]:
    if hasattr(x, "to_tuple"):  # transformers' ModelOutput
        x = x.to_tuple()
    return [t for t in pytree.tree_leaves(x) if isinstance(t, torch.Tensor)]


def _max_diff(got: Any, want: Any) -> float:
    g, w = _leaves(got), _leaves(want)
    if len(g) != len(w) or any(a.shape != b.shape for a, b in zip(g, w)):
        return math.inf
    return max((float((a.double() - b.double()).abs().nan_to_num(0.0).max()) for a, b in zip(g, w) if b.numel()),
               default=0.0)


# Note [the protocol]: what a user who compiles a model and calls it in a loop sees, per
# contestant (eager, Inductor, fuseg; each compiled afresh, in one process per model with empty
# Inductor and fuseg caches, eager first, Inductor and fuseg swapping places from one model to
# the next): (1) the first call (trace, compile, the builds it waits for); (2) the window: calls
# back to back for ``--window`` seconds right after it (what the first 30 s of a loop cost a call;
# fuseg's kernels build in the background there, so its calls may run torch's ops; a compiled
# contestant's window has eager calls among its own: Note [eager at the same moments]), its mean
# and median per call, and the mean against eager's settled time (``window_vs_eager_settled``) and
# against the eager calls among it (``window_vs_eager_same_moments``); (3) settled: once every
# contestant's window is done and fuseg's background builds are finished, the median of
# interleaved timed calls (as the steady state above). The ratios fuseg/eager and fuseg/Inductor
# of each phase compare like with like: first call with first call, window mean with window mean
# (fuseg/eager's window: fuseg's mean over eager's at the same moments, the goal being "at least
# eager's speed while kernels build"), settled median with settled median. A contestant
# that fails is recorded with its error and left out of the ratios. Every time is in seconds.
# perf.train_step (a window of steps) and perf.dynamic_shapes (generates over new prompt
# lengths) record the same fields through ``protocol_record``.

#: the contestants of the protocol, in the order they are compared
CONTESTANTS = ("eager", "inductor", "fuseg")


# Note [contestants compile alone]: dynamo keeps two things per function for the whole process,
# shared by every ``torch.compile`` of it whatever the backend: which sizes changed between its
# compiles (automatic dynamic: a later compile makes those sizes symbolic from its first graph)
# and one recompile limit. Contestants compiled one after another in one process would share
# both, so the second would start from what the first learnt. Found by the generation protocol
# (perf.dynamic_shapes): all four models share ``forward``'s code, and whichever of Inductor and
# fuseg came second compiled symbolic graphs at its first generate and never recompiled in its
# window; the one that came first recompiled at the second prompt length (Inductor about 13 s,
# fuseg about 3 s). The record of 2026-12-07 put fuseg at 1.24x and 1.22x Inductor's window on
# phi3 and starcoder2, where fuseg came first, and at 0.51x and 0.44x on qwen2 and olmo, where it
# came second. ``compile_alone`` forgets the sizes seen (torch's own PGO state, reset as
# ``torch._dynamo.reset`` resets it, without dropping the graphs compiled) and gives the compile a
# recompile limit of its own (``isolate_recompiles``, where torch has it). torch.compile is lazy:
# a contestant is compiled this way right before its first call.


def compile_alone(fn: Any, **kw: Any) -> Any:
    """``torch.compile(fn, **kw)`` as the only compile of ``fn`` in this process would be (Note
    [contestants compile alone]); call it right before the compiled function's first call."""
    import inspect

    from torch._dynamo import pgo

    pgo.reset_code_state()
    if "isolate_recompiles" in inspect.signature(torch.compile).parameters:
        kw.setdefault("isolate_recompiles", True)
    return torch.compile(fn, **kw)


def timed_window(call: Callable[[], Any], seconds: float, reference: Callable[[], Any] | None = None,
                 every: int = 0, reference_times: list[float] | None = None) -> list[float]:
    """``call()`` back to back from now until ``seconds`` have passed (at least once; the last call
    may end after): each call's seconds. With ``reference`` and ``every``: every ``every``-th call
    of the window is ``reference()`` instead (eager's, at the same moment: Note [eager at the same
    moments]), with fuseg's background compilers stopped for it; its seconds go to
    ``reference_times``."""
    if reference is not None and every < 2:
        raise ValueError(f"every={every}: a window with a reference needs every >= 2 (a call of its own between two of eager's)")
    times: list[float] = []
    start = time.perf_counter()
    made = 0
    while not times or time.perf_counter() - start < seconds:
        if reference is not None and made % every == every - 1:
            from runtime.machine import pause

            with pause.held():
                t0 = time.perf_counter()
                reference()
                dt = time.perf_counter() - t0
            if reference_times is not None:
                reference_times.append(dt)
            made += 1
            continue
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
        made += 1
    return times


# Note [eager at the same moments]: the window's ratios once compared a contestant's window with
# eager's settled time (fuseg/eager) or with the other's window (fuseg/Inductor), each measured at
# another moment of the run, minutes apart. On the two-vCPU VMs of these sessions the machine's
# own speed moves more than that between minutes: in the realistic records of 2026-12-07 (AMD
# EPYC family 25 model 17) eager's own window took 0.84-1.36x eager's settled time in float32 and
# 0.85-1.20x in bf16, where nothing of eager's changes in between. So a window of a compiled
# contestant makes every ``EAGER_EVERY``-th call an eager one (the same model and inputs; fuseg's
# compilers stopped for it, as for fuseg's own calls: Note [calls first while kernels build] in
# runtime/machine/threads.py, so the builds get none of its time), and the window's ratios are
# taken against those calls: fuseg/eager is the mean of fuseg's calls over the mean of the eager
# calls among them; fuseg/Inductor is that over Inductor's same ratio in its own window. The
# window then holds a fifth fewer of the contestant's calls, and its builds get the gaps of four
# calls in five; eager's calls between fuseg's are what eager-then-fuseg callers run anyway.
# ``--eager-every 0`` measures as before (no eager call in a window; the ratios against eager's
# settled time and the other window).
#: every this many calls of a compiled contestant's window, one is eager's (0: none)
EAGER_EVERY = 5


def protocol_record(window_s: float, order: list[str], first: dict[str, float], windows: dict[str, list[float]],
                    settled: dict[str, float], extra: dict[str, dict[str, Any]] | None = None,
                    references: dict[str, list[float]] | None = None, eager_every: int | None = None) -> dict[str, Any]:
    """The protocol's fields (Note [the protocol]) from each contestant's first call (s), window
    (each call's s) and settled time (s); ``extra``: more fields per contestant (errors, builds);
    ``references``: per contestant, the eager calls made among its window's (Note [eager at the
    same moments]; one in ``eager_every``), against which its window's ratios are then taken."""
    out: dict[str, Any] = {"window_s": window_s, "order": list(order),
                           **({"eager_every": eager_every} if eager_every is not None else {})}
    eager = settled.get("eager")
    for c in order:
        entry: dict[str, Any] = dict((extra or {}).get(c, {}))
        if c in first:
            entry["first_call_s"] = first[c]
        ts = windows.get(c)
        if ts:
            entry["window"] = {"calls": len(ts), "elapsed_s": sum(ts), "mean_s": sum(ts) / len(ts),
                               "median_s": statistics.median(ts), "max_s": max(ts)}
            ref = (references or {}).get(c)
            if ref:
                entry["window"].update(eager_calls=len(ref), eager_mean_s=sum(ref) / len(ref))
                entry["window_vs_eager_same_moments"] = entry["window"]["mean_s"] / entry["window"]["eager_mean_s"]
            if eager:
                entry["window_vs_eager_settled"] = entry["window"]["mean_s"] / eager
        if c in settled:
            entry["settled_s"] = settled[c]
        out[c] = entry
    for theirs in ("eager", "inductor"):
        ours, them = out.get("fuseg", {}), out.get(theirs, {})
        ratios: dict[str, float] = {}
        if "first_call_s" in ours and them.get("first_call_s"):
            ratios["first_call"] = ours["first_call_s"] / them["first_call_s"]
        if "window" in ours:
            same = ours.get("window_vs_eager_same_moments")
            if same is not None and theirs == "eager":
                ratios["window"] = same
            elif same is not None and them.get("window_vs_eager_same_moments"):
                ratios["window"] = same / them["window_vs_eager_same_moments"]
            else:
                base = eager if theirs == "eager" else them.get("window", {}).get("mean_s")
                if base:
                    ratios["window"] = ours["window"]["mean_s"] / base
        if "settled_s" in ours and them.get("settled_s"):
            ratios["settled"] = ours["settled_s"] / them["settled_s"]
        if ratios:
            out[f"fuseg_vs_{theirs}"] = ratios
    return out


def protocol_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Over rows with ``protocol`` (and ``model``): each phase's median fuseg/eager and
    fuseg/Inductor, and the models whose window is slower than eager's settled time or whose
    settled time is slower than Inductor's."""
    def ratio(r: dict[str, Any], theirs: str, phase: str) -> float | None:
        return r["protocol"].get(f"fuseg_vs_{theirs}", {}).get(phase)

    out: dict[str, Any] = {"window_s": rows[0]["protocol"]["window_s"]}
    for theirs in ("eager", "inductor"):
        out[f"median_fuseg_vs_{theirs}"] = {}
        for phase in ("first_call", "window", "settled"):
            vals = [v for r in rows if (v := ratio(r, theirs, phase)) is not None]
            out[f"median_fuseg_vs_{theirs}"][phase] = statistics.median(vals) if vals else None
    out["window_slower_than_eager"] = [r["model"] for r in rows if (ratio(r, "eager", "window") or 0) > 1]
    out["settled_slower_than_eager"] = [r["model"] for r in rows if (ratio(r, "eager", "settled") or 0) > 1]
    out["settled_slower_than_inductor"] = [r["model"] for r in rows if (ratio(r, "inductor", "settled") or 0) > 1]
    return out


#: the compilers whose first calls are timed, alternating: fuseg as it is and with every build on
#: the caller's thread (what its first call cost before builds went to the background)
FIRST_CALL_BACKENDS = ("inductor", "fuseg", "fuseg-foreground")


def _first_call(name: str, backend: str) -> dict[str, Any]:
    """The first call of ``torch.compile(model, backend=...)`` in a fresh process with empty caches
    (Inductor's and ours): ``first_s``, its seconds; for fuseg also ``kernels_ready_s``, the seconds
    from that call's start until the kernels it started building in the background are built
    (Note [kernels built in the background]), and ``built_in_background``, how many programs
    did so. ``fuseg-foreground``: fuseg with every build on the caller's thread
    (FUSEG_BACKGROUND_BUILDS=0, as fuseg built programs of fixed sizes before 2026-11-27)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor"),
                   FUSEG_CACHE_DIR=os.path.join(tmp, "fuseg"))
        env.pop("FUSEG_BACKGROUND_BUILDS", None)  # fuseg's default, whatever the caller's environment says
        if backend == "fuseg-foreground":
            env["FUSEG_BACKGROUND_BUILDS"] = "0"
        fuseg = backend.startswith("fuseg")
        code = ("import json, sys, time, warnings, torch; warnings.filterwarnings('ignore');"
                "from perf.compiled import MODELS;"
                + ("from runtime.dynamo import registered_by_name; registered_by_name();" if fuseg else "")
                + f"m, a = MODELS[{name!r}]();"
                f"c = torch.compile(m, backend={'fuseg' if fuseg else backend!r});"
                "t0 = time.perf_counter();"
                "torch.no_grad().__enter__(); c(*a);"
                "r = {'first_s': time.perf_counter() - t0};"
                + ("from runtime.codegen.build import wait_for_background_builds;"
                   "from runtime.dynamo import STATS;"
                   "wait_for_background_builds(); r['kernels_ready_s'] = time.perf_counter() - t0;"
                   "r['built_in_background'] = STATS['built_in_background'];" if fuseg else "")
                + "print(json.dumps(r))")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=1800)
        if r.returncode != 0:
            raise RuntimeError(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}")
        return json.loads(r.stdout.strip().splitlines()[-1])


def _no_work_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """The "floor" variant's backend: the graph runs once, now; every call returns its outputs."""
    outputs = gm(*example_inputs)
    return lambda *args: outputs


def _compile(fn: Any, variant: str) -> tuple[Callable[..., Any], Any]:
    """``torch.compile`` of ``fn`` for a variant, and what to inspect afterwards (fuseg_graphs:
    its FusegCompiler)."""
    if variant == "fuseg_graphs":
        from runtime.dynamo import FusegCompiler, compile_with_aot

        compiler = FusegCompiler(cuda_graphs=True)  # what options={"cuda_graphs": True} makes
        return compile_alone(fn, backend=lambda gm, ex: compile_with_aot(compiler, gm, ex)), compiler
    kw: dict[str, Any] = {"inductor": {"backend": "inductor"},
                          "inductor_ro": {"backend": "inductor", "mode": "reduce-overhead"},
                          "fuseg": {"backend": "fuseg"},
                          "dynamo": {"backend": "eager"},  # the captured ops run as they are
                          "floor": {"backend": _no_work_backend}}[variant]  # no work at all
    return compile_alone(fn, **kw), None


def _graphs_record(compiler: Any) -> list[dict[str, Any]]:
    """Per program the fuseg_graphs variant compiled: whether it replayed, or why not."""
    out = []
    for p in compiler.compiled:
        g = getattr(p, "cuda_graph", None)
        out.append({"refused": getattr(p, "cuda_graph_refused", None) if g is None else g.refused,
                    "counts": None if g is None else dict(g.counts),
                    "last_fallback": None if g is None else g.last_fallback})
    return out


def _to(x: Any, device: str) -> Any:
    if isinstance(x, torch.nn.Module):
        return x.to(device)
    return x.to(device) if isinstance(x, torch.Tensor) else x


#: what ``--dtype`` takes: the dtype a model's parameters and floating inputs are cast to
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _cast(x: Any, dtype: torch.dtype) -> Any:
    if isinstance(x, torch.nn.Module):
        return x.to(dtype)
    return x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x


def load_model(name: str, device: str, dtype: str = "float32") -> tuple[Any, list[Any]]:
    """A model of ``MODELS`` and its inputs on ``device``, its parameters and floating inputs in
    ``dtype`` (a name of ``DTYPES``), dynamo's caches reset first."""
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    torch._dynamo.reset()
    fn, inputs = MODELS[name]()
    if dtype != "float32":
        fn, inputs = _cast(fn, DTYPES[dtype]), [_cast(t, DTYPES[dtype]) for t in inputs]
    return _to(fn, device), [_to(t, device) for t in inputs]


def first_call_fields(name: str, first_call: int) -> dict[str, Any]:
    """The first call of each of ``FIRST_CALL_BACKENDS``, ``first_call`` fresh processes each, the
    compilers alternating: the row's ``*_first_call_s`` (median), ``*_kernels_ready_s`` and ratios."""
    row: dict[str, Any] = {}
    runs: dict[str, list[float]] = {b: [] for b in FIRST_CALL_BACKENDS}
    ready: dict[str, list[float]] = {b: [] for b in FIRST_CALL_BACKENDS}
    for _ in range(first_call):  # the compilers alternate: the machine's drift hits each
        for backend in runs:
            if f"{backend}_first_call_error" in row:
                continue
            try:
                got = _first_call(name, backend)
                runs[backend].append(got["first_s"])
                if "kernels_ready_s" in got:
                    ready[backend].append(got["kernels_ready_s"])
                    row[f"{backend.replace('-', '_')}_built_in_background"] = got["built_in_background"]
            except Exception as e:  # noqa: BLE001 - recorded
                row[f"{backend}_first_call_error"] = str(e)[:300]
    for backend, ts in runs.items():
        key = backend.replace("-", "_")
        if ts and f"{backend}_first_call_error" not in row:
            row[f"{key}_first_call_s"] = statistics.median(ts)
            row[f"{key}_first_call_runs_s"] = ts
        if ready[backend] and f"{backend}_first_call_error" not in row:
            row[f"{key}_kernels_ready_s"] = statistics.median(ready[backend])
    if "fuseg_first_call_s" in row and "inductor_first_call_s" in row:
        row["first_call_vs_inductor"] = row["fuseg_first_call_s"] / row["inductor_first_call_s"]
        if "fuseg_kernels_ready_s" in row:
            row["kernels_ready_vs_inductor"] = row["fuseg_kernels_ready_s"] / row["inductor_first_call_s"]
        if "fuseg_foreground_first_call_s" in row:
            row["foreground_first_call_vs_inductor"] = (row["fuseg_foreground_first_call_s"]
                                                        / row["inductor_first_call_s"])
    return row


def bench_compiled(names: list[str], rounds: int = 5, calls: int = 20, first_call: int = 3,
                   progress: bool = True, device: str = "cpu", variants: tuple[str, ...] | None = None,
                   on_row: Callable[[list[dict[str, Any]]], None] | None = None) -> list[dict[str, Any]]:
    """``first_call``: fresh processes per compiler and model whose first calls are timed (the
    median is kept; 0: none; on the CPU only). ``on_row``: called with the rows so far after each
    model (a record written as the run goes)."""
    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else None
    rows: list[dict[str, Any]] = []
    for name in names:
        fn, inputs = load_model(name, device)
        row: dict[str, Any] = {"model": name, "held_out": name in HELD_OUT or name in UNSEEN, "set": _set_of(name),
                               "device": device}
        timed: dict[str, Callable[[], Any]] = {"eager": lambda f=fn, a=inputs: f(*a)}
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = fn(*inputs)
            graphs = None
            for v in variants or VARIANTS[device]:
                try:
                    c, inspect = _compile(fn, v)
                    row[f"{v}_max_abs_diff"] = _max_diff(c(*inputs), want)
                    if v.startswith("fuseg"):  # the steady state is the kernels' (Note [kernels built in the background])
                        wait_for_background_builds()  # (the first call ran torch where a kernel was not built yet:
                        row[f"{v}_max_abs_diff"] = max(row[f"{v}_max_abs_diff"], _max_diff(c(*inputs), want))  # its kernels too)
                    timed[v] = lambda c=c, a=inputs: c(*a)
                    graphs = inspect if v == "fuseg_graphs" else graphs
                except Exception as e:  # noqa: BLE001 - recorded: a compiler that fails is a result
                    row[f"{v}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            times: dict[str, list[float]] = {v: [] for v in timed}
            pipelined: dict[str, list[float]] = {v: [] for v in timed}
            for call in timed.values():  # warm-up
                for _ in range(3):
                    call()
            for _ in range(rounds):
                for v, call in timed.items():
                    for _ in range(calls):
                        t0 = time.perf_counter()
                        call()
                        if sync is not None:
                            sync()
                        times[v].append((time.perf_counter() - t0) * 1e3)
                    if sync is not None:  # back to back: host and device overlap
                        t0 = time.perf_counter()
                        for _ in range(calls):
                            call()
                        sync()
                        pipelined[v].append((time.perf_counter() - t0) * 1e3 / calls)
            if graphs is not None:
                row["fuseg_graphs_programs"] = _graphs_record(graphs)
        for v, ts in times.items():
            row[f"{v}_ms"] = statistics.median(ts)
            q = statistics.quantiles(ts, n=10)
            row[f"{v}_p10_ms"], row[f"{v}_p90_ms"] = q[0], q[-1]
            if pipelined[v]:
                row[f"{v}_pipelined_ms"] = statistics.median(pipelined[v])
        for v in ("dynamo", "floor"):
            if f"{v}_ms" in row:
                row[f"{v}_vs_eager"] = row[f"{v}_ms"] / row["eager_ms"]
        if "fuseg_ms" in row:
            row["fuseg_vs_eager"] = row["fuseg_ms"] / row["eager_ms"]
            if "inductor_ms" in row:
                row["fuseg_vs_inductor"] = row["fuseg_ms"] / row["inductor_ms"]
        for ours in ("fuseg", "fuseg_graphs"):  # the GPU's comparisons (issue 44)
            for theirs in ("inductor", "inductor_ro"):
                if ours == "fuseg" and theirs == "inductor":
                    continue
                if f"{ours}_ms" in row and f"{theirs}_ms" in row:
                    row[f"{ours}_vs_{theirs}"] = row[f"{ours}_ms"] / row[f"{theirs}_ms"]
        if "fuseg_graphs_ms" in row:
            row["fuseg_graphs_vs_eager"] = row["fuseg_graphs_ms"] / row["eager_ms"]
        if first_call and not cuda:
            row.update(first_call_fields(name, first_call))
        rows.append(row)
        del timed, fn, inputs
        if cuda:
            torch.cuda.empty_cache()
        if progress:
            print(_line(row), file=sys.stderr, flush=True)
        if on_row is not None:
            on_row(rows)
    return rows


def protocol_model(name: str, window: float, rounds: int = 5, calls: int = 20,
                   order: tuple[str, ...] = CONTESTANTS, dtype: str = "float32",
                   eager_every: int = EAGER_EVERY) -> dict[str, Any]:
    """Note [the protocol] for one model, in this process (``protocol_child``: in a fresh one with
    empty caches): a row with the settled keys of ``bench_compiled``'s rows and ``protocol``;
    ``eager_every``: Note [eager at the same moments] (0: no eager call in a window)."""
    from runtime.dynamo import registered_by_name

    registered_by_name()
    fn, inputs = load_model(name, "cpu", dtype)
    row: dict[str, Any] = {"model": name, "held_out": name in HELD_OUT or name in UNSEEN, "set": _set_of(name),
                           "device": "cpu", **({"dtype": dtype} if dtype != "float32" else {})}
    first: dict[str, float] = {}
    windows: dict[str, list[float]] = {}
    references: dict[str, list[float]] = {}
    extra: dict[str, dict[str, Any]] = {}
    timed: dict[str, Callable[[], Any]] = {}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.compile(lambda x: x + 1, backend="eager")(torch.ones(1))  # dynamo's own start-up, charged to no one
        torch._dynamo.reset()
        want = None
        for c in order:
            try:
                call = fn if c == "eager" else _compile(fn, c)[0]
                t0 = time.perf_counter()
                got = call(*inputs)
                first[c] = time.perf_counter() - t0
                if c == "eager":
                    want = got
                row[f"{c}_max_abs_diff"] = _max_diff(got, want)
                timed[c] = lambda f=call, a=inputs: f(*a)
                references[c] = []
                windows[c] = timed_window(timed[c], window, (lambda: fn(*inputs)) if c != "eager" and eager_every else None,
                                          eager_every, references[c])
                if c == "fuseg":  # its builds end before the next contestant starts (they would slow it)
                    from runtime.codegen.build import background_builds_under_way

                    extra[c] = {"builds_under_way_after_window": background_builds_under_way()}
                    t0 = time.perf_counter()
                    wait_for_background_builds()
                    extra[c]["waited_for_builds_s"] = time.perf_counter() - t0
                    row["fuseg_max_abs_diff"] = max(row["fuseg_max_abs_diff"], _max_diff(call(*inputs), want))
            except Exception as e:  # noqa: BLE001 - recorded: a compiler that fails is a result
                row[f"{c}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
                extra.setdefault(c, {})["error"] = row[f"{c}_error"]
                timed.pop(c, None)
        times: dict[str, list[float]] = {c: [] for c in timed}
        for c in timed:  # warm-up
            for _ in range(3):
                timed[c]()
        for r in range(rounds):
            for c in (list(timed) if r % 2 == 0 else list(reversed(timed))):
                for _ in range(calls):
                    t0 = time.perf_counter()
                    timed[c]()
                    times[c].append(time.perf_counter() - t0)
    settled = {c: statistics.median(ts) for c, ts in times.items() if ts}
    for c, ts in times.items():
        if not ts:
            continue
        row[f"{c}_ms"] = settled[c] * 1e3
        if len(ts) > 1:
            q = statistics.quantiles(ts, n=10, method="inclusive")
            row[f"{c}_p10_ms"], row[f"{c}_p90_ms"] = q[0] * 1e3, q[-1] * 1e3
    for theirs in ("eager", "inductor"):
        if "fuseg_ms" in row and f"{theirs}_ms" in row:
            row[f"fuseg_vs_{theirs}"] = row["fuseg_ms"] / row[f"{theirs}_ms"]
    row["protocol"] = protocol_record(window, list(order), first, windows, settled, extra, references, eager_every)
    first_ratio = row["protocol"].get("fuseg_vs_inductor", {}).get("first_call")
    if first_ratio is not None:  # (the summary's and the table's first call: this process's, cold caches)
        row["first_call_vs_inductor"] = first_ratio
    return row


def protocol_child(name: str, window: float, rounds: int, calls: int, order: tuple[str, ...],
                   dtype: str = "float32", eager_every: int = EAGER_EVERY) -> dict[str, Any]:
    """``protocol_model`` in a fresh process with empty Inductor and fuseg caches (fuseg's
    background builds as a user has them, whatever the caller's environment says)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor"),
                   FUSEG_CACHE_DIR=os.path.join(tmp, "fuseg"), PYTHONWARNINGS="ignore")
        env.pop("FUSEG_BACKGROUND_BUILDS", None)
        code = ("import json, sys; from perf.compiled import protocol_model;"
                "print(json.dumps(protocol_model(sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]),"
                " tuple(sys.argv[5].split(',')), sys.argv[6], int(sys.argv[7]))))")
        r = subprocess.run([sys.executable, "-c", code, name, str(window), str(rounds), str(calls), ",".join(order), dtype,
                            str(eager_every)],
                           capture_output=True, text=True, env=env, timeout=3600)
        if r.returncode != 0:
            tail = r.stderr.strip().splitlines()
            return {"model": name, "held_out": name in HELD_OUT or name in UNSEEN, "set": _set_of(name),
                    "error": tail[-1] if tail else f"exit {r.returncode}"}
        return json.loads(r.stdout.strip().splitlines()[-1])


def bench_protocol(names: list[str], window: float, rounds: int = 5, calls: int = 20, first_call: int = 0,
                   progress: bool = True, on_row: Callable[[list[dict[str, Any]]], None] | None = None,
                   dtype: str = "float32", eager_every: int = EAGER_EVERY) -> list[dict[str, Any]]:
    """Note [the protocol] per model, each in a fresh process; with ``first_call``, the
    fresh-process first calls of ``bench_compiled`` added to each row."""
    rows: list[dict[str, Any]] = []
    for name, order in zip(names, protocol_orders(len(names))):
        row = protocol_child(name, window, rounds, calls, order, dtype, eager_every)
        if first_call and "error" not in row:
            row.update(first_call_fields(name, first_call))
        rows.append(row)
        if progress:
            print(_line(row), file=sys.stderr, flush=True)
        if on_row is not None:
            on_row(rows)
    return rows


def protocol_orders(n: int) -> list[tuple[str, ...]]:
    """Eager first; Inductor and fuseg swap places from one model to the next (the one made
    second in a process finds its imports and the compiler's files warm)."""
    return [("eager", "inductor", "fuseg") if k % 2 == 0 else ("eager", "fuseg", "inductor") for k in range(n)]


def _protocol_line(row: dict[str, Any]) -> str:
    p = row.get("protocol", {})
    parts = [f"{row['model']:>14}"]
    for c in p.get("order", ()):
        e = p.get(c, {})
        if "error" in e:
            parts.append(f"{c} failed")
            continue
        w = e.get("window", {})
        parts.append(f"{c} first {e.get('first_call_s', math.nan):.2f} s, {p['window_s']:g} s window "
                     f"{w.get('calls', 0)} calls mean {1e3 * w.get('mean_s', math.nan):.3f} ms, "
                     f"settled {1e3 * e.get('settled_s', math.nan):.3f} ms")
    for t in ("eager", "inductor"):
        r = p.get(f"fuseg_vs_{t}", {})
        parts.append(f"fuseg/{t} " + ", ".join(f"{k} {v:.2f}" for k, v in r.items()))
    return "  ".join(parts) if "error" not in row else f"{row['model']:>14}  failed: {row['error']}"


def _line(row: dict[str, Any]) -> str:
    if "protocol" in row or "error" in row:
        return _protocol_line(row)

    def f(k: str, fmt: str = "{:.3f}") -> str:
        return fmt.format(row[k]) if k in row else "-"
    return (f"{row['model']:>14}  eager {f('eager_ms')} ms  inductor {f('inductor_ms')}  fuseg {f('fuseg_ms')}  "
            f"floor/eager {f('floor_vs_eager', '{:.2f}')}  dynamo/eager {f('dynamo_vs_eager', '{:.2f}')}  fuseg/eager {f('fuseg_vs_eager', '{:.2f}')}  fuseg/inductor {f('fuseg_vs_inductor', '{:.2f}')}  "
            f"first call {f('fuseg_first_call_s', '{:.1f}')} s (kernels ready {f('fuseg_kernels_ready_s', '{:.1f}')} s, "
            f"all built first {f('fuseg_foreground_first_call_s', '{:.1f}')} s) vs {f('inductor_first_call_s', '{:.1f}')} s"
            + (f"  inductor_ro {f('inductor_ro_ms')}  fuseg_graphs {f('fuseg_graphs_ms')}  "
               f"graphs/inductor {f('fuseg_graphs_vs_inductor', '{:.2f}')}  "
               f"graphs/inductor_ro {f('fuseg_graphs_vs_inductor_ro', '{:.2f}')}"
               if "fuseg_graphs_ms" in row or "inductor_ro_ms" in row else ""))


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def med(key: str, which: list[dict[str, Any]]) -> float | None:
        vals = [r[key] for r in which if key in r]
        return statistics.median(vals) if vals else None
    out: dict[str, Any] = {}
    def of(part: str) -> list[dict[str, Any]]:
        return [r for r in rows if r.get("set", "held_out" if r["held_out"] else "zoo") == part]
    for part, which in (("all", rows), ("zoo", of("zoo")), ("held_out", of("held_out")), ("unseen", of("unseen"))):
        if part == "unseen" and not which:
            continue
        out[part] = {"models": len(which),
                     "median_fuseg_vs_eager": med("fuseg_vs_eager", which),
                     "median_fuseg_vs_inductor": med("fuseg_vs_inductor", which),
                     "slower_than_eager": [r["model"] for r in which if r.get("fuseg_vs_eager", 0) > 1],
                     # where running the captured ops as they are is slower than eager
                     "dynamo_alone_slower_than_eager": [r["model"] for r in which if r.get("dynamo_vs_eager", 0) > 1],
                     # where torch.compile doing no work at all is: no backend can beat eager there
                     "floor_slower_than_eager": [r["model"] for r in which if r.get("floor_vs_eager", 0) > 1],
                     "slower_than_eager_above_floor": [r["model"] for r in which if r.get("fuseg_vs_eager", 0) > 1
                                                       and r.get("floor_vs_eager", 0) <= 1],
                     "median_first_call_vs_inductor": med("first_call_vs_inductor", which),
                     "max_first_call_vs_inductor": max((r["first_call_vs_inductor"] for r in which
                                                        if "first_call_vs_inductor" in r), default=None),
                     # until the kernels built in the background are built; every build first
                     "median_kernels_ready_vs_inductor": med("kernels_ready_vs_inductor", which),
                     "median_foreground_first_call_vs_inductor": med("foreground_first_call_vs_inductor", which)}
        if any("fuseg_graphs_ms" in r or "inductor_ro_ms" in r for r in which):  # a GPU run (issue 44's goals)
            out[part].update({
                "median_fuseg_graphs_vs_inductor": med("fuseg_graphs_vs_inductor", which),
                "median_fuseg_graphs_vs_inductor_ro": med("fuseg_graphs_vs_inductor_ro", which),
                "fuseg_graphs_not_faster_than_inductor": [r["model"] for r in which
                                                          if r.get("fuseg_graphs_vs_inductor", 0) >= 1],
                "fuseg_graphs_above_1.1x_inductor_ro": [r["model"] for r in which
                                                         if r.get("fuseg_graphs_vs_inductor_ro", 0) > 1.1]})
        protocol = [r for r in which if "protocol" in r]
        if protocol:  # Note [the protocol]
            out[part]["protocol"] = protocol_summary(protocol)
    return out


def plot(rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if "fuseg_vs_eager" in r]
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(rows)), 4))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["fuseg_vs_eager"] for r in rows], 0.4, label="fuseg / eager")
    ax.bar([x + 0.2 for x in xs], [r.get("fuseg_vs_inductor", float("nan")) for r in rows], 0.4,
           label="fuseg / inductor")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(list(xs), [r["model"] for r in rows], rotation=60, ha="right")
    ax.set_ylabel("time ratio (lower is faster)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", help=f"default: the --set's models; known: {', '.join(MODELS)}")
    p.add_argument("--set", choices=("default", "unseen", "all", "gpu"), default=None,
                   help="the zoo and HELD_OUT (default on the CPU), UNSEEN, both, or GPU (default with --device cuda)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--first-calls", type=int, default=None,
                   help="cold first calls per compiler and model in fresh processes (median kept; default 3, "
                        "none with --protocol)")
    p.add_argument("--no-first-call", action="store_true")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--variants", help=f"comma-separated, beside eager (default: {VARIANTS})")
    p.add_argument("--protocol", action="store_true",
                   help="first call, the --window after it and the settled state of eager, Inductor and fuseg, one "
                        "fresh process per model (Note [the protocol]; CPU only)")
    p.add_argument("--window", type=float, default=30.0,
                   help="with --protocol: seconds of calls after each contestant's first call (per model)")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="float32",
                   help="the models' parameters and floating inputs in this dtype (with --protocol; default float32)")
    p.add_argument("--eager-every", type=int, default=EAGER_EVERY,
                   help=f"with --protocol: every N-th call of a compiled contestant's window is eager's, the window's "
                        f"ratios taken against those (Note [eager at the same moments]; default {EAGER_EVERY}, 0: none)")
    p.add_argument("--out", help="the record, written again after every model")
    p.add_argument("--plot")
    a = p.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device here")
    if a.protocol and (a.device != "cpu" or a.variants):
        p.error("--protocol: on the CPU, with its own contestants (eager, inductor, fuseg)")
    if a.dtype != "float32" and not a.protocol:
        p.error("--dtype: with --protocol")
    if a.window <= 0:
        p.error("--window must be positive")
    if a.eager_every < 0 or a.eager_every == 1:
        p.error("--eager-every: 0 (none) or at least 2 (a call of the contestant's own between two of eager's)")
    first_calls = 0 if a.no_first_call or a.device == "cuda" else (
        a.first_calls if a.first_calls is not None else 0 if a.protocol else 3)
    if a.dtype != "float32":  # (the fresh-process first calls are float32's; the protocol times its own)
        first_calls = 0
    sets = {"default": list(DEFAULT), "unseen": list(UNSEEN), "all": list(MODELS), "gpu": GPU}
    names = a.models or sets[a.set or ("gpu" if a.device == "cuda" else "default")]
    variants = tuple(v for v in a.variants.split(",") if v) if a.variants else (
        CONTESTANTS[1:] if a.protocol else VARIANTS[a.device])
    unknown = set(variants) - set(VARIANTS["cpu"]) - set(VARIANTS["cuda"])
    if unknown:
        p.error(f"unknown variants {sorted(unknown)}")
    head = {"benchmark": f"compiled models, {a.device}", "environment": environment(a.device),
            "threads": torch.get_num_threads(), "rounds": a.rounds, "calls": a.calls, "first_calls": first_calls,
            "variants": ["eager", *variants], **({"protocol_window_s": a.window} if a.protocol else {}),
            **({"dtype": a.dtype} if a.dtype != "float32" else {}),
            **({"eager_every": a.eager_every} if a.protocol else {}),
            "command": "python -m perf.compiled " + " ".join(argv if argv is not None else sys.argv[1:])}

    def record(rows: list[dict[str, Any]]) -> dict[str, Any]:
        result = {**head, "models_asked": names, "summary": summary(rows), "rows": rows}
        if a.out:
            with open(a.out, "w") as f:
                json.dump(result, f, indent=1)
                f.write("\n")
        return result

    if a.protocol:
        rows = bench_protocol(names, a.window, a.rounds, a.calls, first_calls, on_row=record, dtype=a.dtype,
                              eager_every=a.eager_every)
    else:
        rows = bench_compiled(names, a.rounds, a.calls, first_calls, device=a.device, variants=variants, on_row=record)
    result = record(rows)
    print(json.dumps(result["summary"], indent=1))
    if a.plot:
        plot(result["rows"], a.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())

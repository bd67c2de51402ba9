"""fuseg's decisions in torch's logs (``TORCH_LOGS=+fuseg``) and traces (``TORCH_TRACE=dir``).

Note [fuseg in torch's logs]: ``torch.compile(backend="fuseg")`` builds a program per graph on
the graph's first call. Each built program is logged on the ``fuseg`` logger, which torch's
logging configures like its own (``TORCH_LOGS=fuseg``: INFO, ``+fuseg``: DEBUG; the top-level
module ``fuseg.py`` makes the name valid when torch reads the variable at import):
- INFO: one line per program: the graph, specialized or a symbolic plan, segments, kernels,
  metadata ops, and the backend that runs each kernel segment (counted); a graph that could not
  be planned symbolically, and why. On ``fuseg.thresholds`` (runtime/codegen/calibrate.py): the
  thread thresholds measured and kept, a kept file found disturbed and measured again, or a
  measurement that stayed "disturbed (not kept)" (Note [a disturbed measurement]).
- DEBUG: each segment (kind, ops, backend, the backends passed over and why), each cut between
  segments with its reason, a symbolic plan's ranges and conditions, and the program's source.
Under ``TORCH_TRACE`` each program is also written as two structured artifacts of the frame that
dynamo compiled (``trace_structured``, so ``tlparse`` lists them beside dynamo's graphs):
``fuseg_segmentation`` (JSON: ``segmentation_to_dict`` with each segment's backend and the
plan's conditions) and ``fuseg_program`` (the program's generated source, and its checks).
Dynamo's trace id (frame, compile and attempt) is read when AOTAutograd hands over the graph,
inside dynamo's compile, and set again around the logging at the first call, which comes after
the compile has ended: so the lines carry the frame's ``[0/1]`` and tlparse files the artifacts
with that frame's graphs.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch

from segmenter.partition.explain import describe_sizes, segmentation_to_dict

__all__ = ["current_trace_id", "log", "log_program", "log_specialized", "register"]

#: under the ``fuseg`` logger that ``TORCH_LOGS=fuseg`` configures
log = logging.getLogger("fuseg.compile")


def register() -> None:
    """``fuseg`` as a log name of torch's logging (``torch._logging.set_logs`` and ``TORCH_LOGS=help``
    list it); torch registers it itself where ``TORCH_LOGS`` named it at import."""
    from torch._logging._internal import log_registry, register_log

    if not log_registry.is_log("fuseg"):
        register_log("fuseg", ["fuseg"])


def current_trace_id() -> Any:
    """Dynamo's trace id of the frame it is compiling (``0/1``, attempt 0), or None outside a compile."""
    try:
        return torch._guards.CompileContext.current_trace_id()
    except Exception:  # noqa: BLE001 - a torch without it: logs without ids
        return None


@contextlib.contextmanager
def _in_frame(trace_id: Any) -> Iterator[None]:
    """Dynamo's compile context of ``trace_id`` set again, where none is set now."""
    guards = torch._guards
    if trace_id is None or guards.CompileContext.try_get() is not None:
        yield
        return
    ctx = guards.CompileContext(trace_id.compile_id)
    ctx.attempt = trace_id.attempt
    with guards.compile_context(ctx):
        yield


def _tracing() -> bool:
    from torch._logging._internal import trace_log

    return bool(trace_log.handlers)


def _backend_of(program: Any, index: int) -> str:
    seg = program.plan.segments[index]
    if not seg.launches_kernel:
        return "metadata"
    return program.backend_of.get(index, "torch")


def log_program(program: Any, how: str, trace_id: Any = None) -> None:
    """Log one built program (Note [fuseg in torch's logs]); ``how``: "symbolic plan" or
    "specialized"; ``trace_id``: ``current_trace_id()`` when the graph was handed over."""
    trace = _tracing()
    if not log.isEnabledFor(logging.INFO) and not trace:
        return
    with _in_frame(trace_id):
        _log_program(program, how, trace)


def _log_program(program: Any, how: str, trace: bool) -> None:
    plan, graph = program.plan, program.graph
    st = plan.stats()
    backends = Counter(_backend_of(program, s.index) for s in plan.segments if s.launches_kernel)
    conditions = describe_sizes(program.sizes) if program.sizes is not None else []
    log.info("%s (%s, alias mode %s): %d nodes -> %d segments, %d kernels, %d metadata, %d opaque; backends: %s",
             graph.name, how, plan.alias_mode, len(graph.nodes), st["segments"], st["kernels"],
             st["metadata"], st["opaque"], ", ".join(f"{b} x{n}" for b, n in sorted(backends.items())) or "-")
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s", _details(program, conditions))
    if trace:
        _trace(program, how, conditions)


def _details(program: Any, conditions: list[str]) -> str:
    plan = program.plan
    lines = [f"{program.graph.name}: segments"]
    for s in plan.segments:
        ops = ", ".join(n.op.removeprefix("aten.") for n in s.nodes)
        lines.append(f"  {s.name} {s.kind.name} on {_backend_of(program, s.index)}: [{ops}]")
        for name, why in program.passed_over.get(s.index, ()):
            lines.append(f"      passed over {name}: {why}")
    lines.append("cuts (value: producer -> consumer: why)")
    lines += [f"  %{b.value}: s{b.producer} -> s{b.consumer}: {b.reason}" for b in plan.boundaries] or ["  none"]
    lines += conditions
    lines += ["program source:", program.source.rstrip()]
    return "\n".join(lines)


def _trace(program: Any, how: str, conditions: list[str]) -> None:
    from torch._logging import trace_structured

    def segmentation() -> dict[str, Any]:
        record = segmentation_to_dict(program.plan)
        record["how"] = how
        record["conditions"] = conditions
        for s in record["segments"]:
            s["backend"] = _backend_of(program, s["index"])
            s["passed_over"] = [list(p) for p in program.passed_over.get(s["index"], ())]
        return record

    def source() -> str:
        check = getattr(program, "check_source", None)
        head = f"# {program.graph.name} ({how})\n"
        return head + program.source + (f"\n\n# the plan's check (Note [symbolic plans])\n{check}" if check else "")

    for name, encoding, payload in (("fuseg_segmentation", "json", segmentation), ("fuseg_program", "string", source)):
        trace_structured("artifact", metadata_fn=lambda name=name, encoding=encoding: {"name": name, "encoding": encoding},
                         payload_fn=payload)


def log_specialized(graph: str, why: str, trace_id: Any = None) -> None:
    """A graph with symbolic sizes specialized per shape instead of planned symbolically."""
    with _in_frame(trace_id):
        log.info("%s: specialized per shape, not planned symbolically: %s", graph, why)

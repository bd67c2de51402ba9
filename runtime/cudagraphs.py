"""CUDA graphs for compiled programs of static shapes: a call's launches captured once, replayed.

Note [CUDA graphs of a program]: a compiled program's call is a fixed sequence of launches
(CuPy kernels on torch's current stream, cuBLAS and other ATen ops, views), so on a GPU its
host time (~30 us for one kernel, more for a transformer's dozens) can be paid once: the launches
are captured into a ``torch.cuda.CUDAGraph`` and each later call is one replay. Opt-in:
``torch.compile(model, backend="fuseg", options={"cuda_graphs": True})``, or
``use_cuda_graphs(program)``. What it does, per program:

    refused?   capture_refusal: symbolic sizes, not on CUDA, an output a view of an input or of
               another output, a value on another device, an op that synchronizes with the host,
               draws random numbers or makes an output whose size depends on values (op tags)
    call 1     warm-up: the program runs on the capture stream (lazy initializations, e.g. a
               stream's cuBLAS workspace, happen outside any capture)
    call 2     capture: the program is recorded (nothing runs), then replayed once; the inputs'
               data pointers are recorded
    call 3...  replay, where every input's data pointer is the recorded one; the inputs' layouts,
               storages and a plain call (no dispatch mode, no autograd) are checked by the
               program's own entry before, as for any call (Note [one entry])
    moved      an input at another address (a new tensor): the program runs uncaptured; after
               ``GIVE_UP_AFTER`` such calls in a row the graph is released and the program no
               longer replays (a caller that passes fresh tensors gains nothing from it)

Another shape or layout never reaches the graph: the program's entry refuses it and the
``torch.compile`` backend compiles (or finds) another program for it, with a graph of its own.

Mutated inputs: the program writes their final values into them (in place or by ``copy_``),
on the device, inside the captured region; a replay writes them again at the recorded
addresses, which are the inputs' (the pointer guard). So every call updates them once.

Outputs: a replay writes the same static buffers (the graph's private memory pool) every time,
so a caller who keeps one call's outputs would see them overwritten by the next call. Inductor's
``mode="reduce-overhead"`` hands the static buffers out and raises if one is read after being
overwritten. Here each output is copied out after the replay (one device copy per output, on
the caller's stream, in the output's own layout): the caller owns what it gets, as with the
uncaptured program. Tiny programs pay a few microseconds for it; programs with big outputs pay
a copy of them.

Streams: the replay runs on the caller's current stream; a call on another stream than the
last replay's first waits for that one (the graph's buffers are shared by all its replays).
A call made while the caller's stream is itself being captured runs the program uncaptured
(it joins the caller's graph).

Memory: each captured program keeps its private pool (its intermediates and outputs) for as
long as it lives. Capturing costs one ``torch.cuda.graph`` (a device synchronize and an
``empty_cache``) per program.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from segmenter import SegmentedFusion, SegmentKind
from segmenter.ir.graph import FusionGraph, Node, iter_value_refs
from segmenter.ir.ops import resolve_op

from .codegen.source.index import dense_strides

__all__ = ["GIVE_UP_AFTER", "WARMUP_CALLS", "Capture", "CudaCapture", "GraphedCalls", "capture_refusal",
           "node_refusal", "plan_refusal", "use_cuda_graphs"]

#: calls run uncaptured before the capture (lazy initializations happen there)
WARMUP_CALLS = 1
#: calls in a row with an input at another address after which the graph is released
GIVE_UP_AFTER = 8

#: indexing ops that synchronize only for a bool (mask) index (which ``index_put`` is not tagged for)
_INDEXING = frozenset({"aten.index.Tensor", "aten._unsafe_index.Tensor", "aten.index_put.default",
                       "aten.index_put_.default", "aten._unsafe_index_put.default"})


def _reads_a_value(op: torch._ops.OpOverload) -> bool:
    """Whether ``op`` returns a number read from a tensor's data (a bool, a float, a Scalar):
    the host waits for the device. (An int it returns is a size, as flash attention's.)"""
    host = (torch.BoolType, torch.FloatType, torch.NumberType, torch.ComplexType)
    for r in op._schema.returns:
        t = r.type
        if isinstance(t, torch.OptionalType):
            t = t.getElementType()
        if isinstance(t, torch.ListType):
            t = t.getElementType()
        if isinstance(t, host):
            return True
    return False


def _argument(node: Node, op: torch._ops.OpOverload, name: str) -> Any:
    """The value ``node`` passes for ``op``'s argument ``name`` (its default where not passed)."""
    kwargs = node.kwargs_dict
    for i, a in enumerate(op._schema.arguments):
        if a.name == name:
            if name in kwargs:
                return kwargs[name]
            return node.args[i] if i < len(node.args) else a.default_value
    raise KeyError(name)


def _without_dropout(node: Node, op: torch._ops.OpOverload) -> bool:
    """A random op that draws nothing here: attention with ``dropout_p`` 0 (what SDPA becomes
    on CUDA, tagged random for its dropout), dropout not in training."""
    names = {a.name for a in op._schema.arguments}
    if "dropout_p" in names:
        return _argument(node, op, "dropout_p") == 0
    if node.op == "aten.native_dropout.default":
        return _argument(node, op, "train") is False
    return False


def node_refusal(node: Node, graph: FusionGraph) -> str | None:
    """Why ``node``, run on ATen inside a captured call, could break the capture or a replay;
    None where it cannot. From torch's own op tags where torch knows."""
    op = resolve_op(node.op, checked=False)
    if not isinstance(op, torch._ops.OpOverload):
        return "not an ATen op (its launches are unknown)"
    if op.namespace not in ("aten", "prims"):
        return "a custom op (it may run on the host or wait for the device)"
    tags = op.tags
    unsafe = getattr(torch.Tag, "cudagraph_unsafe", None)
    if unsafe is not None and unsafe in tags:
        return "torch marks it unsafe in CUDA graphs"
    if torch.Tag.nondeterministic_seeded in tags and not _without_dropout(node, op):
        return "it draws random numbers (a replay would not draw the numbers eager draws for a seed)"
    if torch.Tag.data_dependent_output in tags:
        return "its result is read on the host (a synchronization)"
    if node.op in _INDEXING:  # tagged or not, a mask index is found by the device's nonzero
        indices = [r.name for r in iter_value_refs(node.args[1])] if len(node.args) > 1 else []
        if any(graph.metas[v].dtype in (torch.bool, torch.uint8) for v in indices):
            return "it indexes by a mask (turned into indices on the host: a synchronization)"
    elif torch.Tag.dynamic_output_shape in tags:
        return "the size of its output depends on values (a synchronization)"
    if _reads_a_value(op):
        return "it returns a number read from a tensor (a synchronization)"
    return None


def plan_refusal(plan: SegmentedFusion, device_type: str = "cuda", skip: frozenset[int] = frozenset()) -> str | None:
    """Why a program of ``plan`` on ``device_type`` cannot be captured as one graph, or None.
    ``skip``: segments that do not run at a call (folded when compiled)."""
    g = plan.graph
    if g.scalar_outputs:
        return "an output is handed back as a number (read on the host)"
    if any(a is not None for a in g.output_aliases):
        return "an output is a view of an input or of another output (its storage is not the program's)"
    if any(i.final_layout is not None for i in g.inputs):
        return "an input's layout changes (set on the host after the call)"
    for v, m in g.metas.items():
        if m.device_type != device_type:
            return f"value {v!r} is on {m.device}, not {device_type}"
    for seg in plan.segments:
        if seg.index in skip or seg.kind == SegmentKind.METADATA:
            continue
        for node in seg.nodes:
            why = node_refusal(node, g)
            if why is not None:
                return f"segment {seg.index}: {node.op}: {why}"
    return None


def capture_refusal(program: Any, device_type: str = "cuda") -> str | None:
    """Why ``program`` (a CompiledProgram) is not captured into a CUDA graph, or None."""
    if program.sizes is not None:
        return "symbolic sizes (a graph is made for one shape)"
    if program.ctx.device.type != device_type:
        return f"the program runs on {program.ctx.device.type}, not {device_type}"
    return plan_refusal(program.plan, device_type, program.folded)


class Capture(Protocol):
    """How calls are warmed up and captured: ``CudaCapture`` on a GPU (tests give a stand-in)."""

    device_type: str

    def warm(self, fn: Callable[..., list[torch.Tensor]], args: Sequence[torch.Tensor]) -> list[torch.Tensor]: ...

    def capture(self, fn: Callable[..., list[torch.Tensor]], args: Sequence[torch.Tensor],
                ) -> tuple[Callable[[], None], list[torch.Tensor]]: ...

    def capturing(self) -> bool: ...

    def stream(self) -> int: ...

    def wait_for(self, stream: int) -> None: ...


_CAPTURE_STREAMS: dict[int, Any] = {}


class CudaCapture:
    """``torch.cuda.graph`` on a stream of our own per device, where the warm-up runs too (as
    torch's documentation advises: lazy per-stream setup happens before the capture)."""

    device_type = "cuda"

    def __init__(self, device: torch.device) -> None:
        self.index = device.index if device.index is not None else torch.cuda.current_device()
        self._raw_stream = torch._C._cuda_getCurrentRawStream

    def _side(self) -> Any:
        s = _CAPTURE_STREAMS.get(self.index)
        if s is None:
            s = _CAPTURE_STREAMS[self.index] = torch.cuda.Stream(self.index)
        return s

    def warm(self, fn: Callable[..., list[torch.Tensor]], args: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        side, caller = self._side(), torch.cuda.current_stream(self.index)
        side.wait_stream(caller)
        with torch.cuda.device(self.index), torch.cuda.stream(side):
            outs = fn(*args)
        caller.wait_stream(side)
        for o in outs:  # made on the side stream, used on the caller's: not reused before that is done
            if isinstance(o, torch.Tensor) and o.is_cuda:
                o.record_stream(caller)
        return outs

    def capture(self, fn: Callable[..., list[torch.Tensor]], args: Sequence[torch.Tensor],
                ) -> tuple[Callable[[], None], list[torch.Tensor]]:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.device(self.index), torch.cuda.graph(graph, stream=self._side(),
                                                              capture_error_mode="thread_local"):
            static = fn(*args)
        return graph.replay, static

    def capturing(self) -> bool:
        return torch.cuda.is_current_stream_capturing()

    def stream(self) -> int:
        return self._raw_stream(self.index)

    def wait_for(self, stream: int) -> None:
        torch.cuda.current_stream(self.index).wait_stream(torch.cuda.ExternalStream(stream, device=self.index))


def _copier(t: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """How a static output is copied out in its own layout: ``clone`` keeps the strides of a dense
    tensor; anything else (an offset, gaps, a stride 0) gets a copy of its whole storage."""
    shape, stride = tuple(t.shape), t.stride()
    dense = (t.storage_offset() == 0 and dense_strides(shape, stride) == stride
             and t.untyped_storage().nbytes() == t.numel() * t.element_size())
    return torch.Tensor.clone if dense else _copy_storage


def _copy_storage(t: torch.Tensor) -> torch.Tensor:
    return torch.empty((0,), dtype=t.dtype, device=t.device).set_(
        t.untyped_storage().clone(), t.storage_offset(), t.size(), t.stride())


_data_ptr = torch.Tensor.data_ptr


class GraphedCalls:
    """The fast variant of a program (``fn``), warmed up, captured and replayed (Note [CUDA
    graphs of a program]). Called with inputs the program's entry has checked."""

    def __init__(self, fn: Callable[..., list[torch.Tensor]], capture: Capture, warmup: int = WARMUP_CALLS) -> None:
        self.fn, self.capture = fn, capture
        self.warmup = warmup
        #: calls per path: warm-up, captured, replayed, moved (an input elsewhere: run uncaptured),
        #: nested (the caller was capturing), released (after the graph was given up)
        self.counts = dict.fromkeys(("warm-up", "captured", "replayed", "moved", "nested", "released"), 0)
        #: why the graph was given up or never made (None while it is in use)
        self.refused: str | None = None
        #: the last call that could not replay, and why
        self.last_fallback: str | None = None
        self._replay: Callable[[], None] | None = None
        self._static: list[torch.Tensor] = []
        self._copies: list[Callable[[torch.Tensor], torch.Tensor]] = []
        self._pointers: tuple[int, ...] = ()
        self._stream = 0
        self._misses = 0

    def __call__(self, *args: torch.Tensor) -> list[torch.Tensor]:
        replay = self._replay
        if replay is not None and tuple(map(_data_ptr, args)) == self._pointers and not self.capture.capturing():
            stream = self.capture.stream()
            if stream != self._stream:  # the last replay's buffers are this one's: wait for it
                self.capture.wait_for(self._stream)
                self._stream = stream
            replay()
            self.counts["replayed"] += 1
            self._misses = 0
            return [copy(t) for copy, t in zip(self._copies, self._static)]
        return self._not_replayed(args)

    def _not_replayed(self, args: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
        if self.capture.capturing():
            self.counts["nested"] += 1
            self.last_fallback = "the caller's stream is being captured"
            return self.fn(*args)
        if self._replay is not None:
            return self._moved(args)
        if self.refused is not None:
            self.counts["released"] += 1
            return self.fn(*args)
        if self.counts["warm-up"] < self.warmup:
            self.counts["warm-up"] += 1
            return self.capture.warm(self.fn, args)
        return self._capture(args)

    def _moved(self, args: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
        moved = [i for i, (t, p) in enumerate(zip(args, self._pointers)) if _data_ptr(t) != p]
        self.counts["moved"] += 1
        self._misses += 1
        self.last_fallback = f"inputs {moved} are not where they were captured"
        if self._misses >= GIVE_UP_AFTER:
            self.release(f"inputs moved on {self._misses} calls in a row (last: {moved})")
        return self.fn(*args)

    def _capture(self, args: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
        try:
            replay, static = self.capture.capture(self.fn, args)
        except Exception as e:  # noqa: BLE001 - a capture that fails (an op that synchronizes): run uncaptured
            self.release(f"the capture failed: {type(e).__name__}: {str(e).strip()[:300]}")
            return self.fn(*args)  # nothing ran while capturing
        bits = [i for i, t in enumerate(static) if not isinstance(t, torch.Tensor) or t.is_conj() or t.is_neg()]
        if bits:
            self.release(f"outputs {bits} are not tensors or carry a conjugate or negative bit")
            return self.fn(*args)
        self._replay, self._static = replay, list(static)
        self._copies = [_copier(t) for t in static]
        self._pointers = tuple(map(_data_ptr, args))
        self._stream = self.capture.stream()
        self.counts["captured"] += 1
        replay()  # the capture ran nothing: this call's work
        return [copy(t) for copy, t in zip(self._copies, self._static)]

    def release(self, why: str) -> None:
        """Give the graph up (its memory pool goes with it); the program runs uncaptured."""
        self.refused = why
        self._replay, self._static, self._copies, self._pointers = None, [], [], ()


def use_cuda_graphs(program: Any, capture: Capture | None = None) -> GraphedCalls | None:
    """Have ``program``'s plain calls (a CompiledProgram's fast variant, Note [fast and safe
    programs]) captured and replayed (Note [CUDA graphs of a program]). Returns the
    ``GraphedCalls`` (also ``program.cuda_graph``), or None where the program cannot be captured:
    then ``program.cuda_graph_refused`` says why and nothing else changes."""
    device_type = capture.device_type if capture is not None else "cuda"
    why = capture_refusal(program, device_type)
    program.cuda_graph_refused = why
    program.cuda_graph = None
    if why is not None:
        return None
    calls = GraphedCalls(program._fast, capture or CudaCapture(program.ctx.device))
    program.cuda_graph = calls
    program._fast = calls  # the entry and run_checked call it after their checks
    program._check, program.entry = program._check_and_entry()
    return calls

"""The C++ backend: generated kernels compiled by the machine's C++ compiler (the CPU default
where a compiler exists; torch takes the segments it declines, with the reason recorded)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from segmenter import FusionGraph, Node, Segment, SegmentKind
from segmenter.ir.symbolic import is_symbolic

from ..codegen import Declined
from ..codegen.build import build_cpu_later, build_cpu_many, cpu_compiler, unbuilt_cpu
from ..codegen.kernel import Kernel
from ..codegen.opaque.attention import ATTENTION, ATTENTION_BACKWARD, attention_backward_kernel, attention_kernel
from ..codegen.opaque.conv import CONVOLUTION, depthwise_kernel
from ..codegen.opaque.embedding import (
    EMBEDDING,
    EMBEDDING_BACKWARD,
    embedding_backward_kernel,
    embedding_kernel,
    index_error,
)
from ..codegen.opaque.gemm import matmul_kernel
from ..codegen.opaque.nll_loss import (
    NLL_LOSS_BACKWARD,
    NLL_LOSS_FORWARD,
    nll_loss_backward_kernel,
    nll_loss_forward_kernel,
    target_error,
)
from ..codegen.opaque.onetap import onetap_kernel
from ..codegen.opaque.patches import patches_kernel
from ..codegen.opaque.scan import CUMSUM, cumsum_kernel
from ..codegen.runner import runner_kernel
from ..emit.wrapper import Code
from .base import Backend, BuildContext, SegmentLaunch
from .kernels import KernelLaunch, layouts, raw_read_problem, views_of_outputs
from .measured import choose, measure_pending

__all__ = ["CppBackend"]


class CppLaunch(KernelLaunch):
    #: the kernel reads its inputs' data pointers only (Note [views passed as pointers] in runtime/compiled/pointers.py)
    reads_pointers = True
    #: a run of such launches may be one native call (Note [one native call for a chain of
    #: kernels] in runtime/compiled/chains.py): the launch is ``emit`` and ``emit_call`` as here
    chainable = True

    def emit_call(self, code: Code, values: list[str]) -> None:
        code.line(f"{self.built(code)}({self.arguments(code, values)})")

    def arguments(self, code: Code, values: list[str]) -> str:
        """The kernel's arguments: data pointers, then the call's symbol values where the kernel
        reads symbolic sizes (Note [kernel sizes as arguments] in runtime/codegen/source/symsizes.py)."""
        return ", ".join([*(code.pointer(v) for v in values), *(["_zp"] if self.kernel.symbols else [])])


class LoneOpLaunch(CppLaunch):
    """A lone OPAQUE op as its generated kernel: a depthwise or one-tap convolution (Note [depthwise
    convolutions] in runtime/codegen/opaque/conv.py, Note [one-tap convolutions]), an embedding (Note [embedding kernels]), a
    cumsum (Note [cumsum kernels]), an attention (Note [attention kernels]) or a negative
    log-likelihood loss (Note [nll loss kernels]); launched, guarded and freed as any kernel."""

    def __init__(self, backend: str, ctx: BuildContext, seg: Segment) -> None:  # noqa: D107 - see the class
        self.backend, self.ctx, self.segment = backend, ctx, seg
        if len(seg.nodes) != 1 or seg.nodes[0].op not in _LONE_OPS:
            raise Declined("not a lone op the generator takes")
        node = seg.nodes[0]
        if node.name in ctx.in_place:
            raise Declined(f"a {node.op} written into an input")
        why = raw_read_problem(ctx, seg)
        if why is not None:
            raise Declined(why)
        if node.op == CONVOLUTION:
            _constant_sizes(ctx.graph, seg, "the convolution kernels")
        self._bind(_LONE_OPS[node.op](ctx.graph, node))

    def emit_call(self, code: Code, values: list[str]) -> None:
        if self.kernel.returns == "void":
            super().emit_call(code, values)
            return
        code.line(f"_bad = {self.built(code)}({self.arguments(code, values)})")
        code.line("if _bad:")
        with code.block():
            code.line(f"{code.const(self.raise_count)}(_bad)")

    def raise_count(self, count: int) -> None:
        """A kernel's count of indices out of range, raised as eager raises (Note [embedding
        kernels], Note [nll loss kernels])."""
        _COUNTED[self.segment.nodes[0].op](count, self.kernel.params)


class MatmulLaunch(CppLaunch):
    """A MATMUL segment as its generated kernel (Note [matmul kernels] in runtime/codegen/opaque/gemm.py):
    the product is written into a buffer of its planned layout; outputs that are views of it
    are made after the launch, as for any kernel."""

    def __init__(self, backend: str, ctx: BuildContext, seg: Segment) -> None:  # noqa: D107 - see the class
        self.backend, self.ctx, self.segment = backend, ctx, seg
        if any(n.name in ctx.in_place for n in seg.nodes):
            raise Declined("a matmul written into an input")
        why = raw_read_problem(ctx, seg)
        if why is not None:
            raise Declined(why)
        views = views_of_outputs(ctx.graph, seg, ctx.materialize)
        kernel = matmul_kernel(ctx.graph, seg, layouts(ctx.graph, seg, ctx.materialize, {}))
        written = {p.value for p in kernel.params if p.output}
        if any(o not in views and o not in written for o in seg.outputs):
            raise Declined("an output of the segment that is neither the product nor a view of it")
        self._bind(kernel, hidden=written - set(seg.outputs), views=views)


def _constant_sizes(graph: FusionGraph, seg: Segment, what: str) -> None:
    """Declined where a value of ``seg`` has symbolic sizes: ``what`` size stack buffers and loops
    by constants (Note [kernel sizes as arguments] in runtime/codegen/source/symsizes.py; the matmul and
    attention kernels take every size as an argument, convolutions not yet)."""
    for v in (*seg.inputs, *(o for n in seg.nodes for o in n.outputs if o is not None)):
        if is_symbolic(graph.metas[v]):
            raise Declined(f"%{v} has symbolic sizes, and {what} take sizes as constants (not done)")


def convolution_kernel(graph: FusionGraph, node: Node) -> Kernel:
    """A depthwise convolution's kernel, or a one-tap one's (Note [one-tap convolutions] in
    runtime/codegen/opaque/onetap.py), or a 1-D one's (Note [1-D convolutions as patches] in
    runtime/codegen/opaque/patches.py), the first that takes it; or ``Declined`` with why none did."""
    why = []
    for name, make in (("depthwise", depthwise_kernel), ("one tap", onetap_kernel), ("patches", patches_kernel)):
        try:
            return make(graph, node)
        except Declined as e:
            why.append(f"{name}: {e}")
    raise Declined("; ".join(why))


#: lone ops whose kernels count their indices out of range: what each raises (eager's error)
_COUNTED = {EMBEDDING: lambda count, params: index_error(count, params[0].shape[0], params[1].value),
            NLL_LOSS_FORWARD: lambda count, params: target_error(count, params[0].shape[-1]),
            NLL_LOSS_BACKWARD: lambda count, params: target_error(count, params[0].shape[-1])}

_LONE_OPS = {CONVOLUTION: convolution_kernel, EMBEDDING: embedding_kernel, EMBEDDING_BACKWARD: embedding_backward_kernel,
             CUMSUM: cumsum_kernel, ATTENTION: attention_kernel, ATTENTION_BACKWARD: attention_backward_kernel,
             NLL_LOSS_FORWARD: nll_loss_forward_kernel,
             NLL_LOSS_BACKWARD: nll_loss_backward_kernel}


class CppBackend(Backend):
    name = "cpp"
    device = "cpu"
    opaque_ops = frozenset(_LONE_OPS)  # depthwise and one-tap convolutions, embeddings and their backward, cumsums, attention and its backward, nll losses

    def unavailable(self, device_type: str) -> str | None:
        why = super().unavailable(device_type)
        if why is None and cpu_compiler() is None:
            why = "no C++ compiler found (set CXX)"
        return why

    def __init__(self) -> None:  # noqa: D107
        #: the segment ``not_chosen_for`` last saw, per thread: ``prepare`` is called next for it
        #: where the program chooses by itself (runtime/backends/measured.py)
        self._choosing = threading.local()

    def prepare(self, ctx: BuildContext, seg: Segment) -> SegmentLaunch:
        by_itself = getattr(self._choosing, "segment", None) is seg
        self._choosing.segment = None
        if seg.kind == SegmentKind.OPAQUE:
            launch: CppLaunch = LoneOpLaunch(self.name, ctx, seg)
        elif seg.kind == SegmentKind.MATMUL:
            launch = MatmulLaunch(self.name, ctx, seg)
        else:
            launch = CppLaunch(self.name, ctx, seg)
        if by_itself:  # Note [choices by measurement] (runtime/autotune.py): a matmul, an attention,
            choose(ctx, launch)  # a convolution or a lone softmax, against ATen on this machine
        return launch

    def not_chosen_for(self, seg: Segment) -> str | None:
        # No rule here: whether ATen is faster is measured per shape class on this machine, once the
        # kernel is lowered (prepare) and built (build_all). Measured before that rule, a lone
        # softmax was left to ATen always (perf/results/x86-cpu-unrecorded/before_after_tanh_erf_softmax_cpu.json,
        # perf/results/x86-cpu-unrecorded/row_reductions_cpu.json: 1.13-1.75x ATen's time on one machine).
        self._choosing.segment = seg
        return None

    def build_later(self, launches: Sequence[SegmentLaunch]) -> tuple[Any, list[SegmentLaunch]] | None:
        kernels = [launch.kernel for launch in launches]  # type: ignore[attr-defined]
        unbuilt = unbuilt_cpu(kernels)
        if not any(unbuilt):
            return None
        return build_cpu_later([*kernels, runner_kernel()]), [la for la, u in zip(launches, unbuilt) if u]

    def build_all(self, launches: Sequence[SegmentLaunch]) -> dict[SegmentLaunch, str]:
        kernels = [launch.kernel for launch in launches]  # type: ignore[attr-defined]
        declined = {}
        # with the chain runner (runtime/compiled/chains.py), so that a cold cache builds it alongside
        built = build_cpu_many([*kernels, runner_kernel()]) if kernels else []
        for launch, fn in zip(launches, built):
            if isinstance(fn, Declined):
                declined[launch] = str(fn)
            else:
                launch.fn = fn  # type: ignore[attr-defined]
        declined.update(measure_pending(launches))  # Note [choices by measurement]
        return declined

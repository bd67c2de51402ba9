"""``torch.compile(model, backend="fuseg")``: our segmentation stage behind AOTAutograd.

AOTAutograd hands us functional ATen graphs (forward, and backward when training), with input
mutation as a ``copy_`` epilogue (inference) or as extra outputs it writes back itself
(training). Each graph is compiled on its first call with the real inputs, so graphs with
symbolic sizes are specialized to the concrete shapes, and cached by the inputs' signature
(shapes, strides, offsets, dtypes, devices, which inputs share storage): another signature
compiles again, never misreads.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch.utils._python_dispatch import _disable_current_modes

from alias import apply_aliases
from segmenter import SegmenterOptions, from_fx, segment
from segmenter.fx_import import storage_ids

from .program import CompiledProgram

__all__ = ["FusegCompiler", "aot_backend", "decompositions", "fuseg_backend"]


def _signature(args: Sequence[Any]) -> tuple:
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    return tuple(
        (tuple(a.shape), a.stride(), a.storage_offset(), a.dtype, a.device) if isinstance(a, torch.Tensor) else repr(a)
        for a in args
    ) + (tuple(storage_ids(tensors)),)


class FusegCompiler:
    """The compiler AOTAutograd calls for each graph; the returned callable compiles lazily.
    ``backend``: the kernel backend (``auto``: the registry's order; runtime/backends/)."""

    def __init__(self, mode: str = "post", options: SegmenterOptions | None = None, backend: str = "auto") -> None:
        self.mode = mode
        self.options = options or SegmenterOptions()
        self.backend = backend
        self.compiled: list[CompiledProgram] = []  # every program built, for inspection and tests

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        tokens = strip_effect_tokens(gm)
        out_node = next(n for n in gm.graph.nodes if n.op == "output")
        outs = list(out_node.args[0]) if isinstance(out_node.args[0], (list, tuple)) else [out_node.args[0]]
        present = [o is not None for o in outs]
        all_present = all(present)
        if not all_present:  # backward graphs return None for inputs that need no gradient
            out_node.args = (tuple(o for o in outs if o is not None),)
            gm.recompile()
        cache: dict[tuple, CompiledProgram] = {}
        last: list[CompiledProgram] = []  # the program the previous call ran: tried first

        def run(boxed: list[Any]) -> tuple[Any, ...]:
            # Boxed convention: we own the argument list and clear it, so AOTAutograd's inputs
            # (saved activations, in backward) can be freed as soon as our launches are done with them.
            args = [a for i, a in enumerate(boxed) if i not in tokens] if tokens else list(boxed)
            boxed.clear()
            # Note [one entry] (runtime/program.py): the program the previous call ran, where the
            # inputs match it exactly; None (nothing run) sends the call on to the checked path
            results = last[0].entry(*args) if last and len(args) == last[0].arity else None
            if results is None:
                key = _signature(args)
                program = cache.get(key)
                if program is None:
                    with _disable_current_modes():  # Note [compiling outside the caller's modes]
                        graph = from_fx(gm, list(args), name=f"aot_graph_{len(self.compiled)}")
                    program = CompiledProgram(apply_aliases(segment(graph, self.options), self.mode), self.backend)
                    cache[key] = program
                    self.compiled.append(program)
                last[:] = [program]
                tensors = [a for a in args if isinstance(a, torch.Tensor)]
                del args
                results = program(*tensors)
            if all_present:
                return tuple(results)
            it = iter(results)
            return tuple(next(it) if p else None for p in present)

        run._boxed_call = True  # type: ignore[attr-defined]
        return run


# Note [compiling outside the caller's modes]: a graph is compiled on its first call, so inside
# whatever dispatch modes are on then: AOTAutograd's own (its runtime wrapper runs the first call
# under a mode that checks custom ops for aliasing), or the caller's (a FLOP counter, a memory
# tracker). ``from_fx`` re-runs the graph on FakeTensors of its own (Note [fake tensor cache] in
# segmenter/meta.py); under those modes every fake op went through them too. A caller's mode then
# counted ops that never ran, and with AOTAutograd's mode bart-tiny's re-run took 0.30-0.39 s,
# against 0.25-0.28 s without it (three alternated first calls each). So the re-run happens with
# the mode stack set aside; the program itself, folded segments included, runs where it did
# before. (A FakeTensor input keeps its own mode: the re-run uses it, on the stack or not.)


def strip_effect_tokens(gm: fx.GraphModule) -> frozenset[int]:
    """Note [effect tokens] (segmenter/from_torch.py), for AOTAutograd's graphs: AOTAutograd passes
    each effect token in as an input (None at run time) and drops the token outputs. Each
    ``with_effects(token, op, *args)`` becomes a plain call of ``op`` in the same place (run for
    its effect; the segmenter keeps ops that return nothing), the token outputs become None and
    the token inputs go. Returns the positions of the token inputs: the call drops those."""
    graph = gm.graph
    with_effects = torch.ops.higher_order.with_effects
    effects = [n for n in graph.nodes if n.op == "call_function" and n.target is with_effects]
    if not effects:
        return frozenset()
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    tokens: set[fx.Node] = set()
    token_outs: list[fx.Node] = []
    for n in effects:
        tokens.add(n.args[0])
        op, returns = n.args[1], len(n.args[1]._schema.returns)
        with graph.inserting_before(n):
            call = graph.call_function(op, tuple(n.args[2:]), dict(n.kwargs))
        val = n.meta.get("val")
        call.meta["val"] = None if returns == 0 or val is None else (val[1] if returns == 1 else tuple(val[1:]))
        for user in list(n.users):  # getitem(with_effects, i): i == 0 is the token
            if user.args[1] == 0:
                tokens.add(user)
                token_outs.append(user)
            elif returns == 1:
                user.replace_all_uses_with(call)
                graph.erase_node(user)
            else:
                user.args = (call, user.args[1] - 1)
    out_node = next(n for n in graph.nodes if n.op == "output")
    outs = out_node.args[0] if isinstance(out_node.args[0], (list, tuple)) else (out_node.args[0],)
    out_node.args = (tuple(None if o in tokens else o for o in outs),)
    for n in reversed(effects):  # later effects read earlier tokens: erase from the last
        for t in [u for u in token_outs if u.args[0] is n]:
            graph.erase_node(t)
        graph.erase_node(n)
    positions = frozenset(i for i, p in enumerate(placeholders) if p in tokens)
    for i in positions:
        graph.erase_node(placeholders[i])
    gm.recompile()
    return positions


def fuseg_backend(gm: fx.GraphModule, example_inputs: Sequence[Any], **options: Any) -> Callable[..., Any]:
    """The dynamo backend registered as "fuseg" (setup.py's ``torch_dynamo_backends`` entry point).

    ``torch.compile(model, backend="fuseg", options={"alias_mode": "pre", "backend": "torch"})``
    picks the alias mode and the kernel backend (default: ``post``, and the registry's order:
    generated C++ kernels on the CPU where a compiler exists).
    """
    if options.get("mode") is not None:
        warnings.warn(f"fuseg: torch.compile(mode={options['mode']!r}) is Inductor's setting; fuseg ignores it",
                      stacklevel=2)
    opts = dict(options.get("options") or {}, **{k: v for k, v in options.items() if k not in ("options", "mode")})
    unknown = set(opts) - {"alias_mode", "backend"}
    if unknown:
        raise ValueError(f"fuseg: unknown options {sorted(unknown)} (known: alias_mode, backend)")
    compiler = FusegCompiler(mode=opts.get("alias_mode", "post"), backend=opts.get("backend", "auto"))
    return aot_backend(compiler)(gm, example_inputs)


def aot_backend(compiler: FusegCompiler) -> Callable[..., Any]:
    """AOTAutograd around ``compiler`` (forward and backward), as the "fuseg" backend runs it:
    input mutations kept in the graph, and Note [decompositions before segmenting]."""
    from torch._dynamo.backends.common import aot_autograd

    return aot_autograd(fw_compiler=compiler, bw_compiler=compiler, keep_inference_input_mutations=True,
                        decompositions=decompositions())


# Note [decompositions before segmenting]: AOTAutograd leaves some composite ops whole that are
# made of ops our kernels fuse. ``_safe_softmax`` (SDPA's math path: falcon's attention) is a
# softmax whose rows that are all -inf give zeros instead of NaN; kept whole it was an OPAQUE
# segment, four ATen ops on torch (about 57 us each on falcon-tiny's 2x4x32x32 scores, against
# about 9 us for a plain softmax). Decomposed (softmax, ``x == -inf``, all over the row, where) it
# is one row kernel with the scale and the mask before it. The decomposition is torch's own, as
# ``segmenter.capture`` applies it through torch.export's default table.
def decompositions() -> dict:
    from torch._decomp import get_decompositions

    return get_decompositions([torch.ops.aten._safe_softmax])

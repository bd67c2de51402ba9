"""bf16 kernels on the CPU with and without rounding in the float lanes (a benchmark).

    python -m perf.experiments.bf16_rounding [--rounds 5] [--calls 20] [--models llama-1024,gpt2-768]
        [--out perf/results/<machine>/bf16_rounding_cpu.json]

Note [bf16 rounding in float] (runtime/codegen/kernel.py): a bf16 kernel rounds each op's result
with ``fuseg_bf_round`` (in the 32-bit lanes) and stores a value already rounded as its top 16
bits (``fuseg_bf_bits``), where it wrote ``fuseg_bf2f(fuseg_f2bf(x))`` and stored through one more
``fuseg_f2bf``. The "before" programs are built here with the lowering patched back to those two
forms (``_before``), the "after" ones as the library builds them, both in this process; per round
and case, eager, before and after each run a block of calls (interleaved, the order swapped from
round to round), the median block per call is kept, ratios are per round, then the median over
rounds. Blocks: lone fused ops at transformer sizes (``backend="cpp"``, the kernel kept whatever a timing
against ATen says: ``autotune.fixed("kernel")``), and whole bf16 models of
perf.models captured with ``runtime.compile_module`` (kernels or ATen chosen per segment as
``torch.compile(backend="fuseg")`` chooses them). Programs are not tried against their ATen path
here (``trial.program_checks(False)``): what is compared is the kernels. Outputs are compared
with eager's, bit for bit and by the largest difference.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..bench import environment, write_record


@contextlib.contextmanager
def _before() -> Iterator[None]:
    """Within: the lowering rounds bf16 as two conversions and stores through one more."""
    from runtime.codegen import kernel
    from runtime.codegen.lowering import columns, lower, rows
    from runtime.codegen.source.ctypes_ import store

    rounded = lower._Lowerer.rounded

    def old_rounded(self: Any, dtype: torch.dtype, expr: str) -> str:
        got = rounded(self, dtype, expr)
        if got.startswith("fuseg_bf_round(") and got.endswith(")"):
            return f"fuseg_bf2f(fuseg_f2bf({got[len('fuseg_bf_round('):-1]}))"
        return got

    def old_store_output(lw: Any, b: Any, p: Any, idx: list[str], stores: dict) -> None:
        v = lw.value(b, p.value, idx)
        off = kernel.ix.linear(idx, p.shape, p.stride)
        stores[p.value] = (off, b.loop)
        b.lines.append(f"{b.indent}{p.name}[{off}] = {store(p.dtype, v)};")

    saved = [(m, m.store_output) for m in (lower, rows, columns)]
    lower._Lowerer.rounded = old_rounded  # type: ignore[method-assign]
    for m, _ in saved:
        m.store_output = old_store_output
    try:
        yield
    finally:
        lower._Lowerer.rounded = rounded  # type: ignore[method-assign]
        for m, f in saved:
            m.store_output = f


def _ops(dtype: torch.dtype = torch.bfloat16) -> list[tuple[str, Callable[[], tuple[Callable[..., Any], list[torch.Tensor]]]]]:
    """The lone fused ops at transformer sizes, their inputs in ``dtype`` (perf/experiments/half_vectors.py: fp16)."""
    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape).to(dtype)

    def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return w * (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)

    def silu_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.silu(a) * b

    def gelu_bias(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x + b, approximate="tanh")

    def layer_norm_residual(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.layer_norm(x + y, (x.shape[-1],), w, b)

    def softmax_scaled(x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x * 0.125, -1)

    return [
        ("rms-norm 256x1024", lambda: (rms, [r(256, 1024), r(1024)])),
        ("silu*mul 256x2816", lambda: (silu_mul, [r(256, 2816), r(256, 2816)])),
        ("gelu(x+b) 128x3072", lambda: (gelu_bias, [r(128, 3072), r(3072)])),
        ("layer-norm(x+y) 128x768", lambda: (layer_norm_residual, [r(128, 768), r(128, 768), r(768), r(768)])),
        ("softmax 12x128x128", lambda: (softmax_scaled, [r(12, 128, 128)])),
    ]


def _op_program(fn: Callable[..., Any], inputs: list[torch.Tensor]) -> Any:
    import runtime
    from alias import apply_aliases
    from runtime.autotune import fixed
    from segmenter import capture, segment

    with fixed("kernel"):  # the kernel on both sides, whatever one timing against ATen said
        return runtime.compile(apply_aliases(segment(capture(fn, inputs)), "post"), backend="cpp")


def _model(name: str) -> tuple[Callable[..., Any], list[Any]]:
    from ..models import MODELS

    fn, inputs = MODELS[name]()
    return fn.to(torch.bfloat16).eval(), inputs


def _model_program(fn: Any, inputs: list[Any]) -> Any:
    import runtime

    return runtime.compile_module(fn, inputs)


def _leaves(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict) or hasattr(x, "values"):
        return [t for v in x.values() for t in _leaves(v)]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _leaves(v)]
    return []


def _block(call: Callable[[], Any], calls: int) -> float:
    t = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - t) / calls


def _row(name: str, fn: Callable[..., Any], inputs: list[Any], make: Callable[..., Any], rounds: int,
         calls: int, before_of: Callable[[], Any] = _before) -> dict[str, Any]:
    """One case: ``make(fn, inputs)`` built within ``before_of()`` and as the library builds it, then
    timed interleaved with eager (the module's docstring)."""
    from runtime.compiled import trial

    with trial.program_checks(False):  # (and no verdict of an earlier trial keeps a side on ATen)
        with before_of():
            before = make(fn, inputs)
        after = make(fn, inputs)
    progs = {"before": before, "after": after}
    for p in progs.values():  # kernels built in the background: timed once they are all in
        getattr(p, "program", p).wait_for_builds()
    with torch.no_grad(), trial.program_checks(False):
        want = _leaves(fn(*inputs))
        equal, diff = {}, {}
        outs = {}
        for side, p in progs.items():
            outs[side] = got = _leaves(p(*inputs))
            equal[side] = all(torch.equal(g, w) for g, w in zip(got, want))
            diff[side] = max((g.float() - w.float()).abs().max().item() for g, w in zip(got, want))
        # the same rounding either way: where both ran the same segments as kernels, the same bits
        same = all(torch.equal(a, b) for a, b in zip(outs["after"], outs["before"]))
        calls_of = {"eager": lambda: fn(*inputs), "before": lambda: before(*inputs), "after": lambda: after(*inputs)}
        per: dict[str, list[float]] = {k: [] for k in calls_of}
        for c in calls_of.values():
            _block(c, 3)
        for r in range(rounds):
            for side in (list(calls_of) if r % 2 == 0 else list(reversed(calls_of))):
                per[side].append(statistics.median(_block(calls_of[side], calls) for _ in range(3)))
    row = {"case": name, "kernels": {s: len(getattr(p, "program", p).kernels) for s, p in progs.items()},
           "equal_eager": equal, "max_abs_diff": diff, "after_equals_before": same,
           **{f"{s}_ms": statistics.median(v) * 1e3 for s, v in per.items()},
           **{f"{s}_rounds_ms": [x * 1e3 for x in v] for s, v in per.items()},
           "after_over_before": statistics.median(a / b for a, b in zip(per["after"], per["before"])),
           "before_over_eager": statistics.median(b / e for b, e in zip(per["before"], per["eager"])),
           "after_over_eager": statistics.median(a / e for a, e in zip(per["after"], per["eager"]))}
    print(f"{name:>26}  eager {row['eager_ms']:.4f} ms  before {row['before_ms']:.4f}  after {row['after_ms']:.4f}"
          f"  after/before {row['after_over_before']:.2f}  equal {equal}  same bits {same}  kernels {row['kernels']}",
          flush=True)
    return row


def _model_rows(models: str, dtypes: Callable[[str], tuple[torch.dtype, ...]], rounds: int, calls: int,
                before_of: Callable[[], Any]) -> list[dict[str, Any]]:
    """``_row`` of each of ``models`` (comma-separated perf.models names) in each of its ``dtypes``,
    its "before" side built within ``before_of()`` (the experiments that share this module)."""
    rows = []
    for name in (m for m in models.split(",") if m):
        for dtype in dtypes(name):
            fn, inputs = _model(name)
            rows.append(_row(f"{name} ({str(dtype)[6:]})", fn.to(dtype), inputs, _model_program, rounds,
                             max(3, calls // 5), before_of))
    return rows


def _args(doc: str, argv: list[str] | None, models: str) -> tuple[Any, list[str]]:
    """The options of an experiment built on ``_row`` (``--rounds``, ``--calls``, ``--models``,
    ``--out``) and its argv; warnings off and the seed set, as each of them starts."""
    import sys

    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--models", default=models, help="comma-separated perf.models names (none: '')")
    p.add_argument("--out", default=None)
    argv = sys.argv[1:] if argv is None else argv
    a = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    return a, argv


def _write(benchmark: str, module: str, argv: list[str], a: Any, rows: list[dict[str, Any]]) -> None:
    """The experiment's record at ``a.out`` (if given), with its command and this machine."""
    if a.out:
        write_record({"benchmark": benchmark, "command": f"python -m perf.experiments.{module} " + " ".join(argv),
                      "environment": environment("cpu"), "threads": torch.get_num_threads(), "rounds": a.rounds,
                      "calls": a.calls, "rows": rows}, a.out)


def fp16_main(doc: str, argv: list[str] | None, models: str, ops: Callable[[], list[tuple[str, Callable[..., Any], list[torch.Tensor]]]],
              before_of: Callable[[], Any], benchmark: str, module: str) -> int:
    """The main of an fp16 experiment built on ``_row`` (perf/experiments/half_vectors.py,
    half_rows.py): ``ops()``'s lone ops, then ``--models`` in fp16, their "before" side built
    within ``before_of()``, kernels built at once; the record written with ``_write``."""
    from runtime import options

    a, argv = _args(doc, argv, models)
    rows: list[dict[str, Any]] = []
    with options.use(background_builds=False):
        for name, fn, inputs in ops():
            rows.append(_row(name, fn, inputs, _op_program, a.rounds, a.calls, before_of))
        rows += _model_rows(a.models, lambda name: (torch.float16,), a.rounds, a.calls, before_of)
    _write(benchmark, module, argv, a, rows)
    return 0


def measure(rounds: int, calls: int, models: list[str]) -> list[dict[str, Any]]:
    rows = []
    for name, make in _ops():
        fn, inputs = make()
        rows.append(_row(name, fn, inputs, _op_program, rounds, calls))
    for name in models:
        fn, inputs = _model(name)
        rows.append(_row(f"{name} (bf16)", fn, inputs, _model_program, rounds, max(3, calls // 5)))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--models", default="llama-1024,gpt2-768,bert-768",
                   help="comma-separated perf.models names, run in bf16 (none: '')")
    p.add_argument("--out", default=None)
    if argv is None:
        import sys

        argv = sys.argv[1:]
    a = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    rows = measure(a.rounds, a.calls, [m for m in a.models.split(",") if m])
    _write("bf16 rounding in float before/after (Note [bf16 rounding in float]), CPU", "bf16_rounding", argv or [], a, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

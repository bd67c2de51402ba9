"""A sweep over PyTorch's OpInfo database (``op_db``): one sample per op and dtype, captured,
segmented, alias-analysed (post), compiled for each backend and run, against eager.

Each case ends as one of:
  pass     values (OpInfo-like tolerances per dtype), dtypes, shapes, strides, conj/neg bits,
           aliasing of outputs to inputs and to each other, final values of inputs: as eager;
  refused  a clean refusal with the project's own error types (CaptureError, GraphError),
           tallied by reason;
  crash    any other exception from our pipeline, or a plan that ``alias.check`` rejects;
  wrong    a silent wrong result.

Note [batched captures]: capture costs ~0.25 s per program here, mostly fixed cost inside
torch.export; the whole database is ~1300 cases. So cases are captured several to a program
(each case's tensors and outputs kept apart, compared case by case); a batch that is refused or
crashes is split in halves until the case at fault is alone, and every crash or wrong result is
re-run alone before it is reported, so a verdict never depends on the company a case kept.

Run by hand for the whole database and a report: ``python -m tests.opdb_sweep [--dtype bfloat16]
[--backend cpp] [--ops name,...]``.
"""

from __future__ import annotations

import argparse
import re
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch._higher_order_ops.effects import has_effects
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import runtime
from alias import PlanError, apply_aliases, check
from segmenter import GraphError, capture, segment
from segmenter.capturing.from_torch import bind_inputs
from segmenter.capturing.reference import clone_inputs

from .util import alias_pattern, layout

# torch.testing.assert_close's defaults, what OpInfo's tests use unless an op overrides them
TOLERANCES = {torch.float32: (1.3e-6, 1e-5), torch.bfloat16: (1.6e-2, 1e-5), torch.float16: (1e-3, 1e-5),
              torch.complex64: (1.3e-6, 1e-5)}
# ops whose outputs hold uninitialized memory: only their layouts are compared
_GARBAGE = re.compile(r"(^|\W|_)empty")


@dataclass
class Case:
    op: str  # OpInfo name (with its variant)
    dtype: torch.dtype
    tensors: list[torch.Tensor]
    fn: Callable[..., object]
    values: bool = True  # False: random or uninitialized outputs; layouts only
    batchable: bool = True
    backends: tuple[str, ...] | None = None  # None: every backend the sweep runs


@dataclass
class Outcome:
    case: Case
    verdict: str  # pass | refused | crash | wrong
    detail: str = ""
    backends: tuple[str, ...] = ()


@dataclass
class Tally:
    outcomes: list[Outcome] = field(default_factory=list)
    seconds: float = 0.0
    captures: int = 0
    generated_kernels: int = 0  # segments the C++ backend ran with a generated kernel

    def counts(self) -> Counter:
        c: Counter = Counter()
        for o in self.outcomes:
            c[o.verdict if o.verdict != "refused" else f"refused: {o.detail}"] += 1
        return c

    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.verdict in ("crash", "wrong")]

    def __str__(self) -> str:
        c = self.counts()
        lines = [f"op_db sweep: {len(self.outcomes)} cases, {self.captures} captures, "
                 f"{self.generated_kernels} generated C++ kernels run, {self.seconds:.0f} s; "
                 f"pass {c['pass']}, crash {c['crash']}, wrong {c['wrong']}, "
                 f"refused {sum(n for k, n in c.items() if k.startswith('refused'))}"]
        for k, n in sorted(c.items(), key=lambda kv: -kv[1]):
            if k.startswith("refused"):
                lines.append(f"  {n:4d}  {k}")
        for o in self.failures():
            lines.append(f"  {o.verdict.upper()} {o.case.op} {o.case.dtype}: {o.detail}")
        return "\n".join(lines)


def _sample(op, dtype: torch.dtype):
    gen = op.sample_inputs("cpu", dtype, requires_grad=False)
    try:
        return next(iter(gen), None)
    finally:
        close = getattr(gen, "close", None)
        if close is not None:
            close()  # a half-run generator closed later (inside an export trace) raises there


def _flat_outputs(out: object) -> list[object]:
    return list(pytree.tree_leaves(out))


def make_cases(ops: Sequence, dtypes: Sequence[torch.dtype]) -> tuple[list[Case], Counter]:
    """One case per (op, dtype) that op_db has a CPU sample for and eager runs; the skips tallied."""
    cases, skipped = [], Counter()
    for op in ops:
        for dtype in dtypes:
            if dtype not in op.supported_dtypes("cpu"):
                skipped["dtype not supported by the op"] += 1
                continue
            torch.manual_seed(0)
            try:
                s = _sample(op, dtype)
            except Exception:  # noqa: BLE001 - op_db's own sample generators
                s = None
            if s is None:
                skipped["no sample"] += 1
                continue
            case = case_of_sample(op, dtype, s)
            if isinstance(case, str):
                skipped[case] += 1
            else:
                cases.append(case)
    return cases, skipped


def case_of_sample(op, dtype: torch.dtype, s) -> Case | str:  # noqa: ANN001 - an OpInfo and its SampleInput
    """The case of one OpInfo sample, or why there is none (no dense tensor input, eager raises)."""
    leaves, spec = pytree.tree_flatten((s.input, s.args, s.kwargs))
    pos = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    if not pos or any(leaves[i].layout != torch.strided or leaves[i].requires_grad for i in pos):
        return "no dense tensor input"
    f = op.op

    def fn(*ts, _leaves=leaves, _pos=pos, _spec=spec, _f=f):
        args = list(_leaves)
        for i, t in zip(_pos, ts):
            args[i] = t
        inp, a, kw = pytree.tree_unflatten(args, _spec)
        return _f(inp, *a, **kw)

    tensors = [leaves[i] for i in pos]
    name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
    probe = _Random()
    try:
        outs = [_run_eager(fn, tensors, 0, probe), _run_eager(fn, tensors, 1)]
    except Exception:  # noqa: BLE001 - the sample does not run in eager: nothing to compare
        return "eager raises on the sample"
    flat = _flat_outputs(outs[0])
    tensor_out = all(isinstance(t, torch.Tensor) for t in flat) and flat
    try:
        same = tensor_out and all(
            torch.equal(a, b) or (a.is_floating_point() and torch.allclose(a, b, equal_nan=True))
            for a, b in zip(flat, _flat_outputs(outs[1])) if a.layout == torch.strided)
    except (RuntimeError, NotImplementedError):  # a dtype torch cannot compare: layouts only
        same = False
    values = bool(same) and not probe.seen and not _GARBAGE.search(name)
    alone = not tensor_out or probe.effects or _data_dependent(fn, tensors)
    return Case(name, dtype, tensors, fn, values, batchable=not alone)


class _Random(TorchDispatchMode):
    """Notes whether a random ATen op runs (op_db seeds its random ops inside the sample, which
    a captured graph does not replay: their values are not compared), and whether an op with
    side effects runs (export threads an effect token through those: captured alone)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = False
        self.effects = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen = self.seen or torch.Tag.nondeterministic_seeded in getattr(func, "tags", ())
        try:
            self.effects = self.effects or bool(has_effects(func))
        except Exception:  # noqa: BLE001 - a probe only
            pass
        return func(*args, **(kwargs or {}))


def _data_dependent(fn, tensors) -> bool:
    """Whether the case's output shapes depend on values (nonzero, unique...): such cases are
    refused by capture today, so they are captured alone rather than costing a batch's bisection."""
    mode = FakeTensorMode(allow_non_fake_inputs=False)
    try:
        fakes = [mode.from_tensor(t) for t in tensors]
        with mode, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn(*fakes)
    except Exception:  # noqa: BLE001 - any failure on fakes: alone
        return True
    return False


def _run_eager(fn, tensors, seed: int, probe: _Random | None = None):
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if probe is None:
            return fn(*clone_inputs(tensors))
        with probe:
            return fn(*clone_inputs(tensors))


def _batch_fn(cases: Sequence[Case]) -> tuple[Callable[..., list], list[torch.Tensor]]:
    spans, tensors = [], []
    for c in cases:
        spans.append((len(tensors), len(tensors) + len(c.tensors)))
        tensors.extend(c.tensors)

    def fn(*ts):
        out = []
        for c, (a, b) in zip(cases, spans):
            out.extend(_flat_outputs(c.fn(*ts[a:b])))
        return out

    fn.__name__ = "opdb_batch"
    return fn, tensors


class _Crash(Exception):
    pass


def _reason(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    text = re.sub(r"torch.export failed on \w+: ", "torch.export: ", text)
    text = re.sub(r"'[^']*'|\"[^\"]*\"|%\w+|\d+", "_", text)  # names and numbers vary by case
    return f"{type(e).__name__}: {text[:90]}"


def _compare(case: Case, eager_in, eager_out, got_in, got_out, tensors_off: int, outs_off: int) -> str | None:
    """What differs between eager and ours for one case (None: nothing)."""
    rtol, atol = TOLERANCES.get(case.dtype, (1.3e-6, 1e-5))
    n = len(eager_out)
    for j in range(n):
        e, g = eager_out[j], got_out[outs_off + j]
        if not isinstance(e, torch.Tensor):  # a Python number (``x.item()``): the same type and value
            if type(g) is not type(e):
                return f"output {j}: {type(g).__name__}, eager a {type(e).__name__}"
            if case.values and not (g == e or (g != g and e != e) or abs(g - e) <= atol + rtol * abs(e)):
                return f"output {j}: {g!r}, eager {e!r}"
            continue
        if not isinstance(g, torch.Tensor):
            return f"output {j}: {type(g).__name__}, eager a tensor"
        if layout(e) != layout(g):
            return f"output {j}: layout {layout(g)}, eager {layout(e)}"
        if case.values:
            try:
                torch.testing.assert_close(g.resolve_conj().resolve_neg(), e.resolve_conj().resolve_neg(),
                                           rtol=rtol, atol=atol, equal_nan=True)
            except AssertionError as err:
                return f"output {j} values: {str(err).strip().splitlines()[-1][:160]}"
    ours = alias_pattern(got_in[tensors_off:tensors_off + len(case.tensors)], got_out[outs_off:outs_off + n])
    theirs = alias_pattern(eager_in, eager_out)
    if ours != theirs:
        return f"aliasing {ours}, eager {theirs}"
    for i, (e, g) in enumerate(zip(eager_in, got_in[tensors_off:])):
        if layout(e) != layout(g):
            return f"input {i} after the call: layout {layout(g)}, eager {layout(e)}"
        if not case.values:
            continue  # a random op writes random values into it
        try:
            torch.testing.assert_close(g, e, rtol=rtol, atol=atol, equal_nan=True)
        except AssertionError:
            return f"input {i} after the call differs"
    return None


def run_batch(cases: Sequence[Case], backends: Sequence[str], tally: Tally) -> list[Outcome]:
    """Outcomes of ``cases`` captured as one program; raises a refusal or _Crash for the batch."""
    fn, tensors = _batch_fn(cases)
    tally.captures += 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = capture(fn, clone_inputs(tensors))  # GraphError (CaptureError): a clean refusal
        sf = segment(graph)
        plan = apply_aliases(sf, "post")
    problems = check(sf, plan)
    if problems:
        raise _Crash(f"alias.check rejects the plan: {problems[0][:200]}")
    outcomes = {id(c): Outcome(c, "pass") for c in cases}
    eager = []
    for c in cases:
        e_in = clone_inputs(c.tensors)
        torch.manual_seed(0)
        eager.append((e_in, _flat_outputs(c.fn(*e_in))))
    wanted = {b for c in cases for b in (c.backends or backends)}
    for backend in [b for b in backends if b in wanted]:
        try:
            program = runtime.compile(plan, backend=backend)
            got_in = clone_inputs(tensors)
            torch.manual_seed(0)
            got_out = program(*bind_inputs(graph, None, got_in))
            tally.generated_kernels += sum(b == "cpp" for b in program.backend_of.values())
        except PlanError as e:
            raise _Crash(f"{backend}: {e}") from e
        except GraphError:
            raise
        except Exception as e:  # noqa: BLE001 - a crash in our pipeline (or a torch error it caused)
            raise _Crash(f"{backend}: {type(e).__name__}: {str(e).strip()[:300]}") from e
        t_off = o_off = 0
        for c, (e_in, e_out) in zip(cases, eager):
            if backend in (c.backends or backends):
                bad = _compare(c, e_in, e_out, got_in, got_out, t_off, o_off)
                out = outcomes[id(c)]
                out.backends += (backend,)
                if bad is not None and out.verdict == "pass":
                    out.verdict, out.detail = "wrong", f"{backend}: {bad}"
            t_off += len(c.tensors)
            o_off += len(e_out)
    return list(outcomes.values())


def sweep(cases: Sequence[Case], backends: Sequence[str] = ("torch", "cpp"), batch: int = 8) -> Tally:
    tally = Tally()
    start = time.perf_counter()

    def go(group: Sequence[Case]) -> None:
        try:
            outs = run_batch(group, backends, tally)
        except (GraphError, _Crash) as e:
            if len(group) > 1:
                half = len(group) // 2
                go(group[:half])
                go(group[half:])
                return
            crash = isinstance(e, _Crash)
            detail = str(e) if crash else _reason(e)
            if crash and e.__cause__ is not None:
                detail += "\n" + "".join(traceback.format_exception(e.__cause__)[-6:])
            tally.outcomes.append(Outcome(group[0], "crash" if crash else "refused", detail))
            return
        except Exception as e:  # noqa: BLE001 - anything else from capture/segment/alias is ours too
            if len(group) > 1:
                half = len(group) // 2
                go(group[:half])
                go(group[half:])
                return
            tb = "".join(traceback.format_exception(e)[-6:])
            tally.outcomes.append(Outcome(group[0], "crash", f"{type(e).__name__}: {str(e)[:300]}\n{tb}"))
            return
        for o in outs:
            if o.verdict == "wrong" and len(group) > 1:
                go([o.case])  # see Note [batched captures]: judged alone
                alone = tally.outcomes[-1]
                if alone.verdict == "pass":  # wrong only beside other cases: still wrong
                    alone.verdict, alone.detail = "wrong", f"in a batch of {len(group)} only: {o.detail}"
            else:
                tally.outcomes.append(o)

    by_backends: dict[tuple[str, ...], list[Case]] = {}  # a batch compiles for the backends its cases want
    for c in cases:
        if c.batchable:
            by_backends.setdefault(tuple(c.backends or backends), []).append(c)
    for group in by_backends.values():
        for k in range(0, len(group), batch):
            go(group[k:k + batch])
    for c in cases:
        if not c.batchable:
            go([c])
    tally.seconds = time.perf_counter() - start
    return tally


def op_db_ops(names: Sequence[str] | None = None) -> list:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.testing._internal.common_methods_invocations import op_db
    if names:
        return [op for op in op_db if op.name in names]
    return list(op_db)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", action="append", choices=["float32", "bfloat16", "float16", "complex64"])
    p.add_argument("--backend", action="append", choices=["torch", "cpp"])
    p.add_argument("--ops", default="")
    p.add_argument("--batch", type=int, default=8)
    a = p.parse_args(argv)
    dtypes = [getattr(torch, d) for d in (a.dtype or ["float32", "bfloat16"])]
    ops = op_db_ops([x for x in a.ops.split(",") if x] or None)
    t0 = time.perf_counter()
    cases, skipped = make_cases(ops, dtypes)
    print(f"{len(cases)} cases from {len(ops)} ops in {time.perf_counter() - t0:.0f} s; skipped {dict(skipped)}",
          flush=True)
    tally = sweep(cases, tuple(a.backend or ("torch", "cpp")), a.batch)
    print(tally)
    return 1 if tally.failures() else 0


if __name__ == "__main__":
    raise SystemExit(main())

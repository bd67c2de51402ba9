"""Programs nobody here wrote, through ``torch.compile(backend="fuseg")``, against eager.

Note [the peer suite]: issue 63 goal 5. Three sources, each a table of cases (tests/opdb_sweep.py's
``Case``: a function of tensors, the tensors, a dtype):
  - tests/peer_opinfo.py: PyTorch's OpInfo reductions (op_db), every sample and reference input,
    and the same programs on inputs scaled up to 2^20.. elements;
  - tests/peer_reductions.py: the programs and input classes of PyTorch's test/test_reductions.py,
    re-written as a table;
  - tests/peer_dynamo.py: small programs of the kind dynamo's own tests (test/dynamo/) run.

Each case is compiled by dynamo with the "fuseg" backend as ``torch.compile(fn, backend="fuseg")``
makes it (``fuseg_backend``'s compiler with its defaults, kept here to count the generated kernels
the call ran), with the kernels built before the first call (tests/conftest.py), and judged as the
op_db sweep judges (``opdb_sweep._compare``: values within the dtype's tolerance, dtypes, shapes,
strides, which outputs share storage with which inputs and outputs, inputs' values afterwards).
Values that differ from eager's beyond the tolerance still pass where their error against float64
is within twice eager's own (or two units in the last place of the dtype): a different order of
additions is no error; a larger one is.

Verdicts: pass; wrong (a silent difference); crash (an exception torch's own AOTAutograd path,
``aot_eager``, does not raise); torch (``aot_eager`` raises the same or gives our very result, so
no backend behind dynamo can do better; Note [torch's own bugs] in tests/test_fuzz_dynamo.py).
Cases are compiled several to a program (Note [batched captures] in tests/opdb_sweep.py): a
failing batch is split until the case at fault is alone, and a wrong result is judged alone.
"""

from __future__ import annotations

import math
import re
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch.utils import _pytree as pytree

from runtime.dynamo import FusegCompiler, compile_with_aot
from segmenter.capturing.reference import clone_inputs

from .opdb_sweep import TOLERANCES, Case, _compare

__all__ = ["Outcome", "PeerTally", "grown", "judge", "run_compiled", "sweep", "sweep_dynamic"]


@dataclass
class Outcome:
    case: Case
    verdict: str  # pass | wrong | crash | torch
    detail: str = ""


@dataclass
class PeerTally:
    source: str
    outcomes: list[Outcome] = field(default_factory=list)
    seconds: float = 0.0
    compiles: int = 0
    kernels: int = 0  # segments that ran a generated kernel (cpp or cuda), over every compiled program

    def counts(self) -> Counter:
        return Counter(o.verdict for o in self.outcomes)

    def failures(self, known: dict[str, str] | None = None) -> list[Outcome]:
        """Crashes and wrong results, less the cases ``known`` names (by ``key``)."""
        return [o for o in self.outcomes if o.verdict in ("crash", "wrong") and key(o.case) not in (known or {})]

    def __str__(self) -> str:
        c = self.counts()
        lines = [f"peer suite, {self.source}: {len(self.outcomes)} cases, {self.compiles} compiles, "
                 f"{self.kernels} generated-kernel segments run, {self.seconds:.0f} s; pass {c['pass']}, "
                 f"wrong {c['wrong']}, crash {c['crash']}, torch's {c['torch']}"]
        for o in self.outcomes:
            if o.verdict != "pass":
                lines.append(f"  {o.verdict.upper()} {key(o.case)}: {o.detail.splitlines()[0][:200] if o.detail else ''}")
        return "\n".join(lines)


def key(case: Case) -> str:
    """A case's name in tables of known failures: ``name/dtype``."""
    return f"{case.op}/{str(case.dtype).removeprefix('torch.')}"


def _flat(out: object) -> list[object]:
    return list(pytree.tree_leaves(out))


def _batch_fn(cases: Sequence[Case]) -> tuple[Callable[..., list], list[torch.Tensor]]:
    spans, tensors = [], []
    for c in cases:
        spans.append((len(tensors), len(tensors) + len(c.tensors)))
        tensors.extend(c.tensors)

    def peer_batch(*ts):
        out = []
        for c, (a, b) in zip(cases, spans):
            out.extend(_flat(c.fn(*ts[a:b])))
        return out

    return peer_batch, tensors


def _fuseg(record: list[FusegCompiler]) -> Callable[..., Any]:
    """The "fuseg" backend with its defaults (``runtime.dynamo.fuseg_backend``), keeping its compilers."""

    def fuseg(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        compiler = FusegCompiler()
        record.append(compiler)
        return compile_with_aot(compiler, gm, example_inputs)

    return fuseg


def run_compiled(fn: Callable[..., Any], tensors: Sequence[torch.Tensor], backend: Any) -> tuple[list, list]:
    """(outputs flattened, inputs afterwards) of one call of ``fn`` on fresh copies of ``tensors``,
    eager where ``backend`` is None, else compiled by dynamo for it."""
    torch._dynamo.reset()
    f = fn if backend is None else torch.compile(fn, backend=backend)
    ins = clone_inputs(list(tensors))
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = _flat(f(*ins))
    return out, ins


def _kernels(record: list[FusegCompiler]) -> int:
    return sum(b != "torch" for c in record for p in c.compiled for b in p.backend_of.values())


def _accurate(case: Case, e_out: list, g_out: list, inputs: Sequence[torch.Tensor] | None = None) -> str | None:
    """Each floating output's error against float64 (the program on the inputs in float64) within
    twice eager's, or two units in the last place of its dtype, relative to the output's largest
    magnitude; None where all are."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = _flat(case.fn(*[t.double() if t.is_floating_point() else t.clone()
                              for t in (case.tensors if inputs is None else inputs)]))
    for j, (e, g, r) in enumerate(zip(e_out, g_out, ref)):
        if not isinstance(e, torch.Tensor) or not e.is_floating_point() or e.numel() == 0:
            continue
        rtol, atol = TOLERANCES.get(e.dtype, (1.3e-6, 1e-5))
        if torch.allclose(g, e, rtol=rtol, atol=atol, equal_nan=True):
            continue
        if not (torch.equal(g.isnan(), e.isnan()) and torch.equal(g.isposinf(), e.isposinf())
                and torch.equal(g.isneginf(), e.isneginf())):
            return f"output {j}: NaN or inf where eager has {'none' if e.isfinite().all() else 'others'}"
        finite = e.isfinite()
        e, g, r = e[finite], g[finite], r.double()[finite]
        if e.numel() == 0:
            continue
        scale = max(float(r.abs().nan_to_num(posinf=0, neginf=0).max()), 1e-30)
        err_g = float((g.double() - r).abs().nan_to_num(nan=float("inf")).max()) / scale
        err_e = float((e.double() - r).abs().nan_to_num(nan=float("inf")).max()) / scale
        if err_g > max(2 * err_e, 2 * torch.finfo(e.dtype).eps):
            return f"output {j}: error against float64 {err_g:.2e}, eager's {err_e:.2e} ({e.numel()} values)"
    return None


def judge(case: Case, e_in: list, e_out: list, g_in: list, g_out: list, t_off: int = 0, o_off: int = 0,
          inputs: Sequence[torch.Tensor] | None = None) -> str | None:
    """What differs between eager and ours for one case (None: nothing; ``inputs``: what the call
    took, where not ``case.tensors``). Values that differ beyond
    the dtype's tolerance pass where ours are as accurate as eager's (``_accurate``): a sum of
    values of 100 that cancels to 0.01 differs in its fifth digit between two orders of addition."""
    bad = _compare(case, e_in, e_out, g_in, g_out, t_off, o_off)
    if bad is None or not re.match(r"output \d+ values", bad):
        return bad
    bad = _compare(replace(case, values=False), e_in, e_out, g_in, g_out, t_off, o_off)
    if bad is not None:
        return bad
    rtol, atol = TOLERANCES.get(case.dtype, (1.3e-6, 1e-5))
    for i, (e, g) in enumerate(zip(e_in, g_in[t_off:])):
        try:
            torch.testing.assert_close(g, e, rtol=rtol, atol=atol, equal_nan=True, check_dtype=False)
        except AssertionError:
            return f"input {i} after the call differs"
    return _accurate(case, e_out, g_out[o_off:o_off + len(e_out)], inputs)


class _Failed(Exception):
    pass


def run_group(cases: Sequence[Case], tally: PeerTally) -> list[Outcome]:
    """The cases' outcomes, compiled as one program; raises _Failed where the call raised."""
    fn, tensors = _batch_fn(cases)
    eager = []
    for c in cases:
        out, ins = run_compiled(c.fn, c.tensors, None)
        eager.append((ins, out))
    record: list[FusegCompiler] = []
    tally.compiles += 1
    try:
        g_out, g_in = run_compiled(fn, tensors, _fuseg(record))
    except Exception as e:  # noqa: BLE001 - judged below (ours or torch's)
        raise _Failed(f"{type(e).__name__}: {str(e).strip()[:300]}") from e
    finally:
        tally.kernels += _kernels(record)
    outcomes, t_off, o_off = [], 0, 0
    for c, (e_in, e_out) in zip(cases, eager):
        bad = judge(c, e_in, e_out, g_in, g_out, t_off, o_off)
        outcomes.append(Outcome(c, "pass" if bad is None else "wrong", bad or ""))
        t_off += len(c.tensors)
        o_off += len(e_out)
    return outcomes


def _torchs(case: Case, failure: Outcome) -> bool:
    """Whether ``aot_eager`` (torch's compile path with no compiler of ours) fails the same way."""
    try:
        a_out, a_in = run_compiled(case.fn, case.tensors, "aot_eager")
    except Exception as e:  # noqa: BLE001 - torch's own path raises: what does ours?
        return failure.verdict == "crash" and failure.detail.startswith(type(e).__name__)
    if failure.verdict != "wrong":
        return False
    try:
        g_out, g_in = run_compiled(case.fn, case.tensors, _fuseg([]))
    except Exception:  # noqa: BLE001
        return False
    return judge(case, a_in, a_out, g_in, g_out) is None


def sweep(cases: Sequence[Case], source: str, batch: int = 8) -> PeerTally:
    tally = PeerTally(source)
    start = time.perf_counter()

    def settle(o: Outcome) -> None:
        if o.verdict != "pass" and _torchs(o.case, o):
            o.verdict = "torch"
        tally.outcomes.append(o)

    def go(group: Sequence[Case]) -> None:
        try:
            outs = run_group(group, tally)
        except _Failed as e:
            if len(group) > 1:
                half = len(group) // 2
                go(group[:half])
                go(group[half:])
                return
            tb = "".join(traceback.format_exception(e.__cause__)[-4:]) if e.__cause__ else ""
            settle(Outcome(group[0], "crash", f"{e}\n{tb}"))
            return
        for o in outs:
            if o.verdict == "wrong" and len(group) > 1:
                go([o.case])  # judged alone
                alone = tally.outcomes[-1]
                if alone.verdict == "pass":
                    alone.verdict, alone.detail = "wrong", f"in a batch of {len(group)} only: {o.detail}"
            elif o.verdict == "wrong":
                settle(o)
            else:
                tally.outcomes.append(o)

    together = [c for c in cases if c.batchable]
    for k in range(0, len(together), batch):
        go(together[k:k + batch])
    for c in cases:
        if not c.batchable:
            go([c])
    tally.seconds = time.perf_counter() - start
    return tally


def grown(t: torch.Tensor, by: int = 3, seed: int = 7) -> torch.Tensor:
    """A tensor like ``t`` with every dim of two or more elements ``by`` longer: floating values
    drawn anew, integer and bool ones ``t``'s repeated (their range often means something: class
    indices, counts)."""
    shape = [n + by if n > 1 else n for n in t.shape]
    if t.is_floating_point():
        return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(t.dtype)
    flat = t.flatten() if t.numel() else torch.zeros(1, dtype=t.dtype)
    n = math.prod(shape)
    return flat.repeat(n // flat.numel() + 1)[:n].reshape(shape).clone()


def sweep_dynamic(cases: Sequence[Case], source: str) -> PeerTally:
    """Each case compiled alone with ``dynamic=True`` (Note [symbolic plans]: one plan for every
    size) and called twice, on its tensors and on ``grown`` ones; each call against eager. A grown
    call that eager refuses (a program written for its sizes) is not made."""
    tally = PeerTally(source + ", dynamic=True at two sizes")
    start = time.perf_counter()
    for case in cases:
        record: list[FusegCompiler] = []
        torch._dynamo.reset()
        f = torch.compile(case.fn, backend=_fuseg(record), dynamic=True)
        verdict, detail = "pass", ""
        for call, ts in enumerate((case.tensors, [grown(t) for t in case.tensors])):
            try:
                e_in = clone_inputs(ts)
                torch.manual_seed(0)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    e_out = _flat(case.fn(*e_in))
            except Exception:  # noqa: BLE001 - not a program for these sizes
                continue
            g_in = clone_inputs(ts)
            torch.manual_seed(0)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    g_out = _flat(f(*g_in))
            except Exception as e:  # noqa: BLE001 - judged: a crash of ours
                verdict, detail = "crash", f"call {call}: {type(e).__name__}: {str(e).strip()[:300]}"
                break
            bad = judge(case, e_in, e_out, g_in, g_out, inputs=ts)
            if bad is not None:
                verdict, detail = "wrong", f"call {call} ({[tuple(t.shape) for t in ts]}): {bad}"
                break
        tally.compiles += 1
        tally.kernels += _kernels(record)
        tally.outcomes.append(Outcome(case, verdict, detail))
    tally.seconds = time.perf_counter() - start
    return tally

"""``fuseg bench``: wall time of eager, our runtime (per alias mode and backend) and torch.compile
on the device at hand, with the environment recorded.

Method: every variant of a model is built first, then timed in one process, one after the
other: ``--warmup`` calls, then ``--repeat`` calls each timed alone (CUDA events around the call
on a GPU, ``perf_counter`` after a synchronize on the CPU); the record holds the median, the 10th
and 90th percentiles and the minimum. Compare ratios within one run: absolute times across runs
on a shared machine are noise. On a GPU the kernels one call launches are counted from the torch
profiler (CUPTI sees CuPy's and nvFuser's kernels as well as torch's) and the peak of CUDA memory
one call allocates is recorded (``peak_bytes``). Every variant's outputs
are compared with eager's (max abs difference, recorded; a variant that differs beyond the
dtype's tolerance is flagged ``ok: false``).
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

from alias import apply_aliases
from runtime.compiled.program import CompiledProgram
from segmenter import capture, segment
from segmenter.capturing.from_torch import bind_inputs
from segmenter.capturing.reference import clone_inputs

from . import zoo
from .targets import TargetError

__all__ = ["bench", "call_times", "environment", "run_bench", "write_record"]

TOL = {torch.float32: 1e-3, torch.float64: 1e-6, torch.float16: 1e-2, torch.bfloat16: 5e-2}


def write_record(record: dict[str, Any], out: str | None) -> None:
    """A benchmark's record as indented JSON: into ``out`` when given, else on stdout."""
    text = json.dumps(record, indent=1)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)


def call_times(fn: Callable[..., Any], args: list[Any], calls: int) -> list[float]:
    """Seconds of each of ``calls`` calls of ``fn(*args)``, one by one (the CPU benches of single
    kernels: perf.experiments.depthwise, onetap, patches)."""
    out = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn(*args)
        out.append(time.perf_counter() - t0)
    return out


def environment(device: str) -> dict[str, Any]:
    from runtime.autotune import machine

    cpu = machine()  # what a CPU timing depends on: the CPU's model and flags, the compiler and its flags
    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__, "device": device,
                           "machine": platform.machine(), "cpu_count": os.cpu_count(), "cpu": cpu["cpu"],
                           "cpu_flags": cpu["cpu_flags"], "compiler": cpu["compiler"],
                           "compiler_flags": cpu["compiler_flags"], "torch_threads": torch.get_num_threads(),
                           "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}
    if device == "cpu":  # Note [a vector width measured here]: what the kernels' loops were built for
        from runtime.codegen.vector_width import describe

        width = describe()
        env["kernel_vector_width"] = {k: width[k] for k in ("width", "how", "wide_over_native") if k in width}
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, sm_count=p.multi_processor_count, cuda=torch.version.cuda,
                   gpu_memory_gib=round(p.total_memory / 2**30, 1))
        try:
            env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                           capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            env["driver"] = None
    for mod in ("cupy", "nvfuser", "triton", "transformers"):
        try:
            env[mod] = __import__(mod).__version__
        except Exception as e:  # noqa: BLE001 - a module that fails to import is recorded, not fatal
            env[mod] = f"not importable: {type(e).__name__}: {str(e)[:200]}"
    commit = os.environ.get("FUSEG_GIT_COMMIT")
    if commit is None:
        try:
            commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                                    cwd=os.path.dirname(__file__)).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            commit = None
    env["git_commit"] = commit
    return env


def _on_device(t: Any, device: str, dtype: torch.dtype | None) -> Any:
    if not isinstance(t, torch.Tensor):
        return t
    if t.device.type == "meta":  # real-size zoo entries: materialize them where there is memory for it
        t = torch.randn(t.shape, dtype=torch.float32).to(t.dtype) if t.dtype.is_floating_point else torch.zeros(
            t.shape, dtype=t.dtype)
    if dtype is not None and t.dtype.is_floating_point:
        t = t.to(dtype)
    return t.to(device)


def _timer(device: str) -> Callable[[Callable[[], Any], int, int], list[float]]:
    def cuda_times(fn: Callable[[], Any], warmup: int, repeat: int) -> list[float]:
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        pairs = []
        for _ in range(repeat):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            pairs.append((a, b))
        torch.cuda.synchronize()
        return [a.elapsed_time(b) for a, b in pairs]

    def cpu_times(fn: Callable[[], Any], warmup: int, repeat: int) -> list[float]:
        for _ in range(warmup):
            fn()
        out = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
        return out

    return cuda_times if device == "cuda" else cpu_times


def _kernels_launched(fn: Callable[[], Any]) -> int | None:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and not e.name.startswith(("Memcpy", "Memset")))


def _peak_bytes(fn: Callable[[], Any]) -> int:
    """CUDA memory allocated at the peak of one call, above what was allocated before it."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    del out
    return torch.cuda.max_memory_allocated() - base


def _tensors(x: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(x) if isinstance(t, torch.Tensor)]


def _max_diff(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    worst = 0.0
    for g, w in zip(got, want):
        if g.shape != w.shape:
            return math.inf
        if w.numel():
            worst = max(worst, (g.double() - w.double()).abs().nan_to_num(0.0).max().item())
    return worst


def bench(models: list[str], device: str = "cpu", modes: tuple[str, ...] = ("post", "pre", "off"),
          backends: tuple[str, ...] = ("auto",), inductor: bool = False, warmup: int = 5, repeat: int = 50,
          progress: bool = True) -> list[dict[str, Any]]:
    timer = _timer(device)
    rows: list[dict[str, Any]] = []
    for name in models:
        entry = zoo.ZOO.get(name)
        if entry is None:
            raise TargetError(f"unknown model {name!r}; built-in examples: {', '.join(zoo.ZOO)}")
        fn, inputs = entry.factory()
        dtype = torch.bfloat16 if device == "cuda" and name.startswith("rope-") else None
        inputs = [_on_device(t, device, dtype) for t in inputs]
        module = fn if isinstance(fn, torch.nn.Module) else None
        if module is not None:
            if any(t.device.type == "meta" for t in (*module.parameters(), *module.buffers())):
                raise TargetError(f"{name}: its weights are on the meta device (a real-size config): it can be "
                                  "profiled (fuseg profile), not benchmarked")
            module.to(device)
        with torch.no_grad():
            want = _tensors(fn(*clone_inputs(inputs)))
        graph = capture(fn, clone_inputs(inputs), name=name)
        sf = segment(graph)
        variants: dict[str, tuple[Callable[[], Any], dict[str, Any]]] = {}
        args = clone_inputs(inputs)
        variants["eager"] = (lambda f=fn, a=args: f(*a), {})
        for mode in modes:
            plan = apply_aliases(sf, mode)
            for backend in backends:
                prog = CompiledProgram(plan, backend)
                full = bind_inputs(graph, module, clone_inputs(inputs))
                used = sorted(set(prog.backend_of.values()))
                stats = plan.stats()
                variants[f"fuseg-{mode}-{backend}"] = (lambda p=prog, a=full: p(*a), {
                    "alias_mode": mode, "backend": backend, "backends_used": used,
                    "kernels_planned": stats["kernels"], "launches_planned": stats["launches"],
                    "metadata_ops": stats["metadata"], "fallbacks": prog.fallbacks})
        if inductor:
            try:
                compiled = torch.compile(fn)
                a = clone_inputs(inputs)
                with torch.no_grad():
                    compiled(*a)
                variants["inductor"] = (lambda c=compiled, a=a: c(*a), {})
            except Exception as e:  # noqa: BLE001 - recorded: inductor does not run everywhere
                rows.append({"model": name, "variant": "inductor", "error": f"{type(e).__name__}: {str(e)[:300]}"})
        for variant, (call, extra) in variants.items():
            try:
                with torch.no_grad():
                    got = _tensors(call())
                    times = timer(call, warmup, repeat)
                    kernels = _kernels_launched(call) if device == "cuda" else None
                    peak = _peak_bytes(call) if device == "cuda" else None
            except Exception as e:  # noqa: BLE001 - one broken variant is recorded, the run goes on
                rows.append({"model": name, "variant": variant, "device": device, "ok": False,
                             "error": f"{type(e).__name__}: {str(e)[:300]}", **extra})
                if progress:
                    print(f"{name:>15} {variant:<22} ERROR {type(e).__name__}: {str(e)[:120]}", file=sys.stderr)
                continue
            diff = _max_diff(got, want)
            tol = max((TOL.get(t.dtype, 0.0) for t in want), default=0.0)
            q = statistics.quantiles(times, n=10) if len(times) >= 2 else [times[0]] * 9
            row = {"model": name, "variant": variant, "device": device, "median_ms": statistics.median(times),
                   "p10_ms": q[0], "p90_ms": q[-1], "min_ms": min(times), "repeat": repeat, "warmup": warmup,
                   "kernels_launched": kernels, "peak_bytes": peak, "max_abs_diff": diff, "ok": diff <= tol * max(1.0, max(
                       (w.double().abs().max().item() for w in want if w.numel()), default=1.0)), **extra}
            rows.append(row)
            if progress:
                print(f"{name:>15} {variant:<22} {row['median_ms']:9.4f} ms  kernels={kernels}  "
                      f"diff={diff:.2g}{'' if row['ok'] else '  MISMATCH'}", file=sys.stderr)
        del variants
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def run_bench(models: list[str], device: str, out: str | None,
              shard: tuple[tuple[int, int] | None, list[str]] | None = None, **kw: Any) -> dict[str, Any]:
    """``shard``: (I, N) and the whole list of models, where ``models`` is one shard of it: the
    record is then a sweep record that ``fuseg report merge`` joins (Note [shards of a sweep])."""
    import json

    if device == "cuda" and not torch.cuda.is_available():
        raise TargetError("--device cuda: no CUDA device here")
    result = {"benchmark": "fuseg bench", "environment": environment(device), "rows": bench(models, device, **kw)}
    if shard is not None and shard[0] is not None:
        from .shards import record

        sweep = record("bench", shard[1], shard[0], result["rows"], {k: repr(v) for k, v in sorted(kw.items())})
        result = {**sweep, **result}  # (bench's environment: where its times were taken)
    if out:
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return result


"""The vector width generated CPU kernels prefer, measured on this CPU (issue 64).

Note [a vector width measured here]: g++ vectorizes a kernel's loops at the width its tuning for
``-march=native`` prefers, which is not the widest the CPU has: g++ 12.2 takes an Intel Xeon with
AMX (Sapphire Rapids' features) as rocketlake and prefers 256-bit vectors there, though the CPU
runs 512-bit ones (ATen's own kernels, and Inductor's, use them). On that Xeon a fp16 relu kernel
of 128 x 2048 took 486 us on one thread at 256 bits and 313 us at 512 (the same source, scratch),
and gpt2-768's float32 program ran at 1.07-1.12x Inductor's time built one way and 0.99-1.00x the
other (separate processes, scratch). Whether the wide vectors pay depends on the CPU (how it
splits them, what its clock does under them), so it is measured, once per machine: a probe of
loops written as the kernels write them (an exp, an erf, fp16 and bf16 conversions, rows summed
and scaled, a plain add) is built twice, once with ``#pragma GCC target("prefer-vector-width=512")``
at its top, and the two are timed on one thread in alternated rounds. The wide build is taken
where its geometric mean over the loops is faster by more than ``TIE``; then every kernel's source
starts with that pragma (``pragma``), so its cache entry and the verdicts of choices by
measurement (whose file is named by it: runtime/autotune.py) are those of the wide build. The
decision is kept in the cache dir beside the thread thresholds (a second process takes it without
measuring), named by the machine, the compiler and the probe. Nothing is measured where the CPU
has no AVX-512, the compiler is not GCC, or its tuning for the CPU already prefers 512 bits; the
``vector_width`` option (``FUSEG_VECTOR_WIDTH``: ``measure``, ``native``, ``512``) sets it instead;
the test suite sets ``native``. Built for 512 bits on that Xeon, tests/test_reduction_accuracy.py,
tests/test_codegen.py and tests/test_low_precision.py pass with ``--run-slow``; the peer suite's
slow reduction programs give the same verdicts at both widths: two of them miss eager's accuracy
at either (a sum over dim 0 of 50^3 values, 2.9e-7 off float64 against eager's 1.1e-7, which
failed the same way at 98dd8a4, before this width existed; and the row sum of 2^20 + 3 normal
values that the zeros-and-ones program is called on at its second size, under a symbolic plan,
4.2e-6 against 6.2e-7), left for issue 64's exactness work. A
measured width is a choice by timing made once per machine:
later processes keep it (reductions that vectorize along a row add in the lanes of that width,
so their last bits follow it), ``torch.use_deterministic_algorithms`` included.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import platform
import re
import statistics
import subprocess
import threading
import time
from typing import Any

import torch

from runtime.machine.compiler import _compile_into, _sound, _version, cache_dir, cpu_compiler, machine, write_whole
from runtime.machine.once import once
from runtime.options import current

from .source.ctypes_ import prelude

__all__ = ["LOOPS", "PRAGMA", "TIE", "describe", "kept_path", "measure", "pragma", "resolve"]

#: the line every CPU kernel's source starts with where 512-bit vectors were measured faster
PRAGMA = '#pragma GCC target("prefer-vector-width=512")\n'
#: the wide build is taken where its time is under the native build's divided by this
TIE = 1.03
ROUNDS = 7
_N = 4096  # elements a loop (16 KiB of floats an array: in the first-level cache)
_REPS = 64  # loops a timed call

_PROBE = r"""
extern "C" void fuseg_probe(int which, int reps, const float* __restrict__ x, const float* __restrict__ y,
                            float* __restrict__ z, const unsigned short* __restrict__ a,
                            const unsigned short* __restrict__ b, unsigned short* __restrict__ c) {
  for (int r = 0; r < reps; ++r) {
    if (which == 0) {
#pragma omp simd
      for (long i = 0; i < N; ++i) z[i] = fuseg_exp(x[i] - 1.0f) * y[i];
    } else if (which == 1) {
#pragma omp simd
      for (long i = 0; i < N; ++i) z[i] = 0.5f * x[i] * (1.0f + fuseg_erf(x[i] * 0.7071067811865476f));
    } else if (which == 2) {
#pragma omp simd
      for (long i = 0; i < N; ++i) c[i] = fuseg_f2h(fuseg_h2f(a[i]) + fuseg_h2f(b[i]));
    } else if (which == 3) {
#pragma omp simd
      for (long i = 0; i < N; ++i) c[i] = fuseg_f2bf(fuseg_bf2f(a[i]) * fuseg_bf2f(b[i]));
    } else if (which == 4) {
      for (long row = 0; row < N / 96; ++row) {
        const float* xr = x + row * 96;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (long j = 0; j < 96; ++j) s += xr[j] * xr[j];
        const float k = 1.0f / sqrt(s / 96.0f + 1e-6f);
#pragma omp simd
        for (long j = 0; j < 96; ++j) z[row * 96 + j] = xr[j] * k * y[j];
      }
    } else {
#pragma omp simd
      for (long i = 0; i < N; ++i) z[i] = x[i] + y[i];
    }
  }
}
"""
#: the probe's loops, in ``which`` order
LOOPS = ("exp", "erf gelu", "fp16 add", "bf16 mul", "rows of 96 normalized", "add")

_LOCK = threading.Lock()
_RESOLVED: dict[str, int] = {}


def _source(wide: bool) -> str:
    # (the prelude's matmul routines are compiled, never called: any settings do)
    return (PRAGMA if wide else "") + ("#define FUSEG_I long long\n#define FUSEG_PARALLEL_MACS (1LL << 62)\n"
                                       "#define FUSEG_PACK_ROWS 4\n#define FUSEG_NN_PACK_ROWS 16\n") + (
        prelude("cpu") + f"#define N {_N}\n" + _PROBE)


def _native_preference(cxx: str) -> str:
    """What ``-mprefer-vector-width`` g++ takes for ``-march=native`` ("none": its tuning's own)."""
    try:
        out = subprocess.run([cxx, "-march=native", "-Q", "--help=target"], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    m = re.search(r"-mprefer-vector-width=\s+(\S+)", out)
    return m.group(1) if m else "unknown"


def _why_not(cxx: str | None) -> str | None:
    """Why nothing is measured on this machine, or None."""
    if cxx is None:
        return "no C++ compiler"
    if platform.machine() not in ("x86_64", "AMD64"):
        return f"not an x86-64 CPU ({platform.machine()})"
    if "avx512f" not in machine()["cpu_flags"].split():
        return "the CPU has no AVX-512"
    version = _version(cxx).lower()
    if "clang" in version or not ("g++" in version or "gcc" in version):
        return "the compiler is not GCC"
    if _native_preference(cxx) == "512":
        return "the compiler already prefers 512-bit vectors on this CPU"
    return None


def kept_path() -> str:
    """The file the decision is kept in, named by the machine, the compiler and the probe."""
    what = json.dumps(machine(), sort_keys=True) + _source(True)
    return os.path.join(cache_dir(), f"vector-width-{hashlib.sha256(what.encode()).hexdigest()[:16]}.json")


def _library(wide: bool, cxx: str) -> str:
    src = _source(wide)
    path = os.path.join(cache_dir(), f"fuseg_vector_probe_{hashlib.sha256(src.encode()).hexdigest()[:24]}.so")
    if not _sound(path):
        _compile_into(path, cxx, src, "fuseg_vector_probe", count="library")
    return path


def measure(clock: Any = time.perf_counter, rounds: int = ROUNDS) -> dict[str, Any]:
    """Both builds of the probe timed on one thread in alternated rounds: per loop the median
    microseconds of a call of each, and the width taken (512, or 0: the compiler's own)."""
    cxx = cpu_compiler()
    assert cxx is not None
    libs = {w: ctypes.CDLL(_library(w == 512, cxx)) for w in (0, 512)}
    x, y = torch.rand(_N) * 4 - 2, torch.rand(_N) * 4 - 2
    z = torch.empty(_N)
    a, b = x.half().view(torch.int16), y.half().view(torch.int16)
    c = torch.empty(_N, dtype=torch.int16)
    ptrs = [ctypes.c_void_p(t.data_ptr()) for t in (x, y, z, a, b, c)]
    times: dict[int, dict[str, list[float]]] = {w: {name: [] for name in LOOPS} for w in libs}
    for k in range(rounds):
        for w in ((0, 512) if k % 2 == 0 else (512, 0)):
            fn = libs[w].fuseg_probe
            for which, name in enumerate(LOOPS):
                t0 = clock()
                fn(which, _REPS, *ptrs)
                times[w][name].append((clock() - t0) * 1e6 / _REPS)
    medians = {name: [statistics.median(times[0][name]), statistics.median(times[512][name])] for name in LOOPS}
    ratios = [wide / native for native, wide in medians.values() if native > 0]
    geo = statistics.geometric_mean(ratios) if ratios and min(ratios) > 0 else 1.0
    return {"width": 512 if geo * TIE < 1 else 0, "wide_over_native": geo, "loops_us": medians,
            "how": "measured"}


def _kept() -> dict[str, Any] | None:
    try:
        with open(kept_path(), encoding="utf-8") as f:
            got = json.load(f)
        return got if got.get("width") in (0, 512) else None
    except (OSError, ValueError, AttributeError):
        return None


def resolve() -> int:
    """The width kernels are generated for here (512, or 0: the compiler's own): the option's, else
    the kept decision, else measured now and kept; measured once a process."""
    setting = current().vector_width
    if setting == "native":
        return 0
    if setting == "512":
        return 512
    return int(once(_RESOLVED, current().cache_dir or "", _LOCK, _decide))


def _decide() -> int:
    # (a kept decision first: it was measured on this machine and compiler, which name its file, so
    # a later process asks the compiler nothing)
    kept = _kept()
    if kept is not None:
        return int(kept["width"])
    if _why_not(cpu_compiler()) is not None:
        return 0
    try:
        decision = measure()
    except (OSError, AttributeError, RuntimeError):  # (a probe that fails to build or load: the compiler's width, not kept)
        return 0
    decision["machine"] = machine()
    try:
        write_whole(kept_path(), json.dumps(decision, indent=1), ".vector-width-")
    except OSError:
        pass  # kept for this process only
    return int(decision["width"])


def pragma(target: str) -> str:
    """The first line of a kernel's source: ``PRAGMA`` on the CPU where 512-bit vectors were
    chosen (Note [a vector width measured here]), else nothing."""
    return PRAGMA if target == "cpu" and resolve() == 512 else ""


def describe() -> dict[str, Any]:
    """The width kernels are generated for here and why (``fuseg threads``): ``width`` (512, or 0:
    the compiler's own), ``how``, and where measured the kept medians."""
    width = resolve()
    setting = current().vector_width
    if setting != "measure":
        return {"width": width, "how": f"set by FUSEG_VECTOR_WIDTH={setting}"}
    why = _why_not(cpu_compiler())
    if why is not None:
        return {"width": width, "how": f"not measured: {why}"}
    kept = _kept()
    if kept is None:
        return {"width": width, "how": "not measured: the probe failed to build or load"}
    return {"width": width, "how": "measured", "path": kept_path(), "wide_over_native": kept.get("wide_over_native"),
            "loops_us": kept.get("loops_us")}

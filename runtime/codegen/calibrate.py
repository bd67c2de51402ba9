"""The thread thresholds measured on this CPU, and kept in the kernel cache dir (issue 42).

Note [how the thresholds are measured]: one library (the prelude and a few loops, built with the
kernels' own flags) times, on torch's threads (its libgomp is the one loaded):

* ``loop``: a loop of one plain op an element over rows of 64 (``y = x * w + b``, the row's
  weights broadcast: a bias add) at 2^9 .. 2^20 elements, on one thread against the threads;
* ``macs``: the prelude's ``fuseg_mm_nt`` (the linear layers' product) at M x 2M by M for
  M = 16 .. 256, its threshold a variable here, on one thread against the threads;
* ``beside_loop``, ``beside_macs``: two such loops (products) at once, one thread each, as the
  runner runs a group (Note [kernels side by side] in runtime/compiled/chains.py), against the two one
  after the other, each as it runs alone (on the threads from the threshold just measured);
* ``pack_rows``, ``nn_pack_rows``: on one thread, a product whose B is read in place against one
  that copies B first (Note [register tiles] in runtime/codegen/source/gemm_prelude.py), by rows of C: a small linear
  layer's (2..32 rows by 256 x 128, B contiguous along k) and a wide B read along its rows
  (16..128 rows by GPT-2's 2304 columns, one block of 256 of k);
* ``costly_call``: on one thread, the loop above and one of ``fuseg_exp`` over 2^18 elements:
  how many plain ops an exp costs (Note [work of a loop] in kernel.py).

Each size's calls alternate the two ways, one right after the other, ``CALLS`` pairs, the order
swapped from pair to pair, each call timed in C (``clock_gettime``, no Python between); the
first pair is not counted, the medians are compared, and two ways within ``TIE`` of each other
are a tie. Each ladder runs from its largest size down (the core's clock ramped up on the big
work before the small sizes, whose calls are shortest), and each rung is judged as it comes by
Note [a disturbed measurement] (runtime/codegen/disturbance.py): a median that another process
made (a call waiting out its scheduler slice) stops the measuring there. ``loop`` and ``macs``: the smallest size from which threads were faster, there and at
the next two sizes; twice the largest where they never were. ``beside_*``: a kernel may run
beside others up to the sizes where side by side was faster (past a tie, from the first size
after the last such win that ties or loses, there and at the next two), never below the alone
threshold: a kernel that takes no threads may always join a group, whose trial in its chain
decides (Note [kernels side by side]). The pack rows: from where the copy was faster at all (no
tie: it is the same product either way), there and at the next two. Calls back to back keep the other threads awake
(libgomp's threads spin a while after a region before they sleep), which is what they are
inside a program's chain of kernels; a loop waking threads that slept (a gap of 10 ms between
calls, scratch runs on the AMD EPYC) paid about 20-30 us, which no threshold of work hides.

On the AMD EPYC family 25 model 17 (2 threads; calibrations in one process, scratch): a loop
on the threads from 2^13 or 2^14 elements (once 2^12), a product from 2 x 48^3 multiply-adds; products
side by side 1.2-1.5x faster than one after the other up to 2 x 96^3 and a tie from 2 x 128^3,
so ``beside_macs`` 2^22 (the hand-set constant before); loops side by side within 0-15% of one
after the other from 2^13 on, so ``beside_loop`` came out 2^13 .. 2^17 by the noise of those
near-ties; an exp 5-7 plain ops; B copied first from 5 rows (the constant before), and a wide
B's panels never copied up to 128 rows (1.06-1.28x slower copied; the constant, 64 rows, came
from the AVX2 EPYC, where GPT-2's product went from 4.28 to 3.39 ms with the copy). About 0.2 s
of measuring.

What is kept: a file per machine (Note [choices by measurement]'s ``machine``: the CPU's model
and flags, the compiler and torch) and thread count, holding the thresholds and every median
they came from. A damaged or foreign file reads as none and is measured again; one that cannot
be written leaves the thresholds to this process. So does a file whose medians the rule finds
disturbed (one kept before it existed: on the EPYC, ``loop`` 2^21 from threaded calls of 8-20
ms), which is measured again. A disturbed measurement is measured again after ``RETRY_PAUSE``
(0.1 s), up to ``ATTEMPTS`` (3) in all, a new one only within ``RETRY_BUDGET`` (1 s) of the
first verdict; each disturbed one stops at its first disturbed rung (on the EPYC under a busy
neighbour: the first rung, 21 pairs of calls, the threaded ones 8 ms each, about 0.2 s). Where
every one was disturbed, nothing is kept (the next process measures again) and this process
takes ``UNMEASURED``'s values, said as "disturbed" (the ``fuseg.thresholds`` log, ``fuseg
threads``), not the least disturbed attempt's: those describe a machine whose other cores are
taken, threads that never pay (twice the largest size) where the cores are free again once the
neighbour's burst ends, and an attempt that stopped early has no figures past its ladder; the
hand-set values held on the machines they were set on (a quiet EPYC measures 2^14 elements
against their 2^15, 2.2 x 10^5 multiply-adds against their 2^22: products between run on one
thread for that process). The measuring holds the background compilers
stopped (Note [compilers paused while dynamo traces]), which would take a core from the threads.
Its library is built once per cache dir, about a second: ``prepare`` starts that build in the
background when dynamo first looks the backend up (runtime/dynamo.py's import), so it runs while
dynamo traces the first graph: on gpt-neox-tiny with an empty cache, started at the backend's
first graph instead, the first call waited 0.5 s for it (2.16 s against 1.44 with the
thresholds set; scratch).
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import dataclasses
import hashlib
import json
import logging
import os
import statistics
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from runtime.options import current

from ..machine.compiler import _compile_into, _cpu_build_key, _sound, cache_dir, cpu_compiler, machine, write_whole
from . import thresholds
from .disturbance import disturbed, rungs_disturbed
from .thresholds import UNMEASURED, Thresholds

__all__ = ["ATTEMPTS", "CALLS", "FIELDS", "RETRY_BUDGET", "RETRY_PAUSE", "TIE", "keep", "kept_detail",
           "kept_or_measured", "last_detail", "measure", "prepare", "thresholds_path"]

#: under the ``fuseg`` logger that ``TORCH_LOGS=fuseg`` configures (Note [fuseg in torch's logs])
log = logging.getLogger("fuseg.thresholds")

#: timed pairs of calls per size (the first not counted); of the wide products, whose calls take
#: a millisecond (their two ways 6-27% apart on the AVX-512 EPYC, far above the noise)
CALLS = 21
_SLOW_CALLS = 7
#: what counts as a tie between two ways: the faster must take less than the other's time
#: over this (a margin chosen, not measured: a product of one panel, the same code both ways,
#: gave medians within 1% of each other in the runs on the AVX-512 EPYC, and a single call's
#: noise there reached more); and a kernel runs alone (on its threads) rather than beside another from where that takes at most
#: this much more than a pair side by side (a tie goes to its own threads: a group's partner is
#: seldom its equal, and a group waits for its slowest kernel)
TIE = 1 + 1 / 16
#: the loop's elements, as powers of two; the product's M
_LOOP_BITS = range(9, 21)
_MM_SIZES = (16, 24, 32, 48, 64, 96, 128, 192, 256)
#: rows of the products whose B is copied first or read in place, and their N and K: a small
#: model's linear layer (nt) and a wide B read along n (nn: GPT-2's Conv1D of 768 -> 2304, one
#: block of k; the shape that set the constant on the AVX2 EPYC)
_PACK_ROWS = (2, 3, 4, 5, 6, 8, 12, 16, 24, 32)
_PACK_N, _PACK_K = 256, 128
_NN_PACK_ROWS = (16, 32, 48, 64, 96, 128)
_NN_PACK_N, _NN_PACK_K = 2304, 256
_COLS = 64

_SOURCE = r"""
#include <time.h>
extern "C" void omp_set_num_threads(int);
static double fuseg_cal_now() { timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
// what every ladder does: ``calls`` calls of the two ways (t = 0, 1), the order swapped from call
// to call, each timed into out[2 c + t], nanoseconds
#define FUSEG_CAL_ALTERNATE(...)                          \
  for (long c = 0; c < calls; ++c)                        \
    for (int k_ = 0; k_ < 2; ++k_) {                      \
      const int t = (c & 1) ? 1 - k_ : k_;                \
      const double t0 = fuseg_cal_now();                  \
      __VA_ARGS__;                                        \
      out[2 * c + t] = fuseg_cal_now() - t0;              \
    }
static void fuseg_cal_loop(const float* x, const float* w, float* y, long rows, int threads) {
#pragma omp parallel for schedule(static) if (threads)
  for (long i = 0; i < rows; ++i)
    for (long j = 0; j < @COLS@; ++j) y[i * @COLS@ + j] = x[i * @COLS@ + j] * w[j] + w[@COLS@ + j];
}
static void fuseg_cal_product(long m, const float* A, const float* B, float* C) {
  fuseg_mm_nt(m, 2 * m, m, A, m, B, m, C, 2 * m, nullptr, 0, 0);
}
// two loops (products) at once, one thread each, as the runner runs a group
static void fuseg_cal_side_loops(const float* x, const float* w, float* y, float* z, long rows) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(2)
  for (int j = 0; j < 2; ++j) {
    omp_set_num_threads(1);
    fuseg_cal_loop(x, w, j ? z : y, rows, 0);
  }
}
static void fuseg_cal_side_products(long m, const float* A, const float* B, float* C, float* D) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(2)
  for (int j = 0; j < 2; ++j) {
    omp_set_num_threads(1);
    fuseg_cal_product(m, A, B, j ? D : C);
  }
}
// one loop on one thread (t = 0) or on the threads (t = 1)
extern "C" void fuseg_cal_loops(const float* x, const float* w, float* y, long rows, long calls, double* out) {
  FUSEG_CAL_ALTERNATE(fuseg_cal_loop(x, w, y, rows, t))
}
// two loops side by side (t = 0), or one after the other, each as it runs alone (t = 1: on the
// threads where ``alone``)
extern "C" void fuseg_cal_loop_pairs(const float* x, const float* w, float* y, float* z, long rows, int alone,
                                     long calls, double* out) {
  FUSEG_CAL_ALTERNATE(if (t) { fuseg_cal_loop(x, w, y, rows, alone); fuseg_cal_loop(x, w, z, rows, alone); }
                      else fuseg_cal_side_loops(x, w, y, z, rows))
}
// a product (M x 2M by M) on one thread (t = 0) or on the threads (t = 1)
extern "C" void fuseg_cal_products(long m, const float* A, const float* B, float* C, long calls, double* out) {
  FUSEG_CAL_ALTERNATE(fuseg_cal_macs = t ? 0 : (1LL << 62); fuseg_cal_product(m, A, B, C))
}
// two products side by side (t = 0), or one after the other, each as it runs alone (t = 1: on
// the threads from ``alone`` multiply-adds)
extern "C" void fuseg_cal_product_pairs(long m, const float* A, const float* B, float* C, float* D, long long alone,
                                        long calls, double* out) {
  FUSEG_CAL_ALTERNATE(fuseg_cal_macs = t ? alone : (1LL << 62);
                      if (t) { fuseg_cal_product(m, A, B, C); fuseg_cal_product(m, A, B, D); }
                      else fuseg_cal_side_products(m, A, B, C, D))
}
// on one thread, a product of m rows by B contiguous along k (a linear layer's, M x N by K) that
// reads B in place (t = 0) or copies it contiguous along n first (t = 1)
extern "C" void fuseg_cal_packs(long m, long n, long k, const float* A, const float* B, float* C, long calls,
                                double* out) {
  fuseg_cal_macs = 1LL << 62;
  FUSEG_CAL_ALTERNATE(fuseg_cal_pack = t ? 0 : (1L << 62); fuseg_mm_nt(m, n, k, A, k, B, k, C, n, nullptr, 0, 0))
}
// the same by B contiguous along n (M x N by K, B's rows N apart), read in place (t = 0) or
// panel by panel copied first (t = 1)
extern "C" void fuseg_cal_nn_packs(long m, long n, long k, const float* A, const float* B, float* C, long calls,
                                   double* out) {
  fuseg_cal_macs = 1LL << 62;
  FUSEG_CAL_ALTERNATE(fuseg_cal_nn_pack = t ? 0 : (1L << 62); fuseg_mm_nn(m, n, k, A, k, 1, B, n, C, n, nullptr, 0, 0))
}
// out[2 c]: the plain loop, out[2 c + 1]: a loop of exp, one thread, nanoseconds
extern "C" void fuseg_cal_costly(const float* x, const float* w, float* y, long n, long calls, double* out) {
  for (long c = 0; c < calls; ++c) {
    double t0 = fuseg_cal_now();
    fuseg_cal_loop(x, w, y, n / @COLS@, 0);
    out[2 * c] = fuseg_cal_now() - t0;
    t0 = fuseg_cal_now();
    for (long i = 0; i < n; ++i) y[i] = fuseg_exp(x[i]);
    out[2 * c + 1] = fuseg_cal_now() - t0;
  }
}
""".replace("@COLS@", str(_COLS))


def source() -> str:
    """The library's source: the prelude with its matmul threshold a variable, then the loops."""
    from .source.ctypes_ import prelude

    return ("#define FUSEG_I long long\n#define FUSEG_PARALLEL_MACS fuseg_cal_macs\n"
            "#define FUSEG_PACK_ROWS fuseg_cal_pack\n#define FUSEG_NN_PACK_ROWS fuseg_cal_nn_pack\n"
            "static long long fuseg_cal_macs = 0;\nstatic long fuseg_cal_pack = 0, fuseg_cal_nn_pack = 0;\n"
            + prelude("cpu") + _SOURCE)


def _library_path() -> str:
    digest = hashlib.sha256((source() + _cpu_build_key()).encode()).hexdigest()[:24]
    return os.path.join(cache_dir(), f"fuseg_thresholds_{digest}.so")


def _build() -> str:
    """The library, built into the cache dir where it is not there whole; its path."""
    path = _library_path()
    if not _sound(path):
        cxx = cpu_compiler()
        if cxx is None:
            raise OSError("no C++ compiler found (set CXX)")
        _compile_into(path, cxx, source(), "fuseg_thresholds")
    return path


_PREPARED: dict[str, concurrent.futures.Future] = {}
_PREPARE_LOCK = threading.Lock()


def prepare() -> None:
    """Where the thresholds are neither set nor kept, start building the library in the
    background (the first ``measure`` waits for it)."""
    if current().thread_thresholds or torch.get_num_threads() <= 1 or cpu_compiler() is None:
        return
    if _kept(torch.get_num_threads()) is not None:
        return
    with _PREPARE_LOCK:
        if "build" in _PREPARED or thresholds.resolved():
            return
        pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fuseg-thresholds")
        _PREPARED["build"] = pool.submit(_build)
        pool.shutdown(wait=False)


def _built() -> str:
    with _PREPARE_LOCK:
        future = _PREPARED.pop("build", None)
    if future is not None:
        try:
            return future.result()
        except Exception:  # noqa: BLE001 - built again below, where the error shows
            pass
    return _build()


# -- measuring --------------------------------------------------------------------------------

def _medians(out: Any) -> tuple[float, float]:
    """The medians (ns) of the two ways' calls, the first pair not counted."""
    pairs = out.view(-1, 2)[1:]
    return statistics.median(pairs[:, 0].tolist()), statistics.median(pairs[:, 1].tolist())


def _threshold(ladder: list[tuple[int, float, float]], tie: float = TIE) -> int:
    """The smallest size from which the second way was faster than the first by more than
    ``tie`` (a copy first, whose cost is its own: any faster), there and at the next two sizes
    measured (``ladder``: size, the first way's ns, the second's, by size); twice the largest
    size where no such size was measured."""
    for i, (size, first, second) in enumerate(ladder):
        if second * tie < first and all(s2 * tie < f2 for _, f2, s2 in ladder[i + 1:i + 3]):
            return size
    return 2 * ladder[-1][0]


def _beside(ladder: list[tuple[int, float, float]], alone: int) -> int:
    """See Note [how the thresholds are measured]: from where a kernel keeps to itself (``ladder``:
    size, a pair's ns side by side, one after the other each as it runs alone): above every size
    where side by side was faster by more than ``TIE``, from the first size where it was not,
    there and at the next; never below ``alone``; twice the largest size where side by side won
    at the largest."""
    wins = [i for i, (_, side, apart) in enumerate(ladder) if apart > side * TIE]
    if not wins:
        return alone
    rest = ladder[wins[-1] + 1:]
    least = _threshold([(size, side * TIE * TIE, apart) for size, side, apart in rest]) if rest else 2 * ladder[-1][0]
    return max(least, alone)


def _ladders_of(run: Callable[[str, int, int], tuple[float, float]], threads: int) -> dict[str, Any]:
    """Every ladder, by ``run(name, arg, alone)``: the medians (ns) of the ladder ``name``'s two
    ways at ``arg`` (elements, M, rows), ``alone`` the threshold its second way runs on the
    threads from (``beside_*``); each ladder from its largest size down, each rung judged as it
    comes (Note [a disturbed measurement]): at the first disturbed one the measuring stops, and
    the record holds the rungs measured so far. The record: ``{name}_ns``, each ladder by size,
    the costly call's, ``threads``."""
    rungs = {"loop": [(1 << b, 1 << b) for b in _LOOP_BITS], "macs": [(2 * m ** 3, m) for m in _MM_SIZES],
             "pack_rows": [(m, m) for m in _PACK_ROWS], "nn_pack_rows": [(m, m) for m in _NN_PACK_ROWS]}
    detail: dict[str, Any] = {"threads": threads}
    alone = {"loop": 0, "macs": 0}
    for name in ("loop", "beside_loop", "macs", "beside_macs", "pack_rows", "nn_pack_rows"):
        kind = name.removeprefix("beside_")
        ladder: list[tuple[int, float, float]] = []
        detail[f"{name}_ns"] = ladder
        for size, arg in reversed(rungs[kind]):
            ladder.insert(0, (size, *run(name, arg, alone[kind] if name != kind else 0)))
            if rungs_disturbed(name, ladder, threads, alone[kind] if name != kind else None):
                return detail
        if name in alone:
            alone[name] = _threshold(ladder)
    n = 1 << 18
    plain, costly = run("costly", n, 0)
    return {**detail, "plain_ns_an_element": plain / n, "exp_ns_an_element": costly / n}


def _measure_ladders(threads: int) -> dict[str, Any]:
    """Note [how the thresholds are measured], on ``threads`` of torch's: ``_ladders_of`` the
    library's loops and products."""
    from ..machine import pause
    from . import gemm_library

    gemm_library.load()  # (its products call the matmul library: Note [one matmul library])
    lib = ctypes.CDLL(_built())
    ptr, n_ = ctypes.c_void_p, ctypes.c_long
    out = torch.empty(2 * CALLS, dtype=torch.float64)
    top, big = 1 << max(_LOOP_BITS), max(_MM_SIZES)
    x, w = torch.rand(top) - 0.5, torch.randn(2 * _COLS)
    y, z = torch.empty(top), torch.empty(top)
    a, b = torch.rand(big * big), torch.rand(max(2 * big * big, _NN_PACK_K * _NN_PACK_N))
    c, d = torch.empty(max(2 * big * big, 128 * _NN_PACK_N)), torch.empty(2 * big * big)
    xp, wp, yp, zp = (ptr(t.data_ptr()) for t in (x, w, y, z))
    ap, bp, cp, dp, outp = (ptr(t.data_ptr()) for t in (a, b, c, d, out))

    def run(name: str, arg: int, alone: int) -> tuple[float, float]:
        calls = CALLS
        if name == "loop":
            lib.fuseg_cal_loops(xp, wp, yp, n_(arg // _COLS), n_(calls), outp)
        elif name == "beside_loop":
            lib.fuseg_cal_loop_pairs(xp, wp, yp, zp, n_(arg // _COLS), ctypes.c_int(int(arg >= alone)), n_(calls), outp)
        elif name == "macs":
            lib.fuseg_cal_products(n_(arg), ap, bp, cp, n_(calls), outp)
        elif name == "beside_macs":
            lib.fuseg_cal_product_pairs(n_(arg), ap, bp, cp, dp, ctypes.c_longlong(alone), n_(calls), outp)
        elif name == "pack_rows":
            lib.fuseg_cal_packs(n_(arg), n_(_PACK_N), n_(_PACK_K), ap, bp, cp, n_(calls), outp)
        elif name == "nn_pack_rows":
            calls = _SLOW_CALLS
            lib.fuseg_cal_nn_packs(n_(arg), n_(_NN_PACK_N), n_(_NN_PACK_K), ap, bp, cp, n_(calls), outp)
        else:
            lib.fuseg_cal_costly(xp, wp, yp, n_(arg), n_(calls), outp)
        return _medians(out[:2 * calls])

    own = torch.get_num_threads()
    with pause.held(compile=True):  # (a measurement, not a call: Note [the wait follows the builds' share])
        torch.set_num_threads(threads)
        try:
            return _ladders_of(run, threads)
        finally:
            torch.set_num_threads(own)


def _alone(detail: dict[str, Any]) -> dict[str, int]:
    """The thresholds the ``beside_*`` ladders of ``detail`` ran with: its loop's and macs'."""
    return {k: _threshold([tuple(r) for r in detail[f"{k}_ns"]]) for k in ("loop", "macs") if detail.get(f"{k}_ns")}


def _verdict(detail: dict[str, Any], threads: int) -> list[str]:
    """Note [a disturbed measurement] on the ladders of ``detail``, a measurement's record on
    ``threads`` threads: what is disturbed, each in a line. Raises where it is no record."""
    return disturbed({"threads": threads, **detail}, _alone(detail))


def _thresholds_of(detail: dict[str, Any], how: str) -> Thresholds:
    """The thresholds a whole measurement's record ``detail`` gives (Note [how the thresholds are measured])."""
    ladders = {k: [tuple(r) for r in detail[f"{k}_ns"]] for k in ("loop", "beside_loop", "macs", "beside_macs",
                                                                  "pack_rows", "nn_pack_rows")}
    loop, macs = _threshold(ladders["loop"]), _threshold(ladders["macs"])
    # (a call of exp costs ``ratio`` plain elements; the element itself is one of them)
    costly = max(1, round(detail["exp_ns_an_element"] / max(detail["plain_ns_an_element"], 1e-12) - 1))
    return Thresholds(loop, macs, how, costly, _beside(ladders["beside_loop"], loop),
                      _beside(ladders["beside_macs"], macs), _threshold(ladders["pack_rows"], 1.0),
                      _threshold(ladders["nn_pack_rows"], 1.0))


#: measurements at most, the first included, while they are disturbed; the pause before each
#: again (s); and from when a disturbed one is found, how long (s) a new one may still start
ATTEMPTS = 3
RETRY_PAUSE = 0.1
RETRY_BUDGET = 1.0
#: (the clock and the pause of the retries, replaced in tests: not time's own, which other threads use)
_now, _sleep = time.monotonic, time.sleep
#: thread count -> the record of this process's last measurement (``last_detail``)
_LAST: dict[int, dict[str, Any]] = {}


def measure(threads: int) -> tuple[Thresholds, dict[str, Any]]:
    """Note [how the thresholds are measured], on ``threads`` of torch's: the thresholds and
    the record they came from; where every attempt was disturbed (Note [a disturbed
    measurement]), ``UNMEASURED``'s values as "disturbed", and the last attempt's record, its
    ``disturbed`` lines said."""
    attempts = 0
    since: float | None = None
    while True:
        detail = _measure_ladders(threads)
        attempts += 1
        found = _verdict(detail, threads)
        detail = {**detail, "attempts": attempts, **({"disturbed": found} if found else {})}
        _LAST[threads] = detail
        if not found:
            return _thresholds_of(detail, "measured"), detail
        since = _now() if since is None else since
        if attempts >= ATTEMPTS or _now() - since >= RETRY_BUDGET:
            return dataclasses.replace(UNMEASURED, how="disturbed"), detail
        _sleep(RETRY_PAUSE)


def last_detail(threads: int) -> dict[str, Any]:
    """The record of this process's last measurement on ``threads`` threads (empty where none)."""
    return dict(_LAST.get(threads, {}))


# -- kept ---------------------------------------------------------------------------------------

#: what the kept file holds (part of its name): a new form measures again, once
_FORM = "thread thresholds: loop elements, product multiply-adds, a costly call in plain ops, beside both, pack rows"
FIELDS = ("loop", "macs", "costly_call", "beside_loop", "beside_macs", "pack_rows", "nn_pack_rows")


def thresholds_path(threads: int) -> str:
    """This machine's file of thresholds for ``threads`` threads, in the kernel cache dir."""
    what = json.dumps(machine(), sort_keys=True) + hashlib.sha256(source().encode()).hexdigest() + _FORM
    return os.path.join(cache_dir(), f"threads-{threads}-{hashlib.sha256(what.encode()).hexdigest()[:16]}.json")


def _kept_file(threads: int, found: list[str] | None = None) -> dict[str, Any] | None:
    """The kept file for this machine and ``threads``, read; None where there is none, or it is
    damaged or another machine's, or its ladders were disturbed (Note [a disturbed measurement]:
    a file kept before they were recognised; what is disturbed appended to ``found``)."""
    try:
        with open(thresholds_path(threads), encoding="utf-8") as f:
            got = json.load(f)
        if got["machine"] != machine() or got["threads"] != threads:
            return None
        verdict = _verdict(dict(got.get("measured") or {}), threads)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if verdict:
        (found if found is not None else []).extend(verdict)
        return None
    return got


def _kept(threads: int, found: list[str] | None = None) -> Thresholds | None:
    got = _kept_file(threads, found)
    try:
        values = [int(got[k]) for k in FIELDS] if got is not None else None
    except (ValueError, KeyError, TypeError):
        return None
    if values is None or min(values) <= 0:
        return None
    loop, macs, costly, beside_loop, beside_macs, pack, nn_pack = values
    return Thresholds(loop, macs, "kept", costly, beside_loop, beside_macs, pack, nn_pack)


def keep(threads: int, t: Thresholds, detail: dict[str, Any]) -> None:
    """``t`` and the medians it came from, kept as this machine's for ``threads``; nothing where
    they were disturbed (Note [a disturbed measurement]: the next process measures again)."""
    if t.how == "disturbed" or _verdict(detail, threads):
        return
    body = json.dumps({"machine": machine(), "threads": threads, **{k: getattr(t, k) for k in FIELDS},
                       "measured": detail})
    try:
        write_whole(thresholds_path(threads), body, ".threads-")
    except OSError:
        pass  # an unwritable cache: the thresholds hold for this process


def kept_detail(threads: int) -> dict[str, Any]:
    """The medians the kept thresholds came from (empty where none are kept, or what is kept was
    disturbed)."""
    got = _kept_file(threads)
    try:
        return dict(got["measured"]) if got is not None else {}
    except (KeyError, TypeError, ValueError):
        return {}


def _said(found: list[str]) -> str:
    return "; ".join(found[:3]) + (f"; {len(found) - 3} more" if len(found) > 3 else "")


def kept_or_measured(threads: int) -> Thresholds | None:
    """The thresholds kept for this machine and ``threads``, else measured now and kept (not
    kept where the measurement stayed disturbed: Note [a disturbed measurement]); None where
    they cannot be measured (no compiler, a library that does not build or load)."""
    found: list[str] = []
    got = _kept(threads, found)
    if got is not None:
        return got
    if found:
        log.info("the thread thresholds kept in %s came from a disturbed measurement (%s): measuring again",
                 thresholds_path(threads), _said(found))
    try:
        got, detail = measure(threads)
    except Exception as e:  # noqa: BLE001 - any failure: the unmeasured thresholds, said once
        warnings.warn(f"fuseg: the thread thresholds could not be measured on this machine ({type(e).__name__}: "
                      f"{str(e)[:300]}); kernels use the unmeasured ones", stacklevel=2)
        return None
    if got.how == "disturbed":
        log.info("thread thresholds on %d threads: disturbed (not kept), %d measurements (%s); this process uses "
                 "the unmeasured ones, the next measures again", threads, detail.get("attempts", 1),
                 _said(detail.get("disturbed", [])))
        return got
    keep(threads, got, detail)
    log.info("thread thresholds on %d threads measured (%d measurements): %s; kept in %s", threads,
             detail.get("attempts", 1), ", ".join(f"{k} {getattr(got, k)}" for k in FIELDS), thresholds_path(threads))
    return got


# (thresholds.py resolves through this, looked up at each call: a test may replace it)
thresholds.measured_by(lambda threads: kept_or_measured(threads))

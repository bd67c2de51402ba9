"""The matmul routines compiled once per machine, as a library the kernels call.

Note [one matmul library]: a kernel that multiplies matrices (a matmul segment, an attention,
a convolution through im2col, a half product's float way) calls the prelude's routines
``fuseg_mm_nn`` and ``fuseg_mm_nt`` (Note [register tiles] in source/gemm_prelude.py). Compiled
into each translation unit, they were most of its build: g++ 12.2 at -O3 took 1.1-1.4 s for
``fuseg_mm_nt`` alone (0.45 s for ``fuseg_mm_nn``) where the rest of a unit of a dozen kernels
took 0.3 s, and a training step's first call built three or four such units (gpt2-256: 1.22 s
against 0.32 for the same unit calling this library; AMD EPYC family 25 model 17, scratch).
Compiled without the loop vectorizer the routines built in half the time but ran 1.6-4.8x slower.

So the routines are one library, ``fuseg_gemm_<digest>.so`` in the kernel cache dir (Note [kernel
cache safety]), built with the kernels' compiler and flags from ``GEMM_LIBRARY`` (the CPU prelude,
the routines, and two entry points) and loaded into the process once, its symbols global. A
kernel's prelude declares the entry points and defines the routines' names as calls to them with
the settings its source was made with (Note [thread thresholds measured here]), so the generators
are unchanged. The entry points are named for the library source's digest (``GEMM_TAG``): a
kernel always calls the routines of the library its own source names, and a changed library
changes every kernel's source, so its cache key.

The same binary code runs: matmul kernels of gpt2-256's backward took 0.98-1.01x their time with
the routines compiled in (sizes now arguments, not constants the compiler saw), with the same
bits. ``prepare`` starts the build in the background when dynamo first looks the backend up, so
it runs while dynamo traces the first graph (one core: the other is free); a build that needs the
library before that is done waits for it, and ``build_cpu_many`` builds it beside the kernels
where nothing started it. Once built it is shared by every later process on the machine.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import hashlib
import os
import re
import threading

from ..machine.compiler import (
    Declined,
    _compile_into,
    _configured_dir,
    _cpu_build_key,
    _fall_back,
    _sound,
    cache_dir,
    cpu_compiler,
)
from .source.ctypes_ import GEMM_LIBRARY, GEMM_TAG

__all__ = ["GEMM_TAG", "calls_library", "ensure", "load", "loaded", "path", "prepare"]

_LOCK = threading.Lock()  # one build at a time: a second caller waits for the first's
_LOADED: list[ctypes.CDLL] = []
_PREPARED: list[concurrent.futures.Future] = []
_CALL = re.compile(r"\bfuseg_(?:mm_n[nt]|attention_head(?:_backward)?)\(")


def calls_library(function: str) -> bool:
    """Whether a kernel's function (its source without the prelude) calls the matmul routines."""
    return _CALL.search(function) is not None


def path() -> str:
    """Where the library is kept in the cache dir (its name holds what decides the binary)."""
    digest = hashlib.sha256((GEMM_LIBRARY + _cpu_build_key()).encode()).hexdigest()[:24]
    return os.path.join(cache_dir(), f"fuseg_gemm_{digest}.so")


def ensure(low_priority: bool = False) -> str:
    """The library built into the cache dir where it is not there whole (a compiler killed by a
    signal: ``Declined``); its path."""
    with _LOCK:
        lib_path = path()
        if _sound(lib_path):
            return lib_path
        cxx = cpu_compiler()
        if cxx is None:
            raise Declined("no C++ compiler found (set CXX)")
        try:
            _compile_into(lib_path, cxx, GEMM_LIBRARY, "the matmul library", low_priority, "library")
        except OSError as e:  # the cache dir failed under us: bypassed, as for the kernels
            lib_path = os.path.join(_fall_back(_configured_dir(), e), os.path.basename(lib_path))
            _compile_into(lib_path, cxx, GEMM_LIBRARY, "the matmul library", low_priority, "library")
        return lib_path


def loaded() -> bool:
    """Whether the library is in this process (kernels that call it load without a build)."""
    return bool(_LOADED)


def load(low_priority: bool = False) -> None:
    """The library in this process, its symbols global, before any kernel that calls it is loaded
    (built first where the cache lacks it; a file that does not load is built again, once)."""
    if _LOADED:
        return
    lib_path = ensure(low_priority)
    with _LOCK:
        if _LOADED:
            return
        try:
            lib = ctypes.CDLL(lib_path, mode=os.RTLD_GLOBAL)
        except OSError:
            cxx = cpu_compiler()
            if cxx is None:
                raise Declined("no C++ compiler found (set CXX)") from None
            _compile_into(lib_path, cxx, GEMM_LIBRARY, "the matmul library", count="library")
            try:
                lib = ctypes.CDLL(lib_path, mode=os.RTLD_GLOBAL)
            except OSError as e:
                raise Declined(f"the matmul library does not load: {e}") from None
        _LOADED.append(lib)


def prepare() -> None:
    """Start building the library in the background where the cache lacks it (Note [one matmul
    library]); nothing where there is no compiler or it is built."""
    if _LOADED or _PREPARED or cpu_compiler() is None:
        return
    try:
        if _sound(path()):
            return
    except OSError:
        return
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fuseg-gemm")
    _PREPARED.append(pool.submit(_quietly))
    pool.shutdown(wait=False)


def _quietly() -> None:
    try:
        ensure()
    except Exception:  # noqa: BLE001 - the first kernel that needs it builds it again, where the error shows
        pass

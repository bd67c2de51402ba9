"""Compiling generated kernels: C++ with the machine's compiler (CPU), CUDA with CuPy (GPU),
and CUDA with nvcc for checks without a GPU. Every build is cached by the exact source text:
in this process (a second call compiles nothing) and, for the CPU build, on disk."""

from __future__ import annotations

import concurrent.futures
import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable

from .ctypes_ import Declined
from .lower import Kernel

__all__ = ["CompileError", "build_cpu", "build_cpu_many", "build_cuda", "cache_dir", "cpu_compiler", "nvcc_check"]


class CompileError(RuntimeError):
    """Generated source that the compiler refused (a generator bug): the message holds its log."""


_CPU: dict[str, Callable[..., None]] = {}
_CUDA: dict[str, object] = {}
#: number of compilations run in this process (tests read it to see that the cache works)
compilations = {"cpu": 0, "cuda": 0}


def cache_dir() -> str:
    path = os.environ.get("FUSEG_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fuseg", "kernels")
    os.makedirs(path, exist_ok=True)
    return path


#: -O3 and the machine's own instruction set: loops over unit strides vectorize (Note [pointwise
#: loops]); OpenMP shares big loops among torch's threads (torch's libgomp is the one loaded);
#: ISO C++ keeps floating-point contraction off and no fast-math, so results stay those of eager;
#: without trapping math, branches that pick a value (clamps, NaN rules) become vector selects
CPU_FLAGS = ("-O3", "-march=native", "-fopenmp", "-std=c++17", "-shared", "-fPIC", "-fno-fast-math",
             "-fno-trapping-math")  # no code reads FP exception flags; selects may then vectorize


@functools.cache
def _cpu_build_key() -> str:
    """What besides the source decides the binary: the compiler, the flags and, because of
    -march=native, this CPU's features (a cache dir shared between machines stays correct)."""
    flags = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        pass
    return f"\n// {cpu_compiler()} {' '.join(CPU_FLAGS)} {platform.machine()} {hashlib.sha256(flags.encode()).hexdigest()}"


def cpu_compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")


def build_cpu(kernel: Kernel) -> Callable[..., None]:
    """The kernel compiled for the CPU: a function taking one data pointer per parameter."""
    src = kernel.source("cpu")
    digest = hashlib.sha256((src + _cpu_build_key()).encode()).hexdigest()[:24]
    fn = _CPU.get(digest)
    if fn is not None:
        return fn
    cxx = cpu_compiler()
    if cxx is None:
        raise Declined("no C++ compiler found (set CXX)")
    lib_path = os.path.join(cache_dir(), f"{kernel.name}_{digest}.so")
    if not os.path.exists(lib_path):
        with tempfile.TemporaryDirectory() as tmp:
            cpp = os.path.join(tmp, "k.cpp")
            with open(cpp, "w") as f:
                f.write(src)
            out = os.path.join(tmp, "k.so")
            r = subprocess.run([cxx, *CPU_FLAGS, "-o", out, cpp],
                               capture_output=True, text=True)
            compilations["cpu"] += 1
            if r.returncode != 0:
                raise CompileError(f"{cxx} refused kernel {kernel.name}:\n{r.stderr[-4000:]}\n--- source ---\n{src}")
            os.replace(out, lib_path)  # atomic: a concurrent build of the same kernel is harmless
    lib = ctypes.CDLL(lib_path)
    fn = getattr(lib, kernel.name)
    fn.argtypes = [ctypes.c_void_p] * len(kernel.params)
    fn.restype = None
    _CPU[digest] = fn
    return fn


def build_cpu_many(kernels: list[Kernel]) -> list[Callable[..., None]]:
    """Every kernel compiled for the CPU, the compilers run side by side (one per core): a
    program's kernels on a cold cache cost one round of parallel builds, not one build each."""
    todo = {}
    for k in kernels:
        todo.setdefault(k.source("cpu"), k)
    if len(todo) > 1:
        workers = min(len(todo), os.cpu_count() or 1)
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:  # the compilers run as processes
            list(pool.map(build_cpu, todo.values()))
    return [build_cpu(k) for k in kernels]  # built now: each an in-memory cache hit


def build_cuda(kernel: Kernel):
    """The kernel compiled by CuPy (NVRTC) for the current device: a ``cupy.RawKernel``."""
    import cupy

    src = kernel.source("cuda")
    key = f"{cupy.cuda.Device().id}:{hashlib.sha256(src.encode()).hexdigest()}"
    fn = _CUDA.get(key)
    if fn is None:
        module = cupy.RawModule(code=src, options=("-std=c++17",))
        fn = module.get_function(kernel.name)
        compilations["cuda"] += 1
        _CUDA[key] = fn
    return fn


def nvcc_check(kernel: Kernel, arch: str = "sm_90", ptx_only: bool = True) -> subprocess.CompletedProcess:
    """Compile the exact CUDA source CuPy would get with nvcc (no GPU needed): to PTX by default,
    which is what NVRTC makes of it for CuPy (3x faster than a full object file)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise FileNotFoundError("nvcc is not on the PATH")
    with tempfile.TemporaryDirectory() as tmp:
        cu = os.path.join(tmp, "k.cu")
        with open(cu, "w") as f:
            f.write(kernel.source("cuda"))
        mode = ["-ptx", "-o", os.path.join(tmp, "k.ptx")] if ptx_only else ["-c", "-o", os.path.join(tmp, "k.o")]
        return subprocess.run([nvcc, "-std=c++17", f"-arch={arch}", *mode, cu], capture_output=True, text=True)

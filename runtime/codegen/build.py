"""Compiling generated kernels: C++ with the machine's compiler (CPU), CUDA with CuPy (GPU),
and CUDA with nvcc for checks without a GPU. Every build is cached by the exact source text:
in this process (a second call compiles nothing) and, for the CPU build, on disk.

The machine's compiler, its flags, the cache dir and the compiling of one source into a library
there (Note [kernel cache safety]) are runtime/machine/compiler.py's.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable

from ..machine import pause, threads
from ..machine.compiler import (
    CompileError,
    _compile,
    _compile_into,
    _configured_dir,
    _cpu_build_key,
    _fall_back,
    _fsync_write,
    _install,
    _sound,
    cache_dir,
    compilations,
    cpu_compiler,
    write_whole,
)
from . import gemm_library
from .kernel import routine_settings, translation_unit
from .lowering.lower import Kernel
from .source.ctypes_ import Declined
from .source.symsizes import raw_symbol

__all__ = ["CompileError", "write_whole", "build_cpu", "build_cpu_later", "build_cpu_many", "build_cuda", "cache_dir", "cpu_compiler",
           "nvcc_check", "unbuilt_cpu"]


_CPU: dict[str, Callable[..., None]] = {}
_CUDA: dict[str, object] = {}


def _compile_group(entries: list[tuple[Kernel, str]], cxx: str, low_priority: bool = False) -> None:
    """Note [one build per group of kernels]: most of a small kernel's build is the compiler
    reading the prelude's headers (0.24 of 0.26 s each, llama-tiny's kernels on this machine
    kind), so the kernels a program misses in the cache are built as a few translation units,
    one per core, each holding the prelude once. The library is then installed under every one
    of its kernels' own cache names (a hard link, or a copy where links fail), each with its
    record, so later programs find each kernel on its own as before."""
    lib_dir = os.path.dirname(entries[0][1])
    tmp = tempfile.mkdtemp(dir=lib_dir, prefix=".build-")
    try:
        names = ", ".join(k.name for k, _ in entries)
        out, data = _compile(cxx, translation_unit([k for k, _ in entries], "cpu"), f"kernels {names}", tmp,
                             low_priority)
        for i, (_, lib_path) in enumerate(entries):
            copy = os.path.join(tmp, f"k{i}.so")
            try:
                os.link(out, copy)
            except OSError:
                _fsync_write(copy, data)
            _install(tmp, copy, data, lib_path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _load_kernel(lib_path: str, low_priority: bool) -> ctypes.CDLL:
    """The kernel's binary loaded. One built in a group (Note [one build per group of kernels]) holds
    its group's other kernels too, and those may call the matmul library where this one does not:
    a symbol left undefined loads the library, then the binary again. Raises ``OSError``."""
    try:
        return ctypes.CDLL(lib_path)
    except OSError as e:
        if "undefined symbol" not in str(e) or gemm_library.loaded():
            raise
    gemm_library.load(low_priority)
    return ctypes.CDLL(lib_path)


def _entry(kernel: Kernel) -> tuple[str, str]:
    """The kernel's source and its key in the caches (the source and what else decides the binary)."""
    src = kernel.source("cpu")
    raw = raw_symbol(kernel.function("cpu"))  # (the prelude is the same text for every kernel)
    if raw is not None:  # Note [kernel sizes as arguments] in runtime/codegen/source/symsizes.py: never compiled in as text
        raise Declined(f"kernel {kernel.name}: a symbolic size ({raw}) was formatted outside its printer")
    return src, hashlib.sha256((src + _cpu_build_key()).encode()).hexdigest()[:24]


def _lib_path(kernel: Kernel, digest: str) -> str:
    return os.path.join(cache_dir(), f"{kernel.name}_{digest}.so")


def build_cpu(kernel: Kernel) -> Callable[..., None]:
    """The kernel compiled for the CPU: a function taking one data pointer per parameter."""
    return _build_cpu(kernel, *_entry(kernel))


def _build_cpu(kernel: Kernel, src: str, digest: str, low_priority: bool = False) -> Callable[..., None]:
    fn = _CPU.get(digest)
    if fn is not None:
        return fn
    cxx = cpu_compiler()
    if cxx is None:
        raise Declined("no C++ compiler found (set CXX)")
    lib_path = _lib_path(kernel, digest)
    if not _sound(lib_path):
        try:
            _compile_into(lib_path, cxx, src, kernel.name, low_priority)
        except OSError as e:  # the cache dir failed under us (removed, full, read-only): bypass it
            lib_path = os.path.join(_fall_back(_configured_dir(), e), os.path.basename(lib_path))
            _compile_into(lib_path, cxx, src, kernel.name, low_priority)
    if gemm_library.calls_library(kernel.function("cpu")):  # Note [one matmul library]: loaded first
        gemm_library.load(low_priority)
    try:
        lib = _load_kernel(lib_path, low_priority)
    except OSError as e:  # sound by its record, yet not loadable: built again, once
        _compile_into(lib_path, cxx, src, kernel.name)
        try:
            lib = ctypes.CDLL(lib_path)
        except OSError:
            raise Declined(f"kernel {kernel.name} does not load: {e}") from None
    fn = getattr(lib, kernel.name)
    fn.argtypes = [ctypes.c_void_p] * (len(kernel.params) + (1 if kernel.symbols else 0))
    fn.restype = {"void": None, "long long": ctypes.c_longlong}[kernel.returns]
    _CPU[digest] = fn
    return fn


_Missing = tuple[str, Kernel, str, str]  # digest, kernel, source, cache path


def _groups(missing: list[_Missing], n: int) -> list[list[_Missing]]:
    """``missing`` in ``n`` groups of about equal source length (longest first, to the lightest)."""
    groups: list[list[_Missing]] = [[] for _ in range(n)]
    sizes = [0] * n
    for m in sorted(missing, key=lambda m: -len(m[1].body)):
        i = sizes.index(min(sizes))
        groups[i].append(m)
        sizes[i] += len(m[1].body)
    return [g for g in groups if g]


def unbuilt_cpu(kernels: list[Kernel]) -> list[bool]:
    """Per kernel, whether building it would run the compiler: its binary is neither loaded in
    this process nor whole in the disk cache (a kernel that declines before any build: False)."""
    out = []
    for k in kernels:
        try:
            _, digest = _entry(k)
        except Declined:
            out.append(False)
            continue
        out.append(_unbuilt(k, digest))
    return out


def _unbuilt(kernel: Kernel, digest: str) -> bool:
    return digest not in _CPU and not _sound(_lib_path(kernel, digest))


_LATER: list[concurrent.futures.ThreadPoolExecutor] = []
_LATER_LOCK = threading.Lock()


def build_cpu_later(kernels: list[Kernel]) -> concurrent.futures.Future:
    """Note [kernels built in the background] (runtime/compiled/background.py): ``build_cpu_many(kernels)``
    on one thread of its own, the compilers on every core at the lowest scheduling priority (the
    caller's threads go on running first: the compilers take what they leave idle). Builds queue
    one after another, so a kernel two programs both miss is compiled
    once (the later build finds it in the cache). At exit the interpreter waits for builds
    under way: what they make is kept in the disk cache."""
    with _LATER_LOCK:
        if not _LATER:
            _LATER.append(concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fuseg-build"))
        pool = _LATER[0]
    # (in the caller's context: the contextvars that say how symbolic sizes hash and print)
    # (Note [torch's threads beside background compilers] in runtime/machine/threads.py: cores of their own)
    future = pool.submit(contextvars.copy_context().run, build_cpu_many, list(kernels), threads.background_jobs(), True)
    with _LATER_LOCK:
        _UNDER_WAY.add(future)
        threads.builds_started()
    future.add_done_callback(_finished)
    return future


_UNDER_WAY: set[concurrent.futures.Future] = set()


def _finished(future: concurrent.futures.Future) -> None:
    with _LATER_LOCK:
        _UNDER_WAY.discard(future)
        if not _UNDER_WAY:
            threads.builds_ended()


def background_builds_under_way() -> int:
    """How many builds started by ``build_cpu_later`` are not done yet."""
    with _LATER_LOCK:
        return len(_UNDER_WAY)


def wait_for_background_builds() -> None:
    """Every build started by ``build_cpu_later`` done (each program runs its kernels from its
    next call on: Note [kernels built in the background])."""
    pause.release_all()  # (a held pause would keep them from ending: Note [compilers paused while dynamo traces])
    with _LATER_LOCK:
        under_way = list(_UNDER_WAY)
    concurrent.futures.wait(under_way)


def build_cpu_many(kernels: list[Kernel], jobs: int | None = None, low_priority: bool = False,
                   ) -> list[Callable[..., None] | Declined]:
    """Every kernel compiled for the CPU: those the caches miss as one translation unit per core
    (``jobs``: that many at most; Note [one build per group of kernels]), the compilers run side
    by side, so a program's kernels on a cold cache cost one round of parallel builds. A kernel
    whose build declines (a compiler killed by a signal) comes back as the ``Declined``."""
    entries: list[tuple[str, str] | Declined] = []
    for k in kernels:
        try:
            entries.append(_entry(k))
        except Declined as e:
            entries.append(e)
    todo: dict[str, tuple[Kernel, str]] = {}  # digest -> (kernel, source)
    for k, entry in zip(kernels, entries):
        if not isinstance(entry, Declined):
            todo.setdefault(entry[1], (k, entry[0]))
    declined: dict[str, Declined] = {}
    cxx = cpu_compiler()
    if cxx is not None:
        missing = [(digest, k, src, _lib_path(k, digest)) for digest, (k, src) in todo.items() if _unbuilt(k, digest)]
        # Note [one matmul library] (gemm_library.py): where a kernel to build calls it and this process
        # has not loaded it, it is built beside the kernels (a build under way elsewhere: waited for)
        library = not gemm_library.loaded() and any(gemm_library.calls_library(m[1].function("cpu")) for m in missing)
        if len(missing) > 1 or library:
            def build_group(group: list[_Missing]) -> None:
                try:
                    if len(group) == 1:
                        _, k, src, path = group[0]
                        _compile_into(path, cxx, src, k.name, low_priority)
                    elif len({routine_settings(m[1]) for m in group} - {None}) > 1:  # (thresholds pinned apart:
                        for _, k, src, path in group:                        # one prelude each)
                            _compile_into(path, cxx, src, k.name, low_priority)
                    else:
                        _compile_group([(k, path) for _, k, _, path in group], cxx, low_priority)
                except Declined as e:
                    declined.update(dict.fromkeys((m[0] for m in group), e))
                except OSError:
                    pass  # the cache dir failed under us: each kernel is built on its own below
                except CompileError:
                    if not any(m[1].symbols for m in group):
                        raise
                    # a kernel of symbolic sizes the compiler refuses: each on its own below, where
                    # it declines (Note [kernel sizes as arguments] in runtime/codegen/source/symsizes.py)

            def build_library() -> None:
                try:
                    gemm_library.ensure(low_priority)
                except (Declined, OSError, CompileError):
                    pass  # the first kernel loaded that calls it builds it again, where the error shows

            groups = _groups(missing, min(len(missing), jobs or os.cpu_count() or 1))
            # (each in a copy of this context: the runtime options a source is made with, Note [options in one place])
            context = contextvars.copy_context()
            builds = [build_library] if library else []
            builds += [functools.partial(build_group, group) for group in groups]
            with concurrent.futures.ThreadPoolExecutor(len(builds)) as pool:  # the compilers run as processes
                list(pool.map(lambda build: context.copy().run(build), builds))

    def build(digest: str, k: Kernel, src: str) -> Callable[..., None] | Declined:
        if digest in declined:
            return declined[digest]
        try:
            return _build_cpu(k, src, digest, low_priority)  # loads what the groups built (or builds what they could not)
        except Declined as e:
            return e
        except CompileError as e:
            if not k.symbols:
                raise
            return Declined(f"the compiler refuses kernel {k.name} with symbolic sizes: {str(e).splitlines()[-1][:200]}")

    built = {digest: build(digest, k, src) for digest, (k, src) in todo.items()}
    return [entry if isinstance(entry, Declined) else built[entry[1]] for entry in entries]


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


def _nvcc(source: str, arch: str, ptx_only: bool = True) -> subprocess.CompletedProcess:
    """nvcc on one translation unit, to PTX or to an object file; the result, never raised."""
    return _nvcc_output(source, arch, ptx_only)[0]


def _nvcc_output(source: str, arch: str, ptx_only: bool) -> tuple[subprocess.CompletedProcess, str | None]:
    """``_nvcc``, and the PTX it wrote (None for an object file or a failed run)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise FileNotFoundError("nvcc is not on the PATH")
    with tempfile.TemporaryDirectory() as tmp:
        cu, out = os.path.join(tmp, "k.cu"), os.path.join(tmp, "k.ptx" if ptx_only else "k.o")
        with open(cu, "w") as f:
            f.write(source)
        mode = ["-ptx" if ptx_only else "-c", "-o", out]
        r = subprocess.run([nvcc, "-std=c++17", f"-arch={arch}", *mode, cu], capture_output=True, text=True)
        if not ptx_only or r.returncode != 0:
            return r, None
        with open(out) as f:
            return r, f.read()


def ptx_of(source: str, arch: str = "sm_90") -> str:
    """The PTX nvcc makes of a CUDA translation unit (what a test counts loads and exps in)."""
    r, ptx = _nvcc_output(source, arch, True)
    if ptx is None:
        raise RuntimeError(f"nvcc failed: {r.stderr[-2000:]}")
    return ptx


def nvcc_check(kernel: Kernel, arch: str = "sm_90", ptx_only: bool = True) -> subprocess.CompletedProcess:
    """Compile the exact CUDA source CuPy would get with nvcc (no GPU needed): to PTX by default,
    which is what NVRTC makes of it for CuPy (3x faster than a full object file)."""
    return _nvcc(kernel.source("cuda"), arch, ptx_only)


def nvcc_check_many(kernels: list[Kernel], arch: str = "sm_90") -> list[tuple[str, str]]:
    """Compile many kernels' CUDA functions to PTX with nvcc in one translation unit (the prelude
    once, as ``translation_unit`` writes it for the CPU's grouped builds): one nvcc run instead of
    one per kernel (177 kernels: ~3 s against ~100 s here). Where the unit fails, each kernel is
    compiled alone, exactly as CuPy gets it, so the failures are named: ``[(name, stderr tail)]``,
    empty when every kernel compiles."""
    from .kernel import translation_unit

    by_name = {k.name: k for k in kernels}
    r = _nvcc(translation_unit(list(by_name.values()), "cuda"), arch)
    if r.returncode == 0:
        return []
    failed = [(k.name, res.stderr[-2000:]) for k in by_name.values()
              if (res := nvcc_check(k, arch)).returncode != 0]
    return failed or [("<translation unit>", r.stderr[-2000:])]

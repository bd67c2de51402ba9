"""The machine's C++ compiler, its flags, the kernel cache dir, and compiling a source into a
library there: what generated kernels (codegen/build.py), the thread thresholds' library
(codegen/calibrate.py) and the records of measurements (``machine``) share, below them all.

Note [kernel cache safety]: the disk cache is a cache, never a source of truth.
  * An entry is a ``.so`` plus a record of its size and SHA-256, written when it was built; an
    entry is loaded only when the file matches its record, and rebuilt otherwise (a file cut short
    by a crash or a full disk would kill the process with SIGBUS when loaded).
  * A build happens in a fresh directory inside the cache dir: the compiler's output is fsynced,
    then renamed into place (the record after it), on one filesystem, so the rename is atomic and
    never crosses devices (EXDEV with a tmpfs /tmp and a disk cache). A reader sees a whole old
    entry, a whole new one, or a mismatch it rebuilds; a loaded library's file is never written.
  * A cache dir that cannot be made or written is bypassed: kernels go to a per-process temp dir,
    removed when the process ends, with a warning.
  * A compiler killed by a signal declines the kernel (the segment runs on torch) and says so; a
    compiler that refuses the source is a generator bug (``CompileError``). Build dirs are removed
    on every path out, and ones left by killed processes are removed after an hour.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import os
import platform
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import warnings

import torch

from runtime.options import current, default_cache_dir

from . import pause

__all__ = ["CPU_FLAGS", "CompileError", "Declined", "cache_dir", "compilations", "cpu_compiler", "machine",
           "write_whole"]


class Declined(Exception):
    """The generator does not take this segment, or its compiler was killed; the message says why
    (recorded by the runtime)."""


class CompileError(RuntimeError):
    """Generated source that the compiler refused (a generator bug): the message holds its log."""


#: number of compilations run in this process (tests read it to see that the cache works): kernels'
#: ("cpu", "cuda") and the matmul library's ("library": Note [one matmul library] in runtime/codegen/gemm_library.py)
compilations = {"cpu": 0, "cuda": 0, "library": 0}
_COUNTING = threading.Lock()  # builds may run on a thread of their own (build_cpu_later)
#: configured cache dir -> the dir used (itself, or the per-process fallback)
_USABLE: dict[str, str] = {}
_FALLBACK: list[str] = []
_STALE_BUILD_S = 3600


def _configured_dir() -> str:
    return current().cache_dir or default_cache_dir()


def cache_dir() -> str:
    """The directory kernels are cached in: the configured one (``FUSEG_CACHE_DIR``, else
    ``~/.cache/fuseg/kernels``) where it can be made and written, else a per-process temp dir."""
    path = _configured_dir()
    usable = _USABLE.get(path)
    if usable is None:
        try:
            os.makedirs(path, exist_ok=True)
            fd, probe = tempfile.mkstemp(dir=path, prefix=".probe-")
            os.close(fd)
            os.unlink(probe)
            _remove_stale_builds(path)
            usable = path
        except OSError as e:
            usable = _fall_back(path, e)
        _USABLE[path] = usable
    return usable


def _fall_back(path: str, error: OSError) -> str:
    if not _FALLBACK:
        _FALLBACK.append(tempfile.mkdtemp(prefix="fuseg-kernels-"))
        atexit.register(shutil.rmtree, _FALLBACK[0], ignore_errors=True)
    warnings.warn(f"kernel cache {path!r} is not usable ({error.strerror or error}): kernels are cached in "
                  f"{_FALLBACK[0]} for this process only (set FUSEG_CACHE_DIR)", stacklevel=4)
    _USABLE[path] = _FALLBACK[0]
    return _FALLBACK[0]


def _remove_stale_builds(path: str) -> None:
    """Build dirs of processes killed while building (every other path out removes its own)."""
    now = time.time()
    with os.scandir(path) as entries:
        for e in entries:
            if e.name.startswith(".build-") and now - e.stat(follow_symlinks=False).st_mtime > _STALE_BUILD_S:
                shutil.rmtree(e.path, ignore_errors=True)


#: -O3 and the machine's own instruction set: loops over unit strides vectorize (Note [pointwise
#: loops]); OpenMP shares big loops among torch's threads (torch's libgomp is the one loaded);
#: no fast-math and no floating-point contraction, so results stay those of eager (eager rounds
#: a*b and then +c; g++ contracts them into one FMA unless told not to, -std=c++17 or not: on
#: an AVX-512 machine a kernel of x*y + z differed from eager on 15362 of 65536 elements);
#: without trapping math, branches that pick a value (clamps, NaN rules) become vector selects;
#: without errno from math functions (nothing reads it), sqrt is one instruction that vectorizes
#: and may move out of a loop (values are unchanged: only errno is no longer set)
#: (kernels with ``if`` statements are built without loop if-conversion, a function attribute:
#: Note [no if-conversion of branches] in codegen/kernel.py)
CPU_FLAGS = ("-O3", "-march=native", "-fopenmp", "-std=c++17", "-shared", "-fPIC", "-fno-fast-math", "-ffp-contract=off",
             "-fno-math-errno", "-fno-trapping-math")  # no code reads FP exception flags; selects may then vectorize


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
    return current().cxx or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")


def _record(lib_path: str) -> str:
    return lib_path + ".sha256"


def _sound(lib_path: str) -> bool:
    """The cached file is the one its record describes (size and SHA-256)."""
    try:
        with open(_record(lib_path)) as f:
            size, digest = f.read().split()
        with open(lib_path, "rb") as f:
            data = f.read()
    except (OSError, ValueError):
        return False
    return len(data) == int(size) and hashlib.sha256(data).hexdigest() == digest


def write_whole(path: str, text: str, prefix: str) -> None:
    """``text`` as the file ``path``, written beside it (a temp file named ``prefix``...) and
    renamed over it: a reader sees the old file or the new one. Raises ``OSError``."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=prefix)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _fsync_write(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


_IDLE = (getattr(os, "SCHED_IDLE", None), os.sched_param(0) if hasattr(os, "sched_param") else None)


def _idle_in_child() -> None:
    """Run in the compiler's process before it starts (``preexec_fn``): Linux's SCHED_IDLE
    policy, which its own children (cc1plus, as, ld) inherit; else the lowest nice value. One
    system call on objects made beforehand: nothing here takes a lock another thread may hold."""
    policy, param = _IDLE
    try:
        os.sched_setscheduler(0, policy, param)  # type: ignore[arg-type]
    except (AttributeError, OSError, TypeError):
        try:
            os.nice(19)
        except OSError:
            pass


def _compile(cxx: str, src: str, what: str, tmp: str, low_priority: bool = False, count: str = "cpu") -> tuple[str, bytes]:
    """Compile ``src`` in the build dir ``tmp``: the library's path there and its bytes.
    ``low_priority``: the compiler runs only where a core would be idle (Note [kernels built in
    the background] in runtime/compiled/background.py)."""
    cpp, out = os.path.join(tmp, "k.cpp"), os.path.join(tmp, "k.so")
    with open(cpp, "w") as f:
        f.write(src)
    # (Note [kernels built in the background]: a background build's compiler runs only where a
    # core would be idle, so a thread of torch's that wakes takes the core at once. Set after
    # the start, a policy missed the compiler's children, and a tiny LM's decode step took
    # 15 ms instead of 0.7 while one ran: its CPU attention waited for its second thread.)
    # (Note [compilers paused while dynamo traces] in pause.py: a background one is also stopped
    # while the caller's thread traces or plans)
    cmd = [cxx, *CPU_FLAGS, "-o", out, cpp]
    r = (pause.run_compiler(cmd, _idle_in_child if os.name == "posix" else None) if low_priority
         else subprocess.run(cmd, capture_output=True, text=True))
    with _COUNTING:
        compilations[count] += 1
    if r.returncode < 0:
        try:
            sig = signal.Signals(-r.returncode).name
        except ValueError:
            sig = str(-r.returncode)
        raise Declined(f"{cxx} was killed by signal {sig} while compiling {what}")
    if r.returncode != 0:
        raise CompileError(f"{cxx} refused {what}:\n{r.stderr[-4000:]}\n--- source ---\n{src}")
    with open(out, "rb") as f:
        data = f.read()
    _fsync_write(out, data)
    return out, data


def _install(tmp: str, built: str, data: bytes, lib_path: str) -> None:
    """Put the library ``built`` (in build dir ``tmp``) at ``lib_path`` with its record, by renames
    on one filesystem (Note [kernel cache safety])."""
    rec = os.path.join(tmp, "k.sha256")
    _fsync_write(rec, f"{len(data)} {hashlib.sha256(data).hexdigest()}\n".encode())
    os.replace(built, lib_path)  # same directory tree, one filesystem: atomic
    os.replace(rec, _record(lib_path))
    try:
        fd = os.open(os.path.dirname(lib_path), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass  # some filesystems cannot fsync a directory: the renames are still atomic


def _compile_into(lib_path: str, cxx: str, src: str, name: str, low_priority: bool = False, count: str = "cpu") -> None:
    """Compile ``src`` and put the library and its record at ``lib_path`` (Note [kernel cache
    safety]); ``count``: the key of ``compilations`` it counts under."""
    tmp = tempfile.mkdtemp(dir=os.path.dirname(lib_path), prefix=".build-")
    try:
        out, data = _compile(cxx, src, f"kernel {name}", tmp, low_priority, count)
        _install(tmp, out, data, lib_path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@functools.cache
def machine() -> dict[str, str]:
    """The CPU (model, flags), the compiler (its version and flags) and torch: what a verdict was
    measured on, and what every perf record names."""
    model, flags, ids = platform.processor() or platform.machine(), "", {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = (part.strip() for part in line.partition(":"))
                if key in ("model name", "Model") and model in ("", platform.machine(), platform.processor()):
                    model = value
                elif key in ("flags", "Features") and not flags:
                    flags = " ".join(sorted(value.split()))
                elif key in ("cpu family", "model", "stepping") and key not in ids:
                    ids[key] = value  # (a virtual machine's model name can be as vague as "AMD EPYC")
    except OSError:
        pass
    if ids:
        model += f" (family {ids.get('cpu family', '?')} model {ids.get('model', '?')} stepping {ids.get('stepping', '?')})"
    cxx = cpu_compiler()
    version = _version(cxx) if cxx is not None else ""
    return {"cpu": model, "cpu_flags": flags, "compiler": f"{cxx} ({version})", "compiler_flags": " ".join(CPU_FLAGS),
            "torch": torch.__version__}


@functools.cache
def _version(cxx: str) -> str:
    """The first line of ``cxx --version`` (once a process per compiler)."""
    try:
        return subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout.splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"

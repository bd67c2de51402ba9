"""The kernel cache is a cache (issue 14): a damaged entry is rebuilt, never loaded; a build works
whatever filesystems the temp dir and the cache are on; an unusable cache dir is bypassed with a
warning; a compiler killed by a signal is reported as such; no build leaves a temp dir behind."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest
import torch

from runtime.codegen import build
from runtime.codegen.build import build_cpu, cpu_compiler
from runtime.codegen.lowering.lower import Kernel, Param
from runtime.codegen.source.ctypes_ import Declined

pytestmark = pytest.mark.skipif(cpu_compiler() is None, reason="no C++ compiler")
ROOT = Path(__file__).resolve().parent.parent


def _kernel(tag: str) -> Kernel:
    """A kernel of its own (``tag`` is in its source): out = in * 3 over 4 floats."""
    f32 = torch.float32
    params = (Param("in0", "x", f32, (4,), (1,), False), Param("out0", "y", f32, (4,), (1,), True))
    body = f"  // {tag}\n  for (FUSEG_I i = 0; i < 4; ++i) out0[i] = in0[i] * 3.0f;\n"
    return Kernel(f"fuseg_cachetest_{tag}", params, body, 256, 1, "pointwise")


def _run(fn) -> torch.Tensor:
    x, y = torch.arange(4, dtype=torch.float32), torch.zeros(4)
    fn(x.data_ptr(), y.data_ptr())
    return y


def _entries(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir())


_SUBPROCESS = """
import sys, torch
from runtime.codegen import build
from tests.test_kernel_cache import _kernel, _run
fn = build.build_cpu(_kernel(sys.argv[1]))
print(_run(fn).tolist(), build.compilations["cpu"], build.cache_dir())
"""


def _in_subprocess(tag: str, cache: Path | str) -> subprocess.CompletedProcess:
    env = {**os.environ, "FUSEG_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", _SUBPROCESS, tag], env=env, capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


def test_a_truncated_cached_kernel_is_rebuilt_not_loaded(tmp_path: Path, monkeypatch) -> None:
    tag = uuid.uuid4().hex[:12]
    # Built in another process: this one must not have the library mapped when it is cut short
    # (its pages are read again at exit, by the library's destructors: SIGBUS ended the test run).
    first = _in_subprocess(tag, tmp_path)
    assert first.stdout.startswith("[0.0, 3.0, 6.0, 9.0] 1 "), first.stderr[-2000:]
    so, = tmp_path.glob("*.so")
    whole = so.read_bytes()
    so.write_bytes(whole[: len(whole) // 2])  # a crash or a full disk in the middle of a write
    again = _in_subprocess(tag, tmp_path)
    assert again.returncode == 0, (again.returncode, again.stderr[-2000:])  # -SIGBUS before the fix
    assert again.stdout.startswith("[0.0, 3.0, 6.0, 9.0] 1 ")  # rebuilt (one compilation), and right
    assert so.stat().st_size == len(whole)
    third = _in_subprocess(tag, tmp_path)  # a sound entry is loaded as it is
    assert third.stdout.startswith("[0.0, 3.0, 6.0, 9.0] 0 "), third.stderr[-2000:]


def test_a_build_with_temp_dir_and_cache_on_two_filesystems(tmp_path: Path, monkeypatch) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("no second filesystem (tmpfs /dev/shm) here")
    other = Path(tempfile.mkdtemp(dir=shm))
    try:
        monkeypatch.setattr(tempfile, "tempdir", str(other))  # tmpfs temp dir, disk cache
        monkeypatch.setenv("FUSEG_CACHE_DIR", str(tmp_path / "cache"))
        fn = build_cpu(_kernel(uuid.uuid4().hex[:12]))
        assert _run(fn).tolist() == [0.0, 3.0, 6.0, 9.0]
        assert list(other.iterdir()) == []
    finally:
        os.rmdir(other)


def test_a_rename_across_filesystems_is_never_needed(tmp_path: Path, monkeypatch) -> None:
    """As if every path outside the cache dir were on another filesystem: a rename from there
    raises EXDEV (the build must happen inside the cache dir)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("FUSEG_CACHE_DIR", str(cache))
    real = os.replace

    def replace(src, dst, **kw):
        if not os.path.abspath(src).startswith(str(cache) + os.sep):
            raise OSError(errno.EXDEV, "Invalid cross-device link", src)
        return real(src, dst, **kw)

    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "rename", replace)
    assert _run(build_cpu(_kernel(uuid.uuid4().hex[:12]))).tolist() == [0.0, 3.0, 6.0, 9.0]


def test_an_uncreatable_cache_dir_falls_back_to_a_temp_dir(tmp_path: Path, monkeypatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("FUSEG_CACHE_DIR", str(blocker / "kernels"))  # cannot be made, even by root
    with pytest.warns(UserWarning, match="kernel cache"):
        fn = build_cpu(_kernel(uuid.uuid4().hex[:12]))
    assert _run(fn).tolist() == [0.0, 3.0, 6.0, 9.0]
    assert not str(build.cache_dir()).startswith(str(blocker))


def test_an_unwritable_cache_dir_falls_back_to_a_temp_dir(tmp_path: Path, monkeypatch) -> None:
    cache = tmp_path / "read-only"
    cache.mkdir()
    monkeypatch.setenv("FUSEG_CACHE_DIR", str(cache))

    def refusing(real):  # root ignores chmod: writes into the cache dir fail here instead
        def make(*a, dir=None, **kw):  # noqa: A002 - tempfile's name
            if dir is not None and os.path.abspath(dir).startswith(str(cache)):
                raise PermissionError(errno.EACCES, "Permission denied", dir)
            return real(*a, dir=dir, **kw)
        return make

    monkeypatch.setattr(tempfile, "mkstemp", refusing(tempfile.mkstemp))
    monkeypatch.setattr(tempfile, "mkdtemp", refusing(tempfile.mkdtemp))
    with pytest.warns(UserWarning, match="kernel cache"):
        fn = build_cpu(_kernel(uuid.uuid4().hex[:12]))
    assert _run(fn).tolist() == [0.0, 3.0, 6.0, 9.0]
    assert list(cache.iterdir()) == []


def test_the_fallback_dir_is_removed_when_the_process_ends(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    r = _in_subprocess(uuid.uuid4().hex[:12], blocker / "kernels")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "kernel cache" in r.stderr
    fallback = r.stdout.split()[-1]
    assert fallback.startswith(tempfile.gettempdir()) and not os.path.exists(fallback)


def _fake_compiler(tmp_path: Path, script: str) -> str:
    path = tmp_path / "fake-cxx"
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(0o755)
    return str(path)


def test_a_killed_compiler_is_reported_as_killed(tmp_path: Path, monkeypatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("FUSEG_CACHE_DIR", str(cache))
    monkeypatch.setenv("CXX", _fake_compiler(tmp_path, "kill -KILL $$"))
    with pytest.raises(Declined, match=f"killed by signal {signal.SIGKILL.name}"):
        build_cpu(_kernel(uuid.uuid4().hex[:12]))
    assert _entries(cache) == []  # no build dir left behind


def test_a_refused_kernel_leaves_no_temp_dir(tmp_path: Path, monkeypatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("FUSEG_CACHE_DIR", str(cache))
    monkeypatch.setenv("CXX", _fake_compiler(tmp_path, "echo 'error: no' >&2; exit 1"))
    with pytest.raises(build.CompileError, match="refused"):
        build_cpu(_kernel(uuid.uuid4().hex[:12]))
    assert _entries(cache) == []
    monkeypatch.delenv("CXX")
    build_cpu(_kernel(uuid.uuid4().hex[:12]))
    names = _entries(cache)
    assert len(names) == 2 and all(n.startswith("fuseg_cachetest_") for n in names), names  # the .so, its record


def _scaled(tag: str, factor: int) -> Kernel:
    """A kernel of its own: out = in * factor over 4 floats."""
    f32 = torch.float32
    params = (Param("in0", "x", f32, (4,), (1,), False), Param("out0", "y", f32, (4,), (1,), True))
    body = f"  // {tag}\n  for (FUSEG_I i = 0; i < 4; ++i) out0[i] = in0[i] * {factor}.0f;\n"
    return Kernel(f"fuseg_grouptest_{tag}_{factor}", params, body, 256, 1, "pointwise",
                  "int" if factor % 2 else "long long")  # the index type differs between kernels of one unit


def test_kernels_the_cache_misses_are_built_one_unit_per_core(tmp_path: Path, monkeypatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("FUSEG_CACHE_DIR", str(cache))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    tag = uuid.uuid4().hex[:12]
    kernels = [_scaled(tag, f) for f in range(2, 7)]
    before = build.compilations["cpu"]
    fns = build.build_cpu_many(kernels)
    assert build.compilations["cpu"] - before == 2  # five kernels, two translation units
    for f, fn in zip(range(2, 7), fns):
        assert _run(fn).tolist() == [0.0, f, 2.0 * f, 3.0 * f]
    names = _entries(cache)
    assert len(names) == 10 and not any(n.startswith(".build-") for n in names), names  # each: .so and record
    for n in names:
        if n.endswith(".so"):
            assert build._sound(str(cache / n))
    # each kernel is an entry of its own: another process finds every one without compiling
    build._CPU.clear()
    before = build.compilations["cpu"]
    fns = build.build_cpu_many(kernels[1:3])
    assert build.compilations["cpu"] == before
    assert _run(fns[1]).tolist() == [0.0, 4.0, 8.0, 12.0]


def test_a_killed_compiler_declines_every_kernel_of_its_unit(tmp_path: Path, monkeypatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("FUSEG_CACHE_DIR", str(cache))
    monkeypatch.setenv("CXX", _fake_compiler(tmp_path, "kill -KILL $$"))
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    tag = uuid.uuid4().hex[:12]
    got = build.build_cpu_many([_scaled(tag, f) for f in range(2, 5)])
    assert all(isinstance(g, Declined) and "killed by signal" in str(g) for g in got), got
    assert _entries(cache) == []

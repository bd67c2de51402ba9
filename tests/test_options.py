"""Note [options in one place] (runtime/options.py): the runtime's switches are fields of one
frozen object, read from the environment in that module only, applied by ``use`` / ``configure``
and by ``torch.compile(..., options=...)``."""

from __future__ import annotations

import dataclasses
import os
import re

import pytest
import torch

import runtime
from runtime import options
from runtime.options import RuntimeOptions, from_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DEFAULTS = {
    "background_builds": "inference", "build_threads": False, "pause_builds": True, "thread_thresholds": None,
    "disable": frozenset(), "huge_pages": True, "bias_after_matmul": None, "cache_dir": None, "cxx": None,
    "cuda_tuning": True, "row_regs": True, "bcast_ept": True, "bcast_whole": True, "soft_half": False,
    "vector_width": "measure",
}


def test_the_defaults() -> None:
    assert dataclasses.asdict(RuntimeOptions()) == DEFAULTS
    assert dataclasses.asdict(from_env({})) == DEFAULTS
    assert set(options.FIELDS) == set(DEFAULTS)


# (the variable's text -> the field's value)
PARSED = [
    ("FUSEG_BACKGROUND_BUILDS", "1", "background_builds", True),
    ("FUSEG_BACKGROUND_BUILDS", "0", "background_builds", False),
    ("FUSEG_BACKGROUND_BUILDS", "inference", "background_builds", "inference"),
    ("FUSEG_BACKGROUND_BUILDS", "", "background_builds", "inference"),  # (empty: unset)
    ("FUSEG_BUILD_THREADS", "1", "build_threads", True),
    ("FUSEG_PAUSE_BUILDS", "false", "pause_builds", False),
    ("FUSEG_THREAD_THRESHOLDS", "100,200", "thread_thresholds", (100, 200)),
    ("FUSEG_THREAD_THRESHOLDS", "1, 2, 3", "thread_thresholds", (1, 2, 3)),
    ("FUSEG_DISABLE", "cpp,cupy", "disable", frozenset({"cpp", "cupy"})),
    ("FUSEG_DISABLE", "cpp,,", "disable", frozenset({"cpp"})),
    ("FUSEG_HUGE_PAGES", "0", "huge_pages", False),
    ("FUSEG_VECTOR_WIDTH", "512", "vector_width", "512"),
    ("FUSEG_VECTOR_WIDTH", " Native ", "vector_width", "native"),
    ("FUSEG_HUGE_PAGES", "1", "huge_pages", True),
    ("FUSEG_BIAS_AFTER_MATMUL", "0", "bias_after_matmul", False),
    ("FUSEG_BIAS_AFTER_MATMUL", "1", "bias_after_matmul", None),
    ("FUSEG_CACHE_DIR", "/tmp/k", "cache_dir", "/tmp/k"),
    ("CXX", "clang++", "cxx", "clang++"),
    ("FUSEG_CUDA_TUNING", "0", "cuda_tuning", False),
    ("FUSEG_ROW_REGS", "off", "row_regs", False),
    ("FUSEG_BCAST_EPT", "0", "bcast_ept", False),
    ("FUSEG_BCAST_WHOLE", "no", "bcast_whole", False),
]


@pytest.mark.parametrize("name, text, field, want", PARSED)
def test_the_environment_is_parsed(name: str, text: str, field: str, want) -> None:
    got = from_env({name: text})
    assert getattr(got, field) == want
    assert dataclasses.replace(got, **{field: DEFAULTS[field]}) == RuntimeOptions()  # (nothing else changed)


@pytest.mark.parametrize("name, text", [
    ("FUSEG_BACKGROUND_BUILDS", "sometimes"), ("FUSEG_HUGE_PAGES", "2"), ("FUSEG_CUDA_TUNING", "nope"),
    ("FUSEG_BIAS_AFTER_MATMUL", "maybe"), ("FUSEG_THREAD_THRESHOLDS", "12,abc"), ("FUSEG_THREAD_THRESHOLDS", "1"),
    ("FUSEG_THREAD_THRESHOLDS", "0,5"),
])
def test_a_bad_variable_is_an_error_naming_it(name: str, text: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"{name}={text!r}")):
        from_env({name: text})


@pytest.mark.parametrize("field, value", [
    ("background_builds", "always"), ("huge_pages", 1), ("cuda_tuning", "0"), ("bias_after_matmul", 0),
    ("thread_thresholds", (1,)), ("thread_thresholds", (1, -2)), ("thread_thresholds", "1,2"),
    ("disable", 3), ("cache_dir", ""), ("soft_half", None),
])
def test_a_bad_field_is_an_error_naming_it(field: str, value) -> None:
    with pytest.raises(ValueError, match=re.escape(f"RuntimeOptions.{field}={value!r}")):
        RuntimeOptions(**{field: value})
    with pytest.raises(ValueError, match=re.escape(f"RuntimeOptions.{field}={value!r}")):
        RuntimeOptions().replace(**{field: value})


def test_fields_are_normalized_and_frozen() -> None:
    o = RuntimeOptions(disable=["cpp", "cupy"], thread_thresholds=[1, 2])
    assert o.disable == frozenset({"cpp", "cupy"}) and o.thread_thresholds == (1, 2)
    assert RuntimeOptions(disable="im2col").disable == frozenset({"im2col"})
    assert hash(o) == hash(RuntimeOptions(disable={"cupy", "cpp"}, thread_thresholds=(1, 2)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.huge_pages = False  # type: ignore[misc]
    with pytest.raises(ValueError, match="unknown runtime options \\['huge_page'\\]"):
        o.replace(huge_page=False)


def test_current_follows_the_environment_use_and_configure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FUSEG_HUGE_PAGES", "0")
    assert options.current().huge_pages is False
    monkeypatch.setenv("FUSEG_HUGE_PAGES", "1")  # (read again: the variable changed)
    assert options.current().huge_pages is True
    with options.use(huge_pages=False, row_regs=False) as inside:
        assert options.current() is inside and not inside.huge_pages and not inside.row_regs
        with options.use(row_regs=True):  # (over the outer one)
            assert options.current().row_regs and not options.current().huge_pages
        assert not options.current().row_regs
    assert options.current().huge_pages and options.current().row_regs
    seen = options.bound(options.current, RuntimeOptions(huge_pages=False))
    assert seen().huge_pages is False and options.current().huge_pages is True  # (each call within, only)
    try:
        options.configure(bcast_whole=False)
        assert options.current().bcast_whole is False
        with options.use(bcast_whole=True):
            assert options.current().bcast_whole is True
    finally:
        options.configure()
    assert options.current().bcast_whole is True
    monkeypatch.setenv("FUSEG_BCAST_WHOLE", "maybe")
    with pytest.raises(ValueError, match="FUSEG_BCAST_WHOLE='maybe'"):
        options.current()


_READ = re.compile(r"os\.environ|getenv|environ\.get")


def test_the_environment_is_read_in_one_module() -> None:
    """Only runtime/options.py reads the process environment in segmenter/, alias/ and runtime/."""
    found = []
    for top in ("segmenter", "alias", "runtime"):
        for folder, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in files:
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, ROOT)
                if not name.endswith(".py") or rel == os.path.join("runtime", "options.py"):
                    continue
                with open(path, encoding="utf-8") as f:
                    found += [f"{rel}:{i}" for i, line in enumerate(f, 1) if _READ.search(line)]
    assert found == [], "read the environment in runtime/options.py (a RuntimeOptions field) only"


# -- the options reach what they switch ------------------------------------------------------------

def _kernels(fn, inputs):
    from alias import apply_aliases
    from segmenter import capture, segment

    return list(runtime.compile(apply_aliases(segment(capture(fn, inputs)), "post"), backend="auto").kernels.values())


def test_source_switches_change_the_source_and_its_key() -> None:
    (plain,) = _kernels(lambda x: (x * 2).sin() + 1, [torch.randn(3000)])
    with options.use(cuda_tuning=False):
        (untuned,) = _kernels(lambda x: (x * 2).sin() + 1, [torch.randn(3000)])
        untuned_src = untuned.source("cuda")
    assert "__launch_bounds__" in plain.source("cuda") and "__launch_bounds__" not in untuned_src
    assert plain.grid != untuned.grid  # (four elements a thread against one)
    with options.use(soft_half=True):
        assert "#define FUSEG_SOFT_HALF" in plain.source("cpu")
    assert "#define FUSEG_SOFT_HALF" not in plain.source("cpu")


def test_disable_passes_over_a_backend() -> None:
    from runtime.backends import backends_for

    assert "disabled" not in str(dict((b.name, why) for b, why in backends_for("cpu"))["cpp"])
    with options.use(disable={"cpp", "torch"}):
        got = dict((b.name, why) for b, why in backends_for("cpu"))
    assert "disabled" in got["cpp"] and got["torch"] is None  # (torch cannot be)


def _recording(monkeypatch: pytest.MonkeyPatch) -> list:
    import runtime.dynamo

    made = []

    def recording(plan, backend="auto", background=False):
        made.append((background, options.current()))
        return runtime.CompiledProgram(plan, backend, background=background)

    monkeypatch.setattr(runtime.dynamo, "CompiledProgram", recording)
    return made


def test_torch_compile_options_reach_the_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    made = _recording(monkeypatch)

    def fn(x):
        return torch.sin(x) * 2 + 1

    x = torch.randn(5, 6)
    monkeypatch.setenv("FUSEG_BACKGROUND_BUILDS", "1")
    monkeypatch.setenv("FUSEG_HUGE_PAGES", "1")
    torch._dynamo.reset()
    try:
        compiled = torch.compile(fn, backend="fuseg", options={"background_builds": False, "huge_pages": False,
                                                                "bcast_ept": False})
        with torch.no_grad():
            for shape in ((5, 6), (5, 6), (7, 3)):  # (the later calls through the direct entry, and a new shape)
                y = torch.randn(shape)
                torch.testing.assert_close(compiled(y), fn(y))
        assert made and all(m == made[0] for m in made)  # (a program per shape, each with the options)
        background, seen = made[0]
        assert background is False
        assert (seen.background_builds, seen.huge_pages, seen.bcast_ept) == (False, False, False)
        assert options.current().huge_pages is True  # (the compile's options stay the compile's)
        torch._dynamo.reset()
        made.clear()
        with torch.no_grad():
            torch.compile(fn, backend="fuseg")(x)
        ((background, seen),) = made
        assert background is True and seen.huge_pages is True  # (the environment's)
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize("given, match", [
    ({"huge_page": False}, "unknown options \\['huge_page'\\]"),
    ({"cache_dir": "/tmp/x"}, "are the process's"),
    ({"huge_pages": "no"}, "RuntimeOptions.huge_pages='no'"),
])
def test_torch_compile_refuses_bad_options(given: dict, match: str) -> None:
    def fn(x):
        return x.cos() + 1

    torch._dynamo.reset()
    try:
        with pytest.raises(Exception, match=match):
            torch.compile(fn, backend="fuseg", options=given)(torch.randn(3))
    finally:
        torch._dynamo.reset()


def test_the_compiler_takes_runtime_options(monkeypatch: pytest.MonkeyPatch) -> None:
    from runtime.dynamo import FusegCompiler

    monkeypatch.setenv("FUSEG_BACKGROUND_BUILDS", "1")
    monkeypatch.setenv("FUSEG_BIAS_AFTER_MATMUL", "0")
    assert FusegCompiler().background_builds is True and FusegCompiler().options.bias_after_matmul is False
    c = FusegCompiler(runtime_options={"background_builds": False, "bias_after_matmul": None})
    assert c.background_builds is False and c.options.bias_after_matmul is None
    assert FusegCompiler(background_builds="inference", runtime_options={"background_builds": False}
                         ).background_builds == "inference"  # (the argument first)
    with pytest.raises(ValueError, match="process's"):
        FusegCompiler(runtime_options={"build_threads": True})

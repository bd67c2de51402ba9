"""The runtime's options: one frozen object, read from the environment here and nowhere else.

Note [options in one place]: every switch of the runtime (background builds, huge pages, the
kernel cache dir, the before/after switches of one optimization, ...) is a field of
``RuntimeOptions``. ``from_env()`` is the one place in segmenter/, alias/ and runtime/ that reads
the process environment (tests/test_options.py fails where another module does); each field
names its variable (``env``), listed on docs/options.md. The code asks ``current()``: the options
``use(...)`` applied in this context (a ``torch.compile(..., options=...)`` graph's calls, a
test, an experiment), else ``configure(...)``'s for the process, else the environment's, read
again whenever one of the variables changed (tests set them with ``monkeypatch.setenv``).
A value that cannot be parsed or is of the wrong type is an error naming the variable or the
field, not a default taken silently. The kernel-source switches (``SOURCE_FIELDS``) change the
generated source, hence the kernel cache key, exactly as their variables did.

Scoped options reach threads fuseg starts for a build (they run in a copy of the caller's
context); the process-wide fields (``PROCESS_FIELDS``: the cache dir, the compiler, the thread
thresholds, how background compilers share the cores) act on machinery shared by every program,
so ``torch.compile``'s options refuse them: set them in the environment or with ``configure``.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = ["PROCESS_FIELDS", "SOURCE_FIELDS", "RuntimeOptions", "bound", "configure", "current", "default_cache_dir",
           "from_env", "parse_thread_thresholds", "use"]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_THRESHOLDS_FORMAT = ("LOOP,MACS[,COSTLY[,BESIDE_LOOP,BESIDE_MACS[,PACK_ROWS,NN_PACK_ROWS]]], positive "
                      "integers (elements of a loop's work and multiply-adds of a product from which threads share "
                      "them; what a call of exp costs in plain ops; below what a kernel may run beside others; "
                      "rows from which a product copies B first)")


def _opt(default: Any, env: str | None, doc: str) -> Any:
    return dataclasses.field(default=default, metadata={"env": env, "doc": doc})


@dataclasses.dataclass(frozen=True)
class RuntimeOptions:
    """What the runtime reads besides a plan. See docs/options.md for each field."""

    #: kernels built off the caller's thread: True every graph, False none, "inference" inference graphs only
    background_builds: bool | str = _opt("inference", env="FUSEG_BACKGROUND_BUILDS",
                                         doc="1 / 0 / inference (Note [kernels built in the background])")
    #: background compilers get half the cores and calls run torch on the rest (the "cores" policy);
    #: False: calls keep torch's threads and stop the compilers while they run (Note [calls first
    #: while kernels build])
    build_threads: bool = _opt(False, env="FUSEG_BUILD_THREADS", doc="Note [calls first while kernels build]")
    #: background compilers stopped while dynamo traces and fuseg plans
    pause_builds: bool = _opt(True, env="FUSEG_PAUSE_BUILDS", doc="Note [compilers paused while dynamo traces]")
    #: LOOP,MACS[,...] fixed instead of measured (None: measured once per machine)
    thread_thresholds: tuple[int, ...] | None = _opt(None, env="FUSEG_THREAD_THRESHOLDS",
                                                     doc="Note [thread thresholds measured here]")
    #: backend names passed over (torch cannot be)
    disable: frozenset[str] = _opt(frozenset(), env="FUSEG_DISABLE", doc="comma-separated backend names")
    #: big CPU buffers advised onto transparent huge pages
    huge_pages: bool = _opt(True, env="FUSEG_HUGE_PAGES", doc="Note [huge pages for big buffers]")
    #: False: the torch.compile backend segments with bias_after_matmul=False (None: the segmenter's rule)
    bias_after_matmul: bool | None = _opt(None, env="FUSEG_BIAS_AFTER_MATMUL",
                                          doc="0: Note [a matmul's bias after it] off (a before/after switch)")
    #: the kernel cache dir (None: $XDG_CACHE_HOME/fuseg/kernels, else ~/.cache/fuseg/kernels)
    cache_dir: str | None = _opt(None, env="FUSEG_CACHE_DIR", doc="the kernel cache dir")
    #: the C++ compiler of the cpp backend (None: g++, c++ or clang++ from PATH)
    cxx: str | None = _opt(None, env="CXX", doc="the C++ compiler")
    #: Note [CUDA launch shapes] and friends (False: the code before them; a before/after switch)
    cuda_tuning: bool = _opt(True, env="FUSEG_CUDA_TUNING", doc="Note [CUDA launch shapes]")
    #: Note [row registers] on CUDA (a before/after switch)
    row_regs: bool = _opt(True, env="FUSEG_ROW_REGS", doc="Note [row registers]")
    #: Note [elements along a broadcast dim] (a before/after switch)
    bcast_ept: bool = _opt(True, env="FUSEG_BCAST_EPT", doc="Note [elements along a broadcast dim]")
    #: a small broadcast dim that 4 does not divide taken whole by a thread (a before/after switch)
    bcast_whole: bool = _opt(True, env="FUSEG_BCAST_WHOLE", doc="Note [elements along a broadcast dim]")
    #: the vector width CPU kernels prefer: "measure" (once per machine), "native" (the compiler's) or "512"
    vector_width: str = _opt("measure", env="FUSEG_VECTOR_WIDTH", doc="Note [a vector width measured here]")
    #: the software fp16/bf16 conversions on CUDA too (the CPU always runs them: Note [fp16 on the CPU]; tests)
    soft_half: bool = _opt(False, env=None, doc="Note [fp16 on the CPU]")

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            fixed = _check(f.name, value)
            if fixed is not value:
                object.__setattr__(self, f.name, fixed)

    def replace(self, **changes: Any) -> RuntimeOptions:
        """These options with ``changes``; an unknown name is an error that lists the known ones."""
        unknown = set(changes) - set(FIELDS)
        if unknown:
            raise ValueError(f"unknown runtime options {sorted(unknown)} (known: {', '.join(FIELDS)})")
        return dataclasses.replace(self, **changes)


FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(RuntimeOptions))
#: the fields that change a generated kernel's source (hence its cache key)
SOURCE_FIELDS = frozenset({"cuda_tuning", "row_regs", "bcast_ept", "bcast_whole", "soft_half"})
#: the fields of machinery every program shares (refused by torch.compile's options)
PROCESS_FIELDS = frozenset({"build_threads", "pause_builds", "thread_thresholds", "cache_dir", "cxx", "vector_width"})
_WIDTHS = ("measure", "native", "512")
_ENV_NAMES: dict[str, str] = {f.name: f.metadata["env"] for f in dataclasses.fields(RuntimeOptions)
                              if f.metadata["env"]}


def _bad(name: str, value: Any, want: str) -> ValueError:
    return ValueError(f"RuntimeOptions.{name}={value!r}: expected {want}")


def _check(name: str, value: Any) -> Any:
    """``value`` for field ``name``, normalized (a list of names to a frozenset, a threshold list to
    a tuple), or a ValueError naming the field and the value."""
    if name == "background_builds":
        if value is True or value is False or value == "inference":
            return value
        raise _bad(name, value, 'True, False or "inference"')
    if name == "bias_after_matmul":
        if value is None or isinstance(value, bool):
            return value
        raise _bad(name, value, "True, False or None")
    if name == "thread_thresholds":
        if value is None:
            return value
        if (isinstance(value, (tuple, list)) and len(value) in (2, 3, 5, 7)
                and all(type(v) is int and v > 0 for v in value)):
            return tuple(value)
        raise _bad(name, value, f"None or a tuple of {_THRESHOLDS_FORMAT}")
    if name == "disable":
        names = value.split(",") if isinstance(value, str) else value
        if isinstance(names, Iterable) and all(isinstance(n, str) for n in names):
            out = frozenset(n.strip() for n in names if n.strip())
            return value if isinstance(value, frozenset) and out == value else out
        raise _bad(name, value, "backend names (a set, or a comma-separated string)")
    if name in ("cache_dir", "cxx"):
        if value is None or (isinstance(value, str) and value):
            return value
        raise _bad(name, value, "a non-empty path or None")
    if name == "vector_width":
        if value in _WIDTHS:
            return value
        raise _bad(name, value, " or ".join(repr(w) for w in _WIDTHS))
    if not isinstance(value, bool):
        raise _bad(name, value, "True or False")
    return value


def parse_thread_thresholds(text: str) -> tuple[int, ...]:
    """``FUSEG_THREAD_THRESHOLDS``'s text as positive integers, or a ValueError naming the variable."""
    name = _ENV_NAMES["thread_thresholds"]
    parts = text.split(",")
    try:
        if len(parts) not in (2, 3, 5, 7):
            raise ValueError
        values = tuple(int(p.strip()) for p in parts)
    except ValueError:
        raise ValueError(f"{name}={text!r}: expected {_THRESHOLDS_FORMAT}") from None
    if min(values) <= 0:
        raise ValueError(f"{name}={text!r}: every value must be positive")
    return values


def _parse(field: str, text: str) -> Any:
    """The value of ``field`` its variable's ``text`` says; a ValueError naming the variable."""
    name = _ENV_NAMES[field]
    low = text.strip().lower()
    if field == "thread_thresholds":
        return parse_thread_thresholds(text)
    if field == "disable":
        return text
    if field in ("cache_dir", "cxx"):
        return text
    if field == "vector_width":
        if low in _WIDTHS:
            return low
        raise ValueError(f"{name}={text!r}: expected measure, native or 512")
    if field == "background_builds" and low == "inference":
        return "inference"
    if field == "bias_after_matmul":
        if low in _FALSE:
            return False
        if low in _TRUE:
            return None  # (1: the segmenter's own rule, as unset)
        raise ValueError(f"{name}={text!r}: expected 0 or 1")
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(f"{name}={text!r}: expected 0 or 1" + (" or inference" if field == "background_builds" else ""))


def from_env(environ: Any = None) -> RuntimeOptions:
    """The options the environment (``environ``, default ``os.environ``) sets; an unset or empty
    variable leaves its field's default. The one place the runtime reads the environment."""
    environ = os.environ if environ is None else environ
    given = {}
    for field, name in _ENV_NAMES.items():
        text = environ.get(name)
        if text:
            given[field] = _parse(field, text)
    return RuntimeOptions(**given)


def default_cache_dir() -> str:
    """The kernel cache dir where none is set: ``$XDG_CACHE_HOME/fuseg/kernels``, else ``~/.cache/fuseg/kernels``."""
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fuseg", "kernels")


_NAMES = tuple(_ENV_NAMES.values())
_FROM_ENV: dict[tuple, RuntimeOptions] = {}
_FROM_ENV_LOCK = threading.Lock()
_CONFIGURED: list[RuntimeOptions] = []
_APPLIED: contextvars.ContextVar[RuntimeOptions | None] = contextvars.ContextVar("fuseg_runtime_options",
                                                                                 default=None)


# (the key of the cache: the variables' raw values. ``os.environ.get`` raises and catches a
# KeyError for each unset one, ~25x the time of a look-up in the mapping os.environ keeps of the
# encoded names, which every change through os.environ, monkeypatch's included, updates)
_RAW_NAMES = tuple(os.environ.encodekey(n) for n in _NAMES) if hasattr(os.environ, "encodekey") else ()


def _environment() -> RuntimeOptions:
    raw = getattr(os.environ, "_data", None)  # (looked up each time: os.environ may be replaced)
    key = tuple(map(raw.get, _RAW_NAMES)) if raw is not None and _RAW_NAMES else tuple(map(os.environ.get, _NAMES))
    got = _FROM_ENV.get(key)
    if got is None:
        got = from_env()  # (a bad value raises here, each time it is asked: nothing cached)
        with _FROM_ENV_LOCK:
            if len(_FROM_ENV) > 64:  # (tests set many combinations; the cache stays small)
                _FROM_ENV.clear()
            _FROM_ENV[key] = got
    return got


def current() -> RuntimeOptions:
    """The options in force here: ``use``'s, else ``configure``'s, else the environment's."""
    applied = _APPLIED.get()
    if applied is not None:
        return applied
    if _CONFIGURED:
        return _CONFIGURED[-1]
    return _environment()


def configure(options: RuntimeOptions | None = None, **changes: Any) -> RuntimeOptions:
    """Set the process's options (every thread, every later call): ``options`` (default: the
    environment's) with ``changes``. ``configure(None)`` with no changes goes back to the environment."""
    if options is None and not changes:
        _CONFIGURED.clear()
        return current()
    chosen = (options or _environment()).replace(**changes)
    _CONFIGURED[:] = [chosen]
    return chosen


def bound(fn: Callable[..., Any], options: RuntimeOptions) -> Callable[..., Any]:
    """``fn``, each call of it with ``options`` in force (``use`` without a generator's cost per call)."""
    def with_options(*args: Any, **kwargs: Any) -> Any:
        token = _APPLIED.set(options)
        try:
            return fn(*args, **kwargs)
        finally:
            _APPLIED.reset(token)

    return with_options


@contextlib.contextmanager
def use(options: RuntimeOptions | None = None, **changes: Any) -> Iterator[RuntimeOptions]:
    """Within (this context, and the builds it starts): ``options`` (default: ``current()``) with ``changes``."""
    chosen = (options or current()).replace(**changes)
    token = _APPLIED.set(chosen)
    try:
        yield chosen
    finally:
        _APPLIED.reset(token)

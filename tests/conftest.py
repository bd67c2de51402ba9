"""Print the fuzzers' coverage counters and the op_db and module_db sweeps' tallies at the end of a test run;
every test takes the generated kernels the cpp backend would measure against ATen (below)."""

from __future__ import annotations

import os

import pytest

# Note [thread thresholds measured here] (runtime/codegen/thresholds.py): from how much work a
# kernel's loops share torch's threads is measured once per machine; kernels in tests must not
# depend on a timing, so the suite (and the processes it starts) generates them with the
# thresholds fixed here, unless the caller sets its own; tests/test_thresholds.py measures.
os.environ.setdefault("FUSEG_THREAD_THRESHOLDS", f"{1 << 15},{1 << 22}")
# Note [a vector width measured here] (runtime/codegen/vector_width.py): the compiler's own width,
# unless the caller sets one; tests/test_vector_width.py measures
os.environ.setdefault("FUSEG_VECTOR_WIDTH", "native")


@pytest.fixture(autouse=True)
def _kernels_not_timings():
    """Note [choices by measurement] (runtime/autotune.py): the cpp backend times a matmul, an
    attention, a convolution or a lone softmax against ATen once per shape class and keeps the
    verdict on disk. A test must not depend on a timing (one unlucky one, cached, would fail the
    same test on every later run), so tests take every kernel the generator builds; the tests of
    the measuring itself (tests/test_autotune.py) set their own choice and cache."""
    from runtime.autotune import fixed
    from runtime.compiled.trial import program_checks

    # (Note [a program against its ATen path] in runtime/compiled/trial.py: tests that set measuring on
    # must not have their programs tried against ATen by a timing either; tests/test_program_check.py
    # turns it on with its own clock)
    with fixed("kernel"), program_checks(False):
        yield


@pytest.fixture(autouse=True)
def _builds_at_once(monkeypatch):
    """Note [kernels built in the background] (runtime/compiled/background.py): by default an inference
    graph's programs (symbolic plans and programs of fixed sizes) compile their new kernels off
    the caller's thread and torch runs their segments until they are built, so which launches a
    call runs depends on how fast the compiler was. Tests that inspect a program's kernels must not depend on that: the suite
    builds at once (FUSEG_BACKGROUND_BUILDS=0, set here whatever the caller's environment says),
    and tests/test_background_builds.py turns it on, holding the builds back and letting them go
    where it checks."""
    monkeypatch.setenv("FUSEG_BACKGROUND_BUILDS", "0")
    yield


def pytest_addoption(parser) -> None:  # noqa: ANN001 - pytest's hook signature
    parser.addoption("--run-slow", action="store_true", default=False,
                     help="also run the tests marked slow (sizes past what CI affords: reductions over 2^26 elements)")


def pytest_collection_modifyitems(config, items) -> None:  # noqa: ANN001 - pytest's hook signature
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001 - pytest's hook signature
    import sys

    from tests import test_fuzz, test_hostile_json

    if test_fuzz.COVERAGE:
        items = sorted(test_fuzz.COVERAGE.items())
        terminalreporter.write_line("fuzz coverage: " + ", ".join(f"{k}={v}" for k, v in items))
    if test_hostile_json.OUTCOMES:
        items = sorted(test_hostile_json.OUTCOMES.items())
        terminalreporter.write_line("hostile JSON mutants: " + ", ".join(f"{k}={v}" for k, v in items))
    for line in getattr(sys.modules.get("tests.test_opdb"), "SUMMARY", ()):
        terminalreporter.write_line(line)
    for line in getattr(sys.modules.get("tests.test_peer_suite"), "SUMMARY", ()):
        terminalreporter.write_line(line)
    moduledb = sys.modules.get("tests.test_moduledb")
    if moduledb is not None and moduledb.TALLY:
        terminalreporter.write_line("module_db: " + ", ".join(f"{k}={v}" for k, v in sorted(moduledb.TALLY.items())))
        for line in moduledb.TORCH_DIFFERS:
            terminalreporter.write_line(f"  module_db, torch's difference: {line}")

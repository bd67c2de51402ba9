"""Print the fuzzers' coverage counters and the op_db sweep's tally at the end of a test run."""

from __future__ import annotations


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

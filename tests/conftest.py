"""Print the fuzzers' coverage counters and the op_db and module_db sweeps' tallies at the end of a test run."""

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
    moduledb = sys.modules.get("tests.test_moduledb")
    if moduledb is not None and moduledb.TALLY:
        terminalreporter.write_line("module_db: " + ", ".join(f"{k}={v}" for k, v in sorted(moduledb.TALLY.items())))
        for line in moduledb.TORCH_DIFFERS:
            terminalreporter.write_line(f"  module_db, torch's difference: {line}")

"""Profiles, benchmarks, reports and the ``fuseg`` command line (only ``segment`` exists yet)."""

__all__: list[str] = []

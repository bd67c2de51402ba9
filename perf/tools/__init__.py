"""The ``fuseg`` command line and the user tools behind its commands.

cli.py (``fuseg = perf.tools.cli:main`` in setup.py; ``python -m perf.tools.cli`` runs it too):
``fuseg segment``, ``export``, ``run``, ``profile``, ``bench``, ``report`` and ``examples``.
profile.py (segment, kernel and launch counts per model and alias mode), suite.py (``fuseg profile
--suite transformers``: every architecture transformers ships), run.py (a target run and checked
against eager), report.py (two bench records compared; exit 1 on a regression), sweep_report.py
(the same for two sweep records), html/ (a segmentation as one HTML page, ``--html FILE``).

What they share with the benchmarks is one layer down, at perf/'s root: bench.py (``fuseg
bench``'s timings and a record's environment), targets.py (what a TARGET argument names), hf.py
(``hf:ARCH`` targets), shards.py (``--shard I/N`` and the sweep record), zoo.py (the examples).
"""

__all__: list[str] = []

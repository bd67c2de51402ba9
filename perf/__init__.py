"""The ``fuseg`` command line, the example programs and model sets, and the benchmarks.

The layers (pyproject.toml's import-linter contract "perf: ..."), top to bottom:

- experiments/ (one-off measurements of single kernels and single changes, kept with their
  records) and gpu/ (gpu_bandwidth, gpu_kernels; gpu_summary sums up gpu_validate.sh's run).
- tools/: the ``fuseg`` command line (tools/cli.py; ``fuseg = perf.tools.cli:main`` in setup.py)
  and the modules of its commands: profile, suite, run, report, sweep_report, html/.
  benchmarks/: before_after, bench_segment, bench_pipeline (on synthetic.py's graphs),
  bench_alias, bench_runtime, launch_overhead, each ``python -m perf.benchmarks.NAME``.
  Beside them, here at the root, the benchmarks the docs and issues name as ``python -m perf.NAME``:
  compiled (eager, Inductor and fuseg through ``torch.compile`` on the model sets, CPU or CUDA),
  train_step (one training step under eager, Inductor and fuseg), dynamic_shapes (what a new shape
  costs under each backend), reductions (chunked sums against one loop); and two maintainers'
  tools: records (``python -m perf.records``: results/README.md and the README's results table,
  Note [records]) and notes (``python -m perf.notes``: docs/notes.md, the index of the Notes).
- bench.py: ``fuseg bench`` (wall time of eager, the runtime per alias mode and backend, and
  ``torch.compile``) and what every benchmark shares: a record's environment, its writing, timers.
- targets.py (what a TARGET argument names), shards.py (``--shard I/N`` and a sweep's record),
  models.py (the compiled-model sets: ``DEFAULT``, ``HELD_OUT``, ``UNSEEN``, ``REALISTIC``; loaded
  by path by an older checkout, so it stays here).
- zoo.py (the built-in examples, random weights, some at real sizes on meta tensors), hf.py
  (``hf:ARCH``: any transformers architecture from its config class), fusions/ (nvFuser scripts
  kept as data).

gpu_validate.sh runs the GPU tests and the GPU benchmarks in one go on a GPU machine. results/
holds the committed records, one folder per machine (history, not rewritten).
"""

__all__: list[str] = []

"""The ``fuseg`` command line, the example programs and model sets, and the benchmarks.

Command line (perf/cli.py; ``fuseg = perf.cli:main`` in setup.py): ``fuseg segment``, ``export``,
``run``, ``profile``, ``bench``, ``report`` and ``examples``. Their modules: profile.py (segment,
kernel and launch counts per model and alias mode), bench.py (wall time of eager, the runtime per
alias mode and backend, and ``torch.compile``, with the environment), report.py (two bench
records compared; exit 1 on a regression), run.py (a target run and checked against eager),
targets.py (what a TARGET argument names).

Programs: zoo.py (the built-in examples, random weights, some at real sizes on meta tensors);
models.py (the compiled-model sets: ``DEFAULT``, ``HELD_OUT``, ``UNSEEN``, ``REALISTIC``);
synthetic.py (transformer-like graphs of any size); fusions/ (nvFuser scripts kept as data).

Benchmarks, each ``python -m perf.NAME``: compiled (eager, Inductor and fuseg through
``torch.compile`` on the model sets, CPU or CUDA), before_after (the same against another
checkout, fresh processes alternating), dynamic_shapes (what a new shape costs under each
backend), train_step (one training step of LMs and encoders under eager, Inductor and fuseg,
checked against eager; ``--before`` against another checkout), bench_segment and bench_pipeline (segmentation and the whole pipeline against graph
size), bench_alias (kernels and bytes per alias mode), bench_runtime (the examples through the
runtime against eager), launch_overhead (host time per call of a one-kernel program),
gpu_bandwidth (row kernels and RoPE against a device copy's bandwidth), gpu_kernels (per-kernel
device time of a compiled model, fuseg against Inductor).

gpu_validate.sh runs the GPU tests and the GPU benchmarks in one go on a GPU machine, and
gpu_summary.py summarizes what it left. experiments/ holds one-off measurements of single kernels
and single changes, kept with their records. results/ holds the committed records, one folder per
machine (history, not rewritten); ``python -m perf.records`` (records.py) regenerates their index,
results/README.md, and the README's results table (Note [records]).
"""

__all__: list[str] = []

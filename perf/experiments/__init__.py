"""One-off measurements of single kernels and single changes, kept beside the records they made.

Each script measured one thing, to choose a threshold or to check one change; its record is
committed in perf/results/ and cited in the README. They are kept to be re-run, not as tools for
users (those are at perf/'s top level). Run one as ``python -m perf.experiments.NAME --help``.
One line each: what it measured, and its record in perf/results/.

  depthwise         depthwise 2-D convolutions, eager (oneDNN) against the generated kernel: depthwise_cpu.json
  onetap            one-tap convolutions, eager against the kernel (one thread, threaded) and im2col: onetap_cpu.json
  patches           1-D convolutions of several taps, eager against the patch kernel: patches_cpu.json
  outer_reductions  reductions over outer dims, eager against the column kernel and torch: outer_reductions_cpu.json
  row_reductions    row max/min kernels against eager, 3524c23 against edc6b39: row_reductions_cpu.json
  softmax_exps      softmax row kernels keeping their exps against recomputing them: softmax_exps_cpu.json
  compile_parts     Python's compile() of a 100k-node program, whole and in parts: compile_parts_100k.json
  pipeline_ab       the pipeline at 100k nodes against b30ce78: pipeline_before_after_100k_session21.json
  kernel_choice     the generated matmul and attention kernels against ATen's ops per shape: kernel_choice_cpu.json

The size caps the first three chose (``conv.MAX_MACS``, ``onetap.MAX_WORK``, ``patches.MAX_WORK``) are
gone: kernel or ATen is measured on each machine (Note [choices by measurement] in runtime/autotune.py).
``onetap.PARALLEL_WORK`` and ``patches.MIN_FILTERS`` are still the figures they chose.
perf/results/README.md gives the command that made each record, under the script's old name.
"""

__all__: list[str] = []

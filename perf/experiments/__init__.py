"""One-off measurements of single kernels and single changes, kept beside the records they made.

Each script measured one thing, to choose a threshold or to check one change; its record is
committed in perf/results/<machine>/ (the one-off before/after ones are in git history only). They are kept to be re-run, not as tools for
users (those are in perf/tools/). Run one as ``python -m perf.experiments.NAME --help`` (those in
reductions/ and shapes/ as ``perf.experiments.reductions.NAME``, ``perf.experiments.shapes.NAME``).
One line each: what it measured, and its record (its file name, under perf/results/<machine>/).

  depthwise         depthwise 2-D convolutions, eager (oneDNN) against the generated kernel: depthwise_cpu.json
  onetap            one-tap convolutions, eager against the kernel (one thread, threaded) and im2col: onetap_cpu.json
  patches           1-D convolutions of several taps, eager against the patch kernel: patches_cpu.json
  reductions/outer_reductions  reductions over outer dims, eager against the column kernel and torch: outer_reductions_cpu.json
  reductions/row_reductions    row max/min kernels against eager, 3524c23 against edc6b39: row_reductions_cpu.json
  reductions/softmax_exps      softmax row kernels keeping their exps against recomputing them: softmax_exps_cpu.json
  compile_parts     Python's compile() of a 100k-node program, whole and in parts: compile_parts_100k.json
  pipeline_ab       the pipeline at 100k nodes against b30ce78 (record in git history)
  kernel_choice     the generated matmul and attention kernels against ATen's ops per shape: kernel_choice_cpu.json
  shapes/class_crossing    a prompt crossing a power of two under backend="fuseg", against a checkout: class_crossing_cpu.json
  shapes/second_length_parts  where the second prompt length's time goes (issue 41): second_length_*_cpu.json
  half_round_trips  fp16/bf16 blocks with and without the round trips of rounded values (record in git history)
  index_merge       kernels built with and without merged split indices, in one process: index_merge_cpu.json
  no_pre            kernels built with and without g++'s PRE, in one process: no_pre_cpu.json
  sides             (no record) the shared part of index_merge and no_pre: programs built two ways, timed
  embedding_backward  training steps with the embedding backward (or, --kernels nll_loss, the loss) kernels against
                    ATen's ops: embedding_backward_cpu.json, nll_loss_kernels_cpu.json
  entry_storage_tests  a program entry's storage tests, storages fetched once against per test: entry_storage_tests_cpu.json
  bf16_rounding     bf16 rounded within the float lanes against two conversions, in one process: bf16_rounding_cpu.json
  simd_loops        pointwise loops under OpenMP with and without ``omp simd``, in one process: simd_loops_cpu.json
  builds_share      the first 30 s of calls with and without the wait that follows the builds' share: builds_share_cpu.json
  aten_sum_order    row sums in ATen's order against lane-parallel sums, in one process: aten_sum_order_cpu.json
  half_vectors      fp16 kernels with branchless conversions against F16C's one-value ones, in one process:
                    half_vectors_cpu.json
  half_rows         fp16 kernels with rows converted by F16C, one row's passes on threads and the cheaper
                    round, against none of them, in one process: half_rows_cpu.json

The size caps the first three chose (``conv.MAX_MACS``, ``onetap.MAX_WORK``, ``patches.MAX_WORK``) are
gone: kernel or ATen is measured on each machine (Note [choices by measurement] in runtime/autotune.py).
``patches.MIN_FILTERS`` went the same way (2026-11-28), and ``onetap.PARALLEL_WORK`` gave way to
the matmul threshold measured on the machine (Note [thread thresholds measured here]).
perf/results/README.md (generated) gives the command that made each record, under the script's old name.
"""

__all__: list[str] = []

"""The GPU benchmarks, each ``python -m perf.gpu.NAME``, and the summary of a GPU validation run.

gpu_bandwidth (row kernels and RoPE blocks against a device copy's bandwidth), gpu_kernels
(per-kernel device time of a compiled model, fuseg against Inductor), gpu_summary (what each step
of perf/gpu_validate.sh did, from the files it left). perf/gpu_validate.sh, which runs the GPU
tests and these benchmarks in one go, stays at perf/'s root, where the issues and the README name it.
"""

__all__: list[str] = []

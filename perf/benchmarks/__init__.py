"""Benchmarks of the pipeline and the runtime, each ``python -m perf.benchmarks.NAME``.

before_after (``torch.compile(backend="fuseg")`` of this checkout against another, fresh
processes alternating), bench_segment and bench_pipeline (segmentation and the whole pipeline
against graph size, on synthetic.py's transformer-like graphs of any size), bench_alias (kernels
and bytes per alias mode), bench_runtime (the examples through the runtime against eager),
launch_overhead (host time per call of a one-kernel program, CPU or CUDA).

The benchmarks that docs and issues name by ``python -m perf.NAME`` (compiled, train_step,
dynamic_shapes, reductions) stay at perf/'s root; the GPU ones are in perf/gpu/.
"""

__all__: list[str] = []

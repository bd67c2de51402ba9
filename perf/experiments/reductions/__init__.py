"""One-off measurements of the reduction kernels, each ``python -m perf.experiments.reductions.NAME``:
outer_reductions (reductions over outer dims, eager against the column kernel and torch),
row_reductions (row max/min kernels against eager, one checkout against another), softmax_exps
(softmax row kernels keeping their exps against recomputing them). perf/experiments/__init__.py
names their records."""

__all__: list[str] = []

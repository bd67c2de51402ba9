"""Kernel segments (POINTWISE, REDUCTION, NORMALIZATION) lowered to one kernel each (lower.py):
per-element expressions (pointwise.py), row kernels (rows.py), reductions over outer dims
(columns.py), exact sums in chunks (cascade.py), loops split where their branches are constant
(fission.py), tables of a transcendental of a small input (tables.py)."""

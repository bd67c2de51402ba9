"""Lone OPAQUE ops as generated C++ kernels (the CPU target only), each chosen against ATen by
measurement: matmuls (gemm.py), attention (attention.py), depthwise convolutions (conv.py), the
convolutions built on the matmul routines (matconv.py, onetap.py, patches.py), embedding lookups
(embedding.py), the nll loss (nll_loss.py), cumulative sums (scan.py)."""

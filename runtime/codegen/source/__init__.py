"""What every generated kernel's source is made of: C types, literals and the shared prelude
(ctypes_.py, gemm_prelude.py: the matmul and attention routines), index math (index.py), sizes
passed as arguments (symsizes.py), and the checks on every value written into source (checks.py)."""

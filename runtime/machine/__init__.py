"""The machine under the kernels: torch's threads beside background compilers (threads.py), the
compilers' pause (pause.py)."""

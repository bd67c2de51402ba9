"""The machine under the kernels: its C++ compiler, the kernel cache dir and the machine's
description (compiler.py), torch's threads beside background compilers (threads.py), the
compilers' pause (pause.py), a value made once per key across threads (once.py)."""

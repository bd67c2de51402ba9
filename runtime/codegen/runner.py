"""The chain runner: one native function that calls a list of built kernels in order (Note [one
native call for a chain of kernels] in runtime/chains.py).

It is a kernel like any other (built and cached with a program's kernels), with two int64
parameters: ``code``, the chain's steps, and ``slots``, the base addresses of the call. ``code``
is ``[steps, then per step: kernel address, argument count, returns a count (0/1), then per
argument: slot, bytes]``; an argument is ``slots[slot] + bytes``. The program makes ``code``
when it is compiled, from kernels it built and offsets it planned; only ``slots`` changes from
call to call (the data pointers of that call's tensors).

Every kernel takes only pointers, so a call through a pointer to a function of as many ``void *``
parameters is the call ctypes makes (``argtypes = [c_void_p] * n``). A kernel that returns a
count (an embedding's indices out of range: Note [embedding kernels]) stops the chain when the
count is not 0: the runner returns ``count << 20 | (step + 1)`` (the count saturated at 2^43 - 1),
and 0 when every step ran.
"""

from __future__ import annotations

import torch

from .kernel import Kernel, Param

__all__ = ["MAX_ARGS", "MAX_STEPS", "runner_kernel", "split_result"]

#: the most arguments a chained kernel may take (kernels with more are launched on their own)
MAX_ARGS = 32
#: the most steps in one chain (the step number shares the result with the count)
MAX_STEPS = (1 << 20) - 1
_COUNT_MAX = (1 << 43) - 1


def _calls(returns: bool) -> str:
    out = []
    for n in range(1, MAX_ARGS + 1):
        args = ", ".join(f"a[{i}]" for i in range(n))
        ptype = ", ".join(["void *"] * n)
        call = f"(({'long long' if returns else 'void'} (*)({ptype}))f)({args})"
        out.append(f"      case {n}: {'bad = ' if returns else ''}{call}; break;\n")
    return "".join(out)


_BODY = f"""\
  const long long steps = code[0];
  long long pc = 1;
  void *a[{MAX_ARGS}];
  for (long long s = 0; s < steps; ++s) {{
    void *f = reinterpret_cast<void *>(code[pc]);
    const long long n = code[pc + 1], counts = code[pc + 2];
    pc += 3;
    for (long long i = 0; i < n; ++i, pc += 2)
      a[i] = reinterpret_cast<char *>(slots[code[pc]]) + code[pc + 1];
    long long bad = 0;
    if (counts) {{
      switch (n) {{
{_calls(True)}      default: return -1;
      }}
    }} else {{
      switch (n) {{
{_calls(False)}      default: return -1;
      }}
    }}
    if (bad != 0) return ((bad < {_COUNT_MAX}LL ? bad : {_COUNT_MAX}LL) << 20) | (s + 1);
  }}
  return 0;
"""


def runner_kernel() -> Kernel:
    """The runner as a kernel (CPU only; its source never changes, so it is built once per cache)."""
    params = (Param("code", "code", torch.int64, (0,), (1,), False),
              Param("slots", "slots", torch.int64, (0,), (1,), False))
    return Kernel("fuseg_chain_runner", params, _BODY, block=1, grid=1, kind="chain", returns="long long")


def split_result(result: int) -> tuple[int, int]:
    """The runner's non-zero result as (the step that stopped the chain, its count)."""
    if result < 0:  # an argument count the runner has no case for: the planner's bug
        raise RuntimeError("internal: the chain runner met a kernel with more arguments than it takes")
    return (result & ((1 << 20) - 1)) - 1, result >> 20

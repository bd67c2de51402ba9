"""The chain runner: one native function that calls a list of built kernels in order (Note [one
native call for a chain of kernels] in runtime/compiled/chains.py).

It is a kernel like any other (built and cached with a program's kernels), with two int64
parameters: ``code``, the chain's steps, and ``slots``, the base addresses of the call. ``code``
is ``[steps, then per step: kernel address, argument count, flags, then per argument: slot,
bytes]``; an argument is ``slots[slot] + bytes``. A step's flags: ``COUNTS`` (it returns a
count), and on the first step of a group (Note [kernels side by side] in runtime/compiled/chains.py) the
group's size shifted by ``GROUP_SHIFT``: the group's steps are called at once, shared among
torch's threads, each step on one thread (its own parallel loops run by a team of one). The program makes ``code``
when it is compiled, from kernels it built and offsets it planned; only ``slots`` changes from
call to call (the data pointers of that call's tensors).

Every kernel takes only pointers, so a call through a pointer to a function of as many ``void *``
parameters is the call ctypes makes (``argtypes = [c_void_p] * n``). A kernel that returns a
count (an embedding's indices out of range: Note [embedding kernels]) stops the chain when the
count is not 0: the runner returns ``count << 20 | (step + 1)`` (the count saturated at 2^43 - 1),
and 0 when every step ran.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .kernel import Kernel, Param

__all__ = ["COUNTS", "GROUP_MAX", "GROUP_SHIFT", "MAX_ARGS", "MAX_STEPS", "runner_kernel", "split_result"]

#: the most arguments a chained kernel may take (kernels with more are launched on their own)
MAX_ARGS = 32
#: the most steps in one chain (the step number shares the result with the count)
MAX_STEPS = (1 << 20) - 1
_COUNT_MAX = (1 << 43) - 1


#: a step's flags: it returns a count; the steps of a group (its first step's flags >> GROUP_SHIFT)
COUNTS, GROUP_SHIFT = 1, 8
#: the most steps in a group (Note [kernels side by side] in runtime/compiled/chains.py)
GROUP_MAX = 8


def _calls(returns: bool, f: str = "f", a: str = "a") -> str:
    out = []
    for n in range(1, MAX_ARGS + 1):
        args = ", ".join(f"{a}[{i}]" for i in range(n))
        ptype = ", ".join(["void *"] * n)
        call = f"(({'long long' if returns else 'void'} (*)({ptype})){f})({args})"
        out.append(f"      case {n}: {'bad = ' if returns else ''}{call}; break;\n")
    return "".join(out)


# a kernel that returns nothing, called by its argument count (1: a count the runner has no case for)
_CALL = ("static inline int fuseg_chain_call(void *f, long long n, void **a) {\n  switch (n) {\n"
         + _calls(False) + "      default: return 1;\n  }\n  return 0;\n}\n")

_BODY = f"""\
  const long long steps = code[0];
  long long pc = 1;
  void *a[{GROUP_MAX}][{MAX_ARGS}];
  void *f[{GROUP_MAX}];
  long long n[{GROUP_MAX}];
  for (long long s = 0; s < steps; ++s) {{
    const long long flags = code[pc + 2];
    const long long g = flags >> {GROUP_SHIFT} > 1 ? flags >> {GROUP_SHIFT} : 1;
    if (g > {GROUP_MAX} || s + g > steps) return -1;
    for (long long j = 0; j < g; ++j) {{
      f[j] = reinterpret_cast<void *>(code[pc]);
      n[j] = code[pc + 1];
      pc += 3;
      if (n[j] > {MAX_ARGS}) return -1;
      for (long long i = 0; i < n[j]; ++i, pc += 2)
        a[j][i] = reinterpret_cast<char *>(slots[code[pc]]) + code[pc + 1];
    }}
    if (g > 1) {{  // a group: its steps at once, each on one thread (Note [kernels side by side])
      s += g - 1;
      const int threads = omp_get_max_threads();
      int unknown = 0;
      #pragma omp parallel for schedule(dynamic, 1) num_threads(g < threads ? g : threads) reduction(|: unknown) if (threads > 1)
      for (long long j = 0; j < g; ++j) {{
        omp_set_num_threads(1);  // (this thread's task only: a loop of the kernel's own takes no team)
        unknown |= fuseg_chain_call(f[j], n[j], a[j]);
      }}
      if (unknown) return -1;
      continue;
    }}
    long long bad = 0;
    if (flags & {COUNTS}) {{
      switch (n[0]) {{
{_calls(True, "f[0]", "a[0]")}      default: return -1;
      }}
    }} else if (fuseg_chain_call(f[0], n[0], a[0])) {{
      return -1;
    }}
    if (bad != 0) return ((bad < {_COUNT_MAX}LL ? bad : {_COUNT_MAX}LL) << 20) | (s + 1);
  }}
  return 0;
"""


@dataclass(frozen=True)
class _Runner(Kernel):
    """The runner, after what it calls: OpenMP's thread count, read and set (declared here: the
    prelude includes nothing), and the call of a kernel that returns nothing, by its argument
    count."""

    def function(self, target: str) -> str:
        return ('extern "C" int omp_get_max_threads(void);\nextern "C" void omp_set_num_threads(int);\n' + _CALL
                + super().function(target))


def runner_kernel() -> Kernel:
    """The runner as a kernel (CPU only; its source never changes, so it is built once per cache)."""
    params = (Param("code", "code", torch.int64, (0,), (1,), False),
              Param("slots", "slots", torch.int64, (0,), (1,), False))
    return _Runner("fuseg_chain_runner", params, _BODY, block=1, grid=1, kind="chain", returns="long long")


def split_result(result: int) -> tuple[int, int]:
    """The runner's non-zero result as (the step that stopped the chain, its count)."""
    if result < 0:  # an argument count or a group the runner has no case for: the planner's bug
        raise RuntimeError("internal: the chain runner met a kernel with more arguments than it takes, "
                           "or a group of more steps")
    return (result & ((1 << 20) - 1)) - 1, result >> 20

"""Note [huge pages for big buffers] (runtime/storage/pages.py): buffers of at least HUGE_MIN bytes that
the fast variant allocates (a generated kernel's outputs, a single-output ATen op's through its
``.out`` overload) are advised MADV_HUGEPAGE; everything observable stays eager's."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import runtime
from alias import apply_aliases
from runtime import options
from runtime.storage import pages
from segmenter import capture, segment

from .util import assert_matches_eager

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N = 1024  # [1024, 1024] floats: 4 MiB, HUGE_MIN exactly


def _vm_flags(address: int) -> set[str]:
    """The VmFlags of the mapping of this process that holds ``address``."""
    current = None
    with open("/proc/self/smaps", encoding="ascii") as f:
        for line in f:
            head = line.split(maxsplit=1)[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                current = lo <= address < hi
            elif head == "VmFlags:" and current:
                return set(line.split()[1:])
    return set()


def _softmax(x):
    return torch.softmax(x, -1)


def _mm(x, w):
    return x @ w


def _pointwise(x):
    return (x * 2).exp() + 1, x.t() * 3  # the second: a transposed (dense, permuted) output


def _rows(x):
    return torch.nn.functional.layer_norm(x, x.shape[-1:]) * 2


def _small(x):
    return torch.softmax(x[:8], -1) * 2


CASES = {
    "lone softmax (ATen, out=)": (_softmax, lambda: [torch.randn(N, N)], True),
    "mm (ATen, out=)": (_mm, lambda: [torch.randn(N, 64), torch.randn(64, N)], True),
    "pointwise kernel": (_pointwise, lambda: [torch.randn(N, N)], True),
    "row kernel": (_rows, lambda: [torch.randn(N, N)], True),
    "small outputs": (_small, lambda: [torch.randn(N, N)], False),
}


def _advises(program) -> bool:
    return any(v is pages.empty_huge for v in program._fast.__globals__.values())


@pytest.mark.parametrize("backend", ["torch", "cpp"])
@pytest.mark.parametrize("name", list(CASES))
def test_big_buffers_match_eager(name: str, backend: str) -> None:
    fn, make, big = CASES[name]
    inputs = make()
    plan = apply_aliases(segment(capture(fn, inputs)), "post")
    program = runtime.compile(plan, backend=backend)
    with torch.no_grad():
        assert_matches_eager(fn, inputs, plan.graph, program=program)  # the fast variant
    assert_matches_eager(fn, inputs, plan.graph, program=program)
    assert _advises(program) == (big and pages.enabled())


@pytest.mark.skipif(not pages.enabled(), reason="transparent huge pages are not offered on request here")
@pytest.mark.parametrize("name", ["lone softmax (ATen, out=)", "pointwise kernel"])
def test_big_outputs_are_advised(name: str) -> None:
    fn, make, _ = CASES[name]
    inputs = make()
    program = runtime.compile(apply_aliases(segment(capture(fn, inputs)), "post"), backend="cpp")
    with torch.no_grad():
        outs = program(*inputs)
    for out in outs:
        if out.untyped_storage().nbytes() >= pages.HUGE_MIN:
            start = out.untyped_storage().data_ptr()
            inner = (start + (2 << 20) - 1) // (2 << 20) * (2 << 20)  # the advised 2 MiB-aligned interior
            assert "hg" in _vm_flags(inner)
    # an ordinary torch tensor: resizable, and freed by torch's own deleter
    outs[0].resize_(3)
    assert outs[0].shape == (3,)


def test_the_safe_variant_never_advises() -> None:
    """Where autograd may record (an input requires grad) or a dispatch mode runs, the program's
    buffers are torch.empty_strided's."""
    x = torch.randn(N, N, requires_grad=True)
    plan = apply_aliases(segment(capture(_pointwise, [x.detach()])), "post")
    program = runtime.compile(plan, backend="cpp")
    outs = program(x)
    for got, want in zip(outs, _pointwise(x.detach())):
        torch.testing.assert_close(got.detach(), want)
    assert _advises(program) == pages.enabled()
    assert not any(v is pages.empty_huge for v in program._safe.__globals__.values())


def test_turned_off_by_the_environment() -> None:
    env = dict(os.environ, FUSEG_HUGE_PAGES="0", PYTHONPATH=_ROOT)
    out = subprocess.run([sys.executable, "-c", "import runtime.storage.pages as p; print(p.enabled())"],
                         env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_turned_off_by_the_option() -> None:
    """The ``huge_pages`` runtime option (Note [options in one place]): a program compiled with it
    off advises nothing, where one compiled beside it would."""
    fn, make, big = CASES["pointwise kernel"]
    inputs = make()
    plan = apply_aliases(segment(capture(fn, inputs)), "post")
    with options.use(huge_pages=False):
        assert not pages.enabled()
        off = runtime.compile(plan, backend="cpp")
    assert not _advises(off)
    assert _advises(runtime.compile(plan, backend="cpp")) == (big and pages.OFFERED)


def test_the_mode_is_read_from_the_kernel() -> None:
    mode = pages.thp_mode()
    assert mode in (None, "always", "madvise", "never")
    assert pages.OFFERED == (mode == "madvise" and sys.platform.startswith("linux"))
    assert pages.enabled() == (pages.OFFERED and options.current().huge_pages)


def test_random_ops_keep_their_own_allocation() -> None:
    """A random op's out overload need not draw the same numbers: never called with out=."""
    def fn(p):
        return torch.bernoulli(p)

    p = torch.rand(N, N)
    plan = apply_aliases(segment(capture(fn, [p])), "post")
    program = runtime.compile(plan, backend="torch")
    with torch.no_grad():
        (out,) = program(p)
    assert out.shape == p.shape and set(out.unique().tolist()) <= {0.0, 1.0}
    assert not _advises(program)


def test_generated_out_overloads_are_not_used() -> None:
    """An out overload tagged ``generated`` computes into a temporary and copies (a pass more over
    a big buffer): the op keeps its own allocation."""
    def fn(x):
        return torch.nn.functional.embedding(torch.arange(N), x)  # one generated out= (embedding.out)

    x = torch.randn(N, N)
    plan = apply_aliases(segment(capture(fn, [x])), "post")
    program = runtime.compile(plan, backend="torch")
    with torch.no_grad():
        assert_matches_eager(fn, [x], plan.graph, program=program)
    assert torch.Tag.generated in torch.ops.aten.embedding.out.tags
    assert not _advises(program)

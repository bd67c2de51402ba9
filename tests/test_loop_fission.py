"""Note [one loop per branch range] (runtime/codegen/lowering/fission.py): on the CPU, a pointwise kernel's
innermost loop whose branches test only its own counter against constants (the pieces of a
``cat`` along the last dim, ``pad``) is split into one loop per range where every such test has
one value, the tests written as constants; and Note [no contraction]: kernels round as eager."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import runtime
from alias import apply_aliases
from runtime.codegen.build import cpu_compiler
from runtime.codegen.lowering.fission import fission, split_points
from segmenter import capture, segment

from .util import assert_matches_eager

needs_compiler = pytest.mark.skipif(cpu_compiler() is None, reason="no C++ compiler")


def _program(fn, inputs):
    return runtime.compile(apply_aliases(segment(capture(fn, inputs)), "post"), backend="cpp")


def _cpu_source(prog) -> str:
    (launch,) = [la for la in prog._chosen.values() if getattr(la, "kernel", None) is not None]
    return launch.kernel.source("cpu").split("#else")[-1]


def _rotate(x):
    return torch.cat([-x[..., 4:8], x[..., :4]], -1)


def _rope(x, cos, sin):
    """LitGPT's partial rotary: the first 8 of 32 rotated, the rest passed through."""
    r = x[..., :8]
    return torch.cat([r * cos + _rotate(r) * sin, x[..., 8:]], -1)


def _pad_last(x):
    return F.pad(x * 2, (3, 5), value=-1.0)


def _pad_hoisted(x, m):
    """exp(m[c]) is computed once per channel (Note [hoisted per-loop values]): the nest with
    values at an outer loop is the other shape the split has to keep."""
    return F.pad(x, (2, 6), value=0.5) * m.view(1, -1, 1).exp()


def _cat_middle(x, y):
    return torch.cat([x.abs(), y * 3], 1)  # a cat along dim 1 of 3: an outer loop's counter


def _cat_1d(x, y):
    return torch.cat([x * 2, y + 1])  # a kernel of one loop keeps it whole (OpenMP may share it)


def _cat_scaled(x, s):
    """exp(s) of a 0-dim s is computed before every loop and nothing at the outer loop: the
    outer loop still has to enclose every loop of the split (a torch.compile fuzzer finding, where
    it enclosed only the first and the rest named a counter out of scope)."""
    return torch.cat([x * 2, x + 1], -1) * s.exp()


# (program, inputs, innermost loops on the CPU, the counter a remaining branch tests, if any)
CASES = {
    "rope": (_rope, lambda: [torch.randn(2, 16, 64, 32), torch.randn(64, 8), torch.randn(64, 8)], 3, None),
    "pad": (_pad_last, lambda: [torch.randn(8, 16, 24)], 3, None),
    "pad-hoisted": (_pad_hoisted, lambda: [torch.randn(2, 6, 24), torch.randn(6)], 3, None),
    "cat-middle": (_cat_middle, lambda: [torch.randn(4, 5, 16), torch.randn(4, 7, 16)], 1, "i_1"),
    "cat-1d": (_cat_1d, lambda: [torch.randn(1000), torch.randn(3000)], 1, "i_0"),
    "cat-scaled": (_cat_scaled, lambda: [torch.randn(6, 16), torch.tensor(0.3)], 2, None),
}


@needs_compiler
@pytest.mark.parametrize("case", sorted(CASES))
def test_innermost_branch_ranges_become_loops(case: str) -> None:
    fn, make, loops, tested = CASES[case]
    inputs = make()
    prog = _program(fn, inputs)
    cpu = _cpu_source(prog)
    inner = "i_" + str(max(int(v) for v in re.findall(r"for \(FUSEG_I i_(\d+)", cpu)))
    assert len(re.findall(rf"for \(FUSEG_I {inner} = ", cpu)) == loops, cpu
    branches = re.findall(r"if \((.*)\) \{", cpu)
    assert all(re.search(rf"\b{inner}\b", t) is None for t in branches if tested != inner), cpu
    if tested is not None:
        assert any(re.search(rf"\b{tested}\b", t) for t in branches), cpu
    exact = 0 if case not in ("pad-hoisted", "cat-scaled") else 1e-6  # fuseg_exp is within 1 ulp of libm's
    assert_matches_eager(fn, inputs, prog.graph, program=prog, atol=exact, rtol=exact)
    if case == "pad-hoisted":
        channel = cpu.index("for (FUSEG_I i_1")
        assert "fuseg_exp(" in cpu[channel:cpu.index(f"for (FUSEG_I {inner}")], cpu


@needs_compiler
def test_rope_is_bit_exact_against_eager() -> None:
    """Note [no contraction]: x*cos + r*sin rounds each product, as eager's separate ops do (with
    contraction the vectorized loops made FMAs: 1-ulp differences)."""
    x, cos, sin = torch.randn(2, 16, 64, 32), torch.randn(64, 8), torch.randn(64, 8)
    (got,) = _program(_rope, [x, cos, sin])(x, cos, sin)
    assert torch.equal(got, _rope(x, cos, sin))


def test_split_points_evaluate_each_test_on_the_counter() -> None:
    assert split_points(["i_3 < 8", "i_3 < 4", "(4 + i_3) < 8"], "i_3", 32) == [0, 4, 8, 32]
    assert split_points(["(i_3 - 3) >= 0 && (i_3 - 3) < 24"], "i_3", 32) == [0, 3, 27, 32]
    assert split_points(["i_3 < 40"], "i_3", 32) == [0, 32]  # always true: one range
    # tests on another counter, division, modulo or unknown names are not the counter's alone
    assert split_points(["i_2 < 8", "(i_3 / 2) < 4", "(i_3 % 4) == 0", "n < i_3"], "i_3", 32) is None


def test_fission_writes_constants_and_leaves_other_tests() -> None:
    header = "  for (FUSEG_I i_1 = 0; i_1 < 12; ++i_1)"
    body = ["    float c1;",
            "    if (i_1 < 4) {",
            "      c1 = in0[i_0 * 4 + i_1];",
            "    }",
            "    else if ((i_1 % 3) == 0) {",
            "      c1 = 0.0f;",
            "    }",
            "    else {",
            "      c1 = in1[i_0 * 8 + (i_1 - 4)];",
            "    }",
            "    out0[i_0 * 12 + i_1] = c1;"]
    got = fission(header, body, "i_1", 12, "  ")
    assert got is not None
    text = "\n".join(got)
    assert "for (FUSEG_I i_1 = 0; i_1 < 4; ++i_1)" in text and "for (FUSEG_I i_1 = 4; i_1 < 12; ++i_1)" in text
    assert text.count("if (1) {") == 1 and text.count("if (0) {") == 1
    assert text.count("else if ((i_1 % 3) == 0) {") == 2
    assert fission(header, [ln for ln in body if "i_1 < 4" not in ln], "i_1", 12, "  ") is None


def test_too_many_ranges_keep_one_loop() -> None:
    header = "  for (FUSEG_I i_1 = 0; i_1 < 64; ++i_1)"
    body = [line for k in range(2, 64, 2) for line in (f"    if (i_1 < {k}) {{", "      x += 1;", "    }")]
    assert fission(header, body, "i_1", 64, "  ") is None

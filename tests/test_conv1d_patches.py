"""1-D convolutions of more than one tap as generated kernels: patches of the input copied into a
stack buffer, then the matmul templates (runtime/codegen/opaque/patches.py, Note [1-D convolutions as
patches]). A table of the ones the cpp backend takes (wav2vec 2.0's feature extractor and grouped
positional embedding, Whisper's stem, strides, paddings wider than the filter, dilation, groups,
transposed inputs, rows longer than one block of patches), each against eager (values, strides,
aliasing), the ones it declines with the reason, and random ones against eager."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from runtime.codegen import Declined
from runtime.codegen.opaque import patches
from segmenter import capture

from .util import assert_matches_eager, compiled_post, convolution_segment


def _conv(**kw):
    def fn(x, w, *b):
        return F.conv1d(x, w, *b, **kw)
    return fn


# (name, program, inputs)
TAKEN = [
    ("wav2vec2-stem", _conv(stride=5), [torch.randn(2, 1, 4000), torch.randn(32, 1, 10)]),
    ("wav2vec2-second", _conv(stride=2), [torch.randn(2, 32, 799), torch.randn(32, 32, 3)]),
    ("wav2vec2-positional", _conv(padding=8, groups=4),
     [torch.randn(2, 199, 64).transpose(1, 2), torch.randn(64, 16, 16), torch.randn(64)]),
    ("whisper-stem", _conv(padding=1), [torch.randn(2, 16, 32), torch.randn(64, 16, 3), torch.randn(64)]),
    ("whisper-strided", _conv(stride=2, padding=1), [torch.randn(2, 64, 32), torch.randn(64, 64, 3), torch.randn(64)]),
    ("pad-wider-than-filter", _conv(padding=4), [torch.randn(1, 3, 5), torch.randn(4, 3, 3)]),
    ("dilated", _conv(dilation=3, padding=2), [torch.randn(2, 5, 40), torch.randn(6, 5, 4), torch.randn(6)]),
    ("few-positions", _conv(), [torch.randn(2, 8, 6), torch.randn(5, 8, 3)]),
    ("one-position", _conv(), [torch.randn(2, 8, 3), torch.randn(5, 8, 3)]),
    ("grouped-strided-odd", _conv(stride=3, padding=2, groups=3),
     [torch.randn(3, 9, 50), torch.randn(12, 3, 5), torch.randn(12)]),
    ("weight-tap-major", lambda x, w: F.conv1d(x, w.transpose(1, 2).contiguous().transpose(1, 2), padding=1),
     [torch.randn(2, 4, 30), torch.randn(6, 4, 3)]),
    ("sliced-input", lambda x, w: F.conv1d(x[:, ::2], w), [torch.randn(2, 8, 40), torch.randn(5, 4, 3)]),
]


@pytest.mark.parametrize("name,fn,inputs", TAKEN, ids=[t[0] for t in TAKEN])
def test_1d_convolutions_run_as_patch_kernels(name, fn, inputs) -> None:
    prog = compiled_post(fn, inputs)
    i = convolution_segment(prog)
    assert prog.backend_of[i] == "cpp", prog.passed_over.get(i)
    assert prog.kernels[i].name.startswith("fuseg_patches_")
    assert_matches_eager(fn, inputs, prog.graph, program=prog, atol=1e-4, rtol=1e-5)


def test_rows_longer_than_a_block_are_cut_into_blocks(monkeypatch) -> None:
    monkeypatch.setattr(patches, "BLOCK_FLOATS", 64)  # 32 taps x 2 positions a block: many blocks and a tail
    fn, inputs = _conv(padding=1), [torch.randn(2, 16, 33), torch.randn(8, 16, 2)]
    prog = compiled_post(fn, inputs)
    i = convolution_segment(prog)
    assert prog.backend_of[i] == "cpp", prog.passed_over.get(i)
    assert_matches_eager(fn, inputs, prog.graph, program=prog, atol=1e-4, rtol=1e-5)


# (name, program, inputs, why)
DECLINED = [
    ("2d", lambda x, w: F.conv2d(x, w, padding=1), [torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)], "1-D"),
    ("double", _conv(), [torch.randn(2, 3, 9).double(), torch.randn(4, 3, 3).double()], "float32"),
    # neither channels nor taps one run: a window of a longer filter
    ("weight-window", lambda x, w: F.conv1d(x, w[:, :, :3]), [torch.randn(2, 3, 9), torch.randn(4, 3, 5)], "weight"),
    ("huge-filter", _conv(), [torch.randn(1, 64, 400), torch.randn(2, 64, 300)], "patch"),
]


@pytest.mark.parametrize("length", [199, 64])
def test_few_filters_a_group_are_a_kernel_measured_against_aten(length) -> None:
    """Few filters a group make the copy dear; no constant declines them: the kernel runs (the
    tests take every kernel) and matches eager, and ATen runs them where this machine's
    measurement says so (Note [choices by measurement]; fixed here, no timing in a test)."""
    from runtime.autotune import fixed

    fn, inputs = _conv(padding=8, groups=16), [torch.randn(2, length, 128).transpose(1, 2), torch.randn(128, 8, 16)]
    prog = compiled_post(fn, inputs)
    i = convolution_segment(prog)
    assert prog.backend_of[i] == "cpp" and prog.kernels[i].name.startswith("fuseg_patches_")
    assert_matches_eager(fn, inputs, prog.graph, program=prog, atol=1e-4, rtol=1e-5)
    with fixed("aten"):
        prog = compiled_post(fn, inputs)
    assert "ATen's op chosen" in dict(prog.passed_over[convolution_segment(prog)])["cpp"]
    assert_matches_eager(fn, inputs, prog.graph, program=prog, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("name,fn,inputs,why", DECLINED, ids=[d[0] for d in DECLINED])
def test_convolutions_the_patch_kernel_declines_run_elsewhere_with_the_reason(name, fn, inputs, why) -> None:
    prog = compiled_post(fn, inputs)
    i = convolution_segment(prog)
    assert prog.kernels.get(i) is None or not prog.kernels[i].name.startswith("fuseg_patches_")
    assert why in dict(prog.passed_over[i])["cpp"]
    tol = 1e-12 if name == "double" else 1e-4
    assert_matches_eager(fn, inputs, prog.graph, program=prog, atol=tol, rtol=1e-5)


def test_a_convolution_is_left_to_aten_where_that_is_this_machines_choice() -> None:
    """No size cap: the kernel and ATen's convolution are measured (Note [choices by measurement]
    in runtime/autotune.py; fixed here, no timing in a test)."""
    from runtime.autotune import fixed

    _, fn, inputs = TAKEN[3]
    with fixed("aten"):
        prog = compiled_post(fn, inputs)
    assert "ATen's op chosen" in dict(prog.passed_over[convolution_segment(prog)])["cpp"]
    assert_matches_eager(fn, inputs, prog.graph, program=prog, atol=1e-4, rtol=1e-5)


def test_a_recorded_output_that_contradicts_the_op_is_declined() -> None:
    _, fn, inputs = TAKEN[3]
    graph = capture(fn, inputs)
    node = next(n for n in graph.nodes if n.op == "aten.convolution.default")
    lying = dataclasses.replace(node.metas[0], shape=(2, 64, 40), stride=(2560, 40, 1))
    with pytest.raises(Declined, match="torch computes"):
        patches.patches_kernel(graph, dataclasses.replace(node, metas=(lying,)))
    assert patches.patches_kernel(graph, node).name.startswith("fuseg_patches_")


def test_random_1d_convolutions_match_eager() -> None:
    rng = random.Random(99)
    torch.manual_seed(99)
    seen: Counter = Counter()
    for k in range(30):
        groups = rng.choice((1, 1, 2, 3))
        cg, fg, taps = rng.randint(1, 12), rng.randint(1, 9), rng.randint(2, 9)
        stride, padding, dilation = rng.randint(1, 4), rng.randint(0, 6), rng.randint(1, 3)
        length = rng.randint((taps - 1) * dilation + 1, 120)
        x = torch.randn(rng.randint(1, 3), cg * groups, length)
        if rng.random() < 0.3:
            x = x.transpose(1, 2).contiguous().transpose(1, 2)
        inputs = [x, torch.randn(fg * groups, cg, taps)] + ([torch.randn(fg * groups)] if rng.random() < 0.5 else [])
        fn = _conv(stride=stride, padding=padding, dilation=dilation, groups=groups)
        prog = compiled_post(fn, inputs)
        what = f"x {list(x.shape)} / {list(x.stride())} w {list(inputs[1].shape)} s{stride} p{padding} d{dilation} g{groups}"
        try:
            assert_matches_eager(fn, inputs, prog.graph, program=prog, atol=1e-4, rtol=1e-5)
        except AssertionError as e:
            raise AssertionError(f"program {k}: {what}") from e
        i = convolution_segment(prog)
        seen["patches" if prog.kernels.get(i) and prog.kernels[i].name.startswith("fuseg_patches_") else "other"] += 1
    assert seen["patches"] >= 20, dict(seen)

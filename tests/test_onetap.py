"""Convolutions whose filters have one tap (kernel size 1 in every spatial dim, stride 1, no
padding) as generated matmuls (runtime/codegen/opaque/onetap.py, Note [one-tap convolutions]): a table of
the ones the cpp backend takes, 1-D and 2-D, grouped or not, each against eager (values, strides,
aliasing), and of the ones it declines, each with its reason; then random ones (shapes, groups,
layouts, bias, dilation, strides and paddings the kernel declines) against eager.
``FUSEG_ONETAP_PROGRAMS`` sets how many (default 40, what CI runs; the same ones every run unless
``FUSEG_FUZZ_RANDOM=1``, which draws a new seed and prints it)."""

from __future__ import annotations

import os
import random
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from runtime.codegen.opaque import onetap
from segmenter import capture

from .util import assert_matches_eager, compiled_post, convolution_segment


def _nhwc(*shape):
    return torch.randn(*shape).contiguous(memory_format=torch.channels_last)


# (name, program, inputs): 1-D and 2-D, groups 1 and more, bias or none, an input read through a
# transpose (SqueezeBERT's [batch, seq, channels] seen as [batch, channels, seq]), channels-last
# in and out, odd sizes (tails of the 4 x 64 tiles), one position or a few, a weight in another layout,
# dilation (nothing to dilate with one tap), and one big enough to be shared among threads
TAKEN = [
    ("1d", lambda x, w, b: F.conv1d(x, w, b), [torch.randn(2, 16, 32), torch.randn(24, 16, 1), torch.randn(24)]),
    ("1d-grouped-transposed", lambda x, w, b: F.conv1d(x.transpose(1, 2), w, b, groups=2),
     [torch.randn(2, 32, 64), torch.randn(128, 32, 1), torch.randn(128)]),
    ("1d-grouped-contiguous", lambda x, w, b: F.conv1d(x, w, b, groups=2),
     [torch.randn(2, 128, 32), torch.randn(64, 64, 1), torch.randn(64)]),
    ("1d-four-groups-no-bias", lambda x, w: F.conv1d(x, w, groups=4), [torch.randn(3, 12, 7), torch.randn(20, 3, 1)]),
    ("1d-odd", lambda x, w, b: F.conv1d(x, w, b), [torch.randn(1, 5, 67), torch.randn(7, 5, 1), torch.randn(7)]),
    ("1d-one-position", lambda x, w, b: F.conv1d(x, w, b), [torch.randn(2, 8, 1), torch.randn(6, 8, 1), torch.randn(6)]),
    ("1d-dilated", lambda x, w: F.conv1d(x, w, dilation=3), [torch.randn(2, 4, 9), torch.randn(5, 4, 1)]),
    ("2d", lambda x, w, b: F.conv2d(x, w, b), [torch.randn(2, 16, 8, 8), torch.randn(32, 16, 1, 1), torch.randn(32)]),
    ("2d-nhwc", lambda x, w, b: F.conv2d(x, w, b), [_nhwc(2, 16, 5, 7), torch.randn(24, 16, 1, 1), torch.randn(24)]),
    ("2d-nhwc-grouped", lambda x, w: F.conv2d(x, w, groups=4), [_nhwc(2, 16, 4, 4), torch.randn(8, 4, 1, 1)]),
    ("2d-one-pixel", lambda x, w, b: F.conv2d(x, w, b), [torch.randn(2, 48, 1, 1), torch.randn(40, 48, 1, 1),
                                                        torch.randn(40)]),
    ("2d-weight-from-matrix", lambda x, m: F.conv2d(x, m.t()[:, :, None, None]),
     [torch.randn(2, 6, 3, 5), torch.randn(6, 9)]),
    ("2d-nhwc-weight-from-matrix", lambda x, m: F.conv2d(x, m.t()[:, :, None, None]),
     [_nhwc(2, 6, 3, 5), torch.randn(6, 9)]),
    # fewer positions than a vector: copied contiguous along channels first
    ("2d-few-positions", lambda x, w, b: F.conv2d(x, w, b), [torch.randn(2, 64, 2, 2), torch.randn(32, 64, 1, 1),
                                                            torch.randn(32)]),
    ("1d-few-positions-grouped", lambda x, w: F.conv1d(x, w, groups=2), [torch.randn(2, 34, 5), torch.randn(6, 17, 1)]),
    ("2d-then-relu", lambda x, w: torch.relu(F.conv2d(x, w)), [torch.randn(2, 8, 4, 4), torch.randn(8, 8, 1, 1)]),
    ("threaded", lambda x, w, b: F.conv1d(x, w, b, groups=2),  # (2 x 256 x 128 x 160 multiply-adds: past the
     [torch.randn(2, 256, 160), torch.randn(256, 128, 1), torch.randn(256)]),  # tests' matmul threshold, 2^22)
]


@pytest.mark.parametrize("name,fn,inputs", TAKEN, ids=[t[0] for t in TAKEN])
def test_one_tap_convolutions_run_as_generated_kernels(name, fn, inputs) -> None:
    prog = compiled_post(fn, inputs)
    i = convolution_segment(prog)
    assert prog.backend_of[i] == "cpp", prog.passed_over.get(i)
    assert prog.kernels[i].name.startswith("fuseg_onetap_")
    assert_matches_eager(fn, inputs, prog.graph, program=prog, atol=1e-4, rtol=1e-5)


def test_the_threaded_variant_is_threaded_and_the_small_one_is_not() -> None:
    from runtime.codegen.thresholds import current

    assert 2 * 256 * 128 * 160 >= current().macs > 2 * 24 * 16 * 32  # (the "1d" case's work)
    progs = {name: compiled_post(fn, inputs) for name, fn, inputs in TAKEN if name in ("threaded", "1d")}
    bodies = {name: p.kernels[convolution_segment(p)].body for name, p in progs.items()}
    assert "omp parallel" in bodies["threaded"] and "omp parallel" not in bodies["1d"]


def test_few_positions_are_copied_contiguous_along_channels_first() -> None:
    progs = {name: compiled_post(fn, inputs) for name, fn, inputs in TAKEN
             if name in ("2d-few-positions", "1d-few-positions-grouped", "2d", "1d-grouped-transposed")}
    copied = {name for name, p in progs.items() if "xt[" in p.kernels[convolution_segment(p)].body}
    assert copied == {"2d-few-positions", "1d-few-positions-grouped"}


def test_an_input_in_another_layout_than_compiled_runs_on_torch_not_misread() -> None:
    """A launch run on its own checks its inputs' layouts (as every kernel launch does)."""
    _, fn, inputs = TAKEN[0]
    prog = compiled_post(fn, inputs)
    seg = prog.plan.segments[convolution_segment(prog)]
    launch = prog.launches[seg.index]
    env = dict(zip(prog.graph.input_names, inputs))
    env[seg.inputs[0]] = inputs[0].transpose(1, 2).contiguous().transpose(1, 2)  # planned contiguous
    launch.run(env)
    assert launch.run.stats["layout_fallbacks"] == 1
    torch.testing.assert_close(env[seg.outputs[0]], fn(*inputs), atol=1e-5, rtol=1e-5)


# (name, program, inputs, why): convolutions the one-tap kernel declines, and its reason
DECLINED = [
    ("three-taps", lambda x, w: F.conv1d(x, w), [torch.randn(2, 4, 9), torch.randn(5, 4, 3)], "taps"),
    ("strided", lambda x, w: F.conv2d(x, w, stride=2), [torch.randn(2, 4, 8, 8), torch.randn(5, 4, 1, 1)], "stride"),
    ("padded", lambda x, w: F.conv1d(x, w, padding=1), [torch.randn(2, 4, 9), torch.randn(5, 4, 1)], "padding"),
    ("double", lambda x, w: F.conv1d(x, w), [torch.randn(2, 4, 9).double(), torch.randn(5, 4, 1).double()],
     "float32"),
    # rows of every other image row: the two spatial dims do not make one run of positions
    ("rows-apart", lambda x, w: F.conv2d(x[:, :, ::2], w), [torch.randn(2, 4, 8, 8), torch.randn(5, 4, 1, 1)],
     "positions"),
    # neither positions nor channels one element apart in the input, and positions enough for
    # vectors (fewer are copied contiguous first: "1d-few-positions-grouped")
    ("no-unit-stride", lambda x, w: F.conv1d(x[:, ::2, ::2], w), [torch.randn(2, 8, 40), torch.randn(5, 4, 1)],
     "strides"),
    ("3d", lambda x, w: F.conv3d(x, w), [torch.randn(1, 2, 3, 3, 3), torch.randn(4, 2, 1, 1, 1)], "3-D"),
    ("transposed", lambda x, w: F.conv_transpose1d(x, w), [torch.randn(2, 4, 9), torch.randn(4, 5, 1)], "transposed"),
]


@pytest.mark.parametrize("name,fn,inputs,why", DECLINED, ids=[d[0] for d in DECLINED])
def test_convolutions_the_one_tap_kernel_declines_run_elsewhere_with_the_reason(name, fn, inputs, why) -> None:
    from runtime.codegen import Declined

    graph = capture(fn, inputs)
    node = next(n for n in graph.nodes if n.op == "aten.convolution.default")
    with pytest.raises(Declined, match=why):
        onetap.onetap_kernel(graph, node)
    prog = compiled_post(fn, inputs)  # elsewhere: ATen, or a 1-D one the patch kernel's (Note [1-D convolutions as patches])
    i = convolution_segment(prog)
    assert prog.kernels.get(i) is None or not prog.kernels[i].name.startswith("fuseg_onetap_")
    tol = 1e-12 if name == "double" else 1e-5
    assert_matches_eager(fn, inputs, prog.graph, program=prog, atol=tol, rtol=tol)


def test_a_one_tap_convolution_is_left_to_aten_where_that_is_this_machines_choice() -> None:
    """No size cap: the kernel and ATen's convolution are measured (Note [choices by measurement]
    in runtime/autotune.py; fixed here, no timing in a test)."""
    from runtime.autotune import fixed

    fn = lambda x, w, b: F.conv2d(x, w, b)  # noqa: E731 - 2 x 32 x 64 outputs of 16 multiply-adds
    inputs = [torch.randn(2, 16, 8, 8), torch.randn(32, 16, 1, 1), torch.randn(32)]
    with fixed("aten"):
        prog = compiled_post(fn, inputs)
    i = convolution_segment(prog)
    assert "ATen's op chosen" in dict(prog.passed_over[i])["cpp"]
    assert_matches_eager(fn, inputs, prog.graph, program=prog)


def test_a_recorded_output_that_contradicts_the_op_is_declined() -> None:
    """See Note [checked source values]: the kernel is sized by the metas; an output the op does not
    make (here twice the positions, which would read past each input row) is not believed."""
    import dataclasses

    from runtime.codegen import Declined

    _, fn, inputs = TAKEN[0]
    graph = capture(fn, inputs)
    node = next(n for n in graph.nodes if n.op == "aten.convolution.default")
    lying = dataclasses.replace(node.metas[0], shape=(2, 24, 64), stride=(1536, 64, 1))
    with pytest.raises(Declined, match="torch computes"):
        onetap.onetap_kernel(graph, dataclasses.replace(node, metas=(lying,)))
    assert onetap.onetap_kernel(graph, node).name.startswith("fuseg_onetap_")  # the true one is taken


PROGRAMS = int(os.environ.get("FUSEG_ONETAP_PROGRAMS", "25"))
RANDOM = os.environ.get("FUSEG_FUZZ_RANDOM", "0") == "1"


def _random_conv(rng: random.Random):
    """A random 1-D or 2-D convolution, mostly one-tap, its input in a random layout."""
    spatial = rng.choice((1, 2))
    groups = rng.choice((1, 1, 2, 3, 4))
    per_group, filters_per = rng.randint(1, 40), rng.randint(1, 24)
    n = rng.randint(1, 3)
    positions = [rng.choice((1, 2, 3, 5, 8, 17, 33)) for _ in range(spatial)]
    kernel = [1] * spatial if rng.random() < 0.85 else [rng.choice((1, 2, 3)) for _ in range(spatial)]
    stride = 1 if rng.random() < 0.85 else 2
    padding = 0 if rng.random() < 0.9 else 1
    dilation = rng.choice((1, 1, 2))
    layout = rng.choice(("contiguous", "channels-last", "swapped", "sliced"))
    c = per_group * groups
    if layout == "channels-last":  # by a permute, as SqueezeBERT's [batch, seq, channels]
        x = torch.randn(n, *positions, c).movedim(-1, 1)
    elif layout == "swapped" and spatial == 2:  # positions not one run (unless one extent is 1)
        x = torch.randn(n, c, *positions[::-1]).transpose(2, 3)
    elif layout == "swapped":  # a window of a longer row: a storage offset
        x = torch.randn(n, c, positions[0] + 3)[..., 1:positions[0] + 1]
    elif layout == "sliced":  # every other channel
        x = torch.randn(n, 2 * c, *positions)[:, ::2]
    else:
        x = torch.randn(n, c, *positions)
    positions = [max(p, (k - 1) * dilation + 1) for p, k in zip(positions, kernel)]
    if list(x.shape[2:]) != positions:  # a position count too small for the filter: made bigger
        x = torch.randn(n, c, *positions)
    w = torch.randn(filters_per * groups, per_group, *kernel)
    b = torch.randn(filters_per * groups) if rng.random() < 0.7 else None
    conv = F.conv1d if spatial == 1 else F.conv2d
    what = (f"{conv.__name__} x {list(x.shape)} strides {list(x.stride())} ({layout}) w {list(w.shape)} groups "
            f"{groups} stride {stride} padding {padding} dilation {dilation} bias {b is not None}")

    def fn(x, w, *b):
        return conv(x, w, *b, stride=stride, padding=padding, dilation=dilation, groups=groups)

    return fn, [x, w, *((b,) if b is not None else ())], what


def test_random_convolutions_match_eager() -> None:
    seed = random.randrange(2**32) if RANDOM else 4321
    print(f"FUSEG_ONETAP seed {seed}")
    rng = random.Random(seed)
    torch.manual_seed(seed)
    seen: Counter = Counter()
    for k in range(PROGRAMS):
        fn, inputs, what = _random_conv(rng)
        prog = compiled_post(fn, inputs)
        try:
            assert_matches_eager(fn, inputs, prog.graph, program=prog, atol=1e-4, rtol=1e-5)
        except AssertionError as e:
            raise AssertionError(f"program {k} (seed {seed}): {what}") from e
        i = convolution_segment(prog)
        if prog.backend_of[i] == "cpp" and prog.kernels[i].name.startswith("fuseg_onetap_"):
            seen["one-tap kernel"] += 1
        elif "one tap:" in dict(prog.passed_over.get(i, ())).get("cpp", ""):
            seen["declined"] += 1
    print(f"FUSEG_ONETAP {dict(seen)}")
    assert seen["one-tap kernel"] and seen["declined"], dict(seen)

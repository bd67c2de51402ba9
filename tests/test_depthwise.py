"""Depthwise convolutions as generated C++ kernels (runtime/codegen/opaque/conv.py, Note [depthwise
convolutions]): a table of the ones the cpp backend takes, each against eager (values, strides,
aliasing), and of the ones it declines, each with its reason."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from runtime.codegen.opaque import conv

from .util import assert_matches_eager, compiled_post, convolution_segment


def _nhwc(*shape):
    return torch.randn(*shape).contiguous(memory_format=torch.channels_last)


def _dw(c, kh, kw, dtype=torch.float32):
    return torch.randn(c, 1, kh, kw, dtype=dtype)


# (name, program, inputs): stride, padding (none, some, wider than the filter), dilation, odd
# sizes, a single row or column, bias or none, double, a transposed weight, a 1x1 output
TAKEN = [
    ("3x3-pad1", lambda x, w, b: F.conv2d(x, w, b, padding=1, groups=6), [torch.randn(2, 6, 8, 8), _dw(6, 3, 3), torch.randn(6)]),
    ("3x3-stride2", lambda x, w: F.conv2d(x, w, stride=2, padding=1, groups=5), [torch.randn(2, 5, 9, 7), _dw(5, 3, 3)]),
    ("7x7-pad3", lambda x, w, b: F.conv2d(x, w, b, padding=3, groups=4), [torch.randn(1, 4, 5, 6), _dw(4, 7, 7), torch.randn(4)]),
    ("3x5-nopad", lambda x, w: F.conv2d(x, w, groups=3), [torch.randn(2, 3, 6, 9), _dw(3, 3, 5)]),
    ("dilated", lambda x, w: F.conv2d(x, w, padding=2, dilation=2, groups=3), [torch.randn(2, 3, 7, 7), _dw(3, 3, 3)]),
    ("stride-3-uneven-pad", lambda x, w: F.conv2d(x, w, stride=(3, 2), padding=(2, 1), groups=2),
     [torch.randn(2, 2, 10, 11), _dw(2, 3, 3)]),
    ("pad-past-filter", lambda x, w: F.conv2d(x, w, padding=4, groups=2), [torch.randn(1, 2, 3, 3), _dw(2, 3, 3)]),
    ("one-row", lambda x, w: F.conv2d(x, w, padding=(0, 1), groups=3), [torch.randn(2, 3, 1, 8), _dw(3, 1, 3)]),
    ("one-by-one-out", lambda x, w: F.conv2d(x, w, groups=4), [torch.randn(2, 4, 3, 3), _dw(4, 3, 3)]),
    ("double", lambda x, w, b: F.conv2d(x, w, b, padding=1, groups=3),
     [torch.randn(2, 3, 6, 6, dtype=torch.float64), _dw(3, 3, 3, torch.float64), torch.randn(3, dtype=torch.float64)]),
    ("transposed-weight", lambda x, w: F.conv2d(x, w.transpose(2, 3), padding=1, groups=4),
     [torch.randn(2, 4, 6, 6), _dw(4, 3, 3)]),
    ("channels-last-weight", lambda x, w: F.conv2d(x, w, groups=3),
     [torch.randn(2, 3, 6, 6), _dw(3, 3, 3).contiguous(memory_format=torch.channels_last)]),
    ("then-relu6", lambda x, w: F.hardtanh(F.conv2d(x, w, padding=1, groups=8), 0.0, 6.0),
     [torch.randn(2, 8, 4, 4), _dw(8, 3, 3)]),
    ("threaded", lambda x, w: F.conv2d(x, w, padding=1, groups=64), [torch.randn(2, 64, 16, 16), _dw(64, 3, 3)]),
    # channels-last input and output (ConvNeXt's layers, after its permutes)
    ("nhwc-7x7-pad3", lambda x, w, b: F.conv2d(x, w, b, padding=3, groups=16),
     [_nhwc(2, 16, 8, 8), _dw(16, 7, 7), torch.randn(16)]),
    ("nhwc-stride2-dilated", lambda x, w: F.conv2d(x, w, stride=2, padding=2, dilation=2, groups=5),
     [_nhwc(2, 5, 9, 7), _dw(5, 3, 3)]),
    ("nhwc-from-permute", lambda x, w: F.conv2d(x.permute(0, 3, 1, 2), w, padding=1, groups=6),
     [torch.randn(2, 5, 5, 6), _dw(6, 3, 3)]),
    ("nhwc-threaded", lambda x, w: F.conv2d(x, w, padding=1, groups=64), [_nhwc(2, 64, 16, 16), _dw(64, 3, 3)]),
    ("nhwc-double", lambda x, w: F.conv2d(x, w, padding=1, groups=3),
     [_nhwc(2, 3, 4, 4).double(), _dw(3, 3, 3, torch.float64)]),
]


@pytest.mark.parametrize("name,fn,inputs", TAKEN, ids=[t[0] for t in TAKEN])
def test_depthwise_convolutions_run_as_generated_kernels(name, fn, inputs) -> None:
    prog = compiled_post(fn, inputs)
    i = convolution_segment(prog)
    assert prog.backend_of[i] == "cpp", prog.passed_over.get(i)
    assert prog.kernels[i].name.startswith("fuseg_dwconv_")
    tol = 1e-12 if name.endswith("double") else 1e-5
    assert_matches_eager(fn, inputs, prog.graph, program=prog, atol=tol, rtol=tol)


def test_the_threaded_variant_is_threaded_and_the_small_one_is_not() -> None:
    names = ("threaded", "3x3-pad1", "nhwc-threaded", "nhwc-double")
    progs = {name: compiled_post(fn, inputs) for name, fn, inputs in TAKEN if name in names}
    bodies = {name: p.kernels[convolution_segment(p)].body for name, p in progs.items()}
    assert "omp parallel" in bodies["threaded"] and "omp parallel" not in bodies["3x3-pad1"]
    assert "omp parallel" in bodies["nhwc-threaded"] and "omp parallel" not in bodies["nhwc-double"]


def test_an_input_in_another_layout_than_compiled_runs_on_torch_not_misread() -> None:
    """A launch run on its own checks its inputs' layouts (as every kernel launch does)."""
    fn, inputs = TAKEN[0][1], TAKEN[0][2]
    prog = compiled_post(fn, inputs)
    seg = prog.plan.segments[convolution_segment(prog)]
    launch = prog.launches[seg.index]
    env = dict(zip(prog.graph.input_names, inputs))
    env[seg.inputs[0]] = inputs[0].contiguous(memory_format=torch.channels_last)  # planned NCHW
    launch.run(env)
    assert launch.run.stats["layout_fallbacks"] == 1
    torch.testing.assert_close(env[seg.outputs[0]], fn(*inputs), atol=1e-5, rtol=1e-5)


# (name, program, inputs, why): depthwise-looking convolutions the generator declines
DECLINED = [
    ("multiplier-2", lambda x, w: F.conv2d(x, w, groups=3), [torch.randn(2, 3, 5, 5), torch.randn(6, 1, 3, 3)],
     "not depthwise"),
    ("grouped", lambda x, w: F.conv2d(x, w, groups=2), [torch.randn(2, 4, 5, 5), torch.randn(4, 2, 3, 3)], "not depthwise"),
    ("strided-input", lambda x, w: F.conv2d(x[..., ::2], w, groups=3), [torch.randn(2, 3, 6, 12), _dw(3, 3, 3)],
     "neither contiguous"),
    ("bfloat16", lambda x, w: F.conv2d(x, w, groups=3), [torch.randn(2, 3, 6, 6).bfloat16(), _dw(3, 3, 3).bfloat16()],
     "bfloat16"),
    # (a float32 one is the patch kernel's: Note [1-D convolutions as patches])
    ("conv1d", lambda x, w: F.conv1d(x, w, groups=3), [torch.randn(2, 3, 9).double(), torch.randn(3, 1, 3).double()],
     "1-D"),
    ("transposed", lambda x, w: F.conv_transpose2d(x, w, groups=3), [torch.randn(2, 3, 5, 5), _dw(3, 3, 3)], "transposed"),
]


@pytest.mark.parametrize("name,fn,inputs,why", DECLINED, ids=[d[0] for d in DECLINED])
def test_convolutions_the_generator_declines_run_elsewhere_with_the_reason(name, fn, inputs, why) -> None:
    prog = compiled_post(fn, inputs)
    i = convolution_segment(prog)
    assert prog.backend_of[i] != "cpp"
    assert why in dict(prog.passed_over[i])["cpp"]
    tol = 2e-2 if name == "bfloat16" else 1e-5
    assert_matches_eager(fn, inputs, prog.graph, program=prog, atol=tol, rtol=tol)


def test_a_depthwise_convolution_is_left_to_onednn_where_that_is_this_machines_choice() -> None:
    """No size cap: the kernel and oneDNN's convolution are measured (Note [choices by measurement]
    in runtime/autotune.py; fixed here, no timing in a test)."""
    from runtime.autotune import fixed

    fn, inputs = TAKEN[0][1], TAKEN[0][2]
    with fixed("aten"):
        prog = compiled_post(fn, inputs)
    i = convolution_segment(prog)
    assert "ATen's op chosen" in dict(prog.passed_over[i])["cpp"]
    assert_matches_eager(fn, inputs, prog.graph, program=prog)


def test_a_channels_last_filter_past_the_stack_budget_is_declined(monkeypatch) -> None:
    monkeypatch.setattr(conv, "_STACK_FILTER_BYTES", 64)
    fn = lambda x, w: F.conv2d(x, w, padding=1, groups=4)  # noqa: E731 - a 4x3x3 float filter: 144 bytes
    inputs = [_nhwc(2, 4, 5, 5), _dw(4, 3, 3)]
    prog = compiled_post(fn, inputs)
    i = convolution_segment(prog)
    assert "stack" in dict(prog.passed_over[i])["cpp"]
    assert_matches_eager(fn, inputs, prog.graph, program=prog)

"""Note [the decomposition table, once] (segmenter/capturing/from_torch.py): the cached table decomposes
as torch's own lazy table would, custom ops registered after it was built included."""

import torch

import segmenter.capturing.from_torch as from_torch
from segmenter import capture


def _ops(graph) -> list[str]:
    return sorted({n.op for n in graph.nodes})


def test_the_cached_table_is_torchs_default_with_our_changes() -> None:
    table = from_torch._default_decompositions()
    fresh = torch.export.default_decompositions().materialize()
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    assert flash in fresh and flash not in table  # kept whole
    assert set(table) == set(fresh) - {flash}
    table.clear()  # a caller's copy: the cache is not touched
    assert len(from_torch._default_decompositions()) == len(fresh) - 1


def test_a_capture_is_the_same_with_the_table_built_again() -> None:
    fn = lambda x: torch.nn.functional.gelu(torch.nn.functional.layer_norm(x, (8,))).logsumexp(-1)  # noqa: E731
    x = torch.randn(4, 8)
    cached = _ops(capture(fn, [x]))
    from_torch._TABLE = None
    assert _ops(capture(fn, [x])) == cached


def test_a_custom_op_registered_after_the_table_was_built_is_decomposed() -> None:
    capture(lambda x: x + 1, [torch.randn(3)])  # the table is built
    lib = torch.library.Library("fuseg_decomp_test", "DEF")
    try:
        lib.define("twice(Tensor x) -> Tensor")
        lib.impl("twice", lambda x: x * 2, "CompositeImplicitAutograd")
        op = torch.ops.fuseg_decomp_test.twice.default
        graph = capture(lambda x: op(x) + 1, [torch.randn(3)])
        assert "aten.mul.Tensor" in _ops(graph) and not any("twice" in o for o in _ops(graph))
        assert op in from_torch._default_decompositions()
    finally:
        lib._destroy()

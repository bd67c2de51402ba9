"""The segmentation page's data (perf/tools/html/data.py): groups are the plan's segments, every cut
carries its reason, metadata segments and the alias pass's decisions are marked; the page embeds
the data so that no graph name can end its script block."""

from __future__ import annotations

import json
import re

import pytest
import torch

from alias import apply_aliases
from perf import zoo
from perf.targets import load_program
from perf.tools.cli import main
from perf.tools.html import graph_data, page_data, render_page, write_html
from segmenter import SegmentedFusion, SegmenterOptions, segment
from segmenter.capturing.from_torch import capture


def _diamond(x, w):
    a = x.exp()
    return a + a @ w


def _lone_slice(x):  # nvFuser #2577: the slice of a computed value launches nothing in post
    return x.sin()[:, 1:]


def _opaque_cut(x):
    return torch.cumsum(x.sin(), 0).cos()


def _copy_then_matmul(x, w):
    return x.t().contiguous() @ w


def _names(record: dict, seg: dict) -> list[str]:
    return [record["nodes"][i]["name"] for i in seg["nodes"]]


def _check_groups(record: dict, mode: dict, plan: SegmentedFusion) -> None:
    """One group per segment of the plan, in its order, with its kind, nodes, values and bytes."""
    assert [s["kind"] for s in mode["segments"]] == [s.kind.value for s in plan.segments]
    value = [v["name"] for v in record["values"]]
    for rec, seg in zip(mode["segments"], plan.segments):
        assert _names(record, rec) == [n.name for n in seg.nodes]
        assert [value[v] for v in rec["inputs"]] == list(seg.inputs)
        assert [value[v] for v in rec["outputs"]] == list(seg.outputs)
        assert (rec["bytes_moved"], rec["launches"]) == (seg.bytes_moved, seg.launches_kernel)
    assert mode["stats"] == plan.stats()
    cuts = [(value[b["value"]], b["producer"], b["consumer"], record["reasons"][b["reason"]]) for b in mode["boundaries"]]
    assert cuts == [(b.value, b.producer, b.consumer, b.reason) for b in plan.boundaries]


@pytest.mark.parametrize("shape", [(8, 8), (16, 16)])
@pytest.mark.parametrize("program,inputs,kinds", [
    (_diamond, lambda n: [torch.randn(n), torch.randn(n)], ["pointwise", "matmul", "pointwise"]),
    (_lone_slice, lambda n: [torch.randn(n)], ["pointwise", "metadata"]),
    (_opaque_cut, lambda n: [torch.randn(n)], ["pointwise", "opaque", "pointwise"]),
], ids=["diamond", "lone-slice", "opaque-cut"])
def test_groups_are_the_segments_of_every_mode(program, inputs, kinds, shape) -> None:
    sf = segment(capture(program, inputs(shape)))
    record = graph_data(sf)
    assert [m["mode"] for m in record["modes"]] == ["post", "pre", "off"]
    for mode in record["modes"]:
        _check_groups(record, mode, apply_aliases(sf, mode["mode"]))
    assert [s["kind"] for s in record["modes"][0]["segments"]] == kinds
    assert record["initial_mode"] == "post"


def test_boundary_reasons_are_the_segmenters() -> None:
    record = graph_data(segment(capture(_diamond, [torch.randn(8, 8), torch.randn(8, 8)])))
    post = record["modes"][0]
    why = {(b["producer"], b["consumer"]): record["reasons"][b["reason"]] for b in post["boundaries"]}
    assert "cycle" in why[(0, 2)] and "matmul" in why[(0, 1)]
    # each segment's layer is below every segment it reads from (Note [page layout])
    for b in post["boundaries"]:
        assert post["segments"][b["consumer"]]["layer"] > post["segments"][b["producer"]]["layer"]


def test_metadata_segments_and_the_alias_decisions_are_marked() -> None:
    sf = segment(capture(_lone_slice, [torch.randn(4, 8)]))
    record = graph_data(sf)
    post, pre, off = record["modes"]
    value = [v["name"] for v in record["values"]]
    meta = post["segments"][1]
    assert (meta["kind"], meta["launches"], meta["bytes_moved"], meta["origin"]) == ("metadata", False, 0, 0)
    (decision,) = post["alias"]["segments"]
    assert decision["became"] == ["pointwise", "metadata"]
    assert [[value[v], root] for v, root in decision["views_of_outputs"]] == [["slice_1", "sin"]]
    # pre keeps it a copy, and says why
    (kept,) = pre["alias"]["segments"][0]["kept"]
    assert value[kept[0]] == "slice_1" and "pre:" in kept[1]
    assert [s["kind"] for s in pre["segments"]] == ["pointwise"]
    assert off["alias"]["segments"] == [] and off["stats"]["metadata"] == 0
    # the slice's alias root, as the hover shows it
    assert record["values"][value.index("slice_1")]["root"] == "sin"


def test_elided_copies_and_the_rewritten_ops_are_marked() -> None:
    sf = segment(capture(_copy_then_matmul, [torch.randn(8, 4), torch.randn(8, 8)]))
    record = graph_data(sf)
    post = record["modes"][0]
    value = [v["name"] for v in record["values"]]
    assert [value[v] for v, _ in post["alias"]["elided"]] == ["clone"]
    clone = next(i for i, n in enumerate(record["nodes"]) if n["name"] == "clone")
    assert record["nodes"][clone]["op"] == "aten.clone.default"
    assert post["changed_nodes"] == {str(clone): "aten.alias.default"}
    assert "changed_nodes" not in record["modes"][1]  # pre keeps the graph as it was


def test_values_carry_shape_strides_dtype_and_roles() -> None:
    fn, inputs = zoo.get("rope-seed").factory()
    graph = capture(fn, inputs)
    record = graph_data(segment(graph))
    by_name = {v["name"]: v for v in record["values"]}
    for name, meta in graph.metas.items():
        got = by_name[name]["meta"]
        assert (got["shape"], got["stride"], got["offset"]) == (list(meta.shape), list(meta.stride), meta.storage_offset)
        assert got["dtype"] == str(meta.dtype).removeprefix("torch.")
    assert by_name["x"]["role"] == "user" and all(by_name[o].get("output") for o in graph.outputs)


def test_one_plan_or_plans_by_mode() -> None:
    sf = segment(capture(_lone_slice, [torch.randn(4, 8)]))
    one = graph_data(apply_aliases(sf, "pre"))
    assert [m["mode"] for m in one["modes"]] == ["pre"] and "origin" not in one["modes"][0]["segments"][0]
    two = graph_data({"off": apply_aliases(sf, "off"), "post": apply_aliases(sf, "post")}, base=sf, initial="post")
    assert [m["mode"] for m in two["modes"]] == ["off", "post"] and two["initial_mode"] == "post"
    assert two["modes"][1]["segments"][1]["origin"] == 0
    with pytest.raises(ValueError, match="no 'pre' plan"):
        graph_data({"off": apply_aliases(sf, "off")}, initial="pre")


def _embedded(html: str) -> dict:
    m = re.search(r'<script type="application/json" id="fuseg-data">(.*?)</script>', html, re.S)
    assert m is not None
    return json.loads(m.group(1))


def test_no_name_can_end_the_script_block() -> None:
    sf = segment(capture(_lone_slice, [torch.randn(4, 8)]))
    hostile = "</script><script>alert(1)</script><!--"
    data = page_data([graph_data(sf, name=hostile)], title=hostile)
    html = render_page(data)
    assert hostile not in html and "<script>alert" not in html
    assert html.count("</script>") == 2  # the data block's and the page's own
    assert _embedded(html) == data


def test_cli_segment_writes_the_page(tmp_path, capsys) -> None:
    out = tmp_path / "page.html"
    assert main(["segment", "rope-seed", "--html", str(out), "--alias", "pre"]) == 0
    assert "wrote" in capsys.readouterr().err
    data = _embedded(out.read_text())
    fn, inputs = zoo.get("rope-seed").factory()
    expected = graph_data(segment(capture(fn, inputs, name="rope-seed")), initial="pre")
    assert data["graphs"] == [json.loads(json.dumps(expected))]
    assert "http://" not in out.read_text().replace("http://www.w3.org/2000/svg", "")  # no network


def test_cli_profile_writes_one_page_of_every_model(tmp_path) -> None:
    out = tmp_path / "profile.html"
    assert main(["profile", "rope-seed", "mlp", "--html", str(out), "--format", "csv", "--out", str(tmp_path / "t.csv")]) == 0
    data = _embedded(out.read_text())
    assert [g["name"] for g in data["graphs"]] == ["rope-seed", "mlp"]
    assert [row["model"] for row in data["table"]] == ["rope-seed", "mlp"]
    for g, row in zip(data["graphs"], data["table"]):
        for mode in g["modes"]:
            assert len(mode["segments"]) == row[f"{mode['mode']}_segments"]


def test_write_html_segments_a_graph_with_options(tmp_path) -> None:
    graph = capture(_opaque_cut, [torch.randn(4, 8)])
    path = write_html(graph, str(tmp_path / "g.html"), options=SegmenterOptions(max_ops_per_segment=1))
    post = _embedded(open(path).read())["graphs"][0]["modes"][0]
    assert all(len(s["nodes"]) == 1 for s in post["segments"]) and len(post["segments"]) == len(graph.nodes)


def test_symbolic_sizes_are_shown_as_expressions_with_the_plans_conditions() -> None:
    """An nvFuser script's -1 dims are symbols: sizes and strides print as expressions."""
    graph = load_program("nvfuser-1597").graph
    record = graph_data(segment(graph))
    x = record["values"][record["inputs"][0]]["meta"]
    assert isinstance(x["shape"][1], str) and x["shape"][2] == 6144 and x["stride"][0] == f"6144*{x['shape'][1]}"
    assert record["sizes"] and record["sizes"][0].startswith("symbolic sizes:")
    assert graph_data(segment(capture(_lone_slice, [torch.randn(4, 8)])))["sizes"] == []

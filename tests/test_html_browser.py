"""The segmentation page in a real headless browser (Chromium's --dump-dom): it loads without
script errors and draws the plan's segments as groups, per alias mode; expanding, searching and a
10^4-node graph work. Skipped, with the reason, only where no Chromium can be found (.ci/run
installs Debian's ``chromium``; FUSEG_CHROMIUM names another)."""

from __future__ import annotations

import pytest
import torch

from alias import apply_aliases
from perf import zoo
from perf.benchmarks.synthetic import synthetic_transformer
from perf.tools.html import graph_data, page_data, render_page, write_html
from perf.tools.html.browser import find_chromium, load_page
from segmenter import segment
from segmenter.capturing.from_torch import capture

pytestmark = pytest.mark.skipif(
    find_chromium() is None,
    reason="no Chromium on PATH (apt-get install chromium, or set FUSEG_CHROMIUM): the page is not loaded in a browser")


def _diamond(x, w):
    a = x.exp()
    return a + a @ w


def _lone_slice(x):
    return x.sin()[:, 1:]


def _clean(load) -> None:
    assert load.console_errors == [], load.console_errors
    assert load.page_errors == [] and "data-errors" not in load.body, load.page_errors
    assert load.body.get("data-ready") == "1", load.body


@pytest.mark.parametrize("program,shape", [(_diamond, (8, 8)), (_lone_slice, (4, 8)), (_lone_slice, (16, 3))])
def test_every_mode_draws_its_segments_as_groups(tmp_path, program, shape) -> None:
    inputs = [torch.randn(shape)] * (2 if program is _diamond else 1)
    sf = segment(capture(program, inputs))
    path = write_html(sf, str(tmp_path / "page.html"))
    for mode in ("post", "pre", "off"):
        plan = apply_aliases(sf, mode)
        load = load_page(path, f"mode={mode}")
        _clean(load)
        assert load.body["data-shown-mode"] == mode
        assert [(g["data-seg"], g["data-kind"], g["data-nodes"]) for g in load.groups] == [
            (str(s.index), s.kind.value, str(len(s.nodes))) for s in plan.segments]
        assert load.nodes == []  # collapsed by default


def test_expand_and_search_on_rope_seed(tmp_path) -> None:
    fn, inputs = zoo.get("rope-seed").factory()
    sf = segment(capture(fn, inputs, name="rope-seed"))
    path = write_html(sf, str(tmp_path / "rope.html"))
    post = apply_aliases(sf, "post")
    load = load_page(path, "expand=all&search=neg")
    _clean(load)
    assert sorted(int(n["data-node"]) for n in load.nodes) == list(range(len(post.graph.nodes)))
    names = [n.name for n in post.graph.nodes]
    hits = [names[int(n["data-node"])] for n in load.nodes if "hit" in n["class"].split()]
    assert sorted(hits) == sorted(n.name for n in post.graph.nodes if "neg" in n.name or "neg" in n.op)
    assert [g["data-kind"] for g in load.groups] == ["pointwise", "metadata"]
    assert all("open" in g["class"].split() for g in load.groups)
    # a selected node opens its segment (and only that one); a selected segment is marked
    view = names.index(post.segments[1].nodes[0].name)
    load = load_page(path, f"select=n{view}")
    _clean(load)
    assert [g["data-seg"] for g in load.groups if "open" in g["class"].split()] == ["1"]
    assert [n["data-node"] for n in load.nodes if "sel" in n["class"].split()] == [str(view)]
    load = load_page(path, "mode=post&select=s1")
    _clean(load)
    assert [g["data-seg"] for g in load.groups if "sel" in g["class"].split()] == ["1"] and load.nodes == []


def test_hostile_names_stay_text(tmp_path) -> None:
    sf = segment(capture(_lone_slice, [torch.randn(4, 8)]))
    name = '<img src=x onerror="document.body.setAttribute(\'data-owned\',1)"></script><script>x=1</script>'
    path = tmp_path / "hostile.html"
    path.write_text(render_page(page_data([graph_data(sf, name=name)], title=name)))
    load = load_page(path)
    _clean(load)
    assert "data-owned" not in load.body and "<img" not in load.dom.split("<script", 1)[0]


def test_a_script_error_is_caught(tmp_path) -> None:
    """The check can fail: a page whose script throws is reported."""
    sf = segment(capture(_lone_slice, [torch.randn(4, 8)]))
    page = render_page(page_data([graph_data(sf)])).replace("'use strict';", "'use strict'; notDefined();", 1)
    path = tmp_path / "broken.html"
    path.write_text(page)
    load = load_page(path)
    assert any("notDefined" in e for e in load.console_errors)
    assert load.body.get("data-ready") != "1"


def test_ten_thousand_nodes_load_collapsed(tmp_path) -> None:
    graph = synthetic_transformer(10_000)
    sf = segment(graph)
    path = write_html(sf, str(tmp_path / "big.html"))
    post = apply_aliases(sf, "post")
    load = load_page(path)
    _clean(load)
    assert len(graph.nodes) >= 10_000
    assert [g["data-kind"] for g in load.groups] == [s.kind.value for s in post.segments]
    assert sum(int(g["data-nodes"]) for g in load.groups) == len(post.graph.nodes)
    print(f"10^4 nodes: {len(post.segments)} groups drawn, the page's script took {load.body['data-render-ms']} ms")

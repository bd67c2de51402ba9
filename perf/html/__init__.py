"""A segmentation as one self-contained HTML page (``fuseg segment TARGET --html FILE``).

    write_html(plan_or_graph, path)     the graph, segments as groups, every cut's reason, the
                                        alias pass's decisions, bytes against the floor, the alias
                                        modes side by side
    graph_data / page_data              the page's data (plain dicts), apart from the page
    render_page(data) -> str            the page: inline CSS and JS, no network
"""

from __future__ import annotations

from collections.abc import Mapping

from segmenter import FusionGraph, SegmentedFusion, SegmenterOptions, segment

from .data import MODE_NOTES, PAGE_VERSION, graph_data, page_data
from .render import render_page

__all__ = ["MODE_NOTES", "PAGE_VERSION", "graph_data", "page_data", "render_page", "write_html"]


def write_html(plans: FusionGraph | SegmentedFusion | Mapping[str, SegmentedFusion], path: str,
               title: str | None = None, options: SegmenterOptions | None = None) -> str:
    """Write the page for a graph (segmented here with ``options``), the segmenter's plan (the
    three alias modes are run on it), one plan after an alias pass, or plans by mode name.
    Returns ``path``."""
    if isinstance(plans, FusionGraph):
        plans = segment(plans, options)
    record = graph_data(plans)
    html = render_page(page_data([record], title or f"fuseg segmentation: {record['name']}"))
    with open(path, "w", encoding="utf-8") as f:
        f.write(html)
    return path

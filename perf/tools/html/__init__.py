"""A segmentation as one self-contained HTML page (``fuseg segment TARGET --html FILE``).

    write_html(plan_or_graph, path)     the graph, segments as groups, every cut's reason, the
                                        alias pass's decisions, bytes against the floor, the alias
                                        modes side by side
    graph_data / page_data              the page's data (plain dicts), apart from the page
    render_page(data) -> str            the page: inline CSS and JS, no network
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from segmenter import FusionGraph, SegmentedFusion, SegmenterOptions, segment

from .data import MODE_NOTES, PAGE_VERSION, graph_data, page_data
from .render import render_page

__all__ = ["MODE_NOTES", "PAGE_VERSION", "graph_data", "page_data", "render_page", "write_html", "write_page"]


def write_page(records: Iterable[dict[str, Any]], path: str, title: str,
               table: list[dict[str, Any]] | None = None) -> str:
    """Write a page of graph records (``graph_data``), with a table (``fuseg profile``'s rows)."""
    html = render_page(page_data(records, title, table))
    with open(path, "w", encoding="utf-8") as f:
        f.write(html)
    return path


def write_html(plans: FusionGraph | SegmentedFusion | Mapping[str, SegmentedFusion], path: str,
               title: str | None = None, options: SegmenterOptions | None = None,
               initial: str | None = None) -> str:
    """Write the page for a graph (segmented here with ``options``), the segmenter's plan (the
    three alias modes are run on it), one plan after an alias pass, or plans by mode name;
    ``initial``: the alias mode shown first. Returns ``path``."""
    if isinstance(plans, FusionGraph):
        plans = segment(plans, options)
    record = graph_data(plans, initial=initial)
    return write_page([record], path, title or f"fuseg segmentation: {record['name']}")

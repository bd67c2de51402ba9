"""The page: data (perf/tools/html/data.py) in a JSON script block, with the page's own CSS and JS
inline. One file, no server, no network: it opens from disk in any browser."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

__all__ = ["render_page"]

_SKELETON = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="fuseg">
<title>fuseg segmentation</title>
<style>
{css}
</style>
</head>
<body>
<header>
  <h1 id="title">fuseg segmentation</h1>
  <select id="graphs" hidden aria-label="graph"></select>
  <span id="graph-info" class="graph-info"></span>
  <nav id="tabs" class="tabs" aria-label="alias modes"></nav>
  <div id="legend" class="legend"></div>
  <div class="tools"><button id="expand-all">expand all</button> <button id="collapse-all">collapse all</button></div>
</header>
<ul id="errors" hidden></ul>
<details id="table" class="table"><summary>profile table</summary></details>
<main>
  <div id="canvas"></div>
  <aside class="side">
    <section><input id="search" type="search" placeholder="find nodes by name or op (Enter: go to the first)" autocomplete="off">
      <div id="hitcount" class="note"></div><ul id="results"></ul></section>
    <section id="summary"></section>
    <section id="details"></section>
    <section id="bytes"></section>
    <section id="boundaries"></section>
    <section id="alias"></section>
  </aside>
</main>
<div id="tip" hidden></div>
<script type="application/json" id="fuseg-data">{data}</script>
<script>
{js}
</script>
</body>
</html>
"""


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def _json_in_script(data: Any) -> str:
    """JSON that cannot end its script block or open a comment, whatever the graph's names hold:
    every ``<``, ``>`` and ``&`` as a JSON escape (JSON.parse reads them back unchanged)."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def render_page(data: dict[str, Any]) -> str:
    """The whole page for ``data`` (``perf.tools.html.page_data``)."""
    # str.format would read the CSS's and JS's braces as fields: put the parts in by hand
    page = _SKELETON
    for key, part in (("{css}", _asset("page.css")), ("{js}", _asset("page.js")), ("{data}", _json_in_script(data))):
        head, sep, tail = page.partition(key)
        page = head + part + tail
    return page

"""A flame graph as one self-contained interactive HTML page.

No external scripts, styles or fonts: the template, the drawing it shares with the
analysis's differential flame graph (``flamegraph.js``, ``flamegraph.css``) and the
graph's data are inlined.
Click a frame to zoom in (the breadcrumb zooms out), search by text or ``/regex/``;
hovering shows self and total with units. The view state lives in the URL fragment
(``#zoom=a;b&search=x``; a frame whose name a sibling shares is ``name@file:line``), so
a zoomed or filtered view can be linked.

The data is the graph's flat columns (:meth:`FlameGraph.to_flat`) and the page builds
and lays out the tree with loops, so stacks thousands of frames deep render (no
recursion in Python's JSON encoder nor in the page). The status line counts frames as
the CLI does (every frame but the root) and says how many are drawn: frames narrower
than 0.05 % of the view are not.
"""

from __future__ import annotations

import html
import json
from importlib import resources

from exporter.profiles.flamegraph import FlameGraph

__all__ = ["flame_graph_page", "render_html", "script_json"]

TEMPLATE = "flamegraph.html"
# The drawing (script and styles) this page shares with the analysis's diff page.
SCRIPT = "flamegraph.js"
STYLE = "flamegraph.css"


def script_json(data: object) -> str:
    """``data`` as compact JSON that can stand inside a ``<script>`` element."""
    # Inside <script>, "</" could close the element early; JSON allows "<\/".
    return json.dumps(data, separators=(",", ":")).replace("</", "<\\/")


def flame_graph_page(template: str, title: str, data: object) -> str:
    """``template`` with the shared flame-graph script and styles, ``title`` and ``data``."""
    package = resources.files("exporter.profiles")
    return (
        template.replace("__FLAMEGRAPH_CSS__", package.joinpath(STYLE).read_text("utf-8"))
        .replace("__FLAMEGRAPH_JS__", package.joinpath(SCRIPT).read_text("utf-8"))
        .replace("__TITLE__", html.escape(title))
        .replace("__DATA__", script_json(data))
    )


def render_html(graph: FlameGraph, title: str = "Flame graph") -> str:
    """The HTML page of ``graph``."""
    template = resources.files("exporter.profiles").joinpath(TEMPLATE).read_text("utf-8")
    data = {
        "title": title,
        "unit": graph.unit,
        "sampleType": graph.sample_type,
        "nodes": graph.to_flat(),
    }
    return flame_graph_page(template, title, data)

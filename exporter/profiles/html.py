"""A flame graph as one self-contained interactive HTML page.

No external scripts, styles or fonts: the template and the graph's data are inlined.
Click a frame to zoom in (the breadcrumb zooms out), search by text or ``/regex/``;
hovering shows self and total with units. The view state lives in the URL fragment
(``#zoom=a;b&search=x``), so a zoomed or filtered view can be linked.
"""

from __future__ import annotations

import html
import json
from importlib import resources

from exporter.profiles.flamegraph import FlameGraph

__all__ = ["render_html"]

TEMPLATE = "flamegraph.html"


def render_html(graph: FlameGraph, title: str = "Flame graph") -> str:
    """The HTML page of ``graph``."""
    template = resources.files("exporter.profiles").joinpath(TEMPLATE).read_text("utf-8")
    data = {
        "title": title,
        "unit": graph.unit,
        "sampleType": graph.sample_type,
        "root": graph.to_dict(),
    }
    # Inside <script>, "</" could close the element early; JSON allows "<\/".
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    return template.replace("__TITLE__", html.escape(title)).replace("__DATA__", payload)

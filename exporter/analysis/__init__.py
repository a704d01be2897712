"""Comparison and analysis of captures: what changed since the good run, what is wrong now.

Modules: ``sides`` (what a BASE or HEAD names, read into flame graphs and per-step
samples), ``diff`` (two sides aligned to one tree), ``noise`` (per-frame significance
across steps; ``rank_tests`` its Mann-Whitney U and Benjamini-Hochberg), ``compare``
(the comparison and its JSON), ``facts`` and ``rules`` (the
analysis report's measurements and findings), ``report``, ``render`` (text and HTML),
``baselines``, ``worker`` (reports for finished sessions, off the request path) and
``pyroscope_query`` (a Pyroscope selection as a side).

Import from the modules: this package imports nothing itself, so the sidecar does not
pay for numpy until a report is made.
"""

__all__: list[str] = []

"""Comparison and analysis of captures: what changed since the good run, what is wrong now.

Four subpackages, each importing only those below it (an import-linter contract):

- ``report``: the analysis report (``document``), the ``rules`` that turn facts into
  findings, and its text and HTML ``render``-ings;
- ``compare`` and ``facts``, side by side: comparing two sides (``comparison``, ``diff``,
  ``noise``, ``rank_tests``), and the measured facts of one capture (``capture``,
  ``types`` and one module per kind of fact);
- ``sides``: what a BASE or HEAD names (``load``), read into flame graphs and per-step
  samples, its ``cache``, ``baselines``, a ``pyroscope`` selection, and ``xla_host``
  (XLA's host threads, read by both above).

Import from the modules: no package here imports anything itself, so the sidecar does not
pay for numpy until a report is made.
"""

__all__: list[str] = []

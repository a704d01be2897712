"""Capture engine: profiler targets, remote captures, snapshots and the session store.

See docs/capture.md. Modules: ``targets`` (discovery), ``engine`` (fan-out capture),
``snapshots``, ``store``, ``session`` and ``names`` (the store's layout, records and
names), ``watcher`` (programmatic sessions), ``service`` (the engine with its hooks),
``alerts`` (Alertmanager policy).
"""

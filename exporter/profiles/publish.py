"""Publish a capture's flame graphs: the call the capture pipeline makes per session.

>>> publish_capture(Path("host.xplane.pb"), sink.push, service_name="trainer",
...                 run_id="r1", host="h0", trigger="alert", session_id="s1")  # doctest: +SKIP
{'xprof_device': PushResult(status='ok', ...), 'xprof_host': PushResult(status='ok', ...)}
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from exporter.profiles.flamegraph import FlameGraph
from exporter.profiles.xplane import device_flamegraph, host_flamegraph, load_capture

__all__ = ["capture_labels", "publish_capture"]

Publish = Callable[[FlameGraph, dict[str, str]], object]


def capture_labels(
    profile_source: str,
    *,
    service_name: str,
    run_id: str,
    host: str,
    trigger: str,
    session_id: str | None = None,
) -> dict[str, str]:
    """Pyroscope labels of one flame graph of a capture (see ``profile_labels``)."""
    from exporter.sinks.pyroscope import profile_labels

    return profile_labels(
        service_name,
        run_id=run_id,
        host=host,
        trigger=trigger,
        profile_source=profile_source,
        session_id=session_id,
    )


def publish_capture(
    path: Path,
    publish: Publish,
    *,
    service_name: str,
    run_id: str,
    host: str,
    trigger: str,
    session_id: str | None = None,
) -> dict[str, object]:
    """Convert one ``.xplane.pb`` and publish its device and host flame graphs.

    Returns what ``publish`` returned per profile source (``xprof_device``,
    ``xprof_host``); raises InputError for a capture that cannot be read.
    """
    outcomes: dict[str, object] = {}
    with load_capture(path) as capture:
        graphs = [
            (source, build(capture))
            for source, build in (
                ("xprof_device", device_flamegraph),
                ("xprof_host", host_flamegraph),
            )
        ]
    for source, graph in graphs:
        if graph is None:
            continue
        labels = capture_labels(
            source,
            service_name=service_name,
            run_id=run_id,
            host=host,
            trigger=trigger,
            session_id=session_id,
        )
        outcomes[source] = publish(graph, labels)
    return outcomes

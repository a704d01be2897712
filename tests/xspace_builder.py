"""Hand-made XProf planes for tests: events placed in nanoseconds, stats by name."""

from __future__ import annotations

from exporter.proto import xplane_pb2

__all__ = ["PlaneBuilder"]

PS_PER_NS = 1000


class PlaneBuilder:
    """Build one plane of an XSpace.

    >>> space = xplane_pb2.XSpace()
    >>> plane = PlaneBuilder(space, "/host:CPU")
    >>> line = plane.line("python", line_id=7)
    >>> plane.event(line, "train", 0, 100, step_num=1)
    """

    def __init__(self, space: xplane_pb2.XSpace, name: str) -> None:
        self.plane = space.planes.add(id=len(space.planes), name=name)
        self._metas: dict[tuple[str, tuple[tuple[str, object], ...]], int] = {}
        self._stats: dict[str, int] = {}

    def stat_id(self, name: str) -> int:
        found = self._stats.get(name)
        if found is None:
            found = self._stats[name] = len(self._stats) + 1
            self.plane.stat_metadata[found].id = found
            self.plane.stat_metadata[found].name = name
        return found

    def _set(self, container: object, stats: dict[str, object]) -> None:
        for name, value in stats.items():
            stat = container.stats.add(metadata_id=self.stat_id(name))  # type: ignore[attr-defined]
            if isinstance(value, str):
                stat.ref_value = self.stat_id(value)  # strings as refs, as XProf writes them
            elif isinstance(value, float):
                stat.double_value = value
            else:
                stat.int64_value = int(value)  # type: ignore[call-overload]

    def meta(self, name: str, **stats: object) -> int:
        """The event metadata id of ``name`` with these metadata stats."""
        key = (name, tuple(sorted(stats.items())))
        found = self._metas.get(key)
        if found is None:
            found = self._metas[key] = len(self._metas) + 1
            meta = self.plane.event_metadata[found]
            meta.id, meta.name = found, name
            self._set(meta, stats)
        return found

    def line(
        self, name: str, line_id: int | None = None, timestamp_ns: int = 0
    ) -> xplane_pb2.XLine:
        return self.plane.lines.add(
            id=len(self.plane.lines) + 1 if line_id is None else line_id,
            name=name,
            display_name=name,
            timestamp_ns=timestamp_ns,
        )

    def event(
        self,
        line: xplane_pb2.XLine,
        name: str | int,
        start_ns: float,
        duration_ns: float,
        **stats: object,
    ) -> None:
        """An event of metadata ``name`` (or id) at ``start_ns`` for ``duration_ns``."""
        meta = name if isinstance(name, int) else self.meta(name)
        event = line.events.add(
            metadata_id=meta,
            offset_ps=round(start_ns * PS_PER_NS),
            duration_ps=round(duration_ns * PS_PER_NS),
        )
        self._set(event, stats)

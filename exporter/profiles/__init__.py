"""XProf captures and device-memory profiles -> flame graphs (self/total) -> pprof.

Import from the modules (``exporter.profiles.flamegraph``, ``.pprof``, ``.memory``,
``.xplane``, ...): this package imports nothing itself, so the sidecar does not pay
for numpy and the XPlane reader until a capture is converted.
"""

__all__: list[str] = []

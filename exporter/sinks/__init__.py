"""Where flame graphs go: Grafana Pyroscope, with retry and an on-disk spool."""

from exporter.sinks.pyroscope import PushResult, PyroscopeLimits, PyroscopeSink, profile_labels
from exporter.sinks.spool import Spool

__all__ = ["PushResult", "PyroscopeLimits", "PyroscopeSink", "Spool", "profile_labels"]

"""XProf captures and device-memory profiles -> flame graphs (self/total) -> pprof."""

from exporter.profiles.flamegraph import OTHER, FlameGraph, Frame
from exporter.profiles.frames import FrameLabel
from exporter.profiles.memory import load_memory_profile, memory_flamegraph
from exporter.profiles.pprof import decode_pprof, encode_pprof, from_pprof, to_pprof
from exporter.profiles.xplane import (
    Capture,
    device_flamegraph,
    host_flamegraph,
    load_capture,
    parse_xspace,
)

__all__ = [
    "OTHER",
    "Capture",
    "FlameGraph",
    "Frame",
    "FrameLabel",
    "decode_pprof",
    "device_flamegraph",
    "encode_pprof",
    "from_pprof",
    "host_flamegraph",
    "load_capture",
    "load_memory_profile",
    "memory_flamegraph",
    "parse_xspace",
    "to_pprof",
]

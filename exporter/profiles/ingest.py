"""Pyroscope's two ingest formats, read and checked before the sidecar forwards them.

What agents send (from their source):

* ``POST /push.v1.PusherService/Push`` — Connect unary, ``application/proto``, body a
  gzip-compressed ``PushRequest`` (series of labels + raw pprof). pyroscope-io >= 1.0
  (grafana/pyroscope-rs since "use push instead of /ingest", #313) sends only this: one
  series per upload, ``__name__="process_cpu"``, pprof sample type ``cpu``/
  ``nanoseconds``, thread tags such as ``phase`` as pprof *sample* labels.
* ``POST /ingest?name=app{k=v,…}&from=&until=&format=pprof&sampleRate=&spyName=`` —
  the legacy API of older agents (pyroscope-rs < 1.0, pyroscope-io 0.8): the body a
  pprof (``binary/octet-stream``, gzip when ``Content-Encoding: gzip``); ``format=folded``
  (``a;b;c 12`` lines, counts of samples at ``sampleRate``) from the oldest ones.
  Multipart bodies (pyroscope-go, Java) are refused with a message.

Both become one ``PushRequest``, the wire form of the sidecar's Pyroscope sink. Every
input is bounded: compressed and decompressed sizes, profile size (Pyroscope's 4 MiB),
series and labels; a bad one raises :class:`IngestError` with the status and a message
naming what is wrong.
"""

from __future__ import annotations

import gzip
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from exporter.profiles.flamegraph import FlameGraph
from exporter.profiles.pprof import InflateLimits, decode_pprof, inflate, to_pprof
from exporter.proto import profile_pb2, pyroscope_push_pb2

__all__ = [
    "INGEST_FORMATS",
    "IngestError",
    "IngestLimits",
    "parse_app_name",
    "push_from_connect",
    "push_from_ingest",
]

INGEST_FORMATS = ("pprof", "folded")


@dataclass(frozen=True)
class IngestLimits:
    """Bounds on one ingest request (Pyroscope's own defaults where it has one)."""

    max_decompressed_bytes: int = 64 << 20  # a whole request after gunzip
    max_profile_bytes: int = 4 << 20  # max_profile_size_bytes, uncompressed, per profile
    max_series: int = 64  # an agent sends one per upload
    max_samples: int = 16  # per series: an agent sends one (one profile per upload)
    # All samples' profiles of one request once decompressed: a 142 KB body of many
    # 4 MiB-inflating samples cost 766 CPU-seconds to parse.
    max_request_profile_bytes: int = 16 << 20
    max_folded_depth: int = 2048  # frames in one folded stack (Pyroscope cuts at 1024)
    # Frames of one folded body in all (each a tree node, ~400 bytes): a 4 KB gzip of one
    # 2M-frame stack added 1.7 GB.
    max_folded_frames: int = 200_000
    max_labels: int = 30  # max_label_names_per_series
    max_label_name_length: int = 1024
    max_label_value_length: int = 2048


class IngestError(ValueError):
    """A request the sidecar refuses: ``status`` is the HTTP status to answer."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def gunzip_bounded(data: bytes, limit: int, what: str) -> bytes:
    """``data`` decompressed if it is gzip, refusing more than ``limit`` bytes of output.

    The ingest bounds output only (its body limit already bounds the input), so the
    ratio check of memory profiles is off here.
    """
    if data[:2] != b"\x1f\x8b":
        if len(data) > limit:
            raise IngestError(f"{what}: {len(data)} bytes, more than the limit of {limit}")
        return data
    try:
        # A ratio of ``limit`` never binds: the cap is ``limit`` bytes for any input size.
        return inflate(data, what, InflateLimits(max_bytes=limit, max_ratio=float(limit)))
    except ValueError as exc:
        if "refused" in str(exc):  # the cap, not corruption: name the ingest's own limit
            raise IngestError(f"{what}: more than {limit} bytes once decompressed") from None
        raise IngestError(str(exc)) from None


def _parse_pprof(
    raw: bytes, limits: IngestLimits, what: str, cap: int | None = None
) -> profile_pb2.Profile:
    data = gunzip_bounded(raw, limits.max_profile_bytes if cap is None else cap, what)
    try:
        return decode_pprof(data, what)
    except ValueError as exc:
        raise IngestError(str(exc)) from None


def _check_labels(pairs: list[tuple[str, str]], limits: IngestLimits, what: str) -> None:
    names = [name for name, _ in pairs]
    if len(pairs) > limits.max_labels:
        raise IngestError(f"{what}: {len(pairs)} labels, at most {limits.max_labels}")
    if len(set(names)) != len(names):
        raise IngestError(f"{what}: a label name appears twice")
    for name, value in pairs:
        if not name or len(name.encode()) > limits.max_label_name_length:
            raise IngestError(f"{what}: label name {name[:40]!r} is empty or too long")
        if len(value.encode()) > limits.max_label_value_length:
            raise IngestError(f"{what}: label {name} has a value over "
                              f"{limits.max_label_value_length} bytes")  # fmt: skip
    found = dict(pairs)
    if not found.get("__name__"):
        raise IngestError(f"{what}: label __name__ (the profile type) is required")
    if not found.get("service_name"):
        raise IngestError(f"{what}: label service_name is required")


def push_from_connect(
    body: bytes, content_type: str, content_encoding: str, limits: IngestLimits | None = None
) -> pyroscope_push_pb2.PushRequest:
    """The checked ``PushRequest`` of a Connect unary call to ``PusherService/Push``."""
    limits = limits or IngestLimits()
    ctype = content_type.split(";", maxsplit=1)[0].strip().lower()
    if ctype != "application/proto":
        raise IngestError(
            f"content type {ctype or '(none)'!r}: expected application/proto (Connect's "
            "binary form, as Pyroscope's agents send it)",
            status=415,
        )
    encoding = (content_encoding or "identity").strip().lower()
    if encoding == "gzip":
        body = gunzip_bounded(body, limits.max_decompressed_bytes, "request body")
    elif encoding != "identity":
        raise IngestError(f"content encoding {encoding!r}: expected gzip or none", status=415)
    request = pyroscope_push_pb2.PushRequest()
    try:
        request.ParseFromString(body)
    except DecodeError:
        raise IngestError("request body: not a push.v1 PushRequest") from None
    if not request.series:
        raise IngestError("request body: a PushRequest with no series")
    if len(request.series) > limits.max_series:
        raise IngestError(f"request body: {len(request.series)} series, at most "
                          f"{limits.max_series}")  # fmt: skip
    for index, series in enumerate(request.series):
        what = f"series[{index}]"
        _check_labels([(p.name, p.value) for p in series.labels], limits, what)
        if not series.samples:
            raise IngestError(f"{what}: no samples")
        if len(series.samples) > limits.max_samples:
            raise IngestError(f"{what}: {len(series.samples)} samples, at most "
                              f"{limits.max_samples} per series", status=413)  # fmt: skip
    # Every sample's profile is checked, all of them together within one budget.
    left = limits.max_request_profile_bytes
    for index, series in enumerate(request.series):
        for number, sample in enumerate(series.samples):
            what = f"series[{index}].samples[{number}]"
            if left <= 0:
                raise IngestError(f"{what}: the request's profiles exceed "
                                  f"{limits.max_request_profile_bytes} bytes in all "
                                  "once decompressed", status=413)  # fmt: skip
            cap = min(limits.max_profile_bytes, left)
            try:
                profile = _parse_pprof(sample.raw_profile, limits, what, cap)
            except IngestError as exc:
                if cap < limits.max_profile_bytes and "once decompressed" in exc.message:
                    raise IngestError(f"{what}: the request's profiles exceed "
                                      f"{limits.max_request_profile_bytes} bytes in all "
                                      "once decompressed", status=413) from None  # fmt: skip
                raise
            left -= profile.ByteSize()
    return request


def _check_folded(text: str, limits: IngestLimits) -> None:
    """Refuse a folded body whose stacks would make too many frames, before any is made."""
    separators = text.count(";")
    # An upper bound on the frames of all lines: no line can pass either limit.
    if separators < limits.max_folded_depth and (
        separators + text.count("\n") + 1 <= limits.max_folded_frames
    ):
        return
    total = 0
    for number, line in enumerate(text.splitlines(), start=1):
        depth = line.count(";") + 1
        if depth > limits.max_folded_depth:
            raise IngestError(f"folded body: line {number} is a stack of {depth} frames, "
                              f"at most {limits.max_folded_depth}", status=413)  # fmt: skip
        total += depth
        if total > limits.max_folded_frames:
            raise IngestError(f"folded body: more than {limits.max_folded_frames} frames "
                              f"in all (by line {number})", status=413)  # fmt: skip


# ``name`` of the legacy API: the application, then optional {key=value,...} tags.
_APP_NAME_RE = re.compile(r"^([^{}]+?)(?:\{([^{}]*)\})?$")
_TAG_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
# The suffix older agents put on the application name says the profile type, as the
# server's ingest adapter (pkg/ingester/pyroscope/ingest_adapter.go) reads it.
_SUFFIX_METRIC = {
    "cpu": "process_cpu",
    "itimer": "process_cpu",
    "wall": "wall",
    "inuse_objects": "memory",
    "inuse_space": "memory",
    "alloc_objects": "memory",
    "alloc_space": "memory",
}
_SAMPLE_TYPE_METRIC = {
    "cpu": "process_cpu",
    "samples": "process_cpu",
    "wall": "wall",
    **dict.fromkeys(("inuse_objects", "inuse_space", "alloc_objects", "alloc_space"), "memory"),
}


def parse_app_name(name: str) -> tuple[str, str | None, dict[str, str]]:
    """``app.cpu{env=prod}`` -> (``app``, ``process_cpu``, ``{"env": "prod"}``).

    The middle item is the profile type the suffix names, None without a known suffix.
    """
    match = _APP_NAME_RE.fullmatch(name.strip())
    if not match:
        raise IngestError(f"name={name!r}: expected app or app{{key=value,...}}")
    app, inner = match.group(1).strip(), match.group(2)
    metric = None
    base, dot, suffix = app.rpartition(".")
    if dot and base and suffix in _SUFFIX_METRIC:
        app, metric = base, _SUFFIX_METRIC[suffix]
    tags: dict[str, str] = {}
    for part in (inner or "").split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or not _TAG_KEY_RE.fullmatch(key):
            raise IngestError(f"name={name!r}: tag {part!r} is not key=value")
        if key != "__name__":  # reserved, as the agents filter it
            tags[key] = value.strip()
    return app, metric, tags


def _folded_pprof(text: str, sample_rate: int, from_s: int, until_s: int) -> bytes:
    # Folded counts are samples; the server scales them by the sampling period into cpu
    # nanoseconds, so the profile matches what pprof-sending agents report.
    period = 1_000_000_000 // max(1, sample_rate)
    try:
        graph = FlameGraph.from_folded(
            text,
            sample_type="cpu",
            unit="nanoseconds",
            period_type="cpu",
            period_unit="nanoseconds",
            period=period,
            time_nanos=from_s * 1_000_000_000,
            duration_nanos=max(0, until_s - from_s) * 1_000_000_000,
        )
    except ValueError as exc:
        raise IngestError(f"folded body: {exc}") from None
    raw: bytes = to_pprof(graph.scaled(period)).SerializeToString()
    return raw


def _int_param(query: Mapping[str, str], key: str, default: int) -> int:
    raw = query.get(key, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise IngestError(f"{key}={raw!r}: expected a whole number") from None


def push_from_ingest(
    query: Mapping[str, str],
    body: bytes,
    content_type: str,
    content_encoding: str,
    limits: IngestLimits | None = None,
    now_s: int = 0,
) -> pyroscope_push_pb2.PushRequest:
    """The ``PushRequest`` equivalent of one legacy ``/ingest`` call."""
    limits = limits or IngestLimits()
    ctype = content_type.split(";", maxsplit=1)[0].strip().lower()
    if ctype.startswith("multipart/"):
        raise IngestError(
            "multipart uploads (pyroscope-go, Java agents) are not accepted here: send them "
            "to Pyroscope directly; Python agents send a plain pprof body",
            status=415,
        )
    name = query.get("name", "")
    if not name:
        raise IngestError("query parameter name is required (app or app{key=value,...})")
    app, suffix_metric, tags = parse_app_name(name)
    fmt = (query.get("format") or "folded").strip().lower()
    if fmt not in INGEST_FORMATS:
        raise IngestError(
            f"format={fmt!r}: expected one of {', '.join(INGEST_FORMATS)}", status=415
        )
    encoding = (content_encoding or "identity").strip().lower()
    if encoding not in ("gzip", "identity"):
        raise IngestError(f"content encoding {encoding!r}: expected gzip or none", status=415)
    from_s = _int_param(query, "from", now_s)
    until_s = _int_param(query, "until", from_s)
    sample_rate = _int_param(query, "sampleRate", 100)
    if not 0 < sample_rate <= 1_000_000:
        raise IngestError(f"sampleRate={sample_rate}: expected 1..1000000")
    if fmt == "pprof":
        profile = _parse_pprof(body, limits, "pprof body")
        table = profile.string_table
        kind = table[profile.sample_type[-1].type]
        metric = suffix_metric or _SAMPLE_TYPE_METRIC.get(kind)
        if metric is None:
            raise IngestError(f"pprof body: sample type {kind!r} is not one Pyroscope "
                              f"ingests here ({', '.join(_SAMPLE_TYPE_METRIC)})")  # fmt: skip
        if not profile.time_nanos and from_s:
            profile.time_nanos = from_s * 1_000_000_000
            profile.duration_nanos = max(0, until_s - from_s) * 1_000_000_000
        raw = profile.SerializeToString()
    else:
        text = gunzip_bounded(body, limits.max_profile_bytes, "folded body")
        try:
            decoded = text.decode("utf-8")
        except UnicodeDecodeError:
            raise IngestError("folded body: not UTF-8 text") from None
        metric = suffix_metric or "process_cpu"
        _check_folded(decoded, limits)
        raw = _folded_pprof(decoded, sample_rate, from_s, until_s)
        if len(raw) > limits.max_profile_bytes:
            raise IngestError(f"folded body: profile over {limits.max_profile_bytes} bytes")
    labels = {"__name__": metric, **tags}
    if labels.get("service_name"):
        labels.setdefault("app_name", app)
    else:
        labels["service_name"] = app
    spy = query.get("spyName", "").strip()
    if spy:
        labels.setdefault("pyroscope_spy", spy)
    pairs = sorted(labels.items())
    _check_labels(pairs, limits, f"name={name!r}")
    request = pyroscope_push_pb2.PushRequest()
    series = request.series.add()
    for key, value in pairs:
        series.labels.add(name=key, value=value)
    series.samples.add(raw_profile=gzip.compress(raw, compresslevel=1, mtime=0),
                       ID=str(uuid.uuid4()))  # fmt: skip
    return request

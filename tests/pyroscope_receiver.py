"""A Pyroscope-compatible push receiver for tests (never shipped).

Speaks Connect unary on ``POST /push.v1.PusherService/Push`` (``application/proto``,
optionally gzip) and decodes requests with the real protobufs. It applies the checks of
Pyroscope's ``pkg/validation/validate.go`` with the default limits: at least one label,
at most 30, ``__name__`` a valid metric name, ``service_name`` not empty, label names
valid (UTF-8 by default as in current servers; ``legacy_names=True`` for the Prometheus
``[a-zA-Z_][a-zA-Z0-9_]*`` rule of older ones), name <= 1024 and value <= 2048 bytes, no
duplicate names; profiles <= 4 MiB uncompressed and <= 16 000 samples, no id 0, no '-'
in a sample type. Stacks deeper than 1000 frames are truncated and counted, as the
server does.

>>> with PyroscopeReceiver() as receiver:  # doctest: +SKIP
...     push_something(receiver.url)
...     receiver.wait_for(1)[0].labels["service_name"]
"""

from __future__ import annotations

import gzip
import json
import re
import threading
import zlib
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

from google.protobuf.message import DecodeError

from exporter.proto import profile_pb2, pyroscope_push_pb2
from tests.http_standin import HttpStandIn

__all__ = ["PUSH_PATH", "QUERY_PATH", "PyroscopeReceiver", "ReceivedSeries", "RejectedPush"]

PUSH_PATH = "/push.v1.PusherService/Push"
QUERY_PATH = "/querier.v1.QuerierService/SelectMergeProfile"
_LEGACY_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_LEGACY_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
MAX_LABELS = 30
MAX_LABEL_NAME_LENGTH = 1024
MAX_LABEL_VALUE_LENGTH = 2048
MAX_PROFILE_BYTES = 4 * 1024 * 1024
MAX_SAMPLES = 16_000
MAX_DEPTH = 1000


@dataclass
class ReceivedSeries:
    """One accepted series: labels, its decoded pprof and the request headers."""

    labels: dict[str, str]
    profile: profile_pb2.Profile
    headers: dict[str, str]
    raw_size: int
    truncated_stacks: int = 0

    @property
    def sample_types(self) -> list[tuple[str, str]]:
        table = self.profile.string_table
        return [(table[v.type], table[v.unit]) for v in self.profile.sample_type]

    def folded(self, value_index: int = 0) -> dict[str, int]:
        """``a;b;c`` (root first) -> value, summed over samples."""
        table = self.profile.string_table
        functions = {f.id: table[f.name] for f in self.profile.function}
        locations = {
            loc.id: [functions.get(line.function_id, "?") for line in reversed(loc.line)]
            for loc in self.profile.location
        }
        out: dict[str, int] = {}
        for sample in self.profile.sample:
            names = [n for loc in reversed(sample.location_id) for n in locations[loc]]
            key = ";".join(names)
            out[key] = out.get(key, 0) + sample.value[value_index]
        return out

    def sample_labels(self, sample: profile_pb2.Sample) -> dict[str, str]:
        """A sample's pprof labels (agents put thread tags such as ``phase`` there)."""
        table = self.profile.string_table
        return {table[label.key]: table[label.str] for label in sample.label}

    def folded_where(self, **labels: str) -> dict[str, int]:
        """``folded()`` of the samples whose pprof labels include all of ``labels``."""
        wanted = labels.items()
        kept = [s for s in self.profile.sample if wanted <= self.sample_labels(s).items()]
        subset = profile_pb2.Profile()
        subset.CopyFrom(self.profile)
        del subset.sample[:]
        subset.sample.extend(kept)
        view = ReceivedSeries(self.labels, subset, self.headers, self.raw_size)
        return view.folded()


@dataclass
class RejectedPush:
    """A refused request: the HTTP status and the Connect error."""

    status: int
    code: str
    message: str


class _InvalidPushError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _validate_labels(labels: list[tuple[str, str]], legacy: bool) -> dict[str, str]:
    def bad(message: str) -> _InvalidPushError:
        return _InvalidPushError(400, "invalid_argument", message)

    if not labels:
        raise bad("error at least one label pair is required per profile")
    if len(labels) > MAX_LABELS:
        raise bad(f"profile series has {len(labels)} label names; limit {MAX_LABELS}")
    out: dict[str, str] = {}
    for name, value in sorted(labels):
        if len(name.encode()) > MAX_LABEL_NAME_LENGTH:
            raise bad(f"profile has label name too long: {name[:40]!r}")
        if len(value.encode()) > MAX_LABEL_VALUE_LENGTH:
            raise bad(f"profile has label value too long: {value[:40]!r}")
        if not name or (legacy and not _LEGACY_LABEL_NAME.match(name)):
            raise bad(f"invalid labels with error: invalid label name {name!r}")
        if name in out:
            raise bad(f"profile has duplicate label name: {name!r}")
        out[name] = value
    metric = out.get("__name__", "")
    if not metric or (legacy and not _LEGACY_METRIC_NAME.match(metric)):
        raise bad("invalid labels with error: invalid metric name")
    if not out.get("service_name"):
        raise bad("invalid labels with error: service name is not provided")
    return out


def _decode_profile(raw: bytes) -> tuple[profile_pb2.Profile, int]:
    data = raw
    if raw[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise _InvalidPushError(
                400, "invalid_argument", f"failed to decompress profile: {exc}"
            ) from None
    if len(data) > MAX_PROFILE_BYTES:
        raise _InvalidPushError(
            400,
            "invalid_argument",
            f"uncompressed profile payload size exceeds limit of {MAX_PROFILE_BYTES} bytes",
        )
    profile = profile_pb2.Profile()
    try:
        profile.ParseFromString(data)
    except DecodeError as exc:
        raise _InvalidPushError(
            400, "invalid_argument", f"failed to parse profile: {exc}"
        ) from None
    return profile, len(data)


def _validate_profile(profile: profile_pb2.Profile) -> int:
    def bad(message: str) -> _InvalidPushError:
        return _InvalidPushError(400, "invalid_argument", message)

    table = profile.string_table
    if not table or table[0] != "":
        raise bad("malformed profile: string table must start with ''")
    if len(profile.sample) > MAX_SAMPLES:
        raise bad(
            f"the profile exceeds the samples count limit (max_profile_stacktrace_samples, "
            f"actual: {len(profile.sample)}, limit: {MAX_SAMPLES})"
        )
    if not profile.sample_type:
        raise bad("malformed profile: no sample types")
    for value_type in profile.sample_type:
        if not 0 <= value_type.type < len(table) or "-" in table[value_type.type]:
            raise bad("malformed profile: sample type contains -")
    if any(loc.id == 0 for loc in profile.location):
        raise bad("location id is 0")
    if any(fn.id == 0 for fn in profile.function):
        raise bad("function id is 0")
    location_ids = {loc.id for loc in profile.location}
    function_ids = {f.id for f in profile.function}
    for loc in profile.location:
        if any(line.function_id not in function_ids for line in loc.line):
            raise bad(f"malformed profile: location {loc.id} names an unknown function")
    for fn in profile.function:
        if not (0 <= fn.name < len(table) and 0 <= fn.filename < len(table)):
            raise bad(f"malformed profile: function {fn.id} has a string index out of range")
    n_types = len(profile.sample_type)
    truncated = 0
    for sample in profile.sample:
        if len(sample.value) != n_types:
            raise bad("malformed profile: sample value count != sample types")
        if any(loc not in location_ids for loc in sample.location_id):
            raise bad("malformed profile: sample names an unknown location")
        if len(sample.location_id) > MAX_DEPTH:
            truncated += 1  # the server keeps the 1000 frames nearest the root
    return truncated


class PyroscopeReceiver(HttpStandIn):
    """A push endpoint on 127.0.0.1 in a thread; ``received`` lists accepted series.

    ``fail_next(n, status)`` answers the next ``n`` pushes with ``status`` (e.g. 503).
    """

    def __init__(self, port: int = 0, legacy_names: bool = False) -> None:
        self.legacy_names = legacy_names
        self.received: list[ReceivedSeries] = []
        self.rejected: list[RejectedPush] = []
        self.requests = 0
        self.queries: list[Any] = []  # SelectMergeProfileRequests answered
        self.query_headers: list[dict[str, str]] = []  # their headers, names lower-case
        self._fail: list[int] = []
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        super().__init__(port)

    def fail_next(self, count: int, status: int = 503) -> None:
        with self._lock:
            self._fail.extend([status] * count)

    def wait_for(self, count: int, timeout: float = 30.0) -> list[ReceivedSeries]:
        """Block until ``count`` series were accepted; fail the test otherwise."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.received) >= count, timeout):
                raise AssertionError(
                    f"receiver got {len(self.received)} series, expected {count}; "
                    f"rejected: {self.rejected}"
                )
            return list(self.received)

    def _reply(self, handler: BaseHTTPRequestHandler, status: int, body: bytes, ctype: str) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", ctype)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length)
        if handler.path == QUERY_PATH:
            self._select_merge_profile(handler, body)
            return
        with self._lock:
            self.requests += 1
            forced = self._fail.pop(0) if self._fail else None
        try:
            if handler.path != PUSH_PATH:
                raise _InvalidPushError(404, "unimplemented", f"no handler for {handler.path}")
            if forced is not None:
                raise _InvalidPushError(
                    forced,
                    "unavailable" if forced >= 500 else "resource_exhausted",
                    "injected failure",
                )
            ctype = (handler.headers.get("Content-Type") or "").split(";")[0].strip()
            if ctype != "application/proto":
                raise _InvalidPushError(415, "unknown", f"unsupported content type {ctype!r}")
            encoding = (handler.headers.get("Content-Encoding") or "identity").lower()
            if encoding == "gzip":
                body = gzip.decompress(body)
            elif encoding != "identity":
                raise _InvalidPushError(
                    400, "unimplemented", f"unsupported compression {encoding!r}"
                )
            request = pyroscope_push_pb2.PushRequest()
            try:
                request.ParseFromString(body)
            except DecodeError as exc:
                raise _InvalidPushError(
                    400, "invalid_argument", f"cannot decode PushRequest: {exc}"
                ) from None
            accepted: list[ReceivedSeries] = []
            headers = {k.lower(): v for k, v in handler.headers.items()}
            for series in request.series:
                labels = _validate_labels(
                    [(p.name, p.value) for p in series.labels], self.legacy_names
                )
                for sample in series.samples:
                    profile, size = _decode_profile(sample.raw_profile)
                    truncated = _validate_profile(profile)
                    accepted.append(ReceivedSeries(labels, profile, headers, size, truncated))
        except _InvalidPushError as exc:
            with self._lock:
                self.rejected.append(RejectedPush(exc.status, exc.code, exc.message))
            payload = json.dumps({"code": exc.code, "message": exc.message}).encode()
            self._reply(handler, exc.status, payload, "application/json")
            return
        with self._cond:
            self.received.extend(accepted)
            self._cond.notify_all()
        self._reply(
            handler, 200, pyroscope_push_pb2.PushResponse().SerializeToString(), "application/proto"
        )

    def _select_merge_profile(self, handler: BaseHTTPRequestHandler, body: bytes) -> None:
        """Answer ``SelectMergeProfile`` by merging the accepted series that match."""
        from exporter.proto import pyroscope_querier_pb2

        request = pyroscope_querier_pb2.SelectMergeProfileRequest()
        try:
            ctype = (handler.headers.get("Content-Type") or "").split(";")[0].strip()
            if ctype != "application/proto":
                raise _InvalidPushError(415, "unknown", f"unsupported content type {ctype!r}")
            try:
                request.ParseFromString(body)
            except DecodeError as exc:
                raise _InvalidPushError(
                    400, "invalid_argument", f"cannot decode SelectMergeProfileRequest: {exc}"
                ) from None
            profile = _select(self, request)
        except _InvalidPushError as exc:
            payload = json.dumps({"code": exc.code, "message": exc.message}).encode()
            self._reply(handler, exc.status, payload, "application/json")
            return
        with self._lock:
            self.queries.append(request)
            self.query_headers.append({k.lower(): v for k, v in handler.headers.items()})
        self._reply(handler, 200, profile.SerializeToString(), "application/proto")


# -- query: SelectMergeProfile answered from what was received -------------------------
_MATCHER = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_.]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*,?')


def _parse_selector(text: str) -> list[tuple[str, str, str]]:
    """``{a="x",b=~"y.*"}`` -> [(name, op, value)]; ValueError when malformed."""
    body = text.strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise ValueError(f'selector {text!r}: expected {{name="value",...}}')
    inner, pos, out = body[1:-1], 0, []
    while pos < len(inner):
        match = _MATCHER.match(inner, pos)
        if match is None:
            if inner[pos:].strip():
                raise ValueError(f"selector {text!r}: cannot parse at {inner[pos:]!r}")
            break
        out.append((match.group(1), match.group(2), match.group(3).replace('\\"', '"')))
        pos = match.end()
    return out


def _selected(labels: dict[str, str], matchers: list[tuple[str, str, str]]) -> bool:
    for name, op, value in matchers:
        have = labels.get(name, "")
        if op == "=" and have != value:
            return False
        if op == "!=" and have == value:
            return False
        if op == "=~" and not re.fullmatch(value, have):
            return False
        if op == "!~" and re.fullmatch(value, have):
            return False
    return True


def _merge_series(series: list[ReceivedSeries], sample_type: str, unit: str) -> profile_pb2.Profile:
    """Merge the matching series' samples of one sample type into one pprof, by stack."""
    from exporter.profiles.flamegraph import FlameGraph
    from exporter.profiles.pprof import from_pprof, to_pprof

    merged = FlameGraph(sample_type=sample_type, unit=unit)
    for one in series:
        graph = from_pprof(one.profile, sample_type=sample_type)
        graph.unit = unit
        merged.merge(graph)
    return to_pprof(merged)


def _select(receiver: PyroscopeReceiver, request: object) -> profile_pb2.Profile:
    parts = request.profile_typeID.split(":")  # type: ignore[attr-defined]
    if len(parts) != 5:
        raise _InvalidPushError(400, "invalid_argument", "profile_typeID: expected 5 parts")
    name, sample_type, unit = parts[0], parts[1], parts[2]
    try:
        matchers = _parse_selector(request.label_selector)  # type: ignore[attr-defined]
    except ValueError as exc:
        raise _InvalidPushError(400, "invalid_argument", str(exc)) from None
    start_ns = request.start * 1_000_000  # type: ignore[attr-defined]
    end_ns = request.end * 1_000_000  # type: ignore[attr-defined]
    with receiver._lock:
        received = list(receiver.received)
    chosen = [
        s for s in received
        if s.labels.get("__name__") == name
        and (sample_type, unit) in s.sample_types
        and _selected(s.labels, matchers)
        and (not s.profile.time_nanos or start_ns <= s.profile.time_nanos <= end_ns)
    ]  # fmt: skip
    if not chosen:
        return profile_pb2.Profile()  # Pyroscope answers an empty profile
    return _merge_series(chosen, sample_type, unit)

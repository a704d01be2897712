"""A Pyroscope selection as a comparison side: ``pyroscope:{service_name="…",run_id="…"}``.

Fetched with Pyroscope's query API, ``querier.v1.QuerierService/SelectMergeProfile``
over Connect (``application/proto``), which answers the merged pprof of every profile
of one type matching the label selector between ``--from`` and ``--until``. The
profile type follows ``--kind`` (what this project pushes, see the README):

* ``device``: ``device:device_time:nanoseconds:device_time:nanoseconds``;
* ``host``: ``process_cpu:cpu:nanoseconds:cpu:nanoseconds`` (the pyroscope-io agent's
  CPU profiles), then ``wall:wall:nanoseconds:wall:nanoseconds`` (XProf host time);
* ``memory``: ``memory:inuse_space:bytes:space:bytes``.

``--profile-type`` names another one. Pyroscope has no steps, so such a side compares
as shares of its total.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final

import httpx

from exporter.errors import ConfigError, InputError
from exporter.profiles.flamegraph import FlameGraph

if TYPE_CHECKING:
    from exporter.analysis.sides.load import Kind, SideContext

__all__ = [
    "PROFILE_TYPES",
    "SELECT_MERGE_PROFILE_PATH",
    "fetch_merged",
    "parse_time",
    "select_merged",
]

SELECT_MERGE_PROFILE_PATH: Final = "/querier.v1.QuerierService/SelectMergeProfile"
PROFILE_TYPES: Final[dict[str, tuple[str, ...]]] = {
    "device": ("device:device_time:nanoseconds:device_time:nanoseconds",),
    "host": (
        "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
        "wall:wall:nanoseconds:wall:nanoseconds",
    ),
    "memory": ("memory:inuse_space:bytes:space:bytes",),
}
DEFAULT_RANGE_S: Final = 3600  # --from defaults to an hour before --until
QUERY_TIMEOUT_S: Final = 30.0
_SELECTOR = re.compile(
    r'^\{\s*([A-Za-z_][A-Za-z0-9_.]*\s*(=|!=|=~|!~)\s*"(?:[^"\\]|\\.)*"\s*,?\s*)*\}$'
)
_PROFILE_TYPE = re.compile(r"^[A-Za-z_][\w.]*(:[A-Za-z_][\w.]*){4}$")
_RELATIVE = re.compile(r"^now(?:-(\d+)([smhd]))?$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_time(text: str, now: float | None = None) -> float:
    """Seconds since the epoch from ``now``, ``now-2h``, Unix seconds or ISO 8601."""
    now = time.time() if now is None else now
    value = text.strip()
    relative = _RELATIVE.fullmatch(value)
    if relative:
        amount, unit = relative.groups()
        return now - (int(amount) * _UNITS[unit] if amount else 0)
    try:
        return float(value)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(
            f"time {text!r}: expected now, now-<N>[smhd], Unix seconds or ISO 8601"
        ) from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def fetch_merged(
    url: str,
    profile_type: str,
    selector: str,
    start_s: float,
    end_s: float,
    headers: dict[str, str] | None = None,
    transport: httpx.BaseTransport | None = None,
) -> FlameGraph | None:
    """The merged profile as a flame graph; None when nothing matched."""
    from google.protobuf.message import DecodeError

    from exporter.profiles.pprof import from_pprof
    from exporter.proto import profile_pb2, pyroscope_querier_pb2

    request = pyroscope_querier_pb2.SelectMergeProfileRequest(
        profile_typeID=profile_type,
        label_selector=selector,
        start=int(start_s * 1000),
        end=int(end_s * 1000),
    )
    endpoint = url.rstrip("/") + SELECT_MERGE_PROFILE_PATH
    try:
        with httpx.Client(timeout=QUERY_TIMEOUT_S, transport=transport) as client:
            response = client.post(
                endpoint,
                content=request.SerializeToString(),
                headers={
                    "Content-Type": "application/proto",
                    "Connect-Protocol-Version": "1",
                    "User-Agent": "mlprof-exporter",
                    **(headers or {}),
                },
            )
    except httpx.HTTPError as exc:
        raise InputError(f"Pyroscope {url}: cannot query ({type(exc).__name__}: {exc})") from None
    if response.status_code != 200:
        try:
            message = response.json().get("message", response.text)
        except ValueError:
            message = response.text
        raise InputError(
            f"Pyroscope {url}: SelectMergeProfile answered {response.status_code}: "
            f"{str(message)[:300]}"
        )
    profile = profile_pb2.Profile()
    try:
        profile.ParseFromString(response.content)
    except DecodeError:
        raise InputError(f"Pyroscope {url}: SelectMergeProfile answered no pprof") from None
    if not profile.sample or not profile.sample_type:
        return None
    try:
        graph = from_pprof(profile, profile_name=profile_type.split(":", maxsplit=1)[0])
    except (IndexError, KeyError, ValueError) as exc:
        raise InputError(f"Pyroscope {url}: corrupt pprof in the answer ({exc})") from None
    return graph if graph.root.total > 0 else None


def select_merged(
    selector: str, kind: Kind | None, context: SideContext, spec: str
) -> tuple[Kind, FlameGraph, str]:
    """Fetch a selection (see the module docstring): its kind, its merged flame graph
    and the profile type that had it (a side without steps, made by the caller)."""
    if not context.pyroscope_url:
        raise ConfigError(f"{spec}: set MLPROF_PYROSCOPE_URL to compare Pyroscope selections")
    if not _SELECTOR.match(selector.strip()):
        raise ConfigError(
            f'{spec}: expected a label selector like pyroscope:{{service_name="trainer",'
            'run_id="r1"}'
        )
    chosen: Kind = kind or "device"
    if context.profile_type:
        if not _PROFILE_TYPE.fullmatch(context.profile_type):
            raise ConfigError(
                f"--profile-type {context.profile_type!r}: expected "
                "name:type:unit:period_type:period_unit"
            )
        types: tuple[str, ...] = (context.profile_type,)
    else:
        types = PROFILE_TYPES[chosen]
    now = time.time()
    end = parse_time(context.time_until, now) if context.time_until else now
    start = parse_time(context.time_from, now) if context.time_from else end - DEFAULT_RANGE_S
    if start >= end:
        raise ConfigError(f"--from must be before --until (got {start:.0f} >= {end:.0f})")
    fetch = context.fetch or fetch_merged
    for profile_type in types:
        graph = fetch(
            context.pyroscope_url,
            profile_type,
            selector.strip(),
            start,
            end,
            context.pyroscope_headers,
        )
        if graph is not None:
            return chosen, graph, profile_type
    shown = " or ".join(types)
    raise InputError(
        f"{spec}: Pyroscope has no {shown} profiles matching {selector.strip()} between "
        f"{datetime.fromtimestamp(start, UTC):%Y-%m-%dT%H:%M:%SZ} and "
        f"{datetime.fromtimestamp(end, UTC):%Y-%m-%dT%H:%M:%SZ}"
    )

"""The use cases, written once: compare, analyze, a flame-graph subtree, list sessions and
runs, and naming a side.

Four doors reach them: the CLI (``mlprof compare|analyze|sessions``), the HTTP API
(``/api/v1/compare``, ``/api/v1/sessions``), the MCP server (``mlprof mcp``) and the
sidecar's bounded job child (``python -m exporter.pipeline.job``). A door parses its own
input and renders its own output; what a name may be, which credentials Pyroscope gets,
how the head side is read, how a run's sessions are chosen and how a use case reaches a
bounded child is decided here, so the doors cannot drift apart
(``tests/integration/test_doors.py`` holds them to the same JSON).

The doors that serve other people's requests (the API, MCP, the sidecar's workers) run
the heavy use cases in a bounded child (:func:`exporter.pipeline.job.in_child`, the job
child being a door too); the CLI is one command of the user's own and runs them in its
process.

>>> context = side_context(load_settings(None, store="/var/lib/mlprof/store"))  # doctest: +SKIP
>>> compare(["base-session"], ["head-session"], context).step_verdict.verdict  # doctest: +SKIP
'slower'
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

from exporter.errors import ConfigError, InputError, UnavailableError

if TYPE_CHECKING:
    from exporter.analysis.compare.comparison import Comparison
    from exporter.analysis.report.document import Report
    from exporter.analysis.sides.load import Side, SideContext
    from exporter.capture.store import SessionStore
    from exporter.config import Settings
    from exporter.profiles.convert import Kind

__all__ = [
    "NoSuchSessionError",
    "analyze",
    "compare",
    "comparison_document",
    "flamegraph_subtree",
    "head_kind",
    "list_runs",
    "list_sessions",
    "report_document",
    "side_context",
    "stored_side",
]

RUN_PREFIX: Final = "run:"
PYROSCOPE_PREFIX: Final = "pyroscope:"


class NoSuchSessionError(InputError):
    """A well-formed session id that the store does not hold (HTTP 404)."""


# -- where names are looked up -------------------------------------------------------


def side_context(
    settings: Settings,
    *,
    time_from: str | None = None,
    time_until: str | None = None,
    profile_type: str | None = None,
) -> SideContext:
    """Where sides are looked up, from the settings: the store, the shared directory, and
    Pyroscope with its credentials (the same for every door)."""
    from exporter.analysis.sides.load import SideContext

    headers: dict[str, str] = {}
    if settings.pyroscope_url:
        from exporter.sinks.pyroscope import request_headers

        headers = request_headers(settings)
    return SideContext(
        store=settings.store,
        shared_dir=settings.shared_dir,
        pyroscope_url=settings.pyroscope_url,
        pyroscope_headers=headers,
        time_from=time_from,
        time_until=time_until,
        profile_type=profile_type,
    )


def stored_side(store: SessionStore, value: str, *, pyroscope: bool, field: str = "side") -> str:
    """``value`` as a side that names no file: a session id of ``store``,
    ``run:<run_id>`` (``~N`` for its N newest sessions) or ``pyroscope:{...}``.

    The doors that serve others (API, MCP) take only these, so no request reads a file
    outside the store. Returns the spec to load: a local session's directory, else the
    value itself (a remote session is copied by the reader). ConfigError for a name of
    the wrong shape (or a Pyroscope side without Pyroscope), NoSuchSessionError for an
    id the store does not hold, UnavailableError for a store that does not answer.
    """
    from exporter.analysis.sides.load import run_spec
    from exporter.capture.session import check_session_id

    if value.startswith(PYROSCOPE_PREFIX):
        if not pyroscope:
            raise ConfigError(
                f"{field}: a Pyroscope selection is not a side here (a comparison takes one "
                "where MLPROF_PYROSCOPE_URL is set)"
            )
        return value
    if value.startswith(RUN_PREFIX):
        try:
            run_spec(value)
        except ConfigError as exc:
            raise ConfigError(f"{field}: {exc}") from None
        return value
    try:
        check_session_id(value)
    except ValueError as exc:
        raise ConfigError(f"{field}={value!r}: {exc}; or run:<run_id>, pyroscope:{{...}}") from None
    local = store.local_dir(value)
    if local is not None:
        if not local.is_dir():
            raise NoSuchSessionError(f"{field}: no session {value!r} in the store {store.url}")
        return str(local.absolute())
    try:  # a session without session.json (an XProf logdir's run) is one too
        found = store.session_files(value)
    except OSError as exc:
        raise UnavailableError(f"{field}: cannot read the store {store.url} ({exc})") from None
    if not found:
        raise NoSuchSessionError(f"{field}: no session {value!r} in the store {store.url}")
    return value


# -- compare ---------------------------------------------------------------------------


def head_kind(base: Side, kind: Kind | None) -> Kind | None:
    """How the head is read: as asked, else as the base was (its kind, or the step view
    when the base has one), so the two sides are the same view."""
    return kind or (None if base.scope == "step" else base.kind)


def _replicates(specs: Sequence[str], context: SideContext) -> list[str]:
    """Each spec as the captures it stands for (``run:<id>~N``: the run's N newest)."""
    from exporter.analysis.sides.load import expand_replicates

    return [one for spec in specs for one in expand_replicates(spec, context)]


def compare(
    base: Sequence[str],
    head: Sequence[str],
    context: SideContext,
    *,
    kind: Kind | None = None,
    history: Sequence[str] = (),
) -> Comparison:
    """Compare HEAD against BASE; each side is one spec or several (replicates: one
    capture each, whose spread is the between-run noise). ``history``: earlier runs of
    the workload (``run:<id>~N`` for a run's N newest), one capture each: their median
    steps judge the step time, and each frame's spread between them joins the noise."""
    from exporter.analysis.compare.comparison import compare_sides
    from exporter.analysis.sides.load import load_side

    if not base or not head:
        raise ConfigError("compare: expected at least one BASE and one HEAD")
    base_specs, head_specs = _replicates(base, context), _replicates(head, context)
    base_sides = [load_side(spec, kind, context) for spec in base_specs]
    read_as = head_kind(base_sides[0], kind)
    head_sides = [load_side(spec, read_as, context) for spec in head_specs]
    # A run compared is no earlier run of its own comparison (run:X~8 as history holds
    # the base when the base is run:X's newest).
    history_specs = _replicates(history, context)
    sides = {*base_specs, *head_specs}
    earlier_specs = [spec for spec in history_specs if spec not in sides]
    earlier = []
    for spec in earlier_specs:
        side = load_side(spec, read_as, context)
        if side.kind != base_sides[0].kind or side.scope != base_sides[0].scope:
            raise InputError(f"--history {spec}: a {side.scope or side.kind} side, not the "
                             f"{base_sides[0].scope or base_sides[0].kind} compared")  # fmt: skip
        earlier.append(side)
    try:
        comparison = compare_sides(base_sides, head_sides, history_sides=earlier)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    if len(earlier_specs) < len(history_specs):
        left = len(history_specs) - len(earlier_specs)
        comparison.notes.append(f"{left} of the history's runs are compared: left out of it")
    return comparison


def comparison_document(comparison: Comparison, fmt: str, top: int = 20) -> bytes:
    """The comparison as a door shows it: ``json``, ``html`` or ``text``."""
    from exporter.analysis.report.render import comparison_html, comparison_text

    if fmt == "json":
        return (json.dumps(comparison.to_json(top=top), indent=2) + "\n").encode()
    if fmt == "html":
        return comparison_html(comparison).encode()
    return comparison_text(comparison, top).encode()


# -- analyze ---------------------------------------------------------------------------


def analyze(
    spec: str,
    context: SideContext,
    *,
    baseline: str | Sequence[str] | None = None,
    xprof: bool = True,
    shown_as: str | None = None,
    **options: Any,
) -> Report:
    """The analysis report of a capture, a session or ``run:<id>`` (``baseline``: also
    compare against it, or against each of several as replicates). ``shown_as``: the
    name the user gave, when the door resolved it to a path (a session id); ``options`` are
    :func:`exporter.analysis.report.document.analyze`'s."""
    from exporter.analysis.report.document import analyze as analyse

    report = analyse(spec, context, baseline=baseline, xprof=xprof, **options)
    if shown_as is not None:
        report.input["spec"] = shown_as
    return report


def report_document(report: Report, fmt: str, title: str | None = None) -> bytes:
    """The report as a door shows it: ``json``, ``html`` or ``text``."""
    from exporter.analysis.report.render import report_html, report_text

    if fmt == "json":
        return (json.dumps(report.to_json(), indent=2) + "\n").encode()
    if fmt == "html":
        return report_html(report, title).encode()
    return report_text(report).encode()


# -- a flame graph's subtree -----------------------------------------------------------


def flamegraph_subtree(
    spec: str,
    context: SideContext,
    frames: Sequence[str] = (),
    kind: Kind | None = None,
    limit: int = 50,
    *,
    settings: Settings | None = None,
) -> dict[str, Any]:
    """The frame at ``frames`` (root-first names) of the flame graph of what ``spec``
    names (a capture, a profile, a session), with its children's self and total."""
    from exporter.capture.inputs import resolve_input
    from exporter.config import load_settings
    from exporter.profiles.convert import flamegraph_from_path
    from exporter.profiles.pprof import InflateLimits

    def limits() -> InflateLimits:
        found = settings or load_settings(None)
        return InflateLimits(found.max_profile_bytes, found.max_profile_ratio)

    graph = flamegraph_from_path(resolve_input(spec, context.store), kind, False, limits)
    node = graph.root
    for depth, name in enumerate(frames):
        found = node.named(name)
        if found is None:
            known = sorted(node.children.values(), key=lambda c: -c.total)[:10]
            where = ";".join(frames[:depth]) or "the root"
            raise InputError(
                f"frame path: no frame {name!r} under {where} (its largest children: "
                + (", ".join(repr(c.name) for c in known) or "none")
                + ")"
            )
        node = found
    total = graph.root.total
    children = sorted(node.children.values(), key=lambda c: -c.total)

    def share(value: int) -> float:
        return round(100 * value / total, 3) if total else 0.0

    return {
        "sample_type": graph.sample_type,
        "unit": graph.unit,
        "graph_total": total,
        "path": list(frames),
        "self": node.self_value,
        "total": node.total,
        "total_pct": share(node.total),
        "children": [
            {
                "name": c.name,
                **({"file": f"{c.file}:{c.line}" if c.line else c.file} if c.file else {}),
                "self": c.self_value,
                "total": c.total,
                "total_pct": share(c.total),
                "children": len(c.children),
            }
            for c in children[:limit]
        ],
        "more_children": max(0, len(children) - limit),
    }


# -- sessions and runs -----------------------------------------------------------------


def list_sessions(
    store: SessionStore,
    *,
    run_id: str | None = None,
    trigger: str | None = None,
    status: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int = 100,
) -> dict[str, Any]:
    """Sessions in the store, newest first, filtered by run, trigger, status and time.

    ``total``: the sessions that match; ``stored``: all sessions with a record;
    ``unrecorded``: directories without one (an XProf logdir's runs), still analysable.
    """
    records = store.listed()
    chosen = [
        r
        for r in reversed(records)
        if (run_id is None or r.in_run(run_id))
        and (trigger is None or r.trigger == trigger)
        and (status is None or r.status == status)
        and (since is None or r.created >= since)
        and (until is None or r.created < until)
    ]
    recorded = {r.id for r in records}
    unrecorded = [i for i in store.session_ids() if i not in recorded]
    return {
        "sessions": [r.model_dump(mode="json") for r in chosen[:limit]],
        "total": len(chosen),
        "stored": len(records),
        "unrecorded": unrecorded[:limit],
    }


def list_runs(store: SessionStore) -> dict[str, Any]:
    """The runs the store's sessions belong to: sessions, hosts, first and last."""
    runs: dict[str, dict[str, Any]] = {}
    for record in store.listed():
        ids = {record.run_id, *(t.run_id for t in record.targets)} - {None}
        for run_id in sorted(i for i in ids if i):
            run = runs.setdefault(
                run_id, {"run_id": run_id, "workload": None, "sessions": [], "hosts": []}
            )
            run["workload"] = run["workload"] or record.workload
            run["sessions"].append(record.id)
            run["hosts"] = sorted({*run["hosts"], *(t.host for t in record.targets)})
            created = record.created.isoformat()
            run.setdefault("first", created)
            run["last"] = created
    return {"runs": sorted(runs.values(), key=lambda r: r["last"], reverse=True)}

"""``mlprof mcp``: the project's analysis tools for any Model Context Protocol client.

A stdio MCP server (the ``mcp`` SDK's ``MCPServer``) over one session store, so an agent
can do the managed platform's "targeted follow-ups" offline: list sessions and runs,
analyse, compare, top ops, GPU kernels, a flame-graph subtree, hosts, the memory peak, and a fixed
allow-list of XProf's own CLI tools (``xprof get_step_trace`` ...) on a session's
captures. Each answer is the JSON the CLI prints (``mlprof analyze --format json``,
``mlprof compare --format json``), made by the same functions.

Read-only unless started with ``--allow-capture``, which adds a ``capture`` tool that
asks a running sidecar for a trace. Sessions are named by id and checked as the store
checks them, so no name reaches outside the store; every failure is a tool error of one
line, never a traceback.

    mlprof mcp --store /var/lib/mlprof/store      # stdio; point the client at this command

>>> tools = ProfileTools("/var/lib/mlprof/store")  # doctest: +SKIP
>>> tools.top_ops("my-session", limit=3)["top_ops"][0]["name"]  # doctest: +SKIP
"""

import importlib.util
import json
import shutil
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, Final, Literal, TypeVar

from pydantic import Field, ValidationError

from exporter.config import Settings
from exporter.errors import ConfigError, InputError, MlprofError
from exporter.profiles.capture_files import CAPTURES_NAMED, find_captures

__all__ = ["XPROF_CLI_TOOLS", "ProfileTools", "build_server"]

RUN_PREFIX: Final = "run:"
PYROSCOPE_PREFIX: Final = "pyroscope:"

# XProf's CLI tools a client may run, each with the flags it may pass. Only tools that
# read a capture and answer JSON: none that writes elsewhere (upload_trace, get_hlo_text's
# export path, get_xspace_proto's output_path, the events DB), serves, or takes a second
# session. session_id and logdir are never the client's: the session's copy is given.
XPROF_CLI_TOOLS: Final[dict[str, frozenset[str]]] = {
    name: frozenset(("host", *flags))
    for name, flags in {
        "get_overview": ("include_command",),
        "get_step_trace": ("step_num", "limit", "device_core", "include_summary"),
        "get_kpi_metrics": (),
        "get_hosts": (),
        "get_device_information": (),
        "get_profile_summary": (),
        "get_utilization_viewer": ("device", "node"),
        "get_roofline_model": ("top_n", "group_by"),
        "get_top_hlo_ops": ("limit", "category_filter", "op_name"),
        "get_hlo_stats": ("limit", "sort_by", "category_filter", "include_nested"),
        "get_hlo_op_profile": ("top_n", "view", "category", "path", "depth", "sort_by"),
        "list_hlo_modules": (),
        "get_hlo_neighborhood": (
            "instruction_name",
            "radius",
            "module_name",
            "fmt",
            "op_name",
            "print_metadata",
            "direction",
            "follow_calls",
            "detect_fusion_blockers",
            "opcode_filter",
            "max_nodes",
        ),
        "get_hlo_module_content": ("fmt", "module_name", "max_lines", "print_metadata"),
        "get_peak_allocations": (
            "limit",
            "min_size_mib",
            "output_format",
            "include_summary",
            "aggregate_instructions",
        ),
        "get_memory_profile": (),
        "get_kernel_stats": ("kernel_name", "limit", "include_summary", "device_to_use"),
        "analyze_async_overlap": ("hidden_threshold", "exposed_threshold", "top_k"),
        "check_host_boundness": ("func_name",),
        "get_device_time_attribution": ("include_summary",),
        "aggregate_xplane_events": (
            "plane_regex",
            "event_regex",
            "start_time_ps",
            "end_time_ps",
            "window_semantics",
            "min_duration_ps",
            "max_duration_ps",
            "filter",
            "group_by",
        ),
        "list_xplane_events": (
            "plane_regex",
            "event_regex",
            "start_time_ps",
            "end_time_ps",
            "max_events",
            "offset",
            "window_semantics",
            "min_duration_ps",
            "max_duration_ps",
            "filter",
        ),
        "list_xplane_lines": (),
        "inspect_capture": (),
    }.items()
}
# As the report's own XProf run (analysis/facts/xprof_tools.py): a minute covers a
# 2-million-event capture on a loaded machine; a client never waits longer.
XPROF_CLI_TIMEOUT_S: Final = 60.0
# XProf spills answers over 10 MB to a file; an agent's context wants far less.
MAX_XPROF_ANSWER_BYTES: Final = 4 << 20
MAX_ARGUMENT_CHARS: Final = 1000
CACHED_REPORTS: Final = 8  # reports kept per process: one session's follow-ups reuse one
MAX_ERROR_CHARS: Final = 500
XPROF_CLI_MAIN: Final = "import sys; from xprof.cli.xprof_cli import main; main(sys.argv)"

T = TypeVar("T")


def one_line(exc: BaseException) -> str:
    """``exc`` as one line: its first line, the type named unless it is one of ours."""
    text = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    if not isinstance(exc, MlprofError):
        text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text[:MAX_ERROR_CHARS]


class ProfileTools:
    """The MCP server's tools on one store; each answers the CLI's JSON or raises.

    Names are checked as every door that serves others checks them
    (:func:`exporter.usecases.stored_side`); analyses, comparisons and flame graphs run
    in a bounded child (:func:`exporter.pipeline.job.in_child`), so a hostile capture in the
    store costs a child, never this server. A bad name or input raises
    :class:`InputError` (one line); the server turns every exception into a tool error.
    Reports are cached per session and capture files.
    """

    def __init__(
        self,
        store: str,
        shared_dir: Path | None = None,
        *,
        api_url: str | None = None,
        token: str | None = None,
        settings: Settings | None = None,
    ) -> None:
        from exporter.capture.store import SessionStore
        from exporter.config import load_settings

        self.store = SessionStore(store)
        self.store_url = store
        self.shared_dir = shared_dir
        self.api_url = api_url
        self.token = token
        self.settings = settings or load_settings(None, store=store)
        self._reports: OrderedDict[tuple[object, ...], dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()

    # -- names ---------------------------------------------------------------------
    def _session_dir(self, session: str) -> Path:
        """The local directory of a session id of this store (a copy for a remote one)."""
        from exporter.capture.session import check_session_id

        try:
            check_session_id(session)
            directory = self.store.local_copy(session)
        except ValueError as exc:
            raise InputError(str(exc)) from None
        except OSError as exc:
            raise InputError(
                f"session {session!r}: cannot read it from {self.store.url} ({exc})"
            ) from None
        if directory is None:
            raise InputError(
                f"no session {session!r} in the store {self.store_url} (list_sessions names them)"
            )
        return directory

    def _spec(self, name: str, field: str = "session", *, pyroscope: bool = False) -> str:
        """What the job child is given: a session (its directory when local), or
        ``run:<id>`` checked; never a file path (exporter.usecases.stored_side).
        ``pyroscope``: a Pyroscope selection is a side too (compare, a baseline) when
        Pyroscope is configured; an analysis reads captures."""
        from exporter.usecases import stored_side

        selections = pyroscope and bool(self.settings.pyroscope_url)
        return stored_side(self.store, name, pyroscope=selections, field=field)

    def _context(self) -> Any:
        from exporter.usecases import side_context

        context = side_context(self.settings)
        context.store = self.store_url
        context.shared_dir = self.shared_dir
        return context

    def _captures(self, session: str) -> list[Path]:
        directory = self._session_dir(session)
        paths = find_captures(directory)
        if not paths:
            raise InputError(f"session {session!r}: no XProf captures ({CAPTURES_NAMED}) in it")
        return paths

    def _in_child(self, command: str, inputs: list[str], options: list[str], name: str) -> Any:
        """The JSON file ``name`` that job ``command`` wrote, run bounded."""
        from exporter.pipeline.job import ChildLimits, in_child

        limits = ChildLimits.from_settings(self.settings)
        found = in_child(command, inputs, self._context(), limits, options, read=[name])
        return json.loads(found[name])

    def _stamp(self, spec: str) -> tuple[object, ...] | None:
        """What a cached report depends on: the capture files (or the run's sessions);
        None for what no stamp covers (a Pyroscope selection over a moving window)."""
        if spec.startswith(PYROSCOPE_PREFIX):
            return None
        if spec.startswith(RUN_PREFIX):
            run_id = spec[len(RUN_PREFIX) :].partition("~")[0]
            return tuple(
                (r.id, r.status, tuple(sorted(n for t in r.targets for n in t.files)))
                for r in self.store.run_sessions(run_id)
            )
        path = Path(spec)
        if path.is_dir():
            return tuple(
                (p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in find_captures(path)
            )
        return tuple(sorted(self.store.files(spec).items()))

    def _report(self, name: str, *, xprof: bool, baseline: str | None = None) -> dict[str, Any]:
        """``mlprof analyze --format json``'s report of a session or run, cached by its
        capture files."""
        from exporter.pipeline.job import REPORT_JSON

        spec = self._spec(name)
        base = self._spec(baseline, "baseline", pyroscope=True) if baseline is not None else None
        stamps = (self._stamp(spec), None if base is None else self._stamp(base))
        cached = base is None or stamps[1] is not None  # the baseline's data is known too
        key = (name, xprof, baseline, stamps)
        with self._lock:
            if cached and key in self._reports:
                self._reports.move_to_end(key)
                return self._reports[key]
        options = [f"--shown-as={name}", *([] if xprof else ["--no-xprof"])]
        options += [f"--baseline={base}"] if base is not None else []
        report: dict[str, Any] = self._in_child("analyze", [spec], options, REPORT_JSON)
        if not cached:
            return report
        with self._lock:
            self._reports[key] = report
            while len(self._reports) > CACHED_REPORTS:
                self._reports.popitem(last=False)
        return report

    # -- tools ---------------------------------------------------------------------
    def list_sessions(
        self, run_id: str | None = None, status: str | None = None, limit: int = 50
    ) -> dict[str, Any]:
        """Sessions in the store, newest first, as ``GET /api/v1/sessions`` lists them."""
        from exporter.usecases import list_sessions

        return list_sessions(self.store, run_id=run_id, status=status, limit=limit)

    def list_runs(self) -> dict[str, Any]:
        """The runs the store's sessions belong to: sessions, hosts, first and last."""
        from exporter.usecases import list_runs

        return list_runs(self.store)

    def analyze(self, session: str, baseline: str | None = None, xprof: bool = True) -> Any:
        """``mlprof analyze SESSION --format json`` (with ``--baseline``, ``--no-xprof``)."""
        return self._report(session, xprof=xprof, baseline=baseline)

    def compare(
        self,
        base: str | Sequence[str],
        head: str | Sequence[str],
        kind: str | None = None,
        top: int = 20,
        history: str | Sequence[str] = (),
    ) -> Any:
        """``mlprof compare --base ... --head ... --format json`` (several a side: replicates;
        ``history``: earlier runs of the workload, ``--history``)."""
        from exporter.pipeline.job import COMPARE_JSON

        bases = [base] if isinstance(base, str) else list(base)
        heads = [head] if isinstance(head, str) else list(head)
        earlier = [history] if isinstance(history, str) else list(history)
        options = ["--top", str(top), *(["--kind", kind] if kind else [])]
        options += [f"--base={self._spec(b, 'base', pyroscope=True)}" for b in bases]
        options += [f"--head={self._spec(h, 'head', pyroscope=True)}" for h in heads]
        options += [f"--history={self._spec(e, 'history')}" for e in earlier]
        return self._in_child("compare", [], options, COMPARE_JSON)

    def top_ops(self, session: str, limit: int = 20) -> dict[str, Any]:
        """The report's ``facts.top_ops`` (device self time per XLA op)."""
        facts = self._report(session, xprof=False)["facts"]
        answer: dict[str, Any] = {"session": session, "top_ops": facts["top_ops"][:limit]}
        if "device" in facts["unavailable"]:
            answer["unavailable"] = facts["unavailable"]["device"]
        return answer

    def gpu_kernels(self, session: str, limit: int = 20) -> dict[str, Any]:
        """The report's ``facts.gpu_kernels``: kernels by total time (``limit`` rows, of
        the report's 20), launch configuration and launch overhead."""
        found = dict(self._report(session, xprof=False)["facts"].get("gpu_kernels") or {})
        if "kernels" in found:
            found["kernels"] = found["kernels"][:limit]
        return {"session": session, "gpu_kernels": found}

    def flamegraph_subtree(
        self,
        session: str,
        frames: Sequence[str] = (),
        kind: str | None = None,
        limit: int = 50,
    ) -> dict[str, Any]:
        """The frame at ``frames`` (root-first names) with its children's self/total."""
        from exporter.pipeline.job import SUBTREE_JSON

        spec = self._spec(session)
        if spec.startswith((RUN_PREFIX, PYROSCOPE_PREFIX)):
            raise InputError(f"{session!r}: expected a session id")
        options = ["--frames", json.dumps(list(frames)), "--limit", str(limit)]
        options += ["--kind", kind] if kind else []
        answer = self._in_child("subtree", [spec], options, SUBTREE_JSON)
        return {"session": session, **answer}

    def hosts(self, session: str) -> dict[str, Any]:
        """Per host (capture file): steps, step time and the breakdown of the report."""
        found = self._report(session, xprof=False)["facts"].get("hosts")
        return {"session": session, "hosts": found or [], "source": "facts.hosts"}

    def memory_peak(self, session: str) -> dict[str, Any]:
        """The report's device-memory peak against capacity, and the largest buffers."""
        facts = self._report(session, xprof=True)["facts"]
        answer: dict[str, Any] = {"session": session, "memory": facts.get("memory")}
        if "memory" in facts["unavailable"]:
            answer["unavailable"] = facts["unavailable"]["memory"]
        if facts.get("peak_allocations") is not None:
            answer["peak_allocations"] = facts["peak_allocations"]
        elif importlib.util.find_spec("xprof") is not None:
            try:
                answer["xprof_peak_allocations"] = self.xprof_tool(
                    session, "get_peak_allocations", {"limit": 10}
                )
            except MlprofError as exc:
                answer["xprof_peak_allocations"] = {"error": one_line(exc)}
        return answer

    def xprof_tool(self, session: str, tool: str, arguments: dict[str, Any] | None = None) -> Any:
        """``xprof TOOL <session> --flag=value ...`` on a copy of the session's captures."""
        allowed = XPROF_CLI_TOOLS.get(tool)
        if allowed is None:
            raise InputError(
                f"xprof tool {tool!r}: not allowed; expected one of {', '.join(XPROF_CLI_TOOLS)}"
            )
        flags = [
            f"--{key}={_flag_value(tool, key, value, allowed)}"
            for key, value in (arguments or {}).items()
        ]
        if importlib.util.find_spec("xprof") is None:
            raise ConfigError("XProf is not installed: pip install 'mlprof-exporter[capture]'")
        paths = self._captures(session)
        with tempfile.TemporaryDirectory(prefix="mlprof-mcp-xprof-") as tmp:
            # XProf writes caches beside its input: it gets copies, named as the store's
            # files (it names hosts after them), in a directory named as the session.
            copies = Path(tmp) / session
            copies.mkdir()
            for i, path in enumerate(paths):
                name = path.name if not (copies / path.name).exists() else f"{i}_{path.name}"
                shutil.copyfile(path, copies / name)
            from exporter.config import load_settings
            from exporter.sandbox import run_python

            # Bounded as the report's own XProf child (MLPROF_REPORT_MAX_MEMORY_MB), its
            # limit reserved from the memory budget; stdin is /dev/null, not the client's.
            done = run_python(
                ["-c", XPROF_CLI_MAIN, tool, str(copies), *flags],
                memory_mb=load_settings(None).report_max_memory_mb,
                timeout_s=XPROF_CLI_TIMEOUT_S,
                what=f"xprof {tool}",
                env={
                    "TMPDIR": tmp,  # where XProf spills a large answer: removed with the rest
                    "TF_CPP_MIN_LOG_LEVEL": "3",
                    "GLOG_minloglevel": "3",
                },
                cwd=tmp,
            )
            if done.timed_out:
                raise InputError(f"xprof {tool}: no answer within {XPROF_CLI_TIMEOUT_S:g}s")
            if done.returncode is None:
                raise InputError(f"xprof {tool}: {done.error}")
        if len(done.stdout) > MAX_XPROF_ANSWER_BYTES:
            raise InputError(f"xprof {tool}: answer over {MAX_XPROF_ANSWER_BYTES} bytes; narrow it")
        try:
            answer = json.loads(done.stdout)
        except ValueError:
            answer = None
        if done.returncode != 0 or not isinstance(answer, dict | list):
            if isinstance(answer, dict) and answer.get("status") == "ERROR":
                reason = f"{answer.get('reason')}: {answer.get('error')}"
            else:
                killed = "; killed: out of memory or a signal" if done.killed else ""
                said = done.error[:200] if done.stderr.strip() else ""
                tail = f" ({said}{killed})" if said or killed else ""
                reason = f"exit {done.returncode}{tail}"
            raise InputError(f"xprof {tool}: {reason}")
        if isinstance(answer, dict) and answer.get("status") == "SAVED_TO_FILE":
            raise InputError(f"xprof {tool}: answer over 10 MB; narrow it (e.g. limit=20)")
        return answer

    def capture(
        self,
        duration_ms: int = 2000,
        targets: Sequence[str] = (),
        run_id: str | None = None,
        name: str | None = None,
        captures: int = 1,
    ) -> Any:
        """``mlprof capture --no-wait --json``: ask the sidecar for a trace of targets
        (``captures``: that many captures one after another, each its own replicate)."""
        from exporter.api.client import ApiClient

        if self.api_url is None:
            raise ConfigError("capture: no sidecar URL (mlprof mcp --url or MLPROF_API_URL)")
        body = {
            "targets": list(targets) or None,
            "run_id": run_id,
            "kind": "trace",
            "duration_ms": duration_ms,
            "name": name,
            "captures": captures,
        }
        return ApiClient(self.api_url, self.token).post("/api/v1/captures", body)


def _flag_value(tool: str, key: str, value: Any, allowed: frozenset[str]) -> str:
    if key not in allowed:
        expected = ", ".join(sorted(allowed))
        raise InputError(f"xprof {tool}: argument {key!r} not allowed; expected one of {expected}")
    if isinstance(value, bool | int | float):
        return str(value)
    if isinstance(value, str) and len(value) <= MAX_ARGUMENT_CHARS and "\n" not in value:
        return value
    raise InputError(
        f"xprof {tool}: argument {key}: expected a number, true/false or one line of text"
    )


# -- the MCP server -------------------------------------------------------------------

Session = Annotated[
    str, Field(description="A session id in the store (list_sessions), e.g. my-run-20261201-0830")
]
Input = Annotated[
    str,
    Field(description="A session id in the store, or run:<run id> for all of a run's sessions"),
]
Sides = Annotated[
    str | list[str],
    Field(
        description="A session id, run:<run id> (run:<run id>~N: its N newest sessions), or a "
        "list of them: each capture is a replicate, and their spread is the between-run noise"
    ),
]
Kind = Annotated[
    Literal["device", "host", "memory"] | None,
    Field(description="device time, host time or memory (default: device when present)"),
]
JSON = dict[str, Any]


def build_server(tools: ProfileTools, *, allow_capture: bool = False) -> Any:
    """The MCP server of ``tools``; ``capture`` only when ``allow_capture``."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.types import ToolAnnotations

    from exporter import __version__

    class OneLineServer(MCPServer[Any]):
        """Argument errors in one line too: the SDK's own text is pydantic's, over lines."""

        async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
            try:
                return await super().call_tool(name, arguments, context)
            except ToolError as exc:
                cause = exc.__cause__
                if isinstance(cause, ValidationError):
                    text = "; ".join(
                        f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}"
                        for e in cause.errors()
                    )
                    text = f"tool {name}: {text}"
                else:
                    text = " ".join(line.strip() for line in str(exc).splitlines())
                raise ToolError(text[:MAX_ERROR_CHARS]) from cause

    server = OneLineServer(
        "mlprof",
        version=__version__,
        instructions=(
            "Analyse XProf captures in the mlprof session store: list_sessions, then analyze "
            "a session; follow up with top_ops, gpu_kernels, flamegraph_subtree, hosts, "
            "memory_peak, compare against another session, or xprof (XProf's own CLI tools)."
        ),
        log_level="WARNING",
    )
    read_only = ToolAnnotations(read_only_hint=True, open_world_hint=False)

    def answer(call: Callable[[], T]) -> T:
        try:
            return call()
        except ToolError:
            raise
        except Exception as exc:  # every failure is one line for the model to read
            raise ToolError(one_line(exc)) from None

    @server.tool(annotations=read_only)
    def list_sessions(
        run_id: Annotated[str | None, Field(description="Only sessions of this run")] = None,
        status: Annotated[
            str | None, Field(description="Only this status: done, partial, failed, running")
        ] = None,
        limit: Annotated[int, Field(ge=1, le=10_000)] = 50,
    ) -> JSON:
        """Capture sessions in the store, newest first (the sidecar API's JSON)."""
        return answer(lambda: tools.list_sessions(run_id, status, limit))

    @server.tool(annotations=read_only)
    def list_runs() -> JSON:
        """Runs the store's sessions belong to, with their sessions and hosts."""
        return answer(tools.list_runs)

    @server.tool(annotations=read_only)
    def analyze(
        session: Input,
        baseline: Annotated[
            str | None, Field(description="Also compare against this session or run:<id>")
        ] = None,
        xprof: Annotated[bool, Field(description="Run XProf's converters (slower)")] = True,
    ) -> JSON:
        """The analysis report (`mlprof analyze --format json`): status, facts, findings."""
        return answer(lambda: tools.analyze(session, baseline, xprof))

    @server.tool(annotations=read_only)
    def compare(
        base: Sides,
        head: Sides,
        kind: Kind = None,
        top: Annotated[int, Field(ge=1, le=1000, description="Entries per list")] = 20,
        history: Annotated[
            list[str] | None,
            Field(
                description="Earlier runs of the workload (session ids or run:<id>~N; 3+): "
                "their spread judges the step and each frame"
            ),
        ] = None,
    ) -> JSON:
        """Compare HEAD against BASE (`mlprof compare --format json`): step verdict, regressions."""
        return answer(lambda: tools.compare(base, head, kind, top, history or ()))

    @server.tool(annotations=read_only)
    def top_ops(session: Input, limit: Annotated[int, Field(ge=1, le=1000)] = 20) -> JSON:
        """The XLA ops with the most device self time (the report's facts.top_ops)."""
        return answer(lambda: tools.top_ops(session, limit))

    @server.tool(annotations=read_only)
    def gpu_kernels(session: Input, limit: Annotated[int, Field(ge=1, le=1000)] = 20) -> JSON:
        """GPU kernels by total time with launch configuration, and the device time lost
        waiting for kernel launches (the report's facts.gpu_kernels)."""
        return answer(lambda: tools.gpu_kernels(session, limit))

    @server.tool(annotations=read_only)
    def flamegraph_subtree(
        session: Session,
        frames: Annotated[
            list[str], Field(description="Frame names from the root down; [] for the root")
        ] = [],  # noqa: B006 (the SDK copies defaults per call; the schema shows [])
        kind: Kind = None,
        limit: Annotated[int, Field(ge=1, le=1000, description="Children shown")] = 50,
    ) -> JSON:
        """A flame-graph frame (by its path of names) and its children with self/total."""
        return answer(lambda: tools.flamegraph_subtree(session, frames, kind, limit))

    @server.tool(annotations=read_only)
    def hosts(session: Session) -> JSON:
        """Per host of a session: steps, step time median/p90, device-busy and idle shares."""
        return answer(lambda: tools.hosts(session))

    @server.tool(annotations=read_only)
    def memory_peak(session: Session) -> JSON:
        """Device-memory peak against capacity, and the largest buffers at the peak."""
        return answer(lambda: tools.memory_peak(session))

    @server.tool(annotations=read_only)
    def xprof(
        session: Session,
        tool: Annotated[str, Field(description="One of: " + ", ".join(XPROF_CLI_TOOLS))],
        arguments: Annotated[
            dict[str, str | int | float | bool] | None,
            Field(description='The tool\'s flags without --, e.g. {"limit": 10}'),
        ] = None,
    ) -> JSON:
        """Run one of XProf's CLI tools (`xprof TOOL SESSION`) on a copy of the captures."""
        found = answer(lambda: tools.xprof_tool(session, tool, arguments))
        return found if isinstance(found, dict) else {"result": found}

    if allow_capture:

        @server.tool(annotations=ToolAnnotations(read_only_hint=False, open_world_hint=True))
        def capture(
            duration_ms: Annotated[int, Field(ge=1, le=600_000)] = 2000,
            targets: Annotated[
                list[str], Field(description="Target addresses or hosts; [] for all known")
            ] = [],  # noqa: B006
            run_id: str | None = None,
            name: str | None = None,
            captures: Annotated[
                int,
                Field(
                    ge=1,
                    le=16,
                    description="Captures one after another (replicates of "
                    "the run for a comparison's between-run noise)",
                ),
            ] = 1,
        ) -> JSON:
            """Ask the sidecar for an XProf trace of known targets; answers the new session."""
            return answer(lambda: tools.capture(duration_ms, targets, run_id, name, captures))

    return server

"""Programmatic capture: ``with run.profile("name"):`` (or ``@run.profile("name")``).

Traces the workload itself with ``jax.profiler`` into the capture logdir
(``$MLPROF_CAPTURE_LOGDIR``, default ``<shared_dir>/captures``) as XProf's layout
``plugins/profile/<session_id>/<host>.xplane.pb``, then writes ``session.json`` beside
it; the sidecar moves the session into its store and converts and pushes it like any
other capture. A trace that cannot start (e.g. a remote capture is running) never
breaks training: the session is recorded as failed with the reason.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exporter import schema

if TYPE_CHECKING:
    from exporter.sdk.run import Run

__all__ = ["Profile", "capture_logdir"]

log = logging.getLogger(__name__)

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,80}$")


def capture_logdir(shared_dir: Path) -> Path:
    """Where programmatic (and remote) captures land before the sidecar stores them."""
    configured = os.environ.get(schema.CAPTURE_LOGDIR_ENV)
    return Path(configured) if configured else shared_dir / schema.CAPTURES_DIR


def _iso(moment: float) -> str:
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(moment)) + f".{int(moment % 1 * 1e6):06d}Z"
    )


class Profile(contextlib.ContextDecorator):
    """One programmatic trace; a fresh session each time it is entered."""

    def __init__(
        self,
        run: Run,
        name: str,
        host_tracer_level: int = 2,
        python_tracer_level: int = 0,
    ) -> None:
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or ".." in name:
            raise ValueError(
                f"profile name {name!r}: expected 1-81 characters of A-Z a-z 0-9 . _ -, "
                "starting with a letter or digit, without '..'"
            )
        self.run = run
        self.name = name
        self.host_tracer_level = host_tracer_level
        self.python_tracer_level = python_tracer_level
        self.session_id: str | None = None
        self.session_dir: Path | None = None
        self._record: dict[str, Any] = {}
        self._tracing = False

    def _recreate_cm(self) -> Profile:  # each decorated call is its own session
        return Profile(self.run, self.name, self.host_tracer_level, self.python_tracer_level)

    def __enter__(self) -> Profile:
        import jax.profiler

        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        self.session_id = f"{self.name}-{stamp}-{secrets.token_hex(3)}"
        logdir = capture_logdir(self.run.shared_dir).resolve()
        self.session_dir = logdir / schema.PROFILE_SESSIONS_DIR / self.session_id
        now = time.time()
        self._record = {
            "id": self.session_id,
            "status": "running",
            "kind": "trace",
            "trigger": "programmatic",
            "requester": "sdk",
            "run_id": self.run.run_id,
            "workload": self.run.name,
            "config_fingerprint": self.run.config_fingerprint,
            "name": self.name,
            "created": _iso(now),
            "started": _iso(now),
            "options": {
                "host_tracer_level": self.host_tracer_level,
                "python_tracer_level": self.python_tracer_level,
            },
            "targets": [
                {"address": "local", "host": self.run.host, "run_id": self.run.run_id,
                 "status": "running", "mode": "programmatic", "started": _iso(now)}
            ],
        }  # fmt: skip
        self._write()  # "running" first: the sidecar leaves the session alone until done
        options = jax.profiler.ProfileOptions()
        options.session_id = self.session_id
        options.host_tracer_level = self.host_tracer_level
        options.python_tracer_level = self.python_tracer_level
        try:
            jax.profiler.start_trace(str(logdir), profiler_options=options)
            self._tracing = True
        except RuntimeError as exc:  # e.g. a remote capture holds the profiler now
            log.warning("run.profile(%r): cannot start a trace: %s", self.name, exc)
            self._finish("failed", f"cannot start a trace: {exc}")
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._tracing:
            return
        import jax.profiler

        self._tracing = False
        try:
            jax.profiler.stop_trace()  # type: ignore[no-untyped-call]
        except RuntimeError as error:
            self._finish("failed", f"cannot stop the trace: {error}")
            return
        self._finish("ok", "")

    def _finish(self, status: str, error: str) -> None:
        assert self.session_dir is not None
        files = sorted(
            p.name for p in self.session_dir.glob("*") if p.name != schema.SESSION_FILE
        ) if self.session_dir.is_dir() else []  # fmt: skip
        if status == "ok" and not any(f.endswith(".xplane.pb") for f in files):
            status, error = "failed", "the trace wrote no .xplane.pb"
        now = _iso(time.time())
        target = self._record["targets"][0]
        target.update(status=status, error=error, files=files, finished=now)
        target["bytes"] = sum((self.session_dir / f).stat().st_size for f in files)
        self._record.update(status="done" if status == "ok" else "failed", finished=now)
        self._write()

    def _write(self) -> None:
        assert self.session_dir is not None
        self.session_dir.mkdir(parents=True, exist_ok=True)
        path = self.session_dir / schema.SESSION_FILE
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self._record, indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)  # the sidecar never reads half a record

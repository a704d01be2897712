"""One analysis or comparison in a child process, bounded in time and memory.

The sidecar never analyses a capture in its own process: a capture is written by the
workload (or by anyone with access to the shared directory), and a hostile or simply
huge file must not wedge or crash the sidecar. :func:`run_job` starts
``python -m exporter.analysis.job`` with an address-space limit and a deadline and
reads what it wrote into an output directory.

    python -m exporter.analysis.job analyze INPUT OUT_DIR [--baseline SPEC ...]
    python -m exporter.analysis.job compare BASE HEAD OUT_DIR [--kind K ...]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["JobResult", "run_job"]

REPORT_JSON = "analysis.json"
REPORT_HTML = "summary.html"
COMPARE_JSON = "comparison.json"
COMPARE_HTML = "comparison.html"


@dataclass(frozen=True)
class JobResult:
    """What the child did: ``ok`` and its files, or the one-line error."""

    ok: bool
    error: str = ""
    seconds: float = 0.0


def run_job(
    args: Sequence[str], timeout_s: float, max_memory_mb: int, env: dict[str, str] | None = None
) -> JobResult:
    """Run ``python -m exporter.analysis.job ARGS`` under the limits."""
    import time

    limit = max_memory_mb * 1024 * 1024

    def bound() -> None:  # runs in the child before exec
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    started = time.monotonic()
    child_env = {
        **os.environ,
        **(env or {}),
        # One BLAS thread: each reserves address space and the analysis is not BLAS-bound.
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
    }
    try:
        done = subprocess.run(
            [sys.executable, "-m", "exporter.analysis.job", *args],
            capture_output=True,
            timeout=timeout_s,
            env=child_env,
            check=False,
            preexec_fn=bound if max_memory_mb else None,
        )
    except subprocess.TimeoutExpired:
        return JobResult(False, f"analysis took over {timeout_s:g}s and was stopped")
    seconds = time.monotonic() - started
    if done.returncode == 0:
        return JobResult(True, seconds=seconds)
    lines = done.stderr.decode("utf-8", "replace").strip().splitlines()
    message = next((ln for ln in reversed(lines) if ln.strip()), "")
    if done.returncode < 0 or "MemoryError" in message:
        message = f"analysis stopped (exit {done.returncode}; memory limit {max_memory_mb} MiB?)"
    return JobResult(
        False, message.removeprefix("mlprof: ")[:500] or f"exit {done.returncode}", seconds
    )


def _context(ns: argparse.Namespace) -> Any:
    from exporter.analysis.sides import SideContext

    headers = json.loads(ns.pyroscope_headers) if ns.pyroscope_headers else {}
    return SideContext(
        store=ns.store,
        shared_dir=Path(ns.shared_dir) if ns.shared_dir else None,
        pyroscope_url=ns.pyroscope_url,
        pyroscope_headers=headers,
        time_from=ns.time_from,
        time_until=ns.time_until,
    )


def _write(out: Path, name: str, data: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(data, encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="exporter.analysis.job")
    parser.add_argument("command", choices=["analyze", "compare"])
    parser.add_argument("inputs", nargs="+")
    parser.add_argument("--kind")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--baseline")
    parser.add_argument("--baseline-session")
    parser.add_argument("--baseline-reason", default="given")
    parser.add_argument("--memory-samples")
    parser.add_argument("--links")
    parser.add_argument("--title")
    parser.add_argument("--store")
    parser.add_argument("--shared-dir")
    parser.add_argument("--pyroscope-url")
    parser.add_argument("--pyroscope-headers")
    parser.add_argument("--from", dest="time_from")
    parser.add_argument("--until", dest="time_until")
    parser.add_argument("--no-xprof", action="store_true")
    ns = parser.parse_args(argv)
    from exporter.errors import MlprofError

    try:
        *specs, out_text = ns.inputs
        out = Path(out_text)
        context = _context(ns)
        if ns.command == "analyze":
            from exporter.analysis.render import report_html
            from exporter.analysis.report import analyze

            samples = json.loads(ns.memory_samples) if ns.memory_samples else []
            report = analyze(
                specs[0],
                context,
                baseline=ns.baseline,
                baseline_session=ns.baseline_session,
                baseline_reason=ns.baseline_reason,
                xprof=not ns.no_xprof,
                memory_samples=samples,
            )
            report.links = json.loads(ns.links) if ns.links else {}
            _write(out, REPORT_JSON, json.dumps(report.to_json(), indent=2) + "\n")
            _write(out, REPORT_HTML, report_html(report, ns.title))
        else:
            from exporter.analysis.compare import compare_sides
            from exporter.analysis.render import comparison_html
            from exporter.analysis.sides import load_side

            base = load_side(specs[0], ns.kind, context)
            head = load_side(specs[1], ns.kind or base.kind, context)
            comparison = compare_sides(base, head)
            _write(out, COMPARE_JSON, json.dumps(comparison.to_json(top=ns.top), indent=2) + "\n")
            _write(out, COMPARE_HTML, comparison_html(comparison))
    except (MlprofError, ValueError) as exc:
        print(f"mlprof: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

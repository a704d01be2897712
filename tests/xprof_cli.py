"""XProf's own agent CLI (``xprof get_step_trace FILE`` ...), the reference of the
differential tests. It is installed with the project (the ``xprof`` dependency): a
missing CLI fails the test that needs it, never skips it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

XPROF = Path(sys.executable).parent / "xprof"
XPROF_ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "GLOG_minloglevel": "3"}


def require_xprof() -> Path:
    """The CLI's path; fails (it ships with the project's own dependencies)."""
    assert XPROF.exists(), f"XProf's CLI is not installed at {XPROF} (pip install -e '.[dev]')"
    return XPROF


def xprof_cli(tool: str, target: Path, where: Path, *flags: str) -> dict[str, Any]:
    """XProf's JSON answer for ``tool`` on a copy of ``target`` (a capture or a session
    folder): XProf writes caches beside its input, so it gets its own directory."""
    return xprof_run(tool, target, where, *flags)[0]


def xprof_run(tool: str, target: Path, where: Path, *flags: str) -> tuple[dict[str, Any], str]:
    """``xprof_cli``'s answer and XProf's log (stderr), for a failure message to quote.

    XProf memoises its tools' answers for 24 h in ``$TMPDIR/xprof_cli_cache_<user>``,
    keyed by the files' names and contents, not their paths: a copy elsewhere, another
    test run of identical files, or another user of the machine gets the stored answer
    (``__cached__``), whatever it was. Each call gets its own TMPDIR, so the answer is
    computed from these files now, and a second call is a second computation.
    """
    cli = require_xprof()
    folder = where / f"cli-{tool}"
    folder.mkdir(parents=True, exist_ok=True)
    copy = folder / target.name
    if target.is_dir():
        shutil.copytree(target, copy, dirs_exist_ok=True)
    else:
        shutil.copyfile(target, copy)
    cache = folder / "xprof-tmp"
    cache.mkdir(exist_ok=True)
    done = subprocess.run(
        [str(cli), tool, f"--session_id={copy}", *flags],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=folder,
        env={**XPROF_ENV, "TMPDIR": str(cache)},
        check=False,
    )
    out = done.stdout
    assert "{" in out, (done.returncode, out[-2000:], done.stderr[-2000:])
    answer: dict[str, Any] = json.loads(out[out.index("{") :])
    assert not answer.get("__cached__"), f"XProf answered from a cache: {cache}"
    return answer, done.stderr

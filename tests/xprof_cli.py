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
    cli = require_xprof()
    folder = where / f"cli-{tool}"
    folder.mkdir(parents=True, exist_ok=True)
    copy = folder / target.name
    if target.is_dir():
        shutil.copytree(target, copy, dirs_exist_ok=True)
    else:
        shutil.copyfile(target, copy)
    done = subprocess.run(
        [str(cli), tool, f"--session_id={copy}", *flags],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=folder,
        env=XPROF_ENV,
        check=False,
    )
    out = done.stdout
    assert "{" in out, (done.returncode, out[-2000:], done.stderr[-2000:])
    answer: dict[str, Any] = json.loads(out[out.index("{") :])
    return answer

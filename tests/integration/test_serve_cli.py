"""`mlprof serve` as an operator meets it: restarts, bad directories, tokens from secrets."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.harness import Proc, free_port, wait_http

pytestmark = pytest.mark.integration


def _serve(tmp: Path, port: int, name: str, **env: str) -> Proc:
    base = {
        "MLPROF_LISTEN": f"127.0.0.1:{port}",
        "MLPROF_SHARED_DIR": str(tmp / "shared"),
        "MLPROF_STORE": str(tmp / "store"),
    }
    return Proc.python(["-m", "exporter.cli", "serve"], tmp / f"{name}.log", env={**base, **env})


def test_restart_on_the_same_port_right_away(tmp_path: Path) -> None:
    port = free_port()
    first = _serve(tmp_path, port, "first")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/healthz")
        for _ in range(5):  # connections the server closes leave TIME_WAIT sockets behind
            httpx.get(f"{url}/metrics", headers={"Connection": "close"}, timeout=5)
    finally:
        first.stop()
    second = _serve(tmp_path, port, "second")
    try:
        wait_http(f"{url}/healthz")
        assert second.alive(), second.output()
    finally:
        second.stop()


def test_unusable_shared_dir_is_one_line_and_exit_2(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = subprocess.run(
        [sys.executable, "-m", "exporter.cli", "serve"],
        env={
            "MLPROF_LISTEN": f"127.0.0.1:{free_port()}",
            "MLPROF_SHARED_DIR": str(blocker / "shared"),
            "PATH": "/usr/bin:/bin",
        },
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"mlprof: MLPROF_SHARED_DIR={blocker / 'shared'}: cannot create it (Not a directory)"
    ]


def test_token_from_a_secret_file_with_a_newline_works(tmp_path: Path) -> None:
    port = free_port()
    proc = _serve(tmp_path, port, "token", MLPROF_AUTH_TOKEN="s3cret\n")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/healthz")
        assert httpx.get(f"{url}/metrics").status_code == 401
        assert httpx.get(f"{url}/metrics", headers={"Authorization": "Bearer s3cret"}).is_success
        # The capture page behind a TLS proxy: https origin, same host, not refused.
        same_site = httpx.post(
            f"{url}/api/v1/captures",
            json={"run_id": "none"},
            headers={
                "Authorization": "Bearer s3cret",
                "Origin": f"https://127.0.0.1:{port}",
            },
        )
        assert same_site.status_code == 422  # reached the API: no such run
        page = httpx.get(f"{url}/ui/capture")
        assert page.headers["x-frame-options"] == "DENY"
    finally:
        proc.stop()

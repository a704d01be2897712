"""The capture page Grafana links to, clicked in headless Chromium against a real sidecar
and a real JAX workload; and the sidecar refusing cross-site writes."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

import httpx
import pytest

from tests.harness import Proc, free_port, wait_http, wait_until

if TYPE_CHECKING:
    from playwright.sync_api import Browser

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    tmp = tmp_path_factory.mktemp("ui")
    shared = tmp / "shared"
    port, profiler = free_port(), free_port()
    env = {
        "MLPROF_LISTEN": f"127.0.0.1:{port}",
        "MLPROF_SHARED_DIR": str(shared),
        "MLPROF_STORE": str(tmp / "store"),
        "MLPROF_COLLECT_INTERVAL_S": "0.5",
    }
    # The demo's input knob slows each step (as in test_capture.py): a small capture that
    # ends in seconds, and cores left to the sidecar and the browser.
    shared.mkdir(parents=True)
    (shared / "demo-input-delay").write_text("0.05")
    workload = Proc.python(
        ["-m", "exporter.demo.workload", "--shared-dir", str(shared), "--profiler-port",
         str(profiler), "--batch", "32", "--features", "32", "--hidden", "64"],
        tmp / "workload.log", env=env,
    )  # fmt: skip
    sidecar = Proc.python(["-m", "exporter.cli", "serve"], tmp / "sidecar.log", env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/healthz", timeout=60)
        run = wait_until(
            lambda: json.loads((shared / "run.json").read_text()), timeout=60, what="run.json"
        )
        wait_until(
            lambda: httpx.get(f"{url}/api/v1/targets", timeout=5).json()["targets"],
            timeout=60,
            what="the local workload to be discovered as a profiler target",
        )
        yield url, run
    finally:
        workload.stop()
        sidecar.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One headless Chromium for the module's pages (a launch costs seconds on a busy
    2-core machine); each test opens its own page, in a context of its own."""
    from playwright.sync_api import sync_playwright

    path = shutil.which("chromium")
    assert path, "Debian 'chromium' is required (apt-get install chromium)"
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(
            executable_path=path,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        try:
            yield chromium
        finally:
            chromium.close()


def test_capture_page_starts_a_capture_and_follows_it(
    stack: tuple[str, dict[str, str]], browser: Browser, tmp_path: Path
) -> None:
    url, run = stack
    page_url = f"{url}/ui/capture?run_id={quote(run['run_id'])}&host={quote(run['host'])}"
    page = browser.new_page()
    try:
        page.goto(page_url)
        assert page.input_value("#run_id") == run["run_id"]  # prefilled from the link
        assert page.input_value("#hosts") == run["host"]
        assert not page.is_visible("#token")  # no token configured on loopback
        page.fill("#duration_ms", "500")
        page.click("#submit")
        page.wait_for_function("document.body.dataset.status", timeout=60_000)
        status = page.evaluate("document.body.dataset.status")
        session = page.evaluate("document.body.dataset.session")
        text = page.inner_text("#status")
        page.screenshot(path=str(tmp_path / "capture.png"))
    finally:
        page.close()
    assert status == "done", text
    assert f"session {session}: done" in text and run["host"] in text
    record = httpx.get(f"{url}/api/v1/captures/{session}", timeout=5).json()
    assert record["status"] == "done" and record["run_id"] == run["run_id"]
    assert record["targets"][0]["files"], "the capture wrote no file"


def test_capture_page_shows_a_refusal(stack: tuple[str, dict[str, str]], browser: Browser) -> None:
    url, _ = stack
    page = browser.new_page()
    try:
        page.goto(f"{url}/ui/capture?run_id=no-such-run")
        page.click("#submit")
        page.wait_for_function("document.body.dataset.status", timeout=30_000)
        text = page.inner_text("#status")
    finally:
        page.close()
    assert "refused (422)" in text and "no-such-run" in text


def test_page_values_cannot_inject_markup(stack: tuple[str, dict[str, str]]) -> None:
    url, _ = stack
    evil = '</script><script>alert(1)</script>"&<b>'
    html = httpx.get(f"{url}/ui/capture", params={"run_id": evil}, timeout=5).text
    assert "<script>alert(1)" not in html and "<b>" not in html
    blob = html.split('type="application/json">', 1)[1].split("</script>", 1)[0]
    assert json.loads(blob)["run_id"] == evil


def test_cross_site_writes_are_refused(stack: tuple[str, dict[str, str]]) -> None:
    url, run = stack
    body = {"run_id": run["run_id"], "duration_ms": 100}
    foreign = httpx.post(
        f"{url}/api/v1/captures", json=body, headers={"Origin": "https://evil.example"}, timeout=5
    )
    assert foreign.status_code == 403 and "cross-origin" in foreign.json()["detail"]
    hook = httpx.post(
        f"{url}/api/v1/alertmanager", content=b"{}", headers={"Origin": "null"}, timeout=5
    )
    assert hook.status_code == 403
    # Reads and same-origin writes are unaffected.
    assert httpx.get(f"{url}/metrics", headers={"Origin": "https://evil.example"}).is_success
    same = httpx.post(f"{url}/api/v1/captures", json={"run_id": "none"}, headers={"Origin": url})
    assert same.status_code == 422

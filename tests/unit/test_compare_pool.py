"""/api/v1/compare runs a bounded number of children; beyond its queue it answers 429."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import httpx
import pytest

from exporter.api.admission import AdmissionPool
from exporter.api.analysis import COMPARE_QUEUE, COMPARE_WORKERS
from exporter.api.app import create_app
from exporter.pipeline.job import JobResult, last_message
from exporter.sidecar import Sidecar
from tests.sidecar_app import settings_in


def test_compares_beyond_the_pool_and_its_queue_are_refused_with_retry_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 45 compares hung on a FIFO ran 40 children at once. Now COMPARE_WORKERS run,
    # COMPARE_QUEUE wait, and the rest get 429 at once with Retry-After.
    release = threading.Event()
    lock = threading.Lock()
    running = [0, 0]  # now, most at once

    def blocking_job(
        args: list[str], timeout_s: float, max_memory_mb: int, **_: object
    ) -> JobResult:
        with lock:
            running[0] += 1
            running[1] = max(running[1], running[0])
        release.wait(30)
        with lock:
            running[0] -= 1
        return JobResult(False, "mlprof-test: no sides")

    monkeypatch.setattr("exporter.pipeline.job.run_job", blocking_job)
    settings = settings_in(tmp_path)
    app = create_app(Sidecar(settings))
    total = COMPARE_WORKERS + COMPARE_QUEUE + 3

    async def scenario() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url=f"http://{settings.listen}"
        ) as client:
            params = {"base": "run:a", "head": "run:b"}
            tasks = [
                asyncio.create_task(client.get("/api/v1/compare", params=params))
                for _ in range(total)
            ]
            # Waits for states, never for a time: the admitted compares reach their
            # child on the pool's threads, which a loaded machine starts late. The
            # deadline only turns a hang into a failure.
            deadline = time.monotonic() + 120
            while getattr(app.state, "compare_pool", None) is None or (
                app.state.compare_pool.refused < total - COMPARE_WORKERS - COMPARE_QUEUE
                or running[0] < COMPARE_WORKERS
            ):
                assert time.monotonic() < deadline, "the extra compares were not refused"
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)  # a queued compare that wrongly ran would show now
            assert running[0] == COMPARE_WORKERS  # the queued ones wait for a worker
            release.set()
            return list(await asyncio.gather(*tasks))

    answers = asyncio.run(scenario())
    refused = [r for r in answers if r.status_code == 429]
    assert len(refused) == 3
    assert all(r.headers["retry-after"] == "10" for r in refused)
    assert "comparisons are running" in refused[0].json()["detail"]
    assert [r.status_code for r in answers].count(422) == COMPARE_WORKERS + COMPARE_QUEUE
    assert running[1] == COMPARE_WORKERS
    assert app.state.compare_pool.admitted == 0


def test_the_pool_runs_at_most_its_workers() -> None:
    pool = AdmissionPool(workers=1, queue=1)
    assert pool.admit() and pool.admit() and not pool.admit()
    pool.release()
    assert pool.admit()
    assert pool.run(lambda: 7) == 7


def test_a_childs_error_is_its_last_real_line() -> None:
    # The child's stderr after an OOM-killed finaliser: the message, not the noise.
    noisy = (
        "Traceback (most recent call last):\n"
        '  File "x.py", line 3, in <module>\n'
        "    main()\n"
        "ValueError: base: run 'r1' has no captures\n"
        "Exception ignored in: <function _TemporaryFileCloser.__del__ at 0x7f>\n"
        "Traceback (most recent call last):\n"
        '  File "tempfile.py", line 450, in __del__\n'
        "OSError: [Errno 12] Cannot allocate memory\n"
    )
    assert last_message(noisy) == "ValueError: base: run 'r1' has no captures"
    assert last_message("mlprof: base: bad side\nException ignored in: <x>\n") == (
        "mlprof: base: bad side"
    )

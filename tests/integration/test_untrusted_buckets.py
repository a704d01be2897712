"""A bucket's objects are untrusted input too (issue 35), on fake-gcs-server and moto.

The paths that differ from a local store: ranged reads (``cat_file`` with an end) bound
what is fetched of an object, a session is copied object by object, and fake-gcs-server
maps a key ``a/../b`` to directory ``b``, so a record whose id is not its directory's
needs no attacker. Servers as in :mod:`tests.integration.test_object_stores`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from exporter.analysis.sides.baselines import BaselineStore
from exporter.capture.session import SessionRecord, TargetResult
from exporter.capture.store import MAX_MARK_BYTES, SessionStore
from exporter.capture.watcher import SessionWatcher
from exporter.cli import main
from exporter.testing.synthetic import write_tpu_capture
from tests.integration.test_object_stores import BUCKET, emulators  # noqa: F401 (fixture)

pytestmark = pytest.mark.integration

CAPTURE = "host-a_9999.xplane.pb"


def _clear_client_caches() -> None:
    import gcsfs  # type: ignore[import-untyped]
    import s3fs  # type: ignore[import-untyped]

    gcsfs.GCSFileSystem.clear_instance_cache()
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture(scope="module", autouse=True)
def _fresh_clients() -> Iterator[None]:
    """fsspec keeps one client per set of arguments, the emulator's address not among
    them: a client of an earlier module's (stopped) emulator must not be reused."""
    _clear_client_caches()
    yield
    _clear_client_caches()


@pytest.fixture(params=["gs", "s3"])
def store(request: pytest.FixtureRequest, emulators: dict[str, object]) -> SessionStore:  # noqa: F811
    return SessionStore(f"{request.param}://{BUCKET}/{uuid.uuid4().hex[:12]}/store")


def _record(session_id: str, **extra: object) -> SessionRecord:
    fields: dict[str, object] = {
        "id": session_id,
        "status": "done",
        "run_id": "r1",
        "targets": [TargetResult(address="h:1", host="host-a", status="ok", files=[CAPTURE])],
    }
    return SessionRecord.model_validate(fields | extra)


def _put(store: SessionStore, key: str, data: bytes) -> None:
    store.fs.pipe_file(f"{store.root}/{key}", data)


def test_a_forged_record_in_a_bucket_overwrites_no_other_session(
    store: SessionStore, tmp_path: Path
) -> None:
    store.write_record(_record("base-1"))
    forged = _record("base-1", status="running", run_id="attacker-run", targets=[])
    _put(store, "plugins/profile/zz-orphan/session.json", forged.model_dump_json().encode())
    bad = _record("x", status="running").model_dump(mode="json") | {"id": "../../baselines/x"}
    _put(store, "plugins/profile/aa-badid/session.json", json.dumps(bad).encode())
    watcher = SessionWatcher(store, tmp_path / "logdir")
    handed: list[str] = []
    watcher.on_complete.append(lambda record: handed.append(record.id))

    states = [watcher.poll()[0] for _ in range(2)]

    kept = store.read_record("base-1")
    assert kept is not None and kept.status == "done" and kept.run_id == "r1"
    assert states == ["ok", "ok"] and handed == ["base-1"]
    assert store.refused["id_mismatch"] == 2  # each once, however often read


def test_objects_past_their_bound_are_fetched_no_further(store: SessionStore) -> None:
    store.write_record(_record("s1", workload="trainer"))
    marks = BaselineStore(store)
    _put(store, "baselines/trainer.json", b"[" * 100_000 + b"]" * 100_000)
    _put(store, "baselines/other.json", b'{"session_id": "s1", "pad": "' + b"x" * MAX_MARK_BYTES)
    record = _record("s2").model_dump(mode="json") | {"pad": "y" * (5 << 20)}
    _put(store, "plugins/profile/s2/session.json", json.dumps(record).encode())

    assert marks.get("trainer") is None and marks.get("other") is None
    assert store.read_record("s2") is None
    assert store.refused["too_large"] == 3


def test_the_cli_copies_only_what_it_reads_from_a_bucket(
    store: SessionStore, tmp_path: Path
) -> None:
    """A 1 GiB junk.bin beside the capture was downloaded too (1,005 MiB in TMPDIR)."""
    write_tpu_capture(tmp_path / CAPTURE, devices=1, steps=3)
    store.import_file("s1", tmp_path / CAPTURE)
    store.write_record(_record("s1"))
    _put(store, "plugins/profile/s1/junk.bin", b"\0" * (4 << 20))

    copy = store.local_copy("s1")
    result = CliRunner().invoke(main, ["analyze", "s1", "--store", store.url, "--no-xprof"])

    assert copy is not None
    assert sorted(p.name for p in copy.iterdir()) == [CAPTURE, "session.json"]
    assert result.exit_code == 0, result.output

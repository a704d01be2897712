"""Which runs are the same workload: the run's name and its configuration's fingerprint.

Every producer of session records fills ``config_fingerprint`` the way it fills
``workload``: the SDK (run.json, trace and memory identities, ``run.profile()``
sessions), the target discovery and the capture engine, the programmatic-session
watcher and the torch.profiler watcher. A workload-written fingerprint is hostile input:
taken only when it is 1-64 of [0-9a-f], else computed from the file's configs, else
unknown. Real SDK runs (JAX on CPU), real watchers and a real store throughout.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from exporter import schema, sdk
from exporter.analysis.sides.baselines import BaselineStore
from exporter.capture.engine import CaptureEngine, CaptureLimits, CaptureRequest
from exporter.capture.fingerprints import checked_fingerprint, fingerprint_of
from exporter.capture.session import SessionRecord
from exporter.capture.store import SessionStore
from exporter.capture.targets import (
    LocalRunDiscovery,
    ProfilerTarget,
    StaticDiscovery,
    TargetRegistry,
)
from exporter.capture.watcher import SessionWatcher
from exporter.pipeline.torch_watcher import TorchTraceWatcher
from tests import kineto_traces as kt
from tests.harness import free_port

CONFIGS = {"model": "lm-small", "lr": 3e-4, "layers": [4, 4], "mesh": {"data": 2}}
JUNK: list[object] = [
    "../../etc/passwd",
    "ABCDEF0123456789",  # upper case: not what the SDK writes
    "a" * 65,
    "",
    "12 34",
    "0123456789abcdef\n",
    7,
    None,
    ["0123456789abcdef"],
    {"x": 1},
]


@pytest.fixture(autouse=True)
def _default_logdir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(schema.CAPTURE_LOGDIR_ENV, raising=False)


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


# -- the check itself -------------------------------------------------------------


@pytest.mark.parametrize("value", JUNK)
def test_a_fingerprint_that_is_not_one_is_unknown(value: object) -> None:
    assert checked_fingerprint(value) is None
    # ... and the file's configs speak instead, as for an SDK that wrote none.
    assert fingerprint_of({"config_fingerprint": value, "configs": CONFIGS}) == (
        schema.config_fingerprint(CONFIGS)
    )
    assert fingerprint_of({"config_fingerprint": value}) is None


@pytest.mark.parametrize("configs", ["lr=3e-4", [1, 2], 5, None])
def test_configs_that_are_not_an_object_give_no_fingerprint(configs: object) -> None:
    assert fingerprint_of({"configs": configs}) is None


def test_a_well_formed_fingerprint_is_taken_as_written() -> None:
    assert checked_fingerprint("0" * 64) == "0" * 64
    assert fingerprint_of({"config_fingerprint": "abc123", "configs": CONFIGS}) == "abc123"


# -- the SDK ----------------------------------------------------------------------


def test_the_sdk_writes_the_fingerprint_of_its_configs_into_every_run_file(
    tmp_path: Path,
) -> None:
    # Before: run.json had configs but no fingerprint.
    with sdk.run("trainer", shared_dir=tmp_path, configs=CONFIGS, host="h") as run:
        expected = schema.config_fingerprint(CONFIGS)
        assert run.config_fingerprint == expected
        files = [tmp_path / schema.RUN_FILE, *(tmp_path / schema.RUNS_DIR).iterdir()]
        files += (tmp_path / schema.PROCS_DIR).iterdir()
        assert [_json(p)["config_fingerprint"] for p in files] == [expected] * 3
    # The step lines stay as they were: the identity there is run, workload and host.
    (log,) = (tmp_path / schema.STEPS_DIR).iterdir()
    assert "config_fingerprint" not in log.read_text()


def test_configs_json_cannot_sort_or_hold_still_fingerprint_as_run_json_holds_them(
    tmp_path: Path,
) -> None:
    """Keys of mixed types, a tuple, a Path: the SDK neither crashes nor disagrees with
    a sidecar that computes the fingerprint from run.json (an SDK without the field)."""
    odd = {1: "one", "b": (1, 2), "out": Path("/data/x"), 2.5: {"nested": None}}
    with sdk.run("trainer", shared_dir=tmp_path, configs=odd, host="h") as run:
        info = _json(tmp_path / schema.RUN_FILE)
        written = info.pop("config_fingerprint")
        assert written == run.config_fingerprint == fingerprint_of(info)
        assert checked_fingerprint(written) == written


def test_a_run_without_configs_has_the_fingerprint_of_none_given(tmp_path: Path) -> None:
    with sdk.run("a", shared_dir=tmp_path / "a", host="h") as first:
        pass
    with sdk.run("a", shared_dir=tmp_path / "b", host="h", configs={}) as second:
        pass
    assert first.config_fingerprint == second.config_fingerprint == schema.config_fingerprint({})


def test_memory_profile_identities_carry_the_fingerprint(tmp_path: Path) -> None:
    with sdk.run("trainer", shared_dir=tmp_path, configs=CONFIGS, host="h") as run:
        path = run.memory_profile()
    meta = path.with_name(path.name.removesuffix(schema.MEMORY_PROFILE_SUFFIX))
    meta = meta.with_name(meta.name + schema.MEMORY_META_SUFFIX)
    identity = _json(meta)
    assert (identity["workload"], identity["config_fingerprint"]) == (
        "trainer",
        schema.config_fingerprint(CONFIGS),
    )


# -- programmatic sessions: the SDK writes, the watcher imports ------------------


def _profiled(shared: Path, name: str, configs: dict[str, Any]) -> None:
    """One run of ``name`` tracing itself once (``run.profile``): one finished session."""
    import jax.numpy as jnp

    with (
        sdk.run(name, shared_dir=shared, configs=configs, host="h") as run,
        run.profile("step"),
    ):
        jnp.ones(8).block_until_ready()


def test_a_programmatic_session_is_recorded_with_its_runs_fingerprint(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    store = SessionStore(tmp_path / "store")
    _profiled(shared, "trainer", CONFIGS)
    SessionWatcher(store, shared / schema.CAPTURES_DIR).poll()
    (record,) = store.records()
    assert (record.status, record.workload) == ("done", "trainer")
    assert record.config_fingerprint == schema.config_fingerprint(CONFIGS)


@pytest.mark.parametrize("value", ["../../x", "f" * 65, "0123456789ABCDEF", 5, ["ab"], {}])
def test_a_programmatic_record_with_a_forged_fingerprint_is_imported_without_it(
    tmp_path: Path, value: object
) -> None:
    logdir = tmp_path / "logdir"
    directory = logdir / "plugins" / "profile" / "s1"
    directory.mkdir(parents=True)
    (directory / "vm.xplane.pb").write_bytes(b"\x0a\x00" * 50)
    forged = SessionRecord(id="s1", status="done", workload="trainer").model_dump(mode="json")
    # Not a string either: only the fingerprint is lost, never the session.
    (directory / "session.json").write_text(json.dumps(forged | {"config_fingerprint": value}))
    store = SessionStore(tmp_path / "store")
    SessionWatcher(store, logdir).poll()
    record = store.read_record("s1")
    assert record is not None and record.workload == "trainer"
    assert record.config_fingerprint is None


def test_runs_of_another_configuration_are_not_each_others_history(tmp_path: Path) -> None:
    """Issue 29 item 3: the same run name with other configs is another workload. Before,
    no producer wrote a fingerprint: every session matched every other of its name."""
    shared = tmp_path / "shared"
    store = SessionStore(tmp_path / "store")
    watcher = SessionWatcher(store, shared / schema.CAPTURES_DIR)
    other = CONFIGS | {"lr": 1e-3}
    for configs in (CONFIGS, other, CONFIGS, other, CONFIGS, other):
        _profiled(shared, "trainer", configs)
        watcher.poll()
    _profiled(shared, "trainer", CONFIGS)  # today's run
    watcher.poll()
    by_time = sorted(store.records(), key=lambda r: r.created)
    assert len(by_time) == 7 and {r.workload for r in by_time} == {"trainer"}
    *earlier, today = by_time
    baselines = BaselineStore(store)
    same = [r.id for r in reversed(earlier) if r.config_fingerprint == today.config_fingerprint]
    assert len(same) == 3
    assert baselines.history_sessions(today) == same
    # The latest run of the other configuration has its own history: the other two.
    last_other = earlier[-1]
    assert last_other.config_fingerprint == schema.config_fingerprint(other)
    assert baselines.history_sessions(last_other) == [earlier[3].id, earlier[1].id]


# -- targets and the capture engine ------------------------------------------------


def _run_file(shared: Path, run_id: str, port: int, pid: int, **extra: Any) -> None:
    info = {"run_id": run_id, "name": "trainer", "host": "h", "pid": pid,
            "profiler_port": port, "start_unix": 1000.0 + pid} | extra  # fmt: skip
    (shared / schema.RUNS_DIR).mkdir(parents=True, exist_ok=True)
    (shared / schema.RUNS_DIR / f"{run_id}.json").write_text(json.dumps(info))
    (shared / schema.STEPS_DIR).mkdir(exist_ok=True)
    (shared / schema.STEPS_DIR / f"h-{pid}{schema.STEP_LOG_SUFFIX}").touch()  # heartbeat


def test_local_targets_carry_their_runs_fingerprint(tmp_path: Path) -> None:
    fingerprint = schema.config_fingerprint(CONFIGS)
    _run_file(tmp_path, "new-sdk", 9101, 1, configs=CONFIGS, config_fingerprint=fingerprint)
    _run_file(tmp_path, "old-sdk", 9102, 2, configs=CONFIGS)  # computed from its configs
    _run_file(tmp_path, "forged", 9103, 3, configs=CONFIGS, config_fingerprint="../x")
    _run_file(tmp_path, "forged-bare", 9104, 4, config_fingerprint="X" * 100)
    _run_file(tmp_path, "no-configs", 9105, 5)
    found = {t.run_id: t.config_fingerprint for t in LocalRunDiscovery(tmp_path).discover()}
    assert found == {
        "new-sdk": fingerprint,
        "old-sdk": fingerprint,
        "forged": fingerprint,
        "forged-bare": None,
        "no-configs": None,
    }


def test_a_target_found_twice_keeps_the_runs_fingerprint_and_loses_it_with_the_run(
    tmp_path: Path,
) -> None:
    _run_file(tmp_path, "r1", 9123, 1, configs=CONFIGS)
    registry = TargetRegistry([StaticDiscovery(["127.0.0.1:9123"]), LocalRunDiscovery(tmp_path)])
    registry.refresh(check=False)
    (target,) = registry.known()
    assert (target.source, target.workload, target.config_fingerprint) == (
        "static+local",
        "trainer",
        schema.config_fingerprint(CONFIGS),
    )
    assert registry.describe()[0]["config_fingerprint"] == target.config_fingerprint
    _run_file(tmp_path, "r1", 9123, 1, configs=CONFIGS, ended_unix=2000.0)
    (now,) = registry.current([target])  # no live run owns the port: whose it is, unknown
    assert (now.run_id, now.workload, now.config_fingerprint) == (None, None, None)


def _target(fingerprint: str | None) -> ProfilerTarget:
    # Nobody listens there: the capture ends at once as "unreachable", no profiler needed.
    return ProfilerTarget(f"127.0.0.1:{free_port()}", "h", "r1", "local", None, "trainer",
                          fingerprint)  # fmt: skip


@pytest.mark.parametrize(
    ("fingerprints", "expected"),
    [(["abc", "abc"], "abc"), (["abc", "def"], None), (["abc", None], None), ([None], None)],
)
def test_a_capture_session_has_the_fingerprint_its_targets_agree_on(
    tmp_path: Path, fingerprints: list[str | None], expected: str | None
) -> None:
    store = SessionStore(f"memory://identity-{time.monotonic_ns()}")
    engine = CaptureEngine(store, tmp_path, CaptureLimits(timeout_s=1))
    try:
        submitted = engine.submit(
            CaptureRequest(duration_ms=100), [_target(f) for f in fingerprints]
        )
        assert (submitted.workload, submitted.config_fingerprint) == ("trainer", expected)
        record = engine.wait(submitted.id, timeout=60)
        assert record is not None and record.config_fingerprint == expected
    finally:
        engine.close()


# -- torch.profiler traces ------------------------------------------------------------


class StandInProfiler:
    """What Kineto's export writes (the real torch.profiler: tests/integration)."""

    def export_chrome_trace(self, path: str) -> None:
        Path(path).write_text(json.dumps(kt.document(kt.training_step(1, 0.0, 1))))


def _take_traces(shared: Path, store: SessionStore) -> list[SessionRecord]:
    seen: list[SessionRecord] = []
    watcher = TorchTraceWatcher(shared, store, [seen.append], clock=lambda: time.time() + 3600)
    watcher.poll()
    watcher.poll()  # a trace without identity is taken once it stopped changing
    return seen


def test_an_sdk_torch_trace_is_recorded_with_its_runs_fingerprint(tmp_path: Path) -> None:
    shared, store = tmp_path / "shared", SessionStore(tmp_path / "store")
    with sdk.run("trainer", shared_dir=shared, configs=CONFIGS, host="h") as run:
        assert run.torch_trace_handler("train")(StandInProfiler()) is not None
    (record,) = _take_traces(shared, store)
    assert (record.workload, record.config_fingerprint) == (
        "trainer",
        schema.config_fingerprint(CONFIGS),
    )


def _trace(shared: Path, stem: str, identity: dict[str, Any] | None) -> None:
    directory = shared / schema.TORCH_TRACES_DIR
    directory.mkdir(parents=True, exist_ok=True)
    kt.write(directory / f"{stem}.pt.trace.json", kt.training_step(1, 0.0, 1))
    if identity is not None:
        (directory / f"{stem}.json").write_text(json.dumps(identity))


@pytest.mark.parametrize(
    ("identity", "run_json", "expected"),
    [
        # tensorboard_trace_handler: no identity, the shared dir's run names it.
        (None, {"run_id": "r1", "name": "w", "configs": CONFIGS}, "configs"),
        (None, {"run_id": "r1", "name": "w", "config_fingerprint": "abc"}, "abc"),
        (None, {"run_id": "r1", "name": "w", "config_fingerprint": "../x"}, None),
        # An SDK identity from before the field: run.json of the same run speaks.
        ({"run_id": "r1", "workload": "w"}, {"run_id": "r1", "configs": CONFIGS}, "configs"),
        ({"run_id": "r1", "workload": "w"}, {"run_id": "r2", "configs": CONFIGS}, None),
        # The identity's own, when well formed; a forged one is not replaced by a guess.
        ({"run_id": "r1", "workload": "w", "config_fingerprint": "abc"}, None, "abc"),
        ({"run_id": "r1", "workload": "w", "config_fingerprint": 5}, None, None),
        ({"run_id": "r1", "workload": "w", "config_fingerprint": "A" * 99}, None, None),
    ],
)
def test_a_torch_trace_takes_a_well_formed_fingerprint_or_none(
    tmp_path: Path,
    identity: dict[str, Any] | None,
    run_json: dict[str, Any] | None,
    expected: str | None,
) -> None:
    shared, store = tmp_path / "shared", SessionStore(tmp_path / "store")
    _trace(shared, "t-1", identity)
    if run_json is not None:
        (shared / schema.RUN_FILE).write_text(json.dumps(run_json))
    (record,) = _take_traces(shared, store)
    want = schema.config_fingerprint(CONFIGS) if expected == "configs" else expected
    assert record.workload == "w" and record.config_fingerprint == want
    stored = store.read_record(record.id)
    assert stored is not None and stored.config_fingerprint == want


def test_the_fingerprint_of_mixed_keys_is_that_of_their_json() -> None:
    """Keys of several types (1 and "a") cannot be sorted: the configs are hashed as
    run.json holds them (keys as strings), not refused with a TypeError."""
    assert schema.config_fingerprint({1: 2, "a": 3}) == schema.config_fingerprint({"1": 2, "a": 3})
    assert schema.config_fingerprint({"a": (1, 2)}) == schema.config_fingerprint({"a": [1, 2]})


def test_sessions_named_only_by_their_run_file_keep_to_its_configuration(
    tmp_path: Path,
) -> None:
    """A target found by DNS, k8s or a static list carries no run identity: the report
    worker reads the workload from ``runs/<run_id>.json``, and now its fingerprint too
    (before, all such sessions of one name were each other's history)."""
    from datetime import UTC, datetime, timedelta

    from exporter.capture.session import TargetResult
    from exporter.pipeline.worker import config_from_shared_dir, workload_from_shared_dir

    shared, store = tmp_path / "shared", SessionStore(tmp_path / "store")
    other = CONFIGS | {"lr": 1e-3}
    start = datetime.now(UTC) - timedelta(hours=1)
    for n, configs in enumerate((CONFIGS, other, CONFIGS, other, CONFIGS)):
        _run_file(shared, f"run-{n}", 9000 + n, 100 + n, configs=configs)
        target = TargetResult(address=f"10.0.0.{n}:9012", host="h", run_id=f"run-{n}",
                              status="ok", files=[])  # fmt: skip
        store.write_record(SessionRecord(id=f"s-{n}", status="done", run_id=f"run-{n}",
                                         created=start + timedelta(minutes=n),
                                         targets=[target]))  # fmt: skip
    baselines = BaselineStore(
        store, workload_from_shared_dir(shared), config_from_shared_dir(shared)
    )
    today = store.read_record("s-4")
    assert today is not None and today.config_fingerprint is None
    assert baselines.history_sessions(today) == ["s-2", "s-0"]
    assert BaselineStore(store, workload_from_shared_dir(shared)).history_sessions(today) == [
        "s-3", "s-2", "s-1", "s-0",
    ]  # fmt: skip

"""``run.torch_trace_handler()``: traces land in the shared dir as the sidecar takes them.

A stand-in profiler whose ``export_chrome_trace`` writes what Kineto would; the real
torch.profiler runs in tests/integration/test_torch_trace_sidecar.py.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from exporter import schema, sdk
from exporter.profiles.torch_trace import is_torch_trace
from tests import kineto_traces as kt


class StandInProfiler:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.paths: list[str] = []

    def export_chrome_trace(self, path: str) -> None:
        self.paths.append(path)
        if self.fail:
            raise RuntimeError("Kineto said no")
        Path(path).write_text(json.dumps(kt.document(kt.training_step(1, 0.0, 1))))


@pytest.mark.parametrize("use_gzip", [False, True])
def test_a_trace_lands_with_its_identity_under_the_watched_name(
    tmp_path: Path, use_gzip: bool
) -> None:
    configs = {"lr": 0.1}
    with sdk.run(
        name="trainer", shared_dir=tmp_path, host="gpu-a", run_id="r-1", configs=configs
    ) as run:
        handler = run.torch_trace_handler("train", use_gzip=use_gzip)
        prof = StandInProfiler()
        path = handler(prof)
    assert path is not None and path.parent == tmp_path / schema.TORCH_TRACES_DIR
    suffix = ".pt.trace.json.gz" if use_gzip else ".pt.trace.json"
    assert path.name.startswith("train-gpu-a-") and path.name.endswith(suffix)
    # Exported under a hidden name (the sidecar skips those), renamed in last.
    assert Path(prof.paths[0]).name.startswith(".")
    assert is_torch_trace(path)
    if use_gzip:
        assert path.read_bytes()[:2] == b"\x1f\x8b" and b"traceEvents" in gzip.decompress(
            path.read_bytes()
        )
    identity = json.loads(path.with_name(path.name.removesuffix(suffix) + ".json").read_text())
    assert identity | {"pid": 0, "time": 0} == {
        "run_id": "r-1", "workload": "trainer", "host": "gpu-a", "pid": 0, "time": 0,
        "trigger": "programmatic", "name": "train",
        # Whose history the sidecar's session of it is (docs/analysis.md).
        "config_fingerprint": schema.config_fingerprint(configs),
    }  # fmt: skip
    leftovers = [p.name for p in path.parent.iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_a_failing_export_says_so_and_training_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with sdk.run(name="trainer", shared_dir=tmp_path, host="h") as run:
        assert run.torch_trace_handler("t")(StandInProfiler(fail=True)) is None
    assert "mlprof: torch trace 't' not written: Kineto said no" in capsys.readouterr().err
    directory = tmp_path / schema.TORCH_TRACES_DIR
    assert [p.name for p in directory.iterdir() if "pt.trace" in p.name] == []


def test_a_bad_name_or_a_second_on_trace_ready_is_refused(tmp_path: Path) -> None:
    with sdk.run(name="trainer", shared_dir=tmp_path, host="h") as run:
        with pytest.raises(ValueError, match=r"trace name '\.\./x'"):
            run.torch_trace_handler("../x")
        with pytest.raises(ValueError, match="on_trace_ready is the SDK's"):
            run.torch_profile("t", on_trace_ready=print)

"""exporter.heap: where a converting process's large numpy temporaries come from.

Each test runs a fresh interpreter (the setting is per process and cannot be undone),
does what the process under test does, then allocates a 64 MiB array and reports
whether glibc gave it a new anonymous mapping (its default above 32 MiB) or served it
from the heap (the setting applied). Linux with glibc only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not os.confstr("CS_GNU_LIBC_VERSION"),
    reason="mallopt and /proc/self/maps: Linux with glibc",
)

# Prints {"new_mapping": whether the 64 MiB array got its own anonymous mapping}.
PROBE = """
import json
import numpy as np

def anonymous():
    ranges = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) == 5:  # no path: anonymous ([heap] is named, so not counted)
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                ranges.add((lo, hi))
    return ranges

before = anonymous()
array = np.ones(64 << 20, dtype=np.uint8)  # malloc of 64 MiB, its pages touched
grown = [r for r in anonymous() - before if r[1] - r[0] >= 64 << 20]
print(json.dumps({"new_mapping": bool(grown)}))
"""


def _probe(setup: str, env: dict[str, str] | None = None) -> dict[str, object]:
    """Run ``setup`` then :data:`PROBE` in a fresh interpreter; the probe's answer."""
    child_env = {k: v for k, v in os.environ.items() if k != "MLPROF_MALLOC"}
    child_env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", setup + "\n" + PROBE],
        capture_output=True, text=True, check=False, cwd=ROOT, env=child_env | (env or {}),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    answer: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


def test_glibc_maps_each_large_array_afresh_by_default() -> None:
    # The cost being removed: without the setting, every large temporary is a new mapping.
    assert _probe("") == {"new_mapping": True}


def test_kept_freed_memory_serves_large_arrays_from_the_heap() -> None:
    setup = "from exporter.heap import keep_freed_memory\nassert keep_freed_memory() is True"
    assert _probe(setup) == {"new_mapping": False}


def test_malloc_default_opts_out() -> None:
    setup = "from exporter.heap import keep_freed_memory\nassert keep_freed_memory() is False"
    assert _probe(setup, {"MLPROF_MALLOC": "default"}) == {"new_mapping": True}


def _capture(tmp_path: Path) -> Path:
    from exporter.testing.synthetic import write_tpu_capture

    path = tmp_path / "tpu-vm-0.xplane.pb"
    write_tpu_capture(path, devices=1, steps=2, ops_per_step=20, distinct_ops=5)
    return path


def test_analysis_child_applies_it(tmp_path: Path) -> None:
    # exporter.pipeline.job's entry point, as the sidecar's bounded child runs it.
    capture, out = _capture(tmp_path), tmp_path / "out"
    setup = (
        "from exporter.pipeline import job\n"
        f"assert job.main(['flamegraphs', {str(capture)!r}, {str(out)!r}, '--kind', 'capture'])"
        " == 0"
    )
    assert _probe(setup) == {"new_mapping": False}
    assert (out / "graphs.json").is_file()


@pytest.mark.parametrize(
    "command",
    [["flamegraph", "{c}"], ["analyze", "{c}", "--no-xprof"], ["compare", "{c}", "{c}"]],
    ids=lambda command: command[0],
)
def test_converting_cli_commands_apply_it(tmp_path: Path, command: list[str]) -> None:
    capture, out = _capture(tmp_path), tmp_path / "out.txt"
    argv = [part.format(c=capture) for part in command] + ["-o", str(out)]
    setup = f"from exporter.cli import main\nmain({argv!r}, standalone_mode=False)"
    assert _probe(setup) == {"new_mapping": False}
    assert out.read_text().strip()


def test_xprof_child_applies_it(tmp_path: Path) -> None:
    pytest.importorskip("xprof")
    capture = _capture(tmp_path)  # no tool asked: the child starts, imports XProf, answers {}
    setup = (
        "from exporter.analysis.facts.xprof_tools import _main\n"
        f"_main(['--tools', '', {str(capture)!r}])\nprint()"  # its JSON ends no line
    )
    assert _probe(setup) == {"new_mapping": False}


def test_importing_the_commands_does_not_apply_it() -> None:
    # Only a command's start applies it: `mlprof serve` imports these modules too.
    setup = (
        "import exporter.cli, exporter.cli_analysis, exporter.pipeline.job\n"
        "import exporter.analysis.facts.xprof_tools, exporter.heap"
    )
    assert _probe(setup) == {"new_mapping": True}


def test_sidecar_does_not_apply_it(tmp_path: Path) -> None:
    # What `mlprof serve` starts: a long-running process keeps glibc's defaults, so the
    # memory it frees goes back to the kernel (its conversions run in job children).
    setup = f"""
import asyncio
from pathlib import Path
from exporter.sidecar import Sidecar
from tests.sidecar_app import FileWritingProfilerClient, settings_in

async def start_and_stop():
    settings = settings_in(Path({str(tmp_path)!r}))
    sidecar = Sidecar(settings, profiler_client=FileWritingProfilerClient())
    await sidecar.start()
    await asyncio.sleep(0.1)  # its loops start
    await sidecar.stop()

asyncio.run(start_and_stop())
"""
    assert _probe(setup) == {"new_mapping": True}

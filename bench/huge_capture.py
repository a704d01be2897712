"""Benchmark: a 2.5 GB XProf capture (past protobuf's 2 GiB message limit) through the
CLI, inside the sidecar's 4 GiB analysis bound, against a 36 MB one measured alongside.

What it measures, each as a whole child process under the address-space limit the
sidecar puts on an analysis (``RLIMIT_AS`` of ``report_max_memory_mb``, 4096 MiB by
default, with one BLAS/OpenMP thread, as ``exporter.pipeline.job.run_job`` does; here
set in a ``preexec_fn``, since the CLI takes no limit, where the job child sets its own
before it reads its input):

- ``mlprof flamegraph FILE -o out.folded`` (the device flame graph);
- ``mlprof analyze FILE --no-xprof --format json -o report.json``.

For each: exit code, CPU seconds (user + sys, ``RUSAGE_CHILDREN`` deltas), wall
seconds, peak RSS, and for the report its step count and device total. Peak RSS is the
child's own ``ru_maxrss`` from ``os.wait4`` on its pid (not ``RUSAGE_CHILDREN``, which
is the max over every child so far, the capture writer included). Linux folds the
pre-exec image (a fork of this process) into it, so this process imports only the
standard library and its own RSS is printed as that floor; ``VmPeak`` (address space,
what ``RLIMIT_AS`` bounds) is sampled from ``/proc/PID/status`` every 50 ms beside it.

The big capture cannot be built as one protobuf message, so it is written on the wire:
a one-device template (``synthetic.tpu_capture``, ``S`` steps) is tiled ``T`` times in
time on each of 4 device planes, the op events encoded with numpy, every length prefix
computed before the bytes are written. The same figures come for the reference capture
of ``bench/convert.py`` (2 M events, ``write_tpu_capture``), with the ratios. Each
capture is checked (device total = 4 x T x the template's, T x S steps) from the CLI's
folded output and report, and in process when it is small, so a malformed file fails
loudly instead of being measured.

    .venv/bin/python bench/huge_capture.py --quick     # 0.05 GB: a check of the writer
    .venv/bin/python bench/huge_capture.py             # 2.5 GB: a few minutes, 5 GB disk
    .venv/bin/python bench/huge_capture.py --keep /tmp/huge   # keep the capture
    .venv/bin/python bench/huge_capture.py --gb 0.37 --glibc-defaults  # exporter.heap's gain
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The sidecar's default bound on an analysis (Settings.report_max_memory_mb).
DEFAULT_MEMORY_MB = 4096
PROTOBUF_LIMIT = 2**31  # protobuf refuses to parse or serialize one message this large
DEVICES = 4
STEPS_PER_TILE = 10  # template steps: 10 x ~10k op events, quick to build in protobuf
SHAPE = {"ops_per_step": 10_000, "distinct_ops": 400, "while_every": 50, "while_body": 8}
REF_EVENTS = 2_000_000  # bench/convert.py's large size
STEP_STATS = ("group_id", "step_num")  # what steps.py reads a device step's number from
# Event metadata ids of the steps added by tiling: above every id the template uses.
STEP_META_BASE = 1_000_000
TILE_GAP_PS = 20_000 * 1000  # the template's gap after each step, kept between tiles
BATCH_EVENTS = 1_000_000  # op events encoded per numpy batch (tens of MB of scratch)


# -- writing the capture (in a child: this process stays small, see the docstring) ----
def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes | int) -> bytes:
    """A length-delimited field's tag and length prefix (payload or its length)."""
    length = payload if isinstance(payload, int) else len(payload)
    return _varint(number << 3 | 2) + _varint(length)


class _OpTiler:
    """A stat-free line's events tiled in time, encoded with numpy.

    Each XEvent is ``0x22 len 0x08 metadata_id 0x10 offset_ps 0x18 duration_ps``: what
    protobuf writes for these events (offset_ps is in a oneof, so 0 is written too).
    """

    def __init__(self, line: Any, span_ps: int) -> None:
        import numpy as np

        self.np = np
        events = line.events
        for event in events:  # the encoding below is only right for such events
            assert not event.stats and event.WhichOneof("data") == "offset_ps", line.name
            assert event.metadata_id > 0 and event.duration_ps > 0, line.name
        self.count = len(events)
        self.mid = np.fromiter((e.metadata_id for e in events), np.uint64, self.count)
        self.off = np.fromiter((e.offset_ps for e in events), np.uint64, self.count)
        self.dur = np.fromiter((e.duration_ps for e in events), np.uint64, self.count)
        self.span = np.uint64(span_ps)
        self.batch = max(1, BATCH_EVENTS // max(1, self.count))
        self.mid_len, self.dur_len = self._lengths(self.mid), self._lengths(self.dur)
        # Per tile, every byte but the offsets' varints: 5 tag/length bytes an event.
        self.fixed = 5 * self.count + int(self.mid_len.sum()) + int(self.dur_len.sum())

    def _lengths(self, values: Any) -> Any:
        np = self.np
        n = np.ones(values.shape, np.uint8)
        for k in range(1, 10):
            n += values >= np.uint64(1 << (7 * k))
        return n

    def _columns(self, values: Any, lengths: Any) -> tuple[Any, Any]:
        """(bytes, mask): varint byte k of each value in column k, mask where it exists."""
        np = self.np
        width = int(lengths.max())
        cols = np.empty((len(values), width), np.uint8)
        for k in range(width):
            more = np.where(k < lengths.astype(np.int64) - 1, 0x80, 0).astype(np.uint8)
            cols[:, k] = ((values >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8) | more
        return cols, np.arange(width) < lengths[:, None]

    def _offsets(self, first: int, last: int) -> Any:
        np = self.np
        shifts = np.arange(first, last, dtype=np.uint64) * self.span
        return (self.off[None, :] + shifts[:, None]).ravel()

    def tile_lengths(self, tiles: int) -> list[int]:
        """Encoded bytes of each tile 0..tiles-1 (computed, nothing encoded)."""
        out: list[int] = []
        for first in range(0, tiles, self.batch):
            last = min(tiles, first + self.batch)
            lengths = self._lengths(self._offsets(first, last)).reshape(last - first, -1)
            out += (self.fixed + lengths.sum(axis=1, dtype=self.np.int64)).tolist()
        return [int(n) for n in out]

    def encode(self, first: int, last: int) -> bytes:
        """Tiles first..last-1, encoded back to back."""
        np = self.np
        reps = last - first
        off = self._offsets(first, last)
        off_len = self._lengths(off)
        mid_len, dur_len = np.tile(self.mid_len, reps), np.tile(self.dur_len, reps)
        size = 3 + mid_len.astype(np.int64) + off_len + dur_len
        assert int(size.max()) < 128  # so each event's length prefix is one byte
        parts = [
            (np.full((len(off), 1), 0x22, np.uint8), None),
            (size.astype(np.uint8)[:, None], None),
            (np.full((len(off), 1), 0x08, np.uint8), None),
            self._columns(np.tile(self.mid, reps), mid_len),
            (np.full((len(off), 1), 0x10, np.uint8), None),
            self._columns(off, off_len),
            (np.full((len(off), 1), 0x18, np.uint8), None),
            self._columns(np.tile(self.dur, reps), dur_len),
        ]
        matrix = np.concatenate([p for p, _ in parts], axis=1)
        mask = np.concatenate(
            [m if m is not None else np.ones(p.shape, bool) for p, m in parts], axis=1
        )
        return matrix[mask].tobytes()  # row-major: event by event, fields in order


class _StepTiler:
    """The Steps line (few events, with stats) tiled through protobuf, one XLine a tile:
    step numbers continue across tiles, each new step with its own event metadata."""

    batch = 100  # tiles a write

    def __init__(self, line: Any, span_ps: int, stat_names: dict[int, str]) -> None:
        self.line, self.span_ps = line, span_ps
        self.count = len(line.events)
        self.ids = {i for i, name in stat_names.items() if name in STEP_STATS}
        numbers = [s.int64_value for e in line.events for s in e.stats if s.metadata_id in self.ids]
        assert numbers, "template Steps events carry no step number"
        self.per_tile = max(numbers) - min(numbers) + 1
        self.new_steps: dict[int, int] = {}  # event metadata id -> step number (tiles >= 1)

    def _tile(self, tile: int) -> Any:
        from exporter.proto import xplane_pb2

        out = xplane_pb2.XLine()
        for event in self.line.events:
            new = out.events.add()
            new.CopyFrom(event)
            new.offset_ps = event.offset_ps + tile * self.span_ps
            step = None
            for stat in new.stats:
                if stat.metadata_id in self.ids:
                    stat.int64_value += tile * self.per_tile
                    step = stat.int64_value
            if tile and step is not None:  # tile 0 keeps the template's metadata
                new.metadata_id = STEP_META_BASE + step
                self.new_steps[new.metadata_id] = step
        return out

    def tile_lengths(self, tiles: int) -> list[int]:
        self.new_steps = {}  # only the steps of these tiles get metadata
        return [self._tile(t).ByteSize() for t in range(tiles)]

    def encode(self, first: int, last: int) -> bytes:
        return b"".join(self._tile(t).SerializeToString() for t in range(first, last))


def _template() -> Any:
    from exporter.testing.synthetic import tpu_capture

    return tpu_capture(devices=1, steps=STEPS_PER_TILE, host=True, **SHAPE)  # type: ignore[arg-type]


def _graph_and_steps(path: Path) -> tuple[int, int, int]:
    """(device flame graph root total ns, step windows, device events) of a capture."""
    from exporter.profiles.steps import step_windows
    from exporter.profiles.xplane import device_flamegraph, load_capture

    with load_capture(path) as capture:
        graph = device_flamegraph(capture)
        events = capture.events_read  # before step_windows reads the Steps lines again
        windows, source = step_windows(capture)
        assert source == "device_steps", source
        assert graph is not None
        return graph.root.total, len(windows), events


def write_huge(path: Path, target_bytes: int) -> dict[str, Any]:
    """Write the tiled capture to ``path``; what it must hold, for the checks."""
    from exporter.proto import xplane_pb2

    started = time.perf_counter()
    space = _template().space
    devices = [p for p in space.planes if p.name.startswith("/device:")]
    assert len(devices) == 1, [p.name for p in space.planes]
    device = devices[0]
    # The template's own figures, read back by the project's reader.
    tpl_path = path.with_name("template.xplane.pb")
    tpl_path.write_bytes(space.SerializeToString())
    tpl_total, tpl_steps, _ = _graph_and_steps(tpl_path)
    tpl_path.unlink()
    assert tpl_steps == STEPS_PER_TILE, tpl_steps

    # One tile lasts the template's span plus the gap it leaves after each step, so
    # steps stay evenly spaced across tile boundaries.
    end_ps = max(e.offset_ps + e.duration_ps for line in device.lines for e in line.events)
    span_ps = end_ps + TILE_GAP_PS
    stat_names = {m.id: m.name for m in device.stat_metadata.values()}
    assert max(device.event_metadata) < STEP_META_BASE
    tilers: list[tuple[Any, Any]] = []  # (line header without events, tiler)
    for line in device.lines:
        header = xplane_pb2.XLine()
        header.CopyFrom(line)
        header.ClearField("events")
        has_stats = any(e.stats for e in line.events)
        tiler = _StepTiler(line, span_ps, stat_names) if has_stats else _OpTiler(line, span_ps)
        if not has_stats:  # the numpy encoding must read back as the template's line
            tile0 = xplane_pb2.XLine.FromString(header.SerializeToString() + tiler.encode(0, 1))
            assert tile0 == line, line.name
        tilers.append((header, tiler))
    names = [h.name for h, _ in tilers]
    assert any(isinstance(t, _StepTiler) for _, t in tilers), names
    per_tile_steps = next(t.per_tile for _, t in tilers if isinstance(t, _StepTiler))

    # Tiles: from tile 0's size, then again from the mean over that many (offsets, and so
    # their varints, grow with the tile), so the file lands near the target.
    others = [p for p in space.planes if p is not device]
    bare = xplane_pb2.XPlane()
    bare.CopyFrom(device)
    bare.ClearField("lines")
    fixed = sum(p.ByteSize() + 10 for p in others) + DEVICES * (bare.ByteSize() + 10)
    per_tile = DEVICES * sum(t.tile_lengths(1)[0] for _, t in tilers)
    tiles = max(1, math.ceil((target_bytes - fixed) / per_tile))
    mean = DEVICES * sum(sum(t.tile_lengths(tiles)) for _, t in tilers) / tiles
    tiles = max(1, math.ceil((target_bytes - fixed) / mean))
    lengths = [t.tile_lengths(tiles) for _, t in tilers]
    line_sizes = [
        h.ByteSize() + sum(n) for (h, _), n in zip(tilers, lengths, strict=True)
    ]  # fmt: skip
    lines_bytes = sum(len(_field(3, n)) + n for n in line_sizes)

    with path.open("w+b") as out:  # read too: devices 1.. copy device 0's lines
        head = xplane_pb2.XSpace()
        head.CopyFrom(space)
        head.ClearField("planes")
        out.write(head.SerializeToString())  # hostnames etc.: field order is free
        for plane in others:
            if plane.name.startswith("/host:"):
                out.write(_field(1, plane.SerializeToString()) + plane.SerializeToString())
        steps_tiler = next(t for _, t in tilers if isinstance(t, _StepTiler))
        lines_at: tuple[int, int] | None = None
        for index in range(DEVICES):
            meta = xplane_pb2.XPlane()
            meta.CopyFrom(device)
            meta.ClearField("lines")
            meta.name, meta.id = f"/device:TPU:{index}", index + 1
            for meta_id, step in steps_tiler.new_steps.items():
                meta.event_metadata[meta_id].id = meta_id
                meta.event_metadata[meta_id].name = str(step)
            fields = meta.SerializeToString()
            out.write(_field(1, len(fields) + lines_bytes) + fields)
            if lines_at is not None:  # the same lines as device 0's: copy them in the file
                out.flush()
                _copy_range(out.fileno(), *lines_at)
                out.seek(0, os.SEEK_END)
                continue
            start = out.tell()
            for (header, tiler), size in zip(tilers, line_sizes, strict=True):
                out.write(_field(3, size) + header.SerializeToString())
                for first in range(0, tiles, tiler.batch):
                    out.write(tiler.encode(first, min(tiles, first + tiler.batch)))
            lines_at = (start, out.tell() - start)
            assert lines_at[1] == lines_bytes, (lines_at, lines_bytes)
        rest = [p for p in others if not p.name.startswith("/host:")]
        for number, plane in enumerate(rest, DEVICES + 1):  # ids after the devices'
            stretched = _stretched(plane, tilers[0][0].timestamp_ns, tiles * span_ps)
            stretched.id = number
            data = stretched.SerializeToString()
            out.write(_field(1, data) + data)
    size = path.stat().st_size
    host_events = sum(len(line.events) for p in others for line in p.lines)
    device_events = DEVICES * sum(t.count for _, t in tilers) * tiles
    return {
        "bytes": size,
        "events": host_events + device_events,
        "device_events": device_events,
        "tiles": tiles,
        "steps_per_tile": per_tile_steps,
        "expected_steps": tiles * per_tile_steps,
        "expected_device_ns": DEVICES * tiles * tpl_total,
        "template_device_ns": tpl_total,
        "lines": names,
        "write_s": time.perf_counter() - started,
    }


def _copy_range(fd: int, start: int, length: int) -> None:
    """Append ``length`` bytes of the file from ``start`` to its end, in the kernel."""
    dest = os.fstat(fd).st_size
    done = 0
    while done < length:
        try:
            n = os.copy_file_range(fd, fd, length - done, start + done, dest + done)
        except OSError:  # a file system without it: through user space, 64 MiB at a time
            n = os.pwrite(fd, os.pread(fd, min(length - done, 1 << 26), start + done), dest + done)
        assert n > 0
        done += n


def _stretched(plane: Any, start_ns: int, span_ps: int) -> Any:
    """A plane (Task Environment) whose profile stop time covers every tile."""
    from exporter.proto import xplane_pb2

    out = xplane_pb2.XPlane()
    out.CopyFrom(plane)
    names = {m.id: m.name for m in out.stat_metadata.values()}
    for stat in out.stats:
        if names.get(stat.metadata_id) == "profile_stop_time":
            stat.uint64_value = max(stat.uint64_value, start_ns - (-span_ps // 1000))
    return out


def write_reference(path: Path) -> dict[str, Any]:
    """bench/convert.py's 2 M-event capture (its ``_write`` shape)."""
    from exporter.testing.synthetic import write_tpu_capture

    started = time.perf_counter()
    steps = -(-REF_EVENTS // (DEVICES * SHAPE["ops_per_step"]))
    synthetic = write_tpu_capture(path, devices=DEVICES, steps=steps, **SHAPE)  # type: ignore[arg-type]
    host = synthetic.space.planes[0]
    assert host.name.startswith("/host:")
    return {
        "bytes": path.stat().st_size,
        "events": synthetic.event_count,
        "device_events": synthetic.event_count - sum(len(line.events) for line in host.lines),
        "expected_steps": steps,
        "expected_device_ns": sum(synthetic.expected_device_ns.values()),
        "write_s": time.perf_counter() - started,
    }


def worker(kind: str, path: Path, target_bytes: int) -> dict[str, Any]:
    facts = write_huge(path, target_bytes) if kind == "huge" else write_reference(path)
    if facts["bytes"] < 512 * 2**20:  # small enough to check in process as well
        total, steps, events = _graph_and_steps(path)
        assert total == facts["expected_device_ns"], (total, facts["expected_device_ns"])
        assert steps == facts["expected_steps"], (steps, facts["expected_steps"])
        assert events == facts["device_events"], (events, facts["device_events"])
        facts["checked_in_process"] = True
    return facts


# -- measuring (this process: standard library only) -----------------------------------
def _status_mib(pid: int | str, field: str) -> float | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    found = re.search(rf"^{field}:\s+(\d+) kB", text, re.M)
    return int(found.group(1)) / 1024 if found else None


def measure(
    cmd: list[str], memory_mb: int | None, timeout_s: float, extra_env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run ``cmd`` (bounded as run_job bounds an analysis); its exit code, CPU, wall,
    ru_maxrss (os.wait4 of its pid) and polled VmPeak / VmHWM."""
    limit = (memory_mb or 0) * 1024 * 1024

    def bound() -> None:  # in the child before exec, as exporter/pipeline/job.py does
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", **(extra_env or {})}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        # No thread of ours is alive at the fork (the sampler and timer start after it
        # and are joined before the next), so preexec_fn is safe here.
        child = subprocess.Popen(
            cmd, stdout=out, stderr=err, env=env, cwd=ROOT,
            preexec_fn=bound if memory_mb else None,  # noqa: PLW1509
        )  # fmt: skip
        peaks = {"VmPeak": 0.0, "VmHWM": 0.0}
        done = threading.Event()

        def sample() -> None:  # address space is what RLIMIT_AS bounds; RSS beside it
            while not done.wait(0.05):
                for name, peak in list(peaks.items()):
                    peaks[name] = max(peak, _status_mib(child.pid, name) or 0.0)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        killer = threading.Timer(timeout_s, child.kill)
        killer.start()
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - started
        done.set()
        killer.cancel()
        killer.join()
        child.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        sampler.join()
        out.seek(0)
        err.seek(0)
        return {
            "rc": child.returncode,
            "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "sys_s": after.ru_stime - before.ru_stime,
            "wait4_cpu_s": usage.ru_utime + usage.ru_stime,
            "wall_s": wall,
            "maxrss_mib": usage.ru_maxrss / 1024,
            "vmpeak_mib": peaks["VmPeak"],
            "vmhwm_mib": peaks["VmHWM"],
            "stdout": out.read().decode("utf-8", "replace"),
            "stderr": err.read().decode("utf-8", "replace"),
        }


def _mlprof() -> list[str]:
    script = Path(sys.executable).parent / "mlprof"
    return [str(script)] if script.exists() else [sys.executable, "-m", "exporter.cli"]


def _line(name: str, run: dict[str, Any], events: int) -> str:
    return (
        f"  {name:<10}: exit {run['rc']}, {run['cpu_s']:.2f} s CPU "
        f"({run['cpu_s'] / events * 1e9:.0f} ns/event), {run['wall_s']:.2f} s wall, "
        f"peak RSS {run['maxrss_mib']:,.0f} MiB (ru_maxrss; polled VmHWM "
        f"{run['vmhwm_mib']:,.0f}, VmPeak {run['vmpeak_mib']:,.0f} MiB)"
    )


def _failed(name: str, run: dict[str, Any]) -> str:
    """The failure: the project's frames of the traceback (where), and its last line."""
    lines = [ln for ln in run["stderr"].splitlines() if ln.strip()]
    frames = [ln.strip() for ln in lines if ln.strip().startswith('File "') and "/exporter/" in ln]
    where = [re.sub(r'^File ".*?/(exporter/[^"]+)", line (\d+), in (.+)$', r"\1:\2 \3", f)
             for f in frames[-4:]]  # fmt: skip
    return (
        f"  {name} FAILED (exit {run['rc']}): {lines[-1] if lines else 'no message'}\n"
        + "".join(f"      at {w}\n" for w in where)  # innermost last
    ).rstrip()


def _check(kind: str, run: dict[str, Any], out: Path, facts: dict[str, Any]) -> bool:
    """Print what the command found against what the capture holds; True if equal."""
    if run["rc"] != 0:
        print(_failed(kind, run))
        return False
    expected = facts["expected_device_ns"]
    if kind.startswith("flamegraph"):
        total = sum(int(ln.rsplit(" ", 1)[1]) for ln in out.read_text().splitlines())
        agree = total == expected
        print(
            f"              device total {total:,} ns (folded), expected {expected:,} -> "
            f"{'equal' if agree else 'DIFFERENT'}"
        )
    else:
        data = json.loads(out.read_text())
        steps = data["facts"]["steps"]["count"]
        total_ms = data["facts"]["op_categories"]["total_ms"]
        # total_ms is rounded to the microsecond in the report.
        agree = steps == facts["expected_steps"] and abs(total_ms * 1e6 - expected) <= 1000
        print(
            f"              steps {steps:,} (expected {facts['expected_steps']:,}), device "
            f"total {total_ms:,.3f} ms (expected {expected / 1e6:,.3f}) -> "
            f"{'equal' if agree else 'DIFFERENT'}; status {data['status']}"
        )
    out.unlink()
    return agree


def bench(name: str, path: Path, facts: dict[str, Any], args: argparse.Namespace) -> dict:
    """Both commands on one capture; prints the figures, returns them with a verdict."""
    size = facts["bytes"]
    print(
        f"\n[{name}] {size:,} bytes ({size / 2**30:.2f} GiB; past protobuf's 2 GiB: "
        f"{'yes' if size > PROTOBUF_LIMIT else 'no'}), {facts['events']:,} events, "
        f"written in {facts['write_s']:.1f} s"
        + (f"; {DEVICES} devices x {facts['tiles']} tiles x {facts['steps_per_tile']} steps"
           if "tiles" in facts else "")
        + ("; checked in process" if facts.get("checked_in_process") else "")
    )  # fmt: skip
    outs = {"flamegraph": path.parent / f"{name}.folded",
            "analyze": path.parent / f"{name}.report.json"}  # fmt: skip
    cmds = {
        "flamegraph": [*_mlprof(), "flamegraph", str(path), "-o", str(outs["flamegraph"])],
        "analyze": [*_mlprof(), "analyze", str(path), "--no-xprof", "--format", "json",
                    "-o", str(outs["analyze"])],
    }  # fmt: skip
    runs: dict[str, dict[str, Any]] = {}
    ok = True
    for kind, cmd in cmds.items():
        run = runs[kind] = measure(cmd, args.memory_mb, args.timeout)
        print(_line(kind, run, facts["events"]))
        ok &= _check(kind, run, outs[kind], facts)
    if args.glibc_defaults:
        # The reference for exporter.heap: the same commands with glibc's own settings.
        for kind, cmd in cmds.items():
            run = runs[f"{kind} (glibc)"] = measure(
                cmd, args.memory_mb, args.timeout, {"MLPROF_MALLOC": "default"}
            )
            print(_line(f"{kind} (glibc defaults, MLPROF_MALLOC=default)", run, facts["events"]))
            ok &= _check(kind, run, outs[kind], facts)
            mine = runs[kind]
            if not (run["rc"] or mine["rc"]):
                print(
                    f"    {kind}: CPU {mine['cpu_s'] / run['cpu_s']:.2f}x of glibc's defaults "
                    f"(sys {mine['sys_s']:.2f} vs {run['sys_s']:.2f} s), peak RSS "
                    f"{mine['maxrss_mib'] / run['maxrss_mib']:.2f}x"
                )
    for kind, cmd in cmds.items():
        if runs[kind]["rc"] != 0 and args.memory_mb:
            # The bound was hit: the same command without it, for its peaks (and checked).
            run = runs[f"{kind} (no bound)"] = measure(cmd, None, args.timeout)
            print(_line(f"{kind} (no bound)", run, facts["events"]))
            _check(f"{kind} (no bound)", run, outs[kind], facts)
    return {"runs": runs, "ok": ok, "facts": facts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=2.5, help="capture size, GB (1e9 bytes)")
    parser.add_argument("--quick", action="store_true",
                        help="0.05 GB: the writer and both commands (make bench)")  # fmt: skip
    parser.add_argument("--keep", type=Path, help="write the capture here and keep it")
    parser.add_argument("--memory-mb", type=int, default=DEFAULT_MEMORY_MB,
                        help="RLIMIT_AS of each command, MiB (0: none)")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per command")
    parser.add_argument("--glibc-defaults", action="store_true",
                        help="also run each command with MLPROF_MALLOC=default (exporter.heap's "
                        "reference)")  # fmt: skip
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, path, target = args.worker
        sys.path.insert(0, str(ROOT))
        print(json.dumps(worker(kind, Path(path), int(target))))
        return
    target = int((0.05 if args.quick else args.gb) * 1e9)
    base = args.keep or Path(tempfile.mkdtemp(prefix="mlprof-huge-", dir="/tmp"))
    base.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(base).free
    if free < 2 * target:
        sys.exit(f"huge_capture: {free / 1e9:.1f} GB free in {base}, need {2 * target / 1e9:.1f}")
    print(
        f"bound: RLIMIT_AS {args.memory_mb} MiB per command; this process's RSS (the floor "
        f"of each child's ru_maxrss) {_status_mib('self', 'VmRSS'):.0f} MiB"
    )
    try:
        results = {}
        for name, kind, size in (("reference", "ref", 0), ("huge", "huge", target)):
            folder = base / name
            folder.mkdir(exist_ok=True)
            path = folder / "tpu-vm-0.xplane.pb"
            made = subprocess.run(
                [sys.executable, __file__, "--worker", kind, str(path), str(size)],
                capture_output=True, text=True, check=False, cwd=ROOT,
            )  # fmt: skip
            if made.returncode:
                sys.exit(f"writing the {name} capture failed:\n{made.stderr[-3000:]}")
            facts = json.loads(made.stdout.strip().splitlines()[-1])
            results[name] = bench(name, path, facts, args)
            if not args.keep or name == "reference":
                path.unlink()
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    ref, big = results["reference"], results["huge"]
    print("\nhuge / reference:")
    print(
        f"  size {big['facts']['bytes'] / ref['facts']['bytes']:.1f}x, events "
        f"{big['facts']['events'] / ref['facts']['events']:.1f}x"
    )
    for kind in big["runs"]:
        a, b = ref["runs"].get(kind) or ref["runs"].get(kind.split(" ")[0]), big["runs"][kind]
        if a is None or a["rc"] or b["rc"]:
            print(f"  {kind:<10}: (failed, no ratio)")
            continue
        per_a = a["cpu_s"] / ref["facts"]["events"]
        per_b = b["cpu_s"] / big["facts"]["events"]
        print(
            f"  {kind:<10}: CPU per event {per_b / per_a:.2f}x ({per_b * 1e9:.0f} vs "
            f"{per_a * 1e9:.0f} ns), peak RSS {b['maxrss_mib'] / a['maxrss_mib']:.1f}x "
            f"({b['maxrss_mib']:,.0f} vs {a['maxrss_mib']:,.0f} MiB), peak RSS per byte of "
            f"capture {b['maxrss_mib'] * 2**20 / big['facts']['bytes']:.2f} vs "
            f"{a['maxrss_mib'] * 2**20 / ref['facts']['bytes']:.2f}"
        )
    verdict = ref["ok"] and big["ok"]
    print(f"\nboth commands exit 0 within the bound, totals and steps as built -> "
          f"{'PASS' if verdict else 'FAIL'}")  # fmt: skip
    sys.exit(0 if verdict else 1)


if __name__ == "__main__":
    main()

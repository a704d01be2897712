"""Benchmark: reading a chunked capture (``.xplane.riegeli``) with Riegeli's hashes
verified, against the reader before it verified them, measured in the same run.

The capture is what ``SaveXSpaceChunk`` writes: whole padded Riegeli files appended
one after another, each one brotli chunk of about 1 MiB of XSpace pieces (a synthetic
TPU capture cut as ``DestructiveChunkXSpace`` cuts it, by ``tests/riegeli_writer.py``,
with Riegeli's hashes). One such file is built and repeated up to the target size, so
the capture is quick to write; the merge appends each repeat's events to the same lines.

Each measurement is a child process (CPU seconds and peak RSS from ``os.wait4``):

- ``records``: ``iter_records`` over the whole file (hash, decompress, split);
- ``merge``: ``write_xspace`` to ``/dev/null`` (what ``load_capture`` does with it);

once with this tree's reader (hashes verified: ``verified``) and once with the reader
of ``--reference`` (a git revision; default the commit before hashing) loaded from git
(``reference``), alternating, ``--repeat`` times; the best of each is printed with the
ratio. ``hash only`` is HighwayHash-64 over the file's bytes in this process.

    .venv/bin/python bench/riegeli_read.py --quick      # 64 MB of records: a check
    .venv/bin/python bench/riegeli_read.py              # 2.5 GB of records (decoded)

Measured (2 busy shared cores, --repeat 1, reference c3e3b5a): 2.5 GB of records in a
358 MB file; hash alone 0.28 s CPU (1.28 GB/s); records 5.71 -> 6.13 s CPU (x1.072);
merge 120.3 -> 115.1 s CPU (x0.957: the hashing, under 1 s, is within the noise of a
two-minute merge); peak RSS 37 MiB both. An earlier run against 537f1f4 (same read
path): records x1.065, merge x1.072.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = "c3e3b5a"  # the last exporter/profiles/riegeli.py that did not verify hashes
CHUNK_RECORDS_BYTES = 1 << 20  # XProf's writer makes chunks of about 1 MiB of records


def write_capture(path: Path, target_bytes: int) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from exporter.testing.synthetic import tpu_capture
    from tests import riegeli_writer as rw

    space = tpu_capture(devices=4, steps=4, ops_per_step=2000, start_ns=1_700_000_000 * 10**9)
    records = rw.chunk_xspace(space.space, 2000)
    unit = bytearray()  # padded files, each one chunk of about 1 MiB of records
    batch: list[bytes] = []
    for record in records:
        batch.append(record)
        if sum(map(len, batch)) >= CHUNK_RECORDS_BYTES:
            writer = rw.Writer()
            writer.records(batch, "brotli")
            writer.pad_to_block()
            unit += writer.getvalue()
            batch = []
    if batch:
        writer = rw.Writer()
        writer.records(batch, "brotli")
        writer.pad_to_block()
        unit += writer.getvalue()
    decoded = sum(map(len, records))
    repeats = max(1, round(target_bytes / decoded))
    with path.open("wb") as out:
        for _ in range(repeats):
            out.write(unit)
    return {"file_bytes": len(unit) * repeats, "records_bytes": decoded * repeats}


def _reader(which: str, reference: str, scratch: Path) -> Any:
    import importlib.util

    sys.path.insert(0, str(ROOT))
    if which == "verified":
        from exporter.profiles import riegeli

        return riegeli
    source = subprocess.run(
        ["git", "show", f"{reference}:exporter/profiles/riegeli.py"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout  # fmt: skip
    module_path = scratch / "riegeli_reference.py"
    module_path.write_bytes(source)
    spec = importlib.util.spec_from_file_location("riegeli_reference", module_path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def worker(which: str, what: str, path: Path, reference: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch:
        reader = _reader(which, reference, Path(scratch))
        if what == "records":
            count = size = 0
            for record in reader.iter_records(path):
                count += 1
                size += len(record)
            return {"records": count, "bytes": size}
        with Path(os.devnull).open("wb") as sink:
            return {"bytes": reader.write_xspace(path, sink)}


def measure(cmd: list[str]) -> dict[str, Any]:
    started = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, cwd=ROOT)
    assert child.stdout is not None
    out = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    return {
        "rc": child.returncode,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "wall_s": time.perf_counter() - started,
        "maxrss_mib": usage.ru_maxrss / 1024,
        "answer": json.loads(out) if child.returncode == 0 else out.decode(errors="replace"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=2.5, help="records' decoded size, GB")
    parser.add_argument("--quick", action="store_true", help="0.064 GB: a check")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each (best is shown)")
    parser.add_argument("--reference", default=REFERENCE, help="git revision of the reference")
    parser.add_argument("--only", choices=("records", "merge"), help="measure one of the two reads")
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        which, what, path, reference = args.worker
        print(json.dumps(worker(which, what, Path(path), reference)))
        return
    target = int((0.064 if args.quick else args.gb) * 1e9)
    with tempfile.TemporaryDirectory(prefix="riegeli-bench-") as scratch:
        path = Path(scratch) / "host.xplane.riegeli"
        facts = write_capture(path, target)
        print(
            f"capture: {facts['file_bytes'] / 1e6:,.0f} MB file, "
            f"{facts['records_bytes'] / 1e6:,.0f} MB of records (appended padded files, "
            f"~1 MiB brotli chunks)"
        )
        sys.path.insert(0, str(ROOT))
        from exporter.profiles import highwayhash

        started = time.process_time()
        hasher = highwayhash.HighwayHash64()
        with path.open("rb") as handle:
            while piece := handle.read(1 << 20):
                hasher.update(piece)
        hash_s = time.process_time() - started
        core = "compiled" if highwayhash._compiled is not None else "pure Python"
        rate = facts["file_bytes"] / hash_s / 1e6
        print(f"hash only ({core}): {hash_s:.2f} s CPU, {rate:,.0f} MB/s")
        for what in (args.only,) if args.only else ("records", "merge"):
            best: dict[str, dict[str, Any]] = {}
            for _ in range(args.repeat):
                for which in ("reference", "verified"):
                    cmd = [
                        sys.executable,
                        __file__,
                        "--worker",
                        which,
                        what,
                        str(path),
                        args.reference,
                    ]
                    run = measure(cmd)
                    assert run["rc"] == 0, run
                    if which not in best or run["cpu_s"] < best[which]["cpu_s"]:
                        best[which] = run
            assert best["reference"]["answer"] == best["verified"]["answer"], best
            for which in ("reference", "verified"):
                run = best[which]
                print(
                    f"  {what:<8} {which:<9}: {run['cpu_s']:7.2f} s CPU, {run['wall_s']:7.2f} s "
                    f"wall, peak RSS {run['maxrss_mib']:,.0f} MiB"
                )
            ratio = best["verified"]["cpu_s"] / best["reference"]["cpu_s"]
            rss = best["verified"]["maxrss_mib"] / best["reference"]["maxrss_mib"]
            print(f"  {what:<8} verified / reference: CPU x{ratio:.3f}, peak RSS x{rss:.3f}")


if __name__ == "__main__":
    main()

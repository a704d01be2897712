"""``mlprof flamegraph``: formats, errors without tracebacks, and the HTML page in
headless Chromium (Debian ``chromium``)."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from exporter.profiles.flamegraph import FlameGraph, format_value
from exporter.profiles.frames import FrameLabel
from exporter.profiles.pprof import decode_pprof, encode_pprof, from_pprof
from exporter.testing.synthetic import write_tpu_capture
from tests import torch_snapshots as ts
from tests.harness import ROOT

pytestmark = pytest.mark.integration


def mlprof(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "exporter.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "tpu-vm-0.xplane.pb"
    write_tpu_capture(path, devices=2, steps=3, ops_per_step=400, distinct_ops=64)
    return path


def test_folded_to_stdout(capture: Path) -> None:
    done = mlprof("flamegraph", str(capture), "--kind", "device")
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert re.match(r"^jit_train_step;jit\(train_step\);jit\(main\);.+ \d+$", first)


def test_pprof_file(capture: Path, tmp_path: Path) -> None:
    out = tmp_path / "device.pb.gz"
    done = mlprof("flamegraph", str(capture), "--format", "pprof", "-o", str(out))
    assert done.returncode == 0, done.stderr
    graph = from_pprof(decode_pprof(out.read_bytes()))
    graph.check()
    assert (graph.sample_type, graph.unit) == ("device_time", "nanoseconds")
    assert (
        f"total {format_value(graph.root.total, 'nanoseconds')} = {graph.root.total} nanoseconds"
        in done.stderr
    )
    assert re.search(r"total \d+\.\d{3} (s|ms|µs) = ", done.stderr), done.stderr  # readable first


def test_session_directory_merges_hosts(capture: Path, tmp_path: Path) -> None:
    session = tmp_path / "plugins" / "profile" / "session-1"
    session.mkdir(parents=True)
    shutil.copy(capture, session / "host-a.xplane.pb")
    shutil.copy(capture, session / "host-b.xplane.pb")
    one = mlprof("flamegraph", str(capture), "--max-nodes", "1")
    both = mlprof("flamegraph", str(tmp_path), "--max-nodes", "1")
    assert one.returncode == both.returncode == 0, both.stderr
    total = int(one.stdout.split()[-1])
    assert int(both.stdout.split()[-1]) == 2 * total


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (lambda good: good[: len(good) // 3], "truncated"),
        (lambda good: b"\x00\x01garbage" * 10, "not an XProf capture"),
        (lambda good: b"", "empty file"),
    ],
)
def test_bad_input_is_one_line_exit_1(
    capture: Path, tmp_path: Path, content: object, expected: str
) -> None:
    bad = tmp_path / "broken.xplane.pb"
    bad.write_bytes(content(capture.read_bytes()))  # type: ignore[operator]
    done = mlprof("flamegraph", str(bad))
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith(f"mlprof: {bad}")
    assert expected in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_truncated_memory_profile_is_one_line_exit_1(tmp_path: Path) -> None:
    import gzip

    bad = tmp_path / "mem.pprof.gz"
    bad.write_bytes(gzip.compress(b"\x0a\x04" * 100)[:25])
    done = mlprof("flamegraph", str(bad), "--kind", "memory")
    assert done.returncode == 1
    assert "Traceback" not in done.stderr and str(bad) in done.stderr


def test_negative_sample_values_are_refused_not_shown(tmp_path: Path) -> None:
    """A diff profile (negative bytes) once gave negative totals with exit 0."""
    graph = FlameGraph(sample_type="inuse_space", unit="bytes", profile_name="memory")
    graph.add(["main", "alloc"], 100)
    profile = decode_pprof(encode_pprof(graph))
    profile.sample[0].value[0] = -100
    source = tmp_path / "diff.pprof"
    source.write_bytes(profile.SerializeToString())
    done = mlprof("flamegraph", str(source), "--kind", "memory")
    assert done.returncode == 1, done.stdout
    assert "negative value (-100)" in done.stderr and str(source) in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_torch_memory_snapshot(tmp_path: Path) -> None:
    """`mlprof flamegraph SNAPSHOT --kind memory`: live bytes per stack, the pprof keeps
    block counts, and a snapshot that would run code is one line, exit 1, not run."""
    snapshot = ts.training_snapshot()
    path = ts.write(tmp_path / "snapshot.pickle", snapshot)
    done = mlprof("flamegraph", str(path), "--kind", "memory")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "cuda:0;<module>;train;train_step;step 2097152" in lines
    assert sum(int(line.rsplit(" ", 1)[1]) for line in lines) == ts.live_totals(snapshot)[1]

    out = tmp_path / "memory.pb.gz"
    done = mlprof("flamegraph", str(path), "--format", "pprof", "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert f"= {ts.live_totals(snapshot)[1]} bytes" in done.stderr
    assert re.search(r"total \d+\.\d\d (KiB|MiB|GiB) = ", done.stderr), done.stderr

    sentinel = tmp_path / "pwned"
    evil = tmp_path / "evil.pickle"
    command = f"touch {sentinel}".encode()
    # posix.system("touch ...") by STACK_GLOBAL and REDUCE, as pickle protocol 4 writes it.
    evil.write_bytes(b"\x80\x04\x8c\x05posix\x8c\x06system\x93\x8c"
                     + bytes([len(command)]) + command + b"\x85R.")  # fmt: skip
    done = mlprof("flamegraph", str(evil))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [
        f"mlprof: {evil}: not a safe PyTorch memory snapshot: refused global posix.system: "
        "a memory snapshot holds only dicts, lists, tuples, strings and numbers"
    ]
    assert not sentinel.exists()


def test_missing_input(tmp_path: Path) -> None:
    done = mlprof("flamegraph", str(tmp_path / "nope.xplane.pb"))
    assert done.returncode == 1 and "no such file" in done.stderr


Dom = Callable[..., str]


@pytest.fixture(scope="module")
def chromium_dom() -> Iterator[Dom]:
    """``dom(page, fragment="")``: the page's DOM once loaded, as ``chromium --dump-dom``
    prints it, from one headless Chromium for the module (a launch per page cost ~3 s on
    a busy 2-core machine). Each page is a fresh tab, so a fragment is a first load, not
    a hashchange; the viewport is ``--dump-dom``'s 800x600. The page's script draws
    synchronously (flamegraph.js), so the DOM at ``load`` is the drawn one."""
    from playwright.sync_api import sync_playwright

    browser_path = shutil.which("chromium") or shutil.which("chromium-browser")
    assert browser_path, (
        "Debian 'chromium' is required for the HTML test (apt-get install chromium)"
    )
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=browser_path, args=["--no-sandbox", "--disable-gpu"]
        )

        def dom(page: Path, fragment: str = "") -> str:
            url = page.as_uri() + (f"#{fragment}" if fragment else "")
            tab = browser.new_page(viewport={"width": 800, "height": 600})
            try:
                tab.goto(url, wait_until="load", timeout=120_000)
                return tab.content()
            finally:
                tab.close()

        try:
            yield dom
        finally:
            browser.close()


def _frames(dom: str) -> list[dict[str, str]]:
    frames = []
    for match in re.finditer(r'<div class="frame([^"]*)"([^>]*)>([^<]*)</div>', dom):
        attrs = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', match.group(2)))
        attrs = {k: html.unescape(v) for k, v in attrs.items()}
        attrs["class"] = match.group(1).strip()
        attrs["text"] = html.unescape(match.group(3))
        frames.append(attrs)
    return frames


def test_html_renders_zooms_and_searches(capture: Path, tmp_path: Path, chromium_dom: Dom) -> None:
    page = tmp_path / "device.html"
    done = mlprof("flamegraph", str(capture), "--format", "html", "-o", str(page))
    assert done.returncode == 0, done.stderr
    text = page.read_text()
    assert "<script src" not in text and "<link" not in text  # self-contained

    dom = chromium_dom(page)
    assert 'data-ready="1"' in dom
    frames = _frames(dom)
    top = next(f for f in frames if f["path"] == "jit_train_step")
    assert top["text"] == "jit_train_step"
    assert "self: 0 ns" in top["tooltip"]
    assert re.search(r"total: [\d.]+ ms \(100\.00% of all", top["tooltip"])
    for frame in frames:  # hover text: self and total with units
        assert re.search(r"self: [\d.]+ (ns|µs|ms|s) ", frame["tooltip"])
        assert int(frame["total"]) >= int(frame["self"])

    # Click-to-zoom sets the fragment; the zoomed view starts at the clicked frame.
    leaf = max((f for f in frames if f["path"].count(";") == 8), key=lambda f: int(f["total"]))
    zoom_to = ";".join(leaf["path"].split(";")[:4])
    zoomed = _frames(chromium_dom(page, "zoom=" + quote(zoom_to)))
    assert zoomed[0]["path"] == zoom_to
    assert all(f["path"].startswith(zoom_to) for f in zoomed)
    assert len(zoomed) < len(frames)

    # Search highlights the matching frames and sums them.
    searched_dom = chromium_dom(page, "search=all-reduce")
    searched = _frames(searched_dom)
    matches = [f for f in searched if "match" in f["class"].split()]
    assert matches and all("all-reduce" in f["text"] for f in matches)
    status = re.search(r'id="status"[^>]*data-matched="(\d+)"', searched_dom)
    assert status is not None
    paths = {f["path"] for f in matches}
    outermost = [
        f for f in matches
        if not any(f["path"].startswith(p + ";") for p in paths if p != f["path"])
    ]  # fmt: skip
    assert int(status.group(1)) == sum(int(f["total"]) for f in outermost)


def test_per_step_divides_by_the_steps_line(capture: Path) -> None:
    whole = mlprof("flamegraph", str(capture), "--max-nodes", "1")
    per_step = mlprof("flamegraph", str(capture), "--max-nodes", "1", "--per-step")
    assert whole.returncode == per_step.returncode == 0, per_step.stderr
    assert int(per_step.stdout.split()[-1]) == round(int(whole.stdout.split()[-1]) / 3)


def test_session_id_in_the_store(capture: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    session = store / "plugins" / "profile" / "2025_01_01_12_00_00"
    session.mkdir(parents=True)
    shutil.copy(capture, session / "host-a.xplane.pb")
    done = mlprof("flamegraph", "2025_01_01_12_00_00", "--store", str(store), "--max-nodes", "2")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"jit_train_step;other {int(done.stdout.split()[-1])}\n"
    (tmp_path / "outside").mkdir()
    escape = mlprof("flamegraph", "../../../outside", "--store", str(store))
    assert escape.returncode == 1, escape.stderr
    assert f"no such session in the store {store}" in escape.stderr  # names the store


def _deep_pprof(path: Path, depth: int) -> None:
    """A memory pprof whose one stack is ``depth`` frames deep (f0 calls f1 calls ...)."""
    graph = FlameGraph(sample_type="inuse_space", unit="bytes", profile_name="memory")
    graph.add([FrameLabel(f"f{i}", "deep.py", i + 1) for i in range(depth)], 4096)
    graph.add([FrameLabel(f"f{i}", "deep.py", i + 1) for i in range(depth // 2)], 1024)
    path.write_bytes(encode_pprof(graph))


def test_html_of_a_1200_deep_stack_renders_and_counts_frames_as_the_cli(
    tmp_path: Path,
    chromium_dom: Dom,
) -> None:
    source = tmp_path / "deep.pprof.gz"
    _deep_pprof(source, 1200)  # rendering used to fail past ~500 (RecursionError)
    page = tmp_path / "deep.html"
    done = mlprof("flamegraph", str(source), "--format", "html", "-o", str(page))
    assert done.returncode == 0, done.stderr  # was a RecursionError past ~500 frames
    said = re.search(r"\((\d+) frames, total", done.stderr)
    assert said is not None and said.group(1) == "1200"
    dom = chromium_dom(page)
    assert 'data-ready="1"' in dom
    status = re.search(r'id="status"[^>]*data-frames="(\d+)"[^>]*data-drawn="(\d+)"', dom)
    assert status is not None and status.group(1) == "1200"
    assert "1,200 frames (" in dom and " drawn; narrower than 0.05% of the view are not)" in dom
    frames = _frames(dom)
    assert len(frames) == int(status.group(2))
    deepest = max(frames, key=lambda f: f["path"].count(";"))
    assert deepest["text"] == "f1199" and deepest["path"].count(";") == 1199


def test_html_keeps_same_named_frames_of_two_files_apart(tmp_path: Path, chromium_dom: Dom) -> None:
    graph = FlameGraph(sample_type="inuse_space", unit="bytes", profile_name="memory")
    graph.add(["main", FrameLabel("foo", "a.py", 10)], 100)
    graph.add(["main", FrameLabel("foo", "b.py", 3)], 50)
    source = tmp_path / "two.pprof.gz"
    source.write_bytes(encode_pprof(graph))
    page = tmp_path / "two.html"
    assert mlprof("flamegraph", str(source), "--format", "html", "-o", str(page)).returncode == 0
    frames = _frames(chromium_dom(page))
    foos = sorted((f["path"], f["total"]) for f in frames if f["text"] == "foo")
    assert foos == [("main;foo@a.py:10", "100"), ("main;foo@b.py:3", "50")]
    zoomed = _frames(chromium_dom(page, "zoom=" + quote("main;foo@b.py:3")))
    assert [(f["path"], f["total"]) for f in zoomed] == [("main;foo@b.py:3", "50")]


def test_flamegraph_of_a_capture_imports_only_what_it_needs(capture: Path, tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from exporter.cli import main\n"
        "try:\n"
        "    main(sys.argv[1:])\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = ['pydantic', 'exporter.config', 'exporter.cli_capture', 'httpx', "
        "'exporter.profiles.memory', 'exporter.profiles.html']\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "flamegraph", str(capture), "-o", str(tmp_path / "f")],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"  # settings, capture commands, memory, HTML: not loaded
    assert (tmp_path / "f").read_text().startswith("jit_train_step;")
    # Listing the commands still finds the capture commands.
    listed = mlprof("--help")
    assert "capture" in listed.stdout and "sessions" in listed.stdout


def test_an_embedded_flame_graph_is_as_tall_as_its_depth(tmp_path: Path, chromium_dom: Dom) -> None:
    from exporter.profiles.html import render_html

    def page(depth: int) -> str:
        graph = FlameGraph(sample_type="wall", unit="nanoseconds")
        graph.add([f"f{i}" for i in range(depth)], 1000)
        # As the report embeds it (exporter/analysis/report/render.py): a fixed 520 px iframe.
        frame = html.escape(render_html(graph), quote=True)
        return f'<iframe style="width: 100%; height: 520px" srcdoc="{frame}"></iframe>'

    heights = {}
    for depth in (3, 40):
        report = tmp_path / f"report-{depth}.html"
        report.write_text(f"<!DOCTYPE html><html><body>{page(depth)}</body></html>")
        style = re.search(r'<iframe style="([^"]*)"', chromium_dom(report))
        assert style is not None
        found = re.search(r"height: (\d+)px", style.group(1))
        assert found is not None, style.group(1)
        heights[depth] = int(found.group(1))
    # 18 px a row: 3 rows no longer sit in 520 px (80 % empty), 40 rows are not cut off.
    assert 3 * 18 < heights[3] < 260
    assert heights[40] > 40 * 18


def test_the_host_page_says_its_total_sums_concurrent_threads(
    tmp_path: Path, chromium_dom: Dom
) -> None:
    from exporter.profiles.html import render_html

    graph = FlameGraph(sample_type="wall", unit="nanoseconds")
    graph.add(["python", "train_step"], 2_000_000_000)
    graph.add(["tf_XLAEigen", "dot"], 1_443_000_000)  # 3.443 s in a 2 s capture
    page = tmp_path / "host.html"
    page.write_text(render_html(graph))
    status = re.search(r'<span id="status"[^>]*>([^<]*)</span>', chromium_dom(page))
    assert status is not None
    assert status.group(1).startswith("total 3.443 s (summed over 2 concurrent threads) · ")

"""Bounded Python children, and one memory budget for the sidecar's process tree.

The sidecar never converts or analyses a file in its own process: a capture, a memory
profile or a snapshot is written by the workload (or anyone with access to the shared
directory), and a hostile or simply huge file must not wedge or crash the sidecar. Every
such child starts here (:func:`run_python`): ``python -m MODULE ARGS`` or ``python -c
CODE ARGS`` with

- a memory limit that the child sets on itself before it imports or reads anything
  (``RLIMIT_AS``, or ``RLIMIT_DATA`` for a child whose interpreter maps more than it
  touches). The sidecar never forks to set it (no ``preexec_fn``): a fork copies the
  state of its gRPC, OTLP and worker threads, so Python spawns the child without one;
- a deadline, after which the child is killed;
- one BLAS/OpenMP thread (each reserves address space; nothing here is BLAS-bound);
- a one-line error from its stderr (:func:`last_message`), never a traceback.

A container's memory limit counts the children too, so a burst of children, each within
its own limit, could still get the sidecar OOM-killed beside the training job. Each child
therefore reserves its limit from a :class:`MemoryBudget` before it starts and gives it
back when it ends; one that does not fit waits, first come first served, for at most as
long as it may run. A child asking for more than the whole budget runs alone with its
limit lowered to the budget (logged and counted). The budget
(``MLPROF_MEMORY_LIMIT_MB``) defaults to the cgroup's limit minus
:data:`SIDECAR_HEADROOM_MB` (:func:`default_memory_limit_mb`).

A child that starts children of its own (the analysis child runs XProf's converters)
passes its reservation down: inside a child, the default budget is what its own limit
leaves after its resident memory, so the tree never holds more than the top reservation.

    >>> budget = MemoryBudget(1024)
    >>> with budget.reserve(600, "conversion", wait_s=1.0) as granted:
    ...     granted
    600
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from exporter.ascii_digits import parse_ascii_int

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter, Observation

    from exporter.config import Settings

__all__ = [
    "CHILD_MEMORY_ENV",
    "DEFAULT_MEMORY_LIMIT_MB",
    "SIDECAR_HEADROOM_MB",
    "BudgetEvent",
    "ChildResult",
    "MemoryBudget",
    "default_budget",
    "default_memory_limit_mb",
    "last_message",
    "limit_memory",
    "run_python",
    "set_default_budget",
]

log = logging.getLogger(__name__)

MIB = 1 << 20
# What the sidecar's own process keeps out of the container's limit: its threads, the
# metric series of 1,000 runs, /metrics rendering, a report's JSON. A running sidecar
# sits near 150-250 MiB; twice that leaves room for a burst of ingest bodies (16 MiB each).
SIDECAR_HEADROOM_MB = 512
# The budget where no cgroup limits memory (a laptop, a VM): two children at the default
# analysis bound (MLPROF_REPORT_MAX_MEMORY_MB, 4096) at once, or the machine's memory
# less the headroom where that is smaller.
DEFAULT_MEMORY_LIMIT_MB = 8192
# Set in each child's environment: its own memory limit (MiB), which children it starts
# share (the nested default budget above).
CHILD_MEMORY_ENV = "MLPROF_SANDBOX_MEMORY_MB"
CGROUP_ROOT = Path("/sys/fs/cgroup")
# cgroup v1 writes "no limit" as the largest page-aligned signed 64-bit number.
_UNLIMITED_BYTES = 1 << 60
_ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
# Lines of a child's stderr that are not its error: interpreter noise at exit, and the
# frames of a traceback (the exception line itself is kept).
_NOISE = ("Exception ignored in", "Traceback (most recent call last)", "During handling of",
          "The above exception", "  ", "\t", "^", "~")  # fmt: skip
# How running out of an address-space limit reads on a child's last line: Python's own
# error, C++'s, glibc's (thread data), the dynamic loader's (a shared library numpy loads),
# OpenBLAS's (its buffers at numpy's import: "Memory allocation still failed after 10
# retries", seen under a busy machine's CI run).
_OUT_OF_MEMORY = (
    "memoryerror",
    "bad_alloc",
    "cannot allocate memory",
    "failed to map segment",
    "memory allocation still failed",
)
# The child's first lines, run by ``python -c``: the limit is set before anything else is
# imported (limit_memory's lines, inlined: nothing of ours is imported yet), then the
# module (or code) runs as ``python -m`` (or ``-c``) would run it.
_BOOT = """\
import resource, sys
kind, mb, mode, target, *rest = sys.argv[1:]
if int(mb) > 0:
    which = resource.RLIMIT_AS if kind == "as" else resource.RLIMIT_DATA
    hard = resource.getrlimit(which)[1]
    soft = int(mb) << 20
    resource.setrlimit(which, (soft if hard < 0 else min(soft, hard), hard))
del resource
if mode == "-m":
    import runpy
    sys.argv = [target, *rest]
    runpy.run_module(target, run_name="__main__", alter_sys=True)
else:
    sys.argv = ["-c", *rest]
    exec(compile(target, "<string>", "exec"), {"__name__": "__main__"})
"""


# -- the budget ----------------------------------------------------------------------
def default_memory_limit_mb(cgroup_root: Path = CGROUP_ROOT, meminfo: Path | None = None) -> int:
    """The budget when ``MLPROF_MEMORY_LIMIT_MB`` is unset: see the module docstring.

    The cgroup's ``memory.max`` (v2) or ``memory/memory.limit_in_bytes`` (v1) minus
    :data:`SIDECAR_HEADROOM_MB`; with no limit, :data:`DEFAULT_MEMORY_LIMIT_MB` or the
    machine's ``MemTotal`` less the headroom where smaller. Never below 256 MiB.
    """
    limit: int | None = None
    for name in ("memory.max", "memory/memory.limit_in_bytes"):
        try:
            text = (cgroup_root / name).read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            continue
        if text.isdigit() and int(text) < _UNLIMITED_BYTES:
            limit = int(text) // MIB
        break  # the first file that exists answers ("max": no limit)
    if limit is None:
        limit = DEFAULT_MEMORY_LIMIT_MB + SIDECAR_HEADROOM_MB
        total = _mem_total_mb(meminfo or Path("/proc/meminfo"))
        if total is not None:
            limit = min(limit, total)
    return max(256, limit - SIDECAR_HEADROOM_MB)


def _mem_total_mb(meminfo: Path) -> int | None:
    try:
        for line in meminfo.read_text(encoding="ascii").splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError, UnicodeDecodeError):
        pass
    return None


@dataclass(frozen=True)
class BudgetEvent:
    """One step of a child's reservation: ``wait``, ``start``, ``end``, ``timeout``."""

    kind: Literal["wait", "start", "end", "timeout"]
    what: str
    mb: int
    reserved_mb: int  # reserved over all children after this step


@dataclass
class _Ticket:
    order: int
    mb: int


class MemoryBudget:
    """Memory shared by every bounded child of one process; children reserve, then run.

    ``limit_mb`` is the budget; ``used_mb`` what else already holds part of it (a child
    passing its reservation down counts its own resident memory). ``meter`` makes the
    queue, the reserved bytes and the waits metrics. ``record`` keeps the last events
    (:class:`BudgetEvent`) for tests and the bench to read.
    """

    def __init__(
        self,
        limit_mb: int,
        *,
        used_mb: Callable[[], int] = lambda: 0,
        meter: Meter | None = None,
        record_size: int = 1000,
    ) -> None:
        if limit_mb <= 0:
            raise ValueError(f"memory budget {limit_mb} MiB: expected a positive number")
        self.limit_mb = limit_mb
        self.used_mb = used_mb
        self.reserved_mb = 0
        self.peak_reserved_mb = 0
        self.record: collections.deque[BudgetEvent] = collections.deque(maxlen=record_size)
        self._queue: collections.deque[_Ticket] = collections.deque()
        self._order = itertools.count()
        self._cond = threading.Condition()
        self._waits = self._lowered = None
        if meter is not None:
            meter.create_observable_gauge(
                "mlprof.children.waiting",
                callbacks=[lambda _options: [_observation(len(self._queue))]],
                unit="{child}",
                description="Bounded children waiting for memory budget before they start.",
            )
            meter.create_observable_gauge(
                "mlprof.children.memory_reserved",
                callbacks=[lambda _options: [_observation(self.reserved_mb * MIB)]],
                unit="By",
                description="Memory limits of the running bounded children, reserved from "
                "the budget.",
            )
            meter.create_observable_gauge(
                "mlprof.children.memory_budget",
                callbacks=[lambda _options: [_observation(self.limit_mb * MIB)]],
                unit="By",
                description="Memory the bounded children may reserve together "
                "(MLPROF_MEMORY_LIMIT_MB).",
            )
            self._waits = meter.create_counter(
                "mlprof.children.budget_waits",
                unit="{child}",
                description="Children that waited for memory budget, by outcome (started, "
                "timeout: not run).",
            )
            self._lowered = meter.create_counter(
                "mlprof.children.limit_lowered",
                unit="{child}",
                description="Children whose memory limit was over the whole budget and was "
                "lowered to it.",
            )
            for outcome in ("started", "timeout"):
                self._waits.add(0, {"outcome": outcome})
            self._lowered.add(0)

    @classmethod
    def from_settings(
        cls, settings: Settings, meter: Meter | None = None, cgroup_root: Path = CGROUP_ROOT
    ) -> MemoryBudget:
        """The sidecar's budget: ``MLPROF_MEMORY_LIMIT_MB``, else the cgroup's less headroom."""
        return cls(settings.memory_limit_mb or default_memory_limit_mb(cgroup_root), meter=meter)

    @property
    def waiting(self) -> int:
        """Children queued for budget now."""
        return len(self._queue)

    def grant_mb(self, mb: int) -> int:
        """What a request for ``mb`` gets: at most the whole budget less what is used."""
        return max(1, min(mb, self.limit_mb - self.used_mb()))

    @contextmanager
    def reserve(self, mb: int, what: str, wait_s: float) -> Iterator[int]:
        """Hold ``mb`` (lowered to the budget if over it) while the block runs.

        Waits in arrival order for at most ``wait_s``; raises :class:`TimeoutError`
        (one line) if the budget did not free up by then. Yields the MiB granted.
        """
        granted = self.grant_mb(mb)
        if granted < mb:
            # Over the whole budget: said loudly. Inside a child passing its reservation
            # down, a grandchild gets what its parent's own memory leaves: expected.
            level = logging.WARNING if mb > self.limit_mb else logging.DEBUG
            log.log(
                level,
                "%s: memory limit %d MiB is over the children's budget (%d MiB, %d MiB used "
                "otherwise); lowered to %d MiB (MLPROF_MEMORY_LIMIT_MB)",
                what, mb, self.limit_mb, self.limit_mb - granted, granted,
            )  # fmt: skip
            if self._lowered is not None:
                self._lowered.add(1)
        self._acquire(_Ticket(next(self._order), granted), what, wait_s)
        try:
            yield granted
        finally:
            with self._cond:
                self.reserved_mb -= granted
                self._event("end", what, granted)
                self._cond.notify_all()

    def _acquire(self, ticket: _Ticket, what: str, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        with self._cond:
            self._queue.append(ticket)
            waited = False
            try:
                while not (self._queue[0] is ticket and self._fits(ticket.mb)):
                    if not waited:
                        waited = True
                        self._event("wait", what, ticket.mb)
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self._event("timeout", what, ticket.mb)
                        self._count_wait("timeout")
                        raise TimeoutError(
                            f"waited over {wait_s:g}s for {ticket.mb} MiB of the children's "
                            f"{self.limit_mb} MiB memory budget (MLPROF_MEMORY_LIMIT_MB)"
                        )
                    # used_mb may fall without a notify (a parent's memory): look again.
                    self._cond.wait(min(left, 1.0))
            finally:
                self._queue.remove(ticket)
                self._cond.notify_all()  # the next in line may fit now
            self.reserved_mb += ticket.mb
            self.peak_reserved_mb = max(self.peak_reserved_mb, self.reserved_mb)
            self._event("start", what, ticket.mb)
            if waited:
                self._count_wait("started")

    def _fits(self, mb: int) -> bool:
        # Alone, a child always fits: its grant is at most the limit (what a parent's
        # own memory takes is its limit's business, not a reason to wait forever).
        return self.reserved_mb == 0 or self.reserved_mb + mb + self.used_mb() <= self.limit_mb

    def _event(self, kind: Literal["wait", "start", "end", "timeout"], what: str, mb: int) -> None:
        self.record.append(BudgetEvent(kind, what, mb, self.reserved_mb))

    def _count_wait(self, outcome: str) -> None:
        if self._waits is not None:
            self._waits.add(1, {"outcome": outcome})


def _observation(value: float) -> Observation:
    from opentelemetry.metrics import Observation

    return Observation(value)


def _own_rss_mb() -> int:
    try:
        pages = int(Path("/proc/self/statm").read_text(encoding="ascii").split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE") // MIB


_default: MemoryBudget | None = None
_default_lock = threading.Lock()


def default_budget() -> MemoryBudget:
    """This process's budget: the one :func:`set_default_budget` gave, else one made
    from the environment (``MLPROF_MEMORY_LIMIT_MB``, or inside a bounded child its own
    limit less its resident memory), without metrics."""
    global _default
    with _default_lock:
        if _default is None:
            inherited = os.environ.get(CHILD_MEMORY_ENV, "")
            inherited_mb = parse_ascii_int(inherited) or 0  # '²'.isdigit(): ASCII only
            if inherited_mb > 0:
                _default = MemoryBudget(inherited_mb, used_mb=_own_rss_mb)
            else:
                _default = MemoryBudget(_limit_from_env())
        return _default


def set_default_budget(budget: MemoryBudget | None) -> None:
    """Make ``budget`` this process's (the sidecar's, with its meter); None: rebuild."""
    global _default
    with _default_lock:
        _default = budget


def _limit_from_env() -> int:
    text = os.environ.get("MLPROF_MEMORY_LIMIT_MB", "").strip()
    limit_mb = parse_ascii_int(text) or 0  # '²'.isdigit() is True; int('²') raises
    if limit_mb > 0:
        return max(256, limit_mb)  # the setting's own floor (config.Settings)
    return default_memory_limit_mb()


# -- the child -----------------------------------------------------------------------
def limit_memory(mb: int, kind: Literal["as", "data"] = "as") -> None:
    """Bound this process's address space (or data segment) to ``mb`` MiB.

    For a child run by hand (``--max-memory-mb``); :func:`run_python`'s children set the
    same limit in their first lines (``_BOOT``), before this module could be imported.
    """
    import resource

    which = resource.RLIMIT_AS if kind == "as" else resource.RLIMIT_DATA
    hard = resource.getrlimit(which)[1]
    soft = mb * MIB if hard == resource.RLIM_INFINITY else min(mb * MIB, hard)
    resource.setrlimit(which, (soft, hard))


@dataclass(frozen=True)
class ChildResult:
    """How a child ended: ``returncode`` (None: never ran or was stopped) and its output.

    ``memory_mb`` is the limit it ran under (lowered from ``asked_mb`` when that was over
    the whole budget); ``error`` the one-line reason when it did not exit 0.
    """

    returncode: int | None
    stdout: bytes = b""
    stderr: str = ""
    seconds: float = 0.0
    memory_mb: int = 0
    asked_mb: int = 0
    error: str = ""
    timed_out: bool = False
    no_budget: bool = False
    notes: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def killed(self) -> bool:
        """Ended by a signal (the kernel's OOM killer) or by running out of its limit."""
        code = self.returncode
        return code is not None and (
            code < 0 or any(sign in self.error.lower() for sign in _OUT_OF_MEMORY)
        )


def run_python(
    target: Sequence[str],
    *,
    memory_mb: int,
    timeout_s: float,
    what: str,
    limit: Literal["as", "data"] = "as",
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    pass_fds: Sequence[int] = (),
    budget: MemoryBudget | None = None,
    wait_s: float | None = None,
) -> ChildResult:
    """Run ``python -m MODULE ARGS`` (``target = ["-m", MODULE, *ARGS]``) or ``python -c
    CODE ARGS`` in a bounded child; see the module docstring.

    ``memory_mb``: the child's limit (``limit`` picks RLIMIT_AS or RLIMIT_DATA), reserved
    from ``budget`` (default :func:`default_budget`) before it starts; 0: no limit and no
    reservation. It waits for the budget at most ``wait_s`` (default ``timeout_s``), then
    runs for at most ``timeout_s``. ``env`` is added to this process's environment (and
    this package to ``PYTHONPATH``: a child run from another ``cwd`` finds it). stdin is
    /dev/null; ``pass_fds`` stay open in the child.
    """
    if len(target) < 2 or target[0] not in ("-m", "-c"):
        raise ValueError(f"child {list(target)[:2]!r}: expected -m MODULE or -c CODE")
    budget = budget if budget is not None else default_budget()
    started = time.monotonic()
    if memory_mb <= 0:
        return _spawn(target, 0, 0, limit, timeout_s, env, cwd, pass_fds, started)
    try:
        with budget.reserve(memory_mb, what, timeout_s if wait_s is None else wait_s) as granted:
            notes: tuple[str, ...] = ()
            if granted < memory_mb:
                notes = (f"limit lowered from {memory_mb} to the {granted} MiB budget",)
            result = _spawn(target, granted, memory_mb, limit, timeout_s, env, cwd, pass_fds,
                            time.monotonic())  # fmt: skip
    except TimeoutError as exc:
        return ChildResult(None, seconds=time.monotonic() - started, memory_mb=0,
                           asked_mb=memory_mb, error=str(exc), no_budget=True)  # fmt: skip
    return dataclasses.replace(result, notes=notes) if notes else result


def _spawn(
    target: Sequence[str],
    memory_mb: int,
    asked_mb: int,
    limit: str,
    timeout_s: float,
    env: dict[str, str] | None,
    cwd: str | Path | None,
    pass_fds: Sequence[int],
    started: float,
) -> ChildResult:
    child_env = {**os.environ, **(env or {}), **_ONE_THREAD, CHILD_MEMORY_ENV: str(memory_mb)}
    child_env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(Path(__file__).resolve().parent.parent), child_env.get("PYTHONPATH")])
    )
    command = [sys.executable, "-c", _BOOT, limit, str(memory_mb), *target]
    try:
        done = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout_s,
            env=child_env,
            cwd=cwd,
            pass_fds=tuple(pass_fds),
            check=False,
        )
    except subprocess.TimeoutExpired:
        return ChildResult(None, seconds=time.monotonic() - started, memory_mb=memory_mb,
                           asked_mb=asked_mb, error=f"took over {timeout_s:g}s and was stopped",
                           timed_out=True)  # fmt: skip
    except OSError as exc:
        reason = f"cannot start a child process ({exc.strerror or exc})"
        return ChildResult(None, memory_mb=memory_mb, asked_mb=asked_mb, error=reason)
    stderr = done.stderr.decode("utf-8", "replace")
    error = "" if done.returncode == 0 else (last_message(stderr) or f"exit {done.returncode}")
    return ChildResult(done.returncode, done.stdout, stderr, time.monotonic() - started,
                       memory_mb, asked_mb, error[:500])  # fmt: skip


def last_message(stderr: str) -> str:
    """The child's own last message: ``mlprof: ...`` if it wrote one, else the last
    exception line, never a traceback frame or "Exception ignored in:" noise."""
    lines = [ln.rstrip() for ln in stderr.splitlines() if ln.strip()]
    own = [ln for ln in lines if ln.startswith("mlprof: ")]
    if own:
        return own[-1]
    real: list[str] = []
    ignored = False  # inside an "Exception ignored in:" report, up to its exception line
    for line in lines:
        if line.startswith("Exception ignored in"):
            ignored = True
        elif line.startswith(_NOISE):
            continue
        elif ignored:
            ignored = False  # the ignored exception itself: not why the child failed
        else:
            real.append(line)
    return (real or lines or [""])[-1].strip()

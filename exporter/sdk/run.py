"""``sdk.run``: a training run's identity, configs and step log in the shared dir."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import errno
import importlib.metadata
import json
import math
import os
import platform
import re
import secrets
import socket
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from exporter import schema
from exporter.sdk.host_profile import HostProfiler, HostProfiling, check_phase, options_from_env
from exporter.sdk.memory import MemoryProfiler, interval_from_env
from exporter.sdk.memory_stats import MemoryStatsSampler, jax_local_devices
from exporter.sdk.mfu import MfuBasis, chip_peak, xla_step_flops
from exporter.sdk.profile import Profile
from exporter.sdk.steplog import StepLogWriter
from exporter.sdk.torch_memory import DEFAULT_MAX_ENTRIES, record_history, stop_history
from exporter.sdk.torch_profile import TorchTraceHandler, torch_profile

__all__ = ["Run", "run"]

_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]{0,63}$")
DEFAULT_SHARED_DIR = "./mlprof-data/shared"
MAX_PHASES = 32  # distinct run.phase() names per run: label values, so a bounded set


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _software() -> dict[str, str | None]:
    return {
        "python": platform.python_version(),
        "jax": _version("jax"),
        "jaxlib": _version("jaxlib"),
        "libtpu": _version("libtpu") or _version("libtpu-nightly"),
        "torch": _version("torch"),
        "mlprof_exporter": _version("mlprof-exporter"),
    }


def _system() -> dict[str, Any]:
    info: dict[str, Any] = {"platform": platform.platform(), "cpu_count": os.cpu_count()}
    # Never import JAX, nor initialise its backends, on the workload's behalf: on
    # multi-host TPU that would break a later jax.distributed.initialize().
    devices = jax_local_devices()
    if not devices:
        return info
    jax = sys.modules["jax"]
    info.update(
        backend=jax.default_backend(),
        device_kind=devices[0].device_kind,
        device_count=jax.device_count(),
        local_device_count=len(devices),
        process_index=jax.process_index(),
        process_count=jax.process_count(),
    )
    return info


def _new_run_id(name: str) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return f"{re.sub(r'[^a-zA-Z0-9-]', '-', name)[:40]}-{stamp}-{secrets.token_hex(2)}"


def _port_taken(port: int) -> bool:
    """Whether a server listens on ``port`` (any address) already.

    The probe binds with SO_REUSEADDR, so sockets in TIME_WAIT left by a previous run do
    not count, and without SO_REUSEPORT, so a listener does.
    """
    for family, address in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            probe = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 on this host: try IPv4
        with probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            try:
                probe.bind((address, port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return True
                continue
            return False
    return False


def _positive(name: str, value: float) -> float:
    number = float(value)
    if not (math.isfinite(number) and number > 0):
        raise ValueError(f"{name} {value!r}: expected a positive finite number")
    return number


def _config_fingerprint(configs: Mapping[str, Any]) -> str:
    """``schema.config_fingerprint`` of the configs as ``run.json`` holds them.

    Taken after a JSON round trip, so the sidecar computing it again from an older
    SDK's ``run.json`` gets the same value, and keys JSON sorts badly (``{1: .., "a":
    ..}``) are strings before they are sorted.
    """
    written = json.loads(json.dumps(configs, default=str))
    fingerprint = schema.config_fingerprint(written)
    assert fingerprint is not None  # a mapping always has one
    return fingerprint


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    tmp.replace(path)  # atomic: the sidecar never reads half a file


class _Step:
    """Context manager timing one step; reused per run to keep ``step()`` cheap."""

    __slots__ = ("_run", "_start", "_tokens", "_wall")

    def __init__(self, run: Run) -> None:
        self._run = run
        self._tokens = 0
        self._start = 0.0
        self._wall = 0.0

    def __enter__(self) -> _Step:
        self._wall = time.time()
        self._start = time.perf_counter()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        end = time.perf_counter()
        run = self._run
        if exc_type is not None:
            run._last_end = end  # a step that raised did not complete: not counted
            return
        wait = self._start - run._last_end if run._last_end else 0.0
        run._last_end = end
        run.step_number += 1
        duration = end - self._start
        run._writer.append(
            f'{run._step_prefix}"step":{run.step_number},"start":{self._wall:.6f},'
            f'"duration":{duration:.9f},"wait":{wait:.9f},"tokens":{self._tokens}}}\n'
        )
        scale = run._mfu_scale  # FLOPs per step / peak FLOP/s, once both are known
        if scale is not None and duration > 0:
            run._writer.append(
                f'{run._mfu_record_prefix}{scale / duration:.6g},"step":{run.step_number},'
                f'"time":{self._wall + duration:.6f}}}\n'
            )


class _TaggedStep(_Step):
    """A step whose samples the host profiler labels ``phase="step"``.

    The tag goes on before the clock starts and off after it stops, so the step's
    recorded duration does not include the agent calls.
    """

    __slots__ = ("_profiler",)

    def __init__(self, run: Run, profiler: HostProfiler) -> None:
        super().__init__(run)
        self._profiler = profiler

    def __enter__(self) -> _Step:
        self._profiler.enter(schema.STEP_PHASE)
        self._wall = time.time()  # as _Step.__enter__, inlined: this runs every step
        self._start = time.perf_counter()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        try:
            _Step.__exit__(self, exc_type, *exc)
        finally:
            self._profiler.leave()


class _Phase:
    """``with run.phase("data"):`` — tags host-profile samples while inside."""

    __slots__ = ("_name", "_profiler")

    def __init__(self, name: str, profiler: HostProfiler | None) -> None:
        self._name = name
        self._profiler = profiler

    def __enter__(self) -> _Phase:
        if self._profiler is not None:
            self._profiler.enter(self._name)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._profiler is not None:
            self._profiler.leave()


class Run:
    """One training run as the sidecar sees it. Create it with :func:`run`."""

    def __init__(
        self,
        name: str,
        shared_dir: Path,
        configs: Mapping[str, Any] | None,
        profiler_port: int | None,
        run_id: str | None,
        host: str | None,
        host_profiling: HostProfiling | None = None,
        flops_per_step: float | None = None,
        peak_flops: float | None = None,
    ) -> None:
        self.name = name
        self.shared_dir = shared_dir
        self.configs = dict(configs or {})
        # With the name, which runs are the same workload (docs/analysis.md): the configs
        # are fixed at the start, so it is computed once.
        self.config_fingerprint = _config_fingerprint(self.configs)
        self.profiler_port = profiler_port
        self.run_id = run_id or os.environ.get("MLPROF_RUN_ID") or _new_run_id(name)
        self.host = host or socket.gethostname()
        self.step_number = 0
        self._last_end = 0.0
        self._step_obj = _Step(self)
        self._writer: StepLogWriter
        self._step_prefix = ""
        self._record_prefix = ""
        self._end_prefix = ""
        self._profiler_started = False
        self._memory: MemoryProfiler | None = None
        self._info: dict[str, Any] = {}
        self._closed = True
        self.host_profiling = host_profiling
        self.host_profiler: HostProfiler | None = None
        self._phases: dict[str, _Phase] = {}
        self._mfu = MfuBasis()
        if flops_per_step is not None:
            self._mfu.flops_per_step = _positive("flops_per_step", flops_per_step)
            self._mfu.flops_source = "user"
        if peak_flops is not None:
            self._mfu.peak_flops = _positive("peak_flops", peak_flops)
            self._mfu.peak_source = "user"
        self._mfu_scale: float | None = None
        self._mfu_line: str | None = None  # the last basis written (rewritten on change)
        self._mfu_lock = threading.Lock()

    # -- lifecycle -------------------------------------------------------------
    def start(self) -> Run:
        """Write ``run.json``, open the step log and start the profiler server."""
        if self.profiler_port is not None and _port_taken(self.profiler_port):
            # JAX's gRPC server binds with SO_REUSEPORT: a second one on a taken port
            # starts without error and the two share (and mix up) the captures.
            print(
                f"mlprof: profiler port {self.profiler_port} is already in use (another "
                f"run's profiler server?); run {self.run_id} starts none: pass a free "
                "profiler_port to capture it",
                file=sys.stderr,
            )
            self.profiler_port = None  # run.json must not claim the other run's server
        if self.profiler_port is not None:
            import jax.profiler

            jax.profiler.start_server(self.profiler_port)
            self._profiler_started = True
        identity = {"run_id": self.run_id, "workload": self.name, "host": self.host}
        log = (
            self.shared_dir
            / schema.STEPS_DIR
            / f"{self.host}-{os.getpid()}{schema.STEP_LOG_SUFFIX}"
        )
        self._writer = StepLogWriter(log, identity)
        self._step_prefix = '{"kind":"step",' + self._writer.prefix[1:]
        self._record_prefix = '{"kind":"record",' + self._writer.prefix[1:]
        self._end_prefix = '{"kind":"end",' + self._writer.prefix[1:]
        self._mfu_prefix = '{"kind":"mfu_basis",' + self._writer.prefix[1:]
        self._mfu_record_prefix = self._record_prefix + '"name":"mfu","value":'
        self._memory = MemoryProfiler(self.shared_dir, self._file_identity(), interval_from_env())
        self._writer.on_tick.append(self._memory.tick)
        self._writer.on_tick.append(
            MemoryStatsSampler.for_writer_prefix(self._writer.prefix, self._writer.append).tick
        )
        if self.host_profiling is not None:
            profiler = HostProfiler(self.host_profiling, identity, self.shared_dir)
            if not profiler.start():
                self._writer.on_tick.append(profiler.tick)  # e.g. the sidecar starts later
            self.host_profiler = profiler
            self._step_obj = _TaggedStep(self, profiler)
        self._info = self.info()
        self._write_run_files()
        self._resolve_mfu()
        if "backend" not in self._info["system"] and "jax" in sys.modules:
            # JAX's backends start later (after jax.distributed.initialize()): record the
            # devices from the flusher thread once they exist.
            self._writer.on_tick.append(self._complete_system_info)
        self._closed = False
        atexit.register(self.close)
        return self

    def _process_file(self) -> Path:
        # Named like the step log: the sidecar pairs a process's record with its heartbeat.
        return self.shared_dir / schema.PROCS_DIR / f"{self.host}-{os.getpid()}.json"

    def _write_run_files(self) -> None:
        _write_json(self.shared_dir / schema.RUNS_DIR / f"{self.run_id}.json", self._info)
        _write_json(self._process_file(), self._info)
        _write_json(self.shared_dir / schema.RUN_FILE, self._info)

    def _complete_system_info(self) -> None:
        system = _system()
        if "backend" in system:
            self._info["system"] = system
            self._write_run_files()
            with contextlib.suppress(ValueError):  # step_function() may have got here first
                self._writer.on_tick.remove(self._complete_system_info)
            self._resolve_mfu()  # the device kind is known now: its peak may be too

    def _resolve_mfu(self) -> None:
        """Fill the peak from the chip table, and write the basis line if it changed."""
        with self._mfu_lock:  # the flusher thread may call this too
            self._resolve_mfu_locked()

    def _resolve_mfu_locked(self) -> None:
        basis = self._mfu
        basis.device_kind = self._info.get("system", {}).get("device_kind")
        if basis.peak_source != "user":
            peak = chip_peak(basis.device_kind) if basis.device_kind else None
            basis.peak_flops = peak.flops_per_s if peak else None
            basis.peak_source = "table" if peak else None
            basis.peak_name = peak.name if peak else None
        fields = {
            "flops_per_step": basis.flops_per_step,
            "flops_source": basis.flops_source,
            "peak_flops": basis.peak_flops,
            "peak_source": basis.peak_source,
            "peak_name": basis.peak_name,
            "device_kind": basis.device_kind,
            "note": basis.note(),
        }
        line = json.dumps(fields, separators=(",", ":"))[1:]
        if line != self._mfu_line:
            self._mfu_line = line
            self._writer.append(f'{self._mfu_prefix}"time":{time.time():.6f},{line}\n')
        self._mfu_scale = basis.scale()

    def close(self) -> None:
        """Flush the step log, mark the run ended and stop the profiler server."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        ended = time.time()
        self._writer.append(f'{self._end_prefix}"time":{ended:.6f}}}\n')
        self._writer.close()
        if self.host_profiler is not None:
            self.host_profiler.stop()
        if self._memory is not None and self._memory.torch_history:
            stop_history()
            self._memory.torch_history = False
        # The sidecar's target discovery skips ended processes (their port may be reused).
        self._info["ended_unix"] = ended
        with contextlib.suppress(OSError):
            _write_json(self._process_file(), self._info)
            _write_json(self.shared_dir / schema.RUNS_DIR / f"{self.run_id}.json", self._info)
        if self._profiler_started:
            import jax.profiler

            jax.profiler.stop_server()  # type: ignore[no-untyped-call]
            self._profiler_started = False

    def __enter__(self) -> Run:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- per step ----------------------------------------------------------------
    def step(self, tokens: int = 0) -> _Step:
        """Time one training step; use as ``with run.step(tokens=n): ...``.

        One step at a time per run: the returned object is reused, not nestable.
        """
        step = self._step_obj
        step._tokens = int(tokens)  # the line must stay valid JSON whatever is passed
        return step

    def phase(self, name: str) -> _Phase:
        """Label host-profile samples inside ``with run.phase("data"):`` with ``phase=name``.

        Costs nothing measurable without host profiling; nested phases label the
        innermost one; ``run.step()`` is the phase ``step``.
        """
        found = self._phases.get(name)
        if found is None:
            if len(self._phases) >= MAX_PHASES:
                raise ValueError(
                    f"phase {name!r}: this run already has {MAX_PHASES} phase names; each "
                    "becomes a Pyroscope label value, so keep them few and fixed"
                )
            found = self._phases[name] = _Phase(check_phase(name), self.host_profiler)
        return found

    def step_function(self, function: Any, *example_args: Any, **example_kwargs: Any) -> float:
        """Take FLOPs per step from XLA's cost analysis of the compiled step function.

        ``function`` is what one ``run.step()`` runs: a ``jax.jit``-ed function with
        example arguments (arrays or ``jax.ShapeDtypeStruct``), a ``Lowered`` or a
        ``Compiled``; lowering may compile it once more. With a peak known (the chip
        table, or ``peak_flops``) each step then records ``mfu``. A ``flops_per_step``
        given to :func:`run` wins. Returns the FLOPs per step used.
        """
        if self._closed:
            raise RuntimeError("run not started: use sdk.run(...) to start it")
        basis = self._mfu
        if basis.flops_source != "user":
            basis.flops_per_step = xla_step_flops(function, *example_args, **example_kwargs)
            basis.flops_source = "xla_cost_analysis"
        if "backend" not in self._info["system"]:
            self._complete_system_info()  # compiling started JAX's backends
        self._resolve_mfu()
        assert basis.flops_per_step is not None
        return basis.flops_per_step

    def record(self, name: str, value: float, step: int | None = None) -> None:
        """Record a user gauge such as ``loss`` or ``mfu`` (published as ``train_<name>``)."""
        if not _NAME_RE.fullmatch(name):
            raise ValueError(f"record name {name!r}: expected [a-zA-Z_][a-zA-Z0-9_]* (<= 64)")
        number = float(value)
        if not math.isfinite(number):
            return  # a NaN loss is the user's signal, not a gauge value JSON can carry
        at = self.step_number if step is None else step
        self._writer.append(
            f'{self._record_prefix}"name":"{name}","value":{number!r},"step":{at},'
            f'"time":{time.time():.6f}}}\n'
        )

    def memory_profile(self, trigger: str = "programmatic") -> Path:
        """Write a device-memory profile into the shared dir now; return its path.

        Periodic profiles: ``$MLPROF_MEMORY_PROFILE_INTERVAL_S`` (0 = off). The sidecar
        can also ask for one (``mlprof memory-profile``); both need JAX imported.
        """
        if self._memory is None:
            raise RuntimeError("run not started: use sdk.run(...) to start it")
        return self._memory.take(trigger)

    def record_memory_history(
        self, max_entries: int = DEFAULT_MAX_ENTRIES, cpp_stacks: bool = False
    ) -> bool:
        """Record PyTorch's CUDA allocator history (each allocation's stack) from now on.

        Call it before the code whose memory you want to see: blocks allocated earlier
        show as ``<stack not recorded>``. ``cpp_stacks`` adds C++ frames (slower).
        Requested and periodic memory profiles are then allocator snapshots. False, said
        in one line on stderr, without PyTorch or a CUDA device.
        """
        if self._memory is None:
            raise RuntimeError("run not started: use sdk.run(...) to start it")
        self._memory.torch_history = record_history(max_entries, cpp_stacks)
        return self._memory.torch_history

    def memory_snapshot(self, trigger: str = "programmatic") -> Path | None:
        """Write PyTorch's CUDA allocator snapshot into the shared dir now; return its path.

        The sidecar turns it into a memory flame graph (live bytes and blocks per
        allocation stack; stacks need :meth:`record_memory_history` first) and pushes it
        like a JAX profile. None, said in one line on stderr, without PyTorch or CUDA.
        """
        if self._memory is None:
            raise RuntimeError("run not started: use sdk.run(...) to start it")
        return self._memory.take_torch_snapshot(trigger)

    def profile(
        self, name: str, host_tracer_level: int = 2, python_tracer_level: int = 0
    ) -> Profile:
        """Trace this process into the capture logdir: ``with run.profile("warmup"):``.

        Also a decorator (``@run.profile("eval")``, one session per call). The sidecar
        stores, converts and pushes the session (trigger ``programmatic``); needs JAX.
        """
        return Profile(self, name, host_tracer_level, python_tracer_level)

    def torch_trace_handler(self, name: str = "trace", use_gzip: bool = False) -> TorchTraceHandler:
        """An ``on_trace_ready`` for ``torch.profiler.profile``: each trace goes into the
        shared dir, and the sidecar takes it as a session (flame graphs, push, report)."""
        return TorchTraceHandler(self.shared_dir, self._file_identity(), name, use_gzip)

    def torch_profile(self, name: str = "trace", use_gzip: bool = False, **kwargs: Any) -> Any:
        """``torch.profiler.profile(**kwargs)`` writing its traces for the sidecar:
        ``with run.torch_profile("train", schedule=..., with_stack=True) as prof:``."""
        return torch_profile(self.torch_trace_handler(name, use_gzip), **kwargs)

    def flush(self) -> None:
        """Write buffered lines now (they are written every second anyway)."""
        self._writer.flush()

    # -- identity ----------------------------------------------------------------
    def _file_identity(self) -> dict[str, str]:
        """The identity written beside each trace and memory profile: the step log's,
        and the configuration (not in every step line: the sidecar needs it per file)."""
        return {"run_id": self.run_id, "workload": self.name, "host": self.host,
                "config_fingerprint": self.config_fingerprint}  # fmt: skip

    def info(self) -> dict[str, Any]:
        """The content of ``run.json``."""
        now = time.time()
        return {
            "schema": schema.SCHEMA_VERSION,
            "run_id": self.run_id,
            "name": self.name,
            "host": self.host,
            "pid": os.getpid(),
            "start_time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
            "start_unix": now,
            "profiler_port": self.profiler_port,
            "software": _software(),
            "system": _system(),
            "configs": self.configs,
            "config_fingerprint": self.config_fingerprint,
            "host_profiling": (
                dataclasses.asdict(self.host_profiling) if self.host_profiling else None
            ),
        }


def run(
    name: str,
    shared_dir: str | os.PathLike[str] | None = None,
    configs: Mapping[str, Any] | None = None,
    profiler_port: int | None = None,
    run_id: str | None = None,
    host: str | None = None,
    host_profiling: bool | HostProfiling | None = None,
    flops_per_step: float | None = None,
    peak_flops: float | None = None,
) -> Run:
    """Start a run: writes ``run.json`` and opens the step log; use as a context manager.

    ``shared_dir`` defaults to ``$MLPROF_SHARED_DIR`` or ``./mlprof-data/shared``;
    ``run_id`` to ``$MLPROF_RUN_ID`` (set it to the same value on every host of a
    multi-host job) or a generated id. ``host_profiling`` (default
    ``$MLPROF_HOST_PROFILING``) samples the process's Python threads with pyroscope-io
    and pushes the host CPU profile under the run's labels (``HostProfiling`` options).
    ``flops_per_step`` (FLOPs one device executes per step) and ``peak_flops`` (one
    device's peak FLOP/s) override what :meth:`Run.step_function` and the chip table
    give; with both known each step records ``mfu`` (``train_mfu``).
    """
    if not name or not isinstance(name, str):
        raise ValueError("run name: expected a non-empty string")
    directory = Path(shared_dir or os.environ.get("MLPROF_SHARED_DIR") or DEFAULT_SHARED_DIR)
    options = options_from_env(host_profiling)
    return Run(
        name, directory, configs, profiler_port, run_id, host, options, flops_per_step, peak_flops
    ).start()

"""Synthetic GPU-shaped XProf captures (XSpace) for tests and benchmarks.

Planes, lines and stat names follow what XLA's CUPTI tracer writes, so XProf's own
``kernel_stats`` converter reads them: ``/device:GPU:N`` planes with ``Stream #N(...)``
lines whose kernel events carry ``kernel_details`` (the launch configuration, in
CUPTI's ``regs:32 static_shared:0 dynamic_shared:1024 grid:128,1,1 block:256,1,1
occ_pct:50.0`` form: XProf counts an event as a kernel only with it), ``hlo_module``,
``hlo_op`` and ``correlation_id``; a memcpy on a second stream with ``memcpy_details``
(not a kernel); a ``/host:CUPTI`` plane whose launching thread calls ``cuLaunchKernel``
once per kernel, with the kernel's ``correlation_id``; a ``/host:CPU`` plane with one
``StepTraceAnnotation`` (``step_num``) per step.

The launches are simulated: the host thread spends some time in Python, then in the
launch call; a kernel is ready :data:`LAUNCH_LATENCY_NS` after its call starts and
starts when it is ready and its stream is free. Short kernels leave the stream waiting
for the host (launch-bound gaps); long ones queue up (no gap). Every time is a whole
number of nanoseconds, and :class:`SyntheticGpuCapture` records what a correct reader
must find: each kernel's durations, and per device the stream time spent waiting for
a launch in progress and for a host that had not started the launch yet.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from exporter.proto import xplane_pb2

__all__ = ["GPU_KERNEL_KINDS", "LAUNCH_LATENCY_NS", "SyntheticGpuCapture", "gpu_capture",
           "write_gpu_capture"]  # fmt: skip

_PS_PER_NS = 1000
START_NS = 1_700_000_000_000_000_000  # absolute line times, as CUPTI captures have
# (kernel name, hlo_op stem, kernel_details, duration range ns): a matmul-heavy step of
# long GEMMs between short elementwise kernels, the mix that shows launch gaps.
GPU_KERNEL_KINDS = (
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "fusion",
     "regs:168 static_shared:0 dynamic_shared:98304 grid:132,1,1 block:384,1,1 occ_pct:18.75",
     (40_000, 90_000)),
    ("loop_add_fusion", "add_fusion",
     "regs:16 static_shared:0 dynamic_shared:0 grid:1024,1,1 block:128,1,1 occ_pct:100.0",
     (1_500, 4_000)),
    ("input_reduce_fusion", "reduce_fusion",
     "regs:40 static_shared:4096 dynamic_shared:0 grid:256,1,1 block:256,1,1 occ_pct:75.0",
     (3_000, 9_000)),
    ("loop_convert_fusion", "convert_fusion",
     "regs:12 static_shared:0 dynamic_shared:0 grid:512,2,1 block:64,4,1 occ_pct:100.0",
     (1_000, 2_500)),
)  # fmt: skip
# A kernel is ready to run this long after its launch call starts (CUDA's launch
# latency on current GPUs is a few microseconds).
LAUNCH_LATENCY_NS = 4_000
_API_NS = (2_500, 5_000)  # time inside cuLaunchKernel
_HOST_NS = (500, 6_000)  # Python and framework time before each launch
_STEP_PAUSE_NS = 50_000  # the host between steps (input, logging)


@dataclass
class SyntheticGpuCapture:
    """A generated XSpace and what a correct reader must find in it."""

    space: xplane_pb2.XSpace
    # (kernel name, kernel_details) -> durations ns, every kernel of every device
    kernel_ns: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    # per device plane: ns its compute stream waited for a launch (from the call's start,
    # or the stream's last end if later, to the kernel's start), and ns it waited before
    # the host had begun the launch call
    launch_wait_ns: dict[str, int] = field(default_factory=dict)
    host_wait_ns: dict[str, int] = field(default_factory=dict)
    gaps: dict[str, int] = field(default_factory=dict)  # positive gaps per device
    # ... of which the kernel's launch call had begun when the stream went idle
    launch_gaps: dict[str, int] = field(default_factory=dict)
    # per kernel name: launch latencies (kernel start - its call's start), ns
    latency_ns: dict[str, list[int]] = field(default_factory=dict)
    steps: int = 0


class _Plane:
    """One plane with its stat and event metadata tables."""

    def __init__(self, space: xplane_pb2.XSpace, name: str) -> None:
        self.plane = space.planes.add(id=len(space.planes), name=name)
        self._stats: dict[str, int] = {}
        self._metas: dict[str, int] = {}

    def stat_id(self, name: str) -> int:
        if name not in self._stats:
            found = self._stats[name] = len(self._stats) + 1
            self.plane.stat_metadata[found].id = found
            self.plane.stat_metadata[found].name = name
        return self._stats[name]

    def line(self, line_id: int, name: str, start_ns: int) -> xplane_pb2.XLine:
        line: xplane_pb2.XLine = self.plane.lines.add(
            id=line_id, name=name, display_name=name, timestamp_ns=start_ns
        )
        return line

    def event(self, line: xplane_pb2.XLine, name: str, start_ns: int, dur_ns: int,
              **stats: object) -> None:  # fmt: skip
        if name not in self._metas:
            found = self._metas[name] = len(self._metas) + 1
            self.plane.event_metadata[found].id = found
            self.plane.event_metadata[found].name = name
        event = line.events.add(
            metadata_id=self._metas[name], offset_ps=start_ns * _PS_PER_NS,
            duration_ps=dur_ns * _PS_PER_NS,
        )  # fmt: skip
        for key, value in stats.items():
            stat = event.stats.add(metadata_id=self.stat_id(key))
            if isinstance(value, str):  # strings as refs, as XProf's writers do
                stat.ref_value = self.stat_id(value)
            else:
                stat.int64_value = int(value)  # type: ignore[call-overload]


def gpu_capture(
    *,
    steps: int = 4,
    kernels_per_step: int = 24,
    devices: int = 1,
    gemm_every: int = 6,
    seed: int = 0,
    start_ns: int = START_NS,
) -> SyntheticGpuCapture:
    """A GPU-shaped capture: ``devices`` GPUs, each launched by its own host thread.

    Every ``gemm_every``-th kernel is a long GEMM (0: none, only short kernels: the
    stream waits for the host between most kernels, a launch-bound step). Lines start at
    ``start_ns`` (below 10**17: relative times, which readers holding times as float64,
    such as JAX's ``ProfileData``, keep exact).
    """
    rng = random.Random(seed)
    space = xplane_pb2.XSpace()
    out = SyntheticGpuCapture(space, steps=steps)
    host = _Plane(space, "/host:CPU")
    python = host.line(1, "python", start_ns)
    cupti = _Plane(space, "/host:CUPTI")
    gpus = [_Plane(space, f"/device:GPU:{d}") for d in range(devices)]
    correlation = 1000
    step_spans: list[tuple[int, int]] = []
    for d, gpu in enumerate(gpus):
        thread = cupti.line(4000 + d, f"{4000 + d}", start_ns)
        compute = gpu.line(7, "Stream #7(Compute)", start_ns)
        copies = gpu.line(8, "Stream #8(MemcpyH2D)", start_ns)
        plane = gpu.plane.name
        out.launch_wait_ns[plane] = out.host_wait_ns[plane] = 0
        out.gaps[plane] = out.launch_gaps[plane] = 0
        t = 0  # the host thread's clock, ns after START_NS
        free = 0  # when the compute stream is next free
        last_end: int | None = None
        for _ in range(steps):
            step_start = t
            gpu.event(copies, "MemcpyH2D", t + 200, 3_000,
                      memcpy_details="kind_src:pageable kind_dst:device size:1048576")  # fmt: skip
            for k in range(kernels_per_step):
                name, stem, details, (lo, hi) = GPU_KERNEL_KINDS[
                    0
                    if gemm_every and k % gemm_every == 0
                    else 1 + rng.randrange(len(GPU_KERNEL_KINDS) - 1)
                ]
                t += rng.randrange(*_HOST_NS)
                api = rng.randrange(*_API_NS)
                correlation += 1
                cupti.event(thread, "cuLaunchKernel", t, api, correlation_id=correlation)
                ready = t + LAUNCH_LATENCY_NS
                start = max(ready, free)
                duration = rng.randrange(lo, hi)
                if last_end is not None and start > last_end:
                    out.gaps[plane] += 1
                    # from the later of (call start, stream idle) the stream waits for
                    # the launch; before the call starts, for the host to begin it
                    out.launch_wait_ns[plane] += start - max(last_end, t)
                    out.host_wait_ns[plane] += max(0, t - last_end)
                    out.launch_gaps[plane] += t <= last_end
                gpu.event(compute, name, start, duration, kernel_details=details,
                          hlo_op=f"{stem}.{k}", hlo_module="jit_train_step(42)",
                          correlation_id=correlation)  # fmt: skip
                out.kernel_ns.setdefault((name, details), []).append(duration)
                out.latency_ns.setdefault(name, []).append(start - t)
                free = last_end = start + duration
                t += api
            if d == 0:
                step_spans.append((step_start, 0))
            t = max(t, free) + _STEP_PAUSE_NS  # the step's result is read back
            if d == 0:
                step_spans[-1] = (step_spans[-1][0], t)
    for step, (lo, hi) in enumerate(step_spans):
        host.event(python, "train", lo, hi - lo - 10, step_num=step, _r=1)
    return out


def write_gpu_capture(path: Path, **kwargs: int) -> SyntheticGpuCapture:
    """Write :func:`gpu_capture` to ``path`` (an ``.xplane.pb``)."""
    found = gpu_capture(**kwargs)
    path.write_bytes(found.space.SerializeToString())
    return found

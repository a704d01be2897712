"""Synthetic TPU-shaped XProf captures (XSpace) for tests and benchmarks.

Planes, lines and stat names follow what real TPU captures carry, so XProf's own tools
(``op_profile``, ``hlo_stats``, ``framework_op_stats``) read them: ``/device:TPU:N``
planes with ``Steps`` (events with ``group_id``, the step number XProf reads),
``XLA Modules`` (``name(program_id)``) and ``XLA Ops`` lines; HLO op metadata with
``program_id`` and ``symbol_id`` (XProf attributes an op only when both are there),
``hlo_category``, ``tf_op`` (framework name scope), ``long_name``, ``hlo_module``,
``flops`` and ``bytes_accessed``; a ``/host:CPU`` plane with a Python-tracer thread;
a ``Task Environment`` plane with the profile start and stop times.

With ``while_every=k``, every k-th op of a step is a ``while`` whose body (the next
``while_body`` ops) runs inside it on the ``XLA Ops`` line, as XLA control flow does.

With ``collectives=True`` the op mix adds the collectives XProf's TPU step trace counts
as communication (``all-to-all``, ``send`` / ``recv`` and their ``-done`` ops, beside
the default mix's ``all-reduce``), and every :data:`ASYNC_EVERY`-th op starts an
asynchronous collective (``all-gather-start.N`` ... ``all-gather-done.N``, also
``reduce-scatter`` and ``collective-permute``) whose transfer runs under the next
:data:`ASYNC_SPAN` ops: an ``Async XLA Ops`` line holds each transfer's window, as real
TPU captures do, and a transfer that outlasts the ops it overlaps makes its done op wait.

Every duration is a whole number of nanoseconds, so the expected flame-graph values
(:attr:`SyntheticCapture.expected_device_ns`, per leaf path, and
:attr:`SyntheticCapture.expected_self_ns`, per op) are exact.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from exporter.proto import xplane_pb2

__all__ = ["ASYNC_EVERY", "ASYNC_SPAN", "SyntheticCapture", "tpu_capture", "write_tpu_capture"]

_PS_PER_NS = 1000
# (hlo_category, op-name stem, framework op): the mix a transformer step shows on TPU.
_OP_KINDS = (
    ("convolution fusion", "fusion", "dot_general"),
    ("convolution", "convolution", "conv_general_dilated"),
    ("loop fusion", "fusion", "add"),
    ("output fusion", "fusion", "mul"),
    ("data formatting", "copy", "transpose"),
    ("all-reduce", "all-reduce", "psum"),
    ("non-fusion elementwise", "multiply", "mul"),
    ("custom-call", "custom-call", "flash_attention"),
)
# With collectives=True: the collectives XProf's step trace counts as communication
# (pod_viewer: all-reduce and all-to-all as collectives, send/recv and their done ops
# as device to device), mixed in with the ops above.
_COLLECTIVE_KINDS = (
    ("all-to-all", "all-to-all", "all_to_all"),
    ("send", "send", "ppermute"),
    ("recv-done", "recv-done", "ppermute"),
)
# ... each at this share of the duration drawn for it, so that communication is about a
# fifth of the step: a data-parallel step's share, not the whole step.
_COLLECTIVE_SCALE = 0.5
# Asynchronous collectives: one starts every ASYNC_EVERY-th op of a step, its transfer
# runs under the next ASYNC_SPAN ops and lasts ASYNC_TRANSFER (a range of fractions of
# those ops' time): mostly hidden, sometimes a little longer, so its done op waits.
ASYNC_EVERY = 10
ASYNC_SPAN = 4
_ASYNC_FAMILIES = ("all-gather", "reduce-scatter", "collective-permute")
_ASYNC_START_NS = 300
_ASYNC_DONE_NS = 200
_ASYNC_TRANSFER = (0.5, 1.1)
_SCOPES = (
    "embed",
    "transformer/layer_{i}/attention",
    "transformer/layer_{i}/mlp",
    "transformer/layer_{i}/norm",
    "lm_head",
    "optimizer/adam",
)


@dataclass
class SyntheticCapture:
    """A generated XSpace and what a correct converter must find in it."""

    space: xplane_pb2.XSpace
    program: str
    event_count: int = 0
    # Device-time flame-graph leaf path (program, *scope, category, op) -> self ns; a
    # while body's op sits below its while: (*while path, *rest of its scope, cat, op).
    expected_device_ns: dict[tuple[str, ...], int] = field(default_factory=dict)
    expected_self_ns: dict[str, int] = field(default_factory=dict)  # op name -> self ns
    expected_host_frames: tuple[str, ...] = ()
    # With collectives=True: per device plane name, ns of communication ops (collective
    # categories and async start/done ops) on its XLA Ops line, and the async windows
    # (start of the start op to end of the done op, ns) with the ns other ops cover.
    expected_communication_ns: dict[str, int] = field(default_factory=dict)
    expected_async_windows: dict[str, list[tuple[int, int]]] = field(default_factory=dict)


class _Stats:
    """A plane's stat-metadata table, ids assigned on first use."""

    def __init__(self, plane: xplane_pb2.XPlane) -> None:
        self._plane = plane
        self._ids: dict[str, int] = {}

    def __call__(self, name: str) -> int:
        found = self._ids.get(name)
        if found is None:
            found = self._ids[name] = len(self._ids) + 1
            meta = self._plane.stat_metadata[found]
            meta.id = found
            meta.name = name
        return found


def _add_stat(container: object, stat_id: int, value: object) -> None:
    stat = container.stats.add()  # type: ignore[attr-defined]
    stat.metadata_id = stat_id
    if isinstance(value, str):
        stat.str_value = value
    elif isinstance(value, float):
        stat.double_value = value
    else:
        stat.int64_value = int(value)  # type: ignore[call-overload]


@dataclass(frozen=True)
class _Op:
    name: str
    category: str
    scope: str


def _op_path(program: str, op: _Op, outer: _Op | None) -> tuple[str, ...]:
    scope = [p for p in op.scope.split("/") if p]
    if outer is None:
        return (program, *scope, op.category, op.name)
    theirs = [p for p in outer.scope.split("/") if p]
    shared = 0
    while shared < min(len(scope), len(theirs)) and scope[shared] == theirs[shared]:
        shared += 1
    return (*_op_path(program, outer, None), *scope[shared:], op.category, op.name)


def _device_plane(
    space: xplane_pb2.XSpace,
    index: int,
    program: str,
    program_id: int,
    ops: list[_Op],
    durations_ns: list[int],
    steps: int,
    ops_per_step: int,
    start_ns: int,
    rng: random.Random,
    capture: SyntheticCapture,
    while_every: int,
    while_body: int,
    collectives: bool = False,
) -> int:
    plane = space.planes.add()
    plane.id = index + 1
    plane.name = f"/device:TPU:{index}"
    stat = _Stats(plane)
    _add_stat(plane, stat("core_details"), "TPU v5 lite")
    _add_stat(plane, stat("peak_teraflops_per_second"), 197.0)
    _add_stat(plane, stat("peak_hbm_bw_gigabytes_per_second"), 819.0)
    # Event metadata: 1 = the module, 2.. = steps, then one per distinct HLO op.
    module_meta = plane.event_metadata[1]
    module_meta.id = 1
    module_meta.name = f"{program}({program_id})"
    _add_stat(module_meta, stat("program_id"), program_id)
    first_op_id = 1000
    loop = _Op("while.loop", "control flow", "jit(train_step)/jit(main)/while")
    loop_id = first_op_id + len(ops)
    async_ops: list[_Op] = []  # pair p: start 2p, done 2p + 1
    if collectives:
        for p in range(ops_per_step // ASYNC_EVERY + 1):
            family = _ASYNC_FAMILIES[p % len(_ASYNC_FAMILIES)]
            scope = f"jit(train_step)/jit(main)/{family.replace('-', '_')}"
            async_ops += [_Op(f"{family}-start.{p}", family, scope),
                          _Op(f"{family}-done.{p}", family, scope)]  # fmt: skip
    async_id = loop_id + 1
    comm_categories = {c for c, _, _ in (*_COLLECTIVE_KINDS, ("all-reduce", "", ""))}
    for j, op in enumerate([*ops, loop, *async_ops]):
        meta = plane.event_metadata[first_op_id + j]
        meta.id = first_op_id + j
        meta.name = op.name
        meta.display_name = op.name
        _add_stat(meta, stat("program_id"), program_id)
        _add_stat(meta, stat("symbol_id"), j + 1)  # 0 is XProf's root symbol: never used
        _add_stat(meta, stat("hlo_module"), program)
        _add_stat(meta, stat("hlo_category"), op.category)
        _add_stat(meta, stat("tf_op"), op.scope)
        _add_stat(meta, stat("flops"), rng.randrange(1, 1 << 30))
        _add_stat(meta, stat("bytes_accessed"), rng.randrange(1, 1 << 26))
        _add_stat(
            meta, stat("long_name"), f"%{op.name} = bf16[8,1024] {op.name.split('.')[0]}(...)"
        )

    steps_line = plane.lines.add()
    steps_line.id, steps_line.name, steps_line.timestamp_ns = 1, "Steps", start_ns
    modules_line = plane.lines.add()
    modules_line.id, modules_line.name, modules_line.timestamp_ns = 2, "XLA Modules", start_ns
    ops_line = plane.lines.add()
    ops_line.id, ops_line.name, ops_line.timestamp_ns = 3, "XLA Ops", start_ns
    add_op = ops_line.events.add
    if collectives:
        async_line = plane.lines.add()
        async_line.id, async_line.name, async_line.timestamp_ns = 4, "Async XLA Ops", start_ns
    comm_ns = 0
    windows: list[tuple[int, int]] = []
    async_self: dict[int, int] = {}  # async op index -> self ns
    step_id, group_id = stat("step_num"), stat("group_id")
    n_ops = len(ops)
    cursor_ps = 0
    count = 0
    self_ns = [0] * n_ops
    loop_self = 0
    nested_ns: dict[int, int] = {}  # op index -> ns spent inside a while
    for step in range(steps):
        step_start = cursor_ps
        cursor_ps += 5_000 * _PS_PER_NS  # host-side launch gap before the module runs
        module_start = cursor_ps
        base = rng.randrange(n_ops)
        k = 0
        while k < ops_per_step:
            if while_every and k % while_every == 0 and k + while_body <= ops_per_step:
                # A while op holding the next `while_body` ops, with a gap before each.
                loop_start = cursor_ps
                body_ns = 0
                events = []
                for b in range(while_body):
                    j = (base + (k + b) * 7) % n_ops
                    cursor_ps += 100 * _PS_PER_NS
                    events.append((first_op_id + j, cursor_ps, durations_ns[j]))
                    cursor_ps += durations_ns[j] * _PS_PER_NS
                    nested_ns[j] = nested_ns.get(j, 0) + durations_ns[j]
                    if collectives and ops[j].category in comm_categories:
                        comm_ns += durations_ns[j]
                    body_ns += durations_ns[j]
                cursor_ps += 100 * _PS_PER_NS
                loop_ns = (cursor_ps - loop_start) // _PS_PER_NS
                add_op(metadata_id=loop_id, offset_ps=loop_start, duration_ps=loop_ns * _PS_PER_NS)
                for meta_id, offset, dur_ns in events:
                    add_op(metadata_id=meta_id, offset_ps=offset, duration_ps=dur_ns * _PS_PER_NS)
                loop_self += loop_ns - body_ns
                cursor_ps += 50 * _PS_PER_NS
                count += while_body + 1
                k += while_body
                continue
            if collectives and k % ASYNC_EVERY == 0 and k + ASYNC_SPAN < ops_per_step:
                # An async collective: start, ASYNC_SPAN ops under its transfer, done.
                p = k // ASYNC_EVERY
                window_start = cursor_ps
                add_op(metadata_id=async_id + 2 * p, offset_ps=cursor_ps,
                       duration_ps=_ASYNC_START_NS * _PS_PER_NS)  # fmt: skip
                cursor_ps += (_ASYNC_START_NS + 50) * _PS_PER_NS
                under = 0
                for b in range(ASYNC_SPAN):
                    j = (base + (k + b) * 7) % n_ops
                    dur_ns = durations_ns[j]
                    add_op(metadata_id=first_op_id + j, offset_ps=cursor_ps,
                           duration_ps=dur_ns * _PS_PER_NS)  # fmt: skip
                    self_ns[j] += dur_ns
                    comm_ns += dur_ns if ops[j].category in comm_categories else 0
                    cursor_ps += (dur_ns + 50) * _PS_PER_NS
                    under += dur_ns + 50
                transfer = round(under * rng.uniform(*_ASYNC_TRANSFER))
                done_ns = _ASYNC_DONE_NS + max(0, transfer - under)  # waits for the rest
                add_op(metadata_id=async_id + 2 * p + 1, offset_ps=cursor_ps,
                       duration_ps=done_ns * _PS_PER_NS)  # fmt: skip
                cursor_ps += done_ns * _PS_PER_NS
                async_line.events.add(metadata_id=async_id + 2 * p, offset_ps=window_start,
                                      duration_ps=cursor_ps - window_start)  # fmt: skip
                windows.append((window_start // _PS_PER_NS, cursor_ps // _PS_PER_NS))
                async_self[2 * p] = async_self.get(2 * p, 0) + _ASYNC_START_NS
                async_self[2 * p + 1] = async_self.get(2 * p + 1, 0) + done_ns
                comm_ns += _ASYNC_START_NS + done_ns
                cursor_ps += 50 * _PS_PER_NS
                count += ASYNC_SPAN + 3
                k += ASYNC_SPAN
                continue
            j = (base + k * 7) % n_ops
            dur_ns = durations_ns[j]
            add_op(
                metadata_id=first_op_id + j, offset_ps=cursor_ps, duration_ps=dur_ns * _PS_PER_NS
            )
            self_ns[j] += dur_ns
            if collectives and ops[j].category in comm_categories:
                comm_ns += dur_ns
            cursor_ps += (dur_ns + 50) * _PS_PER_NS  # ops leave small gaps
            count += 1
            k += 1
        modules_line.events.add(
            metadata_id=1, offset_ps=module_start, duration_ps=cursor_ps - module_start
        )
        meta_id = 2 + step
        meta = plane.event_metadata[meta_id]
        meta.id = meta_id
        meta.name = str(step)
        event = steps_line.events.add(
            metadata_id=meta_id, offset_ps=step_start, duration_ps=cursor_ps - step_start
        )
        _add_stat(event, step_id, step)
        _add_stat(event, group_id, step)
        count += 2
        cursor_ps += 20_000 * _PS_PER_NS
    expected = capture.expected_device_ns
    by_op = capture.expected_self_ns
    for j, op in enumerate(ops):
        for path, ns in ((_op_path(program, op, None), self_ns[j]),
                         (_op_path(program, op, loop), nested_ns.get(j, 0))):  # fmt: skip
            if ns:
                expected[path] = expected.get(path, 0) + ns
                by_op[op.name] = by_op.get(op.name, 0) + ns
    if loop_self:
        path = _op_path(program, loop, None)
        expected[path] = expected.get(path, 0) + loop_self
        by_op[loop.name] = by_op.get(loop.name, 0) + loop_self
    for a, ns in async_self.items():
        path = _op_path(program, async_ops[a], None)
        expected[path] = expected.get(path, 0) + ns
        by_op[async_ops[a].name] = by_op.get(async_ops[a].name, 0) + ns
    if collectives:
        capture.expected_communication_ns[plane.name] = comm_ns
        capture.expected_async_windows[plane.name] = windows
    return count


def _host_plane(space: xplane_pb2.XSpace, steps: int, start_ns: int) -> tuple[int, tuple[str, ...]]:
    plane = space.planes.add()
    plane.id = 0
    plane.name = "/host:CPU"
    stat = _Stats(plane)
    names = [
        "$train.py:88 main",
        "$train.py:61 train_step",
        "train",  # the StepTraceAnnotation
        "$model.py:40 __call__",
        "$pjit.py:259 cache_miss",
        "PjitFunction(train_step)",
        "ThunkExecutor::Execute",
    ]
    for i, name in enumerate(names, 1):
        meta = plane.event_metadata[i]
        meta.id, meta.name = i, name
    line = plane.lines.add()
    line.id, line.name, line.display_name, line.timestamp_ns = 1, "python", "python", start_ns
    step_stat = stat("step_num")
    count = 0
    step_ps = 900_000 * _PS_PER_NS
    main_event = line.events.add(metadata_id=1, offset_ps=0, duration_ps=steps * step_ps + 1000)
    count += 1
    del main_event
    for step in range(steps):
        t0 = step * step_ps + 100
        line.events.add(metadata_id=2, offset_ps=t0, duration_ps=step_ps - 200_000)
        annotation = line.events.add(
            metadata_id=3, offset_ps=t0 + 10, duration_ps=step_ps - 300_000
        )
        _add_stat(annotation, step_stat, step)
        line.events.add(metadata_id=4, offset_ps=t0 + 20, duration_ps=400_000_000)
        line.events.add(metadata_id=5, offset_ps=t0 + 30, duration_ps=100_000_000)
        line.events.add(metadata_id=6, offset_ps=t0 + 100_000_030, duration_ps=50_000_000)
        count += 5
    worker = plane.lines.add()
    worker.id, worker.name, worker.timestamp_ns = 2, "tf_XLACpuClient/12345", start_ns
    for step in range(steps):
        worker.events.add(metadata_id=7, offset_ps=step * step_ps + 5000, duration_ps=300_000_000)
        count += 1
    return count, ("python", "main", "train_step", "train", "__call__", "cache_miss")


def tpu_capture(
    devices: int = 4,
    steps: int = 10,
    ops_per_step: int = 1000,
    distinct_ops: int = 400,
    layers: int = 8,
    seed: int = 0,
    program: str = "jit_train_step",
    host: bool = True,
    while_every: int = 0,
    while_body: int = 4,
    slowdown: float = 1.0,
    collectives: bool = False,
    hostname: str = "tpu-vm-0",
    start_ns: int | None = None,
) -> SyntheticCapture:
    """Build a TPU-shaped XSpace with ``devices * steps * ops_per_step`` op events.

    ``slowdown`` multiplies every op's duration (the same ops otherwise, for a seed): a
    uniformly slower chip, clock or configuration.

    ``while_every=k`` makes every k-th op of a step a ``while`` holding the next
    ``while_body`` ops (those ops count towards ``ops_per_step``; the while adds one).

    ``collectives=True`` adds all-to-all and send/recv ops to the mix and asynchronous
    collectives with an ``Async XLA Ops`` line (see the module docstring); the start and
    done ops add to the ops of a step. ``hostname`` is the XSpace's host name.

    ``start_ns``: when the profile starts (ns since the epoch; default a minute ago). The
    hosts of one session should share one: XProf aligns hosts' steps by the overlap of
    their absolute timelines, and hosts written a few ms apart (a loaded machine) can
    overlap so that its merge keeps no step at all.
    """
    rng = random.Random(seed)
    ops: list[_Op] = []
    kinds = (*_OP_KINDS, *_COLLECTIVE_KINDS) if collectives else _OP_KINDS
    for j in range(distinct_ops):
        category, stem, fw_op = kinds[j % len(kinds)]
        scope = _SCOPES[(j // len(kinds)) % len(_SCOPES)].format(i=j % layers)
        ops.append(_Op(f"{stem}.{j}", category, f"jit(train_step)/jit(main)/{scope}/{fw_op}"))
    durations_ns = [round(rng.randrange(200, 40_000) * slowdown) for _ in ops]
    if collectives:
        comm = {c for c, _, _ in _COLLECTIVE_KINDS} | {"all-reduce"}
        durations_ns = [
            max(1, round(d * _COLLECTIVE_SCALE)) if op.category in comm else d
            for d, op in zip(durations_ns, ops, strict=True)
        ]
    space = xplane_pb2.XSpace()
    space.hostnames.append(hostname)
    if start_ns is None:
        start_ns = time.time_ns() - 60_000_000_000
    capture = SyntheticCapture(space=space, program=program)
    if host:
        count, frames = _host_plane(space, steps, start_ns)
        capture.event_count += count
        capture.expected_host_frames = frames
    for device in range(devices):
        capture.event_count += _device_plane(
            space,
            device,
            program,
            4242,
            ops,
            durations_ns,
            steps,
            ops_per_step,
            start_ns,
            rng,
            capture,
            while_every,
            while_body,
            collectives,
        )
    env = space.planes.add()
    env.id, env.name = devices + 1, "Task Environment"
    stat = _Stats(env)
    step_span_ns = steps * 2_000_000
    start = env.stats.add(metadata_id=stat("profile_start_time"))
    start.uint64_value = start_ns
    stop = env.stats.add(metadata_id=stat("profile_stop_time"))
    stop.uint64_value = start_ns + step_span_ns
    return capture


def write_tpu_capture(path: Path, **kwargs: object) -> SyntheticCapture:
    """Write :func:`tpu_capture` to ``path`` (an ``.xplane.pb``) and return it."""
    capture = tpu_capture(**kwargs)  # type: ignore[arg-type]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(capture.space.SerializeToString())
    return capture

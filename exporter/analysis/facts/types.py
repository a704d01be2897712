"""The shapes of a report's facts and baseline: what the rules read, checked by mypy.

TypedDicts, not dataclasses: at run time each is the plain dict the report has always
written, so ``analysis.json`` keeps its keys and their order (docs/analysis.md), while
a rule that reads a key no fact has (a renamed or misspelt one) fails ``mypy``, not a
report. Keys a fact has only sometimes are ``NotRequired``; a class whose facts are
filled in stages is ``total=False`` and says why.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, Required, TypedDict

__all__ = [
    "AllocationModule",
    "BaselineSummary",
    "Breakdown",
    "Buffer",
    "CompilerFacts",
    "FormattingOp",
    "GpuKernelFacts",
    "HostFacts",
    "LaunchLatency",
    "LaunchOverhead",
    "LaunchPerStep",
    "MemoryFacts",
    "Neighbour",
    "Neighbourhood",
    "OpCategories",
    "OpCategoryRow",
    "Overlap",
    "PeakAllocations",
    "Recompilation",
    "Regression",
    "Roofline",
    "SlowStep",
    "StepFacts",
    "StepVerdict",
    "TopOp",
]


class StepFacts(TypedDict, total=False):
    """``facts.steps`` (facts._step_facts). Not total: a capture with step markers but
    no complete step has only ``source``; with steps every other key is there."""

    source: str
    definition: str
    count: int
    mean_ms: float
    median_ms: float
    p90_ms: float
    min_ms: float
    max_ms: float
    stdev_ms: float
    cv: float
    outliers: int
    outlier_ms: list[float]
    outlier_excess_ms: float
    annotated_median_ms: float
    xprof_mean_ms: float | None
    cycle_mean_ms: float


class Overlap(TypedDict):
    """``breakdown.communication_overlap``: asynchronous collectives' windows."""

    async_ops: int
    source: str
    async_ms_per_step: float
    hidden_pct: float
    exposed_ms_per_step: float


class Breakdown(TypedDict):
    """``facts.breakdown``: the step cycle split into XLA and its absence (percent)."""

    cycle_total_ms: float
    xla_pct: float
    compute_pct: float
    communication_pct: float
    communication_ms_per_step: float
    communication_by_kind_ms: dict[str, float]
    communication_overlap: Overlap | None
    input_wait_pct: float
    data_phase_pct: float
    between_steps_pct: float
    compile_pct: float
    host_other_pct: float


class SlowStep(TypedDict):
    step: int | None
    ms: float
    busy_ms: float
    idle_ms: float


class HostFacts(TypedDict):
    """One entry of ``facts.hosts`` (hosts.host_entries); the straggler keys are None
    where there is no verdict (under 3 hosts, a host captured twice)."""

    name: str
    file: str
    steps: int
    step_median_ms: float | None
    step_p90_ms: float | None
    step_mean_ms: float | None
    own_median_ms: float | None
    device_busy_pct: float
    compute_pct: float
    communication_pct: float
    idle_pct: float
    compute_ms_per_step: float | None
    communication_ms_per_step: float | None
    idle_ms_per_step: float | None
    slowest_steps: list[SlowStep]
    straggler_z: float | None
    straggler: bool | None
    straggler_basis: str | None


class Neighbour(TypedDict):
    """A producer or consumer of an op (neighbourhood._entry)."""

    name: str
    opcode: str
    shape: str | None
    share_pct: float | None
    self_ms: float | None


class Neighbourhood(TypedDict):
    """An op's radius-1 HLO neighbourhood (neighbourhood.neighbourhood)."""

    module: str | None
    opcode: str
    shape: str | None
    producers: list[Neighbour]
    consumers: list[Neighbour]
    producers_total: int
    consumers_total: int


class TopOp(TypedDict):
    """One of ``facts.top_ops``; program_facts adds where it comes from, neighbourhood.py
    its neighbours (None where the HLO has no such instruction)."""

    name: str
    self_ms: float
    share_pct: float
    category: NotRequired[str]
    source: NotRequired[str | None]
    framework_op: NotRequired[str | None]
    neighbourhood: NotRequired[Neighbourhood | None]


class FormattingOp(TypedDict):
    """One of ``compiler.ops``: a data-formatting op and, later, its neighbours."""

    name: str
    self_ms: float
    neighbourhood: NotRequired[Neighbourhood | None]


class CompilerFacts(TypedDict):
    """``facts.compiler``: XLA time spent only moving or reformatting data."""

    data_formatting_pct: float
    data_formatting_ms: float
    ops: list[FormattingOp]


class Recompilation(TypedDict):
    """``facts.recompilation``: compilations in the capture and inside its steps."""

    compilations: int
    in_steps: int
    compile_ms: float
    in_steps_pct: float


class MemoryFacts(TypedDict):
    """``facts.memory``: the device memory peak against capacity."""

    peak_bytes: int
    capacity_bytes: int
    peak_pct: float
    source: str


class Roofline(TypedDict, total=False):
    """``facts.roofline`` (program_facts.roofline): ``available`` and ``reason`` when
    not, else XProf's program row."""

    available: Required[bool]
    reason: str
    source: str
    device_type: str | None
    bound_by: str
    operational_intensity_flop_per_byte: float
    bottleneck_operational_intensity_flop_per_byte: float
    ridge_point_flop_per_byte: float | None
    hbm_ridge_point_flop_per_byte: float
    achieved_flop_rate_gflops: float
    peak_flop_rate_gflops: float
    compute_efficiency_pct: float
    hbm_bw_gibs: float
    peak_hbm_bw_gibs: float
    hbm_bw_utilization_pct: float | None
    max_mem_bw_utilization_pct: float
    roofline_efficiency_pct: float
    total_time_ms: float
    custom_call_share_pct: float
    custom_call_ops: int
    mxu_utilization_pct: float | None
    custom_call_note: str


class AllocationModule(TypedDict):
    module: str
    total_allocation_bytes: int
    peak_heap_bytes: int
    parameters_bytes: int
    buffer_count: int
    buffers_basis: str | None


class Buffer(TypedDict, total=False):
    """A buffer live at the peak: XProf's memory viewer row (its keys as XProf gives
    them), with its module, dtype and dims."""

    module: Required[str]
    instruction: str
    bytes: int
    shape: str
    op_code: str
    kind: str
    framework_op: str
    source: str
    dtype: Required[str | None]
    dims: Required[list[int] | None]


class PeakAllocations(TypedDict, total=False):
    """``facts.peak_allocations`` (program_facts.peak_allocations): ``available`` and
    ``reason`` when not, else the modules and the largest buffers of the first."""

    available: Required[bool]
    reason: str
    source: str
    file: str | None
    modules_total: int
    modules_skipped: int
    modules: list[AllocationModule]
    largest: list[Buffer]


class OpCategoryRow(TypedDict):
    category: str
    self_ms: float
    share_pct: float
    ops: int
    top_op: str | None


class OpCategories(TypedDict):
    """``facts.op_categories``: device self time per op category."""

    denominator: str
    total_ms: float
    basis: str
    rows: list[OpCategoryRow]


class LaunchPerStep(TypedDict):
    steps: int
    launch_overhead_ms_per_step: float
    share_of_step_pct: float


class LaunchLatency(TypedDict):
    name: str
    hlo_op: str | None
    launches: int
    mean_us: float
    max_us: float


class LaunchOverhead(TypedDict, total=False):
    """``gpu_kernels.launch_overhead``: ``available`` and ``reason`` when not."""

    available: Required[bool]
    reason: str
    launch_overhead_ms: float
    share_pct: float
    denominator: str
    gaps: int
    launch_gaps: int
    host_gaps: int
    median_gap_us: float | None
    median_launch_gap_us: float | None
    launch_calls: int
    correlated_kernels: int
    per_step: LaunchPerStep | None
    top_latency: list[LaunchLatency]


class GpuKernelFacts(TypedDict, total=False):
    """``facts.gpu_kernels`` (gpu_kernels.gpu_kernel_facts): ``available`` and
    ``reason`` when not; the kernel rows stay XProf-shaped dicts."""

    available: Required[bool]
    reason: str
    source: str
    kernel_basis: str
    devices: int
    streams: int
    kernel_count: int
    distinct_kernels: int
    total_ms: float
    denominator: str
    skipped_events: int
    kernels: list[dict[str, Any]]
    devices_detail: list[dict[str, Any]]
    launch_overhead: LaunchOverhead


class Regression(TypedDict):
    """A comparison entry (compare.Entry.to_json), as the report's ``top_regression``."""

    frame: str
    name: str
    label: NotRequired[str]  # program > op (compare.frame_label); reports before it lack it
    file: str
    line: int
    site: str | None
    basis: Literal["self", "total"]
    self_base: float
    self_head: float
    total_base: float
    total_head: float
    self_base_pct: float
    self_head_pct: float
    total_base_pct: float
    total_head_pct: float
    delta_self_pts: float
    delta_total_pts: float
    relative_change_pct: float | None
    base_ms: float
    head_ms: float
    delta_ms: float
    excess_ms: float
    step_pct: float
    explains_pct: float | None
    new: bool
    wait: bool
    significant: bool
    regression: bool
    p_value: float | None
    q_value: float | None
    effect: float | None


class StepVerdict(TypedDict):
    """A comparison's step-time verdict (noise.StepVerdict.to_json)."""

    base_median_ms: float | None
    head_median_ms: float | None
    statistic: str
    change_pct: float | None
    interval_pct: list[float | None] | None
    noise_pct: float | None
    noise_ratio: float | None
    noise_source: str
    between_runs: bool
    replicates: list[int]
    p_value: float | None
    verdict: Literal["slower", "faster", "unchanged", "unknown"]
    scale: float | None
    uniform: bool
    explained_pct: float | None


class BaselineSummary(TypedDict):
    """The report's ``baseline`` (report.baseline_summary): the comparisons against it;
    the step keys when a comparison was made, the regression keys when one has a
    regression."""

    spec: str
    session: str | None
    reason: str
    comparisons: dict[str, dict[str, Any]]
    top_regression: Regression | None
    step_time_change_pct: NotRequired[float | None]
    step_verdict: NotRequired[StepVerdict]
    kind: NotRequired[str]
    normalisation: NotRequired[str]
    steps: NotRequired[int]
    noise_floor_pts: NotRequired[float | None]

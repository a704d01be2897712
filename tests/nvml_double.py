"""A double of NVML as ``pynvml`` presents it: the functions the NVML source calls.

No GPU here. The double answers with realistic values of three boards and NVML's own
error codes, and uses nvidia-ml-py's real structures (``c_nvmlFieldValue_t``,
``c_nvmlGpmMetricsGet_t``, ``c_nvmlEventData_t``, ``NVMLError`` and its subclasses),
so a wrong field name, value type or error code fails as it would on hardware:

- GPU 0: H100 SXM 80GB under load: GPM, 18 NVLinks, ECC, power capped;
- GPU 1: H100 SXM 80GB in MIG mode with two instances (3g.40gb, 1g.10gb);
- GPU 2: Tesla T4: no GPM, no NVLink, no memory temperature, no row remapping.

Constants and structures come from the real module; a pynvml *function* the double
does not define is missing, as in an older nvidia-ml-py (AttributeError).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

GIB = 1 << 30
MIB = 1 << 20


@dataclass(eq=False)
class Handle:
    """What nvmlDeviceGetHandleByIndex / nvmlDeviceGetMigDeviceHandleByIndex return."""

    index: int
    gpu_instance: int | None = None


@dataclass
class Board:
    """One GPU's answers; None in ``fields`` or a missing key is NOT_SUPPORTED."""

    name: str
    uuid: str
    memory_total: int
    memory_used: int
    memory_reserved: int
    util: tuple[int, int] | None  # gpu %, memory %; None: NOT_SUPPORTED (MIG mode)
    clocks_mhz: tuple[int, int]  # SM, memory
    temperature: int
    power_mw: int
    power_limit_mw: int
    energy_mj: int
    throttle: int  # clock event reasons bitmask
    pcie_kib_s: tuple[int, int] | None  # TX, RX (nvmlDeviceGetPcieThroughput)
    fields: dict[int, tuple[int, float]]  # field id -> (valueType, value)
    nvlinks: int = 0
    nvlink_kib: tuple[float, float] = (0.0, 0.0)  # TX, RX per link
    gpm: dict[int, float] | None = None  # GPM metric id -> value; None: no GPM
    processes: list[tuple[int, int]] = field(default_factory=list)  # (pid, bytes)
    mig: list[tuple[int, str, int, int, list[tuple[int, int]]]] = field(default_factory=list)
    # MIG instances: (gpu instance id, profile, memory total, used, processes)


# A MIG instance's GPM values: its share of the whole GPU's (3g and 1g of 7 slices).
MIG_SHARE = {1: 3 / 7, 2: 1 / 7}
UINT = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
ULL = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG


def h100(**changes: Any) -> Board:
    board = Board(
        name="NVIDIA H100 80GB HBM3",
        uuid="GPU-5b1e6a3c-0d4f-4f7e-9c1a-2f3e4d5c6b7a",
        memory_total=85_520_809_984,
        memory_used=76 * GIB,
        memory_reserved=596 * MIB,
        util=(97, 61),
        clocks_mhz=(1980, 2619),
        temperature=64,
        power_mw=612_000,
        power_limit_mw=700_000,
        energy_mj=9_100_000_000,
        throttle=pynvml.nvmlClocksEventReasonSwPowerCap,  # at the power cap under load
        pcie_kib_s=(870_400, 1_228_800),
        fields={
            pynvml.NVML_FI_DEV_MEMORY_TEMP: (UINT, 71),
            pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: (ULL, 3),
            pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: (ULL, 0),
            pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL: (ULL, 12),
            pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: (ULL, 0),
            pynvml.NVML_FI_DEV_REMAPPED_COR: (UINT, 1),
            pynvml.NVML_FI_DEV_REMAPPED_UNC: (UINT, 0),
            pynvml.NVML_FI_DEV_REMAPPED_PENDING: (UINT, 0),
            pynvml.NVML_FI_DEV_REMAPPED_FAILURE: (UINT, 0),
            pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER: (UINT, 0),
            pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT: (UINT, 18),
        },
        nvlinks=18,
        nvlink_kib=(2_000_000_000.0, 1_900_000_000.0),
        gpm={
            pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 72.5,
            pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 98.0,
            pynvml.NVML_GPM_METRIC_SM_UTIL: 91.0,
            pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 64.0,
            pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: 850.0,
            pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: 1200.0,
        },
        processes=[(4242, 74 * GIB), (5151, 1536 * MIB)],
    )
    for key, value in changes.items():
        setattr(board, key, value)
    return board


def h100_mig() -> Board:
    return h100(
        uuid="GPU-9d8c7b6a-5f4e-4d3c-8b2a-1f0e9d8c7b6a",
        util=None,  # NVML has no utilisation rates for a GPU in MIG mode
        memory_used=30 * GIB,
        gpm=None,
        processes=[],
        throttle=0,
        mig=[
            (1, "3g.40gb", 40 * GIB, 22 * GIB, [(6001, 21 * GIB)]),
            (2, "1g.10gb", 10 * GIB, 7 * GIB, [(6002, 6 * GIB)]),
        ],
    )


def t4() -> Board:
    return Board(
        name="Tesla T4",
        uuid="GPU-1a2b3c4d-5e6f-4a1b-8c2d-3e4f5a6b7c8d",
        memory_total=16_106_127_360,
        memory_used=9 * GIB,
        memory_reserved=235 * MIB,
        util=(45, 20),
        clocks_mhz=(1590, 5000),
        temperature=58,
        power_mw=41_000,
        power_limit_mw=70_000,
        energy_mj=310_000_000,
        throttle=0,
        pcie_kib_s=(102_400, 51_200),
        fields={
            pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: (ULL, 0),
            pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: (ULL, 0),
            pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL: (ULL, 0),
            pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: (ULL, 0),
            pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER: (UINT, 2),
        },
        processes=[(4242, 8 * GIB)],
    )


class NvmlDouble:
    """pynvml's surface as the NVML source uses it.

    Tests steer it: ``boards`` (values), ``lost`` (GPU indices answering
    NVML_ERROR_GPU_IS_LOST), ``failing`` (function name -> NVML error code),
    ``events`` (XID events waiting), ``calls`` (how often each function ran),
    ``requested_fields`` (the field ids of the last nvmlDeviceGetFieldValues per GPU).
    """

    NVMLError = pynvml.NVMLError

    def __init__(self, boards: list[Board] | None = None) -> None:
        self.boards = boards if boards is not None else [h100(), h100_mig(), t4()]
        self.lost: set[int] = set()
        self.failing: dict[str, int] = {}
        self.events: list[tuple[int, int]] = []  # (GPU index, XID)
        self.registered: set[int] = set()
        self.calls: Counter[str] = Counter()
        self.requested_fields: dict[int, list[int]] = {}
        self.live: list[Any] = []  # GPM samples allocated and not freed yet
        self.event_sets = 0
        self.sampled: list[tuple[int, int | None]] = []  # GPM samples taken, by device
        self.initialised = False

    # Constants and structures are pynvml's; functions must be defined here.
    def __getattr__(self, name: str) -> Any:
        value = getattr(pynvml, name)
        if callable(value) and name.startswith("nvml") and not isinstance(value, type):
            raise AttributeError(f"the NVML double has no {name}")
        return value

    def _enter(self, name: str, handle: Handle | None = None) -> Board | None:
        self.calls[name] += 1
        if name in self.failing:
            raise pynvml.NVMLError(self.failing[name])
        if handle is None:
            return None
        if handle.index in self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return self.boards[handle.index]

    @staticmethod
    def _unsupported() -> pynvml.NVMLError:
        return pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _instance(self, handle: Handle) -> tuple[int, str, int, int, list[tuple[int, int]]]:
        board = self.boards[handle.index]
        return next(m for m in board.mig if m[0] == handle.gpu_instance)

    def _board_only(self, name: str, handle: Handle) -> Board:
        """A board-level value: MIG instance handles are refused, as NVML does."""
        board = self._enter(name, handle)
        assert board is not None
        if handle.gpu_instance is not None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return board

    # -- init, devices ----------------------------------------------------------------
    def nvmlInit(self) -> None:  # noqa: N802 - pynvml names
        self._enter("nvmlInit")
        self.initialised = True

    def nvmlShutdown(self) -> None:  # noqa: N802
        self._enter("nvmlShutdown")
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetCount")
        return len(self.boards)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:  # noqa: N802
        self._enter("nvmlDeviceGetHandleByIndex")
        return Handle(index)

    def nvmlDeviceGetIndex(self, handle: Handle) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetIndex")
        return handle.index

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        self._enter("nvmlSystemGetDriverVersion")
        return "570.133.20"

    def nvmlDeviceGetName(self, handle: Handle) -> str:  # noqa: N802
        board = self._enter("nvmlDeviceGetName", handle)
        assert board is not None
        if handle.gpu_instance is not None:
            return f"{board.name} MIG {self._instance(handle)[1]}"
        return board.name

    def nvmlDeviceGetUUID(self, handle: Handle) -> str:  # noqa: N802
        board = self._enter("nvmlDeviceGetUUID", handle)
        assert board is not None
        if handle.gpu_instance is not None:
            return f"MIG-{board.uuid[4:-2]}{handle.gpu_instance:02d}"
        return board.uuid

    # -- MIG -----------------------------------------------------------------------------
    def nvmlDeviceGetMigMode(self, handle: Handle) -> list[int]:  # noqa: N802
        board = self._board_only("nvmlDeviceGetMigMode", handle)
        if board.name.startswith("Tesla"):
            raise self._unsupported()
        return [1, 1] if board.mig else [0, 0]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Handle) -> int:  # noqa: N802
        self._board_only("nvmlDeviceGetMaxMigDeviceCount", handle)
        return 7  # an H100 has seven slots; most are empty here

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Handle, index: int) -> Handle:  # noqa: N802
        board = self._board_only("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        if index >= len(board.mig):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return Handle(handle.index, board.mig[index][0])

    def nvmlDeviceGetGpuInstanceId(self, handle: Handle) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetGpuInstanceId", handle)
        if handle.gpu_instance is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return handle.gpu_instance

    # -- values ----------------------------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> Any:  # noqa: N802
        board = self._board_only("nvmlDeviceGetUtilizationRates", handle)
        if board.util is None:
            raise self._unsupported()
        util = pynvml.c_nvmlUtilization_t()
        util.gpu, util.memory = board.util
        return util

    def nvmlDeviceGetMemoryInfo(self, handle: Handle, version: int | None = None) -> Any:  # noqa: N802
        board = self._enter("nvmlDeviceGetMemoryInfo", handle)
        assert board is not None
        if handle.gpu_instance is not None:
            _, _, total, used, _ = self._instance(handle)
            reserved = 0
        else:
            total, used, reserved = board.memory_total, board.memory_used, board.memory_reserved
        if version is None:
            memory = pynvml.c_nvmlMemory_t()
            memory.used = used + reserved  # v1 counts the reserved part as used
        else:
            assert version == pynvml.nvmlMemory_v2
            memory = pynvml.c_nvmlMemory_v2_t()
            memory.used, memory.reserved = used, reserved
        memory.total = total
        memory.free = memory.total - memory.used - (reserved if version else 0)
        return memory

    def nvmlDeviceGetClockInfo(self, handle: Handle, clock: int) -> int:  # noqa: N802
        board = self._board_only("nvmlDeviceGetClockInfo", handle)
        return {
            pynvml.NVML_CLOCK_SM: board.clocks_mhz[0],
            pynvml.NVML_CLOCK_MEM: board.clocks_mhz[1],
        }[clock]

    def nvmlDeviceGetTemperature(self, handle: Handle, sensor: int) -> int:  # noqa: N802
        board = self._board_only("nvmlDeviceGetTemperature", handle)
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return board.temperature

    def nvmlDeviceGetPowerUsage(self, handle: Handle) -> int:  # noqa: N802
        return self._board_only("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Handle) -> int:  # noqa: N802
        return self._board_only("nvmlDeviceGetEnforcedPowerLimit", handle).power_limit_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Handle) -> int:  # noqa: N802
        return self._board_only("nvmlDeviceGetTotalEnergyConsumption", handle).energy_mj

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Handle) -> int:  # noqa: N802
        return self._board_only("nvmlDeviceGetCurrentClocksEventReasons", handle).throttle

    def nvmlDeviceGetEncoderUtilization(self, handle: Handle) -> list[int]:  # noqa: N802
        self._board_only("nvmlDeviceGetEncoderUtilization", handle)
        return [0, 167_000]

    def nvmlDeviceGetDecoderUtilization(self, handle: Handle) -> list[int]:  # noqa: N802
        self._board_only("nvmlDeviceGetDecoderUtilization", handle)
        return [3, 167_000]

    def nvmlDeviceGetPcieThroughput(self, handle: Handle, counter: int) -> int:  # noqa: N802
        board = self._board_only("nvmlDeviceGetPcieThroughput", handle)
        assert board.pcie_kib_s is not None
        return board.pcie_kib_s[0 if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else 1]

    def nvmlDeviceGetFieldValues(self, handle: Handle, field_ids: list[Any]) -> Any:  # noqa: N802
        board = self._board_only("nvmlDeviceGetFieldValues", handle)
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        self.requested_fields[handle.index] = [
            f[0] if isinstance(f, tuple) else f for f in field_ids
        ]
        for i, requested in enumerate(field_ids):
            field_id, scope = requested if isinstance(requested, tuple) else (requested, 0)
            values[i].fieldId, values[i].scopeId = field_id, scope
            nvlink = {
                pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: 0,
                pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: 1,
            }
            if field_id in nvlink and scope < board.nvlinks:
                values[i].valueType = ULL
                values[i].value.ullVal = int(board.nvlink_kib[nvlink[field_id]])
            elif field_id in board.fields:
                value_type, value = board.fields[field_id]
                values[i].valueType = value_type
                if value_type == UINT:
                    values[i].value.uiVal = int(value)
                else:
                    values[i].value.ullVal = int(value)
            else:
                values[i].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return values

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Handle) -> list[Any]:  # noqa: N802
        board = self._enter("nvmlDeviceGetComputeRunningProcesses", handle)
        assert board is not None
        procs = self._instance(handle)[4] if handle.gpu_instance is not None else board.processes
        return [
            SimpleNamespace(
                pid=pid, usedGpuMemory=used, gpuInstanceId=handle.gpu_instance or 0xFFFFFFFF
            )
            for pid, used in procs
        ]

    # -- XID events -----------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> Any:  # noqa: N802
        self._enter("nvmlEventSetCreate")
        self.event_sets += 1
        return pynvml.c_nvmlEventSet_t()

    def nvmlEventSetFree(self, event_set: Any) -> None:  # noqa: N802
        self._enter("nvmlEventSetFree")
        self.event_sets -= 1

    def nvmlDeviceRegisterEvents(self, handle: Handle, types: int, event_set: Any) -> None:  # noqa: N802
        board = self._board_only("nvmlDeviceRegisterEvents", handle)
        assert types == pynvml.nvmlEventTypeXidCriticalError
        if board.name.startswith("Tesla"):
            raise self._unsupported()  # as on a GPU without event support
        self.registered.add(handle.index)

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:  # noqa: N802
        self._enter("nvmlEventSetWait_v2")
        assert timeout_ms == 0, "the source must never wait for events"
        if not self.events:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        index, xid = self.events.pop(0)
        data = pynvml.c_nvmlEventData_t()
        data.eventType = pynvml.nvmlEventTypeXidCriticalError
        data.eventData = xid
        data.gpuInstanceId = 0xFFFFFFFF
        # The device member is a ctypes pointer in NVML; the double hands its handle back.
        return SimpleNamespace(
            device=Handle(index), eventType=data.eventType, eventData=data.eventData
        )

    # -- GPM ----------------------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, handle: Handle) -> Any:  # noqa: N802
        board = self._board_only("nvmlGpmQueryDeviceSupport", handle)
        supported = board.gpm is not None or bool(board.mig)
        return SimpleNamespace(isSupportedDevice=int(supported))

    def nvmlGpmSampleAlloc(self) -> Any:  # noqa: N802
        self._enter("nvmlGpmSampleAlloc")
        sample = pynvml.c_nvmlGpmSample_t()
        self.live.append(sample)
        return sample

    def nvmlGpmSampleFree(self, sample: Any) -> None:  # noqa: N802
        self._enter("nvmlGpmSampleFree")
        held = [i for i, live in enumerate(self.live) if live is sample]
        assert held, "GPM sample freed twice or never allocated"
        del self.live[held[0]]

    def nvmlGpmSampleGet(self, handle: Handle, sample: Any) -> None:  # noqa: N802
        self._board_only("nvmlGpmSampleGet", handle)
        self.sampled.append((handle.index, None))

    def nvmlGpmMigSampleGet(self, handle: Handle, gpu_instance: int, sample: Any) -> None:  # noqa: N802
        board = self._board_only("nvmlGpmMigSampleGet", handle)
        assert any(m[0] == gpu_instance for m in board.mig)
        self.sampled.append((handle.index, gpu_instance))

    def nvmlGpmMetricsGet(self, request: Any) -> Any:  # noqa: N802
        self._enter("nvmlGpmMetricsGet")
        assert request.version == pynvml.NVML_GPM_METRICS_GET_VERSION
        assert 0 < request.numMetrics <= pynvml.NVML_GPM_METRIC_MAX
        index, instance = self.sampled[-1]  # the device of the newest sample (sample2)
        board = self.boards[index]
        share = 1.0 if instance is None else MIG_SHARE[instance]
        metrics = board.gpm if board.gpm is not None else h100().gpm or {}
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            if metric.metricId in metrics:
                metric.nvmlReturn = 0
                metric.value = metrics[metric.metricId] * share
            else:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return request

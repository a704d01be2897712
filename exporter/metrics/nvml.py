"""GPU source: NVML (``nvidia-ml-py``) per GPU and MIG instance, ``source="nvml"``.

dcgm-exporter's default counter set where NVML offers it (``docs/metrics.md`` maps
each metric to its ``DCGM_FI_*`` field): utilisation, memory, clocks, temperatures,
power, energy, PCIe and NVLink traffic, ECC and row-remapping counters, clock event
(throttle) reasons, XID errors, per-process memory, and DCGM's profiling fields from
GPM (:mod:`exporter.metrics.gpm`). A MIG instance is a device of its own
(``chip="<gpu>/mig<gpu instance>"``) with its memory, processes and GPM metrics; the
board-level values (power, clocks, temperatures, errors) stay on its GPU.

Cheap on purpose, since it runs every collect interval: one call per value, the
many small counters in one ``nvmlDeviceGetFieldValues``, XID events drained without
waiting (``nvmlEventSetWait_v2`` with a zero timeout), and PCIe from GPM's interval
rates where there are some (``nvmlDeviceGetPcieThroughput`` samples 20 ms in the
driver). A value a GPU does not offer (``NVML_ERROR_NOT_SUPPORTED`` and kin) is
logged once, asked for no more on that device and listed in ``/readyz``; other NVML
errors count in ``mlprof_source_errors_total`` and the value is absent that interval.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final, TypeVar

from exporter.metrics.accelerator import DeviceSample, DeviceSeries, Reading, RunIdentity
from exporter.metrics.gpm import GpmSampler
from exporter.metrics.run_pids import RunPids

__all__ = ["NvmlSource", "load_nvml"]

log = logging.getLogger(__name__)

T = TypeVar("T")

# NVML answers that mean "this device or driver does not offer it": never retried.
UNSUPPORTED_ERRORS: Final = (
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_FUNCTION_NOT_FOUND",
    "NVML_ERROR_NO_PERMISSION",
    "NVML_ERROR_INVALID_ARGUMENT",
    "NVML_ERROR_ARGUMENT_VERSION_MISMATCH",
)
# Clock event (throttle) reasons: attribute value <- pynvml bit name.
THROTTLE_REASONS: Final = (
    ("gpu_idle", "nvmlClocksEventReasonGpuIdle"),
    ("applications_clocks", "nvmlClocksEventReasonApplicationsClocksSetting"),
    ("sw_power_cap", "nvmlClocksEventReasonSwPowerCap"),
    ("hw_slowdown", "nvmlClocksEventReasonHwSlowdown"),
    ("sync_boost", "nvmlClocksEventReasonSyncBoost"),
    ("sw_thermal", "nvmlClocksEventReasonSwThermalSlowdown"),
    ("hw_thermal", "nvmlClocksEventReasonHwThermalSlowdown"),
    ("hw_power_brake", "nvmlClocksEventReasonHwPowerBrakeSlowdown"),
    ("display_clocks", "nvmlClocksEventReasonDisplayClockSetting"),
)


# key, pynvml function, constant arguments, catalogue metric, attributes, x times / per.
_BoardValue = tuple[str, str, tuple[str, ...], str, dict[str, str], float, float]
BOARD_VALUES: Final[tuple[_BoardValue, ...]] = (
    ("clock.sm", "nvmlDeviceGetClockInfo", ("NVML_CLOCK_SM",),
     "accelerator.clock.frequency", {"clock": "sm"}, 1e6, 1),  # MHz
    ("clock.memory", "nvmlDeviceGetClockInfo", ("NVML_CLOCK_MEM",),
     "accelerator.clock.frequency", {"clock": "memory"}, 1e6, 1),
    ("temperature.gpu", "nvmlDeviceGetTemperature", ("NVML_TEMPERATURE_GPU",),
     "accelerator.temperature", {"sensor": "gpu"}, 1, 1),
    ("power.usage", "nvmlDeviceGetPowerUsage", (), "accelerator.power.usage", {}, 1, 1000),  # mW
    ("power.limit", "nvmlDeviceGetEnforcedPowerLimit", (), "accelerator.power.limit", {}, 1, 1000),
    ("energy", "nvmlDeviceGetTotalEnergyConsumption", (), "accelerator.energy", {}, 1, 1000),  # mJ
)  # fmt: skip
PCIE_COUNTERS: Final = (
    ("transmit", "NVML_PCIE_UTIL_TX_BYTES"),
    ("receive", "NVML_PCIE_UTIL_RX_BYTES"),
)


@dataclass(frozen=True)
class _Field:
    """One value of ``nvmlDeviceGetFieldValues``."""

    key: str  # what /readyz lists when the GPU does not offer it
    field_id: str  # pynvml constant
    metric: str
    attrs: tuple[tuple[str, str], ...] = ()


FIELD_VALUES: Final = (
    _Field("temperature.memory", "NVML_FI_DEV_MEMORY_TEMP", "accelerator.temperature",
           (("sensor", "memory"),)),
    _Field("ecc.corrected", "NVML_FI_DEV_ECC_SBE_VOL_TOTAL", "accelerator.memory.ecc.errors",
           (("type", "corrected"),)),
    _Field("ecc.uncorrected", "NVML_FI_DEV_ECC_DBE_VOL_TOTAL", "accelerator.memory.ecc.errors",
           (("type", "uncorrected"),)),
    _Field("ecc.lifetime_corrected", "NVML_FI_DEV_ECC_SBE_AGG_TOTAL",
           "accelerator.memory.ecc.lifetime_errors", (("type", "corrected"),)),
    _Field("ecc.lifetime_uncorrected", "NVML_FI_DEV_ECC_DBE_AGG_TOTAL",
           "accelerator.memory.ecc.lifetime_errors", (("type", "uncorrected"),)),
    _Field("remapped_rows.correctable", "NVML_FI_DEV_REMAPPED_COR",
           "accelerator.memory.remapped_rows", (("type", "correctable"),)),
    _Field("remapped_rows.uncorrectable", "NVML_FI_DEV_REMAPPED_UNC",
           "accelerator.memory.remapped_rows", (("type", "uncorrectable"),)),
    _Field("row_remap.pending", "NVML_FI_DEV_REMAPPED_PENDING",
           "accelerator.memory.row_remap.pending"),
    _Field("row_remap.failed", "NVML_FI_DEV_REMAPPED_FAILURE",
           "accelerator.memory.row_remap.failed"),
    _Field("pcie.replays", "NVML_FI_DEV_PCIE_REPLAY_COUNTER", "accelerator.pcie.replays"),
)  # fmt: skip
# NVLink data counters (KiB), one field per link, summed over the GPU's links.
NVLINK_FIELDS: Final = (
    ("transmit", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX"),
    ("receive", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX"),
)
KIB: Final = 1024
MAX_XID_EVENTS: Final = 256  # drained per collection; more wait for the next one
MAX_PROCESSES: Final = 64  # per device, largest first: bounds the pid label's cardinality
MIG_RESCAN_S: Final = 60.0  # MIG instances can be created and destroyed while we run
NO_INSTANCE: Final = 0xFFFFFFFF  # an event's gpuInstanceId outside MIG


def load_nvml() -> Any:
    """The ``pynvml`` module, or None when nvidia-ml-py is not installed."""
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


@dataclass
class _Device:
    """A GPU or a MIG instance, and what it does not offer."""

    chip: str
    handle: Any
    parent: Any = None  # the GPU of a MIG instance
    gpu_instance: int | None = None
    mig_mode: bool = False  # a GPU split into MIG instances
    info: dict[str, str] = field(default_factory=dict)
    unsupported: dict[str, str] = field(default_factory=dict)  # key -> NVML's answer
    gpm: GpmSampler | None = None
    links: int = 0
    reserved: float | None = None  # memory the driver reserves (nvmlMemory_v2)
    xid: bool = False  # XID events registered
    xid_errors: int = 0
    xid_last: int = 0
    failed: int = 0  # NVML errors in this collection

    @property
    def is_mig(self) -> bool:
        return self.gpu_instance is not None


@dataclass
class NvmlSource:
    """Collects NVML readings into a :class:`DeviceSeries`; ``nvml`` is the pynvml module.

    ``start`` returns None when GPUs are there, else why the source is off.
    ``skipped()`` lists ``<chip>:<value>`` pairs a device does not offer.
    """

    nvml: Any
    series: DeviceSeries
    identity: RunIdentity
    on_error: Callable[[str], None] | None = None
    name: str = "nvml"
    runs: RunPids | None = None  # pid -> run, for per-process memory
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self._gpus: list[_Device] = []
        self._migs: list[_Device] = []
        self._events: Any = None
        self._driver = ""
        self._unsupported_codes = {
            getattr(self.nvml, n) for n in UNSUPPORTED_ERRORS if hasattr(self.nvml, n)
        }
        self._mig_scanned = float("-inf")
        self._last_state = ""
        # valueType -> c_nvmlValue_t member, resolved once (field values are the most
        # numerous reads: NVLink alone is two per link).
        self._members = {
            getattr(self.nvml, c): m for c, m in _VALUE_MEMBERS.items() if hasattr(self.nvml, c)
        }

    # -- lifecycle -------------------------------------------------------------
    def start(self) -> str | None:
        """Initialise NVML and find the GPUs; return the reason when there is nothing to read."""
        nvml = self.nvml
        if nvml is None:
            return "nvidia-ml-py is not installed"
        try:
            nvml.nvmlInit()
            count = int(nvml.nvmlDeviceGetCount())
            handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except nvml.NVMLError as exc:
            return f"NVML unavailable ({exc})"
        if not handles:
            self.shutdown()
            return "NVML finds no GPU"
        with contextlib.suppress(nvml.NVMLError, AttributeError):
            self._driver = _text(nvml.nvmlSystemGetDriverVersion())
        with contextlib.suppress(nvml.NVMLError, AttributeError):
            self._events = nvml.nvmlEventSetCreate()
        for index, handle in enumerate(handles):
            gpu = _Device(str(index), handle)
            self._describe(gpu)
            gpu.links = self._link_count(gpu)
            gpu.mig_mode = self._mig_mode(gpu)
            if not gpu.mig_mode:
                gpu.gpm = self._gpm(handle, None)
            if self._events is not None:
                gpu.xid = bool(self._call(gpu, "xid", partial(self._register_xid, gpu)))
            self._gpus.append(gpu)
        self._scan_mig()
        return None

    def shutdown(self) -> None:
        for device in [*self._gpus, *self._migs]:
            if device.gpm is not None:
                device.gpm.close()
        nvml = self.nvml
        if self._events is not None:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlEventSetFree(self._events)
            self._events = None
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()

    close = shutdown

    def skipped(self) -> list[str]:
        """``<chip>:<value>`` for every value a device does not offer (for ``/readyz``)."""
        return [
            f"{d.chip}:{key}" for d in [*self._gpus, *self._migs] for key in sorted(d.unsupported)
        ]

    # -- calls -------------------------------------------------------------------
    def _call(self, device: _Device, key: str, fn: Callable[[], T]) -> T | None:
        """``fn()``, or None: unsupported values are remembered (and logged) once."""
        if key in device.unsupported:
            return None
        nvml = self.nvml
        try:
            return fn()
        except AttributeError:  # an older nvidia-ml-py without this function
            self._unsupported(device, key, "not in this nvidia-ml-py")
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) in self._unsupported_codes:
                self._unsupported(device, key, str(exc))
            else:
                device.failed += 1
                log.debug("NVML read of %s on GPU %s failed: %s", key, device.chip, exc)
        return None

    def _unsupported(self, device: _Device, key: str, why: str) -> None:
        device.unsupported[key] = why
        log.info("GPU %s does not offer %s (%s): skipped", device.chip, key, why)

    def _describe(self, device: _Device) -> None:
        nvml = self.nvml
        name = self._call(device, "name", lambda: nvml.nvmlDeviceGetName(device.handle))
        uuid = self._call(device, "uuid", lambda: nvml.nvmlDeviceGetUUID(device.handle))
        device.info = {
            "model": _text(name) if name is not None else "",
            "uuid": _text(uuid) if uuid is not None else "",
            "driver_version": self._driver,
        }

    def _link_count(self, gpu: _Device) -> int:
        nvml = self.nvml
        values = self._call(
            gpu, "nvlink", lambda: nvml.nvmlDeviceGetFieldValues(
                gpu.handle, [nvml.NVML_FI_DEV_NVLINK_LINK_COUNT])
        )  # fmt: skip
        if values is None:
            return 0
        if values[0].nvmlReturn != 0:
            self._field_refused(gpu, "nvlink", values[0].nvmlReturn)
            return 0
        return int(self._field_value(values[0]) or 0)

    def _register_xid(self, gpu: _Device) -> bool:
        nvml = self.nvml
        nvml.nvmlDeviceRegisterEvents(gpu.handle, nvml.nvmlEventTypeXidCriticalError, self._events)
        return True

    def _mig_mode(self, gpu: _Device) -> bool:
        nvml = self.nvml
        try:
            mode = nvml.nvmlDeviceGetMigMode(gpu.handle)
        except (AttributeError, nvml.NVMLError):
            return False  # no MIG on this GPU: nothing is missing
        return bool(mode[0] == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1))

    def _gpm(self, handle: Any, gpu_instance: int | None) -> GpmSampler | None:
        sampler = GpmSampler(self.nvml, handle, gpu_instance)
        return sampler if sampler.start() else None

    def _scan_mig(self) -> None:
        """(Re)discover the MIG instances of GPUs in MIG mode."""
        nvml = self.nvml
        self._mig_scanned = self.clock()
        known = {d.chip: d for d in self._migs}
        found: list[_Device] = []
        for gpu in self._gpus:
            if not gpu.mig_mode:
                continue
            slots = self._get(gpu, "mig", "nvmlDeviceGetMaxMigDeviceCount")
            for slot in range(slots or 0):
                try:
                    handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, slot)
                    instance = int(nvml.nvmlDeviceGetGpuInstanceId(handle))
                except nvml.NVMLError:
                    continue  # an empty slot
                chip = f"{gpu.chip}/mig{instance}"
                device = known.get(chip) or _Device(chip, handle, gpu.handle, instance)
                device.handle = handle
                if chip not in known:
                    self._describe(device)
                    device.gpm = self._gpm(gpu.handle, instance)
                found.append(device)
        for gone in set(known) - {d.chip for d in found}:
            sampler = known[gone].gpm
            if sampler is not None:
                sampler.close()
        self._migs = found

    # -- collection ----------------------------------------------------------------
    def collect(self) -> tuple[str, str]:
        """Read every GPU and MIG instance once and store the values; never raises."""
        mig = self._migs or any(g.mig_mode for g in self._gpus)
        if mig and self.clock() - self._mig_scanned >= MIG_RESCAN_S:
            self._scan_mig()
        xid_failed = self._drain_xid()
        samples: list[DeviceSample] = []
        unreadable = 0
        for device in [*self._gpus, *self._migs]:
            device.failed = 0
            sample = self._sample(device)
            if sample is None:
                unreadable += 1
            else:
                samples.append(sample)
            if device.failed and self.on_error:
                self.on_error("nvml")
        self.series.update(samples, self.identity.current())
        gpus = sum(1 for s in samples if "/" not in s.chip)
        detail = f"{gpus} GPUs" + (f", {len(self._migs)} MIG instances" if self._migs else "")
        if unreadable:
            total = len(self._gpus) + len(self._migs)
            return self._report("error", f"{unreadable} of {total} GPUs unreadable")
        failed = sum(d.failed for d in [*self._gpus, *self._migs]) + xid_failed
        if failed:
            return self._report("error", f"{detail}, but {failed} NVML reads failed")
        return self._report("ok", detail)

    def _sample(self, device: _Device) -> DeviceSample | None:
        readings: list[Reading] = [Reading("accelerator.info", 1.0, device.info)]
        duty: float | None = None
        util = None
        if not device.is_mig:
            util = self._get(device, "utilization", "nvmlDeviceGetUtilizationRates")
        if util is not None:
            duty = _ratio(util.gpu)
            readings.append(Reading("accelerator.memory.copy.utilization", _ratio(util.memory)))
        memory = self._memory(device)
        if util is None and memory is None and device.failed:
            return None  # the device's series go stale and disappear
        if device.reserved is not None:
            readings.append(Reading("accelerator.memory.reserved", device.reserved))
        gpm = device.gpm.read() if device.gpm is not None else {}
        tensor = gpm.pop(("accelerator.tensorcore.utilization", ""), None)
        for (metric, direction), value in gpm.items():
            readings.append(Reading(metric, value, {"direction": direction} if direction else {}))
        if not device.is_mig:
            self._board(device, readings, pcie_from_gpm=any(m.endswith("pcie.throughput")
                                                            for m, _ in gpm))  # fmt: skip
        if not device.mig_mode:
            readings += self._processes(device)
        return DeviceSample(
            device.chip,
            duty_cycle=duty,
            tensorcore_utilization=tensor,
            memory_usage=None if memory is None else memory[0],
            memory_limit=None if memory is None else memory[1],
            readings=tuple(readings),
        )

    def _memory(self, device: _Device) -> tuple[float, float] | None:
        nvml, h = self.nvml, device.handle
        version = getattr(nvml, "nvmlMemory_v2", None)
        if version is not None and "memory.reserved" not in device.unsupported:
            # v2 separates what the driver reserves from what processes use.
            info = self._call(device, "memory.reserved",
                              lambda: nvml.nvmlDeviceGetMemoryInfo(h, version=version))  # fmt: skip
            if info is not None:
                device.reserved = float(info.reserved)
                return float(info.used), float(info.total)
        info = self._get(device, "memory", "nvmlDeviceGetMemoryInfo")
        return None if info is None else (float(info.used), float(info.total))

    def _get(self, device: _Device, key: str, function: str, *constants: str) -> Any:
        """``nvml.<function>(handle, *constants)`` through :meth:`_call`."""
        nvml = self.nvml

        def call() -> Any:
            return getattr(nvml, function)(device.handle, *(getattr(nvml, c) for c in constants))

        return self._call(device, key, call)

    def _board(self, gpu: _Device, readings: list[Reading], pcie_from_gpm: bool) -> None:
        """Values of the physical board: clocks, temperature, power, errors, links."""
        for key, function, constants, metric, attrs, times, per in BOARD_VALUES:
            value = self._get(gpu, key, function, *constants)
            if value is not None:
                readings.append(Reading(metric, value * times / per, attrs))
        reasons = self._get(gpu, "clock.throttle", "nvmlDeviceGetCurrentClocksEventReasons")
        if reasons is not None:
            for reason, bit in THROTTLE_REASONS:
                on = 1.0 if reasons & getattr(self.nvml, bit, 0) else 0.0
                readings.append(Reading("accelerator.clock.throttle", on, {"reason": reason}))
        for codec in ("encoder", "decoder"):
            function = f"nvmlDeviceGet{codec.capitalize()}Utilization"
            util = self._get(gpu, f"codec.{codec}", function)  # [percent, sampling period]
            if util is not None:
                attrs = {"codec": codec}
                readings.append(Reading("accelerator.codec.utilization", _ratio(util[0]), attrs))
        if not pcie_from_gpm:  # a 20 ms sample in the driver, where GPM has no interval rate
            for direction, constant in PCIE_COUNTERS:
                kib_s = self._get(gpu, f"pcie.{direction}", "nvmlDeviceGetPcieThroughput", constant)
                if kib_s is not None:
                    attrs = {"direction": direction}
                    readings.append(Reading("accelerator.pcie.throughput", kib_s * KIB, attrs))
        readings += self._field_values(gpu)
        if gpu.xid:
            readings.append(Reading("accelerator.xid.errors", float(gpu.xid_errors)))
            readings.append(Reading("accelerator.xid.last", float(gpu.xid_last)))

    def _field_values(self, gpu: _Device) -> list[Reading]:
        """The small counters, one ``nvmlDeviceGetFieldValues`` for all of them."""
        nvml = self.nvml
        request: list[Any] = []
        targets: list[_Field | str] = []  # a field, or an NVLink direction (one per link)
        for spec in FIELD_VALUES:
            if spec.key not in gpu.unsupported and hasattr(nvml, spec.field_id):
                request.append(getattr(nvml, spec.field_id))
                targets.append(spec)
        if "nvlink" not in gpu.unsupported:
            for direction, const in NVLINK_FIELDS:
                if hasattr(nvml, const):
                    request += [(getattr(nvml, const), link) for link in range(gpu.links)]
                    targets += [direction] * gpu.links
        if not request:
            return []
        values = self._call(
            gpu, "field_values", lambda: nvml.nvmlDeviceGetFieldValues(gpu.handle, request)
        )
        if values is None:
            return []
        out: list[Reading] = []
        nvlink: dict[str, float] = {}
        for target, value in zip(targets, values, strict=False):
            key = target.key if isinstance(target, _Field) else "nvlink"
            if value.nvmlReturn != 0:
                self._field_refused(gpu, key, value.nvmlReturn)
                continue
            number = self._field_value(value)
            if number is None:
                continue
            if isinstance(target, _Field):
                out.append(Reading(target.metric, number, dict(target.attrs)))
            else:
                nvlink[target] = nvlink.get(target, 0.0) + number
        if "nvlink" not in gpu.unsupported:  # a link that refused drops NVLink entirely
            out += [
                Reading("accelerator.nvlink.io", kib * KIB, {"direction": direction})
                for direction, kib in nvlink.items()
            ]
        return out

    def _field_value(self, value: Any) -> float | None:
        member = self._members.get(value.valueType)
        return None if member is None else float(getattr(value.value, member))

    def _field_refused(self, gpu: _Device, key: str, code: int) -> None:
        if key in gpu.unsupported:
            return
        if code in self._unsupported_codes:
            self._unsupported(gpu, key, str(self.nvml.NVMLError(code)))
        else:
            gpu.failed += 1

    def _processes(self, device: _Device) -> list[Reading]:
        procs = self._get(device, "processes", "nvmlDeviceGetComputeRunningProcesses")
        if not procs:
            return []
        used = [(p.pid, p.usedGpuMemory) for p in procs if p.usedGpuMemory is not None]
        used.sort(key=lambda p: p[1], reverse=True)
        out = []
        for pid, used_bytes in used[:MAX_PROCESSES]:
            run = self.runs.identity(int(pid)) if self.runs is not None else None
            attrs: dict[str, str | None] = {
                "pid": str(pid),
                "run_id": run["run_id"] if run else None,
                "workload": (run["workload"] or None) if run else None,
            }
            out.append(Reading("accelerator.process.memory.usage", float(used_bytes), attrs))
        return out

    def _drain_xid(self) -> int:
        """Count the XID events waiting, without waiting; returns the NVML failures."""
        nvml = self.nvml
        if self._events is None:
            return 0
        by_index = {int(g.chip): g for g in self._gpus}
        for _ in range(MAX_XID_EVENTS):
            try:
                event = nvml.nvmlEventSetWait_v2(self._events, 0)
                if not event.eventType & nvml.nvmlEventTypeXidCriticalError:
                    continue
                gpu = by_index.get(int(nvml.nvmlDeviceGetIndex(event.device)))
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) == nvml.NVML_ERROR_TIMEOUT:
                    return 0  # nothing more waiting
                log.debug("NVML event wait failed: %s", exc)
                return 1
            if gpu is not None:
                gpu.xid_errors += 1
                gpu.xid_last = int(event.eventData)
                log.warning("GPU %s: XID %d", gpu.chip, gpu.xid_last)
        return 0

    def _report(self, state: str, detail: str) -> tuple[str, str]:
        if state != self._last_state:
            log.log(
                logging.WARNING if state == "error" else logging.INFO,
                "NVML source %s: %s",
                state,
                detail,
            )
            self._last_state = state
        return state, detail


def _ratio(percent: float) -> float:
    return min(1.0, max(0.0, float(percent) / 100.0))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# c_nvmlValue_t member per NVML_VALUE_TYPE_* (pynvml's valueType of a field value).
_VALUE_MEMBERS: Final = {
    "NVML_VALUE_TYPE_DOUBLE": "dVal",
    "NVML_VALUE_TYPE_UNSIGNED_INT": "uiVal",
    "NVML_VALUE_TYPE_UNSIGNED_LONG": "ulVal",
    "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG": "ullVal",
    "NVML_VALUE_TYPE_SIGNED_LONG_LONG": "sllVal",
    "NVML_VALUE_TYPE_SIGNED_INT": "siVal",
    "NVML_VALUE_TYPE_UNSIGNED_SHORT": "usVal",
}

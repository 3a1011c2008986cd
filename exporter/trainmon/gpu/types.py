"""What the NVML facade hands out, and what it needs from an NVML library.

``trainmon.gpu.nvml.NVML`` returns these values (base units, ``None`` where a
reading is not supported) and raises these errors; ``NVMLLibrary`` is the set
of pynvml calls it makes, which ``pynvml`` itself and the simulated node of
``trainmon.demo.gpus`` both provide. Nothing here imports ``pynvml``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from trainmon.core.collector import CollectorUnavailable


class NVMLLibrary(Protocol):
    """The NVML calls trainmon makes, with pynvml's names and return shapes.

    Errors are raised as ``NVMLError`` instances carrying the code in ``.value``.
    """

    @property
    def NVMLError(self) -> type[Exception]: ...

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetName(self, handle: Any) -> str: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str: ...
    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int: ...
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int: ...
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int: ...
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int: ...
    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int: ...
    def nvmlDeviceGetViolationStatus(self, handle: Any, policy: int) -> Any: ...
    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error: int, counter: int) -> int: ...
    def nvmlDeviceGetFieldValues(self, handle: Any, fields: list[tuple[int, int]]) -> Any: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...
    def nvmlDeviceGetSamples(self, handle: Any, kind: int, since: int) -> tuple[int, Any]: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]: ...
    def nvmlEventSetCreate(self) -> Any: ...
    def nvmlDeviceRegisterEvents(self, handle: Any, kinds: int, event_set: Any) -> None: ...
    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any: ...
    def nvmlEventSetFree(self, event_set: Any) -> None: ...
    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any: ...
    def nvmlGpmSampleAlloc(self) -> Any: ...
    def nvmlGpmSampleFree(self, sample: Any) -> None: ...
    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> Any: ...
    def nvmlGpmMetricsGet(self, request: Any) -> Any: ...
    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int: ...
    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int: ...
    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int: ...
    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int: ...
    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int: ...
    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock: int) -> int: ...
    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]: ...
    def nvmlDeviceGetRetiredPages(self, handle: Any, cause: int) -> list[int]: ...
    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any) -> int: ...
    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int: ...
    def nvmlDeviceGetGpuFabricInfoV(self, handle: Any, info: Any) -> Any: ...
    def nvmlDeviceGetGpuFabricInfo(self, handle: Any, info: Any) -> Any: ...


class NVMLUnavailable(CollectorUnavailable):
    """NVML cannot be used right now (no library, no driver, session lost)."""


class GPULost(Exception):
    """The GPU answered ``NVML_ERROR_GPU_IS_LOST`` (fell off the bus, needs a reset)."""


@dataclass(frozen=True)
class GPUIdentity:
    """Static facts of one GPU; empty strings where NVML would not say."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str


@dataclass(frozen=True)
class GPUReadings:
    """One GPU's readings in base units; ``None`` or a missing key = not supported.

    Counters (energy, throttle, byte and ECC counters) are cumulative since the
    driver loaded. ``failed`` names the calls that failed unexpectedly this time.
    """

    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    energy_joules: float | None = None
    temperature_celsius: float | None = None
    sm_clock_hertz: float | None = None
    throttle_seconds: Mapping[str, float] = field(default_factory=dict)
    pcie_transmit_bytes: int | None = None
    pcie_receive_bytes: int | None = None
    nvlink_transmit_bytes: int | None = None
    nvlink_receive_bytes: int | None = None
    ecc_errors: Mapping[str, int] = field(default_factory=dict)
    pcie_link_width: int | None = None
    pcie_link_generation: int | None = None
    pcie_replays: int | None = None
    #: ``nvmlGpuRecoveryAction_t`` of field ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``.
    recovery_action: int | None = None
    failed: tuple[str, ...] = ()


@dataclass(frozen=True)
class GPUHealth:
    """One GPU's slow-changing health readings (``trainmon.gpu.health``); ``None``
    or a missing key = not supported, or not in this driver.

    ``remapped_rows`` by cause (``correctable`` / ``uncorrectable``, rows remapped
    since manufacture, Ampere and later), ``retired_pages`` by cause
    (``single_bit`` / ``double_bit``, pages retired, Volta and older mostly),
    ``nvlink_up`` by link index (every link the GPU has), ``fabric_up`` whether
    NVSwitch fabric registration completed with success (None: no fabric).
    ``failed`` names the calls that failed unexpectedly at the last refresh.
    """

    pcie_link_max_width: int | None = None
    pcie_link_max_generation: int | None = None
    sm_clock_max_hertz: float | None = None
    remapped_rows: Mapping[str, int] = field(default_factory=dict)
    row_remap_pending: bool | None = None
    row_remap_failed: bool | None = None
    retired_pages: Mapping[str, int] = field(default_factory=dict)
    retired_pages_pending: bool | None = None
    nvlink_up: Mapping[int, bool] = field(default_factory=dict)
    fabric_up: bool | None = None
    failed: tuple[str, ...] = ()


@dataclass(frozen=True)
class GPUProcess:
    """A compute process on a GPU; ``used_memory_bytes`` is None where hidden.

    ``gpu_instance_id``: the MIG GPU instance it runs on (None outside MIG, or
    where the driver does not say, as for an unprivileged reader)."""

    pid: int
    used_memory_bytes: int | None
    gpu_instance_id: int | None = None


@dataclass(frozen=True)
class MIGInstance:
    """One MIG GPU instance of a GPU in MIG mode, as its MIG device handle tells.

    ``profile`` is the GPU instance profile (``1g.10gb``, ``3g.40gb``…) as
    ``nvidia-smi`` names it, taken from the MIG device's name; empty where the
    name does not carry it. Memory in bytes, ``None`` where not supported.
    """

    gpu_instance_id: int
    compute_instance_id: int
    profile: str
    uuid: str
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None


@dataclass(frozen=True)
class GPMActivity:
    """What one GPU's SMs and memory did between two GPM samples, ratios 0–1.

    From ``nvmlGpmMetricsGet`` (NVML reports percent); ``None`` or a missing
    pipe = NVML does not report that metric on this GPU. ``sm_active_ratio``
    is the share of SMs busy (``NVML_GPM_METRIC_SM_UTIL``, DCGM's
    ``PROF_SM_ACTIVE``), ``sm_occupancy_ratio`` resident warps over the maximum,
    ``tensor_active_ratio`` any tensor pipe, ``dram_active_ratio`` DRAM
    bandwidth used over the peak; ``pipe_active_ratio`` by pipe (``fp16``,
    ``fp32``, ``fp64``, ``tensor_hmma``, ``tensor_imma``, ``tensor_dfma``).
    """

    sm_active_ratio: float | None = None
    sm_occupancy_ratio: float | None = None
    tensor_active_ratio: float | None = None
    dram_active_ratio: float | None = None
    pipe_active_ratio: Mapping[str, float] = field(default_factory=dict)

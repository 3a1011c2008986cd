"""A simulated 8-GPU node behind the NVML facade, for ``trainmon serve --demo``.

``SimulatedNVML`` has pynvml's function names and return shapes
(``trainmon.gpu.types.NVMLLibrary``), so the real facade, sampler and collector
run on it unchanged. GPUs 0–3 carry a data-starved job: busy (~97 %) for 6.5 s of
every 10 s, then idle while the input pipeline catches up — the sawtooth the
detector exists for. GPUs 4–7 run steady at ~95 %. Utilization samples come
every 1/6 s like the driver's, with small deterministic noise; power,
temperature and the byte counters follow the load. GPM activity (SM,
tensor-core, DRAM) is the mean utilization between two GPM samples times the
job's activity profile: the starved job's SMs idle between batches, the
healthy job's keep ~80 % of SMs and ~60 % tensor activity. Every GPU is
healthy: a PCIe x16 Gen5 link without replays, no remapped rows (page
retirement is not supported, as on a real H100: Ampere and later remap rows
instead), its 18 NVLink links up, NVSwitch fabric registered, no recovery action
asked. The GPU names end in "(simulated)" so demo series are never mistaken
for real ones.
"""

from __future__ import annotations

import ctypes
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from trainmon.gpu import nvml

GPU_COUNT = 8
STARVED_GPUS = range(0, 4)
#: The starved job's sawtooth: period (seconds) and busy share of it.
SAWTOOTH_PERIOD_SECONDS = 10.0
SAWTOOTH_BUSY_SHARE = 0.65
SAMPLE_PERIOD_US = 166_667
SAMPLE_BUFFER = 100
DRIVER_VERSION = "550.54.15"
NAME = "NVIDIA H100 80GB HBM3 (simulated)"
IDLE_WATTS, BUSY_WATTS = 120.0, 680.0
NVLINK_LINKS = 18
PCIE_WIDTH, PCIE_GENERATION = 16, 5
MAX_SM_CLOCK_MHZ = 1980


def pci_bus_id(gpu: int) -> str:
    """NVML's PCI bus id of simulated GPU ``gpu`` (the demo node tree has its sysfs device)."""
    return f"00000000:{0x18 + 0x10 * gpu:02X}:00.0"


def process_pid(gpu: int) -> int:
    """The pid of the training rank's compute process on simulated GPU ``gpu`` (the demo
    tree has its ``/proc/<pid>/status`` and ``environ``)."""
    return 41000 + gpu


#: A notebook left open on GPU 7 beside the healthy job's rank: a process that holds the
#: GPU and never reports (its ``environ`` names the job, ``idle_allocated``).
NOTEBOOK_GPU = 7
NOTEBOOK_PID = 41100
NOTEBOOK_JOB = "demo-notebook"
NOTEBOOK_TEAM = "research"


class SimulatedNVMLError(Exception):
    """An NVML error of the simulation; ``value`` is the NVML return code."""

    def __init__(self, value: int) -> None:
        super().__init__(nvml.error_name(value))
        self.value = value


@dataclass(frozen=True)
class _Profile:
    """Average behaviour of one GPU's job, for the cumulative counters."""

    mean_utilization: float
    pcie_receive_bytes_per_second: float
    nvlink_bytes_per_second: float
    power_throttle_share: float


_STARVED = _Profile(SAWTOOTH_BUSY_SHARE * 0.97, 1.6e9, 45e9, 0.0)
_HEALTHY = _Profile(0.95, 0.4e9, 160e9, 0.03)

#: GPM percent per unit of utilization (a busy GPU ≈ 0.95): SMs ~80 % busy,
#: tensor cores ~60 %, mixed-precision training (HMMA, some FP32/FP16, no FP64).
_GPM_PER_BUSY = {
    nvml.GPM_SM_ACTIVE: 84.0,
    nvml.GPM_SM_OCCUPANCY: 42.0,
    nvml.GPM_TENSOR_ACTIVE: 63.0,
    nvml.GPM_DRAM_ACTIVE: 38.0,
    nvml.GPM_PIPES["tensor_hmma"]: 63.0,
    nvml.GPM_PIPES["tensor_imma"]: 0.0,
    nvml.GPM_PIPES["tensor_dfma"]: 0.0,
    nvml.GPM_PIPES["fp32"]: 18.0,
    nvml.GPM_PIPES["fp16"]: 9.0,
    nvml.GPM_PIPES["fp64"]: 0.0,
}


class SimulatedNVML:
    """pynvml's surface over a simulated node; handles are GPU indexes."""

    NVMLError = SimulatedNVMLError

    def __init__(self, *, wall_clock: Callable[[], float] = time.time) -> None:
        self._clock = wall_clock
        self._started = wall_clock()
        #: GPM sample buffers by address: [buffer, GPU, timestamp µs] (None until taken).
        self._gpm_samples: dict[int, list[Any]] = {}

    # -- helpers ---------------------------------------------------------------

    def _elapsed(self) -> float:
        return max(0.0, self._clock() - self._started)

    def _profile(self, gpu: int) -> _Profile:
        return _STARVED if gpu in STARVED_GPUS else _HEALTHY

    def _check(self, gpu: Any) -> int:
        if not isinstance(gpu, int) or not 0 <= gpu < GPU_COUNT:
            raise SimulatedNVMLError(nvml.ERROR_UNKNOWN)
        return gpu

    def utilization_at(self, gpu: int, timestamp_us: int) -> float:
        """Busy ratio (0–1) of ``gpu`` in the sample period ending at ``timestamp_us``."""
        noise = (zlib.crc32(f"{gpu}:{timestamp_us // SAMPLE_PERIOD_US}".encode()) % 401) / 10000
        if gpu in STARVED_GPUS:
            phase = (timestamp_us / 1e6 + 0.15 * gpu) % SAWTOOTH_PERIOD_SECONDS
            busy = phase < SAWTOOTH_BUSY_SHARE * SAWTOOTH_PERIOD_SECONDS
            return 0.95 + noise if busy else noise / 2
        return 0.93 + noise

    # -- session and identity -----------------------------------------------------

    def nvmlInit(self) -> None:
        return None

    def nvmlShutdown(self) -> None:
        return None

    def nvmlSystemGetDriverVersion(self) -> str:
        return DRIVER_VERSION

    def nvmlDeviceGetCount(self) -> int:
        return GPU_COUNT

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return self._check(index)

    def nvmlDeviceGetName(self, handle: Any) -> str:
        self._check(handle)
        return NAME

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return f"GPU-d3e00000-0000-4000-8000-{self._check(handle):012d}"

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        return SimpleNamespace(busId=pci_bus_id(self._check(handle)))

    # -- readings -------------------------------------------------------------------

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        gpu = self._check(handle)
        total = 80 * 2**30
        used = (61 if gpu in STARVED_GPUS else 74) * 2**30 + gpu * 2**26
        return SimpleNamespace(total=total, used=used, free=total - used)

    def _now_utilization(self, gpu: int) -> float:
        return self.utilization_at(gpu, int(self._clock() * 1e6))

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        gpu = self._check(handle)
        return int((IDLE_WATTS + (BUSY_WATTS - IDLE_WATTS) * self._now_utilization(gpu)) * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        self._check(handle)
        return 700_000

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        profile = self._profile(self._check(handle))
        watts = IDLE_WATTS + (BUSY_WATTS - IDLE_WATTS) * profile.mean_utilization
        return int((5e6 + watts * self._elapsed()) * 1000)  # mJ

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        return int(34 + 40 * self._profile(self._check(handle)).mean_utilization)

    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int:
        gpu = self._check(handle)
        return 1980 if self._now_utilization(gpu) > 0.1 else 345

    def nvmlDeviceGetViolationStatus(self, handle: Any, policy: int) -> Any:
        profile = self._profile(self._check(handle))
        share = profile.power_throttle_share if policy == nvml.THROTTLE_REASONS["power"] else 0
        return SimpleNamespace(referenceTime=0, violationTime=int(share * self._elapsed() * 1e9))

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error: int, counter: int) -> int:
        gpu = self._check(handle)
        return 3 if gpu == 5 and error == nvml.MEMORY_ERROR_CORRECTED else 0

    def nvmlDeviceGetFieldValues(self, handle: Any, fields: list[tuple[int, int]]) -> list[Any]:
        profile = self._profile(self._check(handle))
        elapsed = self._elapsed()
        counters = {
            nvml.FIELD_PCIE_RX_BYTES: profile.pcie_receive_bytes_per_second * elapsed,
            nvml.FIELD_PCIE_TX_BYTES: 0.05e9 * elapsed,
            nvml.FIELD_NVLINK_DATA_TX_KIB: profile.nvlink_bytes_per_second * elapsed / 1024,
            nvml.FIELD_NVLINK_DATA_RX_KIB: profile.nvlink_bytes_per_second * elapsed / 1024,
            nvml.FIELD_NVLINK_LINK_COUNT: NVLINK_LINKS,
            nvml.FIELD_GPU_RECOVERY_ACTION: 0,  # NVML_GPU_RECOVERY_ACTION_NONE
        }
        values = []
        for field_id, scope in fields:
            value = counters.get(field_id)
            per_link = field_id in (nvml.FIELD_NVLINK_DATA_TX_KIB, nvml.FIELD_NVLINK_DATA_RX_KIB)
            if value is not None and per_link and scope != nvml.SCOPE_ALL_LINKS:
                value /= NVLINK_LINKS
            code = 0 if value is not None else nvml.ERROR_NOT_SUPPORTED
            values.append(
                SimpleNamespace(
                    fieldId=field_id,
                    scopeId=scope,
                    nvmlReturn=code,
                    valueType=3,  # unsigned long long
                    value=SimpleNamespace(ullVal=int(value or 0)),
                )
            )
        return values

    # -- health: every GPU healthy ------------------------------------------------------

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        self._check(handle)
        return PCIE_WIDTH

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        self._check(handle)
        return PCIE_WIDTH

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        self._check(handle)
        return PCIE_GENERATION

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        self._check(handle)
        return PCIE_GENERATION

    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, handle: Any) -> int:
        self._check(handle)
        return PCIE_GENERATION

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        self._check(handle)
        return 0

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock: int) -> int:
        self._check(handle)
        return MAX_SM_CLOCK_MHZ

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        self._check(handle)
        return 0, 0, 0, 0  # correctable, uncorrectable, pending, failed

    def nvmlDeviceGetRetiredPages(self, handle: Any, cause: int) -> list[int]:
        self._check(handle)
        raise SimulatedNVMLError(nvml.ERROR_NOT_SUPPORTED)  # Hopper remaps rows instead

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any) -> int:
        self._check(handle)
        raise SimulatedNVMLError(nvml.ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        self._check(handle)
        if not 0 <= link < NVLINK_LINKS:
            raise SimulatedNVMLError(nvml.ERROR_NOT_SUPPORTED)
        return nvml.FEATURE_ENABLED

    def nvmlDeviceGetGpuFabricInfoV(self, handle: Any, info: Any) -> int:
        """Fills the struct ``info`` (``ctypes.byref`` of it, as pynvml takes it)."""
        self._check(handle)
        info._obj.state = nvml.FABRIC_STATE_COMPLETED
        info._obj.status = 0
        return 0

    def nvmlDeviceGetGpuFabricInfo(self, handle: Any, info: Any) -> int:
        return self.nvmlDeviceGetGpuFabricInfoV(handle, info)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        busy = self._now_utilization(self._check(handle))
        return SimpleNamespace(gpu=round(busy * 100), memory=round(busy * 60))

    def nvmlDeviceGetSamples(self, handle: Any, kind: int, since: int) -> tuple[int, list[Any]]:
        """The driver's ring buffer: the last 100 samples, one every 1/6 s."""
        gpu = self._check(handle)
        if kind != nvml.GPU_UTILIZATION_SAMPLES:
            raise SimulatedNVMLError(nvml.ERROR_NOT_SUPPORTED)
        newest = int(self._clock() * 1e6) // SAMPLE_PERIOD_US
        first = max(newest - SAMPLE_BUFFER + 1, since // SAMPLE_PERIOD_US + 1)
        samples = [
            SimpleNamespace(
                timeStamp=k * SAMPLE_PERIOD_US,
                sampleValue=SimpleNamespace(
                    uiVal=round(100 * self.utilization_at(gpu, k * SAMPLE_PERIOD_US))
                ),
            )
            for k in range(first, newest + 1)
            if k * SAMPLE_PERIOD_US > since
        ]
        if not samples:
            raise SimulatedNVMLError(nvml.ERROR_NOT_FOUND)
        return 1, samples  # NVML_VALUE_TYPE_UNSIGNED_INT

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        gpu = self._check(handle)
        processes = [SimpleNamespace(pid=process_pid(gpu), usedGpuMemory=(58 + gpu) * 2**30)]
        if gpu == NOTEBOOK_GPU:
            processes.append(SimpleNamespace(pid=NOTEBOOK_PID, usedGpuMemory=3 * 2**30))
        return processes

    # -- events: the simulated node has no XID errors ----------------------------------

    def nvmlEventSetCreate(self) -> Any:
        return SimpleNamespace()

    def nvmlDeviceRegisterEvents(self, handle: Any, kinds: int, event_set: Any) -> None:
        self._check(handle)

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        time.sleep(timeout_ms / 1000)
        raise SimulatedNVMLError(nvml.ERROR_TIMEOUT)

    def nvmlEventSetFree(self, event_set: Any) -> None:
        return None

    # -- GPM: samples are small ctypes buffers, like NVML's opaque handles ----------

    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any:
        self._check(handle)
        return SimpleNamespace(version=1, isSupportedDevice=1)

    def nvmlGpmSampleAlloc(self) -> Any:
        buffer = ctypes.create_string_buffer(16)
        self._gpm_samples[ctypes.addressof(buffer)] = [buffer, None, None]
        return ctypes.cast(buffer, nvml.GPMSample)

    def _gpm_entry(self, sample: Any) -> list[Any]:
        entry = self._gpm_samples.get(ctypes.cast(sample, ctypes.c_void_p).value or 0)
        if entry is None:
            raise SimulatedNVMLError(nvml.ERROR_UNKNOWN)
        return entry

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self._gpm_entry(sample)
        del self._gpm_samples[ctypes.cast(sample, ctypes.c_void_p).value or 0]

    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> Any:
        entry = self._gpm_entry(sample)
        entry[1], entry[2] = self._check(handle), int(self._clock() * 1e6)
        return sample

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        """Mean utilization between the two samples × the activity profile, percent."""
        _, gpu, start = self._gpm_entry(request.sample1)
        _, other, end = self._gpm_entry(request.sample2)
        if gpu is None or gpu != other or end <= start:
            raise SimulatedNVMLError(nvml.ERROR_UNKNOWN)
        periods = range(start // SAMPLE_PERIOD_US + 1, end // SAMPLE_PERIOD_US + 1)
        busy = [self.utilization_at(gpu, k * SAMPLE_PERIOD_US) for k in periods] or [
            self.utilization_at(gpu, end)
        ]
        mean = sum(busy) / len(busy)
        for slot in range(request.numMetrics):
            metric = request.metrics[slot]
            per_busy = _GPM_PER_BUSY.get(int(metric.metricId))
            metric.nvmlReturn = 0 if per_busy is not None else nvml.ERROR_NOT_SUPPORTED
            metric.value = 0.0 if per_busy is None else min(100.0, per_busy * mean)
        return request

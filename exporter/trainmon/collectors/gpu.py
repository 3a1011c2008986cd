"""GPU metrics from NVML: device readings, the utilization sampler, GPM activity, XID events.

``GPUCollector`` reads every GPU through the ``NVML`` facade on each scrape
(20 cheap calls per GPU, 160 for 8 GPUs, as counted by ``bench/gpu_collection.py``
on the fake NVML; no 20 ms blocking ones), its slow-changing health readings
(PCIe link maxima, row remapping, retired pages, NVLink states, fabric) at most
every ``health_interval_seconds`` (``trainmon.gpu.health``), the recommended
recovery action from the driver or the XID table (``trainmon.gpu.recovery``),
and adds what its three background threads keep: the utilization sampler
(``trainmon.gpu.sampler``), the GPM sampler (``trainmon.gpu.gpm``: SM,
tensor-core and DRAM activity, where the GPU has GPM and ``collectors.gpu.gpm``
is on) and the XID listener (``trainmon.gpu.events``), which waits on an NVML
event set so that no XID error is lost between scrapes. The ``gpu`` label is
the NVML index as a decimal string, as in dcgm-exporter. A lost GPU keeps only
its ``_info``, ``trainmon_gpu_up`` (0), XID series and the XID table's recovery
action (where one applies); the other GPUs go on. Process lists are expensive
and read only on demand, at most every ``process_interval_seconds``. A GPU in
MIG mode adds its GPU instances (``trainmon_gpu_mig_*``: identity, memory, GPM
activity per instance, labelled ``gpu_instance_id`` and ``mig_profile``); a GPU
without MIG mode adds nothing (the MIG families are left out of the scrape).
Every metric is documented in ``docs/metrics.md`` (GPU section).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from trainmon import contract
from trainmon.core.collector import Collector
from trainmon.core.entry import CollectorEntry, Wiring
from trainmon.core.families import CounterMetricFamily, GaugeMetricFamily, Metric
from trainmon.gpu.events import XidCount, XidListener
from trainmon.gpu.gpm import GPMSampler
from trainmon.gpu.health import REFRESH_SECONDS, HealthReader
from trainmon.gpu.nvml import NVML
from trainmon.gpu.recovery import XID_LOOKBACK_SECONDS, recommended_action
from trainmon.gpu.sampler import Hysteresis, UtilizationSampler, UtilizationSnapshot
from trainmon.gpu.types import (
    GPMActivity,
    GPUHealth,
    GPULost,
    GPUProcess,
    GPUReadings,
    MIGInstance,
    NVMLUnavailable,
)
from trainmon.section import Auto, Invalid, setting

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GPUConfig:
    """The ``collectors.gpu`` section: ``auto`` is on where NVML loads."""

    enabled: bool | Auto = "auto"
    #: Sampler window, seconds; the sawtooth ratio looks at the last two windows.
    window_seconds: float = field(default=60.0, metadata=setting(minimum=5, maximum=3600))
    #: How often the sampler thread drains the driver's sample buffer.
    sample_interval_seconds: float = field(default=1.0, metadata=setting(minimum=0.1, maximum=10))
    #: How often the process list (expensive) is read for attribution.
    process_interval_seconds: float = field(
        default=15.0, metadata=setting(minimum=1, maximum=3600))
    #: A utilization sample below this busy ratio (0-1) counts as idle.
    idle_threshold: float = field(
        default=contract.SAMPLER_IDLE_LEVEL, metadata=setting(minimum=0.01, maximum=0.9))
    #: A sample at or above this busy ratio puts the GPU in the busy state.
    busy_threshold: float = field(
        default=contract.SAMPLER_BUSY_LEVEL, metadata=setting(minimum=0.1, maximum=1))
    #: Seconds between attempts to (re)open NVML or to probe a lost GPU.
    retry_seconds: float = field(default=10.0, metadata=setting(minimum=1, maximum=3600))
    #: Read SM, tensor-core and DRAM activity through NVML GPM where the GPU has it.
    gpm: bool = True
    #: Seconds between two GPM samples (>= 0.1; 0 turns GPM off like ``gpm: false``).
    gpm_interval_seconds: float = field(default=1.0, metadata=setting(minimum=0, maximum=60))
    #: Seconds between two reads of a GPU's slow health readings (row remapping,
    #: retired pages, NVLink states, fabric, PCIe link and SM clock maxima).
    health_interval_seconds: float = field(
        default=REFRESH_SECONDS, metadata=setting(minimum=1, maximum=3600))

    @property
    def gpm_enabled(self) -> bool:
        return self.gpm and self.gpm_interval_seconds > 0

    def check(self) -> None:
        """Rules between the keys (``trainmon.section.read_section``)."""
        if 0 < self.gpm_interval_seconds < 0.1:
            raise Invalid(
                "gpm_interval_seconds",
                "must be 0 (GPM off) or at least 0.1 (GPM metrics need 100 ms between samples)",
            )
        if self.busy_threshold - self.idle_threshold < 0.1:
            raise Invalid(
                "busy_threshold",
                "must exceed idle_threshold by at least 0.1 (the gap absorbs utilization noise)",
            )
        if self.sample_interval_seconds * 2 > self.window_seconds:
            raise Invalid("sample_interval_seconds", "must be at most half of window_seconds")


class GPUCollector(Collector):
    """Every GPU metric of docs/metrics.md ("GPU") for the GPUs NVML enumerates."""

    name = "gpu"

    def __init__(
        self,
        nvml: NVML,
        config: GPUConfig,
        *,
        wall_clock: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nvml = nvml
        self._config = config
        self._clock = clock
        self._wall_clock = wall_clock
        self.health_reader = HealthReader(
            nvml, refresh_seconds=config.health_interval_seconds, clock=clock
        )
        self.sampler = UtilizationSampler(
            nvml,
            interval_seconds=config.sample_interval_seconds,
            window_seconds=config.window_seconds,
            hysteresis=Hysteresis(config.idle_threshold, config.busy_threshold),
        )
        self.xid = XidListener(nvml, clock=clock, wall_clock=wall_clock,
                               retry_seconds=config.retry_seconds)
        self.gpm = (
            GPMSampler(nvml, interval_seconds=config.gpm_interval_seconds)
            if config.gpm_enabled
            else None
        )
        self._processes: dict[int, tuple[GPUProcess, ...]] = {}
        self._processes_read_at = float("-inf")
        self._process_lock = threading.Lock()
        self._health: dict[str, object] = {}

    def start(self) -> None:
        """Start the sampler and XID threads; they wait for NVML if it is absent."""
        self.sampler.start()
        self.xid.start()
        if self.gpm is not None:
            self.gpm.start()

    def stop(self) -> None:
        self.sampler.stop()
        self.xid.stop()
        if self.gpm is not None:
            self.gpm.stop()  # frees its sample buffers before the session closes
        self._nvml.close()

    def health(self) -> Mapping[str, object]:
        gpm = {"state": "disabled by configuration"} if self.gpm is None else self.gpm.states()
        return dict(self._health, xid_events=self.xid.state, gpm=gpm)

    def processes(self) -> Mapping[int, tuple[GPUProcess, ...]]:
        """Compute processes per GPU index, re-read at most every
        ``process_interval_seconds`` (for attribution). Empty without NVML."""
        with self._process_lock:
            if self._clock() - self._processes_read_at >= self._config.process_interval_seconds:
                self._processes_read_at = self._clock()
                self._processes = self._read_processes()
            return dict(self._processes)

    def _read_processes(self) -> dict[int, tuple[GPUProcess, ...]]:
        result: dict[int, tuple[GPUProcess, ...]] = {}
        try:
            for device in self._nvml.devices():
                try:
                    processes = self._nvml.processes(device.index)
                except GPULost:
                    continue
                if processes is not None:
                    result[device.index] = processes
        except NVMLUnavailable as reason:
            log.debug("no GPU process list: %s", reason)
        return result

    def collect(self) -> Iterable[Metric]:
        session = self._nvml.session()  # NVMLUnavailable → "unavailable" in /healthz
        devices, driver = session.devices, session.driver_version
        families = _Families()
        utilization = self.sampler.snapshot()
        activity = {} if self.gpm is None else self.gpm.snapshot()
        mig_activity = {} if self.gpm is None else self.gpm.mig_snapshot()
        xid_counts = self.xid.counts()
        recent_xids = _recent_xids(xid_counts, self._wall_clock() - XID_LOOKBACK_SECONDS)
        lost = []
        mig_gpus: list[str] = []
        for device in devices:
            gpu = str(device.index)
            families.info.add_metric(
                [gpu, device.uuid, device.name, device.pci_bus_id, driver], 1.0
            )
            xids = recent_xids.get(device.index, ())
            try:
                readings = self._nvml.read(device.index)
                health = self.health_reader.read(device.index)
                instances = self._nvml.mig_instances(device.index)
            except GPULost:
                families.up.add_metric([gpu], 0.0)
                action, source = recommended_action(None, xids)
                if action != "none":
                    families.recovery.add_metric([gpu, action, source], 1.0)
                lost.append(device.index)
                continue
            families.up.add_metric([gpu], 0.0 if readings.failed or health.failed else 1.0)
            families.add_readings(gpu, readings)
            families.add_health(gpu, health)
            action, source = recommended_action(readings.recovery_action, xids)
            families.recovery.add_metric([gpu, action, source], 1.0)
            snapshot = utilization.get(device.index)
            if snapshot is not None:
                families.add_utilization(gpu, snapshot)
            gpm = activity.get(device.index)
            if gpm is not None:
                families.add_activity(gpu, gpm)
            if instances:
                mig_gpus.append(gpu)
            for instance in instances:
                families.add_instance(
                    gpu, instance, mig_activity.get((device.index, instance.gpu_instance_id))
                )
        if mig_gpus:  # which instance each process runs on (the rate-limited process list)
            for index, processes in sorted(self.processes().items()):
                for process in processes:
                    if str(index) in mig_gpus and process.gpu_instance_id is not None:
                        families.mig_process.add_metric(
                            [str(index), str(process.gpu_instance_id), str(process.pid)], 1.0
                        )
        for (index, xid), count in sorted(xid_counts.items()):
            families.xid_errors.add_metric([str(index), str(xid)], count.count)
            families.xid_last.add_metric([str(index), str(xid)], count.last_timestamp_seconds)
        self._health = {
            "driver_version": driver,
            "gpus": len(devices),
            "lost_gpus": lost,
            "generation": self._nvml.generation,
        }
        return families.all()


def _recent_xids(counts: Mapping[tuple[int, int], XidCount], since: float) -> dict[int, list[int]]:
    """GPU index → XID codes whose latest event came at or after ``since`` (Unix time)."""
    recent: dict[int, list[int]] = {}
    for (index, xid), count in counts.items():
        if count.last_timestamp_seconds >= since:
            recent.setdefault(index, []).append(xid)
    return recent


class _Families:
    """Fresh metric families for one scrape."""

    def __init__(self) -> None:
        g, c = GaugeMetricFamily, CounterMetricFamily
        gpu = ["gpu"]
        self.info = g(
            "trainmon_gpu_info",
            "GPU identity from NVML (gauge = 1); join on gpu.",
            labels=["gpu", "uuid", "name", "pci_bus_id", "driver_version"],
        )
        self.up = g(
            "trainmon_gpu_up", "1 if the GPU answers NVML, 0 if lost or erroring.", labels=gpu
        )
        self.utilization = g(
            "trainmon_gpu_utilization_ratio",
            "Latest driver utilization sample: share of time a kernel ran (0-1).",
            labels=gpu,
        )
        self.memory_used = g(
            "trainmon_gpu_memory_used_bytes",
            "Framebuffer memory in use, bytes (nvmlDeviceGetMemoryInfo).",
            labels=gpu,
        )
        self.memory_total = g(
            "trainmon_gpu_memory_total_bytes", "Framebuffer memory size, bytes.", labels=gpu
        )
        self.power = g(
            "trainmon_gpu_power_watts", "Power draw, watts (nvmlDeviceGetPowerUsage).", labels=gpu
        )
        self.power_limit = g(
            "trainmon_gpu_power_limit_watts", "Enforced power limit, watts.", labels=gpu
        )
        self.energy = c(
            "trainmon_gpu_energy_joules_total",
            "Energy used since the driver loaded, joules.",
            labels=gpu,
        )
        self.temperature = g(
            "trainmon_gpu_temperature_celsius", "GPU die temperature, degrees Celsius.", labels=gpu
        )
        self.sm_clock = g("trainmon_gpu_sm_clock_hertz", "Current SM clock, hertz.", labels=gpu)
        self.throttle = c(
            "trainmon_gpu_throttle_seconds_total",
            "Time clocks were held below target, per reason, seconds "
            "(nvmlDeviceGetViolationStatus).",
            labels=["gpu", "reason"],
        )
        self.pcie_tx = c(
            "trainmon_gpu_pcie_transmit_bytes_total",
            "Bytes sent over PCIe (NVML field 197).",
            labels=gpu,
        )
        self.pcie_rx = c(
            "trainmon_gpu_pcie_receive_bytes_total",
            "Bytes received over PCIe (NVML field 198).",
            labels=gpu,
        )
        self.nvlink_tx = c(
            "trainmon_gpu_nvlink_transmit_bytes_total",
            "NVLink data bytes sent, all links (NVML field 138).",
            labels=gpu,
        )
        self.nvlink_rx = c(
            "trainmon_gpu_nvlink_receive_bytes_total",
            "NVLink data bytes received, all links (NVML field 139).",
            labels=gpu,
        )
        self.ecc = c(
            "trainmon_gpu_ecc_errors_total",
            "ECC memory errors since the driver loaded (volatile counters), by severity.",
            labels=["gpu", "severity"],
        )
        self.xid_errors = c(
            "trainmon_gpu_xid_errors_total",
            "XID critical errors seen by the event thread.",
            labels=["gpu", "xid"],
        )
        self.xid_last = g(
            "trainmon_gpu_xid_last_timestamp_seconds",
            "Unix time of the latest XID error of this code on this GPU.",
            labels=["gpu", "xid"],
        )
        self.samples = c(
            "trainmon_gpu_util_samples_total",
            "Driver utilization samples seen by the sampler (~6/s).",
            labels=gpu,
        )
        self.idle_samples = c(
            "trainmon_gpu_util_idle_samples_total",
            "Utilization samples below the idle threshold.",
            labels=gpu,
        )
        self.transitions = c(
            "trainmon_gpu_util_transitions_total",
            "Busy/idle transitions of the utilization (with hysteresis).",
            labels=gpu,
        )
        self.sm_active = g(
            "trainmon_gpu_sm_active_ratio",
            "Share of SMs busy over the last GPM interval, 0-1 (NVML GPM SM_UTIL).",
            labels=gpu,
        )
        self.sm_occupancy = g(
            "trainmon_gpu_sm_occupancy_ratio",
            "Resident warps over the SMs' maximum, last GPM interval, 0-1 (GPM SM_OCCUPANCY).",
            labels=gpu,
        )
        self.tensor_active = g(
            "trainmon_gpu_tensor_active_ratio",
            "Share of time any tensor-core pipe was active, last GPM interval, 0-1 "
            "(GPM ANY_TENSOR_UTIL).",
            labels=gpu,
        )
        self.pipe_active = g(
            "trainmon_gpu_pipe_active_ratio",
            "Share of time an SM pipe was active, last GPM interval, 0-1 "
            "(GPM FP16/FP32/FP64_UTIL, HMMA/IMMA/DFMA_TENSOR_UTIL).",
            labels=["gpu", "pipe"],
        )
        self.dram_active = g(
            "trainmon_gpu_dram_active_ratio",
            "DRAM bandwidth used over the peak, last GPM interval, 0-1 (GPM DRAM_BW_UTIL).",
            labels=gpu,
        )
        self.pcie_width = g(
            "trainmon_gpu_pcie_link_width",
            "PCIe link width now, lanes (nvmlDeviceGetCurrPcieLinkWidth).",
            labels=gpu,
        )
        self.pcie_max_width = g(
            "trainmon_gpu_pcie_link_max_width",
            "PCIe link's maximum width, lanes (nvmlDeviceGetMaxPcieLinkWidth).",
            labels=gpu,
        )
        self.pcie_generation = g(
            "trainmon_gpu_pcie_link_generation",
            "PCIe link generation now (nvmlDeviceGetCurrPcieLinkGeneration; lower when idle).",
            labels=gpu,
        )
        self.pcie_max_generation = g(
            "trainmon_gpu_pcie_link_max_generation",
            "The GPU's maximum PCIe generation (nvmlDeviceGetGpuMaxPcieLinkGeneration).",
            labels=gpu,
        )
        self.pcie_replays = c(
            "trainmon_gpu_pcie_replays_total",
            "PCIe packets replayed after link errors (nvmlDeviceGetPcieReplayCounter).",
            labels=gpu,
        )
        self.remapped_rows = g(
            "trainmon_gpu_remapped_rows",
            "Memory rows remapped, by cause (nvmlDeviceGetRemappedRows).",
            labels=["gpu", "cause"],
        )
        self.remap_pending = g(
            "trainmon_gpu_row_remap_pending",
            "1 if a row remap waits for a GPU reset to take effect.",
            labels=gpu,
        )
        self.remap_failed = g(
            "trainmon_gpu_row_remap_failed",
            "1 if a row remap failed (the GPU needs service).",
            labels=gpu,
        )
        self.retired_pages = g(
            "trainmon_gpu_retired_pages",
            "Memory pages retired, by cause (nvmlDeviceGetRetiredPages).",
            labels=["gpu", "cause"],
        )
        self.retired_pending = g(
            "trainmon_gpu_retired_pages_pending",
            "1 if a page retirement waits for a driver reload "
            "(nvmlDeviceGetRetiredPagesPendingStatus).",
            labels=gpu,
        )
        self.nvlink_down = g(
            "trainmon_gpu_nvlink_links_down",
            "NVLink links of the GPU that are not active (nvmlDeviceGetNvLinkState), "
            "out of every link it has.",
            labels=gpu,
        )
        self.fabric_up = g(
            "trainmon_gpu_fabric_up",
            "1 if NVSwitch fabric registration completed with success, else 0 "
            "(nvmlDeviceGetGpuFabricInfoV).",
            labels=gpu,
        )
        self.recovery = g(
            "trainmon_gpu_recovery_action",
            "The recommended recovery action (1), from the driver or trainmon's XID table.",
            labels=["gpu", "action", "source"],
        )
        self.sm_clock_max = g(
            "trainmon_gpu_sm_clock_max_hertz",
            "Maximum SM clock, hertz (nvmlDeviceGetMaxClockInfo).",
            labels=gpu,
        )
        mig = ["gpu", "gpu_instance_id", "mig_profile"]
        self.mig_info = g(
            "trainmon_gpu_mig_info",
            "A MIG GPU instance of a GPU in MIG mode (gauge = 1); uuid is its MIG device's.",
            labels=[*mig, "uuid"],
        )
        self.mig_process = g(
            "trainmon_gpu_mig_process_info",
            "A compute process on a MIG GPU instance (gauge = 1); join on gpu, pid with "
            "trainmon_gpu_process_info.",
            labels=["gpu", "gpu_instance_id", "pid"],
        )
        self.mig_memory_used = g(
            "trainmon_gpu_mig_memory_used_bytes",
            "Memory in use in a MIG GPU instance, bytes (nvmlDeviceGetMemoryInfo on its handle).",
            labels=mig,
        )
        self.mig_memory_total = g(
            "trainmon_gpu_mig_memory_total_bytes",
            "Memory of a MIG GPU instance, bytes.",
            labels=mig,
        )
        self.mig_sm_active = g(
            "trainmon_gpu_mig_sm_active_ratio",
            "Share of a MIG instance's SMs busy over the last GPM interval, 0-1 "
            "(nvmlGpmMigSampleGet, GPM SM_UTIL).",
            labels=mig,
        )
        self.mig_tensor_active = g(
            "trainmon_gpu_mig_tensor_active_ratio",
            "Share of time any tensor-core pipe of a MIG instance was active, last GPM "
            "interval, 0-1 (GPM ANY_TENSOR_UTIL).",
            labels=mig,
        )
        self.mig_dram_active = g(
            "trainmon_gpu_mig_dram_active_ratio",
            "DRAM bandwidth a MIG instance used over its peak, last GPM interval, 0-1 "
            "(GPM DRAM_BW_UTIL).",
            labels=mig,
        )
        self.sawtooth = g(
            "trainmon_gpu_sawtooth_ratio",
            "Strength of busy/idle oscillation over the last two sampler windows, 0-1: "
            "min(1, transitions/4); >= 0.5 is flagged.",
            labels=gpu,
        )

    def add_readings(self, gpu: str, readings: GPUReadings) -> None:
        optional = (
            (self.memory_used, readings.memory_used_bytes),
            (self.memory_total, readings.memory_total_bytes),
            (self.power, readings.power_watts),
            (self.power_limit, readings.power_limit_watts),
            (self.energy, readings.energy_joules),
            (self.temperature, readings.temperature_celsius),
            (self.sm_clock, readings.sm_clock_hertz),
            (self.pcie_tx, readings.pcie_transmit_bytes),
            (self.pcie_rx, readings.pcie_receive_bytes),
            (self.nvlink_tx, readings.nvlink_transmit_bytes),
            (self.nvlink_rx, readings.nvlink_receive_bytes),
            (self.pcie_width, readings.pcie_link_width),
            (self.pcie_generation, readings.pcie_link_generation),
            (self.pcie_replays, readings.pcie_replays),
        )
        for family, value in optional:
            if value is not None:
                family.add_metric([gpu], value)
        for reason, seconds in readings.throttle_seconds.items():
            self.throttle.add_metric([gpu, reason], seconds)
        for severity, count in readings.ecc_errors.items():
            self.ecc.add_metric([gpu, severity], count)

    def add_health(self, gpu: str, health: GPUHealth) -> None:
        optional = (
            (self.pcie_max_width, health.pcie_link_max_width),
            (self.pcie_max_generation, health.pcie_link_max_generation),
            (self.sm_clock_max, health.sm_clock_max_hertz),
            (self.remap_pending, health.row_remap_pending),
            (self.remap_failed, health.row_remap_failed),
            (self.retired_pending, health.retired_pages_pending),
            (self.fabric_up, health.fabric_up),
        )
        for family, value in optional:
            if value is not None:
                family.add_metric([gpu], float(value))
        for cause, rows in health.remapped_rows.items():
            self.remapped_rows.add_metric([gpu, cause], rows)
        for cause, pages in health.retired_pages.items():
            self.retired_pages.add_metric([gpu, cause], pages)
        if health.nvlink_up:
            self.nvlink_down.add_metric(
                [gpu], float(sum(not up for up in health.nvlink_up.values())))

    def add_utilization(self, gpu: str, snapshot: UtilizationSnapshot) -> None:
        if snapshot.utilization_ratio is not None:
            self.utilization.add_metric([gpu], snapshot.utilization_ratio)
        self.samples.add_metric([gpu], snapshot.samples_total)
        self.idle_samples.add_metric([gpu], snapshot.idle_samples_total)
        self.transitions.add_metric([gpu], snapshot.transitions_total)
        self.sawtooth.add_metric([gpu], snapshot.sawtooth_ratio)

    def add_activity(self, gpu: str, activity: GPMActivity) -> None:
        optional = (
            (self.sm_active, activity.sm_active_ratio),
            (self.sm_occupancy, activity.sm_occupancy_ratio),
            (self.tensor_active, activity.tensor_active_ratio),
            (self.dram_active, activity.dram_active_ratio),
        )
        for family, value in optional:
            if value is not None:
                family.add_metric([gpu], value)
        for pipe, ratio in activity.pipe_active_ratio.items():
            self.pipe_active.add_metric([gpu, pipe], ratio)

    def add_instance(
        self, gpu: str, instance: MIGInstance, activity: GPMActivity | None
    ) -> None:
        labels = [gpu, str(instance.gpu_instance_id), instance.profile]
        self.mig_info.add_metric([*labels, instance.uuid], 1.0)
        optional: list[tuple[GaugeMetricFamily, float | None]] = [
            (self.mig_memory_used, instance.memory_used_bytes),
            (self.mig_memory_total, instance.memory_total_bytes),
        ]
        if activity is not None:
            optional += [
                (self.mig_sm_active, activity.sm_active_ratio),
                (self.mig_tensor_active, activity.tensor_active_ratio),
                (self.mig_dram_active, activity.dram_active_ratio),
            ]
        for family, value in optional:
            if value is not None:
                family.add_metric(labels, value)

    def all(self) -> list[Metric]:
        """Every family; the MIG ones only where a GPU is in MIG mode (so that a node
        without MIG exposes no empty ``trainmon_gpu_mig_*`` family)."""
        return [
            value
            for value in vars(self).values()
            if isinstance(value, Metric)
            and (value.samples or not value.name.startswith("trainmon_gpu_mig_"))
        ]


def _build(config: GPUConfig, wiring: Wiring) -> Collector:
    """NVML, or the simulated 8-GPU node in demo mode."""
    library = None
    if wiring.demo:
        from trainmon.demo.gpus import SimulatedNVML

        library = SimulatedNVML()
    nvml = NVML(
        library,
        retry_seconds=config.retry_seconds,
        mig_refresh_seconds=config.health_interval_seconds,
    )
    return GPUCollector(nvml, config)


ENTRY = CollectorEntry("gpu", GPUConfig, _build)

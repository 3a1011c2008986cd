"""Which Cloud Monitor metrics are pulled, and how each becomes a trainmon metric.

One row per metric: namespace, Tencent's metric name, our name, the factor to
base units and a help text. Adding a metric is adding a row. Units are those
of Tencent's metric reference pages:

* CVM (``QCE/CVM``, dimension ``InstanceId``,
  https://www.tencentcloud.com/document/product/248/6843): ``GpuUtil``,
  ``GpuMemUsage``, ``GpuPowUsage``, ``CPUUsage``, ``MemUsage`` in %;
  ``GpuMemUsed``/``GpuMemTotal`` in MB (the agent reports NVML's MiB, so the
  factor is 2^20); ``GpuPowDraw``/``GpuPowLimit`` in W; ``GpuTemp`` in °C;
  ``LanIntraffic``/``LanOuttraffic`` in Mbps (10^6 bit/s = 125 000 bytes/s).
* CBS (``QCE/BLOCK_STORAGE``, dimension ``diskId``,
  https://www.tencentcloud.com/document/product/248/37085): read/write IOPS in
  operations per second; ``DiskReadTraffic``/``DiskWriteTraffic`` in KB/s
  (kernel iostat kB = 1024 bytes); ``DiskAwait`` in ms; ``DiskUtil`` in %.

The API's own spelling of a name can differ in case from the reference pages
(``DescribeBaseMetrics`` answers ``CpuUsage``, ``Gpuutil``...), so names are
matched case-insensitively at start-up and the API's spelling is used to pull.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum


@dataclass(frozen=True)
class Conversion:
    """value × multiplier ÷ divisor: Tencent's unit → the base unit (exact for %)."""

    multiplier: float = 1.0
    divisor: float = 1.0

    def __call__(self, value: float) -> float:
        return value * self.multiplier / self.divisor


SAME = Conversion()
PERCENT = Conversion(divisor=100)
MEBIBYTE = Conversion(multiplier=1 << 20)
MEGABIT_PER_SECOND = Conversion(multiplier=125_000)  # 10^6 bit/s ÷ 8
KIBIBYTE = Conversion(multiplier=1024)
MILLISECOND = Conversion(divisor=1000)


class TargetKind(Enum):
    """What a namespace's objects are and the dimension that names one."""

    INSTANCE = ("QCE/CVM", "InstanceId")
    DISK = ("QCE/BLOCK_STORAGE", "diskId")

    @property
    def namespace(self) -> str:
        return self.value[0]

    @property
    def dimension(self) -> str:
        return self.value[1]


@dataclass(frozen=True)
class MetricSpec:
    """One Cloud Monitor metric and its trainmon name."""

    kind: TargetKind
    tencent_name: str
    name: str
    convert: Conversion
    help: str

    @property
    def namespace(self) -> str:
        return self.kind.namespace


_CVM = TargetKind.INSTANCE
_CBS = TargetKind.DISK

CATALOGUE: tuple[MetricSpec, ...] = (
    MetricSpec(_CVM, "GpuUtil", "trainmon_tencent_cvm_gpu_utilization_ratio", PERCENT,
               "GPU utilization reported by Cloud Monitor (GpuUtil), 0-1."),
    MetricSpec(_CVM, "GpuMemUsage", "trainmon_tencent_cvm_gpu_memory_usage_ratio", PERCENT,
               "GPU memory in use over total (GpuMemUsage), 0-1."),
    MetricSpec(_CVM, "GpuMemUsed", "trainmon_tencent_cvm_gpu_memory_used_bytes", MEBIBYTE,
               "GPU memory in use (GpuMemUsed), bytes."),
    MetricSpec(_CVM, "GpuMemTotal", "trainmon_tencent_cvm_gpu_memory_total_bytes", MEBIBYTE,
               "Total GPU memory (GpuMemTotal), bytes."),
    MetricSpec(_CVM, "GpuPowDraw", "trainmon_tencent_cvm_gpu_power_watts", SAME,
               "GPU power draw (GpuPowDraw), watts."),
    MetricSpec(_CVM, "GpuPowLimit", "trainmon_tencent_cvm_gpu_power_limit_watts", SAME,
               "GPU power limit (GpuPowLimit), watts."),
    MetricSpec(_CVM, "GpuPowUsage", "trainmon_tencent_cvm_gpu_power_usage_ratio", PERCENT,
               "GPU power draw over limit (GpuPowUsage), 0-1."),
    MetricSpec(_CVM, "GpuTemp", "trainmon_tencent_cvm_gpu_temperature_celsius", SAME,
               "GPU temperature (GpuTemp), degrees Celsius."),
    MetricSpec(_CVM, "CPUUsage", "trainmon_tencent_cvm_cpu_usage_ratio", PERCENT,
               "CVM CPU utilization (CPUUsage), 0-1."),
    MetricSpec(_CVM, "MemUsage", "trainmon_tencent_cvm_memory_usage_ratio", PERCENT,
               "CVM memory utilization (MemUsage), 0-1."),
    MetricSpec(_CVM, "LanIntraffic", "trainmon_tencent_cvm_lan_receive_bytes_per_second",
               MEGABIT_PER_SECOND, "Private network inbound traffic (LanIntraffic), bytes/s."),
    MetricSpec(_CVM, "LanOuttraffic", "trainmon_tencent_cvm_lan_transmit_bytes_per_second",
               MEGABIT_PER_SECOND, "Private network outbound traffic (LanOuttraffic), bytes/s."),
    MetricSpec(_CBS, "DiskReadIops", "trainmon_tencent_cbs_read_iops", SAME,
               "CBS disk read operations per second (DiskReadIops)."),
    MetricSpec(_CBS, "DiskWriteIops", "trainmon_tencent_cbs_write_iops", SAME,
               "CBS disk write operations per second (DiskWriteIops)."),
    MetricSpec(_CBS, "DiskReadTraffic", "trainmon_tencent_cbs_read_bytes_per_second", KIBIBYTE,
               "CBS disk read throughput (DiskReadTraffic), bytes/s."),
    MetricSpec(_CBS, "DiskWriteTraffic", "trainmon_tencent_cbs_write_bytes_per_second", KIBIBYTE,
               "CBS disk write throughput (DiskWriteTraffic), bytes/s."),
    MetricSpec(_CBS, "DiskAwait", "trainmon_tencent_cbs_await_seconds", MILLISECOND,
               "CBS disk average I/O wait time (DiskAwait), seconds."),
    MetricSpec(_CBS, "DiskUtil", "trainmon_tencent_cbs_utilization_ratio", PERCENT,
               "CBS disk busy time ratio (DiskUtil), 0-1."),
)

#: Label names the puller adds itself or that Prometheus reserves; a response
#: dimension with one of these names is exposed as ``tencent_<name>``.
RESERVED_LABELS = frozenset({"region", "instance", "job", "type", "le", "quantile"})


def select(names: tuple[str, ...]) -> tuple[MetricSpec, ...]:
    """The catalogue rows for Tencent metric ``names`` (case-insensitive); all if empty.

    Raises ValueError naming the unknown ones (the config parser reports it).
    """
    if not names:
        return CATALOGUE
    by_name = {spec.tencent_name.lower(): spec for spec in CATALOGUE}
    unknown = [name for name in names if name.lower() not in by_name]
    if unknown:
        known = ", ".join(spec.tencent_name for spec in CATALOGUE)
        raise ValueError(f"unknown metric(s) {', '.join(unknown)}; known: {known}")
    wanted = {name.lower() for name in names}
    return tuple(spec for spec in CATALOGUE if spec.tencent_name.lower() in wanted)


def label_name(dimension: str) -> str:
    """A Cloud Monitor dimension name as a Prometheus label: snake_case, safe.

    ``InstanceId`` → ``instance_id``, ``diskId`` → ``disk_id``,
    ``minorNumber`` → ``minor_number``, ``vm_uuid`` → ``vm_uuid``.
    """
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", dimension)
    snake = re.sub(r"[^a-zA-Z0-9_]+", "_", snake).strip("_").lower() or "dimension"
    if snake[0].isdigit() or snake.startswith("__"):
        snake = "d_" + snake
    if snake in RESERVED_LABELS:
        snake = "tencent_" + snake
    return snake

"""Disk collector: I/O counters of whole block devices.

Exports, labelled ``device``, the counters of ``COUNTERS``
(``trainmon_disk_reads_completed_total``, ``trainmon_disk_read_bytes_total``,
``trainmon_disk_io_time_seconds_total``...) and the gauge
``trainmon_disk_io_now``. The readings (``/proc/diskstats`` fields per kernel
version, units, how whole disks are told from partitions, which devices are
always dropped, 32-bit wraps) come from ``trainmon.node.diskstats``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from trainmon.core.collector import Collector
from trainmon.core.entry import CollectorEntry, Wiring
from trainmon.core.families import CounterMetricFamily, GaugeMetricFamily, Metric
from trainmon.node.diskstats import DISKSTATS_FIELDS, DiskstatsReader
from trainmon.section import DeviceFilter, setting

#: Exported counter → (``DISKSTATS_FIELDS`` counter, start of the HELP text).
COUNTERS: dict[str, tuple[str, str]] = {
    "trainmon_disk_reads_completed_total": (
        "reads_completed", "Reads completed successfully"),
    "trainmon_disk_writes_completed_total": (
        "writes_completed", "Writes completed successfully"),
    "trainmon_disk_read_bytes_total": (
        "read_bytes", "Bytes read (sectors read x 512)"),
    "trainmon_disk_written_bytes_total": (
        "written_bytes", "Bytes written (sectors written x 512)"),
    "trainmon_disk_read_time_seconds_total": (
        "read_time_seconds", "Seconds spent by all reads"),
    "trainmon_disk_write_time_seconds_total": (
        "write_time_seconds", "Seconds spent by all writes"),
    "trainmon_disk_io_time_seconds_total": (
        "io_time_seconds", "Seconds the device was busy with I/O (rate = utilization 0-1)"),
    "trainmon_disk_io_time_weighted_seconds_total": (
        "io_time_weighted_seconds",
        "Seconds of I/O weighted by requests in flight (rate = avg queue size)"),
    "trainmon_disk_discards_completed_total": (
        "discards_completed", "Discards completed successfully (4.18+)"),
    "trainmon_disk_discarded_bytes_total": (
        "discarded_bytes", "Bytes discarded (sectors x 512, 4.18+)"),
    "trainmon_disk_flush_requests_total": (
        "flush_requests", "Flush requests completed successfully (5.5+)"),
}  # fmt: skip


@dataclass(frozen=True)
class DiskConfig:
    """The ``collectors.disk`` section."""

    enabled: bool = True
    #: ``include``/``exclude`` regexes over device names, applied after the
    #: built-in rule that drops partitions, loop, ram and zram.
    devices: DeviceFilter = field(default=DeviceFilter(), metadata=setting(inline=True))


class DiskCollector(Collector):
    """I/O counters of whole block devices."""

    name = "disk"

    def __init__(self, config: DiskConfig, proc_root: Path, sys_root: Path) -> None:
        self._disks = DiskstatsReader(proc_root, sys_root, config.devices.accepts)

    def collect(self) -> Iterable[Metric]:
        """Read ``/proc/diskstats`` and the sysfs block tree now; build fresh families."""
        disks = self._disks.read()
        families = {
            name: CounterMetricFamily(name, _HELP[name], labels=["device"]) for name in COUNTERS
        }
        in_flight = GaugeMetricFamily(
            "trainmon_disk_io_now",
            "I/O requests in flight on the whole block device (/proc/diskstats field 9).",
            labels=["device"],
        )
        for disk in disks:
            for name, (counter, _) in COUNTERS.items():
                value = disk.counters.get(counter)
                if value is not None:
                    families[name].add_metric([disk.device], value)
            in_flight.add_metric([disk.device], disk.io_in_flight)
        return [family for family in [*families.values(), in_flight] if family.samples]


def _counter_help(counter: str, start: str) -> str:
    field = DISKSTATS_FIELDS[counter].number
    return f"{start} on the whole block device, cumulative (/proc/diskstats field {field})."


#: Exported counter → its HELP text (made once, not on every scrape).
_HELP = {name: _counter_help(counter, start) for name, (counter, start) in COUNTERS.items()}


def _build(config: DiskConfig, wiring: Wiring) -> Collector:
    return DiskCollector(config, wiring.proc_root, wiring.sys_root)


ENTRY = CollectorEntry("disk", DiskConfig, _build)

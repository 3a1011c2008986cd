"""Block device I/O counters from ``/proc/diskstats``, whole disks only.

Source: ``<proc>/diskstats`` (roots injected, ``/host/proc`` in a container),
one line per block device: ``major minor name`` and then, cumulative since
boot or since the device appeared,

====  ========================================  ===================================
 #     field (Documentation/admin-guide/         exported as
       iostats.rst)
====  ========================================  ===================================
 1     reads completed                           ``reads_completed_total``
 3     sectors read                              ``read_bytes_total`` (x 512)
 4     milliseconds reading                      ``read_time_seconds_total`` (/ 1000)
 5     writes completed                          ``writes_completed_total``
 7     sectors written                           ``written_bytes_total`` (x 512)
 8     milliseconds writing                      ``write_time_seconds_total``
 9     I/Os in flight (a gauge)                  ``io_now``
 10    milliseconds doing I/O (busy time)        ``io_time_seconds_total``
 11    weighted milliseconds doing I/O           ``io_time_weighted_seconds_total``
 12    discards completed (4.18+)                ``discards_completed_total``
 14    sectors discarded (4.18+)                 ``discarded_bytes_total`` (x 512)
 16    flush requests completed (5.5+)           ``flush_requests_total``
====  ========================================  ===================================

Lines have 14 fields before 4.18, 18 with the discard fields, 20 with the
flush fields (5.5+); a metric whose field a line lacks is omitted for that
device. A sector is always 512 bytes here, whatever the device's own sector
size. Lines with fewer than 14 fields (partitions on 2.6 kernels) are skipped.

Only whole block devices are exported, decided by sysfs: ``<sys>/block/<name>``
exists (``/`` in a name such as ``cciss/c0d0`` is ``!`` in sysfs); without
``<sys>/block``, a ``<sys>/class/block/<name>`` without a ``partition`` file.
``loop*``, ``ram*`` and ``zram*`` are always dropped; the configured
include/exclude filter applies after that. Device-mapper and md devices are
kept (they are whole devices), so do not sum ``dm-0`` with the disk below it.

Counters that wrap at 2**32 (32-bit kernels; the millisecond fields of older
64-bit kernels) are kept monotonic, see ``kernelfiles.CounterWrapTracker``.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from trainmon.config import DiskConfig
from trainmon.core.collector import Collector, CollectorUnavailable
from trainmon.node.kernelfiles import CounterWrapTracker, KernelFileReader

log = logging.getLogger(__name__)

#: Bytes per diskstats sector: fixed by the kernel, independent of the device.
SECTOR_BYTES = 512
#: Devices dropped before the configured filter: RAM disks, zram, loop devices.
BUILTIN_EXCLUDE = re.compile(r"^(loop|ram|zram)\d+$")
_MIN_FIELDS = 14


def _count(value: int) -> float:
    return value


def _sectors(value: int) -> float:
    return value * SECTOR_BYTES


def _milliseconds(value: int) -> float:
    return value / 1000


@dataclass(frozen=True)
class DiskCounter:
    """One exported counter: its 0-based index after the device name, unit conversion, HELP."""

    index: int
    convert: Callable[[int], float]
    help: str


COUNTERS: dict[str, DiskCounter] = {
    "reads_completed": DiskCounter(0, _count, "Reads completed successfully"),
    "writes_completed": DiskCounter(4, _count, "Writes completed successfully"),
    "read_bytes": DiskCounter(2, _sectors, "Bytes read (sectors read x 512)"),
    "written_bytes": DiskCounter(6, _sectors, "Bytes written (sectors written x 512)"),
    "read_time_seconds": DiskCounter(3, _milliseconds, "Seconds spent by all reads"),
    "write_time_seconds": DiskCounter(7, _milliseconds, "Seconds spent by all writes"),
    "io_time_seconds": DiskCounter(
        9, _milliseconds, "Seconds the device was busy with I/O (rate = utilization 0-1)"
    ),
    "io_time_weighted_seconds": DiskCounter(
        10, _milliseconds, "Seconds of I/O weighted by requests in flight (rate = avg queue size)"
    ),
    "discards_completed": DiskCounter(11, _count, "Discards completed successfully (4.18+)"),
    "discarded_bytes": DiskCounter(13, _sectors, "Bytes discarded (sectors x 512, 4.18+)"),
    "flush_requests": DiskCounter(15, _count, "Flush requests completed successfully (5.5+)"),
}
_IN_FLIGHT_INDEX = 8


def parse_diskstats(text: str) -> dict[str, list[int]]:
    """``/proc/diskstats`` → ``{name: [field 1, field 2, ...]}`` for lines of 14+ fields."""
    devices: dict[str, list[int]] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < _MIN_FIELDS:
            continue
        try:
            devices[fields[2]] = [int(field) for field in fields[3:]]
        except ValueError:
            log.debug("skipping malformed /proc/diskstats line: %r", line)
    return devices


class DiskCollector(Collector):
    """I/O counters of whole block devices."""

    name = "disk"

    def __init__(self, config: DiskConfig, proc_root: Path, sys_root: Path) -> None:
        self._devices = config.devices
        self._diskstats = proc_root / "diskstats"
        self._sys_block = sys_root / "block"
        self._sys_class_block = sys_root / "class" / "block"
        self._wrap: CounterWrapTracker[tuple[str, str]] = CounterWrapTracker()
        self._lock = threading.Lock()

    def collect(self) -> Iterable[Metric]:
        """Read ``/proc/diskstats`` and the sysfs block tree now; build fresh families."""
        with self._lock:
            devices = self._read_whole_disks()
            values = self._wrap.extend(
                {
                    (counter, device): fields[spec.index]
                    for device, fields in devices.items()
                    for counter, spec in COUNTERS.items()
                    if spec.index < len(fields)
                }
            )
        families = {
            counter: CounterMetricFamily(
                f"trainmon_disk_{counter}",
                f"{spec.help} on the whole block device, cumulative "
                f"(/proc/diskstats field {spec.index + 1}).",
                labels=["device"],
            )
            for counter, spec in COUNTERS.items()
        }
        in_flight = GaugeMetricFamily(
            "trainmon_disk_io_now",
            "I/O requests in flight on the whole block device (/proc/diskstats field 9).",
            labels=["device"],
        )
        for (counter, device), value in values.items():
            families[counter].add_metric([device], COUNTERS[counter].convert(value))
        for device, fields in devices.items():
            in_flight.add_metric([device], fields[_IN_FLIGHT_INDEX])
        return [family for family in [*families.values(), in_flight] if family.samples]

    def _read_whole_disks(self) -> dict[str, list[int]]:
        text = KernelFileReader.required_text(self._diskstats)
        is_whole_disk = self._whole_disk_test()
        return {
            device: fields
            for device, fields in sorted(parse_diskstats(text).items())
            if not BUILTIN_EXCLUDE.search(device)
            and is_whole_disk(device)
            and self._devices.accepts(device)
        }

    def _whole_disk_test(self) -> Callable[[str], bool]:
        """How to tell a whole disk from a partition with the sysfs at hand."""
        if self._sys_block.is_dir():
            return lambda device: (self._sys_block / _sysfs_name(device)).exists()
        if self._sys_class_block.is_dir():
            return lambda device: _not_a_partition(self._sys_class_block / _sysfs_name(device))
        raise CollectorUnavailable(
            f"neither {self._sys_block} nor {self._sys_class_block} exists: "
            "cannot tell whole disks from partitions"
        )


def _sysfs_name(device: str) -> str:
    return device.replace("/", "!")


def _not_a_partition(entry: Path) -> bool:
    return entry.exists() and not (entry / "partition").exists()

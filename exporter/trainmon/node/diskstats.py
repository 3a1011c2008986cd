"""Block device I/O counters from ``/proc/diskstats``, whole disks only.

Source: ``<proc>/diskstats`` (roots injected, ``/host/proc`` in a container),
one line per block device: ``major minor name`` and then, cumulative since
boot or since the device appeared,

====  ========================================  ===================================
 #     field (Documentation/admin-guide/         ``DISKSTATS_FIELDS`` counter
       iostats.rst)
====  ========================================  ===================================
 1     reads completed                           ``reads_completed``
 3     sectors read                              ``read_bytes`` (x 512)
 4     milliseconds reading                      ``read_time_seconds`` (/ 1000)
 5     writes completed                          ``writes_completed``
 7     sectors written                           ``written_bytes`` (x 512)
 8     milliseconds writing                      ``write_time_seconds``
 9     I/Os in flight (a gauge)                  ``DiskReading.io_in_flight``
 10    milliseconds doing I/O (busy time)        ``io_time_seconds``
 11    weighted milliseconds doing I/O           ``io_time_weighted_seconds``
 12    discards completed (4.18+)                ``discards_completed``
 14    sectors discarded (4.18+)                 ``discarded_bytes`` (x 512)
 16    flush requests completed (5.5+)           ``flush_requests``
====  ========================================  ===================================

Lines have 14 fields before 4.18, 18 with the discard fields, 20 with the
flush fields (5.5+); a counter whose field a line lacks is absent for that
device. A sector is always 512 bytes here, whatever the device's own sector
size. Lines with fewer than 14 fields (partitions on 2.6 kernels) are skipped.

Only whole block devices are read, decided by sysfs: ``<sys>/block/<name>``
exists (``/`` in a name such as ``cciss/c0d0`` is ``!`` in sysfs); without
``<sys>/block``, a ``<sys>/class/block/<name>`` without a ``partition`` file.
``loop*``, ``ram*`` and ``zram*`` are always dropped; the configured
include/exclude filter applies after that. Device-mapper and md devices are
kept (they are whole devices), so do not sum ``dm-0`` with the disk below it.

Counters that wrap at 2**32 (32-bit kernels; the millisecond fields of older
64-bit kernels) are kept monotonic, see ``kernelfiles.CounterWrapTracker``.
The exported metrics are made in ``trainmon.collectors.disk``.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from trainmon.core.collector import CollectorUnavailable
from trainmon.node.kernelfiles import (
    CounterWrapTracker,
    DeviceFilter,
    KernelFileReader,
    any_device,
)

log = logging.getLogger(__name__)

#: Bytes per diskstats sector: fixed by the kernel, independent of the device.
SECTOR_BYTES = 512
#: Devices dropped before the configured filter: RAM disks, zram, loop devices.
BUILTIN_EXCLUDE = re.compile(r"^(loop|ram|zram)\d+$")
_MIN_FIELDS = 14
_IN_FLIGHT_INDEX = 8


def _count(value: int) -> float:
    return value


def _sectors(value: int) -> float:
    return value * SECTOR_BYTES


def _milliseconds(value: int) -> float:
    return value / 1000


@dataclass(frozen=True)
class DiskstatsField:
    """Where a counter is in a diskstats line, and how its raw value becomes a base unit."""

    #: 0-based index after the device name (the iostats.rst field number - 1).
    index: int
    convert: Callable[[int], float]

    @property
    def number(self) -> int:
        """The field number of Documentation/admin-guide/iostats.rst."""
        return self.index + 1


#: Counter → its field; values in counts, bytes or seconds.
DISKSTATS_FIELDS: dict[str, DiskstatsField] = {
    "reads_completed": DiskstatsField(0, _count),
    "writes_completed": DiskstatsField(4, _count),
    "read_bytes": DiskstatsField(2, _sectors),
    "written_bytes": DiskstatsField(6, _sectors),
    "read_time_seconds": DiskstatsField(3, _milliseconds),
    "write_time_seconds": DiskstatsField(7, _milliseconds),
    "io_time_seconds": DiskstatsField(9, _milliseconds),
    "io_time_weighted_seconds": DiskstatsField(10, _milliseconds),
    "discards_completed": DiskstatsField(11, _count),
    "discarded_bytes": DiskstatsField(13, _sectors),
    "flush_requests": DiskstatsField(15, _count),
}


@dataclass(frozen=True)
class DiskReading:
    """One whole block device at one read."""

    device: str
    #: ``DISKSTATS_FIELDS`` counter → value in its base unit, cumulative and
    #: monotonic across 32-bit wraps; absent when the line lacks the field.
    counters: Mapping[str, float]
    #: I/O requests in flight now (field 9).
    io_in_flight: int


def parse_diskstats(
    text: str, keep: Callable[[str], bool] | None = None
) -> dict[str, list[int]]:
    """``/proc/diskstats`` → ``{name: [field 1, field 2, ...]}`` for lines of 14+ fields
    (with ``keep``: of the devices it keeps; the others' fields are not even converted)."""
    devices: dict[str, list[int]] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < _MIN_FIELDS or (keep is not None and not keep(fields[2])):
            continue
        try:
            devices[fields[2]] = [int(field) for field in fields[3:]]
        except ValueError:
            log.debug("skipping malformed /proc/diskstats line: %r", line)
    return devices


class DiskstatsReader:
    """Reads the whole block devices of ``<proc>/diskstats``, told apart by ``<sys>``.

    ``accepts`` filters devices by name (the configured include/exclude); it
    applies after ``BUILTIN_EXCLUDE``. Thread-safe: reads are serialised so the
    wrap tracker sees them in order.
    """

    def __init__(self, proc_root: Path, sys_root: Path, accepts: DeviceFilter = any_device) -> None:
        self._diskstats = proc_root / "diskstats"
        self._sys_block = sys_root / "block"
        self._sys_class_block = sys_root / "class" / "block"
        self._accepts = accepts
        self._wrap: CounterWrapTracker[tuple[str, str]] = CounterWrapTracker()
        self._lock = threading.Lock()

    def read(self) -> list[DiskReading]:
        """Every accepted whole disk, sorted by name.

        Raises ``CollectorUnavailable`` when ``<proc>/diskstats`` does not exist
        or the sysfs cannot tell whole disks from partitions.
        """
        with self._lock:
            devices = self._read_whole_disks()
            values = self._wrap.extend(
                {
                    (counter, device): fields[spec.index]
                    for device, fields in devices.items()
                    for counter, spec in DISKSTATS_FIELDS.items()
                    if spec.index < len(fields)
                }
            )
        return [
            DiskReading(
                device=device,
                counters={
                    counter: spec.convert(values[(counter, device)])
                    for counter, spec in DISKSTATS_FIELDS.items()
                    if (counter, device) in values
                },
                io_in_flight=fields[_IN_FLIGHT_INDEX],
            )
            for device, fields in devices.items()
        ]

    def _read_whole_disks(self) -> dict[str, list[int]]:
        text = KernelFileReader.required_text(self._diskstats)
        is_whole_disk = self._whole_disk_test()

        def keep(device: str) -> bool:
            return (not BUILTIN_EXCLUDE.search(device) and is_whole_disk(device)
                    and self._accepts(device))

        return dict(sorted(parse_diskstats(text, keep).items()))

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

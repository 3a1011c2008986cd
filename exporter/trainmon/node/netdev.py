"""Network interface counters from ``/proc/net/dev`` and link speed from sysfs.

Sources (roots injected, ``/host/proc`` and ``/host/sys`` in a container):

- ``<proc>/net/dev`` — cumulative per-interface counters since the interface
  was created: bytes, packets, errors and drops, for receive and transmit. The
  columns are located by the file's own header, so the older layouts work too
  (``eth0:123`` with no space after the colon, kernels whose header lacks a
  column — that counter is then absent). Interface names are taken verbatim
  up to the first ``:``, which the kernel forbids inside a name (so
  ``bond0.100`` and other names with dots work).
- ``<sys>/class/net/<device>/speed`` — link speed in Mbit/s. Unknown (``None``)
  when the file is missing, unreadable (``EINVAL`` on virtual and down links),
  not positive (``-1`` = unknown) or ``4294967295`` (unknown, as 3.x kernels
  printed it).

Both files belong to the network namespace of the process that reads (or
mounted) them: run the daemon in the host network namespace
(``hostNetwork: true``) to see the host's interfaces.

Counters that wrap at 2**32 (drivers with 32-bit statistics) are kept
monotonic, see ``kernelfiles.CounterWrapTracker``. The exported metrics are
made in ``trainmon.collectors.network``.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from trainmon.node.kernelfiles import (
    CounterWrapTracker,
    DeviceFilter,
    KernelFileReader,
    any_device,
)

log = logging.getLogger(__name__)

#: Counter → its ``/proc/net/dev`` (section, column header).
NET_DEV_COLUMNS: dict[str, tuple[str, str]] = {
    "receive_bytes": ("receive", "bytes"),
    "transmit_bytes": ("transmit", "bytes"),
    "receive_packets": ("receive", "packets"),
    "transmit_packets": ("transmit", "packets"),
    "receive_errors": ("receive", "errs"),
    "transmit_errors": ("transmit", "errs"),
    "receive_drops": ("receive", "drop"),
    "transmit_drops": ("transmit", "drop"),
}

#: The header of every kernel since 2.6 (bytes first, 8 columns per direction).
_STANDARD_RECEIVE = ("bytes", "packets", "errs", "drop", "fifo", "frame", "compressed", "multicast")
_STANDARD_TRANSMIT = ("bytes", "packets", "errs", "drop", "fifo", "colls", "carrier", "compressed")
_UNKNOWN_SPEED = 4294967295
_BYTES_PER_MBIT = 125_000


@dataclass(frozen=True)
class InterfaceReading:
    """One network interface at one read."""

    device: str
    #: ``NET_DEV_COLUMNS`` counter → value, cumulative since the interface was
    #: created and monotonic across 32-bit wraps (bytes, packets, errors, drops);
    #: a counter whose column the header lacks is absent.
    counters: Mapping[str, int]
    #: Link speed in bytes per second (sysfs Mbit/s x 125000); ``None`` when unknown.
    speed_bytes: int | None


def parse_net_dev(text: str) -> dict[str, dict[str, int]]:
    """``/proc/net/dev`` → ``{device: {NET_DEV_COLUMNS counter: raw value}}``.

    Counters whose column the header lacks are absent; a malformed row is
    skipped (logged at debug).
    """
    positions = _column_positions(_STANDARD_RECEIVE, _STANDARD_TRANSMIT)
    devices: dict[str, dict[str, int]] = {}
    for line in text.splitlines():
        name, colon, rest = line.partition(":")
        if not colon:
            if line.count("|") == 2:  # " face |bytes packets ...|bytes packets ..."
                _, receive, transmit = line.split("|")
                positions = _column_positions(tuple(receive.split()), tuple(transmit.split()))
            continue
        fields = rest.split()
        try:
            devices[name.strip()] = {
                counter: int(fields[index]) for counter, index in positions.items()
            }
        except (IndexError, ValueError):
            log.debug("skipping malformed /proc/net/dev row: %r", line)
    return devices


@functools.lru_cache(maxsize=8)  # the standard header, and what a kernel's own header gives
def _column_positions(receive: tuple[str, ...], transmit: tuple[str, ...]) -> dict[str, int]:
    columns = {("receive", name): index for index, name in enumerate(receive)}
    columns.update({("transmit", name): len(receive) + i for i, name in enumerate(transmit)})
    return {
        counter: columns[column]
        for counter, column in NET_DEV_COLUMNS.items()
        if column in columns
    }


class NetDevReader:
    """Reads the interfaces of ``<proc>/net/dev`` and their ``<sys>/class/net`` speed.

    ``accepts`` filters interfaces by name (the configured include/exclude).
    Thread-safe: reads are serialised so the wrap tracker sees them in order.
    """

    def __init__(self, proc_root: Path, sys_root: Path, accepts: DeviceFilter = any_device) -> None:
        self._net_dev = proc_root / "net" / "dev"
        self._class_net = sys_root / "class" / "net"
        self._accepts = accepts
        self._files = KernelFileReader(log)
        self._wrap: CounterWrapTracker[tuple[str, str]] = CounterWrapTracker()
        # <sys>/class/net/<device>/speed of the interfaces of the latest read.
        self._speed_files: dict[str, Path] = {}
        self._lock = threading.Lock()

    def read(self) -> list[InterfaceReading]:
        """Every accepted interface, sorted by name.

        Raises ``CollectorUnavailable`` when ``<proc>/net/dev`` does not exist.
        """
        with self._lock:
            text = self._files.required_text(self._net_dev)
            devices = {
                device: counters
                for device, counters in sorted(parse_net_dev(text).items())
                if self._accepts(device)
            }
            values = self._wrap.extend(
                {
                    (counter, device): value
                    for device, counters in devices.items()
                    for counter, value in counters.items()
                }
            )
            known = self._speed_files
            self._speed_files = {
                device: known.get(device) or self._class_net / device / "speed"
                for device in devices
            }
            speed_files = self._speed_files
        return [
            InterfaceReading(
                device=device,
                counters={counter: values[(counter, device)] for counter in counters},
                speed_bytes=self._speed_bytes(speed_files[device]),
            )
            for device, counters in devices.items()
        ]

    def _speed_bytes(self, speed_file: Path) -> int | None:
        mbits = self._files.integer(speed_file)
        if mbits is None or mbits <= 0 or mbits == _UNKNOWN_SPEED:
            return None
        return mbits * _BYTES_PER_MBIT

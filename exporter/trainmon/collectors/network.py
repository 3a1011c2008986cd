"""Network interface counters from ``/proc/net/dev`` and link speed from sysfs.

Sources (roots injected, ``/host/proc`` and ``/host/sys`` in a container):

- ``<proc>/net/dev`` — cumulative per-interface counters since the interface
  was created: bytes, packets, errors and drops, for receive and transmit. The
  columns are located by the file's own header, so the older layouts work too
  (``eth0:123`` with no space after the colon, kernels whose header lacks a
  column — that metric is then omitted). Interface names are taken verbatim
  up to the first ``:``, which the kernel forbids inside a name (so
  ``bond0.100`` and other names with dots work).
- ``<sys>/class/net/<device>/speed`` — link speed in Mbit/s. Omitted when
  the file is missing, unreadable (``EINVAL`` on virtual and down links), not
  positive (``-1`` = unknown) or ``4294967295`` (unknown, as 3.x kernels
  printed it).

Both files belong to the network namespace of the process that reads (or
mounted) them: run the daemon in the host network namespace
(``hostNetwork: true``) to see the host's interfaces.

Counters that wrap at 2**32 (drivers with 32-bit statistics) are kept
monotonic, see ``kernelfiles.CounterWrapTracker``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from trainmon.config import NetworkConfig
from trainmon.core.collector import Collector
from trainmon.node.kernelfiles import CounterWrapTracker, KernelFileReader

log = logging.getLogger(__name__)

#: Exported counter → (``/proc/net/dev`` section, column, HELP text).
COUNTERS: dict[str, tuple[str, str, str]] = {
    "receive_bytes": ("receive", "bytes", "Bytes received on the interface"),
    "transmit_bytes": ("transmit", "bytes", "Bytes transmitted on the interface"),
    "receive_packets": ("receive", "packets", "Packets received on the interface"),
    "transmit_packets": ("transmit", "packets", "Packets transmitted on the interface"),
    "receive_errors": ("receive", "errs", "Receive errors (bad packets) on the interface"),
    "transmit_errors": ("transmit", "errs", "Transmit errors on the interface"),
    "receive_drops": ("receive", "drop", "Received packets dropped by the interface"),
    "transmit_drops": ("transmit", "drop", "Packets dropped on transmit by the interface"),
}

#: The header of every kernel since 2.6 (bytes first, 8 columns per direction).
_STANDARD_RECEIVE = ("bytes", "packets", "errs", "drop", "fifo", "frame", "compressed", "multicast")
_STANDARD_TRANSMIT = ("bytes", "packets", "errs", "drop", "fifo", "colls", "carrier", "compressed")
_UNKNOWN_SPEED = 4294967295
_BYTES_PER_MBIT = 125_000


def parse_net_dev(text: str) -> dict[str, dict[str, int]]:
    """``/proc/net/dev`` → ``{device: {exported counter: value}}``.

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


def _column_positions(receive: tuple[str, ...], transmit: tuple[str, ...]) -> dict[str, int]:
    columns = {("receive", name): index for index, name in enumerate(receive)}
    columns.update({("transmit", name): len(receive) + i for i, name in enumerate(transmit)})
    return {
        counter: columns[(section, column)]
        for counter, (section, column, _) in COUNTERS.items()
        if (section, column) in columns
    }


class NetworkCollector(Collector):
    """Per-interface traffic counters and link speed."""

    name = "network"

    def __init__(self, config: NetworkConfig, proc_root: Path, sys_root: Path) -> None:
        self._devices = config.devices
        self._net_dev = proc_root / "net" / "dev"
        self._class_net = sys_root / "class" / "net"
        self._files = KernelFileReader(log)
        self._wrap: CounterWrapTracker[tuple[str, str]] = CounterWrapTracker()
        self._lock = threading.Lock()

    def collect(self) -> Iterable[Metric]:
        """Read ``/proc/net/dev`` and the speed files now; build fresh families."""
        with self._lock:
            devices = self._read_counters()
            values = self._wrap.extend(
                {
                    (counter, device): value
                    for device, counters in devices.items()
                    for counter, value in counters.items()
                }
            )
        families = {
            counter: CounterMetricFamily(
                f"trainmon_network_{counter}",
                f"{help_text}, cumulative since it appeared "
                f"(/proc/net/dev, {section} column {column}).",
                labels=["device"],
            )
            for counter, (section, column, help_text) in COUNTERS.items()
        }
        speed = GaugeMetricFamily(
            "trainmon_network_speed_bytes",
            "Link speed of the network interface in bytes per second "
            "(/sys/class/net/<device>/speed Mbit/s x 125000); absent when unknown.",
            labels=["device"],
        )
        for (counter, device), value in values.items():
            families[counter].add_metric([device], value)
        for device in devices:
            link_speed = self._speed_bytes(device)
            if link_speed is not None:
                speed.add_metric([device], link_speed)
        return [family for family in [*families.values(), speed] if family.samples]

    def _read_counters(self) -> Mapping[str, dict[str, int]]:
        text = self._files.required_text(self._net_dev)
        return {
            device: counters
            for device, counters in sorted(parse_net_dev(text).items())
            if self._devices.accepts(device)
        }

    def _speed_bytes(self, device: str) -> int | None:
        mbits = self._files.integer(self._class_net / device / "speed")
        if mbits is None or mbits <= 0 or mbits == _UNKNOWN_SPEED:
            return None
        return mbits * _BYTES_PER_MBIT

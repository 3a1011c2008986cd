"""InfiniBand and RoCE port counters from ``/sys/class/infiniband``.

For every ``<sys>/class/infiniband/<device>/ports/<port>/`` (``mlx5_0`` port
``1``; RoCE NICs appear here too, with ``link_layer`` ``Ethernet``):

- ``counters/port_rcv_data`` and ``port_xmit_data`` count **4-byte words**
  (the value is multiplied by 4). The 64-bit ``counters_ext/port_rcv_data_64``
  and ``port_xmit_data_64`` are preferred when present. Older drivers give
  only the legacy PortCounters, which are 32 bits wide and *saturate* at
  4294967295 (= 17179869180 bytes) instead of wrapping — at 100 Gb/s that
  takes under 2 s, after which the exported counter stops moving until the
  counters are reset (``perfquery -R``). Current mlx5 kernels serve 64-bit
  values in ``counters/`` already. Saturating counters are therefore read
  raw, never wrap-corrected.
- ``counters/port_rcv_packets`` and ``port_xmit_packets`` (or their ``_64``
  twins in ``counters_ext``) count packets.
- the error counters in ``ERROR_COUNTERS``, read under short stable names
  (several are 8 or 16 bits wide and saturate too).
- ``rate`` (``"100 Gb/sec (4X EDR)"``) → bytes per second;
  ``state`` (``"4: ACTIVE"``) → port active or not;
  ``link_layer`` (``InfiniBand`` / ``Ethernet``).

A host without ``/sys/class/infiniband`` is normal: no ports, no error, no
log line. A single unreadable file (``EINVAL`` from some drivers, permission
denied) leaves that reading out only and is logged at debug level once.
The exported metrics are made in ``trainmon.collectors.infiniband``;
``trainmon.diagnosis.nccl`` reads the port states too.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from trainmon.node.kernelfiles import KernelFileReader

log = logging.getLogger(__name__)

#: ``counters/<file>`` → its short stable name (the ``counter`` label of
#: ``trainmon_infiniband_errors_total``).
ERROR_COUNTERS: dict[str, str] = {
    "symbol_error": "symbol",
    "link_downed": "link_downed",
    "link_error_recovery": "link_error_recovery",
    "port_rcv_errors": "rcv_errors",
    "port_rcv_remote_physical_errors": "rcv_remote_physical",
    "port_rcv_switch_relay_errors": "rcv_switch_relay",
    "port_rcv_constraint_errors": "rcv_constraint",
    "port_xmit_discards": "xmit_discards",
    "port_xmit_constraint_errors": "xmit_constraint",
    "local_link_integrity_errors": "local_link_integrity",
    "excessive_buffer_overrun_errors": "excessive_buffer_overrun",
    "VL15_dropped": "vl15_dropped",
}


@dataclass(frozen=True)
class TrafficFiles:
    """Where a traffic counter is read, and the unit of its raw value."""

    #: The legacy ``counters/`` file (32 bits wide on old drivers, saturating).
    legacy: str
    #: The 64-bit ``counters_ext/`` file, preferred when present.
    extended: str
    #: Raw value x multiplier = bytes or packets (data counters count 4-byte words).
    multiplier: int


#: Traffic counter → its files; values in bytes or packets.
TRAFFIC_COUNTERS: dict[str, TrafficFiles] = {
    "receive_bytes": TrafficFiles("port_rcv_data", "port_rcv_data_64", 4),
    "transmit_bytes": TrafficFiles("port_xmit_data", "port_xmit_data_64", 4),
    "receive_packets": TrafficFiles("port_rcv_packets", "port_rcv_packets_64", 1),
    "transmit_packets": TrafficFiles("port_xmit_packets", "port_xmit_packets_64", 1),
}

_RATE = re.compile(r"(\d+(?:\.\d+)?)\s*Gb/sec")
_ACTIVE = "ACTIVE"  # IB_PORT_ACTIVE, "4: ACTIVE" in sysfs


@dataclass(frozen=True)
class PortReading:
    """One port of an InfiniBand or RoCE HCA at one read; a field the port's
    files do not give is absent (``None``, or left out of a mapping)."""

    device: str
    port: str
    #: ``TRAFFIC_COUNTERS`` counter → bytes or packets, cumulative (raw, may saturate).
    traffic: Mapping[str, int]
    #: ``ERROR_COUNTERS`` short name → errors, cumulative (raw, may saturate).
    errors: Mapping[str, int]
    #: Port data rate in bytes per second (``rate`` Gb/sec x 1e9 / 8).
    rate_bytes: float | None
    #: True when ``state`` is ACTIVE.
    active: bool | None
    #: ``InfiniBand`` or ``Ethernet`` (RoCE); ``None`` when missing or empty.
    link_layer: str | None


def infiniband_ports(sys_root: Path) -> Iterator[tuple[str, str, Path]]:
    """``(device, port, port directory)`` of every port under ``<sys>/class/infiniband``:
    devices by name, ports by number; nothing where the class is absent."""
    try:
        devices = sorted((sys_root / "class" / "infiniband").iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return
    for device in devices:
        try:
            ports = sorted((device / "ports").iterdir(), key=_port_order)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for port in ports:
            yield device.name, port.name, port


def _port_order(path: Path) -> tuple[int, str]:
    return (int(path.name), "") if path.name.isdigit() else (1 << 31, path.name)


def port_active(state: str) -> bool:
    """True for the ACTIVE port state (``ports/<port>/state``, e.g. ``"4: ACTIVE"``)."""
    return state.split(":")[-1].strip() == _ACTIVE


def parse_rate(text: str) -> float | None:
    """``"100 Gb/sec (4X EDR)"`` → 12.5e9 bytes per second; ``None`` if unparsable."""
    match = _RATE.match(text)
    return float(match.group(1)) * 1e9 / 8 if match else None


class InfinibandReader:
    """Reads every port under ``<sys>/class/infiniband``."""

    def __init__(self, sys_root: Path) -> None:
        #: ``<sys>/class/infiniband``, for messages.
        self.directory = sys_root / "class" / "infiniband"
        self._sys_root = sys_root
        self._files = KernelFileReader(log)

    def read(self) -> list[PortReading]:
        """Every port, devices by name and ports by number; empty without InfiniBand."""
        return [
            self._read_port(device, port, directory)
            for device, port, directory in infiniband_ports(self._sys_root)
        ]

    def _read_port(self, device: str, port: str, directory: Path) -> PortReading:
        traffic = self._traffic(directory)
        errors: dict[str, int] = {}
        for file_name, counter in ERROR_COUNTERS.items():
            count = self._files.integer(directory / "counters" / file_name)
            if count is not None:
                errors[counter] = count
        rate = self._files.text(directory / "rate")
        state = self._files.text(directory / "state")
        return PortReading(
            device=device,
            port=port,
            traffic=traffic,
            errors=errors,
            rate_bytes=parse_rate(rate) if rate is not None else None,
            active=port_active(state) if state is not None else None,
            link_layer=self._files.text(directory / "link_layer") or None,
        )

    def _traffic(self, port: Path) -> dict[str, int]:
        values: dict[str, int] = {}
        for counter, files in TRAFFIC_COUNTERS.items():
            value = self._files.integer(port / "counters_ext" / files.extended)
            if value is None:
                value = self._files.integer(port / "counters" / files.legacy)
            if value is not None:
                values[counter] = value * files.multiplier
        return values

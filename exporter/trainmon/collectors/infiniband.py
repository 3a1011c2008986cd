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
  values in ``counters/`` already. Saturating counters are therefore exported
  raw, never wrap-corrected.
- ``counters/port_rcv_packets`` and ``port_xmit_packets`` (or their ``_64``
  twins in ``counters_ext``) count packets.
- the error counters in ``ERROR_COUNTERS``, exported under short stable names
  in the ``counter`` label (several are 8 or 16 bits wide and saturate too).
- ``rate`` (``"100 Gb/sec (4X EDR)"``) → bytes per second;
  ``state`` (``"4: ACTIVE"``) → port up 1, any other state 0;
  ``link_layer`` (``InfiniBand`` / ``Ethernet``) → the ``_port_info`` metric.

A host without ``/sys/class/infiniband`` is normal: no samples, no error, no
log line. A single unreadable file (``EINVAL`` from some drivers, permission
denied) omits that sample only and is logged at debug level once.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from trainmon.core.collector import Collector, CollectorUnavailable
from trainmon.node.kernelfiles import KernelFileReader

log = logging.getLogger(__name__)

#: ``counters/<file>`` → value of the ``counter`` label of ``trainmon_infiniband_errors_total``.
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

#: Exported counter → (legacy ``counters/`` file, ``counters_ext/`` file, multiplier, HELP).
TRAFFIC_COUNTERS: dict[str, tuple[str, str, int, str]] = {
    "receive_bytes": (
        "port_rcv_data",
        "port_rcv_data_64",
        4,
        "Bytes received on the port (4-byte words x 4; counters_ext/port_rcv_data_64 when "
        "present, else counters/port_rcv_data, which saturates at 2^32-1 words on old drivers).",
    ),
    "transmit_bytes": (
        "port_xmit_data",
        "port_xmit_data_64",
        4,
        "Bytes transmitted on the port (4-byte words x 4; counters_ext/port_xmit_data_64 when "
        "present, else counters/port_xmit_data, which saturates at 2^32-1 words on old drivers).",
    ),
    "receive_packets": (
        "port_rcv_packets",
        "port_rcv_packets_64",
        1,
        "Packets received on the port (counters_ext/port_rcv_packets_64 when present, "
        "else counters/port_rcv_packets).",
    ),
    "transmit_packets": (
        "port_xmit_packets",
        "port_xmit_packets_64",
        1,
        "Packets transmitted on the port (counters_ext/port_xmit_packets_64 when present, "
        "else counters/port_xmit_packets).",
    ),
}

_RATE = re.compile(r"(\d+(?:\.\d+)?)\s*Gb/sec")
_ACTIVE = "ACTIVE"  # IB_PORT_ACTIVE, "4: ACTIVE" in sysfs


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


class InfinibandCollector(Collector):
    """Per-port traffic, error counters, rate and state of InfiniBand/RoCE HCAs."""

    name = "infiniband"

    def __init__(self, sys_root: Path, *, required: bool = False) -> None:
        """``required`` (``enabled: true`` rather than ``auto``): a host without
        InfiniBand/RoCE ports is reported as unavailable instead of as normal."""
        self._sys_root = sys_root
        self._required = required
        self._files = KernelFileReader(log)
        self._port_count = 0

    def collect(self) -> Iterable[Metric]:
        """Read every port's sysfs files now; build fresh families."""
        labels = ["device", "port"]
        traffic = {
            counter: CounterMetricFamily(f"trainmon_infiniband_{counter}", help_text, labels=labels)
            for counter, (_, _, _, help_text) in TRAFFIC_COUNTERS.items()
        }
        errors = CounterMetricFamily(
            "trainmon_infiniband_errors",
            "Port error counters from /sys/class/infiniband/<device>/ports/<port>/counters; "
            "counter is a short name of the file (symbol = symbol_error, rcv_errors = "
            "port_rcv_errors, ...). Many saturate at 2^8-1 or 2^16-1.",
            labels=[*labels, "counter"],
        )
        rate = GaugeMetricFamily(
            "trainmon_infiniband_rate_bytes",
            "Port data rate in bytes per second (ports/<port>/rate, Gb/sec x 1e9 / 8).",
            labels=labels,
        )
        up = GaugeMetricFamily(
            "trainmon_infiniband_port_up",
            '1 if the port state is ACTIVE (ports/<port>/state "4: ACTIVE"), else 0.',
            labels=labels,
        )
        info = GaugeMetricFamily(
            "trainmon_infiniband_port_info",
            "Always 1; link_layer is InfiniBand or Ethernet (RoCE), from ports/<port>/link_layer.",
            labels=[*labels, "link_layer"],
        )
        port_count = 0
        for device, port, directory in infiniband_ports(self._sys_root):
            port_count += 1
            for counter, value in self._traffic(directory).items():
                traffic[counter].add_metric([device, port], value)
            for file_name, counter_label in ERROR_COUNTERS.items():
                count = self._files.integer(directory / "counters" / file_name)
                if count is not None:
                    errors.add_metric([device, port, counter_label], count)
            rate_text = self._files.text(directory / "rate")
            rate_bytes = parse_rate(rate_text) if rate_text is not None else None
            if rate_bytes is not None:
                rate.add_metric([device, port], rate_bytes)
            state = self._files.text(directory / "state")
            if state is not None:
                up.add_metric([device, port], 1 if port_active(state) else 0)
            link_layer = self._files.text(directory / "link_layer")
            if link_layer:
                info.add_metric([device, port, link_layer], 1)
        self._port_count = port_count
        if self._required and port_count == 0:
            raise CollectorUnavailable(
                f"no InfiniBand/RoCE ports under {self._sys_root / 'class' / 'infiniband'}"
            )
        families: list[Metric] = [*traffic.values(), errors, rate, up, info]
        return [family for family in families if family.samples]

    def health(self) -> Mapping[str, object]:
        """How many ports the last collection found (0 on hosts without InfiniBand)."""
        return {"ports": self._port_count}

    def _traffic(self, port: Path) -> dict[str, int]:
        values: dict[str, int] = {}
        for counter, (legacy, extended, multiplier, _) in TRAFFIC_COUNTERS.items():
            value = self._files.integer(port / "counters_ext" / extended)
            if value is None:
                value = self._files.integer(port / "counters" / legacy)
            if value is not None:
                values[counter] = value * multiplier
        return values

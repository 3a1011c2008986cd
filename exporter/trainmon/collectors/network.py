"""Network collector: per-interface traffic counters and link speed.

Exports ``trainmon_network_{receive,transmit}_{bytes,packets,errors,drops}_total``
and ``trainmon_network_speed_bytes``, all labelled ``device``. The readings
(``/proc/net/dev`` and ``/sys/class/net/<device>/speed``, their kernel
formats, the network namespace they belong to, 32-bit wraps) come from
``trainmon.node.netdev``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from trainmon.core.collector import Collector
from trainmon.core.entry import CollectorEntry, Wiring
from trainmon.core.families import CounterMetricFamily, GaugeMetricFamily, Metric
from trainmon.node.netdev import NET_DEV_COLUMNS, NetDevReader
from trainmon.section import DeviceFilter, setting

#: Exported counter → (``NET_DEV_COLUMNS`` counter, start of the HELP text).
COUNTERS: dict[str, tuple[str, str]] = {
    "trainmon_network_receive_bytes_total": (
        "receive_bytes", "Bytes received on the interface"),
    "trainmon_network_transmit_bytes_total": (
        "transmit_bytes", "Bytes transmitted on the interface"),
    "trainmon_network_receive_packets_total": (
        "receive_packets", "Packets received on the interface"),
    "trainmon_network_transmit_packets_total": (
        "transmit_packets", "Packets transmitted on the interface"),
    "trainmon_network_receive_errors_total": (
        "receive_errors", "Receive errors (bad packets) on the interface"),
    "trainmon_network_transmit_errors_total": (
        "transmit_errors", "Transmit errors on the interface"),
    "trainmon_network_receive_drops_total": (
        "receive_drops", "Received packets dropped by the interface"),
    "trainmon_network_transmit_drops_total": (
        "transmit_drops", "Packets dropped on transmit by the interface"),
}  # fmt: skip


#: Interfaces left out by default: loopback and the host ends of container networks.
DEFAULT_NETWORK_EXCLUDE = r"^(lo|veth.*|docker.*|cali.*|flannel.*|cni.*)$"


@dataclass(frozen=True)
class NetworkConfig:
    """The ``collectors.network`` section."""

    enabled: bool = True
    #: ``include``/``exclude`` regexes over interface names.
    devices: DeviceFilter = field(
        default=DeviceFilter(exclude=re.compile(DEFAULT_NETWORK_EXCLUDE)),
        metadata=setting(inline=True),
    )


class NetworkCollector(Collector):
    """Per-interface traffic counters and link speed."""

    name = "network"

    def __init__(self, config: NetworkConfig, proc_root: Path, sys_root: Path) -> None:
        self._interfaces = NetDevReader(proc_root, sys_root, config.devices.accepts)

    def collect(self) -> Iterable[Metric]:
        """Read ``/proc/net/dev`` and the speed files now; build fresh families."""
        interfaces = self._interfaces.read()
        families = {
            name: CounterMetricFamily(name, _HELP[name], labels=["device"]) for name in COUNTERS
        }
        speed = GaugeMetricFamily(
            "trainmon_network_speed_bytes",
            "Link speed of the network interface in bytes per second "
            "(/sys/class/net/<device>/speed Mbit/s x 125000); absent when unknown.",
            labels=["device"],
        )
        for interface in interfaces:
            for name, (counter, _) in COUNTERS.items():
                value = interface.counters.get(counter)
                if value is not None:
                    families[name].add_metric([interface.device], value)
            if interface.speed_bytes is not None:
                speed.add_metric([interface.device], interface.speed_bytes)
        return [family for family in [*families.values(), speed] if family.samples]


def _counter_help(counter: str, start: str) -> str:
    section, column = NET_DEV_COLUMNS[counter]
    return f"{start}, cumulative since it appeared (/proc/net/dev, {section} column {column})."


#: Exported counter → its HELP text (made once, not on every scrape).
_HELP = {name: _counter_help(counter, start) for name, (counter, start) in COUNTERS.items()}


def _build(config: NetworkConfig, wiring: Wiring) -> Collector:
    return NetworkCollector(config, wiring.proc_root, wiring.sys_root)


ENTRY = CollectorEntry("network", NetworkConfig, _build)

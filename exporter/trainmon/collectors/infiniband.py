"""InfiniBand collector: per-port traffic, error counters, rate and state of HCAs.

Exports, labelled ``device`` and ``port`` (``mlx5_0``, ``1``; RoCE NICs too):
``trainmon_infiniband_{receive,transmit}_{bytes,packets}_total``,
``trainmon_infiniband_errors_total{counter}``, ``trainmon_infiniband_rate_bytes``,
``trainmon_infiniband_port_up`` and ``trainmon_infiniband_port_info{link_layer}``.
The readings (which sysfs files, 4-byte words, saturating legacy counters,
hosts without InfiniBand) come from ``trainmon.node.infiniband``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from trainmon.core.collector import Collector, CollectorUnavailable
from trainmon.core.entry import CollectorEntry, Wiring
from trainmon.core.families import CounterMetricFamily, GaugeMetricFamily, Metric
from trainmon.node.infiniband import InfinibandReader
from trainmon.section import Auto

#: Exported counter → (``node.infiniband.TRAFFIC_COUNTERS`` counter, HELP).
TRAFFIC_COUNTERS: dict[str, tuple[str, str]] = {
    "trainmon_infiniband_receive_bytes_total": (
        "receive_bytes",
        "Bytes received on the port (4-byte words x 4; counters_ext/port_rcv_data_64 when "
        "present, else counters/port_rcv_data, which saturates at 2^32-1 words on old drivers).",
    ),
    "trainmon_infiniband_transmit_bytes_total": (
        "transmit_bytes",
        "Bytes transmitted on the port (4-byte words x 4; counters_ext/port_xmit_data_64 when "
        "present, else counters/port_xmit_data, which saturates at 2^32-1 words on old drivers).",
    ),
    "trainmon_infiniband_receive_packets_total": (
        "receive_packets",
        "Packets received on the port (counters_ext/port_rcv_packets_64 when present, "
        "else counters/port_rcv_packets).",
    ),
    "trainmon_infiniband_transmit_packets_total": (
        "transmit_packets",
        "Packets transmitted on the port (counters_ext/port_xmit_packets_64 when present, "
        "else counters/port_xmit_packets).",
    ),
}


@dataclass(frozen=True)
class InfinibandConfig:
    """The ``collectors.infiniband`` section: ``auto`` is on where ports exist."""

    enabled: bool | Auto = "auto"


class InfinibandCollector(Collector):
    """Per-port traffic, error counters, rate and state of InfiniBand/RoCE HCAs."""

    name = "infiniband"

    def __init__(self, sys_root: Path, *, required: bool = False) -> None:
        """``required`` (``enabled: true`` rather than ``auto``): a host without
        InfiniBand/RoCE ports is reported as unavailable instead of as normal."""
        self._ports = InfinibandReader(sys_root)
        self._required = required
        self._port_count = 0

    def collect(self) -> Iterable[Metric]:
        """Read every port's sysfs files now; build fresh families."""
        labels = ["device", "port"]
        traffic = {
            name: CounterMetricFamily(name, help_text, labels=labels)
            for name, (_, help_text) in TRAFFIC_COUNTERS.items()
        }
        errors = CounterMetricFamily(
            "trainmon_infiniband_errors_total",
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
        ports = self._ports.read()
        for port in ports:
            port_labels = [port.device, port.port]
            for name, (counter, _) in TRAFFIC_COUNTERS.items():
                value = port.traffic.get(counter)
                if value is not None:
                    traffic[name].add_metric(port_labels, value)
            for counter, count in port.errors.items():
                errors.add_metric([*port_labels, counter], count)
            if port.rate_bytes is not None:
                rate.add_metric(port_labels, port.rate_bytes)
            if port.active is not None:
                up.add_metric(port_labels, 1 if port.active else 0)
            if port.link_layer is not None:
                info.add_metric([*port_labels, port.link_layer], 1)
        self._port_count = len(ports)
        if self._required and not ports:
            raise CollectorUnavailable(f"no InfiniBand/RoCE ports under {self._ports.directory}")
        families: list[Metric] = [*traffic.values(), errors, rate, up, info]
        return [family for family in families if family.samples]

    def health(self) -> Mapping[str, object]:
        """How many ports the last collection found (0 on hosts without InfiniBand)."""
        return {"ports": self._port_count}


def _build(config: InfinibandConfig, wiring: Wiring) -> Collector:
    return InfinibandCollector(wiring.sys_root, required=config.enabled is True)


ENTRY = CollectorEntry("infiniband", InfinibandConfig, _build)

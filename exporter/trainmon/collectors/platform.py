"""Platform collector: the node's identity, spot status and the metadata service's health.

Exports ``trainmon_node_info{provider,instance_id,instance_type,region,zone,
<configured labels>}`` = 1, ``trainmon_node_spot_instance``,
``trainmon_node_spot_termination_timestamp_seconds`` (only while a reclaim is
announced), and on Tencent nodes ``trainmon_platform_metadata_up`` and
``trainmon_platform_metadata_errors_total{reason}``. The label set of
``trainmon_node_info`` is fixed per node: values not known (yet) are empty
strings. Everything is read from ``trainmon.platform.poller``'s last
snapshot; a scrape never waits for the metadata service.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from trainmon import contract
from trainmon.core.collector import Collector
from trainmon.core.entry import CollectorEntry, Wiring
from trainmon.core.families import CounterMetricFamily, GaugeMetricFamily, Metric
from trainmon.platform.config import CONFIGURABLE_IDENTITY, IDENTITY_LABELS, PlatformConfig
from trainmon.platform.dmi import read_dmi
from trainmon.platform.poller import PlatformPoller, PlatformState
from trainmon.tencent.metadata import HTTPTransport, MetadataTransport, TencentMetadata


class PlatformCollector(Collector):
    """``trainmon_node_*`` and ``trainmon_platform_metadata_*`` from the platform poller."""

    name = "platform"

    def __init__(
        self,
        config: PlatformConfig,
        sys_root: Path,
        *,
        transport: MetadataTransport | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``transport``: the metadata service's HTTP layer (the demo's simulation);
        by default HTTP to ``config.metadata_url``."""
        self._config = config
        self._clock = clock
        self._monotonic = monotonic
        transport = transport or HTTPTransport(config.metadata_url, config.timeout_seconds)
        self.poller = PlatformPoller(
            config,
            TencentMetadata(transport, clock),
            lambda: read_dmi(sys_root),
            clock=clock,
            monotonic=monotonic,
        )

    def start(self) -> None:
        self.poller.start()

    def stop(self) -> None:
        self.poller.stop()

    def collect(self) -> Iterable[Metric]:
        state = self.poller.state()
        if state.provider is None:  # the first detection has not finished
            return []
        extra = self._config.extra_labels
        info = GaugeMetricFamily(
            "trainmon_node_info",
            "Always 1: the node's platform. provider is tencent or self-hosted; instance_id, "
            "instance_type, region and zone come from the CVM metadata service (Tencent) or "
            "from collectors.platform.labels (self-hosted), empty when unknown; the other "
            "labels (leaf, rack...) are configured.",
            labels=[*IDENTITY_LABELS, *extra],
        )
        configured = [self._config.labels[name] for name in extra]
        info.add_metric([*self._identity_values(state), *configured], 1)
        families: list[Metric] = [info]
        if state.spot is not None:
            families.append(GaugeMetricFamily(
                "trainmon_node_spot_instance",
                "1 if the node is a spot (preemptible) instance, 0 if not: billing mode "
                "SPOTPAID or an announced reclaim (Tencent), or collectors.platform.spot; "
                "absent while unknown.",
                value=1 if state.spot else 0,
            ))
        if state.termination_time is not None:
            notice = contract.SPOT_RECLAIM_NOTICE_SECONDS
            families.append(GaugeMetricFamily(
                "trainmon_node_spot_termination_timestamp_seconds",
                "Unix time at which the cloud reclaims this spot instance (Tencent "
                f"spot/termination-time, announced about {notice:.0f} s ahead); present only "
                "while a reclaim is scheduled.",
                value=state.termination_time,
            ))
        if state.provider == "tencent":
            if state.metadata_up is not None:
                families.append(GaugeMetricFamily(
                    "trainmon_platform_metadata_up",
                    "1 if the last poll of the CVM metadata service returned valid values, "
                    "else 0 (identity then not re-verified; see /healthz for the error).",
                    value=1 if state.metadata_up else 0,
                ))
            errors = CounterMetricFamily(
                "trainmon_platform_metadata_errors_total",
                "Failed polls of the CVM metadata service by reason: timeout, unreachable, "
                "http_status (unexpected HTTP status), invalid (a value that fails its pattern, "
                "an HTML page, garbage, an implausible termination time).",
                labels=["reason"],
            )
            for reason, count in state.errors.items():
                errors.add_metric([reason], count)
            families.append(errors)
        return families

    def _identity_values(self, state: PlatformState) -> list[str]:
        """provider, instance_id, instance_type, region, zone (``IDENTITY_LABELS`` order)."""
        identity = state.identity
        if state.provider == "tencent":
            if identity is None:
                return ["tencent", "", "", "", ""]
            return [
                "tencent", identity.instance_id, identity.instance_type or "",
                identity.region, identity.zone,
            ]
        configured = {k: v for k, v in self._config.labels.items() if k in CONFIGURABLE_IDENTITY}
        return [
            "self-hosted", "", configured.get("instance_type", ""),
            configured.get("region", ""), configured.get("zone", ""),
        ]

    def health(self) -> Mapping[str, object]:
        state = self.poller.state()
        identity = state.identity
        return {
            "provider": state.provider or "detecting",
            "provider_source": state.provider_source,
            "metadata_url": self._config.metadata_url if state.provider == "tencent" else None,
            "instance_id": identity.instance_id if identity is not None else None,
            "metadata_up": state.metadata_up,
            "last_success_age_seconds": (
                None if state.last_success is None
                else round(max(0.0, self._monotonic() - state.last_success), 1)
            ),
            "last_error": state.last_error,
            "spot": state.spot,
            "termination_time": state.termination_time,
        }


def _build(config: PlatformConfig, wiring: Wiring) -> Collector:
    """The metadata service over HTTP, or the demo's simulated spot instance."""
    transport = None
    if wiring.demo:
        from trainmon.demo.cvm import SimulatedMetadata

        transport = SimulatedMetadata()
    return PlatformCollector(config, wiring.sys_root, transport=transport)


ENTRY = CollectorEntry("platform", PlatformConfig, _build)

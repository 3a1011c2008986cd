"""Health collector: ``trainmon_health_status``, per subsystem its unhealthy devices.

A derived collector on the daemon's evaluation clock, after ``diagnosis``: the
registry shows it the families every collector before it produced in the same
evaluation (``Collector.observe``), ``trainmon.diagnosis.health`` judges them
(its reason table and the ``collectors.health`` thresholds), and every scrape
exports the statuses of the latest evaluation:

``trainmon_health_status{subsystem,device,reason,action}`` = 0 healthy
(``reason="ok"``, ``action="none"``), 1 degraded, 2 failed; the worst reason of
the (subsystem, device) wins. A subsystem whose every device is healthy is one
``ok`` series with ``device=""`` (``exported_statuses``). Its ``evaluation_seconds`` is
``window_seconds / 20`` (3 s by default), so it runs on the clock also where
the diagnosis is off.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from trainmon.core.collector import Collector
from trainmon.core.entry import CollectorEntry, Wiring
from trainmon.core.families import GaugeMetricFamily, Metric
from trainmon.diagnosis.health import (
    OK,
    SNAPSHOTS_PER_WINDOW,
    HealthConfig,
    HealthMonitor,
    HealthStatus,
)


class HealthCollector(Collector):
    """Sums the node's evidence up in one health gauge per (subsystem, device)."""

    name = "health"

    def __init__(
        self,
        config: HealthConfig,
        *,
        cpu_count: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """``cpu_count``: the host's CPUs, over which steal time is summed
        (default ``os.cpu_count()``)."""
        self._monitor = HealthMonitor(config, cpu_count or os.cpu_count() or 1)
        self._clock = clock
        self._wall_clock = wall_clock
        self.evaluation_seconds = config.window_seconds / SNAPSHOTS_PER_WINDOW
        self._statuses: list[HealthStatus] = []

    def observe(self, families: Sequence[Metric]) -> None:
        self._statuses = self._monitor.evaluate(families, self._clock(), self._wall_clock())

    def health(self) -> Mapping[str, object]:
        statuses = self._statuses
        return {"unhealthy": [f"{status.subsystem}/{status.device}: {status.reason}"
                              for status in statuses if status.severity > 0]}

    def collect(self) -> Iterable[Metric]:
        status = GaugeMetricFamily(
            "trainmon_health_status",
            "Health of one subsystem of the node (gpu, gpu_memory, pcie, nvlink, fabric, "
            "network, infiniband, cpu, instance) per device: 0 healthy (reason ok), "
            "1 degraded, 2 failed; the worst reason and its recommended action; one ok "
            "series (device \"\") for a subsystem whose devices are all healthy "
            "(docs/metrics.md, Node health).",
            labels=["subsystem", "device", "reason", "action"],
        )
        for found in exported_statuses(self._statuses):
            status.add_metric([found.subsystem, found.device, found.reason, found.action],
                              found.severity)
        return [status] if status.samples else []


def exported_statuses(statuses: Sequence[HealthStatus]) -> list[HealthStatus]:
    """What the gauge carries: per subsystem, its unhealthy devices; a subsystem whose
    every device is healthy is one ``ok`` series with ``device=""``. A healthy 8-GPU node
    then exports one series per subsystem instead of one per GPU and subsystem (the
    series budget, docs/deploy.md), and an unhealthy device is still named."""
    exported: list[HealthStatus] = []
    by_subsystem: dict[str, list[HealthStatus]] = {}
    for status in statuses:
        by_subsystem.setdefault(status.subsystem, []).append(status)
    for subsystem, members in by_subsystem.items():
        unhealthy = [status for status in members if status.severity > 0]
        exported.extend(unhealthy or [HealthStatus(subsystem, "", "ok", OK, "none")])
    return exported


def _build(config: HealthConfig, wiring: Wiring) -> Collector:
    return HealthCollector(config)


#: Derived, after the diagnosis: it reads every family collected before it, on the
#: registry's evaluation clock.
ENTRY = CollectorEntry("health", HealthConfig, _build, derived=True)

"""Collector isolation and the exporter's self-metrics.

``CollectorRegistry`` is what the HTTP server scrapes. It asks every collector
for its families in turn; a collector that raises loses only its own families
for that scrape. For each one it exports ``trainmon_collector_success`` and
``trainmon_collector_duration_seconds``, and it keeps the latest state of each
for ``/healthz``. It also exports ``trainmon_build_info``.

prometheus_client's own registry has no such isolation: one exception there
turns the whole scrape into an HTTP 500.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric

from trainmon import __version__
from trainmon.core.collector import Collector, CollectorUnavailable
from trainmon.logthrottle import LogThrottle

log = logging.getLogger(__name__)


@dataclass
class CollectorState:
    """What ``/healthz`` reports about one collector."""

    state: str = "pending"  # pending | ok | failed | unavailable
    error: str | None = None
    duration_seconds: float = 0.0
    last_success_timestamp: float | None = None


class CollectorRegistry:
    """Scrapes every collector in isolation; the object the server exposes."""

    def __init__(
        self,
        collectors: Sequence[Collector],
        *,
        mode: str = "real",
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        names = [collector.name for collector in collectors]
        duplicates = {name for name in names if names.count(name) > 1}
        if duplicates or "" in names:
            raise ValueError(f"collector names must be unique and non-empty: {names}")
        self._collectors = list(collectors)
        self._mode = mode
        self._clock = clock
        self._wall_clock = wall_clock
        self._states = {name: CollectorState() for name in names}
        # A failing collector logs its error once per 5 minutes, and at once when it changes.
        self._errors_logged = LogThrottle(clock=clock)
        # Scrapes are serialised: collectors keep per-scrape state (counter
        # wrap tracking) and two concurrent full reads of /proc buy nothing.
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start every collector's background work, then collect once so that
        ``/healthz`` tells the truth before the first scrape. A collector that
        fails to start is reported as such; the others go on."""
        started = []
        for collector in self._collectors:
            try:
                collector.start()
            except CollectorUnavailable as reason:
                self._record(collector.name, "unavailable", str(reason), 0.0)
            except Exception as error:  # isolate: one source never takes down another
                log.exception("collector %s failed to start", collector.name)
                self._record(collector.name, "failed", _describe(error), 0.0)
            else:
                started.append(collector)
        with self._lock:
            families: list[Metric] = []
            for collector in started:
                families.extend(self._collect_one(collector, families))

    def stop(self) -> None:
        for collector in reversed(self._collectors):
            try:
                collector.stop()
            except Exception:
                log.exception("collector %s failed to stop cleanly", collector.name)

    def collect(self) -> Iterator[Metric]:
        """All families of every collector, then the self-metrics."""
        with self._lock:
            families: list[Metric] = []
            success = GaugeMetricFamily(
                "trainmon_collector_success",
                "1 if the collector's last collection succeeded, 0 if it failed or its "
                "source is unavailable (see /healthz for the reason).",
                labels=["collector"],
            )
            available = GaugeMetricFamily(
                "trainmon_collector_available",
                "0 if the collector's data source is absent on this machine (no NVML, no "
                "InfiniBand ports under enabled: true...), else 1. Alert on failures with "
                "trainmon_collector_success == 0 and trainmon_collector_available == 1.",
                labels=["collector"],
            )
            duration = GaugeMetricFamily(
                "trainmon_collector_duration_seconds",
                "Wall time of the collector's last collection, in seconds.",
                labels=["collector"],
            )
            for collector in self._collectors:
                families.extend(self._collect_one(collector, families))
                state = self._states[collector.name]
                success.add_metric([collector.name], 1.0 if state.state == "ok" else 0.0)
                available.add_metric(
                    [collector.name], 0.0 if state.state == "unavailable" else 1.0
                )
                duration.add_metric([collector.name], state.duration_seconds)
            build_info = GaugeMetricFamily(
                "trainmon_build_info",
                "trainmon build; mode is 'demo' when the node is simulated, else 'real'.",
                labels=["version", "mode"],
            )
            build_info.add_metric([__version__, self._mode], 1.0)
            families.extend([success, available, duration, build_info])
        yield from families

    def health(self) -> dict[str, object]:
        """JSON-serialisable state of every collector, for ``/healthz``."""
        with self._lock:
            report: dict[str, object] = {}
            for collector in self._collectors:
                state = self._states[collector.name]
                entry: dict[str, object] = {
                    "state": state.state,
                    "duration_seconds": round(state.duration_seconds, 6),
                    "last_success_timestamp": state.last_success_timestamp,
                }
                if state.error is not None:
                    entry["error"] = state.error
                try:
                    entry.update(collector.health())
                except Exception as error:
                    entry["health_error"] = _describe(error)
                report[collector.name] = entry
            return {"mode": self._mode, "version": __version__, "collectors": report}

    def _collect_one(self, collector: Collector, earlier: Sequence[Metric]) -> list[Metric]:
        """``collector``'s families, after showing it the ``earlier`` ones of this scrape."""
        started = self._clock()
        try:
            collector.observe(earlier)
            families = list(collector.collect())
        except CollectorUnavailable as reason:
            self._record(collector.name, "unavailable", str(reason), self._clock() - started)
            return []
        except Exception as error:  # isolate: a failing collector never fails the scrape
            self._record(collector.name, "failed", _describe(error), self._clock() - started)
            return []
        self._record(collector.name, "ok", None, self._clock() - started)
        return families

    def _record(self, name: str, state: str, error: str | None, duration: float) -> None:
        entry = self._states[name]
        entry.state = state
        entry.error = error
        entry.duration_seconds = duration
        if state == "ok":
            entry.last_success_timestamp = self._wall_clock()
            if self._errors_logged.forget(name):
                log.info("collector %s recovered", name)
            return
        if self._errors_logged.allow(name, (state, error)):
            level = logging.INFO if state == "unavailable" else logging.ERROR
            log.log(level, "collector %s %s: %s", name, state, error)


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"

"""The registry's evaluation loop: derived collectors run on its clock, scrapes read them.

The derived collectors here count the evaluations that reached them; the
diagnosis itself on that clock is ``tests/diagnosis/test_live_verdicts.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric

from testkit.exposition import scrape
from testkit.sources import SteadySource
from trainmon.core.collector import Collector
from trainmon.core.registry import CollectorRegistry

#: Seconds to wait for an evaluation that the loop owes within milliseconds.
EVENT_TIMEOUT_SECONDS = 10.0


class Derived(Collector):
    """Counts its evaluations and the sources' families it was shown; exports the count."""

    def __init__(self, name: str, evaluation_seconds: float | None, *, signal_at: int = 0
                 ) -> None:
        self.name = name
        self.evaluation_seconds = evaluation_seconds
        self.evaluations = 0
        self.seen: list[list[str]] = []
        self.reached = threading.Event()
        self._signal_at = signal_at

    def observe(self, families: Sequence[Metric]) -> None:
        self.evaluations += 1
        self.seen.append([family.name for family in families])
        if self._signal_at and self.evaluations >= self._signal_at:
            self.reached.set()

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(f"{self.name}_evaluations", "Evaluations that reached it.")
        family.add_metric([], self.evaluations)
        return [family]


class BrokenDerived(Derived):
    def collect(self) -> Iterable[Metric]:
        raise RuntimeError("rules crashed")


def test_a_scrape_never_evaluates_it_reads_the_latest_evaluation() -> None:
    derived = Derived("derived", evaluation_seconds=3600.0)
    registry = CollectorRegistry([SteadySource(), derived])
    registry.start()  # evaluates once before it returns
    try:
        for _ in range(3):
            result = scrape(registry)
            assert result.value("derived_evaluations") == 1
            assert result.value("example_value", device="a") == 1
        assert derived.evaluations == 1
        registry.evaluate()
        assert scrape(registry).value("derived_evaluations") == 2
        assert derived.seen[-1] == ["example_value", "example_events"]
    finally:
        registry.stop()


def test_the_loop_evaluates_on_its_interval_with_no_scrape_and_stops_with_the_registry(
) -> None:
    derived = Derived("derived", evaluation_seconds=0.02, signal_at=4)
    after = Derived("after", evaluation_seconds=None)
    registry = CollectorRegistry([SteadySource(), derived, after])
    assert registry.evaluation_seconds == 0.02
    registry.start()
    try:
        assert derived.reached.wait(EVENT_TIMEOUT_SECONDS)
    finally:
        registry.stop()
    assert not [thread for thread in threading.enumerate() if thread.name == "evaluation"]
    # the collector after the first derived one is evaluated with it, in order,
    # and is shown the derived families of the same evaluation too
    assert after.evaluations == derived.evaluations
    assert after.seen[-1] == ["example_value", "example_events", "derived_evaluations"]


def test_a_failing_derived_collector_loses_only_its_own_families() -> None:
    broken = BrokenDerived("broken", evaluation_seconds=3600.0)
    after = Derived("after", evaluation_seconds=None)
    registry = CollectorRegistry([SteadySource(), broken, after])
    registry.start()
    try:
        result = scrape(registry)
        health = registry.health()["collectors"]
    finally:
        registry.stop()
    assert result.value("trainmon_collector_success", collector="broken") == 0
    assert result.value("trainmon_collector_success", collector="after") == 1
    assert result.value("trainmon_collector_success", collector="steady") == 1
    assert result.value("after_evaluations") == 1
    assert "broken_evaluations" not in result.samples
    assert health["broken"]["state"] == "failed"  # type: ignore[index]
    assert health["broken"]["error"] == "RuntimeError: rules crashed"  # type: ignore[index]
    assert health["after"]["state"] == "ok"  # type: ignore[index]


def test_derived_collectors_are_pending_until_the_first_evaluation() -> None:
    derived = Derived("derived", evaluation_seconds=3600.0)
    registry = CollectorRegistry([SteadySource(), derived])
    result = scrape(registry)
    assert registry.health()["collectors"]["derived"]["state"] == "pending"  # type: ignore[index]
    assert result.value("trainmon_collector_success", collector="derived") == 0
    assert "derived_evaluations" not in result.samples
    assert derived.evaluations == 0


def test_without_a_derived_collector_there_is_no_loop() -> None:
    plain = Derived("plain", evaluation_seconds=None)  # observes, but on scrapes
    registry = CollectorRegistry([SteadySource(), plain])
    assert registry.evaluation_seconds is None
    registry.start()
    try:
        assert not [thread for thread in threading.enumerate() if thread.name == "evaluation"]
        scrape(registry)
        scrape(registry)
    finally:
        registry.stop()
    assert plain.evaluations == 3  # the start, then each scrape


class Stopping(Collector):
    """Notes in ``order`` when it is stopped."""

    def __init__(self, name: str, order: list[str], evaluation_seconds: float | None = None
                 ) -> None:
        self.name = name
        self.evaluation_seconds = evaluation_seconds
        self._order = order

    def collect(self) -> Iterable[Metric]:
        return []

    def stop(self) -> None:
        self._order.append(self.name)


def test_sources_stop_before_the_derived_collectors() -> None:
    """The training receiver takes in its last reports before the ledger's last flush."""
    order: list[str] = []
    registry = CollectorRegistry([
        Stopping("gpu", order), Stopping("training", order),
        Stopping("diagnosis", order, evaluation_seconds=3600.0), Stopping("ledger", order)])
    registry.start()
    registry.stop()
    assert order == ["training", "gpu", "ledger", "diagnosis"]

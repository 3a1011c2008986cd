"""Small data sources for the server and registry tests."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from trainmon.core.collector import Collector, CollectorUnavailable


class SteadySource(Collector):
    """A data source with one gauge and one counter whose values the test sets."""

    name = "steady"

    def __init__(self) -> None:
        self.value = 1.0

    def collect(self) -> Iterable[Metric]:
        gauge = GaugeMetricFamily("example_value", "A value set by the test.", labels=["device"])
        gauge.add_metric(["a"], self.value)
        counter = CounterMetricFamily("example_events", "Events seen.", labels=["device"])
        counter.add_metric(["a"], 3.0)
        return [gauge, counter]


class BrokenSource(Collector):
    name = "broken"

    def collect(self) -> Iterable[Metric]:
        raise OSError("the device went away")


class AbsentSource(Collector):
    name = "absent"

    def start(self) -> None:
        raise CollectorUnavailable("no such hardware on this machine")

    def collect(self) -> Iterable[Metric]:
        raise CollectorUnavailable("no such hardware on this machine")

"""The text format encoder: the bytes of prometheus_client's generate_latest, and bounded."""

from __future__ import annotations

import math
import tracemalloc
from collections.abc import Callable, Iterable, Iterator

import pytest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
    StateSetMetricFamily,
    SummaryMetricFamily,
    UnknownMetricFamily,
)
from prometheus_client.exposition import generate_latest

from trainmon.core.exposition import TextEncoder

#: Label values a pushing client or a mount table could bring: escapes, quotes,
#: line ends, braces, commas, non-ASCII, the empty string.
HOSTILE_VALUES = [
    'a"b', "back\\slash", "new\nline", "cr\rlf", "}{,=", "", "作业-1", "tab\tx",
    '\\"\n', "x" * 300, "\x00nul",
]


class Families:
    """A collector of fixed families, as generate_latest takes them."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


def expected(families: Iterable[Metric]) -> bytes:
    return generate_latest(Families(families))  # type: ignore[arg-type]


def every_kind() -> list[Metric]:
    counter = CounterMetricFamily("jobs_done", "Done jobs.", labels=["job", "node"])
    counter.add_metric(["b", "n1"], 3)
    counter.add_metric(["a", "n1"], 1.5, created=1700000000.25)
    gauge = GaugeMetricFamily("temperature_celsius", 'HELP with \\ and\nline "quotes"',
                              labels=["zone"])
    for index, value in enumerate([0.0, -1.0, math.inf, -math.inf, math.nan, 1e21, 123456789.0,
                                   1234567.0, 0.1, 5e-324, 2**53, True]):
        gauge.add_metric([f"z{index}"], value)
    gauge.add_metric(["t"], 7.0, timestamp=1700000000.123)
    info = InfoMetricFamily("build", "Build.", value={"version": "1.0", "commit": "abc"})
    states = StateSetMetricFamily("mode", "Mode.", value={"on": True, "off": False})
    histogram = HistogramMetricFamily("latency_seconds", "Latency.",
                                      buckets=[("0.1", 2), ("+Inf", 5)], sum_value=1.5)
    gauge_histogram = GaugeHistogramMetricFamily("queue_bytes", "Queue.",
                                                 buckets=[("10", 1), ("+Inf", 3)], gsum_value=12)
    summary = SummaryMetricFamily("size_bytes", "Size.", count_value=4, sum_value=100)
    unknown = UnknownMetricFamily("mystery", "Unknown.", value=42)
    empty = GaugeMetricFamily("nothing_yet", "An empty family keeps its HELP and TYPE.",
                              labels=["job"])
    no_labels = GaugeMetricFamily("plain", "No labels.", value=2)
    return [counter, gauge, info, states, histogram, gauge_histogram, summary, unknown, empty,
            no_labels]


def hostile() -> list[Metric]:
    values = GaugeMetricFamily("trainmon_job_info", "Jobs.", labels=["job", "path"])
    for index, value in enumerate(HOSTILE_VALUES):
        values.add_metric([value, f"/mnt/{index}"], 1)
    names = Metric("weird.name-with:colon", "UTF-8 metric name.", "gauge")
    names.add_sample("weird.name-with:colon", {"lab.el": "x", "ü": "y", "0start": "z"}, 1)
    return [values, names]


@pytest.mark.parametrize("make", [every_kind, hostile], ids=["every kind", "hostile"])
def test_the_bytes_of_generate_latest(make: Callable[[], list[Metric]]) -> None:
    encoder = TextEncoder()
    for _ in range(3):  # the first encoding, then from what it remembered
        assert encoder.encode(make()) == expected(make())


def test_new_values_of_remembered_series_are_written() -> None:
    encoder = TextEncoder()
    for value in [1.0, 2.5, 0.0, math.nan]:
        family = CounterMetricFamily("steps", "Steps.", labels=["job"])
        family.add_metric(["a"], value)
        assert encoder.encode([family]) == expected([family])


def test_one_series_in_two_families_with_its_labels_in_another_order() -> None:
    encoder = TextEncoder()
    first = GaugeMetricFamily("x", "First HELP.", labels=["a", "b"])
    first.add_metric(["1", "2"], 1)
    second = GaugeMetricFamily("x", "Another HELP.", labels=["b", "a"])
    second.add_metric(["2", "1"], 2)  # the same labels in another order
    assert encoder.encode([first, second]) == expected([first, second])
    assert encoder.encode([second]) == expected([second])


def test_an_error_names_its_family() -> None:
    broken = GaugeMetricFamily("broken", "Broken.", labels=["job"])
    broken.add_metric(["a"], "not a number")  # type: ignore[arg-type]
    with pytest.raises(ValueError) as raised:
        TextEncoder().encode([broken])
    assert raised.value.args[-1] is broken


def test_memory_stays_bounded_under_label_churn() -> None:
    """Each encoding keeps only what it used: a client that sends new job names on
    every report leaves nothing behind once they are gone."""
    encoder = TextEncoder()

    def churn(round_number: int) -> list[Metric]:
        family = GaugeMetricFamily("trainmon_job", "Jobs.", labels=["job"])
        for index in range(50):
            family.add_metric([f"job-{round_number}-{index}-" + "x" * 100], 1)
        return [family]

    tracemalloc.start()
    try:
        for round_number in range(100):
            encoder.encode(churn(round_number))
        settled, _ = tracemalloc.get_traced_memory()
        for round_number in range(100, 1100):
            encoder.encode(churn(round_number))
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert after - settled < 64 * 1024  # 1000 rounds x 50 new series of 120 bytes: 6 MB if kept

"""The exposition: the bytes of prometheus_client's encoders (text 0.0.4 remembered and bounded,
text 1.0.0 in each escaping, OpenMetrics), its negotiation, and trainmon's families."""

from __future__ import annotations

import math
import tracemalloc
from collections.abc import Callable, Iterable, Iterator

import pytest
from prometheus_client import core as prometheus_core
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
from prometheus_client.exposition import choose_encoder, generate_latest
from prometheus_client.openmetrics import parser as openmetrics_parser
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.utils import floatToGoString

from trainmon.core import families as families_module
from trainmon.core.exposition import (
    ESCAPINGS,
    TextEncoder,
    encode_openmetrics,
    escape_metric_name,
    negotiate,
    value_text,
)

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


# -- the families and the other formats, held to prometheus_client's ---------------------

def ours(families: Iterable[Metric]) -> list[families_module.Metric]:
    """The same families built with trainmon.core.families: each sample added as is."""
    built = []
    for family in families:
        copy = families_module.Metric(family.name, family.documentation, family.type,
                                      family.unit)
        for sample in family.samples:
            copy.add_sample(sample.name, dict(sample.labels), sample.value, sample.timestamp)
        built.append(copy)
    return built


def test_the_families_build_the_samples_of_the_library_s() -> None:
    gauge, library_gauge = (module.GaugeMetricFamily("g", "G.", labels=["a", "b"])
                            for module in (families_module, prometheus_core))
    counter, library_counter = (module.CounterMetricFamily("c_total", "C.", labels=["a"])
                                for module in (families_module, prometheus_core))
    histogram, library_histogram = (module.HistogramMetricFamily("h", "H.", labels=["a"])
                                    for module in (families_module, prometheus_core))
    for family in (gauge, library_gauge):
        family.add_metric(["1", "2"], 3.5)
        family.add_metric(["x"], 1.0, timestamp=17.5)  # fewer values: zip's truncation
    for family in (counter, library_counter):
        family.add_metric(["1"], 3.0)
        family.add_metric(["2"], 4.0, created=1700000000.0)
    for family in (histogram, library_histogram):
        family.add_metric(["1"], [("0.5", 1.0), ("+Inf", 3.0)], 2.5)
        family.add_metric(["2"], [("-1", 1.0), ("+Inf", 2.0)], 0.5)  # no count, no sum
    for mine, theirs in ((gauge, library_gauge), (counter, library_counter),
                         (histogram, library_histogram)):
        assert (mine.name, mine.type, mine.documentation) == (
            theirs.name, theirs.type, theirs.documentation)
        assert mine.samples == theirs.samples
    assert families_module.GaugeMetricFamily("v", "V.", value=2.0).samples == (
        prometheus_core.GaugeMetricFamily("v", "V.", value=2.0).samples)
    assert families_module.Metric("m", "M.", "untyped", unit="bytes").name == "m_bytes"
    with pytest.raises(ValueError, match="at most one"):
        families_module.GaugeMetricFamily("v", "V.", value=1.0, labels=["a"])


@pytest.mark.parametrize("make", [every_kind, hostile], ids=["every kind", "hostile"])
def test_our_families_encode_to_the_bytes_of_generate_latest(
        make: Callable[[], list[Metric]]) -> None:
    assert TextEncoder().encode(ours(make())) == expected(make())


@pytest.mark.parametrize("escaping", ESCAPINGS)
@pytest.mark.parametrize("make", [every_kind, hostile], ids=["every kind", "hostile"])
def test_text_1_0_0_in_each_escaping_is_the_library_s(
        make: Callable[[], list[Metric]], escaping: str) -> None:
    reference = generate_latest(Families(make()), escaping=escaping)  # type: ignore[arg-type]
    assert TextEncoder(escaping).encode(ours(make())) == reference


@pytest.mark.parametrize("make", [every_kind, hostile], ids=["every kind", "hostile"])
def test_openmetrics_is_the_library_s(make: Callable[[], list[Metric]]) -> None:
    """prometheus_client writes a sample's name through another escaping than its HELP and
    TYPE (a colon becomes ``_`` there, ``values`` prefixes ``U__`` even to a legacy name);
    here both read alike, so the reference is taken with the default scheme and names of
    the legacy set, where the two agree."""
    families = [family for family in make() if ":" not in family.name]
    reference = openmetrics_latest(Families(families))  # type: ignore[arg-type]
    assert encode_openmetrics(ours(families)) == reference
    parsed = list(openmetrics_parser.text_string_to_metric_families(
        encode_openmetrics(ours(make())).decode()))
    assert [family.name for family in parsed] == [
        escape_metric_name(family.name) for family in make()]


@pytest.mark.parametrize(("accept", "answer"), [
    ("", ("text", "underscores", "text/plain; version=0.0.4; charset=utf-8")),
    ("application/openmetrics-text; version=1.0.0",
     ("openmetrics", "underscores",
      "application/openmetrics-text; version=1.0.0; charset=utf-8; escaping=underscores")),
    ("application/openmetrics-text",
     ("openmetrics", "underscores", "application/openmetrics-text; version=1.0.0; charset=utf-8")),
    # Prometheus' default: OpenMetrics 1.0.0 first
    ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
     "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
     ("openmetrics", "underscores",
      "application/openmetrics-text; version=1.0.0; charset=utf-8; escaping=underscores")),
    ("application/openmetrics-text; version=0.0.1, text/plain; version=1.0.0; escaping=dots",
     ("text", "dots", "text/plain; version=1.0.0; charset=utf-8; escaping=dots")),
    ("text/plain; version=1.0.0; escaping=nonsense",
     ("text", "underscores", "text/plain; version=1.0.0; charset=utf-8; escaping=underscores")),
    ("text/plain; version=0.0.4", ("text", "underscores", "text/plain; version=0.0.4; charset=utf-8")),
    ("text/plain; version=1", ("text", "underscores", "text/plain; version=0.0.4; charset=utf-8")),
])
def test_negotiation_picks_what_choose_encoder_picks(
        accept: str, answer: tuple[str, str, str]) -> None:
    assert negotiate(accept) == answer
    assert choose_encoder(accept)[1] == answer[2]


@pytest.mark.parametrize("value", [0.0, -1.0, math.inf, -math.inf, math.nan, 1e21, 123456789.0,
                                   1234567.0, 0.1, 5e-324, 2.0**53, 1e-7, 12345678.5, True, 3])
def test_values_are_written_as_go_writes_them(value: float) -> None:
    assert value_text(value) == floatToGoString(value)

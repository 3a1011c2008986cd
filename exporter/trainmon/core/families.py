"""Metric families as the collectors build them: the data model of the exposition.

A collector returns families (``GaugeMetricFamily``, ``CounterMetricFamily``,
``HistogramMetricFamily``), each a name, a HELP text, a type and its samples;
``trainmon.core.exposition`` writes them in the text formats. The classes keep
the constructors, attributes and samples of prometheus_client's families of the
same names (``Sample`` is a tuple of the same six fields, a family's ``samples``
the same list), so that code written against either reads both: the daemon's
collectors build these, while ``doctor`` and the tests read exposition text with
prometheus_client's parser, and the tests hold the encoders to prometheus_client's
own as the reference.

Why not import them from prometheus_client: its package imports, at module level,
its HTTP servers and client (``http.server``, ``wsgiref``, ``urllib.request``) and
with them ``ssl``; in the node daemon, which answers HTTP itself, that was 1.1 MiB
of its resident memory for classes of a few lines (docs/benchmarks.md, "Resident
memory of the node daemon"). What they leave out, which trainmon never exports:
exemplars, native histograms, ``Timestamp`` objects (a timestamp is Unix seconds),
and the family kinds info, stateset, summary and gauge histogram (the exposition
still writes a ``Metric`` of any OpenMetrics type).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol

#: The OpenMetrics family types (``untyped`` is read as ``unknown``).
METRIC_TYPES = ("counter", "gauge", "summary", "histogram", "gaugehistogram", "unknown",
                "info", "stateset")


class Sample(NamedTuple):
    """One sample: its name (the family's, or with a suffix such as ``_total``), labels,
    value and optional Unix timestamp (seconds). ``exemplar`` and ``native_histogram``
    are always None here; they keep the tuple prometheus_client's ``Sample`` is."""

    name: str
    labels: dict[str, str]
    value: float
    timestamp: float | None = None
    exemplar: Any = None
    native_histogram: Any = None


class ReadSample(Protocol):
    """What a reader of samples uses, of this module's or prometheus_client's."""

    @property
    def name(self) -> str: ...

    @property
    def labels(self) -> Mapping[str, str]: ...

    @property
    def value(self) -> float: ...


class ReadFamily(Protocol):
    """A family as a reader sees it: built here, or parsed from exposition text by
    prometheus_client's parser (``doctor``, ``top``)."""

    @property
    def name(self) -> str: ...

    @property
    def samples(self) -> Sequence[ReadSample]: ...


class Metric:
    """A metric family and its samples."""

    def __init__(self, name: str, documentation: str, typ: str, unit: str = "") -> None:
        if unit and not name.endswith("_" + unit):
            name += "_" + unit
        if not name:
            raise ValueError("metric name cannot be empty")
        if typ == "untyped":
            typ = "unknown"
        if typ not in METRIC_TYPES:
            raise ValueError(f"Invalid metric type: {typ}")
        self.name = name
        self.documentation = documentation
        self.unit = unit
        self.type = typ
        self.samples: list[Sample] = []

    def add_sample(self, name: str, labels: dict[str, str], value: float,
                   timestamp: float | None = None) -> None:
        self.samples.append(Sample(name, labels, value, timestamp))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Metric) and self.name == other.name
                and self.documentation == other.documentation and self.type == other.type
                and self.unit == other.unit and self.samples == other.samples)

    def __repr__(self) -> str:
        return (f"Metric({self.name}, {self.documentation}, {self.type}, {self.unit}, "
                f"{self.samples})")


class _LabelledFamily(Metric):
    """A family whose samples carry the label names given once, at construction."""

    def __init__(self, name: str, documentation: str, typ: str,
                 labels: Sequence[str] | None, unit: str) -> None:
        super().__init__(name, documentation, typ, unit)
        self._labelnames = tuple(labels or ())

    def _labels(self, values: Sequence[str]) -> dict[str, str]:
        return dict(zip(self._labelnames, values, strict=False))


class GaugeMetricFamily(_LabelledFamily):
    """A gauge: one sample per label set."""

    def __init__(self, name: str, documentation: str, value: float | None = None,
                 labels: Sequence[str] | None = None, unit: str = "") -> None:
        if labels is not None and value is not None:
            raise ValueError("Can only specify at most one of value and labels.")
        super().__init__(name, documentation, "gauge", labels, unit)
        if value is not None:
            self.add_metric([], value)

    def add_metric(self, labels: Sequence[str], value: float,
                   timestamp: float | None = None) -> None:
        self.samples.append(Sample(self.name, self._labels(labels), value, timestamp))


class CounterMetricFamily(_LabelledFamily):
    """A counter: the family is named without ``_total``, its samples with it (and
    ``_created`` where a creation time is given)."""

    def __init__(self, name: str, documentation: str, value: float | None = None,
                 labels: Sequence[str] | None = None, created: float | None = None,
                 unit: str = "") -> None:
        if labels is not None and value is not None:
            raise ValueError("Can only specify at most one of value and labels.")
        super().__init__(name.removesuffix("_total"), documentation, "counter", labels, unit)
        if value is not None:
            self.add_metric([], value, created)

    def add_metric(self, labels: Sequence[str], value: float, created: float | None = None,
                   timestamp: float | None = None) -> None:
        names = self._labels(labels)
        self.samples.append(Sample(self.name + "_total", names, value, timestamp))
        if created is not None:
            self.samples.append(Sample(self.name + "_created", dict(names), created, timestamp))


class HistogramMetricFamily(_LabelledFamily):
    """A histogram: ``_bucket`` samples with ``le`` (sorted, ``+Inf`` last), then
    ``_count`` (the ``+Inf`` bucket) and ``_sum`` when a sum is given."""

    def __init__(self, name: str, documentation: str,
                 buckets: Sequence[tuple[str, float]] | None = None,
                 sum_value: float | None = None, labels: Sequence[str] | None = None,
                 unit: str = "") -> None:
        if sum_value is not None and buckets is None:
            raise ValueError("sum value cannot be provided without buckets.")
        if labels is not None and buckets is not None:
            raise ValueError("Can only specify at most one of buckets and labels.")
        super().__init__(name, documentation, "histogram", labels, unit)
        if buckets is not None:
            self.add_metric([], buckets, sum_value)

    def add_metric(self, labels: Sequence[str], buckets: Sequence[tuple[str, float]],
                   sum_value: float | None, timestamp: float | None = None) -> None:
        for bound, value in buckets:
            self.samples.append(Sample(
                self.name + "_bucket", {**self._labels(labels), "le": bound}, value, timestamp))
        if float(buckets[0][0]) >= 0 and sum_value is not None:  # no count with negative bounds
            self.samples.append(
                Sample(self.name + "_count", self._labels(labels), buckets[-1][1], timestamp))
            self.samples.append(
                Sample(self.name + "_sum", self._labels(labels), sum_value, timestamp))

"""Matching GetMonitorData answers to targets, and the latest value of each series.

``GetMonitorData`` answers one ``DataPoint`` per object that has data:
``{"Dimensions": [{"Name", "Value"}...], "Timestamps": [...], "Values": [...]}``.
Nothing promises the order of the data points, nor of the dimensions inside
one, nor that a data point has only the dimensions that were asked for (a
per-GPU metric adds e.g. ``minorNumber``). So every data point is matched back
to the requested target **by its dimensions** (name case-insensitive, value
exact), never by position, and every dimension it carries becomes a label.

An object without data (agent missing, instance stopped) comes back with
empty ``Timestamps``/``Values`` or not at all: its series then disappears —
no sample rather than a stale or zero one — and the metric's sample age rises.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from trainmon.tencent.catalogue import MetricSpec, label_name
from trainmon.tencent.targets import Target

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Sample:
    """One series' latest value, in base units."""

    labels: Labels
    value: float
    #: Start of the Cloud Monitor period the value averages, Unix seconds.
    timestamp: float


def match_datapoints(
    answer: Mapping[str, object],
    batch: Sequence[Target],
    spec: MetricSpec,
    latest_start: float,
) -> dict[Target, list[Sample]]:
    """The newest point (at or before ``latest_start``) of every series, per target.

    Every target of ``batch`` is a key of the result; an empty list means the
    API had no data for it. Data points that match no requested target are
    ignored (the answer is about objects we did not ask for).
    """
    by_id = {target.object_id: target for target in batch}
    key = spec.kind.dimension.lower()
    result: dict[Target, list[Sample]] = {target: [] for target in batch}
    points = answer.get("DataPoints")
    if not isinstance(points, list):
        return result
    for point in points:
        if not isinstance(point, dict):
            continue
        dimensions = _dimensions(point.get("Dimensions"))
        object_id = next((v for n, v in dimensions.items() if n.lower() == key), None)
        target = by_id.get(object_id) if object_id is not None else None
        if target is None:
            continue
        newest = _newest(point.get("Timestamps"), point.get("Values"), latest_start)
        if newest is None:
            continue
        timestamp, value = newest
        result[target].append(
            Sample(_labels(target, dimensions), spec.convert(value), timestamp)
        )
    return result


def _dimensions(raw: object) -> dict[str, str]:
    if not isinstance(raw, list):
        return {}
    dimensions: dict[str, str] = {}
    for item in raw:
        if isinstance(item, dict) and isinstance(item.get("Name"), str):
            value = item.get("Value")
            if value is not None:
                dimensions[item["Name"]] = str(value)
    return dimensions


def _newest(timestamps: object, values: object, latest_start: float) -> tuple[float, float] | None:
    if not isinstance(timestamps, list) or not isinstance(values, list):
        return None
    best: tuple[float, float] | None = None
    for stamp, value in zip(timestamps, values, strict=False):  # unequal: ignore the tail
        if isinstance(stamp, bool) or not isinstance(stamp, (int, float)):
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if not math.isfinite(value) or stamp > latest_start:
            continue
        if best is None or stamp > best[0]:
            best = (float(stamp), float(value))
    return best


def _labels(target: Target, dimensions: Mapping[str, str]) -> Labels:
    labels = {label_name(name): value for name, value in dimensions.items()}
    labels["region"] = target.region
    if target.instance_id is not None:
        labels.setdefault("instance_id", target.instance_id)
    return tuple(sorted(labels.items()))


@dataclass(frozen=True)
class TencentSamples:
    """A consistent copy of the store: the Cloud Monitor samples current now, per metric."""

    #: metric name → its current samples.
    series: Mapping[str, tuple[Sample, ...]]
    #: metric name → end (Unix seconds) of the newest period ever received.
    newest_end: Mapping[str, float]


class SampleStore:
    """The latest samples of every (metric, target); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._series: dict[str, dict[Target, list[Sample]]] = {}
        self._newest_end: dict[str, float] = {}

    def update(self, metric: str, period: float, results: Mapping[Target, list[Sample]]) -> None:
        """Replace the series of each target in ``results`` (an empty list removes them)."""
        with self._lock:
            per_target = self._series.setdefault(metric, {})
            for target, samples in results.items():
                if samples:
                    per_target[target] = samples
                    end = max(sample.timestamp for sample in samples) + period
                    self._newest_end[metric] = max(self._newest_end.get(metric, end), end)
                else:
                    per_target.pop(target, None)

    def retain(self, metric_names: set[str], targets: set[Target]) -> None:
        """Forget metrics no longer pulled and targets no longer monitored."""
        with self._lock:
            for metric in list(self._series):
                if metric not in metric_names:
                    del self._series[metric]
                    self._newest_end.pop(metric, None)
                    continue
                per_target = self._series[metric]
                for target in [t for t in per_target if t not in targets]:
                    del per_target[target]

    def snapshot(self, oldest: float) -> TencentSamples:
        """Current samples, leaving out those whose period started before ``oldest``."""
        with self._lock:
            series = {
                metric: tuple(
                    sample
                    for samples in per_target.values()
                    for sample in samples
                    if sample.timestamp >= oldest
                )
                for metric, per_target in self._series.items()
            }
            return TencentSamples(series, dict(self._newest_end))

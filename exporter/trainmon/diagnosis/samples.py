"""Metric snapshots and windows: the one input of the diagnosis, wherever it runs.

The daemon's diagnosis collector snapshots its sibling collectors' families on
every evaluation (every window / 20, on the daemon's clock); ``trainmon
doctor`` snapshots a daemon's ``/metrics`` text, or collectors run in process,
about once a second. Both keep the snapshots of
the last few seconds to a minute in a ``Window``, from which counters give
increases and gauges give means — the same arithmetic in every case, so the
daemon and ``doctor`` reach the same verdict from the same data.

Samples are keyed by their *sample* name (a counter ``x`` appears as
``x_total``; a histogram as ``x_sum``, ``x_count`` and ``x_bucket``), as
Prometheus itself stores them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from trainmon.core.families import ReadFamily

#: A label set, sorted by label name.
Labels = tuple[tuple[str, str], ...]


def labels_of(mapping: Mapping[str, str]) -> Labels:
    return tuple(sorted(mapping.items()))


@dataclass(frozen=True)
class ScrapedSamples:
    """Every sample of one scrape, with the time it was taken."""

    #: Monotonic seconds (rates and windows).
    at: float
    #: Unix seconds (compared with ``*_timestamp_seconds`` samples).
    wall: float
    samples: Mapping[str, Mapping[Labels, float]]

    @classmethod
    def from_families(
        cls,
        families: Iterable[ReadFamily],
        at: float,
        wall: float,
        names: Collection[str] | None = None,
    ) -> ScrapedSamples:
        """Keep the finite samples, only those named in ``names`` when given."""
        samples: dict[str, dict[Labels, float]] = {}
        for family in families:
            for sample in family.samples:
                if (names is None or sample.name in names) and math.isfinite(sample.value):
                    samples.setdefault(sample.name, {})[labels_of(sample.labels)] = sample.value
        return cls(at, wall, samples)

    @classmethod
    def from_text(
        cls, text: str, at: float, wall: float, names: Collection[str] | None = None
    ) -> ScrapedSamples:
        """Parse Prometheus text exposition; raises ``ValueError`` on malformed input."""
        # Here, not above: only ``doctor`` parses text; the daemon reads its own families.
        from prometheus_client.parser import text_string_to_metric_families

        return cls.from_families(text_string_to_metric_families(text), at, wall, names)

    def series(self, name: str) -> Mapping[Labels, float]:
        return self.samples.get(name, {})


class Window:
    """Consecutive snapshots, oldest first (at least one)."""

    def __init__(self, snapshots: Sequence[ScrapedSamples]) -> None:
        if not snapshots:
            raise ValueError("a window needs at least one snapshot")
        self.snapshots = tuple(snapshots)

    @property
    def first(self) -> ScrapedSamples:
        return self.snapshots[0]

    @property
    def last(self) -> ScrapedSamples:
        return self.snapshots[-1]

    @property
    def seconds(self) -> float:
        """Span between the first and the last snapshot."""
        return self.last.at - self.first.at

    def halves(self) -> tuple[Window, Window] | None:
        """The earlier and the later half (sharing the middle snapshot); None if too short."""
        if len(self.snapshots) < 3:
            return None
        middle_time = (self.first.at + self.last.at) / 2
        middle = min(
            range(1, len(self.snapshots) - 1),
            key=lambda index: abs(self.snapshots[index].at - middle_time),
        )
        return Window(self.snapshots[: middle + 1]), Window(self.snapshots[middle:])

    def from_count(self, name: str, labels: Labels, count: float) -> Window:
        """The snapshots from the first in which the counter ``name{labels}`` reached
        ``count`` on (the last snapshot alone if it never did: nothing increases)."""
        for index, snapshot in enumerate(self.snapshots):
            if snapshot.series(name).get(labels, -1.0) >= count:
                return Window(self.snapshots[index:])
        return Window(self.snapshots[-1:])

    def latest(self, name: str) -> Mapping[Labels, float]:
        """The newest snapshot's series of ``name``."""
        return self.last.series(name)

    def increase(self, name: str, labels: Labels) -> float | None:
        """How much a counter grew over the window, across counter resets.

        ``None`` when the series is in fewer than two snapshots. A value below
        its predecessor is a reset: the new value counts as growth from zero,
        as Prometheus' ``increase()`` does.
        """
        values = [
            value
            for snapshot in self.snapshots
            if (value := snapshot.series(name).get(labels)) is not None
        ]
        if len(values) < 2:
            return None
        total = 0.0
        for previous, current in itertools.pairwise(values):
            total += current - previous if current >= previous else current
        return total

    def rate(self, name: str, labels: Labels) -> float | None:
        """``increase`` per second over the span of the snapshots that hold the series."""
        times = [s.at for s in self.snapshots if labels in s.series(name)]
        increase = self.increase(name, labels)
        if increase is None or times[-1] <= times[0]:
            return None
        return increase / (times[-1] - times[0])

    def mean(self, name: str, labels: Labels) -> float | None:
        """Mean of a gauge over the snapshots that hold it; None if none do."""
        values = [
            value
            for snapshot in self.snapshots
            if (value := snapshot.series(name).get(labels)) is not None
        ]
        return sum(values) / len(values) if values else None

    def label_sets(self, name: str) -> list[Labels]:
        """Every label set of ``name`` seen in the window, in first-seen order."""
        seen: dict[Labels, None] = {}
        for snapshot in self.snapshots:
            for labels in snapshot.series(name):
                seen.setdefault(labels, None)
        return list(seen)

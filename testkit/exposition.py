"""Exposition text as Prometheus reads it, for assertions on exactly that.

``scrape(collector)`` registers one collector alone in a fresh registry,
renders it with ``prometheus_client.generate_latest`` and parses the text back
with ``text_string_to_metric_families``; ``parse(text)`` does the second half
for text from a running daemon. Both check what every test relies on: each
family has a non-empty HELP, and no series appears twice.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from trainmon.core.collector import Collector

Labels = tuple[tuple[str, str], ...]


def labels(**values: str) -> Labels:
    """The sorted label tuple a sample of these label values is keyed by."""
    return tuple(sorted(values.items()))


@dataclass(frozen=True)
class Scrape:
    """One rendering: the text, ``# TYPE`` lines (family → type) and every sample.

    ``samples`` maps a sample name (counters with ``_total``, histograms with
    ``_bucket``/``_sum``/``_count``) to its series, keyed by sorted labels.
    ``_created`` samples are left out.
    """

    text: str
    types: dict[str, str]
    samples: dict[str, dict[Labels, float]]

    def value(self, name: str, **labels: str) -> float | None:
        """The sample of ``name`` whose labels include ``labels`` (exactly one), or None."""
        matches = [
            value
            for sample_labels, value in self.samples.get(name, {}).items()
            if labels.items() <= dict(sample_labels).items()
        ]
        assert len(matches) <= 1, f"{name}{labels} is ambiguous: {matches}"
        return matches[0] if matches else None

    def labelsets(self, name: str) -> list[dict[str, str]]:
        """The label sets of every series of ``name``."""
        return [dict(sample_labels) for sample_labels in self.samples.get(name, {})]

    def series(self, name: str, *label_names: str) -> dict[tuple[str, ...], float]:
        """Samples of ``name`` keyed by the values of ``label_names``, in that order.

        The sample's label names must be exactly ``label_names``.
        """
        result = {}
        for sample_labels, value in self.samples.get(name, {}).items():
            mapping = dict(sample_labels)
            assert sorted(mapping) == sorted(label_names), (name, mapping)
            result[tuple(mapping[label] for label in label_names)] = value
        return result

    def by_device(self, name: str) -> dict[str, float]:
        """Samples of a metric labelled only by ``device``, keyed by it."""
        return {key[0]: value for key, value in self.series(name, "device").items()}

    def by_gpu(self, name: str, **labels: str) -> dict[str, float]:
        """Samples of ``name`` (with the extra ``labels``) keyed by their ``gpu`` label."""
        result = {}
        for sample_labels, value in self.samples.get(name, {}).items():
            mapping = dict(sample_labels)
            if all(mapping.get(k) == v for k, v in labels.items()):
                result[mapping["gpu"]] = value
        return result


def parse(text: str) -> Scrape:
    """Exposition text → Scrape; every family must have a non-empty HELP."""
    types = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            types[name] = kind
        elif line.startswith("# HELP "):
            parts = line.split(" ", 3)
            assert len(parts) == 4 and parts[3].strip(), line
    samples: dict[str, dict[Labels, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            series = samples.setdefault(sample.name, {})
            key = labels(**sample.labels)
            assert key not in series, f"duplicate series {sample.name}{sample.labels}"
            series[key] = sample.value
    return Scrape(text, types, samples)


def scrape(collector: Collector) -> Scrape:
    """``collector`` alone in a fresh registry, rendered as Prometheus would receive it."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return parse(generate_latest(registry).decode("utf-8"))

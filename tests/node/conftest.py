"""Fixtures for the node collector tests: fixture trees and exposition scraping.

``scrape(collector)`` registers the collector alone in a fresh registry, renders
it with ``prometheus_client.generate_latest`` and parses that text back, so the
tests assert on exactly what Prometheus would receive.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.collectors.base import Collector

FIXTURES = Path(__file__).parent / "fixtures"

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Scrape:
    """One rendering of a collector: the text, ``# TYPE`` lines and every sample."""

    text: str
    types: dict[str, str]
    samples: dict[str, dict[Labels, float]]

    def series(self, name: str, *label_names: str) -> dict[tuple[str, ...], float]:
        """Samples of ``name`` keyed by the values of ``label_names``, in that order.

        The sample's label names must be exactly ``label_names``.
        """
        result = {}
        for labels, value in self.samples.get(name, {}).items():
            mapping = dict(labels)
            assert sorted(mapping) == sorted(label_names), (name, mapping)
            result[tuple(mapping[label] for label in label_names)] = value
        return result

    def by_device(self, name: str) -> dict[str, float]:
        """Samples of a metric labelled only by ``device``, keyed by it."""
        return {key[0]: value for key, value in self.series(name, "device").items()}


def render(collector: Collector) -> Scrape:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    text = generate_latest(registry).decode("utf-8")
    types = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            types[name] = kind
        elif line.startswith("# HELP "):
            assert len(line.split(" ", 3)) == 4 and line.split(" ", 3)[3].strip(), line
    samples: dict[str, dict[Labels, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = tuple(sorted(sample.labels.items()))
            series = samples.setdefault(sample.name, {})
            assert key not in series, f"duplicate series {sample.name}{sample.labels}"
            series[key] = sample.value
    return Scrape(text, types, samples)


@pytest.fixture
def scrape() -> Callable[[Collector], Scrape]:
    return render


@pytest.fixture
def tree() -> Callable[[str], Path]:
    """The checked-in fixture tree ``name`` (read-only)."""

    def locate(name: str) -> Path:
        path = FIXTURES / name
        assert path.is_dir(), path
        return path

    return locate


@pytest.fixture
def writable_tree(tmp_path: Path) -> Callable[[str], Path]:
    """A private copy of fixture tree ``name`` that a test may rewrite."""

    def copy(name: str) -> Path:
        return Path(shutil.copytree(FIXTURES / name, tmp_path / name))

    return copy

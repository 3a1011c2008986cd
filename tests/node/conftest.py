"""Fixtures for the node collector tests: fixture trees and exposition scraping.

``scrape(collector)`` registers the collector alone in a fresh registry, renders
it with ``prometheus_client.generate_latest`` and parses that text back, so the
tests assert on exactly what Prometheus would receive.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit import exposition
from testkit.exposition import Scrape
from trainmon.core.collector import Collector

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def scrape() -> Callable[[Collector], Scrape]:
    return exposition.scrape


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

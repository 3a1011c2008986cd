"""The metric families of ``trainmon serve --demo`` match the committed list.

Dashboards, alerts and users' queries depend on these names: a family that
vanishes or is renamed breaks them. The list (``demo_metric_families.txt``)
changes only together with ``docs/metrics.md`` and ``CHANGELOG.md``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.daemon import Daemon

pytestmark = pytest.mark.integration

FAMILIES_FILE = Path(__file__).with_name("demo_metric_families.txt")
#: Diagnosis and the demo jobs appear a few seconds after start.
OBSERVE_SECONDS = 40.0


def committed_families() -> set[str]:
    lines = FAMILIES_FILE.read_text().splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


def exposed_families(exposition: str) -> set[str]:
    return {line.split()[2] for line in exposition.splitlines() if line.startswith("# TYPE ")}


def test_demo_exposes_exactly_the_committed_families(start_daemon: Callable[..., Daemon]) -> None:
    expected = committed_families()
    daemon = start_daemon(args=["--demo"])
    seen: set[str] = set()
    deadline = time.monotonic() + OBSERVE_SECONDS
    while not expected <= seen and time.monotonic() < deadline:
        seen |= exposed_families(daemon.metrics())
        time.sleep(0.5)
    assert sorted(expected - seen) == [], "families vanished or were renamed"
    assert sorted(seen - expected) == [], "new families: add them to the list and docs/metrics.md"

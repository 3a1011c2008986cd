"""Series per node: the number docs/deploy.md quotes for sizing Prometheus.

The demo is an 8-GPU node with two 4-rank training jobs, run with the default
configuration; every series a scrape returns is counted (one per sample line).
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.daemon import Daemon
from trainmon import contract

pytestmark = pytest.mark.integration

DEPLOY_DOCS = Path(__file__).resolve().parents[2] / "docs" / "deploy.md"
READY_SECONDS = 30.0
#: Diagnosis first sees GPU processes without step reports (pseudo-jobs), then
#: the jobs: count over a while and keep the peak as well as the settled value.
OBSERVE_SECONDS = 12.0


def series_by_family(exposition: str) -> Counter[str]:
    families: Counter[str] = Counter()
    for line in exposition.splitlines():
        if line and not line.startswith("#"):
            families[re.split(r"[{ ]", line, maxsplit=1)[0]] += 1
    return families


def reported_everything(families: Counter[str]) -> bool:
    """Every GPU and every rank of the demo's two 4-rank jobs is in the scrape."""
    return families["trainmon_gpu_up"] == 8 and families["trainmon_training_steps_total"] == 8


def test_demo_node_stays_under_the_series_budget(start_daemon: Callable[..., Daemon]) -> None:
    daemon = start_daemon(args=["--demo"])
    deadline = time.monotonic() + READY_SECONDS
    families = series_by_family(daemon.metrics())
    while not reported_everything(families) and time.monotonic() < deadline:
        time.sleep(0.5)
        families = series_by_family(daemon.metrics())
    assert reported_everything(families), f"the demo never reported all GPUs and ranks: {families}"

    peak = sum(families.values())
    end = time.monotonic() + OBSERVE_SECONDS
    while time.monotonic() < end:
        time.sleep(1.0)
        families = series_by_family(daemon.metrics())
        peak = max(peak, sum(families.values()))
    settled = sum(families.values())
    print(f"series per demo node: {settled} settled, {peak} at the peak")
    for name, count in families.most_common(8):
        print(f"  {count:4d} {name}")
    assert peak < contract.SERIES_PER_NODE_BUDGET


def scaling_section(markdown: str) -> str:
    """The text of docs/deploy.md's "## Scaling" section, up to the next "## " heading."""
    _, start, rest = markdown.partition("\n## Scaling\n")
    assert start, "docs/deploy.md has no '## Scaling' section"
    return rest.split("\n## ", 1)[0]


def test_the_deploy_docs_state_the_budget() -> None:
    budget = f"{contract.SERIES_PER_NODE_BUDGET:,}".replace(",", " ")
    section = scaling_section(DEPLOY_DOCS.read_text(encoding="utf-8"))
    assert f"fails at {budget}" in section, f"docs/deploy.md 'Scaling' should say it fails at {budget}"

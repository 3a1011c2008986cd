"""``--prometheus`` knows how runs ended from ``trainmon_training_run_end_timestamp_seconds``:
a real Prometheus scrapes a fake node daemon whose runs end, stall and resume."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from testkit.prometheus import Prometheus, wait_until
from tests.runs.runs_support import PhasedNode, scrape_every_second
from trainmon.runs.prometheus import PrometheusSource

pytestmark = pytest.mark.integration

STARTED = time.time() - 600
#: run -> (end reason, end time) exported in phase 1 and in phase 2; None: no end series.
PHASES = {
    # crashed while Prometheus watched: its run_info goes, the end stays
    "r1": (("crashed", STARTED + 100), ("crashed", STARTED + 100)),
    # stalled, then steps resumed: the ledger dropped the end
    "r2": (("stalled", STARTED + 200), None),
    # stalled, and still
    "r3": (("stalled", STARTED + 300), ("stalled", STARTED + 300)),
    # stalled, then finished: the latest end counts
    "r4": (("stalled", STARTED + 400), ("finished", STARTED + 450)),
}
LIVE = {1: ("r1", "r2", "r3", "r4"), 2: ("r2", "r3")}


def metrics(phase: int) -> str:
    """A node daemon's /metrics in phase 1 or 2 of ``PHASES``."""
    lines = ["# TYPE trainmon_training_run_info gauge"]
    lines += [f'trainmon_training_run_info{{job="llama",run="{run}",config_hash="sha256:0"}} 1'
              for run in LIVE[phase]]
    lines.append("# TYPE trainmon_training_run_start_timestamp_seconds gauge")
    lines += [f'trainmon_training_run_start_timestamp_seconds{{job="llama",run="{run}"}} '
              f"{STARTED}" for run in LIVE[phase]]
    lines.append("# TYPE trainmon_training_run_end_timestamp_seconds gauge")
    for run, ends in PHASES.items():
        end = ends[phase - 1]
        if end is not None:
            lines.append(f'trainmon_training_run_end_timestamp_seconds{{job="llama",'
                         f'run="{run}",reason="{end[0]}"}} {end[1]}')
    return "\n".join(lines) + "\n"


@pytest.fixture
def node() -> Iterator[PhasedNode]:
    with PhasedNode(metrics) as node:
        yield node


def test_end_reasons_come_from_the_ledgers_series(
        node: PhasedNode, prometheus: Prometheus) -> None:
    scrape_every_second(prometheus, node.address)

    def scraped(expr: str, count: int) -> bool:
        return len(prometheus.query(expr)) == count

    wait_until(lambda: scraped("count_over_time(trainmon_training_run_info[1m]) >= 2", 4),
               30, "two scrapes of phase 1")
    node.move_to(2)
    wait_until(lambda: scraped('trainmon_training_run_end_timestamp_seconds{reason="finished"}',
                               1), 30, "a scrape of phase 2")
    wait_until(lambda: scraped('trainmon_training_run_end_timestamp_seconds', 3), 30,
               "the resumed run's end gone stale")
    source = PrometheusSource(prometheus.url)
    try:
        views = {view.run: view for view in source.runs(job="llama")}
    finally:
        source.close()
    assert {run: view.end_reason for run, view in views.items()} == {
        "r1": "crashed", "r2": None, "r3": "stalled", "r4": "finished"}
    assert views["r1"].ended == pytest.approx(STARTED + 100)
    assert views["r4"].ended == pytest.approx(STARTED + 450)
    assert views["r2"].ended is None

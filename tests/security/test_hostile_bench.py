"""``python -m bench.hostile`` works: every probe, tiny, against this tree's daemon.

The bench compares a landed commit with the working tree; here only the working
tree runs, with sizes that take seconds, and the report must hold every row of
the table (the figures themselves are the bench's business, not asserted).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import benchlib, hostile

pytestmark = pytest.mark.integration

TINY = hostile.Settings(
    quiet_seconds=1.0, scrape_interval_seconds=0.05, post_timeout_seconds=10.0,
    datagram_seconds=2, jobs=100, jobs_deadline_seconds=10.0, exit_timeout_seconds=15.0,
    slow_clients=20, slow_seconds=2.0, reporters=10, steps_per_reporter=3,
)  # fmt: skip


def test_every_probe_fills_its_rows(tmp_path: Path) -> None:
    outcome = hostile.measure(benchlib.ROOT / "exporter", tmp_path, TINY)
    assert outcome.notes == []  # no probe raised, the daemon exited cleanly
    assert set(outcome.report) == {(row.probe, row.figure) for row in hostile.ROWS}
    # the daemon answered every probe, and the jobs of probe 3 reached it
    assert hostile.NO_ANSWER not in outcome.report.values()
    series = outcome.report[(hostile.P3, "series in /metrics afterwards")].value
    assert series is not None and series > 0
    lines = hostile.table(None, outcome, TINY)
    assert len(lines) == 2 + len(hostile.ROWS)
    assert all(line.count("|") == 6 and "| skipped |" in line for line in lines[2:])


def test_a_ref_the_repository_lacks_skips_the_before_side() -> None:
    with hostile.before_tree("0" * 40) as tree:
        assert tree is None

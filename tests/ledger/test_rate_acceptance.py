"""Acceptance: the run ledger measures real ``torchrun`` jobs as the jobs measure
themselves (issue 36): samples/s within 2 % of the job's own count (its samples over
its loop's elapsed time), the duration within 1 s of the job's own (from just
before its reporters were made to just after they were closed) and the step time's
p50/p95 within 2 % of its own steps' durations, for 20 s, 60 s and
3 min runs, under the daemon's default flush of 10 s, whose ticks fall anywhere in the
run (``tests/ledger/rate_job.py``: 2 ranks, gloo on CPU, each step a 50 ms sleep for
the GPU, a real MLP step and DDP's all-reduce)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.daemon import Daemon
from tests.ledger.ledger_support import (
    WORLD_SIZE,
    finish,
    launch,
    ledger_daemon,
    wait_for_record,
)

pytestmark = pytest.mark.integration

#: The daemon's default flush: the end of a run is noticed within one.
FLUSH_SECONDS = 10.0


#: The runs' lengths: a short "change one thing" run, a minute, several minutes.
RUN_SECONDS = (20.0, 60.0, 180.0)


def test_torchrun_jobs_rates_and_durations_are_their_own(
        start_daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    """The three jobs run at once on one daemon (their steps sleep for the GPU, so
    together they take the longest one's time), each its own job name."""
    ledger = tmp_path / "ledger.sqlite3"
    with ledger_daemon(start_daemon, ledger, FLUSH_SECONDS) as endpoint:
        jobs = {seconds: (f"rate-{seconds:.0f}s", tmp_path / f"results-{seconds:.0f}s")
                for seconds in RUN_SECONDS}
        launched = {seconds: launch(seconds, results, endpoint, job)
                    for seconds, (job, results) in jobs.items()}
        measured = {}
        for seconds, process in launched.items():
            job, results = jobs[seconds]
            truth = finish(process, results, timeout=seconds + 120)
            [record] = wait_for_record(ledger, job, lambda r: r.end_reason is not None,
                                       timeout=FLUSH_SECONDS + 20)
            measured[seconds] = (truth, record)
    for seconds, (truth, record) in measured.items():
        summary = record.summary
        assert (record.run, record.end_reason, record.ranks) == (
            truth.run, "finished", WORLD_SIZE), seconds
        assert (summary["steps"], summary["samples"]) == (truth.steps, truth.samples), seconds
        assert summary["samples_per_second"] == pytest.approx(
            truth.samples_per_second, rel=0.02), seconds
        assert summary["duration_seconds"] == pytest.approx(
            truth.ended - truth.started, abs=1.0), seconds
        assert record.started == pytest.approx(truth.started, abs=1.0), seconds
        assert record.ended == pytest.approx(truth.ended, abs=1.0), seconds
        # the step percentiles from the ranks' sketches (1 % relative error)
        assert summary["step_seconds_p50"] == pytest.approx(
            truth.step_percentile(0.5), rel=0.02), seconds
        assert summary["step_seconds_p95"] == pytest.approx(
            truth.step_percentile(0.95), rel=0.02), seconds
        # the spread stays around the job's rate (its windows, warm-up left out), where
        # there are windows enough for a median (a 20 s run has two or three, each at the
        # mercy of a busy machine)
        if seconds >= 60:
            assert summary["samples_per_second_median"] == pytest.approx(
                truth.samples_per_second, rel=0.05), seconds

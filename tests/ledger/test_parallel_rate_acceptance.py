"""Acceptance: the run ledger measures the 2-D parallel jobs as they measure themselves
(issue 36), as ``test_rate_acceptance.py`` does for DDP: samples/s within 2 % of the
job's own count, the duration within 1 s of its own and the step time's p50/p95 within
2 % of its own steps' durations, under the daemon's default flush of 10 s.

The jobs (``testkit.parallel_job``, healthy, CPU and gloo, about 0.25 s of sleep a step
for the GPU): ``fsdp2_tp``, 4 ranks on a 2×2 mesh (dp × tp: tensor parallel inside ranks
0-1 and 2-3, FSDP across them), and ``pipeline``, 2 stages under GPipe. They run at once
on one daemon, each its own job name, for about 25 s (``STEPS`` steps: a job of
``--max-seconds`` would let each rank decide alone when to stop, and a rank that stops
first leaves its peers in a collective).

What each job measures of itself (``parallel_job_truth``):

- **samples**: counted once per data-parallel replica. The ranks of one tensor-parallel
  group read the same rows (one data shard per ``dp`` coordinate), and so do the stages
  of a pipeline (features on the first, labels on the last): the job trains on 2 × 8
  rows a step (fsdp2_tp) or 8 (pipeline), not on the 8 rows each of its 4 or 2 ranks
  sees (counting every rank's would double the job's samples/s).
  The ledger counts a rank's samples only where the rank is the lowest of its ``tp``,
  ``pp`` and ``cp`` groups (the groups' ``root`` in its reports' ``comm_groups``).
- **samples/s**: those samples over the job's loop, from the first rank's loop start to
  the last rank's last step's end, as the ledger's active time spans its ranks' steps.
- **duration**: from just before the first reporter was made to just after the last was
  closed.
- **step p50/p95**: every rank's steps, each from the end of the previous step (the
  first from the loop's start) to the end of its ``step()``, as the client times it.

No evaluation pauses or checkpoints (no ``--confounders``): the steps are the training
steps alone. With them, an evaluation pause (after ``step()``, before the next batch)
and a save (inside ``reporter.checkpoint()``, before ``step()``) would fall inside the
next or the current step on both sides alike, the client's timing and the job's own,
since both read the clock at the end of each ``step()``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.daemon import Daemon
from testkit.parallel_launch import JobSpec, launch, world_size
from tests.ledger.ledger_support import (
    Truth,
    ledger_daemon,
    parallel_job_truth,
    wait_for_record,
)
from trainmon.ledger import RunRecord

pytestmark = pytest.mark.integration

#: The daemon's default flush: the end of a run is noticed within one.
FLUSH_SECONDS = 10.0
#: Steps of each job: about 25 s at its healthy pace.
STEPS = {"fsdp2_tp": 80, "pipeline": 90}
#: From the launch to the ranks' exit: imports, rendezvous and the steps, on a loaded
#: 2-core machine.
JOB_DEADLINE_SECONDS = 300.0


def test_2d_jobs_rates_durations_and_step_times_are_their_own(
        start_daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.sqlite3"
    with ledger_daemon(start_daemon, ledger, FLUSH_SECONDS) as endpoint:
        specs = [JobSpec(kind, job=f"rate-{kind}", extra_args=("--steps", str(steps)))
                 for kind, steps in STEPS.items()]
        jobs = [launch(spec, endpoint, tmp_path) for spec in specs]
        measured: dict[str, tuple[Truth, RunRecord]] = {}
        try:
            for job in jobs:
                codes = job.wait(JOB_DEADLINE_SECONDS)
                assert codes == (0,) * world_size(job.spec.kind), job.logs()
                truth = parallel_job_truth(job.truth())
                [record] = wait_for_record(ledger, job.spec.job_name,
                                           lambda r: r.end_reason is not None,
                                           timeout=FLUSH_SECONDS + 20)
                measured[job.spec.kind] = (truth, record)
        finally:
            for job in jobs:
                job.stop()
    for kind, (truth, record) in measured.items():
        summary = record.summary
        figures = {"ledger": {key: summary.get(key) for key in (
            "samples", "samples_per_second", "duration_seconds", "step_seconds_p50",
            "step_seconds_p95")}, "job": {
            "samples": truth.samples, "samples_per_second": truth.samples_per_second,
            "duration_seconds": truth.ended - truth.started,
            "step_seconds_p50": truth.step_percentile(0.5),
            "step_seconds_p95": truth.step_percentile(0.95)}}
        print(kind, figures)  # the figures, with -s
        assert (record.run, record.end_reason, record.ranks) == (
            truth.run, "finished", world_size(kind)), kind
        assert (summary["steps"], summary["samples"]) == (truth.steps, truth.samples), \
            (kind, figures)
        assert summary["samples_per_second"] == pytest.approx(
            truth.samples_per_second, rel=0.02), (kind, figures)
        assert summary["duration_seconds"] == pytest.approx(
            truth.ended - truth.started, abs=1.0), (kind, figures)
        assert record.started == pytest.approx(truth.started, abs=1.0), kind
        assert record.ended == pytest.approx(truth.ended, abs=1.0), kind
        assert summary["step_seconds_p50"] == pytest.approx(
            truth.step_percentile(0.5), rel=0.02), (kind, figures)
        assert summary["step_seconds_p95"] == pytest.approx(
            truth.step_percentile(0.95), rel=0.02), (kind, figures)

"""The labelled parallel jobs (``testkit.parallel_launch``) against a real daemon.

Each kind (DDP, FSDP2, FSDP2 with tensor parallelism on a 2×2 mesh, a 2-stage
pipeline, Lightning) runs healthy until every rank's steps have reached the daemon and
risen since; then a ``hang_loader`` fault on the 2-D job makes its last rank report a
stall. The ranks reach the daemon through its unix socket. Every wait is bounded and
ends as soon as what it waits for is in ``/metrics`` (or a rank has died: then its log
is the failure message).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.daemon import Daemon
from testkit.exposition import Scrape, parse
from testkit.parallel_launch import KINDS, JobSpec, RunningJob, launch, world_size

pytestmark = pytest.mark.integration

#: From the launch to every rank's first steps in /metrics (imports, rendezvous, first
#: step, first report), on a loaded 2-core machine.
STEPS_DEADLINE_SECONDS = 120.0
#: From the hang to the stall in /metrics: the watchdog's floor (10 s) plus reports.
STALL_DEADLINE_SECONDS = 45.0
POLL_SECONDS = 0.5


def wait_for_metrics(daemon: Daemon, job: RunningJob, condition: Callable[[Scrape], bool],
                     seconds: float, what: str) -> Scrape:
    """Scrape until ``condition`` holds; fail with the ranks' logs if one exits or
    ``seconds`` pass first."""
    deadline = time.monotonic() + seconds
    while True:
        scrape = parse(daemon.metrics())
        if condition(scrape):
            return scrape
        assert job.alive(), f"a rank of {job.spec.job_name} exited:\n{job.logs()}"
        assert time.monotonic() < deadline, (
            f"{job.spec.job_name}: no {what} within {seconds:.0f} s\n{job.logs()}")
        time.sleep(POLL_SECONDS)


def steps(scrape: Scrape, job: str, ranks: int) -> list[float]:
    """Each rank's ``trainmon_training_steps_total`` (0 for a rank not seen yet)."""
    return [scrape.value("trainmon_training_steps_total", job=job, rank=str(rank)) or 0.0
            for rank in range(ranks)]


@pytest.fixture
def daemon(tmp_path: Path, start_daemon: Callable[..., Daemon]) -> tuple[Daemon, str]:
    """A daemon and the endpoint of its step socket."""
    socket = tmp_path / "steps.sock"
    return (start_daemon(config={"collectors": {"training": {"socket": str(socket)}}}),
            f"unix://{socket}")


@pytest.mark.parametrize("kind", KINDS)
def test_every_rank_of_a_healthy_job_reports_its_steps(
    kind: str, daemon: tuple[Daemon, str], tmp_path: Path,
) -> None:
    server, endpoint = daemon
    spec = JobSpec(kind)
    ranks = world_size(kind)
    with launch(spec, endpoint, tmp_path) as job:
        first = steps(wait_for_metrics(
            server, job, lambda s: all(steps(s, spec.job_name, ranks)),
            STEPS_DEADLINE_SECONDS, "steps from every rank"), spec.job_name, ranks)
        wait_for_metrics(
            server, job, lambda s: all(
                now > before for now, before in zip(steps(s, spec.job_name, ranks), first,
                                                    strict=True)),
            STEPS_DEADLINE_SECONDS / 3, "more steps from every rank")
        # each rank's own account (rewritten every second) counts its steps too
        wait_for_metrics(server, job, lambda s: all(t.get("steps") for t in job.truth()),
                         STEPS_DEADLINE_SECONDS / 3, "steps in every rank's truth")


def test_a_blocked_loader_on_the_2d_job_makes_its_rank_report_a_stall(
    daemon: tuple[Daemon, str], tmp_path: Path,
) -> None:
    server, endpoint = daemon
    spec = JobSpec("fsdp2_tp", "hang_loader", fault_at=2.0)
    stalled = str(spec.rank_at_fault)
    with launch(spec, endpoint, tmp_path) as job:
        wait_for_metrics(server, job, lambda s: all(steps(s, spec.job_name, 4)),
                         STEPS_DEADLINE_SECONDS, "steps from every rank")
        scrape = wait_for_metrics(
            server, job, lambda s: s.value("trainmon_training_stalled", job=spec.job_name,
                                           rank=stalled) == 1.0,
            STALL_DEADLINE_SECONDS + spec.fault_at, f"stall of rank {stalled}")
        began = job.fault_time
    assert stalled == "3" and began is not None
    since = scrape.value("trainmon_training_stall_start_timestamp_seconds",
                         job=spec.job_name, rank=stalled)
    assert since is not None and since <= began + 1.0  # its last step came before the hang
    where = {labels["rank"]: labels["where"] for labels in scrape.labelsets(
        "trainmon_training_stall_info") if labels["job"] == spec.job_name}
    assert where[stalled] == "data_loader", where

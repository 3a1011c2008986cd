"""``idle_allocated`` and a job's team: GPUs that a job's processes hold while no rank
of it reports (NVML's process list, as ``trainmon.ledger.holding`` hands it over),
booked to the job their environment names, only for that job's owner."""

from __future__ import annotations

from pathlib import Path

import pytest

from testkit.exposition import Scrape, scrape
from tests.ledger.ledger_support import Clocks, description, make_recorder, send, step
from trainmon.ledger.holding import GpuHolding
from trainmon.ledger.recorder import MAX_IDLE_JOBS_PER_USER

TICK = 10.0
TICKS = 4


def run_ticks(clocks: Clocks, tmp_path: Path, holdings: list[GpuHolding], *,
              reporting: bool = False):  # type: ignore[no-untyped-def]
    """``TICKS`` ticks ``TICK`` s apart with ``holdings`` on the GPUs; with ``reporting``,
    rank 0 of ``resnet50`` (pid 4242, GPU 0, writer ``uid:1000``) steps meanwhile.
    The scrape after the last tick."""
    training, ledger = make_recorder(clocks, tmp_path / "ledger.sqlite3",
                                     flush_seconds=3600.0, holdings=lambda: holdings)()
    ledger.start()
    try:
        if reporting:
            send(training, description(started=clocks.wall), step(0, gpu="0"),
                 identity="uid:1000")
        ledger.tick()
        for tick in range(1, TICKS):
            clocks.advance(TICK)
            if reporting:
                send(training, step(100 * tick, gpu="0"), identity="uid:1000")
            ledger.tick()
        return scrape(ledger)
    finally:
        ledger.stop()
        training.stop()


def test_a_process_that_holds_a_gpu_and_never_reports_is_idle_allocated(
    clocks: Clocks, tmp_path: Path,
) -> None:
    notebook = GpuHolding(gpu=2, pid=5000, uid=1000, job="notebook", team="vision")
    exposition = run_ticks(clocks, tmp_path, [notebook])
    seconds = job_seconds(exposition)
    assert seconds[("notebook", "idle_allocated")] == pytest.approx((TICKS - 1) * TICK)
    assert sum(value for (job, _), value in seconds.items() if job == "notebook") \
        == pytest.approx((TICKS - 1) * TICK)
    assert exposition.value("trainmon_job_goodput_ratio", job="notebook") == 0.0
    assert exposition.value("trainmon_job_team_info", job="notebook", team="vision") == 1.0


def test_a_gpu_of_a_reporting_job_without_a_reporting_rank_is_idle_the_others_not(
    clocks: Clocks, tmp_path: Path,
) -> None:
    """Rank 0 reports from pid 4242 on GPU 0; a second process of the job (a rank
    that crashed and kept its CUDA context) holds GPU 1 and one GPU: one GPU idle."""
    holdings = [GpuHolding(gpu=0, pid=4242, uid=1000, job="resnet50", team="ml"),
                GpuHolding(gpu=1, pid=4243, uid=1000, job="resnet50", team="ml")]
    exposition = run_ticks(clocks, tmp_path, holdings, reporting=True)
    seconds = job_seconds(exposition)
    assert seconds[("resnet50", "idle_allocated")] == pytest.approx((TICKS - 1) * TICK)
    stepped = sum(value for (job, bucket), value in seconds.items()
                  if job == "resnet50" and bucket != "idle_allocated")
    assert stepped == pytest.approx((TICKS - 1) * TICK)
    assert exposition.value("trainmon_job_team_info", job="resnet50", team="ml") == 1.0


def test_a_reporting_job_without_processes_on_the_node_takes_its_owners_team(
    clocks: Clocks, tmp_path: Path,
) -> None:
    exposition = run_ticks(clocks, tmp_path, [], reporting=True)
    teams = exposition.labelsets("trainmon_job_team_info")
    assert [labels["job"] for labels in teams] == ["resnet50"]
    assert teams[0]["team"] in ("uid:1000", _user(1000))


def test_another_users_process_cannot_book_into_a_job_it_does_not_own(
    clocks: Clocks, tmp_path: Path,
) -> None:
    """uid 1001 runs a process that names resnet50, a job of uid 1000: not booked,
    counted."""
    intruder = GpuHolding(gpu=3, pid=6000, uid=1001, job="resnet50", team="other")
    exposition = run_ticks(clocks, tmp_path, [intruder], reporting=True)
    seconds = job_seconds(exposition)
    assert seconds[("resnet50", "idle_allocated")] == 0.0
    assert exposition.value("trainmon_ledger_refused_idle_gpu_seconds_total") \
        == pytest.approx((TICKS - 1) * TICK)
    assert exposition.value("trainmon_job_team_info", job="resnet50", team="other") is None


def test_one_user_books_at_most_a_few_jobs_without_reports(
    clocks: Clocks, tmp_path: Path,
) -> None:
    jobs = [f"squat-{index}" for index in range(MAX_IDLE_JOBS_PER_USER + 2)]
    holdings = [GpuHolding(gpu=index, pid=7000 + index, uid=1002, job=job, team="")
                for index, job in enumerate(jobs)]
    exposition = run_ticks(clocks, tmp_path, holdings)
    booked = {job for job, bucket in job_seconds(exposition)}
    assert booked == set(jobs[:MAX_IDLE_JOBS_PER_USER])
    assert exposition.value("trainmon_ledger_refused_idle_gpu_seconds_total") \
        == pytest.approx(2 * (TICKS - 1) * TICK)


def test_a_process_whose_environment_cannot_be_read_books_nothing(
    clocks: Clocks, tmp_path: Path,
) -> None:
    unknown = GpuHolding(gpu=0, pid=8000, uid=1000, job=None, team="")
    exposition = run_ticks(clocks, tmp_path, [unknown])
    assert job_seconds(exposition) == {}


def job_seconds(exposition: Scrape) -> dict[tuple[str, str], float]:
    """``trainmon_job_gpu_seconds_total`` by (job, bucket); every job is uid 1000's or
    1002's, the users of these tests."""
    seconds = exposition.series("trainmon_job_gpu_seconds_total", "job", "owner", "bucket")
    assert {owner for _, owner, _ in seconds} <= {"uid:1000", "uid:1002"}, seconds
    return {(job, bucket): value for (job, _, bucket), value in seconds.items()}


def _user(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid:{uid}"

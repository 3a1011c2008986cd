"""The demo jobs run through the real client and receiver and show the intended ratios."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.exposition import scrape
from trainmon.collectors.training import TrainingCollector
from trainmon.demo.jobs import DEMO_JOBS, SimulatedJob, start_demo_jobs

Make = Callable[..., TrainingCollector]


def test_demo_jobs_report_starved_and_healthy_ranks(
    make_collector: Make, socket_path: Path
) -> None:
    collector = make_collector(socket=socket_path)
    assert collector.socket_endpoint is not None
    # Same proportions as the demo, ten times faster, so the test takes seconds.
    fast = tuple(
        SimulatedJob(job.name, job.first_gpu, job.data_wait_seconds / 10,
                     job.compute_seconds / 10, job.comm_seconds / 10, job.batch_size)
        for job in DEMO_JOBS
    )
    stop = start_demo_jobs(collector.socket_endpoint, fast)
    time.sleep(3.0)
    started = time.monotonic()
    stop()
    assert time.monotonic() - started < 2.0
    result = scrape(collector)
    info = result.labelsets("trainmon_training_rank_info")
    assert sorted((labels["job"], labels["gpu"]) for labels in info) == [
        *(("demo-healthy", str(gpu)) for gpu in range(4, 8)),
        *(("demo-starved", str(gpu)) for gpu in range(4)),
    ]
    for job in DEMO_JOBS:
        for rank in range(4):
            labels = {"job": job.name, "rank": str(rank)}
            ratio = result.value("trainmon_training_data_wait_ratio", **labels)
            assert ratio == pytest.approx(job.data_wait_ratio, abs=0.06), labels
            steps = result.value("trainmon_training_steps_total", **labels)
            assert steps is not None and steps > 20
            comm = result.value("trainmon_training_phase_seconds_total", phase="comm", **labels)
            assert comm is not None and comm > 0
    assert DEMO_JOBS[0].data_wait_ratio == pytest.approx(0.35)

"""``idle_allocated`` end to end: a process that holds a GPU (the fake
libnvidia-ml.so.1 lists it) and names a job in its environment, and never
reports, is booked to that job by ``trainmon serve`` (docs/metrics.md, "Goodput")."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from testkit.daemon import Daemon
from testkit.exposition import parse
from trainmon.training.writers import uid_writer

pytestmark = pytest.mark.integration

StartDaemon = Callable[..., Daemon]
DEADLINE_SECONDS = 20.0


@pytest.fixture
def notebook() -> Iterator[subprocess.Popen[bytes]]:
    """A process of job ``notebook`` (``TRAINMON_JOB``) that just waits."""
    process = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
        env={**os.environ, "TRAINMON_JOB": "notebook"})
    yield process
    process.kill()
    process.wait()


def test_a_gpu_held_by_a_process_that_never_reports_is_idle_allocated(
    start_daemon: StartDaemon, gpu_env: Callable[..., dict[str, str]],
    notebook: subprocess.Popen[bytes],
) -> None:
    env = gpu_env(f"gpus 2\nprocess 1 {notebook.pid} 1073741824\n")
    daemon = start_daemon(config={"collectors": {
        "gpu": {"process_interval_seconds": 1, "sample_interval_seconds": 0.5},
        "ledger": {"flush_seconds": 0.2}}}, env=env)
    deadline = time.monotonic() + DEADLINE_SECONDS
    while True:
        scrape = parse(daemon.metrics())
        seconds = {(job, bucket): value for (job, owner, bucket), value in scrape.series(
            "trainmon_job_gpu_seconds_total", "job", "owner", "bucket").items()
            if owner == uid_writer(os.geteuid())}  # the user who runs the process
        if seconds.get(("notebook", "idle_allocated"), 0.0) >= 2.0:
            break
        assert time.monotonic() < deadline, daemon.log()
        time.sleep(0.2)
    assert sum(value for (job, _), value in seconds.items() if job == "notebook") \
        == seconds[("notebook", "idle_allocated")]
    assert scrape.value("trainmon_job_goodput_ratio", job="notebook") == 0.0
    teams = [labels["team"] for labels in scrape.labelsets("trainmon_job_team_info")
             if labels["job"] == "notebook"]
    assert teams == ["root"]  # the user who runs it: no pod, no Slurm account

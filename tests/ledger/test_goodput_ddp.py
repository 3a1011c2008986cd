"""The goodput ledger on a real ``torch.distributed`` job (CPU, gloo, 2 processes)
against the truth the job measured on its own clock (``testkit/ddp_job.py goodput``).

Each step: 60 ms of device time, and a Dataset that sleeps 2.5 ms per sample (8 a
batch, about a quarter of the step); a checkpoint save of 0.5 s every 40 steps; rank
1 hangs 20 s at step 100 while rank 0 waits for it in the all-reduce. The daemon's
``trainmon_job_gpu_seconds_total{job}`` after the run ended must hold, for the two
ranks together, every bucket within 5 % of the allocated GPU-seconds of the truth
(``startup``: reporter start to first step; ``data_wait``: time blocked in the
loader's ``next()``; ``checkpoint``: the saves; ``stalled``: the hang, on both ranks),
the buckets must add up to the ranks' lifetimes within 1 %, and the run's ledger
record must say the same. Exposed communication has no truth apart from the
reporter's own measurement: what the ranks reported, less the hang that rank 0
waited out in the all-reduce (a stall, not communication).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.daemon import Daemon, free_port
from testkit.exposition import parse

REPO_ROOT = Path(__file__).resolve().parents[2]
JOB = "goodput"
JOB_DEADLINE_SECONDS = 240.0
END_DEADLINE_SECONDS = 30.0

pytestmark = pytest.mark.integration


def run_job(directory: Path, socket: str) -> list[dict[str, object]]:
    """Both ranks to the end; what each wrote with ``--result``."""
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "GLOO_SOCKET_IFNAME": "lo",
           "TRAINMON_ENDPOINT": f"unix://{socket}", "TRAINMON_JOB": JOB,
           "PYTHONPATH": os.pathsep.join(
               [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    processes, results, logs = [], [], []
    for rank in (0, 1):
        result, log = directory / f"result-{rank}.json", directory / f"rank-{rank}.log"
        results.append(result)
        logs.append(log)
        processes.append(subprocess.Popen(
            [sys.executable, "-m", "testkit.ddp_job", "goodput", "--output", str(directory),
             "--result", str(result)],
            cwd=REPO_ROOT, env={**env, "RANK": str(rank)}, stdout=log.open("wb"),
            stderr=subprocess.STDOUT))
    try:
        for process, log in zip(processes, logs, strict=True):
            assert process.wait(JOB_DEADLINE_SECONDS) == 0, log.read_text(errors="replace")
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    return [json.loads(path.read_text()) for path in results]


def booked_after_the_end(daemon: Daemon) -> dict[str, float]:
    """The job's GPU-seconds per bucket once the ledger has closed its run."""
    deadline = time.monotonic() + END_DEADLINE_SECONDS
    while True:
        scrape = parse(daemon.metrics())
        if any(labels.get("job") == JOB for labels in scrape.labelsets(
                "trainmon_training_run_end_timestamp_seconds")):
            break
        assert time.monotonic() < deadline, daemon.log()
        time.sleep(0.2)
    return {bucket: value for (job, bucket), value in scrape.series(
        "trainmon_job_gpu_seconds_total", "job", "bucket").items() if job == JOB}


def test_each_bucket_of_a_real_ddp_job_is_within_5_percent_of_its_truth(
    tmp_path: Path, start_daemon: Callable[..., Daemon],
) -> None:
    socket = str(tmp_path / "steps.sock")
    daemon = start_daemon(config={"collectors": {
        "training": {"socket": socket}, "ledger": {"flush_seconds": 1.0}}})
    ranks = run_job(tmp_path, socket)
    booked = booked_after_the_end(daemon)
    truths = [rank["truth"] for rank in ranks]
    truth = {key: sum(float(t[key]) for t in truths) for key in truths[0]}  # type: ignore[index]
    held = truth.pop("held")
    allocated = sum(booked.values())
    assert allocated == pytest.approx(held, rel=0.01), f"{booked} {truth} held {held}"
    # Rank 0 reports the hang's 20 s as exposed communication (it waited in the
    # all-reduce); the ledger books them as the stall they are, on both ranks.
    reported = sum(float(rank["comm_exposed"] or 0.0) for rank in ranks)  # type: ignore[arg-type]
    truth["comm_exposed"] = max(reported - float(truths[1]["stalled"]), 0.0)  # type: ignore[index]
    truth["productive"] = held - sum(truth.values())
    for bucket, seconds in truth.items():
        assert abs(booked[bucket] - seconds) <= 0.05 * held, (bucket, booked, truth)
    for bucket in ("straggler_wait", "idle_allocated", "lost_progress"):
        assert booked[bucket] == 0.0
    assert booked["other"] <= 0.05 * held
    status, body = daemon.get(f"/api/v1/runs?job={JOB}")
    assert status == 200, body
    [record] = json.loads(body)
    assert sum(record["summary"]["gpu_seconds"].values()) == pytest.approx(allocated, rel=0.01)
    assert record["summary"]["goodput_ratio"] == pytest.approx(
        booked["productive"] / allocated, abs=0.01)

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

The second test crashes a run of another job and restarts it from its checkpoint, as
torchrun's ``--max-restarts`` would: its docstring says how.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from testkit.daemon import Daemon, free_port
from testkit.exposition import Scrape, parse

REPO_ROOT = Path(__file__).resolve().parents[2]
JOB = "goodput"
JOB_DEADLINE_SECONDS = 240.0
END_DEADLINE_SECONDS = 30.0

pytestmark = pytest.mark.integration


def run_job(directory: Path, socket: str, *, job: str = JOB, name: str = "job",
            options: Sequence[str] = (), env: Mapping[str, str] | None = None,
            returncode: int = 0) -> list[dict[str, Any]]:
    """Both ranks of a run of ``job`` to their end, which must be exit status
    ``returncode``; what each wrote with ``--result`` (files named after ``name``)."""
    environ = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(free_port()), "GLOO_SOCKET_IFNAME": "lo",
               "TRAINMON_ENDPOINT": f"unix://{socket}", "TRAINMON_JOB": job,
               "PYTHONPATH": os.pathsep.join(
                   [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
               **(env or {})}
    processes, results, logs = [], [], []
    for rank in (0, 1):
        result, log = directory / f"{name}-result-{rank}.json", directory / f"{name}-{rank}.log"
        results.append(result)
        logs.append(log)
        processes.append(subprocess.Popen(
            [sys.executable, "-m", "testkit.ddp_job", "goodput", "--output", str(directory),
             "--result", str(result), *options],
            cwd=REPO_ROOT, env={**environ, "RANK": str(rank)}, stdout=log.open("wb"),
            stderr=subprocess.STDOUT))
    try:
        for process, log in zip(processes, logs, strict=True):
            assert process.wait(JOB_DEADLINE_SECONDS) == returncode, \
                log.read_text(errors="replace")
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    return [json.loads(path.read_text()) for path in results]


def scrape_after_the_ends(daemon: Daemon, job: str, ends: Mapping[str, str] | None = None,
                          ) -> Scrape:
    """The first scrape after the ledger closed ``job``'s runs ``ends`` (run -> its end
    reason), or any run of it when None."""
    deadline = time.monotonic() + END_DEADLINE_SECONDS
    while True:
        scrape = parse(daemon.metrics())
        ended = {labels["run"]: labels["reason"] for labels in scrape.labelsets(
            "trainmon_training_run_end_timestamp_seconds") if labels.get("job") == job}
        if ended if ends is None else ends.items() <= ended.items():
            return scrape
        assert time.monotonic() < deadline, (ended, daemon.log())
        time.sleep(0.2)


def job_seconds(scrape: Scrape, job: str) -> dict[str, float]:
    """``job``'s GPU-seconds per bucket in ``scrape``."""
    return {bucket: value for (name, _, bucket), value in scrape.series(
        "trainmon_job_gpu_seconds_total", "job", "owner", "bucket").items() if name == job}


def booked_after_the_end(daemon: Daemon) -> dict[str, float]:
    """The job's GPU-seconds per bucket once the ledger has closed its run."""
    return job_seconds(scrape_after_the_ends(daemon, JOB), JOB)


def test_each_bucket_of_a_real_ddp_job_is_within_5_percent_of_its_truth(
    tmp_path: Path, start_daemon: Callable[..., Daemon],
) -> None:
    socket = str(tmp_path / "steps.sock")
    daemon = start_daemon(config={"collectors": {
        "training": {"socket": socket}, "ledger": {"flush_seconds": 1.0}}})
    ranks = run_job(tmp_path, socket)
    booked = booked_after_the_end(daemon)
    truths = [rank["truth"] for rank in ranks]
    truth = {key: sum(float(t[key]) for t in truths) for key in truths[0]}
    held = truth.pop("held")
    allocated = sum(booked.values())
    assert allocated == pytest.approx(held, rel=0.01), f"{booked} {truth} held {held}"
    # Rank 0 reports the hang's 20 s as exposed communication (it waited in the
    # all-reduce); the ledger books them as the stall they are, on both ranks.
    reported = sum(float(rank["comm_exposed"] or 0.0) for rank in ranks)
    truth["comm_exposed"] = max(reported - float(truths[1]["stalled"]), 0.0)
    truth["productive"] = held - sum(truth.values())
    for bucket, seconds in truth.items():
        assert abs(booked[bucket] - seconds) <= 0.05 * held, (bucket, booked, truth)
    for bucket in ("idle_allocated", "lost_progress"):
        assert booked[bucket] == 0.0
    # Both ranks do the same work: what one waits for the other is their noise, small
    # (a busy machine's scheduler makes it a few seconds of two minutes), and it is
    # carved out of the exposed communication they reported, never added to it.
    assert booked["straggler_wait"] <= 0.05 * held
    assert abs(booked["straggler_wait"] + booked["comm_exposed"] - truth["comm_exposed"]) \
        <= 0.05 * held, (booked, truth)
    assert booked["other"] <= 0.05 * held
    status, body = daemon.get(f"/api/v1/runs?job={JOB}")
    assert status == 200, body
    [record] = json.loads(body)
    assert sum(record["summary"]["gpu_seconds"].values()) == pytest.approx(allocated, rel=0.01)
    assert record["summary"]["goodput_ratio"] == pytest.approx(
        booked["productive"] / allocated, abs=0.01)


RESTART_JOB = "goodput-restart"
#: torchrun's id of the job: its relaunch keeps it and counts TORCHELASTIC_RESTART_COUNT,
#: which the client appends (a run of its own: ``<id>.1``).
ELASTIC_RUN = "ddp-restart"
STEPS, CHECKPOINT_EVERY, CRASH_AFTER = 60, 20, 55
RESTART_OPTIONS = ("--steps", str(STEPS), "--checkpoint-every", str(CHECKPOINT_EVERY),
                   "--checkpoint-seconds", "0.3", "--stall-at", "0")


def test_a_restart_from_the_checkpoint_books_the_redone_steps_as_lost_progress(
    tmp_path: Path, start_daemon: Callable[..., Daemon],
) -> None:
    """A crash, then the relaunch that redoes the steps since the last checkpoint.

    The job of the first test without its hang (``testkit/ddp_job.py goodput``), 60
    steps, a checkpoint save of 0.3 s every 20 steps, saved with its step. The first run
    (``TORCHELASTIC_RUN_ID`` ``ddp-restart``) raises in both ranks after step 55,
    uncaught: both exit 1, and their reporters close ``crashed`` at exit. At once its
    relaunch (``TORCHELASTIC_RESTART_COUNT=1``, as torchrun's ``--max-restarts`` sets
    it: run ``ddp-restart.1``) loads the checkpoint of step 40 and trains steps 41-60,
    so each rank redoes 15 steps.

    Truth, on the job's clock, for both runs and both ranks: ``lost_progress`` is the
    productive time of the relaunch's first 15 steps per rank (each step's wall time
    less its data wait, its save and the exposed communication its reporter measured);
    ``startup``, ``data_wait``, ``checkpoint`` and ``comm_exposed`` as in the first
    test; ``other`` the time from a rank's last step to its end (its reporter closed:
    at exit, for the crash); no stall, no straggler (both ranks do the same work), no
    idle GPU; ``productive`` the rest of the allocated time, the ranks' lifetimes
    summed. Each bucket of ``trainmon_job_gpu_seconds_total`` must be within 5 % of
    the allocated time of its truth, their sum within 1 % of it, and
    ``trainmon_job_goodput_ratio`` within 0.05 of productive ÷ allocated: its
    10-minute window holds every booking of the job since the daemon started, i.e.
    both runs (between them no rank reports, nothing is booked). The relaunch's ledger
    record carries the ``lost_progress``, the crashed run's none.
    """
    socket = str(tmp_path / "steps.sock")
    daemon = start_daemon(config={"collectors": {
        "training": {"socket": socket}, "ledger": {"flush_seconds": 1.0}}})
    crashed = run_job(tmp_path, socket, job=RESTART_JOB, name="crash", returncode=1,
                      options=(*RESTART_OPTIONS, "--crash-after", str(CRASH_AFTER)),
                      env={"TORCHELASTIC_RUN_ID": ELASTIC_RUN,
                           "TORCHELASTIC_RESTART_COUNT": "0"})
    restarted = run_job(tmp_path, socket, job=RESTART_JOB, name="restart",
                        options=(*RESTART_OPTIONS, "--resume"),
                        env={"TORCHELASTIC_RUN_ID": ELASTIC_RUN,
                             "TORCHELASTIC_RESTART_COUNT": "1"})
    relaunch = f"{ELASTIC_RUN}.1"
    scrape = scrape_after_the_ends(daemon, RESTART_JOB,
                                   {ELASTIC_RUN: "crashed", relaunch: "finished"})
    booked = job_seconds(scrape, RESTART_JOB)
    saved_at = CRASH_AFTER // CHECKPOINT_EVERY * CHECKPOINT_EVERY
    assert [rank["last_step"] for rank in crashed] == [CRASH_AFTER] * 2
    assert [(rank["resumed_from"], rank["last_step"]) for rank in restarted] == [
        (saved_at, STEPS)] * 2
    ranks = crashed + restarted
    truths: list[dict[str, float]] = [rank["truth"] for rank in ranks]
    held = sum(t["held"] for t in truths)
    truth = {bucket: sum(t[bucket] for t in truths)
             for bucket in ("data_wait", "checkpoint", "stalled", "other", "startup")}
    truth["comm_exposed"] = sum(float(rank["comm_exposed"] or 0.0) for rank in ranks)
    lost = sum(sum(rank["step_productive"][:CRASH_AFTER - saved_at]) for rank in restarted)
    truth["lost_progress"] = lost
    truth["productive"] = held - sum(truth.values())
    truth["straggler_wait"] = truth["idle_allocated"] = 0.0

    status, body = daemon.get(f"/api/v1/runs?job={RESTART_JOB}")
    assert status == 200, body
    records = {record["run"]: record for record in json.loads(body)}
    assert records.keys() == {ELASTIC_RUN, relaunch}
    crash, redo = records[ELASTIC_RUN], records[relaunch]
    assert (crash["end_reason"], redo["end_reason"]) == ("crashed", "finished")
    assert crash["summary"]["gpu_seconds"]["lost_progress"] == 0.0
    assert sum(crash["summary"]["gpu_seconds"].values()) == pytest.approx(
        sum(t["held"] for t in truths[:2]), rel=0.01)
    assert redo["summary"]["gpu_seconds"]["lost_progress"] == pytest.approx(
        booked["lost_progress"], rel=1e-6)
    assert booked["lost_progress"] > 0.5 * lost, (booked, truth)  # not the tolerance alone
    assert booked.keys() == truth.keys()
    for bucket, seconds in truth.items():
        assert abs(booked[bucket] - seconds) <= 0.05 * held, (bucket, booked, truth)
    allocated = sum(booked.values())
    assert allocated == pytest.approx(held, rel=0.01), f"{booked} {truth} held {held}"
    ratio = scrape.value("trainmon_job_goodput_ratio", job=RESTART_JOB)
    assert ratio == pytest.approx(truth["productive"] / held, abs=0.05), (ratio, truth, held)

"""How a run ended, as the daemon stores it: ``finished``, ``crashed``, ``preempted``
(``trainmon.client.ending``; issue 23, item 3).

Real training processes (``ending_job``: torch, the real client, real launches
with ``torch.multiprocessing.spawn`` and real signals) report over the unix
socket to a real ``TrainingCollector``; the tests read the run description the
daemon stored for each rank, the totals it counted and the process's exit
status.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.daemon import free_port
from trainmon.client import Reporter
from trainmon.client.reporter import CLOSE_TIMEOUT_SECONDS
from trainmon.collectors.training import TrainingCollector
from trainmon.training.store import DescribedRank

pytest.importorskip("torch")

Make = Callable[..., TrainingCollector]
ROOT = Path(__file__).parents[2]
JOB = "ending"
BATCH = 16  # ending_job.BATCH
#: Bound on waiting for what a process sent to be stored (ends at arrival).
ARRIVAL_SECONDS = 10.0


def job_env(socket_path: Path, run: str) -> dict[str, str]:
    return {**os.environ, "TRAINMON_ENDPOINT": f"unix://{socket_path}",
            "TRAINMON_RUN_ID": run, "PYTHONPATH": str(ROOT)}


def run_job(mode: str, socket_path: Path, run: str,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.client.ending_job", mode], cwd=ROOT,
        env={**job_env(socket_path, run), **(env or {})}, capture_output=True, text=True,
        timeout=180,
    )


def start_job(mode: str, socket_path: Path, run: str) -> subprocess.Popen[str]:
    """A job that runs until signalled; returns once it printed ``ready``."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.client.ending_job", mode], cwd=ROOT,
        env=job_env(socket_path, run), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()  # blocks until the job's reporter runs
    if line.strip() != "ready":
        process.kill()
        raise AssertionError(f"job did not start: {line!r} {process.communicate()}")
    return process


def stored_end(collector: TrainingCollector, rank: int = 0) -> DescribedRank:
    """The description the daemon stored for ``rank`` once one says how the run ended."""
    deadline = time.monotonic() + ARRIVAL_SECONDS
    while True:
        described = collector.store.snapshot().descriptions.get((JOB, rank))
        if described is not None and described.description.ended is not None:
            return described
        if time.monotonic() > deadline:
            raise AssertionError(f"rank {rank}: no ended description, latest {described}")
        time.sleep(0.02)


def samples_of(collector: TrainingCollector, rank: int = 0) -> tuple[int, int]:
    [view] = [view for view in collector.store.snapshot().ranks
              if (view.job, view.rank) == (JOB, rank)]
    return view.totals.steps, view.totals.samples


def test_an_uncaught_exception_ends_the_run_crashed(make_collector: Make,
                                                    socket_path: Path) -> None:
    collector = make_collector(socket=socket_path)
    result = run_job("crash", socket_path, "crash-1")
    assert result.returncode == 1 and "RuntimeError: loss is NaN" in result.stderr
    described = stored_end(collector)
    assert (described.description.run, described.description.ended) == ("crash-1", "crashed")
    assert samples_of(collector) == (2, 2 * BATCH)  # (x, y) counted by x.shape[0]


def test_a_clean_exit_without_close_ends_the_run_finished(make_collector: Make,
                                                          socket_path: Path) -> None:
    collector = make_collector(socket=socket_path)
    result = run_job("forget", socket_path, "clean-1")
    assert result.returncode == 0, result.stderr
    assert stored_end(collector).description.ended == "finished"
    assert samples_of(collector) == (3, 3 * BATCH)


@pytest.mark.parametrize("mode", ["sigterm", "sigterm-stuck"])
def test_sigterm_ends_the_run_preempted_and_the_process_still_dies_by_it(
    make_collector: Make, socket_path: Path, mode: str,
) -> None:
    collector = make_collector(socket=socket_path)
    process = start_job(mode, socket_path, "spot-1")
    try:
        process.send_signal(signal.SIGTERM)
        # "sigterm-stuck" sits in one C call for minutes: only the wakeup-fd
        # watcher can end it within the bound
        process.wait(timeout=CLOSE_TIMEOUT_SECONDS + 10)
    finally:
        process.kill()
        process.communicate()
    assert process.returncode == -signal.SIGTERM
    assert stored_end(collector).description.ended == "preempted"


def test_the_programs_own_sigterm_handler_runs_and_the_run_says_preempted(
    make_collector: Make, socket_path: Path,
) -> None:
    collector = make_collector(socket=socket_path)
    process = start_job("sigterm-handler", socket_path, "spot-2")
    try:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert (process.returncode, out.strip()) == (0, "stopped by the handler"), err
    # the handler let the loop end and the with block close cleanly: still preempted
    assert stored_end(collector).description.ended == "preempted"


def test_a_forked_child_killed_by_sigterm_leaves_the_parents_run_alone(
    make_collector: Make, socket_path: Path,
) -> None:
    collector = make_collector(socket=socket_path)
    result = run_job("fork-sigterm", socket_path, "fork-1")
    # the child, signalled at once after fork(), dies by the default action; the
    # parent is neither woken, closed nor killed by the child's SIGTERM
    assert (result.returncode, result.stdout.strip()) == (0, "child ended by signal 15")
    assert stored_end(collector).description.ended == "finished"
    assert samples_of(collector) == (3, 3 * BATCH)


def test_a_dying_training_thread_ends_only_its_reporters_run(make_collector: Make,
                                                             socket_path: Path) -> None:
    collector = make_collector(socket=socket_path)
    result = run_job("thread-crash", socket_path, "threads-1")
    assert result.returncode == 0 and "the data thread's loader broke" in result.stderr
    assert stored_end(collector, rank=1).description.ended == "crashed"
    assert stored_end(collector, rank=0).description.ended == "finished"
    assert samples_of(collector, rank=0) == (3, 3 * BATCH)


@pytest.mark.integration
def test_a_rank_raising_in_backward_under_mp_spawn_ends_crashed(
    make_collector: Make, socket_path: Path,
) -> None:
    collector = make_collector(socket=socket_path)
    result = run_job("spawn-crash", socket_path, "spawn-1",
                     env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
    assert result.returncode == 1, result.stderr
    assert "illegal memory access (simulated)" in result.stdout  # what mp.spawn raised
    failed = stored_end(collector, rank=1).description
    assert (failed.run, failed.ended) == ("spawn-1", "crashed")
    assert samples_of(collector, rank=1) == (2, 2 * BATCH)
    # rank 0 waits on rank 1 in the all-reduce: gloo fails it (crashed), or
    # mp.spawn terminates it first (SIGTERM: preempted); never a clean end
    assert stored_end(collector, rank=0).description.ended in ("crashed", "preempted")


# -- close() and with, in process ---------------------------------------------------


def test_close_and_with_say_how_the_run_ended(make_collector: Make,
                                              socket_path: Path) -> None:
    collector = make_collector(socket=socket_path)
    endpoint = f"unix://{socket_path}"

    def reporter(rank: int) -> Reporter:
        return Reporter(JOB, rank=rank, world_size=4, endpoint=endpoint, environ={},
                        run="in-process", interval_seconds=60)

    reporter(0).close()
    reporter(1).close(finished=False)
    with pytest.raises(SystemExit), reporter(2):
        raise SystemExit(0)  # a clean exit through the with block
    with pytest.raises(KeyError), reporter(3):
        raise KeyError("lr")
    assert [stored_end(collector, rank).description.ended for rank in range(4)] == [
        "finished", "crashed", "finished", "crashed"]


def test_close_refuses_an_unknown_reason(tmp_path: Path) -> None:
    reporter = Reporter(JOB, endpoint=f"unix://{tmp_path}/none.sock", environ={})
    with pytest.raises(ValueError, match="finished, crashed, preempted"):
        reporter.close(ended="lost")  # the daemon's conclusion, not the client's
    reporter.close(ended="preempted")

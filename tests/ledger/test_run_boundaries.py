"""A run's boundaries and rate are the job's own, whenever the ledger's ticks fall: it
starts when its reporter did, ends at its last report, and its samples/s is its samples
over the time from its first step's start to its last step's end, the partial windows
weighed by their real length (docs/runs.md, "Duration and samples/s").

Each test drives a job of ranks that step back to back, as the client times them, and
report every second, against a recorder whose flush ticks fall where they may."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.ledger.ledger_support import (
    Clocks,
    description,
    make_recorder,
    only_record,
    send,
    step,
)
from trainmon.ledger import Ledger

#: Time resolution of the simulation (s).
TICK = 0.05
REPORT_SECONDS = 1.0
FLUSH_SECONDS = 10.0


@dataclass
class Job:
    """Ranks that step back to back from ``loop_start``, the first step ``warmup``
    seconds long and the others ``step_seconds``, each step of ``samples`` samples per
    rank; the reporter reports every ``REPORT_SECONDS``."""

    started: float
    loop_start: float
    ranks: int = 2
    step_seconds: float = 0.25
    warmup: float = 1.5
    samples: int = 16
    run: str = "run-a"
    steps: int = 0
    last_step: float | None = None
    #: (rank, where, since) of the stall reports to send with each report.
    stalls: list[tuple[int, str, float]] = field(default_factory=list)

    def step_end(self, index: int) -> float:
        """When step ``index`` (1-based) ends."""
        return self.loop_start + self.warmup + (index - 1) * self.step_seconds

    def advance_to(self, now: float) -> None:
        while self.step_end(self.steps + 1) <= now + 1e-9:
            self.steps += 1
            self.last_step = self.step_end(self.steps)

    def lines(self, **changes: object) -> list[dict[str, object]]:
        stepped: dict[str, object] = {**changes} if self.last_step is None else {
            "step_seconds": self.last_step - self.loop_start, "last_step_time": self.last_step,
            **changes}
        lines = [step(self.steps, rank=rank, world_size=self.ranks, reporter_id=f"{rank:016x}",
                      run=self.run, samples=self.steps * self.samples,
                      **stepped)  # type: ignore[arg-type]
                 for rank in range(self.ranks)]
        for rank, where, since in self.stalls:
            lines.append({"v": 1, "type": "stall", "job": "resnet50", "rank": rank,
                          "world_size": self.ranks, "reporter_id": f"{rank:016x}",
                          "run": self.run, "steps": self.steps, "since": since,
                          "where": where, "frames": [{"file": "/work/train.py", "line": 7,
                                                      "function": "main"}]})
        return lines

    def describe(self, **changes: object) -> list[dict[str, object]]:
        return [description(rank=rank, world_size=self.ranks, reporter_id=f"{rank:016x}",
                            run=self.run, started=self.started, **changes)
                for rank in range(self.ranks)]

    def samples_per_second(self) -> float:
        """What the job itself prints: its samples over its loop's elapsed time."""
        assert self.last_step is not None
        return self.ranks * self.steps * self.samples / (self.last_step - self.loop_start)


class Node:
    """A recorder ticking every ``FLUSH_SECONDS`` from ``tick_offset`` on the shared clocks,
    and the job's reporter reporting every ``REPORT_SECONDS``."""

    def __init__(self, clocks: Clocks, path: Path, *, tick_offset: float = 3.7,
                 **settings: object) -> None:
        self.clocks = clocks
        self.make = make_recorder(clocks, path, flush_seconds=3600.0,
                                  **settings)  # type: ignore[arg-type]
        self.training, self.ledger = self.make()
        self.ledger.start()
        self.next_tick = clocks.wall + tick_offset
        #: Wall time of the job's latest report.
        self.last_report = clocks.wall

    def restart(self) -> None:
        """The daemon stops and a new one starts, with an empty training store."""
        self.ledger.stop()
        self.training, self.ledger = self.make()
        self.ledger.start()

    def run(self, job: Job, until: float, *, reporting: bool = True) -> None:
        """Let the job step (and report, unless ``reporting`` is False) until wall time
        ``until``, the ledger ticking on."""
        next_report = self.clocks.wall
        while self.clocks.wall < until - 1e-9:
            self.clocks.advance(TICK)
            job.advance_to(self.clocks.wall)
            if reporting and self.clocks.wall >= next_report - 1e-9:
                send(self.training, *job.lines())
                self.last_report = self.clocks.wall
                next_report = self.clocks.wall + REPORT_SECONDS
            if self.clocks.wall >= self.next_tick - 1e-9:
                self.ledger.tick()
                self.next_tick += FLUSH_SECONDS

    def idle(self, seconds: float) -> None:
        """Nothing reports for ``seconds``; the ledger ticks on."""
        until = self.clocks.wall + seconds
        while self.clocks.wall < until - 1e-9:
            self.clocks.advance(TICK)
            if self.clocks.wall >= self.next_tick - 1e-9:
                self.ledger.tick()
                self.next_tick += FLUSH_SECONDS


def start_job(node: Node, *, startup: float = 0.4, **settings: object) -> Job:
    """A reporter made now that describes its run; its loop starts ``startup`` later."""
    clocks = node.clocks
    job = Job(started=clocks.wall, loop_start=clocks.wall + startup, **settings)  # type: ignore[arg-type]
    send(node.training, *job.describe(), *job.lines())
    return job


def close(node: Node, job: Job, ended: str = "finished") -> float:
    """``reporter.close()`` on every rank: the final totals, then the ended description;
    the time it was called."""
    send(node.training, *job.lines(), *job.describe(ended=ended))
    return node.clocks.wall


@pytest.fixture
def path(tmp_path: Path) -> Path:
    """The ledger's file."""
    return tmp_path / "ledger.sqlite3"


@pytest.mark.parametrize("seconds", [20.0, 60.0, 600.0])
def test_a_finished_run_lasts_and_steps_as_long_as_the_job_says(
        clocks: Clocks, path: Path, seconds: float) -> None:
    """20 s, 60 s and 10 min loops: the duration within 1 s, samples/s within 2 % of the
    job's own count (exact here), the windows' median too; never a whole flush tick."""
    node = Node(clocks, path)
    job = start_job(node)
    node.run(job, until=job.loop_start + seconds)
    closed = close(node, job)
    node.idle(2 * FLUSH_SECONDS)
    node.ledger.stop()
    record = only_record(path)
    assert (record.end_reason, record.started, record.ended) == ("finished", job.started,
                                                                 closed)
    summary = record.summary
    assert summary["duration_seconds"] == pytest.approx(seconds + 0.4, abs=1.0)
    assert summary["samples"] == job.ranks * job.steps * job.samples
    assert summary["samples_per_second"] == pytest.approx(job.samples_per_second(), rel=1e-6)
    assert summary["active_seconds"] == pytest.approx(job.last_step - job.loop_start)  # type: ignore[operator]
    steady = job.ranks * job.samples / job.step_seconds
    assert summary["samples_per_second_median"] == pytest.approx(steady, rel=0.02)
    assert summary["samples_per_second_p10"] == pytest.approx(steady, rel=0.02)


def test_the_partial_last_window_counts_only_the_time_training_happened(
        clocks: Clocks, path: Path) -> None:
    """The issue's 20 s run: a tick 3.7 s into the job, one 10 s later, the end 6 s
    after that. Each window's rate is the job's; none is diluted to a whole tick."""
    node = Node(clocks, path)
    job = start_job(node, warmup=0.25)  # no warm-up: every window steps at one rate
    node.run(job, until=job.loop_start + 20.0)
    close(node, job)
    node.idle(FLUSH_SECONDS)
    node.ledger.stop()
    with Ledger.open(path) as reader:
        state = reader.stored("resnet50", "run-a", "node-1")
    assert state is not None
    windows = state[1]["buckets"]
    assert isinstance(windows, list) and job.last_step is not None
    steady = job.ranks * job.samples / job.step_seconds
    assert len(windows) == 3
    assert [rate for rate, _ in windows] == pytest.approx([steady] * 3, rel=0.02)
    assert sum(length for _, length in windows) == pytest.approx(
        job.last_step - job.loop_start, abs=1e-6)


def test_a_crashed_run_ends_at_its_last_report_with_the_jobs_rate(
        clocks: Clocks, path: Path) -> None:
    """Killed at 16 s (SIGKILL: no word): the ranks go silent, the run is lost once they
    expire, ended at their last report; its rate is the job's."""
    node = Node(clocks, path)
    job = start_job(node)
    node.run(job, until=job.started + 16.0)
    last_report = node.last_report
    node.idle(61.0 + FLUSH_SECONDS)  # the training store's ttl_seconds is 60
    node.ledger.stop()
    record = only_record(path)
    assert record.end_reason == "lost"
    assert record.ended == last_report
    assert record.summary["duration_seconds"] == pytest.approx(16.0, abs=1.0)
    # the steps after its last report are the job's alone
    assert record.summary["samples_per_second"] == pytest.approx(job.samples_per_second(),
                                                                 rel=0.02)


@pytest.mark.parametrize("ended", ["crashed", "preempted"])
def test_a_run_that_said_how_it_ended_ends_when_it_said_so(
        clocks: Clocks, path: Path, ended: str) -> None:
    node = Node(clocks, path)
    job = start_job(node)
    node.run(job, until=job.started + 25.0)
    closed = close(node, job, ended)
    node.idle(FLUSH_SECONDS)
    node.ledger.stop()
    record = only_record(path)
    assert (record.end_reason, record.ended) == (ended, closed)
    assert record.summary["duration_seconds"] == pytest.approx(25.0, abs=1.0)
    assert record.summary["samples_per_second"] == pytest.approx(job.samples_per_second(),
                                                                 rel=1e-6)


def test_a_hung_run_that_is_killed_has_its_stall_closed_at_its_end(
        clocks: Clocks, path: Path) -> None:
    node = Node(clocks, path)
    job = start_job(node)
    node.run(job, until=job.started + 12.0)
    hung_at = job.last_step
    assert hung_at is not None
    job.step_seconds = 1e9  # no further step
    job.stalls = [(0, "collective", hung_at), (1, "data_loader", hung_at)]
    node.run(job, until=clocks.wall + 2 * FLUSH_SECONDS)
    stalls = only_record(path).summary["stalls"]
    assert isinstance(stalls, list) and len(stalls) == 1
    assert stalls[0]["until"] is None and stalls[0]["holds"] == "1"
    closed = close(node, job, "preempted")  # SIGTERM from the scheduler
    node.idle(FLUSH_SECONDS)
    node.ledger.stop()
    record = only_record(path)
    assert (record.end_reason, record.ended) == ("preempted", closed)
    stalls = record.summary["stalls"]
    assert isinstance(stalls, list) and len(stalls) == 1
    assert (stalls[0]["since"], stalls[0]["until"]) == (hung_at, closed)


def test_a_run_whose_reporters_vanished_while_the_daemon_was_down_is_closed_lost(
        clocks: Clocks, path: Path) -> None:
    """The daemon goes down during a hung run, the job ends meanwhile: when the daemon is
    back and no reporter continues the run within the grace (stall_seconds, 30 s here),
    it is closed lost at its last report, its stall with it."""
    node = Node(clocks, path, stall_seconds=30.0)
    job = start_job(node)
    node.run(job, until=job.started + 15.0)
    job.step_seconds = 1e9
    job.stalls = [(0, "collective", job.last_step or 0.0)]
    node.run(job, until=clocks.wall + FLUSH_SECONDS)
    node.ledger.tick()
    last_report = node.last_report
    node.ledger.stop()
    clocks.advance(600)  # down; the job died meanwhile
    node.training, node.ledger = node.make()
    node.ledger.start()
    node.next_tick = clocks.wall + 1.0
    node.idle(25.0)
    assert only_record(path).end_reason is None  # within the grace: it may still report
    assert node.ledger.health()["recording_runs"] == 0
    node.idle(10.0)
    node.ledger.stop()
    record = only_record(path)
    assert record.end_reason == "lost"
    assert record.ended == last_report
    stalls = record.summary["stalls"]
    assert isinstance(stalls, list) and len(stalls) == 1
    assert stalls[0]["until"] == record.ended
    assert record.summary["samples_per_second"] == pytest.approx(job.samples_per_second(),
                                                                 rel=1e-6)


def test_a_run_the_restarted_daemon_hears_of_again_goes_on_as_one_run(
        clocks: Clocks, path: Path) -> None:
    """The daemon restarts during the run: one record, every sample counted once, the
    job's rate and duration; not closed lost."""
    node = Node(clocks, path, stall_seconds=30.0)
    job = start_job(node)
    node.run(job, until=job.started + 23.0)
    node.restart()
    node.run(job, until=clocks.wall + 5.0, reporting=False)  # the daemon starting
    node.run(job, until=job.started + 70.0)
    closed = close(node, job)
    node.idle(FLUSH_SECONDS)
    node.ledger.stop()
    record = only_record(path)
    assert (record.end_reason, record.started, record.ended) == ("finished", job.started,
                                                                 closed)
    assert record.summary["samples"] == job.ranks * job.steps * job.samples
    assert record.summary["samples_per_second"] == pytest.approx(job.samples_per_second(),
                                                                 rel=1e-6)
    steady = job.ranks * job.samples / job.step_seconds
    assert record.summary["samples_per_second_median"] == pytest.approx(steady, rel=0.02)


def test_a_second_recorder_on_the_ledger_is_refused_and_says_who_holds_it(
        clocks: Clocks, path: Path) -> None:
    first = Node(clocks, path)
    second = Node(clocks, path)
    try:
        assert first.ledger.health()["open"] is True
        health = second.ledger.health()
        assert (health["open"], health["state"]) == (False, "degraded")
        assert "held by another trainmon daemon (pid " in str(health["ledger_error"])
        assert second.ledger.recorder.readings().up is False
        first.ledger.stop()
        clocks.advance(31)  # tried again every 30 s: the lock is free now
        second.ledger.tick()
        assert second.ledger.health()["open"] is True
    finally:
        first.ledger.stop()
        second.ledger.stop()

"""The recorder and the diagnosis' fail-slow changes: each run's ``summary.fail_slow``
from the evaluations' families (``verdict_families`` as the diagnosis exports them), one
change per rank and part while consecutive evaluations name it, for the job's owner only,
kept over a daemon restart, at most ``MAX_RECORDED_FAIL_SLOW`` of the largest."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.ledger.ledger_support import (
    WALL_START,
    Clocks,
    description,
    make_recorder,
    only_record,
    send,
    step,
)
from trainmon.collectors.diagnosis import verdict_families
from trainmon.diagnosis.finding import Finding
from trainmon.diagnosis.rules import Evidence, Verdict
from trainmon.ledger.summary import MAX_RECORDED_FAIL_SLOW, MAX_VERDICT_GAP_SECONDS
from trainmon.training.writers import LOCAL_WRITER

START = WALL_START + 5.0


def fail_slow(rank: str, ratio: float, *, part: str = "compute", cause: str = "cpu_throttled",
              kind: str = "scheduling", start: float = START) -> Finding:
    """A ``fail_slow`` finding as the diagnosis makes it."""
    return Finding(kind, "fail_slow", values={"rank": rank, "part": part, "cause": cause,
                                              "ratio": ratio, "start": start},
                   severity="warning")


def evaluation(*findings: Finding, job: str = "resnet50", owner: str = LOCAL_WRITER,
               kind: str = "compute") -> list[object]:
    """The diagnosis' families of one evaluation: ``job``'s verdict with ``findings``."""
    verdict = Verdict(job, kind, tuple(findings), Evidence())
    return verdict_families([verdict], 60.0, {job: owner})  # type: ignore[return-value]


def start_run(clocks: Clocks, training, ledger, *, job: str = "resnet50",  # type: ignore[no-untyped-def]
              run: str = "run-a", identity: str = LOCAL_WRITER) -> None:
    send(training, description(job=job, run=run), step(0, job=job, run=run), identity=identity)
    ledger.tick()
    clocks.advance(10)
    send(training, step(100, job=job, run=run), identity=identity)
    ledger.tick()


def test_a_run_records_each_change_with_its_largest_ratio_and_how_long_it_held(
        tmp_path: Path) -> None:
    clocks, path = Clocks(), tmp_path / "ledger.sqlite3"
    training, ledger = make_recorder(clocks, path, flush_seconds=3600.0)()
    ledger.start()
    start_run(clocks, training, ledger)
    ledger.observe(evaluation())  # healthy
    clocks.advance(3)
    ledger.observe(evaluation(fail_slow("1", 0.2, cause="unknown")))
    clocks.advance(3)
    ledger.observe(evaluation(fail_slow("1", 0.35)))
    clocks.advance(3)
    ledger.observe([])  # no evaluation: tells nothing, the change goes on
    ledger.tick()  # a tick between evaluations: the same change
    clocks.advance(3)
    ledger.observe(evaluation(fail_slow("1", 0.3, cause="unknown")))
    clocks.advance(100)  # a long pause counts MAX_VERDICT_GAP_SECONDS
    ledger.observe(evaluation(fail_slow("1", 0.3)))
    clocks.advance(3)
    ledger.observe(evaluation())  # over
    clocks.advance(3)
    ledger.observe(evaluation(fail_slow("", 0.5, part="data_wait", cause="data_loading",
                                        kind="storage", start=START + 40)))
    ledger.observe(evaluation(fail_slow("", 0.5, part="data_wait", cause="data_loading",
                                        kind="storage", start=START + 40),
                              job="bert"))  # a job without a run here
    clocks.advance(3)
    ledger.observe(evaluation(fail_slow("1", 0.12, start=START + 50)))  # a new change
    ledger.tick()
    ledger.stop()
    changes = only_record(path).summary["fail_slow"]
    assert changes == [
        {"rank": "1", "part": "compute", "kind": "scheduling", "cause": "cpu_throttled",
         "ratio": 0.35, "start": START, "seconds": 9.0 + MAX_VERDICT_GAP_SECONDS},
        {"rank": "", "part": "data_wait", "kind": "storage", "cause": "data_loading",
         "ratio": 0.5, "start": START + 40, "seconds": 0.0},
        {"rank": "1", "part": "compute", "kind": "scheduling", "cause": "cpu_throttled",
         "ratio": 0.12, "start": START + 50, "seconds": 0.0},
    ]


def test_a_healthy_run_records_none(tmp_path: Path) -> None:
    clocks, path = Clocks(), tmp_path / "ledger.sqlite3"
    training, ledger = make_recorder(clocks, path, flush_seconds=3600.0)()
    ledger.start()
    start_run(clocks, training, ledger)
    for _ in range(5):
        ledger.observe(evaluation())
        clocks.advance(3)
    ledger.tick()
    ledger.stop()
    assert only_record(path).summary["fail_slow"] == []


def test_a_change_counts_only_toward_the_runs_of_its_jobs_owner(tmp_path: Path) -> None:
    clocks, path = Clocks(), tmp_path / "ledger.sqlite3"
    training, ledger = make_recorder(clocks, path, flush_seconds=3600.0)()
    ledger.start()
    start_run(clocks, training, ledger, identity="uid:1000")
    start_run(clocks, training, ledger, job="bert", run="run-b", identity="token:ci")
    for _ in range(2):
        # the same job name under another owner (the diagnosis' owner label) is not theirs
        ledger.observe([*evaluation(fail_slow("1", 0.4), owner="uid:1001"),
                        *evaluation(fail_slow("0", 0.25, start=START + 1), job="bert",
                                    owner="token:ci")])
        clocks.advance(3)
    ledger.tick()
    ledger.stop()
    assert only_record(path, "resnet50").summary["fail_slow"] == []
    [bert] = only_record(path, "bert").summary["fail_slow"]
    assert (bert["rank"], bert["ratio"], bert["seconds"]) == ("0", 0.25, 3.0)


def test_the_changes_survive_a_daemon_restart(tmp_path: Path) -> None:
    clocks, path = Clocks(), tmp_path / "ledger.sqlite3"
    make = make_recorder(clocks, path, flush_seconds=3600.0)
    training, ledger = make()
    ledger.start()
    start_run(clocks, training, ledger)
    for ratio in (0.2, 0.3):
        ledger.observe(evaluation(fail_slow("1", ratio)))
        clocks.advance(3)
    ledger.tick()
    ledger.stop()
    # a new daemon: empty store and no memory of the evaluations; the job goes on
    training, ledger = make()
    ledger.start()
    clocks.advance(10)
    send(training, description(), step(200))
    ledger.tick()
    for ratio in (0.25, 0.25):  # the same change named again: one change
        ledger.observe(evaluation(fail_slow("1", ratio)))
        clocks.advance(3)
    ledger.observe(evaluation(fail_slow("", 0.15, part="comm", cause="network_errors",
                                        kind="communication", start=START + 60)))
    ledger.tick()
    ledger.stop()
    record = only_record(path)
    assert record.summary["steps"] == 200
    assert [(c["rank"], c["part"], c["ratio"], c["seconds"])
            for c in record.summary["fail_slow"]] == [
        ("1", "compute", 0.3, 6.0), ("", "comm", 0.15, 0.0)]


def test_a_run_keeps_the_largest_changes_up_to_the_bound(tmp_path: Path) -> None:
    clocks, path = Clocks(), tmp_path / "ledger.sqlite3"
    training, ledger = make_recorder(clocks, path, flush_seconds=3600.0)()
    ledger.start()
    start_run(clocks, training, ledger)
    count = MAX_RECORDED_FAIL_SLOW + 4
    for index in range(count):
        # one rank after another, each named once: a change each
        ledger.observe(evaluation(fail_slow(str(index), 0.1 + index / 100,
                                            start=START + index)))
        clocks.advance(3)
        if index % 3 == 0:
            ledger.tick()
    ledger.tick()
    ledger.stop()
    changes = only_record(path).summary["fail_slow"]
    assert [c["rank"] for c in changes] == [str(i) for i in range(4, count)]
    assert [c["start"] for c in changes] == sorted(c["start"] for c in changes)
    assert min(c["ratio"] for c in changes) == pytest.approx(0.14)

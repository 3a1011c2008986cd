"""The recorder and writer identities: each run is recorded with the identity owning its
job, and a user who re-uses another user's job name and run id after that job expired
cannot resume or overwrite the old record."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from testkit.exposition import scrape
from tests.ledger.ledger_support import Clocks, description, make_recorder, only, send, step
from trainmon.collectors.ledger import LedgerCollector
from trainmon.collectors.training import TrainingCollector
from trainmon.ledger import Ledger, RecordUpdate, RunRecord
from trainmon.ledger.holding import owner_team


def test_each_run_is_recorded_with_its_owner(tmp_path: Path) -> None:
    clocks = Clocks()
    path = tmp_path / "ledger.sqlite3"
    training, ledger = make_recorder(clocks, path, flush_seconds=3600.0)()
    ledger.start()
    send(training, description(), step(0), identity="uid:1000")
    send(training, description(job="bert", run="run-b"), step(0, job="bert", run="run-b"),
         identity="token:ci")
    ledger.tick()
    clocks.advance(10)
    send(training, step(100), identity="uid:1000")
    ledger.tick()
    ledger.stop()
    with Ledger.open(path) as reader:
        owners = {(r.job, r.run): r.owner for r in reader.runs()}
        [resnet] = reader.runs(job="resnet50")
    assert owners == {("resnet50", "run-a"): "uid:1000", ("bert", "run-b"): "token:ci"}
    assert resnet.to_json()["owner"] == "uid:1000" and resnet.summary["steps"] == 100
    assert scrape(ledger).value("trainmon_ledger_refused_runs_total") == 0.0


def test_a_reused_job_and_run_id_cannot_rewrite_another_users_record(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clocks = Clocks()
    path = tmp_path / "ledger.sqlite3"
    make = make_recorder(clocks, path, flush_seconds=3600.0)
    training, ledger = make()
    ledger.start()
    send(training, description(), step(0), identity="uid:1000")
    ledger.tick()
    for index in range(1, 4):
        clocks.advance(10)
        send(training, step(index * 100), identity="uid:1000")
        ledger.tick()
    send(training, description(ended="finished"), identity="uid:1000")
    ledger.tick()
    ledger.stop()
    with Ledger.open(path) as reader:
        original = only(reader.runs())
    assert (original.owner, original.end_reason, original.summary["steps"]) == (
        "uid:1000", "finished", 300)

    # the job expired long ago; a restarted daemon; another user takes the same names
    clocks.advance(3600)
    training, ledger = make()
    ledger.start()
    caplog.set_level(logging.INFO, logger="trainmon.ledger.recorder")
    send(training, description(config={"lr": 9.9}), step(0), identity="uid:1001")
    ledger.tick()
    for index in range(1, 4):
        clocks.advance(10)
        send(training, description(config={"lr": 9.9}), step(index * 7), identity="uid:1001")
        ledger.tick()
    exposition = scrape(ledger)
    ledger.stop()
    with Ledger.open(path) as reader:
        assert only(reader.runs()) == original  # not resumed, not overwritten, not ended
    assert exposition.value("trainmon_ledger_refused_runs_total") == 1.0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "uid:1001" in warnings[0] and "belongs to uid:1000" in warnings[0]
    assert not any("resuming" in r.getMessage() for r in caplog.records)

    # the owner itself may come back to its run after a restart
    training, ledger = make()
    ledger.start()
    send(training, description(), step(400), identity="uid:1000")
    ledger.tick()
    ledger.stop()
    with Ledger.open(path) as reader:
        resumed = only(reader.runs())
    assert (resumed.owner, resumed.summary["steps"]) == ("uid:1000", 400)
    assert scrape(ledger).value("trainmon_ledger_refused_runs_total") == 0.0


def test_a_conflict_found_only_when_writing_is_refused_too(tmp_path: Path) -> None:
    # the ledger could not be opened when the run began: the owner check happens at write
    clocks = Clocks()
    path = tmp_path / "state" / "ledger.sqlite3"
    make = make_recorder(clocks, path, flush_seconds=3600.0)
    path.parent.mkdir()
    training, ledger = make()
    ledger.start()
    send(training, description(), step(50), identity="uid:1000")
    ledger.tick()
    ledger.stop()
    path.parent.rename(tmp_path / "away")
    training, ledger = make()
    ledger.start()  # no directory: recording in memory
    send(training, description(), step(0), identity="uid:1001")
    ledger.tick()
    (tmp_path / "away").rename(path.parent)
    clocks.advance(31)  # reopened
    send(training, step(10), identity="uid:1001")
    ledger.tick()
    clocks.advance(10)
    send(training, step(20), identity="uid:1001")
    ledger.tick()
    assert scrape(ledger).value("trainmon_ledger_refused_runs_total") == 1.0
    ledger.stop()
    with Ledger.open(path) as reader:
        kept = only(reader.runs())
    assert (kept.owner, kept.summary["steps"]) == ("uid:1000", 50)


def test_the_recorders_retention_spares_the_smaller_owner(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clocks = Clocks()
    path = tmp_path / "ledger.sqlite3"
    with Ledger.open(path, readonly=False) as ledger:
        ledger.write([RecordUpdate(RunRecord(
            job="flood", run=f"f{i}", node="node-1", config_hash="", started=float(i),
            ended=None, end_reason=None, updated=clocks.wall, world_size=1, ranks=1,
            owner=owner), {}) for i, owner in enumerate(["uid:1000"] * 2 + ["uid:2000"] * 7)])
    caplog.set_level(logging.INFO, logger="trainmon.ledger.recorder")
    training, ledger = make_recorder(clocks, path, flush_seconds=3600.0, max_runs=6,
                                     max_runs_per_owner=5)()
    ledger.start()  # retention runs at open
    exposition = scrape(ledger)
    ledger.stop()
    training.stop()
    assert exposition.series("trainmon_ledger_pruned_runs_total", "reason") == {
        ("age",): 0.0, ("owner_limit",): 2.0, ("max_runs",): 1.0}
    with Ledger.open(path) as reader:
        kept = sorted((r.owner, r.run) for r in reader.runs())
    assert kept == [("uid:1000", "f0"), ("uid:1000", "f1"),
                    *(("uid:2000", f"f{i}") for i in range(5, 9))]
    [line] = [r.getMessage() for r in caplog.records if "deleted" in r.getMessage()]
    assert "uid:2000 3" in line, line


def run_for(clocks: Clocks, training: TrainingCollector, ledger: LedgerCollector, *,
            identity: str, run: str, reporter: str, steps: list[int], end: str | None,
            **reported: object) -> None:
    """A run of job ``train`` by ``identity``: its description, a report of each of
    ``steps`` 10 s apart (0.1 s steps, a quarter of each waiting for data and a tenth
    communicating unless ``reported`` says otherwise), then its end, a tick after each."""
    started = clocks.wall
    described = {"job": "train", "run": run, "reporter_id": reporter}
    send(training, description(started=started, **described),
         step(0, **described, **reported), identity=identity)
    ledger.tick()
    for count in steps:
        clocks.advance(10)
        send(training, step(count, **described, **reported), identity=identity)
        ledger.tick()
    if end is not None:
        send(training, description(started=started, ended=end, **described),
             identity=identity)
        ledger.tick()


def expire(clocks: Clocks, ledger: LedgerCollector) -> None:
    """Past the training store's TTL (60 s here): the job name is free for anyone."""
    clocks.advance(61)
    ledger.tick()


@pytest.mark.parametrize("restarter", ["uid:1002", "uid:1001"], ids=["same owner", "another"])
def test_a_crash_is_redone_only_by_its_owners_next_run(tmp_path: Path, restarter: str) -> None:
    """uid 1002 runs job ``train`` for 10 s claiming 10 000 000 steps and says it
    crashed; the next run of ``train`` within the hour redoes its steps as lost progress
    only if it is uid 1002's own: uid 1001's run books its steps as productive."""
    clocks = Clocks()
    path = tmp_path / "ledger.sqlite3"
    training, ledger = make_recorder(clocks, path, flush_seconds=3600.0)()
    ledger.start()
    try:
        run_for(clocks, training, ledger, identity="uid:1002", run="forged",
                reporter="f" * 16, steps=[10_000_000], end="crashed", seconds_per_step=1e-6)
        expire(clocks, ledger)
        run_for(clocks, training, ledger, identity=restarter, run="victim",
                reporter="b" * 16, steps=[100, 200, 300], end=None)
        exposition = scrape(ledger)
    finally:
        ledger.stop()
        training.stop()
    seconds = exposition.series("trainmon_job_gpu_seconds_total", "job", "owner", "bucket")
    with Ledger.open(path) as reader:
        [record] = [r for r in reader.runs(job="train") if r.run == "victim"]
    booked = record.summary["gpu_seconds"]
    assert isinstance(booked, dict)
    # 300 steps of 0.1 s, 65 % of each neither data wait nor communication
    if restarter == "uid:1001":
        assert booked["lost_progress"] == 0.0
        assert booked["productive"] == pytest.approx(300 * 0.1 * 0.65)
        assert seconds[("train", "uid:1001", "lost_progress")] == 0.0
    else:
        assert booked["productive"] == 0.0
        assert booked["lost_progress"] == pytest.approx(300 * 0.1 * 0.65)
    assert {owner for _, owner, _ in seconds} == {restarter}


def test_a_job_name_taken_by_another_owner_starts_its_team_and_goodput_again(
        tmp_path: Path) -> None:
    """uid 1000's ``train`` is all productive; once it expired, uid 1001
    runs its own ``train`` at 65 % productive: the node's series of ``train`` are uid
    1001's alone, its GPU-seconds, its goodput window and its team."""
    clocks = Clocks()
    training, ledger = make_recorder(clocks, tmp_path / "ledger.sqlite3",
                                     flush_seconds=3600.0)()
    ledger.start()
    try:
        run_for(clocks, training, ledger, identity="uid:1000", run="first",
                reporter="a" * 16, steps=[100, 200, 300], end="finished",
                data_wait_seconds=0.0, phase_seconds={"comm": 0.0})
        before = scrape(ledger)
        expire(clocks, ledger)
        run_for(clocks, training, ledger, identity="uid:1001", run="second",
                reporter="b" * 16, steps=[100, 200, 300], end=None)
        after = scrape(ledger)
    finally:
        ledger.stop()
        training.stop()
    # the first owner's run was all productive, and its series were its own
    assert before.value("trainmon_job_goodput_ratio", job="train", owner="uid:1000") == 1.0
    assert before.labelsets("trainmon_job_team_info") == [
        {"job": "train", "owner": "uid:1000", "team": owner_team("uid:1000")}]
    seconds = after.series("trainmon_job_gpu_seconds_total", "job", "owner", "bucket")
    assert {owner for _, owner, _ in seconds} == {"uid:1001"}
    assert sum(seconds.values()) == pytest.approx(30.0)  # the second run's 30 s alone
    assert seconds[("train", "uid:1001", "productive")] == pytest.approx(30 * 0.65)
    assert after.series("trainmon_job_goodput_ratio", "job", "owner") == {
        ("train", "uid:1001"): pytest.approx(0.65)}
    assert after.labelsets("trainmon_job_team_info") == [
        {"job": "train", "owner": "uid:1001", "team": owner_team("uid:1001")}]

"""Per-writer budgets of the training store (docs/security.md, "Caps that hold
everywhere"): what one untrusted writer can hold grows with a small constant, not
with what it sends: ranks, distinct runs and run-description bytes over all its jobs."""

from __future__ import annotations

import json

import pytest

from tests.training.training_support import FakeClock, report
from trainmon.training.protocol import ReportError, RunDescription, StepReport, parse
from trainmon.training.store import TrainingStore, description_size

ATTACKER = "uid:4242"
VICTIM = "uid:4343"


def step(**changes: object) -> StepReport:
    parsed = parse(json.dumps(report(**changes)).encode())
    assert isinstance(parsed, StepReport)
    return parsed


def description(**changes: object) -> RunDescription:
    line: dict[str, object] = {
        "v": 1, "type": "run", "job": "resnet50", "rank": 0,
        "reporter_id": "a1b2c3d4e5f60718", "run": "run-1", "started": 1_700_000_000.0,
        "world_size": 8, "config_hash": "sha256:0123456789abcdef", "config": {"lr": 0.1},
        "environment": {}, "data_paths": [], "versions": {"python": "3.11"}, "git": None,
        "host": "node-1", "framework": {}}
    line.update(changes)
    parsed = parse(json.dumps(line).encode())
    assert isinstance(parsed, RunDescription)
    return parsed


def store(**limits: int) -> TrainingStore:
    return TrainingStore(clock=FakeClock(), **limits)  # type: ignore[arg-type]


def test_a_writer_holds_at_most_its_rank_budget_over_all_its_jobs() -> None:
    training = store(max_ranks_per_writer=8)
    for index in range(8):
        training.ingest(step(job=f"job-{index % 3}", rank=index, run="r"), "unix",
                        identity=ATTACKER)
    with pytest.raises(ReportError, match="max_ranks_per_writer") as refused:
        training.ingest(step(job="job-9", rank=0, run="r"), "unix", identity=ATTACKER)
    assert refused.value.reason == "limit"
    # its known ranks go on reporting, and another writer is not affected
    training.ingest(step(job="job-0", rank=0, run="r", last_step_time=1_700_000_001.0),
                    "unix", identity=ATTACKER)
    training.ingest(step(job="victim", rank=0), "unix", identity=VICTIM)
    assert training.counts() == {"jobs": 4, "ranks": 9}


def test_a_writer_names_at_most_its_run_budget_and_a_rank_moving_on_frees_its_run() -> None:
    training = store(max_runs_per_writer=4)
    for index in range(4):
        training.ingest(step(rank=index, run=f"run-{index}"), "unix", identity=ATTACKER)
    with pytest.raises(ReportError, match="max_runs_per_writer"):
        training.ingest(step(rank=7, run="run-9"), "unix", identity=ATTACKER)
    with pytest.raises(ReportError, match="max_runs_per_writer"):
        training.describe(description(rank=7, run="run-9"), "unix", identity=ATTACKER)
    # rank 0's restart replaces its run: the budget follows what is held now
    training.ingest(step(rank=0, run="run-9", reporter_id="b1b2c3d4e5f60718"), "unix",
                    identity=ATTACKER)
    training.describe(description(rank=1, run="run-1"), "unix", identity=ATTACKER)
    views = {view.rank: view.run for view in training.snapshot().ranks}
    assert views == {0: "run-9", 1: "run-1", 2: "run-2", 3: "run-3"}


def test_description_bytes_are_budgeted_per_writer_and_a_replacement_counts_once() -> None:
    big = {f"key_{index}": "x" * 200 for index in range(60)}
    size = description_size(description(config=big))
    training = store(max_description_bytes_per_writer=3 * size + 10)
    for rank in range(3):
        training.describe(description(rank=rank, config=big), "unix", identity=ATTACKER)
    # the same rank's repeated description replaces its earlier one
    training.describe(description(rank=2, config=big), "unix", identity=ATTACKER)
    with pytest.raises(ReportError, match="max_description_bytes_per_writer"):
        training.describe(description(rank=3, config=big), "unix", identity=ATTACKER)
    training.describe(description(job="victim", config=big), "unix", identity=VICTIM)
    assert len(training.snapshot().descriptions) == 4


def test_trusted_writers_are_not_budgeted() -> None:
    training = store(max_ranks_per_writer=2, max_runs_per_writer=1)
    for rank in range(5):
        training.ingest(step(rank=rank, run=f"run-{rank}"), "unix", identity="uid:0")
    assert training.counts()["ranks"] == 5


def test_expired_ranks_and_descriptions_give_their_budget_back() -> None:
    clock = FakeClock()
    training = TrainingStore(clock=clock, ttl_seconds=10.0, max_ranks_per_writer=2,
                             max_runs_per_writer=2)
    training.ingest(step(rank=0, run="a"), "unix", identity=ATTACKER)
    training.describe(description(rank=1, run="b"), "unix", identity=ATTACKER)
    training.ingest(step(rank=1, run="b"), "unix", identity=ATTACKER)
    with pytest.raises(ReportError):
        training.ingest(step(rank=2, run="c"), "unix", identity=ATTACKER)
    clock.advance(11.0)
    training.ingest(step(rank=2, run="c"), "unix", identity=ATTACKER)
    training.ingest(step(rank=3, run="d"), "unix", identity=ATTACKER)
    assert sorted(view.rank for view in training.snapshot().ranks) == [2, 3]


def test_a_reload_changes_the_caps_ttl_and_trusted_writers_and_keeps_what_is_held() -> None:
    clock = FakeClock()
    training = TrainingStore(clock=clock, max_jobs_per_writer=4)
    for index in range(3):
        training.ingest(step(job=f"job-{index}", rank=0, run="r"), "unix", identity=ATTACKER)
    clock.advance(100)
    training.ingest(step(job="job-2", rank=0, run="r", last_step_time=1_700_000_001.0),
                    "unix", identity=ATTACKER)

    def reconfigure(**changes: object) -> None:
        limits: dict[str, object] = {
            "ttl_seconds": 300.0, "max_jobs": 64, "max_ranks_per_job": 1024,
            "max_jobs_per_writer": 4, "max_ranks_per_writer": 256, "max_runs_per_writer": 32,
            "max_description_bytes_per_writer": 1 << 20, "trusted_writers": ()}
        training.reconfigure(**{**limits, **changes})  # type: ignore[arg-type]

    # a lower cap: what is held stays, what would go past it is refused
    reconfigure(max_ranks_per_writer=2)
    assert training.counts() == {"jobs": 3, "ranks": 3}
    with pytest.raises(ReportError, match="max_ranks_per_writer"):
        training.ingest(step(job="job-3", rank=0, run="r"), "unix", identity=ATTACKER)
    training.ingest(step(job="job-0", rank=0, run="r", last_step_time=1_700_000_002.0),
                    "unix", identity=ATTACKER)
    # trusted now: no per-writer cap
    reconfigure(max_ranks_per_writer=2, trusted_writers=(ATTACKER,))
    assert ATTACKER in training.trusted_writers
    training.ingest(step(job="job-3", rank=0, run="r"), "unix", identity=ATTACKER)
    assert training.counts() == {"jobs": 4, "ranks": 4}
    # a shorter TTL expires what is older than it at the next read: job-1 last
    # reported 100 s ago, the others now
    reconfigure(ttl_seconds=50.0)
    assert {view.job for view in training.snapshot().ranks} == {"job-0", "job-2", "job-3"}
    assert training.counts() == {"jobs": 3, "ranks": 3}

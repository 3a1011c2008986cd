"""What a recorder tick costs (docs/security.md, "Caps that hold everywhere"): records
written only when they changed, and the file written without the lock that scrapes and
``/healthz`` take."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from tests.ledger.ledger_support import Clocks, description, make_recorder, send, step
from trainmon.ledger import recorder as recorder_module
from trainmon.ledger.records import RunRecord
from trainmon.ledger.store import Ledger, RecordUpdate, WriteResult

RUNS = 40


def updated_times(path: Path) -> dict[str, float]:
    with sqlite3.connect(path) as connection:
        return dict(connection.execute("SELECT run, updated FROM runs").fetchall())


def start_runs(clocks: Clocks, path: Path):  # type: ignore[no-untyped-def]
    training, ledger = make_recorder(clocks, path, flush_seconds=3600.0)()
    ledger.start()
    for index in range(RUNS):  # described runs, as a launcher's ranks before their first step
        send(training, description(job=f"job-{index}", run=f"run-{index}"))
    send(training, step(10, job="job-3", run="run-3"))
    ledger.tick()
    return training, ledger


def test_a_tick_writes_only_the_records_that_changed(tmp_path: Path) -> None:
    clocks = Clocks()
    path = tmp_path / "ledger.sqlite3"
    training, ledger = start_runs(clocks, path)
    try:
        first = updated_times(path)
        assert len(first) == RUNS
        clocks.advance(10)
        send(training, step(20, job="job-3", run="run-3"))  # one run steps on
        ledger.tick()
        second = updated_times(path)
        assert {run for run in first if second[run] != first[run]} == {"run-3"}
        # only the clock moved: each record is still written again once a minute
        clocks.advance(recorder_module.REWRITE_SECONDS)
        ledger.tick()
        third = updated_times(path)
        assert all(third[run] > second[run] for run in first)
    finally:
        ledger.stop()
        training.stop()


def test_scrapes_and_health_never_wait_for_the_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clocks = Clocks()
    path = tmp_path / "ledger.sqlite3"
    training, ledger = start_runs(clocks, path)
    writing, release = threading.Event(), threading.Event()
    slow_write = Ledger.write

    def stuck_write(self: Ledger, updates: list[RecordUpdate],
                    max_runs_per_owner: int | None = None) -> WriteResult:
        writing.set()
        assert release.wait(30.0)
        return slow_write(self, updates, max_runs_per_owner)

    monkeypatch.setattr(Ledger, "write", stuck_write)
    clocks.advance(10)
    send(training, step(20, job="job-3", run="run-3"))
    ticking = threading.Thread(target=ledger.tick)
    ticking.start()
    try:
        assert writing.wait(10.0)
        answered: list[object] = []
        reader = threading.Thread(
            target=lambda: answered.extend([ledger.health(), ledger.recorder.readings()]))
        reader.start()
        reader.join(5.0)
        assert not reader.is_alive() and len(answered) == 2  # while the write is stuck
    finally:
        release.set()
        ticking.join(30.0)
        monkeypatch.setattr(Ledger, "write", slow_write)
        ledger.stop()
        training.stop()
    assert updated_times(path)["run-3"] == clocks.wall


def test_one_owners_rows_are_capped_at_every_write_and_their_space_given_back(
        tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    padding = {f"key_{index}": "x" * 250 for index in range(64)}  # as large as allowed

    def big(run: str, started: float, owner: str) -> RecordUpdate:
        return RecordUpdate(RunRecord(
            job="flood", run=run, node="node-1", config_hash="sha256:0000000000000000",
            started=started, ended=started + 1, end_reason="finished", updated=started + 1,
            world_size=1, ranks=1, description={"config": padding}, summary={},
            owner=owner), {})

    with Ledger.open(path, readonly=False) as ledger:
        ledger.write([big("victim-run", 1.0, "uid:1001")], max_runs_per_owner=10)
        pruned = 0
        for batch in range(20):  # 400 runs of 17 KB: 7 MB
            result = ledger.write(
                [big(f"flood-{batch}-{index}", 10.0 + batch * 20 + index, "uid:1002")
                 for index in range(20)], max_runs_per_owner=10)
            pruned += result.owner_limit
            assert ledger.owners() == {"uid:1001": 1, "uid:1002": 10}
        assert pruned == 390
        # deleted rows' pages are reused: the file holds about 11 rows, not 401
        assert path.stat().st_size < 1 << 20
        ledger.write([big("last", 1000.0, "uid:1002")], max_runs_per_owner=1)
        free = path.stat().st_size
        reclaimed = ledger.reclaim(min_free_bytes=64 << 10)
        assert reclaimed > 0 and path.stat().st_size < free
        assert Path(f"{path}-wal").stat().st_size == 0
        assert [record.run for record in ledger.runs(job="flood")] == ["last", "victim-run"]

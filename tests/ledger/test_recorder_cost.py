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

    def stuck_write(self: Ledger, updates: list[RecordUpdate]) -> WriteResult:
        writing.set()
        assert release.wait(30.0)
        return slow_write(self, updates)

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

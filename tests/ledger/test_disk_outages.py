"""The ledger's disk full (``ENOSPC``) or read-only (``EROFS``): metrics and step intake
go on, ``/healthz`` and ``trainmon_ledger_write_errors_total`` say so, nothing is
corrupted, and the records are written once the disk takes them again, those of runs
that ended meanwhile included.

A real filesystem: a small tmpfs mounted for each test (``testkit.small_disk``; root
only, skipped where mounting is not permitted). The kernel refuses to remount a
filesystem read-only while a file on it is open for writing, so ``EROFS`` is met as a
daemon meets it after a filesystem went read-only under it and it (re)opens the ledger:
the file and its folder are there, every write is refused.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testkit.daemon import Daemon
from testkit.exposition import parse, scrape
from testkit.old_release import report
from testkit.small_disk import CannotMount, fill, remount, small_disk
from tests.ledger.ledger_support import Clocks, description, make_recorder, send, step
from trainmon.ledger import Ledger
from trainmon.ledger import recorder as recorder_module
from trainmon.ledger.recorder import REOPEN_SECONDS

SIZE_BYTES = 512 * 1024
#: Longest wait for the daemon to show a change (s).
WAIT_SECONDS = 20.0


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A 512 KiB tmpfs on ``tmp_path/disk``, unmounted afterwards."""
    try:
        with small_disk(tmp_path / "disk", SIZE_BYTES) as mounted:
            yield mounted
    except CannotMount as error:
        pytest.skip(str(error))


def intact(path: Path) -> dict[str, tuple[int, str | None]]:
    """``PRAGMA integrity_check`` is ok; each run's steps and end reason."""
    connection = sqlite3.connect(path)
    try:
        assert connection.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        connection.close()
    with Ledger.open(path) as reader:
        return {record.run: (int(record.summary["steps"]), record.end_reason)
                for record in reader.runs()}


def test_a_run_that_ends_while_the_disk_is_full_is_written_once_space_returns(
        disk: Path, clocks: Clocks) -> None:
    path = disk / "ledger.sqlite3"
    training, ledger = make_recorder(clocks, path, flush_seconds=3600.0)()
    ledger.start()
    try:
        send(training, description(run="before"), step(50, run="before"))
        ledger.tick()
        filler = fill(disk, SIZE_BYTES)
        clocks.advance(10)
        send(training, description(run="before", ended="finished"),
             step(60, run="before"))
        ledger.tick()  # the end is decided and its record fails to reach the file
        exposition = scrape(ledger)
        assert exposition.value("trainmon_ledger_write_errors_total",
                                reason="disk_full") >= 1.0
        assert "the disk is full" in str(ledger.health()["ledger_error"])
        assert exposition.value("trainmon_ledger_unwritten_runs") == 1.0
        filler.unlink()
        clocks.advance(10)
        ledger.tick()
        assert scrape(ledger).value("trainmon_ledger_up") == 1.0
        assert scrape(ledger).value("trainmon_ledger_unwritten_runs") == 0.0
    finally:
        ledger.stop()
        training.stop()
    assert intact(path) == {"before": (60, "finished")}


def test_ended_runs_beyond_the_bound_are_dropped_oldest_first_and_counted(
        disk: Path, clocks: Clocks, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recorder_module, "MAX_UNWRITTEN", 2)
    path = disk / "ledger.sqlite3"
    training, ledger = make_recorder(clocks, path, flush_seconds=3600.0)()
    ledger.start()
    try:
        ledger.tick()  # the file is made while there is room
        filler = fill(disk, SIZE_BYTES)
        for run in ("first", "second", "third"):
            clocks.advance(10)
            send(training, description(run=run, ended="finished"), step(10, run=run))
            ledger.tick()
        exposition = scrape(ledger)
        assert exposition.value("trainmon_ledger_unwritten_runs") == 2.0
        assert exposition.value("trainmon_ledger_dropped_unwritten_runs_total") == 1.0
        filler.unlink()
        clocks.advance(10)
        ledger.tick()
    finally:
        ledger.stop()
        training.stop()
    assert {run: end for run, (_, end) in intact(path).items()} == {
        "second": "finished", "third": "finished"}


def test_a_read_only_disk_is_counted_and_recording_resumes_when_it_is_writable(
        disk: Path, clocks: Clocks) -> None:
    path = disk / "ledger.sqlite3"
    training, ledger = make_recorder(clocks, path, flush_seconds=3600.0)()
    ledger.start()
    send(training, description(run="before", ended="finished"), step(30, run="before"))
    ledger.tick()
    ledger.stop()
    training.stop()
    remount(disk, readonly=True)
    training, ledger = make_recorder(clocks, path, flush_seconds=3600.0)()
    ledger.start()
    try:
        for steps in (10, 20):  # two flushes with records the file cannot take
            clocks.advance(10)
            send(training, description(run="after"), step(steps, run="after"))
            ledger.tick()
        exposition = scrape(ledger)
        assert exposition.value("trainmon_ledger_write_errors_total",
                                reason="read_only") == 2.0
        assert exposition.value("trainmon_ledger_up") == 0.0
        health = ledger.health()
        assert health["state"] == "degraded" and health["open"] is False
        assert "read-only" in str(health["error"]).lower(), health
        remount(disk, readonly=False)
        clocks.advance(REOPEN_SECONDS)
        send(training, description(run="after", ended="finished"), step(25, run="after"))
        ledger.tick()
        assert ledger.health().get("state") != "degraded", ledger.health()
    finally:
        ledger.stop()
        training.stop()
    assert intact(path) == {"before": (30, "finished"), "after": (25, "finished")}


def steps_counted(daemon: Daemon, job: str) -> float | None:
    return parse(daemon.metrics()).value("trainmon_training_steps_total", job=job,
                                          rank="0", owner="uid:0")


def wait_until(condition: Callable[[], bool], daemon: Daemon, what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}, not in {WAIT_SECONDS} s:\n{daemon.log()}")
        time.sleep(0.1)


def ledger_health(daemon: Daemon) -> dict[str, object]:
    _, body = daemon.get("/healthz")
    health = json.loads(body)["collectors"]["ledger"]
    assert isinstance(health, dict)
    return health


def listed_runs(daemon: Daemon) -> dict[str, str | None]:
    status, body = daemon.get("/api/v1/runs")
    return {} if status != 200 else {record["run"]: record["end_reason"]
                                     for record in json.loads(body)}


@pytest.mark.integration
def test_a_daemon_on_a_full_disk_goes_on_and_records_once_space_returns(
        disk: Path, tmp_path: Path, start_daemon: Callable[..., Daemon]) -> None:
    path = disk / "ledger.sqlite3"
    socket = tmp_path / "steps.sock"
    daemon = start_daemon(config={"collectors": {
        "training": {"socket": str(socket)},
        "ledger": {"path": str(path), "flush_seconds": 0.2}}})
    endpoint = f"unix://{socket}"
    report(None, endpoint, "resnet50", "before", 30)
    wait_until(lambda: listed_runs(daemon).get("before") == "finished", daemon,
               "the first run recorded")
    filler = fill(disk, SIZE_BYTES)
    report(None, endpoint, "bert", "during", 40)  # intake goes on: counted, not written
    wait_until(lambda: steps_counted(daemon, "bert") == 40.0, daemon, "bert's steps")
    wait_until(lambda: "the disk is full" in str(ledger_health(daemon).get("error")),
               daemon, "/healthz naming the full disk")
    assert ledger_health(daemon)["state"] == "degraded"
    wait_until(lambda: (parse(daemon.metrics()).value(  # /metrics may answer from its cache
        "trainmon_ledger_write_errors_total", reason="disk_full") or 0.0) >= 1.0, daemon,
        "the full disk counted")
    assert "during" not in listed_runs(daemon)
    filler.unlink()
    wait_until(lambda: listed_runs(daemon).get("during") == "finished", daemon,
               "the run that ended on the full disk recorded")
    assert ledger_health(daemon).get("state") != "degraded"  # ok again
    report(None, endpoint, "gpt", "after", 20)
    wait_until(lambda: listed_runs(daemon).get("after") == "finished", daemon,
               "a run after space returned")
    assert daemon.stop() == 0
    assert intact(path) == {"before": (30, "finished"), "during": (40, "finished"),
                            "after": (20, "finished")}


@pytest.mark.integration
def test_a_daemon_on_a_read_only_disk_goes_on_and_records_once_it_is_writable(
        disk: Path, tmp_path: Path, start_daemon: Callable[..., Daemon]) -> None:
    path = disk / "ledger.sqlite3"
    socket = tmp_path / "steps.sock"
    config = {"collectors": {"training": {"socket": str(socket)},
                             "ledger": {"path": str(path), "flush_seconds": 0.2}}}
    first = start_daemon(config=config)
    report(None, f"unix://{socket}", "resnet50", "before", 30)
    wait_until(lambda: listed_runs(first).get("before") == "finished", first,
               "the first run recorded")
    assert first.stop() == 0
    remount(disk, readonly=True)
    daemon = start_daemon(config=config)
    report(None, f"unix://{socket}", "bert", "during", 40)
    wait_until(lambda: steps_counted(daemon, "bert") == 40.0, daemon, "bert's steps")
    wait_until(lambda: (parse(daemon.metrics()).value(
        "trainmon_ledger_write_errors_total", reason="read_only") or 0.0) >= 1.0, daemon,
        "the read-only flushes counted")
    health = ledger_health(daemon)
    assert health["state"] == "degraded" and "read-only" in str(health["error"]).lower()
    remount(disk, readonly=False)
    wait_until(lambda: listed_runs(daemon).get("during") == "finished", daemon,
               "the run that ended on the read-only disk recorded")
    assert daemon.stop() == 0
    assert intact(path) == {"before": (30, "finished"), "during": (40, "finished")}

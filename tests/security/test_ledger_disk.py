"""The run ledger on a full disk: the recorder says so, counts it, and goes on.

A real filesystem that fills up: a 256 KiB tmpfs mounted for the test (root
only; skipped where mounting is not permitted), the ledger on it, a filler
file written until ``ENOSPC``. SQLite rolls the transaction back itself on
``SQLITE_FULL``; the recorder must report the full disk (not a failed
``ROLLBACK``), count it in ``trainmon_ledger_write_errors_total{reason="disk_full"}``,
keep the records in memory, and write them once space is back.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.exposition import scrape
from tests.ledger.ledger_support import Clocks, description, make_recorder, only, send, step
from trainmon.ledger import Ledger, LedgerError, RecordUpdate, RunRecord

SIZE_BYTES = 256 * 1024
CHUNK_BYTES = 4096


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A freshly mounted 256 KiB tmpfs, unmounted afterwards."""
    mountpoint = tmp_path / "small"
    mountpoint.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE_BYTES},mode=0755",
                        "tmpfs", str(mountpoint)], check=True, capture_output=True,
                       timeout=30)
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"cannot mount a tmpfs here: {error}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "--lazy", str(mountpoint)], check=True, timeout=30)


def fill(directory: Path) -> Path:
    """A file that takes every free block of ``directory``'s filesystem."""
    filler = directory / "filler"
    with filler.open("wb", buffering=0) as file:  # unbuffered: nothing left for close()
        for _ in range(SIZE_BYTES // CHUNK_BYTES + 16):  # bounded: the disk is that small
            try:
                file.write(b"\0" * CHUNK_BYTES)
            except OSError as error:
                assert error.errno == errno.ENOSPC, error
                break
        else:
            raise AssertionError("the filesystem never filled up")
    return filler


def test_a_transaction_that_fills_the_disk_mid_statement_says_so(small_disk: Path) -> None:
    # 3 MB of dirty pages spill to the WAL during the INSERT (beyond SQLite's 2 MB page
    # cache): the failure there (SQLITE_FULL, or SQLITE_IOERR_SHMSIZE when the -shm
    # cannot grow) rolls the whole transaction back before ROLLBACK is sent
    path = small_disk / "ledger.sqlite3"
    with Ledger.open(path, readonly=False) as ledger:
        filler = fill(small_disk)
        big = RunRecord(job="j", run="r", node="n", config_hash="", started=1.0, ended=None,
                        end_reason=None, updated=1.0, world_size=1, ranks=1,
                        description={"config": {"blob": "x" * 3_000_000}})
        with pytest.raises(LedgerError) as caught:
            ledger.write([RecordUpdate(big, {})])
        assert caught.value.reason == "disk_full"
        assert "the disk is full" in str(caught.value), caught.value
        assert "rollback" not in str(caught.value)
        filler.unlink()
        assert ledger.count() == 0  # rolled back whole; the connection still works
        ledger.write([RecordUpdate(dataclasses.replace(big, description={}), {})])
        assert ledger.count() == 1


def test_a_full_disk_is_named_counted_and_survived(
        small_disk: Path, caplog: pytest.LogCaptureFixture) -> None:
    clocks = Clocks()
    path = small_disk / "ledger.sqlite3"
    training, ledger = make_recorder(clocks, path, flush_seconds=3600.0)()
    ledger.start()
    send(training, description(), step(0))
    ledger.tick()
    assert scrape(ledger).value("trainmon_ledger_writes_total") == 1.0
    filler = fill(small_disk)

    caplog.set_level(logging.INFO)
    for index in range(1, 4):  # the run goes on while the disk is full
        clocks.advance(10)
        send(training, step(index * 100))
        ledger.tick()
    exposition = scrape(ledger)
    assert exposition.value("trainmon_ledger_write_errors_total", reason="disk_full") == 3.0
    assert exposition.value("trainmon_ledger_write_errors_total", reason="other") == 0.0
    assert exposition.value("trainmon_ledger_up") == 0.0
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors  # rate-limited: one line for one condition
    assert "the disk is full" in errors[0] and "SQLITE_FULL" in errors[0], errors
    assert not any("rollback" in r.getMessage() for r in caplog.records)
    health = ledger.health()
    assert health["open"] is True and "the disk is full" in str(health["ledger_error"])

    filler.unlink()  # space is back: the next flush writes what was kept in memory
    clocks.advance(10)
    send(training, step(400))
    ledger.tick()
    exposition = scrape(ledger)
    assert exposition.value("trainmon_ledger_up") == 1.0
    assert exposition.value("trainmon_ledger_writes_total") == 2.0
    assert "ledger_error" not in ledger.health()
    ledger.stop()
    training.stop()
    with Ledger.open(path) as reader:
        assert only(reader.runs()).summary["steps"] == 400


def test_a_ledger_created_on_a_full_disk_says_the_disk_is_full(
        small_disk: Path, caplog: pytest.LogCaptureFixture) -> None:
    clocks = Clocks()
    path = small_disk / "ledger.sqlite3"
    filler = fill(small_disk)
    training, ledger = make_recorder(clocks, path, flush_seconds=3600.0)()
    caplog.set_level(logging.INFO)
    ledger.start()
    send(training, description(), step(0))
    ledger.tick()
    health = ledger.health()
    assert health["open"] is False and "the disk is full" in str(health["ledger_error"])
    assert "rollback" not in str(health["ledger_error"])
    assert scrape(ledger).value("trainmon_ledger_up") == 0.0
    [error] = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert "the disk is full" in error and "rollback" not in error, error

    filler.unlink()
    clocks.advance(31)  # the next attempt to open (REOPEN_SECONDS)
    send(training, step(100))
    ledger.tick()
    assert ledger.health()["open"] is True and "ledger_error" not in ledger.health()
    ledger.stop()
    training.stop()
    with Ledger.open(path) as reader:
        assert only(reader.runs()).summary["steps"] == 100

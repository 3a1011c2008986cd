"""Ledgers written by every earlier schema open, are backed up and migrated, and keep
every run; a ledger of a newer schema is refused and left byte for byte as it was.

The files (``tests/ledger/fixtures/ledger-schema-{1,2,3}.sqlite3``) were written by the
old code itself (``testkit/old_ledgers.py``): a finished run of
``resnet50`` (40 steps) and a ``bert`` run whose process went away without closing
(25 steps), ``vanished`` in schemas 1 and 2, ``lost`` since.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.daemon import Daemon, trainmon_command
from testkit.old_ledgers import EXPECTED, fixture_path
from testkit.small_disk import CannotMount, fill, small_disk
from trainmon.ledger import Ledger, LedgerError
from trainmon.ledger.schema import SCHEMA_VERSION, backup_path

#: What each run of a fixture says once read by the current code: steps, samples, end.
RUNS = {job: (steps, steps * 32, "finished" if end == "finished" else "lost")
        for job, _, steps, end in EXPECTED}
OLD_SCHEMAS = (1, 2)


def copy_of(version: int, folder: Path) -> Path:
    folder.mkdir(mode=0o755, exist_ok=True)
    path = folder / "ledger.sqlite3"
    shutil.copyfile(fixture_path(version), path)
    return path


def rows(path: Path) -> list[tuple[object, ...]]:
    """Every column of every row, read-only, in key order."""
    connection = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        return connection.execute("SELECT * FROM runs ORDER BY job, run").fetchall()
    finally:
        connection.close()


def pragma(path: Path, name: str) -> object:
    connection = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        return connection.execute(f"PRAGMA {name}").fetchone()[0]
    finally:
        connection.close()


def assert_runs(listed: dict[str, tuple[int, int, str | None]]) -> None:
    assert listed == RUNS


@pytest.mark.parametrize("version", OLD_SCHEMAS)
def test_an_old_ledger_is_backed_up_then_migrated_with_every_run(
        tmp_path: Path, version: int) -> None:
    path = copy_of(version, tmp_path / "state")
    before = rows(path)
    with Ledger.open(path, readonly=False) as ledger:
        assert ledger.version == SCHEMA_VERSION
        assert_runs({record.job: (record.summary["steps"], record.summary["samples"],
                                  record.end_reason) for record in ledger.runs()})
        assert {record.owner for record in ledger.runs()} == ({""} if version == 1
                                                               else {"uid:0"})
    assert pragma(path, "user_version") == SCHEMA_VERSION
    assert pragma(path, "integrity_check") == "ok"
    backup = backup_path(path, version)
    assert pragma(backup, "user_version") == version
    assert pragma(backup, "integrity_check") == "ok"
    assert rows(backup) == before  # the file as the old code left it
    assert backup.stat().st_mode & 0o777 == 0o600
    assert not backup.with_name(backup.name + ".partial").exists()
    saved = backup.read_bytes()
    with Ledger.open(path, readonly=False):  # current now: no second backup
        pass
    assert sorted(p.name for p in path.parent.iterdir() if "schema" in p.name) == \
        [backup.name]
    assert backup.read_bytes() == saved


def test_a_current_ledger_is_opened_without_a_backup(tmp_path: Path) -> None:
    path = copy_of(SCHEMA_VERSION, tmp_path / "state")
    with Ledger.open(path, readonly=False) as ledger:
        assert_runs({record.job: (record.summary["steps"], record.summary["samples"],
                                  record.end_reason) for record in ledger.runs()})
    assert not any("schema" in p.name for p in path.parent.iterdir())


@pytest.mark.parametrize("version", OLD_SCHEMAS)
def test_trainmon_runs_lists_every_run_of_a_migrated_ledger(
        tmp_path: Path, version: int) -> None:
    path = copy_of(version, tmp_path / "state")
    Ledger.open(path, readonly=False).close()
    listed = subprocess.run([*trainmon_command(), "runs", "--ledger", str(path), "--json"],
                            capture_output=True, text=True, timeout=60, check=True)
    records = json.loads(listed.stdout)["runs"]
    assert_runs({record["job"]: (record["summary"]["steps"], record["summary"]["samples"],
                                 record["end_reason"]) for record in records})
    assert {record["run"] for record in records} == {run for _, run, _, _ in EXPECTED}


def test_a_ledger_of_a_newer_schema_is_refused_and_never_rewritten(tmp_path: Path) -> None:
    path = copy_of(SCHEMA_VERSION, tmp_path / "state")
    newer = sqlite3.connect(path, isolation_level=None)
    newer.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    newer.close()
    saved = path.read_bytes()
    for readonly in (False, True):
        with pytest.raises(LedgerError) as refused:
            Ledger.open(path, readonly=readonly)
        message = str(refused.value)
        assert "\n" not in message
        assert message == (f"{path} has ledger schema {SCHEMA_VERSION + 1}, newer than "
                           f"this trainmon's {SCHEMA_VERSION}; left untouched: upgrade "
                           "trainmon")
    assert path.read_bytes() == saved
    # SQLite's read-only connections leave an empty -wal and the -shm of a WAL file
    assert not any("schema" in p.name for p in path.parent.iterdir())
    assert Path(f"{path}-wal").stat().st_size == 0


def test_an_old_ledger_on_a_full_disk_is_left_as_it_was_until_its_backup_fits(
        tmp_path: Path) -> None:
    size = 256 * 1024
    try:
        with small_disk(tmp_path / "disk", size) as disk:
            path = disk / "ledger.sqlite3"
            shutil.copyfile(fixture_path(1), path)
            saved = path.read_bytes()
            Ledger.open(path).close()  # a reader made the -shm before the disk filled up
            filler = fill(disk, size)
            with pytest.raises(LedgerError) as refused:
                Ledger.open(path, readonly=False)
            assert refused.value.reason == "disk_full", refused.value
            assert "cannot back up the ledger" in str(refused.value)
            assert path.read_bytes() == saved
            assert not any("schema" in p.name for p in disk.iterdir())  # nor a .partial
            filler.unlink()
            with Ledger.open(path, readonly=False) as ledger:
                assert ledger.version == SCHEMA_VERSION
                assert len(ledger.runs()) == len(EXPECTED)
            assert backup_path(path, 1).exists()
    except CannotMount as error:
        pytest.skip(str(error))


@pytest.mark.integration
def test_a_daemon_migrates_an_old_ledger_and_serves_its_runs(
        tmp_path: Path, start_daemon: Callable[..., Daemon]) -> None:
    path = copy_of(1, tmp_path / "state")
    daemon = start_daemon(config={"collectors": {"ledger": {"path": str(path)}}})
    status, body = daemon.get("/api/v1/runs")
    assert status == 200, body
    records = json.loads(body)
    assert_runs({record["job"]: (record["summary"]["steps"], record["summary"]["samples"],
                                 record["end_reason"]) for record in records})
    assert backup_path(path, 1).exists()
    log = daemon.log()
    assert f"schema 1 backed up to {backup_path(path, 1)}" in log, log
    assert "upgraded from schema 1 to 3" in log, log


@pytest.mark.integration
def test_a_daemon_refuses_a_newer_ledger_in_one_line_and_leaves_it_alone(
        tmp_path: Path, start_daemon: Callable[..., Daemon]) -> None:
    path = copy_of(SCHEMA_VERSION, tmp_path / "state")
    newer = sqlite3.connect(path, isolation_level=None)
    newer.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    newer.close()
    saved = path.read_bytes()
    daemon = start_daemon(config={"collectors": {"ledger": {"path": str(path)}}})
    _, body = daemon.get("/healthz")
    ledger = json.loads(body)["collectors"]["ledger"]
    assert ledger["state"] == "degraded", body
    assert "newer than this trainmon's" in ledger["error"], body
    assert daemon.stop() == 0
    lines = [line for line in daemon.log().splitlines() if "newer than" in line]
    assert len(lines) == 1, daemon.log()
    assert path.read_bytes() == saved
    assert not any("schema" in p.name for p in path.parent.iterdir())

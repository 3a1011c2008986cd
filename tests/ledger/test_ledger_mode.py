"""Who can read the ledger: created 0640 (group ``trainmon`` where it exists) whatever the
umask allows, its ``-wal``/``-shm`` alike, and an existing file open to others tightened."""

from __future__ import annotations

import grp
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainmon.ledger import Ledger, RecordUpdate, RunRecord, schema

RECORD = RunRecord(job="j", run="r", node="n", config_hash="", started=1.0, ended=None,
                   end_reason=None, updated=1.0, world_size=1, ranks=1,
                   description={"config": {"dataset": "/data/private"}})


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def files(path: Path) -> list[Path]:
    """The ledger and the -wal/-shm SQLite keeps beside it."""
    return [path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")]


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The usual umask, which would make new files 0644."""
    before = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(before)


@pytest.mark.usefixtures("umask_022")
def test_a_new_ledger_and_its_wal_are_not_readable_by_others(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    with Ledger.open(path, readonly=False) as ledger:
        ledger.write([RecordUpdate(RECORD, {})])
        assert {p.name: oct(mode(p)) for p in files(path)} == {
            p.name: oct(0o640) for p in files(path)}
        with Ledger.open(path) as reader:  # a reader changes nothing
            assert len(reader.runs()) == 1
        assert all(mode(p) == 0o640 for p in files(path))


@pytest.mark.usefixtures("umask_022")
def test_the_ledger_gets_the_trainmon_group_where_it_exists(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a file another group than one's own needs root")
    other = next((g for g in grp.getgrall() if g.gr_gid not in (0, os.getegid())), None)
    if other is None:
        pytest.skip("no group to give the file")
    # the deployed group is "trainmon" (docs/deploy.md); this machine may lack it
    monkeypatch.setattr(schema, "LEDGER_GROUP", other.gr_name)
    path = tmp_path / "ledger.sqlite3"
    with Ledger.open(path, readonly=False) as ledger:
        ledger.write([RecordUpdate(RECORD, {})])
        assert {p.name: p.stat().st_gid for p in files(path)} == {
            p.name: other.gr_gid for p in files(path)}


@pytest.mark.usefixtures("umask_022")
def test_without_the_group_the_ledger_keeps_the_creators(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schema, "LEDGER_GROUP", "no-such-group-9f3c")
    path = tmp_path / "ledger.sqlite3"
    Ledger.open(path, readonly=False).close()
    assert (path.stat().st_gid, mode(path)) == (os.getegid(), 0o640)


def test_a_stricter_umask_is_kept(tmp_path: Path) -> None:
    before = os.umask(0o077)
    try:
        path = tmp_path / "ledger.sqlite3"
        Ledger.open(path, readonly=False).close()
    finally:
        os.umask(before)
    assert mode(path) == 0o600


def test_an_existing_ledger_open_to_others_is_tightened_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "ledger.sqlite3"
    with Ledger.open(path, readonly=False) as ledger:
        ledger.write([RecordUpdate(RECORD, {})])
        # keep the -wal and -shm: a second connection holds the file open
        with Ledger.open(path):
            pass
    with Ledger.open(path, readonly=False) as ledger:
        ledger.write([RecordUpdate(RECORD, {"n": 1})])
        for item in files(path):
            os.chmod(item, 0o666)  # as an older trainmon under umask 0 left it
        with Ledger.open(path) as reader:  # readers do not touch the mode
            reader.runs()
        assert mode(path) == 0o666
        caplog.set_level(logging.INFO, logger="trainmon.ledger")
        with Ledger.open(path, readonly=False) as second:
            assert second.count() == 1
        with Ledger.open(path, readonly=False):
            pass
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "readable or writable by other users" in warnings[0]
    assert "ledger.sqlite3-wal 666 -> 640" in warnings[0]
    assert all(mode(p) == 0o640 for p in files(path) if p.exists())

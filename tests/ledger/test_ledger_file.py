"""The ledger file: schema markers, foreign and corrupt files left untouched, retention,
a reader beside the writer."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from trainmon.ledger import (
    APPLICATION_ID,
    SCHEMA_VERSION,
    Ledger,
    LedgerError,
    RecordUpdate,
    RunRecord,
)


def record(run: str, started: float, *, job: str = "resnet50", ended: float | None = None,
           config_hash: str = "sha256:0000000000000000") -> RunRecord:
    return RunRecord(
        job=job, run=run, node="node-1", config_hash=config_hash, started=started,
        ended=ended, end_reason=None if ended is None else "finished",
        updated=ended or started, world_size=8, ranks=8,
        description={"config": {"lr": 0.1}}, summary={"samples_per_second_median": 100.0})


def test_a_new_ledger_carries_trainmon_markers_and_wal(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    Ledger.open(path, readonly=False).close()
    connection = sqlite3.connect(path)
    assert connection.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    assert connection.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    connection.close()


def test_records_round_trip_and_queries_filter(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    with Ledger.open(path, readonly=False) as ledger:
        ledger.write([
            RecordUpdate(record("a", 100.0, ended=200.0), {}),
            RecordUpdate(record("b", 300.0, config_hash="sha256:1111111111111111"), {}),
            RecordUpdate(record("c", 400.0, job="bert"), {}),
        ])
    with Ledger.open(path) as ledger:
        assert [r.run for r in ledger.runs()] == ["c", "b", "a"]
        assert [r.run for r in ledger.runs(job="resnet50")] == ["b", "a"]
        assert [r.run for r in ledger.runs(since=250.0)] == ["c", "b"]
        assert ledger.get("a") == [record("a", 100.0, ended=200.0)]
        assert ledger.get("a", job="bert") == []
        previous = ledger.previous("resnet50", None, before=350.0)
        assert previous is not None and previous.run == "b"
        same_hash = ledger.previous("resnet50", "sha256:0000000000000000", before=350.0)
        assert same_hash is not None and same_hash.run == "a"
        assert ledger.previous("resnet50", None, before=100.0) is None
        assert ledger.get("a")[0].to_json()["summary"] == {"samples_per_second_median": 100.0}
        with pytest.raises(LedgerError, match="read-only"):
            ledger.write([RecordUpdate(record("d", 1.0), {})])


def test_an_update_replaces_the_record(tmp_path: Path) -> None:
    with Ledger.open(tmp_path / "l.sqlite3", readonly=False) as ledger:
        ledger.write([RecordUpdate(record("a", 100.0), {"samples": 1})])
        ledger.write([RecordUpdate(record("a", 100.0, ended=150.0), {"samples": 2})])
        assert ledger.count() == 1
        assert ledger.get("a")[0].end_reason == "finished"
        assert ledger.state("resnet50", "a", "node-1") == {"samples": 2}


def test_reading_a_missing_ledger_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LedgerError, match="no ledger at"):
        Ledger.open(tmp_path / "absent.sqlite3")
    with pytest.raises(LedgerError, match="does not exist"):
        Ledger.open(tmp_path / "no" / "dir" / "l.sqlite3", readonly=False)


@pytest.mark.parametrize("readonly", [True, False])
def test_a_file_that_is_not_sqlite_is_refused_and_untouched(tmp_path: Path,
                                                            readonly: bool) -> None:
    path = tmp_path / "ledger.sqlite3"
    content = b"2026-12-01 training log line\n" * 200
    path.write_bytes(content)
    with pytest.raises(LedgerError, match="not an SQLite database"):
        Ledger.open(path, readonly=readonly)
    assert path.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger.sqlite3"]


@pytest.mark.parametrize("readonly", [True, False])
def test_another_programs_database_is_refused_and_untouched(tmp_path: Path,
                                                            readonly: bool) -> None:
    path = tmp_path / "ledger.sqlite3"
    connection = sqlite3.connect(path)
    connection.execute("CREATE TABLE photos (name TEXT)")
    connection.execute("INSERT INTO photos VALUES ('cat.jpg')")
    connection.commit()
    connection.close()
    content = path.read_bytes()
    with pytest.raises(LedgerError, match="another program"):
        Ledger.open(path, readonly=readonly)
    assert path.read_bytes() == content
    connection = sqlite3.connect(path)
    assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    connection.close()


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    Ledger.open(path, readonly=False).close()
    connection = sqlite3.connect(path)
    connection.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    connection.close()
    content = path.read_bytes()
    with pytest.raises(LedgerError, match="newer"):
        Ledger.open(path, readonly=False)
    assert path.read_bytes() == content


def test_a_corrupted_ledger_is_refused_and_untouched(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    with Ledger.open(path, readonly=False) as ledger:
        ledger.write([RecordUpdate(record(f"r{i}", float(i)), {"pad": "x" * 2000})
                      for i in range(50)])
        ledger._connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(path.read_bytes())
    page = 4096
    data[page * 2:page * 2 + 512] = b"\xff" * 512  # clobber a b-tree page, keep the header
    path.write_bytes(bytes(data))
    with pytest.raises(LedgerError, match=r"corrupt|not a readable"):
        Ledger.open(path, readonly=False)
    assert path.read_bytes() == bytes(data)


def test_retention_by_age_then_by_count(tmp_path: Path) -> None:
    with Ledger.open(tmp_path / "l.sqlite3", readonly=False) as ledger:
        ledger.write([
            RecordUpdate(record("old-ended", 10.0, ended=20.0), {}),
            RecordUpdate(record("old-running", 15.0), {}),
            *(RecordUpdate(record(f"new{i}", 1000.0 + i, ended=1100.0 + i), {})
              for i in range(5)),
        ])
        pruned = ledger.prune(now=1200.0, retention_seconds=500.0, max_runs=4)
        assert (pruned.age, pruned.max_runs, pruned.total) == (1, 2, 3)
        assert [r.run for r in ledger.runs()] == ["new4", "new3", "new2", "new1"]


def test_a_reader_reads_while_the_writer_writes(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite3"
    writer = Ledger.open(path, readonly=False)
    stop = threading.Event()
    written = threading.Event()
    failures: list[BaseException] = []

    def write() -> None:
        index = 0
        while not stop.is_set():
            try:
                writer.write([RecordUpdate(record(f"r{index % 40}", float(index)),
                                           {"i": index})])
            except LedgerError as error:
                failures.append(error)
                written.set()
                return
            written.set()
            index += 1

    thread = threading.Thread(target=write)
    thread.start()
    try:
        counts = []
        # the reads race the writes from its first commit on (before it, on a busy
        # machine, all 50 reads could find an empty ledger)
        assert written.wait(10)
        for _ in range(50):
            try:
                with Ledger.open(path) as reader:
                    counts.append(len(reader.runs()))
            except LedgerError as error:
                failures.append(error)
    finally:
        stop.set()
        thread.join()
        writer.close()
    assert not failures
    assert counts == sorted(counts) and counts[-1] > 0

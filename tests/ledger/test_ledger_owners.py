"""Owners in the ledger: each row belongs to a writer identity, another writer's row is
never rewritten, retention is fair between owners; schema 1 and 2 files are upgraded."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from trainmon.ledger import APPLICATION_ID, SCHEMA_VERSION, Ledger, RecordUpdate, RunRecord
from trainmon.ledger.store import fair_share

#: The runs table of schema version 1 (trainmon 0.16), as that version created it.
SCHEMA_1 = (
    """CREATE TABLE runs (
        job TEXT NOT NULL, run TEXT NOT NULL, node TEXT NOT NULL,
        config_hash TEXT NOT NULL, started REAL NOT NULL, ended REAL, end_reason TEXT,
        updated REAL NOT NULL, world_size INTEGER, ranks INTEGER NOT NULL,
        description TEXT NOT NULL, summary TEXT NOT NULL, state TEXT NOT NULL DEFAULT '{}',
        PRIMARY KEY (job, run, node))""",
    "CREATE INDEX runs_by_job_started ON runs (job, started)",
    "CREATE INDEX runs_by_started ON runs (started)",
)


def record(run: str, started: float, owner: str, *, job: str = "resnet50",
           ended: float | None = None, steps: int = 1) -> RunRecord:
    return RunRecord(
        job=job, run=run, node="node-1", config_hash="sha256:0000000000000000",
        started=started, ended=ended, end_reason=None if ended is None else "finished",
        updated=ended or started, world_size=1, ranks=1,
        description={"config": {"lr": 0.1}}, summary={"steps": steps}, owner=owner)


def write(ledger: Ledger, *records: RunRecord) -> None:
    result = ledger.write([RecordUpdate(item, {}) for item in records])
    assert (result.written, result.refused) == (len(records), ())


def runs_of(ledger: Ledger) -> dict[str, list[str]]:
    """Run ids per owner, oldest first."""
    found: dict[str, list[str]] = {}
    for kept in sorted(ledger.runs(), key=lambda r: r.started):
        found.setdefault(kept.owner, []).append(kept.run)
    return found


def make_schema_1(path: Path, end_reason: str = "finished") -> None:
    connection = sqlite3.connect(path, isolation_level=None)
    for statement in SCHEMA_1:
        connection.execute(statement)
    connection.execute(
        "INSERT INTO runs VALUES ('resnet50', 'old-run', 'node-1', 'sha256:0', 10.0, 20.0, "
        "?, 20.0, 1, 1, '{}', '{\"steps\": 7}', '{}')", [end_reason])
    connection.execute(f"PRAGMA application_id={APPLICATION_ID}")
    connection.execute("PRAGMA user_version=1")
    connection.execute("PRAGMA journal_mode=WAL")
    connection.close()


def make_schema_2(path: Path) -> None:
    """A file as trainmon wrote it before end reasons were renamed: a ``vanished`` run."""
    make_schema_1(path, end_reason="vanished")
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("ALTER TABLE runs ADD COLUMN owner TEXT NOT NULL DEFAULT ''")
    connection.execute("CREATE INDEX runs_by_owner_started ON runs (owner, started)")
    connection.execute("UPDATE runs SET owner = 'uid:1000'")
    connection.execute("PRAGMA user_version=2")
    connection.close()


def test_the_owner_is_stored_and_shown(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    with Ledger.open(path, readonly=False) as ledger:
        write(ledger, record("a", 1.0, "uid:1000"))
    with Ledger.open(path) as reader:
        [kept] = reader.runs()
    assert kept.owner == "uid:1000" and kept.to_json()["owner"] == "uid:1000"
    assert RunRecord.from_json(kept.to_json()) == kept
    older = {key: value for key, value in kept.to_json().items() if key != "owner"}
    assert RunRecord.from_json(older).owner == ""  # a record from an older daemon


def test_another_owners_row_is_never_rewritten(tmp_path: Path) -> None:
    with Ledger.open(tmp_path / "l.sqlite3", readonly=False) as ledger:
        write(ledger, record("a", 1.0, "uid:1000", steps=500))
        result = ledger.write([RecordUpdate(record("a", 2.0, "uid:1001", steps=1), {"x": 1}),
                               RecordUpdate(record("b", 3.0, "uid:1001"), {})])
        assert result.written == 1
        assert result.refused == ((("resnet50", "a", "node-1"), "uid:1000"),)
        [kept] = ledger.get("a")
        assert (kept.owner, kept.summary, kept.started) == ("uid:1000", {"steps": 500}, 1.0)
        assert ledger.state("resnet50", "a", "node-1") == {}
        write(ledger, record("a", 1.0, "uid:1000", steps=600))  # its owner goes on
        assert ledger.get("a")[0].summary == {"steps": 600}
        assert ledger.owner("resnet50", "a", "node-1") == "uid:1000"
        assert ledger.owner("resnet50", "zzz", "node-1") is None


def test_a_schema_1_file_is_read_as_it_is_and_upgraded_when_opened_writable(
        tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    make_schema_1(path)
    with Ledger.open(path) as reader:  # readers of a v1 file: every owner ""
        [old] = reader.runs()
        assert (old.run, old.owner, old.summary, reader.version) == ("old-run", "", {"steps": 7}, 1)
        assert reader.owners() == {"": 1}
    connection = sqlite3.connect(path)
    assert connection.execute("PRAGMA user_version").fetchone()[0] == 1
    connection.close()

    with Ledger.open(path, readonly=False) as ledger:
        assert ledger.version == SCHEMA_VERSION == 3
        assert ledger.get("old-run")[0].owner == ""
        # a row without owner is claimed by the next writer of it
        write(ledger, record("old-run", 10.0, "uid:1000", ended=30.0, steps=9))
        write(ledger, record("new-run", 40.0, "uid:1000"))
    connection = sqlite3.connect(path)
    assert connection.execute("PRAGMA user_version").fetchone()[0] == 3
    columns = [row[1] for row in connection.execute("PRAGMA table_info(runs)")]
    assert columns[-1] == "owner"
    indexes = {row[1] for row in connection.execute("PRAGMA index_list(runs)")}
    assert "runs_by_owner_started" in indexes
    assert connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    connection.close()
    with Ledger.open(path) as reader:
        assert runs_of(reader) == {"uid:1000": ["old-run", "new-run"]}
        assert reader.get("old-run")[0].summary == {"steps": 9}


def test_the_largest_owner_pays_for_max_runs(tmp_path: Path) -> None:
    with Ledger.open(tmp_path / "l.sqlite3", readonly=False) as ledger:
        write(ledger, *(record(f"flood-{i:03d}", 100.0 + i, "uid:2000") for i in range(10)),
              *(record(f"alice-{i}", float(i), "uid:1000") for i in range(3)),
              *(record(f"bob-{i}", 50.0 + i, "token:ci") for i in range(2)))
        pruned = ledger.prune(now=1000.0, retention_seconds=1e9, max_runs=9,
                              max_runs_per_owner=1000)
        assert (pruned.age, pruned.owner_limit, pruned.max_runs) == (0, 0, 6)
        assert pruned.by_owner == {"uid:2000": 6}
        kept = runs_of(ledger)
    # alice's runs are the oldest on the node, and all still there
    assert kept["uid:1000"] == ["alice-0", "alice-1", "alice-2"]
    assert kept["token:ci"] == ["bob-0", "bob-1"]
    assert kept["uid:2000"] == [f"flood-{i:03d}" for i in range(6, 10)]  # its newest


def test_owners_tied_at_the_top_are_levelled_down_together(tmp_path: Path) -> None:
    with Ledger.open(tmp_path / "l.sqlite3", readonly=False) as ledger:
        write(ledger, *(record(f"a{i}", float(i), "uid:1") for i in range(5)),
              *(record(f"b{i}", 10.0 + i, "uid:2") for i in range(5)),
              record("c0", 0.5, "uid:3"))
        assert ledger.prune(now=0.0, retention_seconds=1e9, max_runs=7).max_runs == 4
        assert runs_of(ledger) == {"uid:1": ["a2", "a3", "a4"], "uid:2": ["b2", "b3", "b4"],
                                   "uid:3": ["c0"]}


def test_max_runs_per_owner_applies_to_each_owner_first(tmp_path: Path) -> None:
    with Ledger.open(tmp_path / "l.sqlite3", readonly=False) as ledger:
        write(ledger, *(record(f"a{i}", float(i), "uid:1") for i in range(6)),
              *(record(f"b{i}", 10.0 + i, "uid:2") for i in range(2)),
              *(record(f"legacy{i}", 20.0 + i, "") for i in range(5)))
        pruned = ledger.prune(now=0.0, retention_seconds=1e9, max_runs=100,
                              max_runs_per_owner=3)
        assert (pruned.owner_limit, pruned.max_runs, pruned.by_owner) == (3, 0, {"uid:1": 3})
        # rows written before owners were kept are not one owner's: exempt
        assert runs_of(ledger) == {"uid:1": ["a3", "a4", "a5"], "uid:2": ["b0", "b1"],
                                   "": [f"legacy{i}" for i in range(5)]}


@pytest.mark.parametrize(("counts", "limit", "expected"), [
    ({"a": 10, "b": 3, "c": 2}, 9, {"a": 6}),
    ({"a": 10, "b": 3, "c": 2}, 15, {}),
    ({"a": 5, "b": 5, "c": 1}, 7, {"a": 2, "b": 2}),
    ({"a": 5, "b": 5, "c": 1}, 8, {"a": 2, "b": 1}),
    ({"a": 4, "b": 2}, 2, {"a": 3, "b": 1}),
    ({"a": 3}, 1, {"a": 2}),
])
def test_fair_share(counts: dict[str, int], limit: int, expected: dict[str, int]) -> None:
    quotas = fair_share(counts, limit)
    assert quotas == expected
    assert sum(counts.values()) - sum(quotas.values()) == min(limit, sum(counts.values()))


def test_a_vanished_run_of_an_older_ledger_reads_as_lost_and_is_migrated(
        tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    make_schema_2(path)
    with Ledger.open(path) as reader:  # read-only: the file stays as it is
        [old] = reader.runs()
        assert (old.end_reason, old.owner, reader.version) == ("lost", "uid:1000", 2)
        assert RunRecord.from_json({**old.to_json(), "end_reason": "vanished"}) == old
    connection = sqlite3.connect(path)
    assert connection.execute("SELECT end_reason FROM runs").fetchall() == [("vanished",)]
    connection.close()

    with Ledger.open(path, readonly=False) as ledger:
        assert ledger.version == SCHEMA_VERSION
    connection = sqlite3.connect(path)
    assert connection.execute("SELECT end_reason FROM runs").fetchall() == [("lost",)]
    assert connection.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    connection.close()

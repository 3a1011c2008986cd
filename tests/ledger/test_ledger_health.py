"""``/healthz`` of the ledger collector, as the registry serves it: ``degraded`` with the
error while the file is not open or its last write failed, the registry's ``ok`` again
once a write goes through."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from testkit.exposition import scrape
from tests.ledger.ledger_support import Clocks, description, make_recorder, send, step
from trainmon.core.registry import CollectorRegistry
from trainmon.ledger import schema


def ledger_health(registry: CollectorRegistry) -> dict[str, object]:
    collectors = registry.health()["collectors"]
    assert isinstance(collectors, dict)
    entry = collectors["ledger"]
    assert isinstance(entry, dict)
    return entry


def test_a_ledger_that_cannot_be_opened_is_degraded(tmp_path: Path) -> None:
    clocks = Clocks()
    path = tmp_path / "ledger.sqlite3"
    foreign = sqlite3.connect(path)
    foreign.execute("CREATE TABLE t (x)")
    foreign.commit()
    foreign.close()
    training, ledger = make_recorder(clocks, path, flush_seconds=3600.0)()
    registry = CollectorRegistry([training, ledger], clock=lambda: clocks.monotonic,
                                 wall_clock=lambda: clocks.wall)
    registry.start()
    try:
        health = ledger_health(registry)
        assert (health["state"], health["open"]) == ("degraded", False)
        assert "another program" in str(health["error"])
        assert health["error"] == health["ledger_error"]
        path.rename(tmp_path / "foreign.sqlite3")  # moved away, as the log says to
        clocks.advance(31)
        send(training, description(), step(10))
        ledger.tick()
        list(registry.collect())
        health = ledger_health(registry)
        assert (health["state"], health["open"]) == ("ok", True)
        assert "error" not in health and "ledger_error" not in health
    finally:
        registry.stop()


def test_a_ledger_whose_last_write_failed_is_degraded_until_one_succeeds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schema, "BUSY_TIMEOUT_MS", 50)  # wait 50 ms for the lock, not 5 s
    clocks = Clocks()
    path = tmp_path / "ledger.sqlite3"
    training, ledger = make_recorder(clocks, path, flush_seconds=3600.0)()
    registry = CollectorRegistry([training, ledger], clock=lambda: clocks.monotonic,
                                 wall_clock=lambda: clocks.wall)
    registry.start()
    other = sqlite3.connect(path, isolation_level=None)
    try:
        list(registry.collect())
        assert ledger_health(registry)["state"] == "ok"
        other.execute("BEGIN IMMEDIATE")  # another writer holds the file's write lock
        send(training, description(), step(10))
        ledger.tick()
        list(registry.collect())
        health = ledger_health(registry)
        assert (health["state"], health["open"]) == ("degraded", True)
        assert "locked" in str(health["error"])
        assert scrape(ledger).value("trainmon_ledger_up") == 0.0
        other.execute("ROLLBACK")
        clocks.advance(10)
        send(training, step(20))
        ledger.tick()
        list(registry.collect())
        health = ledger_health(registry)
        assert health["state"] == "ok" and "error" not in health
        assert scrape(ledger).value("trainmon_ledger_up") == 1.0
    finally:
        other.close()
        registry.stop()

"""A real daemon killed with SIGKILL while it records a run: the restarted daemon opens the
ledger, the run is still there, and the read routes serve it."""

from __future__ import annotations

import json
import signal
import sqlite3
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from testkit.daemon import Daemon
from tests.ledger.ledger_support import description, step
from trainmon.ledger import Ledger


def push(daemon: Daemon, *lines: dict[str, object]) -> None:
    body = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    request = urllib.request.Request(daemon.url + "/api/v1/steps", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 200


def wait_for(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def runs(daemon: Daemon, query: str = "") -> list[dict[str, object]]:
    status, body = daemon.get("/api/v1/runs" + query)
    assert status == 200, body
    records = json.loads(body)
    assert isinstance(records, list)
    return records


def test_sigkill_during_a_run_loses_nothing_committed(
        start_daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    path = tmp_path / "state" / "ledger.sqlite3"
    path.parent.mkdir()
    config = {"collectors": {"ledger": {"path": str(path), "flush_seconds": 0.1},
                             "gpu": {"enabled": False}}}
    daemon = start_daemon(config=config)
    started = time.time()
    push(daemon, description(started=started), step(0))
    stop = threading.Event()
    steps = [0]

    def keep_stepping() -> None:  # the run goes on while the daemon dies
        while not stop.is_set():
            steps[0] += 10
            try:
                push(daemon, step(steps[0]))
            except OSError:
                return
            time.sleep(0.02)

    pusher = threading.Thread(target=keep_stepping)
    pusher.start()
    try:
        wait_for(lambda: any(r["summary"]["steps"] > 0  # type: ignore[index,operator]
                             for r in runs(daemon)))
        time.sleep(0.5)  # many flushes, the last one possibly half-done
        daemon.process.send_signal(signal.SIGKILL)
        daemon.process.wait(10)
    finally:
        stop.set()
        pusher.join()

    with Ledger.open(path) as ledger:  # opens: no corruption, nothing to repair
        [record] = ledger.runs()
    assert (record.run, record.end_reason) == ("run-a", None)
    assert record.summary["steps"] > 0  # type: ignore[operator]
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    assert connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    connection.close()

    restarted = start_daemon(config=config)
    [served] = runs(restarted, "?job=resnet50")
    assert served["run"] == "run-a" and served["node"] == record.node
    push(restarted, description(started=started), step(steps[0] + 100))
    wait_for(lambda: runs(restarted)[0]["summary"]["steps"] >= steps[0] + 100)  # type: ignore[index,operator]
    status, body = restarted.get("/api/v1/runs/run-a")
    assert status == 200 and [r["run"] for r in json.loads(body)] == ["run-a"]
    assert restarted.get("/api/v1/runs/run-zzz")[0] == 404
    assert restarted.get("/api/v1/runs?since=yesterday")[0] == 400
    status, body = restarted.get("/healthz")
    health = json.loads(body)["collectors"]["ledger"]
    assert health["open"] is True and health["stored_runs"] == 1


def test_a_daemon_without_its_state_directory_serves_and_says_so(
        start_daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    path = tmp_path / "absent" / "ledger.sqlite3"
    daemon = start_daemon(config={"collectors": {"ledger": {"path": str(path)},
                                                 "gpu": {"enabled": False}}})
    status, body = daemon.get("/healthz")
    health = json.loads(body)["collectors"]["ledger"]
    assert status == 200 and health["open"] is False
    assert "does not exist" in health["ledger_error"]
    assert "trainmon_ledger_up 0.0" in daemon.metrics()
    status, body = daemon.get("/api/v1/runs")
    assert status == 503 and json.loads(body)["error"] == "ledger_unavailable"
    assert not path.parent.exists()

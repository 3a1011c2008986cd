"""Readers of the run ledger cannot make the daemon lose records.

A real ``trainmon serve`` records a real training process (``Reporter`` over
the unix socket) while ``GET /api/v1/runs`` is served several times and
outside processes read and back up the file as docs/deploy.md tells operators
to (Python's ``sqlite3`` and ``Connection.backup``; the ``sqlite3`` shell's
``.backup`` where it is installed). Closing a descriptor of the database in
the daemon's process would drop its POSIX locks: the next outside reader then
deletes the ``-wal``/``-shm`` under the running daemon, later records are
invisible, and a SIGKILL loses them. Here: the daemon never holds a deleted
ledger file open, outside readers keep seeing new records, and everything an
outside reader saw before the SIGKILL is in the file after it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.daemon import Daemon
from trainmon.ledger import Ledger

pytestmark = pytest.mark.integration

JOB, RUN = "readers", "readers-a"
#: A training loop that steps every 10 ms until its stop file appears (or 120 s pass).
CLIENT = """
import sys, time
from pathlib import Path
from trainmon.client import Reporter
stop = Path(sys.argv[2])
with Reporter("readers", endpoint=sys.argv[1], interval_seconds=0.05,
              run="readers-a") as reporter:
    deadline = time.monotonic() + 120
    while not stop.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
        reporter.step(samples=32)
"""
#: An outside reader: opens the file read-write as the sqlite3 shell does, prints the
#: steps of every run, optionally backs it up with the online backup API.
READER = """
import json, sqlite3, sys
source = sqlite3.connect(sys.argv[1], timeout=5)
rows = source.execute("SELECT run, summary FROM runs").fetchall()
if len(sys.argv) > 2:
    target = sqlite3.connect(sys.argv[2])
    source.backup(target)
    target.close()
source.close()
print(json.dumps({run: json.loads(summary)["steps"] for run, summary in rows}))
"""
#: How long new records may take to become visible to an outside reader (s).
VISIBLE_TIMEOUT_SECONDS = 15.0


def outside_read(path: Path, backup: Path | None = None) -> int:
    """The steps of the run as a separate process reads them (0 before its record)."""
    command = [sys.executable, "-c", READER, str(path), *([str(backup)] if backup else [])]
    done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=True)
    return int(json.loads(done.stdout).get(RUN, 0))


def deleted_ledger_files(pid: int, path: Path) -> list[str]:
    """The daemon's open descriptors of files of the ledger that were unlinked."""
    found = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except FileNotFoundError:  # closed meanwhile
            continue
        if target.startswith(str(path)) and target.endswith(" (deleted)"):
            found.append(target)
    return found


def wait_for_steps(path: Path, above: int, timeout: float = VISIBLE_TIMEOUT_SECONDS) -> int:
    """Outside reads until the run shows more than ``above`` steps; those steps."""
    deadline = time.monotonic() + timeout
    while True:
        steps = outside_read(path)
        if steps > above:
            return steps
        assert time.monotonic() < deadline, (
            f"an outside reader still sees {steps} steps after {timeout} s "
            f"(no record after {above} became visible)")
        time.sleep(0.2)


def test_readers_and_backups_never_cost_the_daemon_a_record(
        start_daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    path = tmp_path / "state" / "ledger.sqlite3"
    path.parent.mkdir()
    socket_path = tmp_path / "steps.sock"
    daemon = start_daemon(config={"collectors": {
        "ledger": {"path": str(path), "flush_seconds": 0.1},
        "training": {"socket": str(socket_path)},
        "gpu": {"enabled": False}}})
    stop = tmp_path / "stop"
    client = subprocess.Popen([sys.executable, "-c", CLIENT, f"unix://{socket_path}",
                               str(stop)])
    try:
        seen = wait_for_steps(path, 0)
        wal = path.with_name(path.name + "-wal")
        wal_inode = wal.stat().st_ino
        for _ in range(5):  # the daemon's own readers
            status, body = daemon.get("/api/v1/runs")
            assert status == 200 and [r["run"] for r in json.loads(body)] == [RUN], body
        backups = []
        for index in range(3):  # outside readers and backups, the daemon writing on
            backup = tmp_path / f"backup-{index}.sqlite3"
            seen = max(seen, outside_read(path, backup))
            backups.append(backup)
            assert deleted_ledger_files(daemon.process.pid, path) == []
            seen = wait_for_steps(path, seen)
            status, _ = daemon.get(f"/api/v1/runs/{RUN}")
            assert status == 200
        shell = shutil.which("sqlite3")
        if shell is not None:  # the commands docs/deploy.md gives, and the older one
            for options in (["-readonly"], []):
                backup = tmp_path / f"backup-shell{len(options)}.sqlite3"
                subprocess.run([shell, *options, str(path), f".backup {backup}"],
                               check=True, timeout=30)
                backups.append(backup)
                assert deleted_ledger_files(daemon.process.pid, path) == []
                seen = wait_for_steps(path, seen)
        assert wal.exists() and wal.stat().st_ino == wal_inode, "the -wal file was replaced"
        assert deleted_ledger_files(daemon.process.pid, path) == []
        seen = max(seen, outside_read(path))
        daemon.process.send_signal(signal.SIGKILL)
        daemon.process.wait(10)
    finally:
        stop.touch()
        client.wait(30)

    with Ledger.open(path) as ledger:
        [record] = ledger.runs(job=JOB)
    assert record.summary["steps"] >= seen > 0  # type: ignore[operator]
    for backup in backups:  # every backup is a ledger holding the run
        with Ledger.open(backup) as copy:
            assert [r.run for r in copy.runs()] == [RUN]

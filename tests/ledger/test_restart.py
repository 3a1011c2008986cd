"""Real daemons, real ``torchrun`` jobs (``tests/ledger/rate_job.py``): a daemon killed
with SIGKILL and restarted while the job goes on continues the same run (one record,
every sample once, the job's rate and duration); a run that ends while the daemon is
down is closed ``lost`` at its last report once the daemon is back; a second daemon on
the same ledger is refused it, says who holds it, and serves its metrics on."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from testkit.daemon import Daemon, serve
from tests.ledger.ledger_support import WORLD_SIZE, finish, launch, wait_for_record

pytestmark = pytest.mark.integration

FLUSH_SECONDS = 1.0


@pytest.fixture
def socket_folder() -> Iterator[str]:
    """A short folder for training sockets (a unix socket path has 107 bytes)."""
    with tempfile.TemporaryDirectory(prefix="tm-", dir="/tmp") as folder:
        yield folder


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Callable[[Path], Daemon]]:
    """``start(config_file)``: a daemon on that config (the same file: the same socket
    and ledger, as a restarted service has); all stopped at the end."""
    started: list[Daemon] = []

    def start(config: Path) -> Daemon:
        daemon = serve(config, tmp_path / f"trainmon-{len(started)}.log")
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.stop()


def config_file(tmp_path: Path, name: str, socket: str, ledger: Path,
                **settings: object) -> Path:
    path = tmp_path / f"{name}.yml"
    path.write_text(yaml.safe_dump({"collectors": {
        "training": {"socket": socket},
        "ledger": {"path": str(ledger), "flush_seconds": FLUSH_SECONDS, **settings},
        "gpu": {"enabled": False}}}))
    return path


def kill(daemon: Daemon) -> None:
    daemon.process.send_signal(signal.SIGKILL)
    daemon.process.wait(10)


def test_a_daemon_killed_and_restarted_during_a_run_goes_on_recording_it(
        daemons: Callable[[Path], Daemon], tmp_path: Path, socket_folder: str) -> None:
    ledger = tmp_path / "ledger.sqlite3"
    socket = f"{socket_folder}/steps.sock"
    config = config_file(tmp_path, "node", socket, ledger)
    daemon = daemons(config)
    results = tmp_path / "results"
    job = launch(30.0, results, f"unix://{socket}", "restart")
    wait_for_record(ledger, "restart", lambda record: int(record.summary["steps"]) > 40,  # type: ignore[call-overload]
                    timeout=60)
    kill(daemon)
    time.sleep(3.0)  # down for a while: the job's reports meanwhile are not delivered
    restarted = daemons(config)
    truth = finish(job, results, timeout=120)
    records = wait_for_record(ledger, "restart", lambda record: record.end_reason is not None,
                              timeout=30)
    assert len(records) == 1, records  # one run, not a second one
    [record] = records
    assert (record.run, record.end_reason, record.ranks) == (truth.run, "finished", WORLD_SIZE)
    # every step once: the reporters' totals are cumulative, taken whole after the restart
    assert (record.summary["steps"], record.summary["samples"]) == (truth.steps, truth.samples)
    assert record.summary["samples_per_second"] == pytest.approx(truth.samples_per_second,
                                                                 rel=0.02)
    assert record.summary["duration_seconds"] == pytest.approx(truth.ended - truth.started,
                                                               abs=1.0)
    assert "resuming the ledger record of run" in restarted.log()
    assert "closed as lost" not in restarted.log()


def test_a_run_that_ended_while_the_daemon_was_down_is_closed_lost(
        daemons: Callable[[Path], Daemon], tmp_path: Path, socket_folder: str) -> None:
    ledger = tmp_path / "ledger.sqlite3"
    socket = f"{socket_folder}/steps.sock"
    # stall_seconds 3: the grace within which a reporter must continue the run
    config = config_file(tmp_path, "node", socket, ledger, stall_seconds=3)
    daemon = daemons(config)
    results = tmp_path / "results"
    job = launch(12.0, results, f"unix://{socket}", "downtime")
    [seen] = wait_for_record(ledger, "downtime",
                             lambda record: int(record.summary["steps"]) > 20,  # type: ignore[call-overload]
                             timeout=60)
    kill(daemon)
    killed = time.time()
    truth = finish(job, results, timeout=120)  # it ends while no daemon listens
    assert truth.ended > killed
    [running] = wait_for_record(ledger, "downtime", lambda record: True, timeout=5)
    assert running.end_reason is None  # the file still says so
    restarted = daemons(config)
    [record] = wait_for_record(ledger, "downtime", lambda record: record.end_reason == "lost",
                               timeout=30)
    assert record.run == truth.run
    assert seen.started <= record.ended <= killed  # type: ignore[operator]
    assert record.ended >= running.updated - FLUSH_SECONDS  # type: ignore[operator]
    assert record.summary["duration_seconds"] == pytest.approx(
        record.ended - record.started, abs=1e-6)  # type: ignore[operator]
    assert "closed as lost at their last report: " + f"{truth.run} of downtime" \
        in restarted.log()


def test_a_second_daemon_on_the_same_ledger_is_refused_it_and_serves_on(
        daemons: Callable[[Path], Daemon], tmp_path: Path, socket_folder: str) -> None:
    ledger = tmp_path / "ledger.sqlite3"
    first = daemons(config_file(tmp_path, "first", f"{socket_folder}/a.sock", ledger))
    second = daemons(config_file(tmp_path, "second", f"{socket_folder}/b.sock", ledger))
    status, body = second.get("/healthz")
    health = json.loads(body)["collectors"]["ledger"]
    assert status == 200 and health["open"] is False and health["state"] == "degraded"
    holder = f"held by another trainmon daemon (pid {first.process.pid} on "
    assert holder in health["ledger_error"]
    assert "trainmon_ledger_up 0.0" in second.metrics()
    assert "trainmon_ledger_up 1.0" in first.metrics()
    lines = [line for line in second.log().splitlines() if holder in line]
    assert len(lines) == 1, second.log()
    # readers take no lock: trainmon runs reads the file both daemons name
    listed = subprocess.run([sys.executable, "-m", "trainmon", "runs", "--ledger", str(ledger),
                             "--json"], capture_output=True, text=True, timeout=60, check=False)
    assert listed.returncode == 0 and json.loads(listed.stdout) == {"runs": []}, listed

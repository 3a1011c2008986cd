"""Two runs of a real client process against a real daemon, one variable changed: the
ledger holds both, finished, measured, with the change named and no secret anywhere; the
storage of the data and of the checkpoint, known while the run was live, is still in the
record once the reporter has exited."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from testkit.daemon import Daemon
from testkit.exposition import parse
from trainmon.ledger import Ledger
from trainmon.ledger.recorder import changed_keys

SECRET = "planted-secret-3f9a1c"
#: A training loop: ``seconds`` per step, 32 samples each, for about 3 s.
CLIENT = """
import sys, time
from trainmon.client import Reporter
seconds = float(sys.argv[2])
with Reporter("e2e", endpoint=sys.argv[1], interval_seconds=0.1,
              config={"lr": 0.1, "optimizer": {"name": "sgd"}, "hf_token": sys.argv[3]},
              data_paths=[sys.argv[4]]) as reporter:
    deadline = time.monotonic() + 3.0
    saved = False
    while time.monotonic() < deadline:
        time.sleep(seconds)
        reporter.step(samples=32)
        if not saved and time.monotonic() > deadline - 2.0:
            reporter.checkpoint_saved(sys.argv[4] + "/step.ckpt", 0.01)
            saved = True
"""


def train(daemon: Daemon, run: str, seconds: float, data: Path,
          environment: dict[str, str]) -> subprocess.Popen[str]:
    env = {**os.environ, "TRAINMON_RUN_ID": run, "TORCH_AUTH_TOKEN": SECRET, **environment}
    return subprocess.Popen([sys.executable, "-c", CLIENT, daemon.url, str(seconds), SECRET,
                             str(data)], env=env, text=True)


def wait_for(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_two_runs_one_change(start_daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    daemon = start_daemon(config={"collectors": {
        "ledger": {"path": str(path), "flush_seconds": 0.2, "node": "node-7"},
        "gpu": {"enabled": False}}})
    data = tmp_path / "data"
    data.mkdir()

    first = train(daemon, "e2e-a", 0.01, data, {"NCCL_IB_DISABLE": "0"})
    assert first.wait(60) == 0
    second = train(daemon, "e2e-b", 0.02, data, {"NCCL_IB_DISABLE": "1"})
    changes: set[str] = set()

    def seen_change() -> bool:
        scrape = parse(daemon.metrics())
        changes.update(labels["changed"] for labels
                       in scrape.labelsets("trainmon_training_run_changes_info")
                       if labels["run"] == "e2e-b")
        return bool(changes)

    wait_for(seen_change)
    status, body = daemon.get("/api/v1/runs/e2e-b?job=e2e")
    assert status == 200
    [live] = json.loads(body)
    assert second.wait(60) == 0

    def both_finished() -> bool:
        with Ledger.open(path) as ledger:
            return [r.end_reason for r in ledger.runs(job="e2e")] == ["finished", "finished"]

    wait_for(both_finished)
    with Ledger.open(path) as ledger:
        b, a = ledger.runs(job="e2e")
    assert (a.run, b.run, a.node) == ("e2e-a", "e2e-b", "node-7")
    assert changes == {"NCCL_IB_DISABLE"}
    assert changed_keys(a.description, b.description) == "NCCL_IB_DISABLE"
    assert a.config_hash == b.config_hash
    [where] = a.description["data_paths"]  # type: ignore[misc]
    assert where["path"] == str(data)  # the test's tmp folder: whatever holds it, but known
    assert where["storage"] != "unknown" and where["mountpoint"], where
    # the reporter is gone: the finished record keeps what the live one said
    assert b.description["data_paths"] == live["description"]["data_paths"] == [where]
    assert (a.summary["checkpoints"], b.summary["checkpoints"]) == (1, 1)
    last = b.summary["last_checkpoint"]
    assert isinstance(last, dict) and last["path"] == f"{data}/step.ckpt"
    assert (last["mountpoint"], last["fstype"], last["storage"]) == (
        where["mountpoint"], where["fstype"], where["storage"])
    rate_a = a.summary["samples_per_second_median"]
    rate_b = b.summary["samples_per_second_median"]
    assert isinstance(rate_a, float) and isinstance(rate_b, float)
    assert 0.3 < rate_b / rate_a < 0.8  # twice the time per step (plus the loop's own cost)
    assert a.summary["steps"] and 2.5 < a.summary["duration_seconds"] < 6  # type: ignore[operator]
    # the planted secret: nowhere
    assert SECRET.encode() not in path.read_bytes()
    assert SECRET not in daemon.metrics()
    status, body = daemon.get("/api/v1/runs?job=e2e")
    assert status == 200 and SECRET not in body and len(json.loads(body)) == 2
    daemon.stop()
    assert SECRET not in daemon.log()
    assert a.description["config"]["hf_token"] == "<redacted>"  # type: ignore[index]
    assert a.description["environment"]["TORCH_AUTH_TOKEN"] == "<redacted>"  # type: ignore[index]


def test_a_run_that_ends_just_before_the_daemon_stops_is_recorded_finished(
        start_daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    """The reporter's last payload (final totals, then "ended") is still in the socket's
    queue or the store when SIGTERM arrives: the receiver's last drain and the ledger's
    last flush, in that order, record the run finished with every step."""
    path = tmp_path / "ledger.sqlite3"
    daemon = start_daemon(config={"collectors": {
        "ledger": {"path": str(path), "flush_seconds": 3600.0},  # only the last flush
        "gpu": {"enabled": False}}})
    socket_path = yaml_socket(daemon)
    finished = subprocess.run(
        [sys.executable, "-c", """
import sys
from trainmon.client import Reporter
with Reporter("e2e", endpoint=sys.argv[1], run="late", interval_seconds=3600) as reporter:
    for _ in range(25):
        reporter.step(samples=4)
""", f"unix://{socket_path}"], env={**os.environ}, timeout=60, check=False)
    assert finished.returncode == 0
    assert daemon.stop() == 0
    with Ledger.open(path) as ledger:
        [record] = ledger.get("late")
    assert (record.end_reason, record.summary["steps"], record.summary["samples"]) == (
        "finished", 25, 100)


def yaml_socket(daemon: Daemon) -> str:
    """The training socket a ``start_daemon`` daemon was configured with."""
    assert daemon.config_path is not None
    settings = yaml.safe_load(daemon.config_path.read_text())
    return str(settings["collectors"]["training"]["socket"])

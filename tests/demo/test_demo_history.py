"""The demo's run history: the seeded faster runs, the runs each start adds (two of them
crash on purpose, and the start log says so), and ``trainmon doctor`` showing both jobs
about 30 % slower than their seeded baselines."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.daemon import Daemon, trainmon_command
from trainmon.demo.history import EARLIER_RUNS, STALE_SECONDS, seed_history
from trainmon.demo.jobs import DEMO_JOBS, restart_run_id, run_id, runs_per_start, start_note
from trainmon.ledger import Ledger
from trainmon.ledger.config import LedgerConfig

#: How long the demo's restarted runs may take to have a settled rate in the ledger
#: (they start 10 and 25 s after the demo; the ledger flushes every 2 s here).
RESTARTS_RECORDED_SECONDS = 120.0
#: Seconds of steps after which a run's rate is its own (the demo's start log says 20).
SETTLED_SECONDS = 20.0


def test_each_start_adds_a_crashed_run_and_its_restart_per_job() -> None:
    started = 1.8e9
    assert runs_per_start() == 4
    assert start_note(started) == (
        "4 new runs in the ledger: demo-starved-20270115T080000Z crashes on purpose 22 s "
        "after the start and goes on as demo-starved-20270115T080022Z; "
        "demo-healthy-20270115T080000Z crashes on purpose 10 s after the start and goes on "
        "as demo-healthy-20270115T080010Z")
    for job in DEMO_JOBS:
        assert restart_run_id(job, started) not in (None, run_id(job, started))


def test_the_seeded_runs_are_written_once_and_dated_again_when_stale(tmp_path: Path) -> None:
    config = LedgerConfig(path=tmp_path / "demo-ledger.sqlite3")
    now = 1.8e9
    first = seed_history(config, sys_root=tmp_path, now=now)
    assert sorted(record.run for record in first) == sorted(run.run for run in EARLIER_RUNS)
    assert all(record.end_reason == "finished" and record.world_size == 4 and record.ranks == 4
               for record in first)
    assert seed_history(config, sys_root=tmp_path, now=now + STALE_SECONDS - 3600) == []
    later = now + STALE_SECONDS + 3600
    again = seed_history(config, sys_root=tmp_path, now=later)
    assert [record.ended for record in again] == [later - 1800.0] * len(EARLIER_RUNS)
    with Ledger.open(config.file) as ledger:
        assert ledger.count() == len(EARLIER_RUNS)  # still one copy of each
    for record in first:
        summary = record.summary
        # the exact rate and the window median agree for a steady simulated run
        assert summary["samples_per_second"] == pytest.approx(
            summary["samples_per_second_median"], rel=0.02)


def trainmon(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*trainmon_command(), *args], capture_output=True, text=True,
                          timeout=120, check=False)


def restarts(log: str) -> dict[str, str]:
    """Each job's run that goes on after its crash, as the start log names it."""
    return {found.group(1): found.group(0).split()[-1] for found in re.finditer(
        r"(demo-[a-z]+)-\d{8}T\d{6}Z crashes on purpose [\d.]+ s after the start and goes "
        r"on as \S+?(?=;|$)", log, re.MULTILINE)}


def recorded(ledger: Path, runs: dict[str, str]) -> bool:
    """Every run of ``runs`` (job → run) has stepped ``SETTLED_SECONDS`` in the ledger."""
    result = trainmon("runs", "--json", "--ledger", str(ledger))
    if result.returncode != 0:
        return False
    rated = {(run["job"], run["run"]) for run in json.loads(result.stdout)["runs"]
             if (run["summary"].get("active_seconds") or 0) >= SETTLED_SECONDS}
    return set(runs.items()) <= rated


@pytest.mark.integration
def test_doctor_shows_the_demo_slower_than_its_seeded_baselines(
        start_daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    daemon = start_daemon(config={"collectors": {"ledger": {"flush_seconds": 2}}},
                          args=["--demo"])
    ledger = tmp_path / "ledger-0.sqlite3"
    deadline = time.monotonic() + RESTARTS_RECORDED_SECONDS
    while len(going_on := restarts(daemon.log())) < len(DEMO_JOBS):
        assert time.monotonic() < deadline, daemon.log()
        time.sleep(0.2)
    assert "demo: 4 new runs in the ledger: demo-starved-" in daemon.log()
    while not recorded(ledger, going_on):
        assert time.monotonic() < deadline, daemon.log()
        time.sleep(1.0)

    result = trainmon("doctor", "--url", daemon.url, "--ledger", str(ledger), "--seconds", "2")
    lines = result.stdout.splitlines()
    index = lines.index("Run history (this node's ledger)")
    history = {line.split(":")[0].strip(): line for line in lines[index + 1:index + 3]}
    # about −29 % and −32 % on an idle host; the simulated steps are sleeps, which a busy
    # host only lengthens
    for job, (low, high) in {"demo-healthy": (-0.5, -0.22),
                             "demo-starved": (-0.5, -0.26)}.items():
        found = re.fullmatch(
            rf"   {job}: run {going_on[job]} at [\d ]+ samples/s, −(\d+) % compared "
            rf"with run {job}-baseline \(finished 3\d min ago, same world size 4 on 1 node\): "
            r"slower by more than 20 %; trainmon compare .*", history[job])
        assert found is not None, history[job]
        assert low <= -int(found.group(1)) / 100 <= high, history[job]
    document = json.loads(trainmon("doctor", "--url", daemon.url, "--ledger", str(ledger),
                                   "--seconds", "2", "--json").stdout)
    assert {entry["job"]: entry["previous_run"] for entry in document["previous_runs"]} == {
        "demo-healthy": "demo-healthy-baseline", "demo-starved": "demo-starved-baseline"}

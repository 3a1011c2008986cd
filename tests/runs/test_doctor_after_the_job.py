"""``trainmon doctor`` on a node whose job ended: a real daemon recorded the run, no job
reports any more and there is no GPU; doctor shows how the run ended and what to run
next, exit 0, in English and in Chinese."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from testkit.daemon import Daemon, trainmon_command
from trainmon.client import Reporter

pytestmark = pytest.mark.integration

JOB = "after-the-job"
RUN = "after-the-job-1"
#: Seconds the run's ledger record may take to say it finished (a flush a second here).
RECORDED_SECONDS = 30.0


def trainmon(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*trainmon_command(), *args], capture_output=True, text=True,
                          timeout=120, check=False)


def finished(ledger: Path) -> dict[str, object] | None:
    result = trainmon("runs", "--json", "--ledger", str(ledger), "--job", JOB)
    if result.returncode != 0:
        return None
    runs = json.loads(result.stdout)["runs"]
    if runs and runs[0]["end_reason"] == "finished" and runs[0]["summary"].get(
            "samples_per_second"):
        return dict(runs[0])
    return None


def test_doctor_after_the_job_shows_its_last_run(
        start_daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    daemon = start_daemon(config={"collectors": {"gpu": {"enabled": False},
                                                 "ledger": {"flush_seconds": 1}}})
    config = yaml.safe_load(Path(daemon.config_path or "").read_text())
    socket, ledger = (config["collectors"]["training"]["socket"],
                      Path(config["collectors"]["ledger"]["path"]))
    reporter = Reporter(JOB, rank=0, world_size=1, endpoint=f"unix://{socket}", run=RUN,
                        config={"model": "tiny"}, interval_seconds=0.2)
    for batch in reporter.track(iter([32] * 40)):
        time.sleep(0.05)
        reporter.step(samples=batch)
    reporter.close(finished=True)
    deadline = time.monotonic() + RECORDED_SECONDS
    while (record := finished(ledger)) is None:
        assert time.monotonic() < deadline, daemon.log()
        time.sleep(0.5)

    result = trainmon("doctor", "--url", daemon.url, "--ledger", str(ledger),
                      "--seconds", "1")
    print(result.stdout)  # shown with -rP
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Could not measure" not in result.stdout
    lines = result.stdout.splitlines()
    index = lines.index("The last run of each job that ended within 24 h (this node's ledger)")
    assert re.fullmatch(rf"   {JOB}: run {RUN} finished \d+ s ago after \ds: [\d.]+ samples/s, "
                        r"no verdict, goodput \d+ %", lines[index + 1]), lines[index + 1]
    assert lines[index + 2] == (
        "      no earlier comparable run (same config, world size 1 on 1 node, ended, with a "
        "rate)")
    assert lines[index + 3] == f"      see: trainmon runs --job {JOB} --ledger {ledger}"
    assert lines[-1] == "No training job runs on this node now; its jobs' last runs are above."

    document = json.loads(trainmon("doctor", "--url", daemon.url, "--ledger", str(ledger),
                                   "--seconds", "1", "--json").stdout)
    assert (document["status"], document["exit_code"]) == ("ended", 0)
    [entry] = document["recent_runs"]
    summary = record["summary"]
    assert isinstance(summary, dict)
    assert (entry["run"], entry["end_reason"], entry["samples_per_second"]) == (
        RUN, "finished", summary["samples_per_second"])

    chinese = trainmon("doctor", "--url", daemon.url, "--ledger", str(ledger), "--seconds",
                       "1", "--lang", "zh")
    assert chinese.returncode == 0
    assert f"{JOB}：运行 {RUN} 于 " in chinese.stdout and "正常结束" in chinese.stdout
    without_commands = re.sub(r"trainmon [a-z]+ [^；;\n]*", "", chinese.stdout)
    assert re.findall(r"[A-Za-z]{2,}(?:[ ,]+[A-Za-z]{2,}){3,}", without_commands) == []

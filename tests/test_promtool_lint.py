"""``promtool check metrics`` finds nothing to lint in what ``trainmon serve`` exposes.

Prometheus' own linter checks names and help against its conventions (a
counter ends in ``_total`` and names no type, units are base units, every
family has HELP). The metric names are a contract, so a lint found here is
fixed by a deliberate rename (docs/metrics.md, CHANGELOG.md), never silenced.
Both the plain daemon (with one rank reporting, so that the per-rank training
families are there) and ``--demo`` (8 simulated GPUs, two jobs) are checked;
every scrape of the demo's observation window goes through promtool, because
some families appear only once its jobs and diagnosis have run a few seconds.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.daemon import Daemon
from trainmon.contract import STEP_BUCKET_COUNT

pytestmark = pytest.mark.integration

FAMILIES_FILE = Path(__file__).parent / "demo" / "demo_metric_families.txt"
#: Diagnosis and the demo jobs appear a few seconds after start.
OBSERVE_SECONDS = 40.0


def promtool() -> str:
    """promtool from Debian's ``prometheus`` package (``make test`` installs it)."""
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is not installed: run `make test` (Debian package prometheus)")
    return path


def lint(exposition: str) -> list[str]:
    """The lines ``promtool check metrics`` prints for ``exposition``; [] when clean."""
    completed = subprocess.run(
        [promtool(), "check", "metrics"], input=exposition, capture_output=True, text=True,
        timeout=60, check=False,
    )
    lines = (completed.stdout + completed.stderr).splitlines()
    if completed.returncode != 0 and not lines:
        lines = [f"promtool exited with {completed.returncode}"]
    return lines


def families(exposition: str) -> set[str]:
    return {line.split()[2] for line in exposition.splitlines() if line.startswith("# TYPE ")}


def report_line(job: str, rank: int) -> str:
    buckets = [0] * STEP_BUCKET_COUNT
    buckets[4] = 10
    return json.dumps({
        "v": 1, "job": job, "rank": rank, "world_size": 2, "reporter_id": f"lint{rank}",
        "steps": 10, "samples": 320, "step_seconds": 2.5, "data_wait_seconds": 0.5,
        "phase_seconds": {"comm": 0.4}, "step_buckets": buckets, "dropped_reports": 0,
        "checkpoints": 1, "checkpoint_seconds": 1.5, "checkpoint_path": "/tmp/lint/ckpt",
    })  # fmt: skip


def test_plain_daemon_exposition_passes_promtool(start_daemon: Callable[..., Daemon]) -> None:
    daemon = start_daemon()
    before = daemon.metrics()
    assert lint(before) == []
    body = "\n".join(report_line("lint", rank) for rank in range(2)).encode()
    request = urllib.request.Request(f"{daemon.url}/api/v1/steps", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=10) as reply:
        assert reply.status == 200
    after = daemon.metrics()
    assert "trainmon_training_steps_total" in families(after)
    assert lint(after) == []


def test_demo_exposition_passes_promtool(start_daemon: Callable[..., Daemon]) -> None:
    expected = {
        line.strip() for line in FAMILIES_FILE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }  # fmt: skip
    daemon = start_daemon(args=["--demo"])
    seen: set[str] = set()
    problems: set[str] = set()
    deadline = time.monotonic() + OBSERVE_SECONDS
    while not expected <= seen and time.monotonic() < deadline:
        exposition = daemon.metrics()
        seen |= families(exposition)
        problems.update(lint(exposition))
        time.sleep(1.0)
    # the demo's jobs reported, so the per-rank families went through promtool too
    assert {"trainmon_training_steps_total", "trainmon_training_reporter_resets_total"} <= seen
    assert sorted(problems) == []

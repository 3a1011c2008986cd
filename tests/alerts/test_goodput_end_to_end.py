"""The same goodput from the daemon, the shipped recording rules in a real Prometheus, and
``trainmon runs``: client → daemon → Prometheus, all real.

Two ranks of one job (``trainmon.client.Reporter`` threads over the daemon's Unix socket)
step with a loader that waits a third of each step and compute the rest. Prometheus
scrapes the daemon every second with ``alerts/dcgm/trainmon.rules.yml`` time-scaled by
``alerts/generate.py scale`` (× 0.025: the 10-minute window becomes 15 s, 15 scrapes).
After 25 s: ``job:trainmon_goodput:ratio_rate10m`` (the rule), ``trainmon_job_goodput_ratio``
(the daemon's own 10 minutes, the whole run) and the run's ``goodput_ratio`` in ``trainmon
runs --json`` agree within 0.05, with the job's truth (the share of its steps outside the
loader) too; ``job_bucket:trainmon_job_gpu_seconds:rate10m`` adds up to the job's 2 GPUs
(within the step of the daemon's evaluations, below).
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testkit.daemon import Daemon, trainmon_command
from testkit.exposition import parse
from testkit.prometheus import Prometheus, wait_until
from tests.alerts.alerts_support.bundle import scrape_with_scaled_rules
from trainmon.client import Reporter

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TIME_SCALE = 0.025
JOB = "goodput-e2e"
RANKS = 2
LOADER_SECONDS = 0.02
COMPUTE_SECONDS = 0.04
RUN_SECONDS = 25.0


def _rank(endpoint: str, rank: int, stop: threading.Event, waited: list[float],
          stepped: list[float]) -> None:
    reporter = Reporter(JOB, rank=rank, world_size=RANKS, endpoint=endpoint, environ={},
                        run="run-a", interval_seconds=0.5)

    def loader() -> Iterator[int]:
        while not stop.is_set():
            began = time.perf_counter()
            time.sleep(LOADER_SECONDS)
            waited.append(time.perf_counter() - began)
            yield 8

    last = time.perf_counter()
    try:
        for samples in reporter.track(loader()):
            time.sleep(COMPUTE_SECONDS)
            reporter.step(samples=samples)
            now = time.perf_counter()
            stepped.append(now - last)
            last = now
    finally:
        reporter.close()


def test_daemon_rules_and_runs_tell_the_same_goodput(
    tmp_path: Path, start_daemon: Callable[..., Daemon], prometheus: Prometheus,
) -> None:
    ledger = tmp_path / "ledger.sqlite3"
    daemon = start_daemon(config={"collectors": {
        "ledger": {"path": str(ledger), "flush_seconds": 0.5}}})
    scrape_with_scaled_rules(prometheus, daemon.port, tmp_path, TIME_SCALE)
    stop = threading.Event()
    waited: list[float] = []
    stepped: list[float] = []
    endpoint = f"unix://{tmp_path / 'steps-0.sock'}"
    ranks = [threading.Thread(target=_rank, args=(endpoint, rank, stop, waited, stepped),
                              daemon=True) for rank in range(RANKS)]
    started = time.monotonic()
    for thread in ranks:
        thread.start()
    try:
        wait_until(lambda: bool(prometheus.query(
            f'job:trainmon_goodput:ratio_rate10m{{job="{JOB}"}}')), 60,
            f"no goodput rule:\n{prometheus.log()}\n{daemon.log()}")
        # a rate is whole once its window lies after the counters' first scrape
        time.sleep(max(0.0, started + RUN_SECONDS - time.monotonic()))
        rule = float(prometheus.query(
            f'job:trainmon_goodput:ratio_rate10m{{job="{JOB}"}}')[0]["value"][1])
        gpus = sum(float(sample["value"][1]) for sample in prometheus.query(
            f'job_bucket:trainmon_job_gpu_seconds:rate10m{{job="{JOB}"}}'))
        own = parse(daemon.metrics()).value("trainmon_job_goodput_ratio", job=JOB)
    finally:
        stop.set()
        for thread in ranks:
            thread.join(timeout=10)
    truth = 1 - sum(waited) / sum(stepped)
    done = subprocess.run([*trainmon_command(), "runs", "--json", "--ledger", str(ledger)],
                          capture_output=True, text=True, timeout=30, check=True)
    (run,) = [run for run in json.loads(done.stdout)["runs"] if run["job"] == JOB]
    recorded = run["summary"]["goodput_ratio"]
    assert own is not None
    for name, value in (("rule", rule), ("daemon", own), ("ledger", recorded)):
        assert value == pytest.approx(truth, abs=0.05), (name, value, truth)
    assert abs(rule - own) <= 0.05 and abs(recorded - own) <= 0.05
    # The ledger's series change at each evaluation of the daemon's derived collectors
    # (every 3 s by default), so a 15-s rate of them is one such step (a fifth) off.
    assert gpus == pytest.approx(RANKS, rel=0.25)

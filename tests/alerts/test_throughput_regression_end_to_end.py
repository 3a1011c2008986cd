"""A rerun slower than the last run of its config pages: client → daemon → Prometheus.

Everything is real and shipped: two runs of one job with the same config, each a
``trainmon.client.Reporter`` reporting one rank's steps to ``trainmon serve`` over
its Unix socket (the run description included), and Prometheus scraping the
daemon with ``alerts/dcgm/trainmon.rules.yml`` time-scaled by
``alerts/generate.py scale`` (× 0.025: the 10-minute rate window and the
10-minute settling offset become 15 s, ``for: 15m`` 22.5 s, the 7-day best 4.2 h;
15 one-second scrapes per window keep the rate's meaning).
The first run trains at 200 samples/s and finishes; the second, 30 % slower,
must fire ``TrainmonThroughputRegression`` naming both runs, and must not
before it has run one rate window.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from testkit.daemon import Daemon
from testkit.prometheus import Prometheus, wait_until
from tests.alerts.alerts_support.bundle import scrape_with_scaled_rules
from trainmon.client import Reporter

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TIME_SCALE = 0.025
#: The scaled 10-minute rate window, which is also the settling offset, seconds.
WINDOW_SECONDS = 600 * TIME_SCALE
#: The scaled ``for: 15m``, seconds.
FOR_SECONDS = 900 * TIME_SCALE
JOB = "regress"
CONFIG = {"model": "resnet50", "batch_size": 32, "optimizer": {"lr": 0.1}}
SAMPLES_PER_STEP = 10
FAST_STEP_SECONDS = 0.05  # 200 samples/s
SLOW_STEP_SECONDS = FAST_STEP_SECONDS / 0.7  # 140 samples/s: 30 % slower
#: The first run: the settling offset plus time to record its best.
FIRST_RUN_SECONDS = WINDOW_SECONDS + 10.0
#: From the second run's start: settling + for + scrapes and evaluations.
FIRE_DEADLINE_SECONDS = WINDOW_SECONDS + FOR_SECONDS + 30.0
#: Before this the second run has not been compared at all (settling offset).
NOT_BEFORE_SECONDS = WINDOW_SECONDS


def _train(endpoint: str, run: str, step_seconds: float, until: Callable[[], bool]) -> None:
    """One rank of ``run``: a step of SAMPLES_PER_STEP samples every ``step_seconds``."""
    reporter = Reporter(JOB, rank=0, world_size=1, endpoint=endpoint, environ={}, run=run,
                        config=CONFIG, interval_seconds=1.0)
    next_step = time.monotonic()
    try:
        while not until():
            next_step += step_seconds
            time.sleep(max(0.0, next_step - time.monotonic()))
            reporter.step(samples=SAMPLES_PER_STEP)
    finally:
        reporter.close()


def _firing(prometheus: Prometheus) -> list[dict[str, Any]]:
    return prometheus.query(
        'ALERTS{alertname="TrainmonThroughputRegression", alertstate="firing"}')


def test_a_rerun_30_percent_slower_with_the_same_config_pages(
    tmp_path: Path,
    start_daemon: Callable[..., Daemon],
    prometheus: Prometheus,
) -> None:
    daemon = start_daemon(config={"collectors": {
        "ledger": {"path": str(tmp_path / "ledger.sqlite3")},
    }})
    endpoint = f"unix://{tmp_path / 'steps-0.sock'}"
    scrape_with_scaled_rules(prometheus, daemon.port, tmp_path, TIME_SCALE)

    first_ends = time.monotonic() + FIRST_RUN_SECONDS
    _train(endpoint, "run-a", FAST_STEP_SECONDS, lambda: time.monotonic() >= first_ends)
    best = prometheus.query(
        f'job_run:trainmon_training_samples_per_second_per_rank:best7d{{job="{JOB}"}}')
    assert [sample["metric"]["run"] for sample in best] == ["run-a"], best
    assert float(best[0]["value"][1]) == pytest.approx(200, rel=0.1), best

    stop = threading.Event()
    second_started = time.monotonic()
    second = threading.Thread(target=_train, args=(endpoint, "run-b", SLOW_STEP_SECONDS,
                                                   stop.is_set), daemon=True)
    second.start()
    try:
        time.sleep(NOT_BEFORE_SECONDS - 3)
        assert prometheus.query(
            'job_run:trainmon_training_throughput_vs_best:ratio{run="run-b"}') == [], (
            "compared before its rate window held only its own steps")
        assert _firing(prometheus) == []
        wait_until(
            lambda: bool(_firing(prometheus)),
            FIRE_DEADLINE_SECONDS - (time.monotonic() - second_started),
            f"TrainmonThroughputRegression for run-b; prometheus log:\n{prometheus.log()}\n"
            f"daemon log:\n{daemon.log_path.read_text()}",
        )
    finally:
        stop.set()
        second.join(timeout=10)

    (alert,) = _firing(prometheus)
    labels = alert["metric"]
    assert (labels["job"], labels["run"], labels["best_run"]) == (JOB, "run-b", "run-a")
    assert labels["severity"] == "warning"
    # both runs' shape: world size 1 (as the reporters say) on this one node
    assert (labels["world_size"], labels["nodes"]) == ("1", "1")
    (config_hash,) = {sample["metric"]["config_hash"] for sample in
                      prometheus.query(f'trainmon_training_run_info{{job="{JOB}"}}')}
    assert labels["config_hash"] == config_hash
    (ratio,) = prometheus.query(
        'job_run:trainmon_training_throughput_vs_best:ratio{run="run-b"}')
    assert float(ratio["value"][1]) == pytest.approx(0.7, abs=0.07), ratio
    groups = prometheus.api("rules", [("type", "alert")])["groups"]
    (rule,) = [rule for group in groups for rule in group["rules"]
               if rule["name"] == "TrainmonThroughputRegression"]
    (active,) = rule["alerts"]
    assert "trainmon compare run-a run-b" in active["annotations"]["description"]
    assert "shape (1 rank on 1 node)" in active["annotations"]["description"]

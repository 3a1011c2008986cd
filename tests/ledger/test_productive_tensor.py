"""How much of a job's productive time had its tensor pipes busy (GPM): the mean tensor
activity the diagnosis saw over the goodput window, over the job's goodput."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.core import GaugeMetricFamily

from testkit.exposition import scrape
from tests.ledger.ledger_support import Clocks, description, make_recorder, send, step


def tensor_activity(value: float, job: str = "resnet50") -> GaugeMetricFamily:
    family = GaugeMetricFamily("trainmon_diagnosis_tensor_active_ratio", "", labels=["job"])
    family.add_metric([job], value)
    return family


def test_productive_time_with_the_tensor_pipes_busy(tmp_path: Path) -> None:
    """Steps that are 65 % productive (a quarter data wait, a tenth communication) on GPUs
    whose tensor pipes are active 39 % of the time: 60 % of the productive time."""
    clocks = Clocks()
    training, ledger = make_recorder(clocks, tmp_path / "ledger.sqlite3",
                                     flush_seconds=3600.0)()
    ledger.start()
    try:
        send(training, description(started=clocks.wall), step(0))
        ledger.tick()
        before = scrape(ledger)
        for steps in (100, 200, 300):
            clocks.advance(10)
            send(training, step(steps))
            ledger.tick()
            ledger.observe([tensor_activity(0.39), tensor_activity(0.5, job="unknown-job")])
        after = scrape(ledger)
    finally:
        ledger.stop()
        training.stop()
    assert before.value("trainmon_job_productive_tensor_active_ratio", job="resnet50") is None
    assert after.value("trainmon_job_goodput_ratio", job="resnet50") == pytest.approx(0.65)
    assert after.value("trainmon_job_productive_tensor_active_ratio", job="resnet50") \
        == pytest.approx(0.6)
    # a job without goodput series is not remembered
    assert after.value("trainmon_job_productive_tensor_active_ratio", job="unknown-job") is None

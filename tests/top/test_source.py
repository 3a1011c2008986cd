"""``trainmon top``'s sources against real servers: a real Prometheus (Debian's) scraping
``trainmon serve --demo`` every second, read through its federation endpoint
(``FederationSource``, the node found by its job: ``nodes_of_job``), and a daemon
(``DaemonSource``) that goes away and comes back."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.daemon import Daemon, ready, trainmon_command
from testkit.prometheus import Prometheus, wait_until
from trainmon.diagnosis.thresholds import DiagnosisConfig
from trainmon.doctor import MeasurementError
from trainmon.local_daemon import DaemonTrust
from trainmon.top.model import Recorder, TopView
from trainmon.top.source import DaemonSource, FederationSource, SnapshotSource, nodes_of_job

pytestmark = pytest.mark.integration


def read_until(source: SnapshotSource, recorder: Recorder,
               condition: Callable[[TopView], bool], timeout: float) -> TopView:
    """Read ``source`` each second into ``recorder`` until its view satisfies ``condition``."""
    deadline = time.monotonic() + timeout
    shown = recorder.view(source.name)
    while time.monotonic() < deadline:
        try:
            recorder.add(source.read())
            shown = recorder.view(source.name)
        except MeasurementError as error:
            shown = recorder.view(source.name, str(error))
        if condition(shown):
            return shown
        time.sleep(1.0)
    raise AssertionError(f"timed out after {timeout:.0f}s; last view: {shown}")


def ranks_of(shown: TopView, job: str) -> list[str]:
    return [row.rank for each in shown.jobs if each.job == job for row in each.ranks]


def test_one_node_read_through_prometheus_federation_shows_its_jobs_and_ranks(
        start_daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    daemon = start_daemon(args=["--demo"])
    instance = f"127.0.0.1:{daemon.port}"
    prometheus = Prometheus(tmp_path).start({
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [{"job_name": "trainmon", "honor_labels": True,
                            "static_configs": [{"targets": [instance]}]}]})
    try:
        assert wait_until(lambda: nodes_of_job(prometheus.url, "demo-healthy"), 20,
                          "demo-healthy in Prometheus") == [instance]
        source = FederationSource(prometheus.url, instance)
        recorder = Recorder(DiagnosisConfig(), {"kind": "url", "url": source.name})
        shown = read_until(source, recorder, lambda view: ranks_of(view, "demo-healthy") == [
            "0", "1", "2", "3"] and all(
                row.step_seconds is not None and row.samples_per_second
                for each in view.jobs for row in each.ranks if each.job == "demo-healthy"), 30)
        healthy = next(each for each in shown.jobs if each.job == "demo-healthy")
        # its steps take about 0.25 s; rates span Prometheus' scrapes, not our reads
        assert all(0.2 < (row.step_seconds or 0) < 0.4 for row in healthy.ranks), healthy
        assert all(row.gpu_utilization is not None for row in healthy.ranks), healthy
        assert ranks_of(shown, "demo-starved") == ["0", "1", "2", "3"]
        assert not shown.problem
        assert nodes_of_job(prometheus.url, "no-such-job") == []
        with pytest.raises(MeasurementError, match="no trainmon series"):
            FederationSource(prometheus.url, "10.9.9.9:19400").read()
    finally:
        prometheus.stop()


def test_a_daemon_that_goes_away_is_an_error_and_the_next_one_is_checked_again(
        start_daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    daemon = start_daemon()
    source = DaemonSource(daemon.url, DaemonTrust.default())
    assert source.read().samples and source.changed()
    assert source.read().samples and not source.changed()
    daemon.stop()
    with pytest.raises(MeasurementError, match="Connection refused"):
        source.read()
    assert daemon.config_path is not None
    log = tmp_path / "again.log"
    with log.open("w") as output:
        process = subprocess.Popen(
            [*trainmon_command(), "serve", "--config", str(daemon.config_path),
             "--listen", f"127.0.0.1:{daemon.port}"],
            stdout=output, stderr=subprocess.STDOUT, text=True)
    again = ready(Daemon(process, daemon.port, log, daemon.config_path))
    try:
        assert source.read().samples and source.changed()  # its owner checked again
    finally:
        again.stop()

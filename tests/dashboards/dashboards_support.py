"""Helpers of the dashboard tests (``test_dashboard_queries.py``, ``test_demo_panels.py``)
and of ``tests/scale/test_fleet.py``: the stack's node names and credentials, starting a
``trainmon serve``, the bundle's Prometheus configuration aimed at the stack's targets,
its rule files (the goodput ledger's day rules time-scaled, ``DAY_GROUPS``), and the
metrics nothing in the stack produces yet."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from testkit.daemon import Daemon, free_port, trainmon_command, wait_ready
from testkit.dashboard_files import REPO
from testkit.prometheus import QueryAPI
from tests.alerts.alerts_support.bundle import run_script

#: Metrics of the contract (or series of one: ``name{label="value"}``) that no source in
#: this stack produces; queries over them may come back empty. Each must really be absent
#: (``test_dashboard_queries.test_expected_empty_metrics_are_still_empty``).
EXPECTED_EMPTY: dict[str, str] = {
    "trainmon_gpu_xid_errors_total": "the demo node simulates no XID errors (exporter/trainmon/demo/gpus.py)",
    "trainmon_gpu_xid_last_timestamp_seconds": "the demo node simulates no XID errors",
    "trainmon_node_spot_termination_timestamp_seconds": (
        "the demo instance is not being reclaimed (exporter/trainmon/demo/cvm.py); "
        "tests/alerts/test_spot_reclaim_end_to_end.py schedules a reclaim"),
    # The run-ledger comparison needs an earlier run of the same job and config that ran
    # for the 10-minute rate window and ended; the demo's jobs run one run each for the
    # minute this test lasts. alerts/tests/runs.test.yml checks these rules.
    "job_config:trainmon_training_samples_per_second_per_rank:best7d": (
        "no demo run has ended after running 10 minutes, so none is a comparison"),
    "job_run:trainmon_training_throughput_vs_best:ratio": (
        "no demo run has an earlier comparable run (see the line above)"),
    # The Training overview's clean run-end markers: the demo's runs go on while the test
    # lasts (their early crashes are run failures; their earlier runs are history in the
    # ledger, not ends the recorder saw).
    'trainmon_training_run_end_timestamp_seconds{reason="finished"}': (
        "no demo run finishes while the test lasts; tests/ledger/test_end_reasons.py ends some"),
}


SCRAPE_SECONDS = 1.0
#: After every target is up: enough scrapes for rate() over $__rate_interval (4 s).
SETTLE_SECONDS = 8.0
NODE = "gpu-node-1"
PULLER_NODE = "cloud-puller"
#: GPUs the fake dcgm-exporter watches; the daemon's demo node has 0–7.
DCGM_DEVICES = tuple(range(6))
SECRET_ID = "AKIDdashboardtest0001"
SECRET_KEY = "dashboard-test-secret-key-0123456789"


def start_trainmon(tmp: Path, name: str, config: dict[str, object], args: list[str],
                   env: dict[str, str]) -> Daemon:
    port = free_port()
    config_path = tmp / f"{name}.yml"
    config_path.write_text(yaml.safe_dump(config))
    log_path = tmp / f"{name}.log"
    process = subprocess.Popen(
        [*trainmon_command(), "serve", "--config", str(config_path),
         "--listen", f"127.0.0.1:{port}", *args],
        stdout=log_path.open("w"), stderr=subprocess.STDOUT, text=True,
        env={**os.environ, **env},
    )
    daemon = Daemon(process, port, log_path, config_path)
    wait_ready(daemon)
    return daemon


def aim_scrape_jobs(config: dict[str, Any], shipped: Path, tmp: Path, variant: str,
                    targets: dict[str, tuple[str, str]]) -> None:
    """Scrape every second, each job of ``config`` at its stack target.

    ``targets`` maps a scrape job of the shipped config to (address, node label).
    """
    config["global"].update(scrape_interval=f"{SCRAPE_SECONDS:g}s",
                            scrape_timeout=f"{SCRAPE_SECONDS:g}s")
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == set(targets), f"{shipped.name} scrapes {sorted(jobs)}"
    for name, (address, node) in targets.items():
        job = jobs[name]
        target_file = tmp / f"targets-{variant}-{name}.yml"
        target_file.write_text(yaml.safe_dump([{"targets": [address], "labels": {"node": node}}]))
        job["file_sd_configs"] = [{"files": [str(target_file)]}]
        job.pop("scrape_interval", None)  # the puller's 60 s would make the test wait minutes
        job.pop("scrape_timeout", None)


#: The goodput ledger's day rules add up the hour's at every full hour of the day
#: (``sum_over_time(…:rate1h[1d:1h] offset 1s)``), so they have nothing until an hour
#: has ended since the rules started: an hour boundary the minute a test lasts rarely
#: crosses. Their group runs time-scaled by DAY_TIME_SCALE (``alerts/generate.py
#: scale``), its hour steps 7.2 s apart, so that the GPU-hours dashboard's day panels
#: have data within seconds on both engines; every other group is as shipped.
DAY_GROUPS = ("trainmon-goodput-1d.rules",)
DAY_TIME_SCALE = 0.002


def scale_groups(rule_file: Path, groups: tuple[str, ...], factor: float, tmp: Path) -> None:
    """``rule_file`` with ``groups`` time-scaled by ``factor`` (``alerts/generate.py
    scale``) and every other group kept."""
    document = yaml.safe_load(rule_file.read_text())
    stem = f"{rule_file.parent.name}-{rule_file.stem}-x{factor:g}"
    part, scaled = tmp / f"{stem}.yml", tmp / f"{stem}-scaled.yml"
    part.write_text(yaml.safe_dump(
        {"groups": [g for g in document["groups"] if g["name"] in groups]}))
    done = run_script("alerts/generate.py", "scale", "--factor", str(factor),
                      str(part), str(scaled))
    assert done.returncode == 0, done.stderr
    by_name = {group["name"]: group for group in yaml.safe_load(scaled.read_text())["groups"]}
    assert set(by_name) == set(groups), f"{rule_file}: {sorted(by_name)}"
    document["groups"] = [by_name.get(group["name"], group) for group in document["groups"]]
    rule_file.write_text(yaml.safe_dump(document, sort_keys=False))


def copy_rule_files(variant: str, tmp: Path) -> list[Path]:
    """Copies of the variant's shipped rule files (what both engines evaluate), every group
    at the stack's evaluation interval: the groups' own (1 or 5 min) would leave their rules
    unevaluated for the seconds a test runs; DAY_GROUPS time-scaled."""
    rules = tmp / f"rules-{variant}"
    rules.mkdir()
    copies = []
    for rule_file in sorted((REPO / "alerts" / variant).glob("*.yml")):
        document = yaml.safe_load(rule_file.read_text())
        for group in document["groups"]:
            group.pop("interval", None)
        copy = rules / rule_file.name
        copy.write_text(yaml.safe_dump(document, sort_keys=False))
        if {group["name"] for group in document["groups"]} >= set(DAY_GROUPS):
            scale_groups(copy, DAY_GROUPS, DAY_TIME_SCALE, tmp)
        copies.append(copy)
    return copies


def prometheus_config(
    variant: str, tmp: Path, targets: dict[str, tuple[str, str]]
) -> dict[str, Any]:
    """The bundle's Prometheus config for ``variant`` aimed at this stack's targets."""
    shipped = REPO / "deploy" / "prometheus" / f"prometheus-{variant}.yml"
    config: dict[str, Any] = yaml.safe_load(shipped.read_text())
    aim_scrape_jobs(config, shipped, tmp, variant, targets)
    config["global"]["evaluation_interval"] = f"{SCRAPE_SECONDS:g}s"
    config.pop("alerting", None)
    config["rule_files"] = [str(tmp / f"rules-{variant}" / "*.yml")]
    return config


def wait_for_targets(scrapers: Mapping[QueryAPI, set[str]]) -> None:
    """Until every scraper (Prometheus, vmagent) has each of its jobs' target up."""
    deadline = time.monotonic() + 30
    health: dict[str, dict[str, str]] = {}
    while time.monotonic() < deadline:
        health = {str(s.workdir): s.target_health() for s in scrapers}
        if all(health[str(s.workdir)] == dict.fromkeys(jobs, "up")
               for s, jobs in scrapers.items()):
            time.sleep(SETTLE_SECONDS)
            return
        time.sleep(0.5)
    raise AssertionError(f"targets not up: {health}")

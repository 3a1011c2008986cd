"""The straggler panel, the straggler alert and the daemon's verdict name the same rank.

A real ``trainmon serve`` receives step reports (``trainmon.client.Reporter``
over HTTP, ``testkit/workloads.py``) from two synchronised 4-rank
jobs: in ``straggler-job`` rank 3 computes three times as long as the others,
who wait for it in their ``comm`` phase, so every rank's step time is the
same; ``balanced-job`` has four equal ranks. A real Prometheus scrapes the
daemon with the shipped ``alerts/dcgm/trainmon.rules.yml`` loaded (unscaled:
the 10 m rate windows already give a value from the first two scrapes). Then

(a) the Training overview's straggler panels — their queries read from the
    generated ``dashboards/dcgm/training.json``, thresholds from their red
    step — put rank 3 of ``straggler-job`` above the factor;
(b) the expression of ``TrainmonStragglerRank`` from the generated rules
    file, evaluated as an instant query (its ``for:`` skipped), selects
    exactly that rank;
(c) the daemon names ``straggler-job`` scheduling-bound with a straggler
    finding, and ``trainmon doctor`` over the daemon names rank 3;
(d) neither the expression of ``TrainmonCommunicationBound``, the Training
    overview's "Comm ratio" nor the daemon
    calls ``straggler-job`` communication-bound, although its fast ranks
    spend most of each step waiting in the comm phase: both read the rank
    that waits least, rank 3 itself;

and ``balanced-job`` trips none of them.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from testkit.daemon import Daemon, trainmon_command
from testkit.exposition import parse
from testkit.prometheus import Prometheus, wait_until
from testkit.workloads import Workload, ranks
from tests.alerts.alerts_support.bundle import REPO, rules_path
from trainmon import contract
from trainmon.training.writers import uid_writer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

STRAGGLER_JOB = "straggler-job"
BALANCED_JOB = "balanced-job"
#: Rank 3's work is 0.15 s a step against 0.05 s: 3× the median, 0.1 s more
#: (above the alert's 50 ms margin).
SLOW_RANK, SLOW_FACTOR = "3", 3.0
SETTLE_SECONDS = 60.0
#: The owner of both jobs: their ranks report from this test's process.
OWNER = uid_writer(os.geteuid())


def training_panel(title: str) -> dict[str, Any]:
    """A panel of the generated dcgm Training overview, by title."""
    model = json.loads((REPO / "dashboards" / "dcgm" / "training.json").read_text())
    panels = [p for row in model["panels"] for p in (row, *row.get("panels", []))]
    return next(panel for panel in panels if panel.get("title") == title)


def red_step(panel: dict[str, Any]) -> float:
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    return float(next(step["value"] for step in steps if step["color"] == "red"))


def panel_query(panel: dict[str, Any], job: str) -> str:
    """The panel's query for ``job`` of ``OWNER``, as Grafana sends it."""
    (target,) = panel["targets"]
    return str(target["expr"]).replace("$job", job).replace("$owner", OWNER)


def alert_expr(alert: str) -> str:
    document = yaml.safe_load(rules_path("dcgm").read_text())
    return next(str(rule["expr"]) for group in document["groups"] for rule in group["rules"]
                if rule.get("alert") == alert)


def daemon_verdicts(daemon: Daemon) -> tuple[dict[str, str], set[tuple[str, str]]]:
    """(job → kind of the verdict, {(job, finding)}) from the daemon's /metrics."""
    samples = parse(daemon.metrics()).samples
    kinds = {dict(labels)["job"]: dict(labels)["kind"]
             for labels, value in samples.get("trainmon_bottleneck", {}).items() if value == 1}
    findings = {(dict(labels)["job"], dict(labels)["finding"])
                for labels in samples.get("trainmon_diagnosis_finding_info", {})}
    return kinds, findings


def doctor_jobs(daemon: Daemon) -> dict[str, dict[str, Any]]:
    result = subprocess.run(
        [*trainmon_command(), "doctor", "--url", daemon.url, "--seconds", "5", "--json"],
        capture_output=True, text=True, timeout=60, env=dict(os.environ), check=False,
    )
    assert result.returncode in (0, 1), result.stdout + result.stderr
    return {job["job"]: job for job in json.loads(result.stdout)["jobs"]}


def test_panel_alert_and_verdict_name_the_same_straggler(
    start_daemon: Callable[..., Daemon],
    workload: Callable[[str], Workload],
    prometheus: Prometheus,
) -> None:
    daemon = start_daemon(config={"collectors": {
        "gpu": {"enabled": False},
        "diagnosis": {"window_seconds": 10},
    }})
    jobs = workload(daemon.url)
    jobs.job(ranks(STRAGGLER_JOB, [0, 1, 2, 3], wait=0.002, compute=0.05, comm=0.005,
                   slow_rank=int(SLOW_RANK), slow_factor=SLOW_FACTOR))
    jobs.job(ranks(BALANCED_JOB, [4, 5, 6, 7], wait=0.002, compute=0.05, comm=0.005))
    prometheus.start({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules_path("dcgm"))],
        "scrape_configs": [{
            "job_name": "trainmon",
            "honor_labels": True,  # the training series keep their own job (docs/alerts.md)
            "static_configs": [{"targets": [f"127.0.0.1:{daemon.port}"],
                                "labels": {"node": "node-1"}}],
        }],
    })

    def straggler_series() -> list[dict[str, Any]]:
        return prometheus.query(contract.STRAGGLER_RATIO_SERIES)

    wait_until(lambda: len(straggler_series()) == 8, SETTLE_SECONDS,
               f"{contract.STRAGGLER_RATIO_SERIES} for 8 ranks; got {straggler_series()}\n"
               f"{prometheus.log()}")
    # the rules keep the jobs' owner: the writer the daemon saw, through the scrape
    assert {s["metric"]["owner"] for s in straggler_series()} == {OWNER}
    wait_until(lambda: daemon_verdicts(daemon)[0].get(STRAGGLER_JOB) == "scheduling",
               SETTLE_SECONDS, f"the daemon's verdict on {STRAGGLER_JOB}: "
               f"{daemon_verdicts(daemon)}")

    # (a) the dashboard: per-rank panel and headline stat, as Grafana would query them
    per_rank = training_panel("Straggler ratio per rank")
    headline = training_panel("Straggler ratio")
    assert red_step(per_rank) == red_step(headline) == contract.STRAGGLER_FACTOR
    for job, expected in ((STRAGGLER_JOB, {SLOW_RANK}), (BALANCED_JOB, set())):
        series = prometheus.query(panel_query(per_rank, job))
        assert len(series) == 4, series
        above = {s["metric"]["rank"] for s in series
                 if float(s["value"][1]) >= red_step(per_rank)}
        assert above == expected, (job, series)
        (stat,) = prometheus.query(panel_query(headline, job))
        assert (float(stat["value"][1]) >= red_step(headline)) == bool(expected), (job, stat)

    # (b) the alert's expression, evaluated now
    selected = {(s["metric"]["job"], s["metric"]["rank"])
                for s in prometheus.query(alert_expr("TrainmonStragglerRank"))}
    assert selected == {(STRAGGLER_JOB, SLOW_RANK)}

    # (c) the daemon's verdict, and the rank behind it
    kinds, findings = daemon_verdicts(daemon)
    assert kinds[STRAGGLER_JOB] == "scheduling" and (STRAGGLER_JOB, "straggler") in findings
    assert kinds[BALANCED_JOB] != "scheduling" and (BALANCED_JOB, "straggler") not in findings
    reported = doctor_jobs(daemon)
    straggler = reported[STRAGGLER_JOB]["evidence"]
    assert straggler["straggler_rank"] == SLOW_RANK
    assert straggler["straggler_ratio"] >= contract.STRAGGLER_FACTOR
    assert reported[BALANCED_JOB]["evidence"]["straggler_ratio"] < contract.STRAGGLER_FACTOR
    assert all(f["code"] != "straggler" for f in reported[BALANCED_JOB]["findings"])

    # (d) the fast ranks' wait for rank 3 is not communication, to the alert or the daemon
    def comm_ratios() -> dict[str, float]:
        return {s["metric"]["job"]: float(s["value"][1])
                for s in prometheus.query("job:trainmon_training_comm:ratio_rate10m")}

    wait_until(lambda: set(comm_ratios()) == {STRAGGLER_JOB, BALANCED_JOB}, SETTLE_SECONDS,
               f"job:trainmon_training_comm:ratio_rate10m for both jobs; got {comm_ratios()}")
    waits = {s["metric"]["rank"]: float(s["value"][1]) for s in prometheus.query(
        f'job_rank:trainmon_training_comm:ratio_rate10m{{job="{STRAGGLER_JOB}"}}')}
    assert min(waits, key=lambda rank: waits[rank]) == SLOW_RANK, waits
    assert max(waits.values()) >= contract.COMM_RATIO, waits  # the fast ranks do wait
    assert prometheus.query(alert_expr("TrainmonCommunicationBound")) == [], comm_ratios()
    comm_panel = training_panel("Comm ratio")
    assert red_step(comm_panel) == contract.COMM_RATIO
    (stat,) = prometheus.query(panel_query(comm_panel, STRAGGLER_JOB).replace(
        "$__rate_interval", "10m").replace('node=~"$node"', 'node=~".+"'))
    assert float(stat["value"][1]) < contract.COMM_RATIO, stat
    kinds, findings = daemon_verdicts(daemon)
    assert not {code for job, code in findings if job == STRAGGLER_JOB} & {
        "comm_phase", "comm_exposed"}, findings
    assert straggler["comm_ratio"] < contract.COMM_RATIO, straggler

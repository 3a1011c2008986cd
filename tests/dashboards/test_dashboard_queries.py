"""Every panel query of every dashboard, against a real Prometheus scraping real sources.

The stack, all on loopback:

* ``trainmon serve --demo``: the simulated 8-GPU node with its two training jobs;
* a fake dcgm-exporter (``fake_dcgm_exporter.py``) for the ``dcgm`` variant,
  watching GPUs 0–5 of the node (``--devices g:0-5``), so GPUs 6 and 7 are the
  daemon's alone and the either-source panels show both of their sources;
* ``trainmon serve`` with only the ``tencent`` collector, pulling from the fake
  Tencent Cloud API of ``tests/support/fake_tencent_api.py`` (TC3 signatures,
  rate limit, per-GPU answers), for the ``tencent-cloud`` variant;
* one Prometheus per variant, configured from the bundle's own
  ``deploy/prometheus/prometheus-<variant>.yml`` (``honor_labels``, ``node``
  relabelling) and loaded with ``alerts/<variant>/*.yml``; only the scrape and
  evaluation intervals (1 s, per-job overrides dropped), the target lists, the
  rule path and the Alertmanager section (removed) are changed.

Every query variable is resolved the way Grafana does it, every panel query
(and annotation query) is sent with the variables expanded, and a parse error or
an empty result fails,
except for queries over the metrics in ``EXPECTED_EMPTY``, which nothing in the
stack produces yet; those must stay empty (``test_expected_empty_metrics_are_still_empty``)
so the list gets tightened when a producer lands.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.dashboards.dashboard_files import (
    REPO,
    VARIANTS,
    Dashboard,
    PanelQuery,
    annotation_queries,
    panel_queries,
)
from tests.dashboards.grafana_templating import Selection, Window, interpolate, selections
from tests.dashboards.metric_contract import metric_names
from tests.support import fake_tencent_api as tencent_fake
from tests.support.daemon import Daemon, free_port, trainmon_command, wait_ready
from tests.support.fake_dcgm_exporter import FakeDCGMExporter
from tests.support.prometheus import Prometheus, QueryError

# No skips: a missing /usr/bin/prometheus fails with the install hint of
# support.prometheus.require (Prometheus.start calls it), and the fake Tencent
# Cloud API (tests/tencent, tencentcloud-sdk-python of the test extra) is imported.
pytestmark = pytest.mark.integration

#: Metrics of the contract that no source in this stack produces; queries over
#: them may come back empty. Each must really be absent (see the test below).
EXPECTED_EMPTY: dict[str, str] = {
    "trainmon_gpu_xid_errors_total": "the demo node simulates no XID errors (exporter/trainmon/demo/gpus.py)",
    "trainmon_gpu_xid_last_timestamp_seconds": "the demo node simulates no XID errors",
    "trainmon_node_spot_termination_timestamp_seconds": (
        "the demo instance is not being reclaimed (exporter/trainmon/demo/platform.py); "
        "tests/alerts/test_spot_reclaim_end_to_end.py schedules a reclaim"),
    # The run-ledger comparison needs an earlier run of the same job and config that ran
    # for the 10-minute rate window and ended; the demo's jobs run one run each for the
    # minute this test lasts. alerts/tests/runs.test.yml checks these rules.
    "job_config:trainmon_training_samples_per_second_per_rank:best7d": (
        "no demo run has ended after running 10 minutes, so none is a comparison"),
    "job_run:trainmon_training_throughput_vs_best:ratio": (
        "no demo run has an earlier comparable run (see the line above)"),
}
#: The demo node's price, so that the Training overview's cost per million samples
#: has trainmon_ledger_price_per_gpu_hour to read.
DEMO_PRICE_PER_GPU_HOUR = 2.5
DEMO_CURRENCY = "USD"
#: Placement labels of the demo node (collectors.platform.labels), so that the
#: leaf-switch panels have a leaf to count.
DEMO_PLACEMENT_LABELS = {"leaf": "leaf-07", "rack": "r12"}
SCRAPE_SECONDS = 1.0
#: After every target is up: enough scrapes for rate() over $__rate_interval (4 s).
SETTLE_SECONDS = 8.0
#: How long sources may take to produce their first samples (Cloud Monitor pull, jobs).
DEADLINE_SECONDS = 60.0
NODE = "gpu-node-1"
PULLER_NODE = "cloud-puller"
#: GPUs the fake dcgm-exporter watches; the daemon's demo node has 0–7.
DCGM_DEVICES = tuple(range(6))
#: How an either-source query joins its sources (dashboards/promql.py).
EITHER_SOURCE = "or on(node, gpu)"
SECRET_ID = "AKIDdashboardtest0001"
SECRET_KEY = "dashboard-test-secret-key-0123456789"


@dataclass
class Stack:
    prometheus: dict[str, Prometheus]
    started: float


def _start_trainmon(tmp: Path, name: str, config: dict[str, object], args: list[str],
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


def _prometheus_config(
    variant: str, tmp: Path, targets: dict[str, tuple[str, str]]
) -> dict[str, Any]:
    """The bundle's Prometheus config for ``variant`` aimed at this stack's targets.

    ``targets`` maps a scrape job of the shipped config to (address, node label).
    """
    shipped = REPO / "deploy" / "prometheus" / f"prometheus-{variant}.yml"
    config: dict[str, Any] = yaml.safe_load(shipped.read_text())
    config["global"].update(scrape_interval=f"{SCRAPE_SECONDS:g}s",
                            scrape_timeout=f"{SCRAPE_SECONDS:g}s",
                            evaluation_interval=f"{SCRAPE_SECONDS:g}s")
    config.pop("alerting", None)
    rules = tmp / f"rules-{variant}"
    rules.mkdir()
    for rule_file in sorted((REPO / "alerts" / variant).glob("*.yml")):
        shutil.copy(rule_file, rules / rule_file.name)
    config["rule_files"] = [str(rules / "*.yml")]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == set(targets), f"{shipped.name} scrapes {sorted(jobs)}"
    for name, (address, node) in targets.items():
        job = jobs[name]
        target_file = tmp / f"targets-{variant}-{name}.yml"
        target_file.write_text(yaml.safe_dump([{"targets": [address], "labels": {"node": node}}]))
        job["file_sd_configs"] = [{"files": [str(target_file)]}]
        job.pop("scrape_interval", None)  # the puller's 60 s would make the test wait minutes
        job.pop("scrape_timeout", None)
    return config


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("dashboard-stack")
    daemons: list[Daemon] = []
    servers: list[Prometheus] = []
    cloud = tencent_fake.FakeTencentCloud()
    cloud.add_account(SECRET_ID, SECRET_KEY)
    cloud.add_fleet("ap-shanghai", 2, disks_per_instance=2, gpus=8)
    try:
        with cloud, FakeDCGMExporter(opt_in=["DCGM_FI_PROF_SM_ACTIVE"],
                                        devices=DCGM_DEVICES) as dcgm:
            node = _start_trainmon(
                tmp, "node", {"collectors": {
                    "training": {"socket": str(tmp / "steps.sock")},
                    "platform": {"labels": DEMO_PLACEMENT_LABELS},
                    "ledger": {"path": str(tmp / "ledger.sqlite3"),
                               "price_per_gpu_hour": DEMO_PRICE_PER_GPU_HOUR,
                               "currency": DEMO_CURRENCY},
                }},
                ["--demo"], {})
            daemons.append(node)
            off = {"enabled": False}
            puller = _start_trainmon(tmp, "puller", {
                "collectors": {
                    "network": off, "infiniband": off, "disk": off, "gpu": off,
                    "training": off, "attribution": off, "diagnosis": off,
                    "tencent": {
                        "enabled": True, "endpoint": cloud.url, "region": "ap-shanghai",
                        "secret_id": SECRET_ID, "secret_key": "${DASHBOARD_TEST_SECRET_KEY}",
                        "metadata_url": "http://127.0.0.1:9",
                    },
                },
            }, [], {"DASHBOARD_TEST_SECRET_KEY": SECRET_KEY})
            daemons.append(puller)
            node_address = f"127.0.0.1:{node.port}"
            targets = {
                "dcgm": {"trainmon": (node_address, NODE),
                         "dcgm-exporter": (dcgm.address, NODE)},
                "tencent-cloud": {"trainmon": (node_address, NODE),
                                  "trainmon-tencent": (f"127.0.0.1:{puller.port}", PULLER_NODE)},
            }
            started = time.time()
            for variant in VARIANTS:
                workdir = tmp / f"prometheus-{variant}"
                workdir.mkdir()
                servers.append(
                    Prometheus(workdir).start(_prometheus_config(variant, tmp, targets[variant]))
                )
            stack = Stack(dict(zip(VARIANTS, servers, strict=True)), started)
            _wait_for_targets(stack)
            yield stack
    finally:
        for server in servers:
            server.stop()
        for daemon in daemons:
            daemon.stop()


def _wait_for_targets(stack: Stack) -> None:
    deadline = time.monotonic() + 30
    health: dict[str, dict[str, str]] = {}
    while time.monotonic() < deadline:
        health = {v: p.target_health() for v, p in stack.prometheus.items()}
        if all(h and set(h.values()) == {"up"} for h in health.values()):
            time.sleep(SETTLE_SECONDS)
            return
        time.sleep(0.5)
    raise AssertionError(f"targets not up: {health}")


@dataclass
class Outcome:
    planned: int
    verified: list[str]
    expected_empty: list[str]
    empty: list[str]
    errors: list[str]


def _expected_empty(expr: str) -> bool:
    return bool(metric_names(expr) & EXPECTED_EMPTY.keys())


def _run_panel_query(query: PanelQuery, selection: Selection, prometheus: Prometheus,
                     window: Window, outcome: Outcome) -> None:
    chosen = ", ".join(f"{k}={v}" for k, v in selection.values.items() if not k.startswith("__"))
    where = f"{query.where} [{chosen}]"
    try:
        expr = interpolate(query.expr, selection.values)
        if query.instant:
            result = prometheus.query(expr, window.end)
        else:
            result = prometheus.query_range(expr, window.start, window.end, window.step)
    except (KeyError, QueryError) as error:
        outcome.errors.append(f"{where}: {error}\n    {query.expr}")
        return
    if result:
        outcome.verified.append(where)
    elif _expected_empty(query.expr):
        outcome.expected_empty.append(where)
    else:
        outcome.empty.append(f"{where}\n    {expr}")


def _run_dashboard(dashboard: Dashboard, prometheus: Prometheus, window: Window,
                   outcome: Outcome) -> None:
    """Resolve the variables (each value of the first), then run every panel and
    annotation query."""
    queries = [*panel_queries(dashboard), *annotation_queries(dashboard)]
    for selection in selections(dashboard.variables(), prometheus, window):
        outcome.planned += len(selection.variable_queries) + len(queries)
        unset = []
        for name, variable_query, options in selection.variable_queries:
            where = f"{dashboard.name} · ${name} · {variable_query}"
            if options:
                outcome.verified.append(where)
            else:
                unset.append(f"{where}: no values, so {len(queries)} panel queries were not run")
        if unset:
            outcome.empty += unset
            continue
        for query in queries:
            _run_panel_query(query, selection, prometheus, window, outcome)


def _run_all(stack: Stack, dashboards: list[Dashboard]) -> Outcome:
    outcome = Outcome(0, [], [], [], [])
    end = time.time()
    window = Window(start=stack.started, end=end, step=SCRAPE_SECONDS,
                    scrape_interval=SCRAPE_SECONDS)
    for dashboard in dashboards:
        _run_dashboard(dashboard, stack.prometheus[dashboard.variant], window, outcome)
    return outcome


def test_every_panel_query_of_every_dashboard_returns_data(
    stack: Stack, dashboards: list[Dashboard],
) -> None:
    deadline = stack.started + DEADLINE_SECONDS
    outcome = _run_all(stack, dashboards)
    while outcome.empty and not outcome.errors and time.time() < deadline:
        time.sleep(2)  # a source may still be warming up (first Cloud Monitor pull, demo jobs)
        outcome = _run_all(stack, dashboards)
    print(f"\nverified {len(outcome.verified)} dashboard queries against Prometheus "
          f"({len(outcome.expected_empty)} expected empty: {', '.join(sorted(EXPECTED_EMPTY))})",
          file=sys.stderr)
    assert not outcome.errors, "queries Prometheus refused:\n" + "\n".join(outcome.errors)
    assert not outcome.empty, "queries without data:\n" + "\n".join(outcome.empty)
    assert len(outcome.verified) + len(outcome.expected_empty) == outcome.planned


def test_expected_empty_metrics_are_still_empty(stack: Stack) -> None:
    """Fails once a source produces one of them: remove it from EXPECTED_EMPTY then."""
    appeared = {
        name: variant
        for variant, prometheus in stack.prometheus.items()
        for name in EXPECTED_EMPTY
        if prometheus.query(f'count({{__name__="{name}"}})', time.time())
    }
    assert not appeared, f"now produced, tighten EXPECTED_EMPTY: {appeared}"


def test_training_job_label_survives_the_scrape(stack: Stack) -> None:
    """honor_labels keeps the pushed training job; other series get the scrape job."""
    prometheus = stack.prometheus["dcgm"]
    now = time.time()
    jobs = prometheus.label_values("job", "trainmon_training_steps_total", now - 60, now)
    assert jobs and "trainmon" not in jobs, jobs
    scrape_jobs = prometheus.label_values("job", "trainmon_gpu_up", now - 60, now)
    assert scrape_jobs == ["trainmon"]
    nodes = prometheus.label_values("node", "DCGM_FI_DEV_GPU_UTIL", now - 60, now)
    assert nodes == [NODE]


def _sources_by_gpu(series: list[dict[str, Any]]) -> dict[str, set[str]]:
    """gpu → the sources of its series: ``dcgm`` (dcgm-exporter labels ``UUID``) or ``daemon``."""
    sources: dict[str, set[str]] = {}
    for item in series:
        labels = item["metric"]
        sources.setdefault(labels["gpu"], set()).add("dcgm" if "UUID" in labels else "daemon")
    return sources


def test_either_source_panels_read_dcgm_where_it_exports_and_the_daemon_elsewhere(
    stack: Stack, dashboards: list[Dashboard],
) -> None:
    """Each GPU once: DCGM profiling for the GPUs dcgm-exporter watches, the daemon's GPM
    series for the others; memory from the daemon, which sees every GPU."""
    prometheus = stack.prometheus["dcgm"]
    now = time.time()
    window = Window(start=stack.started, end=now, step=SCRAPE_SECONDS,
                    scrape_interval=SCRAPE_SECONDS)
    dcgm_gpus = {str(gpu) for gpu in DCGM_DEVICES}
    checked: list[str] = []
    for dashboard in dashboards:
        if dashboard.variant != "dcgm":
            continue
        either = [q for q in panel_queries(dashboard) if EITHER_SOURCE in q.expr]
        selection = next(selections(dashboard.variables(), prometheus, window))
        for query in either:
            series = prometheus.query(interpolate(query.expr, selection.values), now)
            sources = _sources_by_gpu(series)
            assert sources, f"{query.where}: no data"
            assert all(len(found) == 1 for found in sources.values()), (query.where, sources)
            if "DCGM_FI_PROF_" in query.expr.split(EITHER_SOURCE)[0]:
                expected = {gpu: {"dcgm"} if gpu in dcgm_gpus else {"daemon"} for gpu in sources}
                assert sources == expected, query.where
                if dashboard.kind != "training":  # the Training overview shows one job's GPUs
                    assert dcgm_gpus & sources.keys() and sources.keys() - dcgm_gpus, (
                        f"{query.where}: the GPUs shown do not include both sources: {sources}")
            else:
                assert set().union(*sources.values()) == {"daemon"}, (query.where, sources)
            if dashboard.kind == "node":  # "(LEFT or on(node, gpu) RIGHT)": each side alone
                left, right = interpolate(query.expr, selection.values)[1:-1].split(EITHER_SOURCE)
                for side in (left, right):
                    side_sources = _sources_by_gpu(prometheus.query(side, now))
                    dcgm_side = "DCGM_" in side
                    assert side_sources == {
                        gpu: {"dcgm" if dcgm_side else "daemon"}
                        for gpu in (dcgm_gpus if dcgm_side else sources.keys())
                    }, (query.where, side, side_sources)
            checked.append(query.where)
    titles = {where.split(" · ")[1] for where in checked}
    assert {"'SM active'", "'Tensor pipe active'", "'DRAM active'",
            "'Memory used share'"} <= titles, checked

"""Every panel of both variants' dashboards has data against the demo as ``make demo`` runs it.

``trainmon serve --demo`` with nothing configured but where its files go (the training
socket and the run ledger in tmp): its price per GPU hour, placement labels and run
history are the demo's own (``trainmon.demo``). Around it, the stack of
``test_dashboard_queries.py``: the fake dcgm-exporter (``dcgm``), the Tencent puller on
the fake Cloud API (``tencent-cloud``), and one real Prometheus per variant configured
from the bundle's ``deploy/prometheus/prometheus-<variant>.yml``, scraping every second
and loaded with the variant's shipped rules. Every panel and annotation query of every
dashboard of the variant must return data, except the event-only panels of
``EVENT_ONLY``, which must stay empty.

Two things make the run comparison (the 7-day best, this run vs best, and
``TrainmonThroughputRegression``) answer in seconds rather than in the 25 minutes it
takes by construction (a run is compared once it has run its 10-minute rate window,
and pages after ``for: 15m`` more):

* the run-ledger rule groups (``RUN_GROUPS``) are time-scaled by
  ``TIME_SCALE`` with ``alerts/generate.py scale``, as
  ``tests/alerts/test_throughput_regression_end_to_end.py`` does: 10 minutes become
  12 s, ``for: 15m`` 18 s, the 7 days 3.4 h; every other rule is as shipped but for
  the goodput ledger's day rules, which both dashboard tests scale
  (``dashboards_support.DAY_GROUPS``);
* Prometheus starts with the history of the demo's seeded earlier runs: the one series
  of theirs that the comparison reads, ``job_run:…:best1h`` (each run's best settled
  samples/s per rank), backfilled with ``promtool tsdb create-blocks-from openmetrics``
  as the shipped rule would have recorded it had Prometheus scraped that run — from
  10 minutes after its start to an hour after its end, at the samples/s per rank of
  its ledger record (``trainmon runs --json``). Everything downstream (the 7-day best,
  the comparable run, the ratio, the alert, the panels) is the shipped rules evaluating
  live against the demo's running jobs.
"""

from __future__ import annotations

import json
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

from testkit import fake_tencent_api as tencent_fake
from testkit.daemon import Daemon, trainmon_command
from testkit.dashboard_files import (
    VARIANTS,
    Dashboard,
    PanelQuery,
    annotation_queries,
    panel_queries,
)
from testkit.fake_dcgm_exporter import FakeDCGMExporter
from testkit.grafana_templating import Window, interpolate, selections
from testkit.prometheus import Prometheus, QueryAPI, QueryError, require, wait_until
from tests.dashboards.dashboards_support import (
    DCGM_DEVICES,
    NODE,
    PULLER_NODE,
    SCRAPE_SECONDS,
    SECRET_ID,
    SECRET_KEY,
    copy_rule_files,
    prometheus_config,
    scale_groups,
    start_trainmon,
    wait_for_targets,
)
from trainmon.contract import THROUGHPUT_REGRESSION_RATIO
from trainmon.demo.history import EARLIER_RUNS
from trainmon.demo.jobs import DEMO_JOBS
from trainmon.training.writers import uid_writer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
#: The run-ledger groups of alerts/source/common.yml, and the factor they are scaled by.
RUN_GROUPS = ("trainmon-runs.rules", "trainmon-runs")
TIME_SCALE = 0.02
#: The backfilled series: each run's best settled samples/s per rank in the last hour.
BEST_1H = "job_run:trainmon_training_samples_per_second_per_rank:best1h"
#: What the shipped (unscaled) rules take: the settling offset, how long a run's hourly
#: best outlives it; and the backfill's resolution (the evaluation interval shipped).
SETTLE_SECONDS = 600.0
BEST_1H_SECONDS = 3600.0
BACKFILL_STEP_SECONDS = 15.0
#: (dashboard kind, panel title) → why the panel shows nothing against the demo.
EVENT_ONLY: dict[tuple[str, str], str] = {
    ("node", "Reclaim in"): (
        "a spot reclaim is an event; the demo instance is not being reclaimed "
        "(tests/alerts/test_spot_reclaim_end_to_end.py schedules one)"),
    ("node", "XID errors by code"): (
        "XID errors are events; the demo node simulates none (trainmon/demo/gpus.py)"),
    ("fleet", "XID events"): "the same XID events, fleet-wide",
    ("training", "annotation Run ends"): (
        "a run's clean end is an event; the demo's runs go on until the demo stops (their "
        "crashes 10 and 12 s in are Run failures)"),
}
#: From Prometheus' start: every panel query has data by then.
DEADLINE_SECONDS = 60.0
#: From Prometheus' start: the regression alert fires by then (the demo's runs that go on
#: start 25 s in, after their jobs' early crashes; settling 12 s, for 18 s).
FIRE_DEADLINE_SECONDS = 90.0


@dataclass
class DemoStack:
    prometheus: dict[str, Prometheus]
    node: Daemon
    #: The seeded earlier runs as ``trainmon runs --json`` shows them.
    earlier: list[dict[str, Any]]
    #: Unix time the Prometheus servers started.
    started: float


def _earlier_records(ledger: Path) -> list[dict[str, Any]]:
    done = subprocess.run([*trainmon_command(), "runs", "--json", "--ledger", str(ledger)],
                          capture_output=True, text=True, timeout=30, check=True)
    seeded = {earlier.run for earlier in EARLIER_RUNS}
    runs = [run for run in json.loads(done.stdout)["runs"] if run["run"] in seeded]
    assert sorted(run["run"] for run in runs) == sorted(seeded), done.stdout
    return runs


def _backfill(records: list[dict[str, Any]], until: float) -> str:
    """OpenMetrics text of BEST_1H for each earlier run, as the shipped rule records it:
    from SETTLE_SECONDS after its start until BEST_1H_SECONDS after its end (or ``until``).
    Its owner is the demo jobs' (they report over the socket as the daemon's user, this
    test's): the earlier runs of the same jobs, which their runs are compared with. Its
    shape is the record's: its world size on its one node (the demo's only node)."""
    owner = uid_writer(os.geteuid())
    lines = [f"# TYPE {BEST_1H} gauge"]
    for record in records:
        per_rank = record["summary"]["samples_per_second_median"] / record["world_size"]
        assert len(record["nodes"]) == 1, record
        labels = (f'config_hash="{record["config_hash"]}",job="{record["job"]}",'
                  f'nodes="1",owner="{owner}",run="{record["run"]}",'
                  f'world_size="{record["world_size"]}"')
        at = record["started"] + SETTLE_SECONDS
        while at <= min(record["ended"] + BEST_1H_SECONDS, until):
            lines.append(f"{BEST_1H}{{{labels}}} {per_rank:.3f} {at:.3f}")
            at += BACKFILL_STEP_SECONDS
    return "\n".join([*lines, "# EOF"]) + "\n"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoStack]:
    tmp = tmp_path_factory.mktemp("demo-panels")
    daemons: list[Daemon] = []
    servers: list[Prometheus] = []
    cloud = tencent_fake.FakeTencentCloud()
    cloud.add_account(SECRET_ID, SECRET_KEY)
    cloud.add_fleet("ap-shanghai", 2, disks_per_instance=2, gpus=8)
    try:
        with cloud, FakeDCGMExporter(opt_in=["DCGM_FI_PROF_SM_ACTIVE"],
                                     devices=DCGM_DEVICES) as dcgm:
            ledger = tmp / "demo-ledger.sqlite3"
            node = start_trainmon(tmp, "node", {"collectors": {
                "training": {"socket": str(tmp / "steps.sock")},
                "ledger": {"path": str(ledger)},
            }}, ["--demo"], {})
            daemons.append(node)
            off = {"enabled": False}
            daemons.append(start_trainmon(tmp, "puller", {"collectors": {
                "network": off, "infiniband": off, "disk": off, "gpu": off,
                "training": off, "attribution": off, "diagnosis": off,
                "tencent": {
                    "enabled": True, "endpoint": cloud.url, "region": "ap-shanghai",
                    "secret_id": SECRET_ID, "secret_key": "${DEMO_PANELS_SECRET_KEY}",
                    "metadata_url": "http://127.0.0.1:9",
                },
            }}, [], {"DEMO_PANELS_SECRET_KEY": SECRET_KEY}))
            earlier = _earlier_records(ledger)
            history = tmp / "history.om"
            history.write_text(_backfill(earlier, until=time.time() - 60))
            node_address = f"127.0.0.1:{node.port}"
            targets = {
                "dcgm": {"trainmon": (node_address, NODE),
                         "dcgm-exporter": (dcgm.address, NODE)},
                "tencent-cloud": {"trainmon": (node_address, NODE),
                                  "trainmon-tencent": (f"127.0.0.1:{daemons[1].port}",
                                                       PULLER_NODE)},
            }
            prometheus: dict[str, Prometheus] = {}
            started = time.time()
            for variant in VARIANTS:
                for rule_file in copy_rule_files(variant, tmp):
                    scale_groups(rule_file, RUN_GROUPS, TIME_SCALE, tmp)
                workdir = tmp / f"prometheus-{variant}"
                workdir.mkdir()
                backfilled = subprocess.run(
                    [require(PROMTOOL, "prometheus"), "tsdb", "create-blocks-from",
                     "openmetrics", "--quiet", str(history), str(workdir / "prometheus-data")],
                    capture_output=True, text=True, timeout=60)
                assert backfilled.returncode == 0, backfilled.stderr
                server = Prometheus(workdir)
                servers.append(server)
                prometheus[variant] = server.start(
                    prometheus_config(variant, tmp, targets[variant]))
            wait_for_targets({prometheus[v]: set(targets[v]) for v in VARIANTS})
            yield DemoStack(prometheus, node, earlier, started)
    finally:
        for server in reversed(servers):
            server.stop()
        for daemon in daemons:
            daemon.stop()


@dataclass
class Outcome:
    verified: list[str]
    empty: list[str]
    errors: list[str]
    #: EVENT_ONLY panel queries that returned data.
    event_data: list[str]


def _event_only(query: PanelQuery) -> bool:
    return (query.dashboard.kind, query.panel_title) in EVENT_ONLY


def _run_queries(dashboard: Dashboard, api: QueryAPI, window: Window, outcome: Outcome) -> None:
    """Every panel and annotation query of ``dashboard``, for each value of its first
    variable (grafana_templating.selections)."""
    queries = [*panel_queries(dashboard), *annotation_queries(dashboard)]
    for selection in selections(dashboard.variables(), api, window):
        unset = [name for name, _, options in selection.variable_queries if not options]
        if unset:
            outcome.empty.append(f"{dashboard.name}: no values for ${', $'.join(unset)}")
            continue
        chosen = ", ".join(f"{k}={v}" for k, v in selection.values.items()
                           if not k.startswith("__"))
        for query in queries:
            where = f"{query.where} [{chosen}]"
            try:
                expr = interpolate(query.expr, selection.values)
                result = (api.query(expr, window.end) if query.instant
                          else api.query_range(expr, window.start, window.end, window.step))
            except (KeyError, QueryError) as error:
                outcome.errors.append(f"{where}: {error}\n    {query.expr}")
                continue
            if _event_only(query):
                if result:
                    outcome.event_data.append(where)
            elif result:
                outcome.verified.append(where)
            else:
                outcome.empty.append(f"{where}\n    {expr}")


def _run_variant(demo: DemoStack, dashboards: list[Dashboard], variant: str) -> Outcome:
    outcome = Outcome([], [], [], [])
    window = Window(start=demo.started, end=time.time(), step=SCRAPE_SECONDS,
                    scrape_interval=SCRAPE_SECONDS)
    for dashboard in dashboards:
        if dashboard.variant == variant:
            _run_queries(dashboard, demo.prometheus[variant], window, outcome)
    return outcome


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_panel_has_data_against_the_demo(
    demo: DemoStack, dashboards: list[Dashboard], variant: str,
) -> None:
    outcome = _run_variant(demo, dashboards, variant)
    while (outcome.empty and not outcome.errors
           and time.time() < demo.started + DEADLINE_SECONDS):
        time.sleep(1)
        outcome = _run_variant(demo, dashboards, variant)
    print(f"\n{variant}: {len(outcome.verified)} panel queries with data "
          f"{time.time() - demo.started:.0f} s after Prometheus started", file=sys.stderr)
    assert not outcome.errors, "queries Prometheus refused:\n" + "\n".join(outcome.errors)
    assert not outcome.empty, "queries without data:\n" + "\n".join(outcome.empty)
    assert not outcome.event_data, (
        "event-only panels with data (remove them from EVENT_ONLY):\n"
        + "\n".join(outcome.event_data))
    titles = {(d.kind, q.panel_title) for d in dashboards if d.variant == variant
              for q in [*panel_queries(d), *annotation_queries(d)]}
    assert set(EVENT_ONLY) <= titles, "EVENT_ONLY names panels that are gone"


def _firing(api: QueryAPI) -> list[dict[str, Any]]:
    return api.query('ALERTS{alertname="TrainmonThroughputRegression", alertstate="firing"}')


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_demo_pages_for_the_slowdown_since_its_seeded_runs(
    demo: DemoStack, variant: str,
) -> None:
    api = demo.prometheus[variant]
    wait_until(lambda: len(_firing(api)) == len(EARLIER_RUNS),
               max(1.0, demo.started + FIRE_DEADLINE_SECONDS - time.time()),
               f"TrainmonThroughputRegression for every demo job; demo log:\n{demo.node.log()}")
    fired = {alert["metric"]["job"]: alert["metric"] for alert in _firing(api)}
    ratios = {item["metric"]["job"]: float(item["value"][1]) for item in
              api.query("job_run:trainmon_training_throughput_vs_best:ratio")}
    jobs = {job.name: job for job in DEMO_JOBS}
    for record in demo.earlier:
        labels = fired[record["job"]]
        assert (labels["best_run"], labels["config_hash"]) == (record["run"],
                                                                record["config_hash"])
        # today's run has the seeded run's shape: its world size, on the demo's one node
        assert (labels["world_size"], labels["nodes"]) == (str(record["world_size"]), "1")
        assert labels["run"].startswith(f"{record['job']}-") and labels["run"] != record["run"]
        # today's run against the earlier one, per rank, as the simulation has them (a
        # loaded machine oversleeps and slows today's a little more)
        earlier = next(e for e in EARLIER_RUNS if e.run == record["run"])
        expected = earlier.job.step_seconds / jobs[record["job"]].step_seconds
        assert expected - 0.12 < ratios[record["job"]] < expected + 0.05, ratios
        assert ratios[record["job"]] < 1 - THROUGHPUT_REGRESSION_RATIO

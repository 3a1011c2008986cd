"""Every panel query of every dashboard, against real Prometheus and VictoriaMetrics
scraping real sources.

The stack, all on loopback:

* ``trainmon serve --demo``: the simulated 8-GPU node with its two training jobs;
* a fake dcgm-exporter (``fake_dcgm_exporter.py``) for the ``dcgm`` variant,
  watching GPUs 0–5 of the node (``--devices g:0-5``), so GPUs 6 and 7 are the
  daemon's alone and the either-source panels show both of their sources;
* ``trainmon serve`` with only the ``tencent`` collector, pulling from the fake
  Tencent Cloud API of ``testkit/fake_tencent_api.py`` (TC3 signatures,
  rate limit, per-GPU answers), for the ``tencent-cloud`` variant;
* one Prometheus per variant, configured from the bundle's own
  ``deploy/prometheus/prometheus-<variant>.yml`` (``honor_labels``, ``node``
  relabelling) and loaded with ``alerts/<variant>/*.yml``; only the scrape and
  evaluation intervals (1 s, per-job overrides dropped), the target lists, the
  rule path and the Alertmanager section (removed) are changed, and the goodput
  ledger's day rules time-scaled (``dashboards_support.DAY_GROUPS``: their hours
  a few seconds long, so that a day of whole hours has some);
* beside it, scraping the same targets at the same time, one VictoriaMetrics per
  variant fed by a vmagent run from the bundle's ``deploy/scale/vmagent-<variant>.yml``
  (one unsharded scraper: ``TRAINMON_SHARD_COUNT=1 TRAINMON_SHARD=0``; only the
  scrape intervals and the target lists changed, as for Prometheus), and a
  vmalert evaluating the same rule files against it every second, writing the
  recording rules and ``ALERTS`` back. VictoriaMetrics is told to flush every second
  (``testkit.victoriametrics.flushing``), so that a new series is searchable within
  one instead of some 9 (docs/dashboards.md, "Engines"): a chain of recording rules
  fills in seconds, as on Prometheus.

The tests run once per engine (ids ``prometheus``, ``victoriametrics``), and two
compare the engines: every panel query, sent to both at the same instant, returns
the same series (label sets) with values of the same kind (NaN, ±Inf, a number)
(a query over recording rules given the time VictoriaMetrics takes to find a new
series at each rule of its chain) and, for queries over gauges alone, about the
same values; and every rule loads and evaluates in vmalert as it does in
Prometheus. Where PromQL and MetricsQL differ for a shipped query, the query was changed to mean
the same on both (docs/dashboards.md, "Engines").

Every query variable is resolved the way Grafana does it, every panel query
(and annotation query) is sent with the variables expanded, and a parse error or
an empty result fails,
except for queries over the metrics (or the series: ``name{label="value"}``) in
``EXPECTED_EMPTY``, which nothing in the stack produces yet; those must stay empty (``test_expected_empty_metrics_are_still_empty``)
so the list gets tightened when a producer lands.
"""

from __future__ import annotations

import math
import os
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy.sharding import SHARD_COUNT_VARIABLE, SHARD_VARIABLE
from testkit import fake_tencent_api as tencent_fake
from testkit.daemon import Daemon
from testkit.dashboard_files import (
    REPO,
    VARIANTS,
    Dashboard,
    PanelQuery,
    annotation_queries,
    panel_queries,
)
from testkit.fake_dcgm_exporter import FakeDCGMExporter
from testkit.grafana_templating import Selection, Window, interpolate, selections
from testkit.metric_contract import metric_names
from testkit.prometheus import Prometheus, QueryAPI, QueryError
from testkit.victoriametrics import VictoriaMetrics, VMAgent, VMAlert, flushing
from tests.dashboards.dashboards_support import (
    DCGM_DEVICES,
    EXPECTED_EMPTY,
    NODE,
    PULLER_NODE,
    SCRAPE_SECONDS,
    SECRET_ID,
    SECRET_KEY,
    SETTLE_SECONDS,
    aim_scrape_jobs,
    copy_rule_files,
    prometheus_config,
    start_trainmon,
    wait_for_targets,
)
from trainmon.training.writers import uid_writer

# No skips: a missing /usr/bin/prometheus or /usr/bin/victoria-metrics fails with the
# install hint of testkit.prometheus.require (every start calls it), and the fake Tencent
# Cloud API (tests/tencent, tencentcloud-sdk-python of the test extra) is imported.
pytestmark = [pytest.mark.integration, pytest.mark.quiet]

#: The demo node's price, so that the Training overview's cost per million samples
#: has trainmon_ledger_price_per_gpu_hour to read.
DEMO_PRICE_PER_GPU_HOUR = 2.5
DEMO_CURRENCY = "USD"
#: Placement labels of the demo node (collectors.platform.labels), so that the
#: leaf-switch panels have a leaf to count.
DEMO_PLACEMENT_LABELS = {"leaf": "leaf-07", "rack": "r12"}
#: How long sources may take to produce their first samples (Cloud Monitor pull, jobs;
#: the demo's runs that go on start 25 s in, after their jobs' early crashes, and on
#: VictoriaMetrics each rule that reads another adds its lag).
DEADLINE_SECONDS = 90.0
#: How an either-source query joins its sources (dashboards/promql.py).
EITHER_SOURCE = "or on(node, gpu)"


ENGINES = ("prometheus", "victoriametrics")
#: vmalert notifies nobody here: a loopback port where nothing listens.
NO_ALERTMANAGER = "http://127.0.0.1:9"
#: The agreement test asks both engines about this many seconds ago, so that the
#: newest scrape has reached VictoriaMetrics (vmagent flushes every second, and
#: -search.latencyOffset hides the last second).
AGREEMENT_LAG_SECONDS = 3.0
#: A query whose series differ between the engines is asked again this many times
#: (at a newer instant) before the difference counts: a series that appears or
#: ends between the two engines' scrapes agrees on the next try.
AGREEMENT_TRIES = 3
#: A query over recording rules may lack on VictoriaMetrics, for one new-series delay
#: per rule of its chain (about 8.5 s each, docs/dashboards.md, "Engines"), a series
#: Prometheus already has: one the demo starts late (its notebook's job, some 20 s in)
#: reaches the goodput ledger's day rules two rules on. Such a difference counts once
#: it has lasted this long.
RULE_AGREEMENT_SECONDS = 30.0
#: Panel queries (dashboard · title · refId) whose series may differ between the
#: engines, with the reason. Only timing may excuse a difference; none does today.
ENGINE_DIFFERENCES: dict[str, str] = {}
#: The instant value VictoriaMetrics returns for a query that reads no range vector, no
#: recording rule and no clock lies within what Prometheus returned over the last
#: GAUGE_SPAN_SECONDS, widened by GAUGE_TOLERANCE of the largest: both read the same
#: gauges, scraped at other moments (a sawtooth GPU's SM activity swings by half
#: between scrapes). Rates are not compared: VictoriaMetrics' rate() starts at the
#: sample before the window and divides by the time its samples cover, Prometheus'
#: extrapolates and divides by the window (docs/dashboards.md, "Engines").
GAUGE_SPAN_SECONDS = 4.0
GAUGE_TOLERANCE = 0.2
#: vmalert's evaluations a rule must have had before its errors are read.
VMALERT_SETTLE_SECONDS = 5.0
#: vmalert as the scale deployment runs it (``VMAlert`` passes ``-disableAlertgroupLabel``,
#: without which vmalert adds ``alertgroup`` to ``ALERTS`` and to every alert it sends),
#: plus remote-write flushes every second (5 s by default) to suit the 1 s evaluations:
#: a recording rule that reads another of its group sees the other's result only once
#: vmalert has flushed it to VictoriaMetrics, not in the same evaluation as in Prometheus.
VMALERT_FLAGS = (f"-remoteWrite.flushInterval={SCRAPE_SECONDS:g}s",)


@dataclass
class Stack:
    #: engine → variant → the query API that engine answers for the variant.
    engines: dict[str, dict[str, QueryAPI]]
    vmalert: dict[str, VMAlert]
    #: variant → the rule files both engines evaluate.
    rule_files: dict[str, list[Path]]
    started: float

    @property
    def prometheus(self) -> dict[str, QueryAPI]:
        return self.engines["prometheus"]


_PLACEHOLDER = re.compile(r"'?%\{(\w+)\}'?")


def _vmagent_config(variant: str, tmp: Path, targets: dict[str, tuple[str, str]]) -> Path:
    """The bundle's vmagent config for ``variant`` aimed at this stack's targets.

    The shipped file is YAML only once vmagent has replaced its ``%{NAME}``
    placeholders; they are quoted to read it and written back as they were, so that
    vmagent expands them from the environment as in a deployment.
    """
    shipped = REPO / "deploy" / "scale" / f"vmagent-{variant}.yml"
    text = shipped.read_text()
    bare = {m[1] for m in _PLACEHOLDER.finditer(text) if not m[0].startswith("'")}
    config: dict[str, Any] = yaml.safe_load(_PLACEHOLDER.sub(r"'%{\1}'", text))
    aim_scrape_jobs(config, shipped, tmp, variant, targets)
    written = yaml.safe_dump(config, sort_keys=False)
    for name in bare:
        written = written.replace(f"'%{{{name}}}'", f"%{{{name}}}")
    path = tmp / f"vmagent-{variant}.yml"
    path.write_text(written)
    return path


def _start_victoriametrics(variant: str, tmp: Path, targets: dict[str, tuple[str, str]],
                           rule_files: list[Path], servers: list[QueryAPI],
                           evaluators: dict[str, VMAlert]) -> tuple[VictoriaMetrics, VMAgent]:
    """VictoriaMetrics, its vmagent (one shard of one) and its vmalert, for ``variant``."""
    workdir = tmp / f"victoriametrics-{variant}"
    workdir.mkdir()
    engine = VictoriaMetrics(workdir)
    servers.append(engine)
    engine.start()
    agent = VMAgent(workdir)
    servers.append(agent)
    agent.start(_vmagent_config(variant, tmp, targets), remote_write=engine.write_url,
                env={SHARD_COUNT_VARIABLE: "1", SHARD_VARIABLE: "0"})
    evaluator = VMAlert(workdir)
    evaluators[variant] = evaluator
    evaluator.start(rule_files, engine=engine.url, notifier=NO_ALERTMANAGER,
                    evaluation_interval=f"{SCRAPE_SECONDS:g}s", flags=VMALERT_FLAGS)
    return engine, agent


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("dashboard-stack")
    daemons: list[Daemon] = []
    servers: list[QueryAPI] = []
    evaluators: dict[str, VMAlert] = {}
    cloud = tencent_fake.FakeTencentCloud()
    cloud.add_account(SECRET_ID, SECRET_KEY)
    cloud.add_fleet("ap-shanghai", 2, disks_per_instance=2, gpus=8)
    try:
        with cloud, FakeDCGMExporter(opt_in=["DCGM_FI_PROF_SM_ACTIVE"],
                                        devices=DCGM_DEVICES) as dcgm:
            node = start_trainmon(
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
            puller = start_trainmon(tmp, "puller", {
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
            engines: dict[str, dict[str, QueryAPI]] = {engine: {} for engine in ENGINES}
            rule_files: dict[str, list[Path]] = {}
            scrapers: dict[QueryAPI, set[str]] = {}
            for variant in VARIANTS:
                rule_files[variant] = copy_rule_files(variant, tmp)
                workdir = tmp / f"prometheus-{variant}"
                workdir.mkdir()
                prometheus = Prometheus(workdir)
                servers.append(prometheus)
                engines["prometheus"][variant] = prometheus.start(
                    prometheus_config(variant, tmp, targets[variant]))
                engine, agent = _start_victoriametrics(
                    variant, tmp, targets[variant], rule_files[variant], servers, evaluators)
                engines["victoriametrics"][variant] = engine
                scrapers[prometheus] = scrapers[agent] = set(targets[variant])
            stack = Stack(engines, evaluators, rule_files, started)
            wait_for_targets(scrapers)
            with flushing([engine for engine in servers if isinstance(engine, VictoriaMetrics)]):
                yield stack
    finally:
        for evaluator in evaluators.values():
            evaluator.stop()
        for server in reversed(servers):
            server.stop()
        for daemon in daemons:
            daemon.stop()


@dataclass
class Outcome:
    planned: int
    verified: list[str]
    expected_empty: list[str]
    empty: list[str]
    errors: list[str]


def _expected_empty(expr: str) -> bool:
    """Whether ``expr`` selects an ``EXPECTED_EMPTY`` metric, or a series of one that an
    entry such as ``name{reason="finished"}`` names (its matchers written in ``expr``)."""
    names = metric_names(expr)
    for key in EXPECTED_EMPTY:
        name, _, matchers = key.partition("{")
        if name in names and all(matcher in expr for matcher in
                                 filter(None, matchers.rstrip("}").split(","))):
            return True
    return False


def _run_panel_query(query: PanelQuery, selection: Selection, engine: QueryAPI,
                     window: Window, outcome: Outcome) -> None:
    chosen = ", ".join(f"{k}={v}" for k, v in selection.values.items() if not k.startswith("__"))
    where = f"{query.where} [{chosen}]"
    try:
        expr = interpolate(query.expr, selection.values)
        if query.instant:
            result = engine.query(expr, window.end)
        else:
            result = engine.query_range(expr, window.start, window.end, window.step)
    except (KeyError, QueryError) as error:
        outcome.errors.append(f"{where}: {error}\n    {query.expr}")
        return
    if result:
        outcome.verified.append(where)
    elif _expected_empty(query.expr):
        outcome.expected_empty.append(where)
    else:
        outcome.empty.append(f"{where}\n    {expr}")


def _run_dashboard(dashboard: Dashboard, engine: QueryAPI, window: Window,
                   outcome: Outcome) -> None:
    """Resolve the variables (each value of the first), then run every panel and
    annotation query."""
    queries = [*panel_queries(dashboard), *annotation_queries(dashboard)]
    for selection in selections(dashboard.variables(), engine, window):
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
            _run_panel_query(query, selection, engine, window, outcome)


def _run_all(engines: dict[str, QueryAPI], started: float,
             dashboards: list[Dashboard]) -> Outcome:
    outcome = Outcome(0, [], [], [], [])
    end = time.time()
    window = Window(start=started, end=end, step=SCRAPE_SECONDS, scrape_interval=SCRAPE_SECONDS)
    for dashboard in dashboards:
        _run_dashboard(dashboard, engines[dashboard.variant], window, outcome)
    return outcome


def _until_every_query_has_data(stack: Stack, dashboards: list[Dashboard],
                                engine: str) -> Outcome:
    """Run every query until none is empty, or DEADLINE_SECONDS after the stack started:
    a source may still be warming up (first Cloud Monitor pull, demo jobs), and on
    VictoriaMetrics each recording rule that reads another lags by the time a new series
    takes to become searchable (docs/dashboards.md, "Engines")."""
    deadline = stack.started + DEADLINE_SECONDS
    outcome = _run_all(stack.engines[engine], stack.started, dashboards)
    while outcome.empty and not outcome.errors and time.time() < deadline:
        time.sleep(2)
        outcome = _run_all(stack.engines[engine], stack.started, dashboards)
    return outcome


@pytest.mark.parametrize("engine", ENGINES)
def test_every_panel_query_of_every_dashboard_returns_data(
    stack: Stack, dashboards: list[Dashboard], engine: str,
) -> None:
    outcome = _until_every_query_has_data(stack, dashboards, engine)
    print(f"\nverified {len(outcome.verified)} dashboard queries against {engine} "
          f"({len(outcome.expected_empty)} expected empty: {', '.join(sorted(EXPECTED_EMPTY))})",
          file=sys.stderr)
    assert not outcome.errors, f"queries {engine} refused:\n" + "\n".join(outcome.errors)
    assert not outcome.empty, "queries without data:\n" + "\n".join(outcome.empty)
    assert len(outcome.verified) + len(outcome.expected_empty) == outcome.planned


@pytest.mark.parametrize("engine", ENGINES)
def test_expected_empty_metrics_are_still_empty(stack: Stack, engine: str) -> None:
    """Fails once a source produces one of them: remove it from EXPECTED_EMPTY then."""
    appeared = {
        name: variant
        for variant, api in stack.engines[engine].items()
        for name in EXPECTED_EMPTY
        if api.query(f"count({_selector(name)})", time.time())
    }
    assert not appeared, f"now produced, tighten EXPECTED_EMPTY: {appeared}"


def _selector(key: str) -> str:
    """The series an ``EXPECTED_EMPTY`` key names: ``{__name__="name", reason="finished"}``."""
    name, _, matchers = key.partition("{")
    return "{" + ", ".join([f'__name__="{name}"', *filter(None, matchers.rstrip("}")
                                                          .split(","))]) + "}"


@pytest.mark.parametrize("engine", ENGINES)
def test_training_job_label_survives_the_scrape(stack: Stack, engine: str) -> None:
    """honor_labels keeps the pushed training job and its owner (the demo's jobs report
    over the socket as the daemon's user, this test's); other series get the scrape job."""
    api = stack.engines[engine]["dcgm"]
    now = time.time()
    jobs = api.label_values("job", "trainmon_training_steps_total", now - 60, now)
    assert jobs and "trainmon" not in jobs, jobs
    owners = api.label_values("owner", "trainmon_training_steps_total", now - 60, now)
    assert owners == [uid_writer(os.geteuid())], owners
    scrape_jobs = api.label_values("job", "trainmon_gpu_up", now - 60, now)
    assert scrape_jobs == ["trainmon"]
    nodes = api.label_values("node", "DCGM_FI_DEV_GPU_UTIL", now - 60, now)
    assert nodes == [NODE]


def _sources_by_gpu(series: list[dict[str, Any]]) -> dict[str, set[str]]:
    """gpu → the sources of its series: ``dcgm`` (dcgm-exporter labels ``UUID``) or ``daemon``."""
    sources: dict[str, set[str]] = {}
    for item in series:
        labels = item["metric"]
        sources.setdefault(labels["gpu"], set()).add("dcgm" if "UUID" in labels else "daemon")
    return sources


@pytest.mark.parametrize("engine", ENGINES)
def test_either_source_panels_read_dcgm_where_it_exports_and_the_daemon_elsewhere(
    stack: Stack, dashboards: list[Dashboard], engine: str,
) -> None:
    """Each GPU once: DCGM profiling for the GPUs dcgm-exporter watches, the daemon's GPM
    series for the others; memory from the daemon, which sees every GPU.

    The queries are instant ones: a scrape that timed out (1 s here, on a loaded machine)
    leaves its target's series stale at that instant, so the check is asked again at a
    newer instant, a scrape apart, AGREEMENT_TRIES times before its failure counts; the
    failure names the targets' ``up`` at the instant it read."""
    api = stack.engines[engine]["dcgm"]
    for attempt in range(1, AGREEMENT_TRIES + 1):
        now = time.time() - AGREEMENT_LAG_SECONDS
        try:
            _check_either_source_panels(api, dashboards, stack.started, now)
            return
        except AssertionError as failure:
            up = {item["metric"].get("job", "?"): item["value"][1]
                  for item in api.query("up", now)}
            if attempt == AGREEMENT_TRIES:
                raise AssertionError(f"{failure} (up at that instant: {up})") from failure
            time.sleep(SCRAPE_SECONDS)


def _check_either_source_panels(api: QueryAPI, dashboards: list[Dashboard], started: float,
                                now: float) -> None:
    window = Window(start=started, end=now, step=SCRAPE_SECONDS,
                    scrape_interval=SCRAPE_SECONDS)
    dcgm_gpus = {str(gpu) for gpu in DCGM_DEVICES}
    checked: list[str] = []
    for dashboard in dashboards:
        if dashboard.variant != "dcgm":
            continue
        either = [q for q in panel_queries(dashboard) if EITHER_SOURCE in q.expr]
        selection = next(selections(dashboard.variables(), api, window))
        for query in either:
            series = api.query(interpolate(query.expr, selection.values), now)
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
                    side_sources = _sources_by_gpu(api.query(side, now))
                    dcgm_side = "DCGM_" in side
                    assert side_sources == {
                        gpu: {"dcgm" if dcgm_side else "daemon"}
                        for gpu in (dcgm_gpus if dcgm_side else sources.keys())
                    }, (query.where, side, side_sources)
            checked.append(query.where)
    titles = {where.split(" · ")[1] for where in checked}
    assert {"'SM active'", "'Tensor pipe active'", "'DRAM active'",
            "'Memory used share'"} <= titles, checked


# --- The engines side by side -------------------------------------------------------------

#: An instant result: each series' labels → its value.
Series = dict[frozenset[tuple[str, str]], float]


def _series(result: list[dict[str, Any]]) -> Series:
    """Label set → value of every series of an instant result (a scalar: no labels)."""
    return {
        frozenset(item.get("metric", {}).items()):
            float(item["value"][1] if "value" in item else item["result"][1])
        for item in result
    }


def _value_kind(value: float) -> str:
    """``NaN``, ``+Inf``, ``-Inf`` or ``number``: a panel shows each differently."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return "number"


def _compares_values(expr: str) -> bool:
    """Whether VictoriaMetrics' values of ``expr`` must lie in Prometheus' (GAUGE_TOLERANCE)."""
    return "[" not in expr and "time()" not in expr and not any(
        ":" in name for name in metric_names(expr))


#: Each series' lowest and highest value over a span.
Spread = dict[frozenset[tuple[str, str]], tuple[float, float]]


def _spread(result: list[dict[str, Any]]) -> Spread:
    """Label set → (min, max) of the numbers of every series of a range result."""
    spread: Spread = {}
    for item in result:
        numbers = [float(v) for _, v in item["values"] if math.isfinite(float(v))]
        if numbers:
            spread[frozenset(item["metric"].items())] = (min(numbers), max(numbers))
    return spread


def _differences(expected: Series, found: Series, spread: Spread | None) -> list[str]:
    """What differs between Prometheus' series (``expected``, and the ``spread`` of their
    values when those are compared) and VictoriaMetrics' (``found``)."""
    def labels(key: frozenset[tuple[str, str]]) -> str:
        return "{" + ", ".join(f"{k}={v!r}" for k, v in sorted(key)) + "}"

    lines = [f"prometheus only: {labels(k)}" for k in expected.keys() - found.keys()]
    lines += [f"victoriametrics only: {labels(k)}" for k in found.keys() - expected.keys()]
    for key in expected.keys() & found.keys():
        a, b = expected[key], found[key]
        if _value_kind(a) != _value_kind(b):
            lines.append(f"{labels(key)}: prometheus {a:g}, victoriametrics {b:g}")
        elif spread is not None and _value_kind(b) == "number":
            low, high = spread.get(key, (a, a))
            margin = GAUGE_TOLERANCE * max(abs(low), abs(high), abs(a))
            if not low - margin <= b <= high + margin:
                lines.append(f"{labels(key)}: prometheus {low:g} to {high:g} over "
                             f"{GAUGE_SPAN_SECONDS:g} s, victoriametrics {b:g}")
    return sorted(lines)


def _disagreement(prometheus: QueryAPI, victoriametrics: QueryAPI, expr: str) -> list[str]:
    """What differs when both engines are asked ``expr`` at the same instant (nothing:
    []); a difference must last AGREEMENT_TRIES tries, a scrape apart, and for a query
    over recording rules RULE_AGREEMENT_SECONDS."""
    differences: list[str] = []
    reads_rules = any(":" in name for name in metric_names(expr))
    settle = time.monotonic() + (RULE_AGREEMENT_SECONDS if reads_rules else 0.0)
    tries = 0
    while tries < AGREEMENT_TRIES or time.monotonic() < settle:
        tries += 1
        at = time.time() - AGREEMENT_LAG_SECONDS
        spread = (_spread(prometheus.query_range(expr, at - GAUGE_SPAN_SECONDS, at,
                                                 SCRAPE_SECONDS))
                  if _compares_values(expr) else None)
        differences = _differences(_series(prometheus.query(expr, at)),
                                   _series(victoriametrics.query(expr, at)), spread)
        if not differences:
            break
        time.sleep(SCRAPE_SECONDS)
    return differences


def test_both_engines_return_the_same_series_for_every_panel_query(
    stack: Stack, dashboards: list[Dashboard],
) -> None:
    """Each variable offers the same values on both engines, and each panel and
    annotation query, asked at one instant, returns the same label sets (metric name
    kept or dropped alike, no series dropped for NaN, the same labels after joins)
    with values of the same kind, and queries over gauges alone values that
    Prometheus had too (GAUGE_SPAN_SECONDS, GAUGE_TOLERANCE)."""
    for engine in ENGINES:  # else a recording rule still missing on one engine differs
        _until_every_query_has_data(stack, dashboards, engine)
    differences: list[str] = []
    compared = with_values = 0
    for dashboard in dashboards:
        prometheus = stack.engines["prometheus"][dashboard.variant]
        victoriametrics = stack.engines["victoriametrics"][dashboard.variant]
        now = time.time() - AGREEMENT_LAG_SECONDS
        window = Window(start=stack.started, end=now, step=SCRAPE_SECONDS,
                        scrape_interval=SCRAPE_SECONDS)
        for selection, vm_selection in zip(
            selections(dashboard.variables(), prometheus, window),
            selections(dashboard.variables(), victoriametrics, window), strict=True,
        ):
            assert selection.variable_queries == vm_selection.variable_queries, dashboard.name
            for query in [*panel_queries(dashboard), *annotation_queries(dashboard)]:
                if query.where in ENGINE_DIFFERENCES:
                    continue
                compared += 1
                expr = interpolate(query.expr, selection.values)
                with_values += _compares_values(expr)
                difference = _disagreement(prometheus, victoriametrics, expr)
                if difference:
                    differences.append(f"{query.where}\n    {expr}\n    " + "\n    ".join(difference))
    print(f"\ncompared {compared} dashboard queries on both engines ({with_values} with "
          "their values)", file=sys.stderr)
    assert not differences, "the engines disagree:\n" + "\n".join(differences)


def _file_rules(rule_files: list[Path]) -> dict[str, list[str]]:
    """group → the names of its rules (alert or record), as the files list them."""
    groups: dict[str, list[str]] = {}
    for path in rule_files:
        for group in yaml.safe_load(path.read_text())["groups"]:
            groups[group["name"]] = sorted(r.get("alert") or r["record"] for r in group["rules"])
    return groups


def _engine_rules(groups: list[dict[str, Any]]) -> dict[str, list[str]]:
    return {group["name"]: sorted(rule["name"] for rule in group["rules"]) for group in groups}


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_rule_loads_and_evaluates_in_vmalert_as_in_prometheus(
    stack: Stack, variant: str,
) -> None:
    """vmalert has every group and rule of the variant's files and evaluates each
    without error; Prometheus, evaluating the same files, reports every rule healthy."""
    expected = _file_rules(stack.rule_files[variant])
    vmalert = stack.vmalert[variant]
    assert _engine_rules(vmalert.groups()) == expected
    prometheus = stack.prometheus[variant]
    assert _engine_rules(prometheus.api("rules", [])["groups"]) == expected
    time.sleep(max(0.0, stack.started + SETTLE_SECONDS + VMALERT_SETTLE_SECONDS - time.time()))
    rules = {f"{group['name']}/{rule['name']}": rule
             for group in vmalert.groups() for rule in group["rules"]}
    never = sorted(name for name, rule in rules.items()
                   if rule["lastEvaluation"].startswith("0001-"))  # Go's zero time
    assert not never, f"vmalert never evaluated: {never}"
    assert vmalert.rule_errors() == {}
    assert {name for name, rule in rules.items() if rule["health"] != "ok"} == set()
    unhealthy = {
        f"{group['name']}/{rule['name']}": f"{rule['health']}: {rule.get('lastError', '')}"
        for group in prometheus.api("rules", [])["groups"] for rule in group["rules"]
        if rule["health"] != "ok"
    }
    assert unhealthy == {}

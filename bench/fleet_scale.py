"""Fleet scale: a simulated fleet scraped by vmagent → VictoriaMetrics and by Prometheus.

Per fleet size, in one run, side by side on loopback (every binary Debian's):

* the fleet simulator (``bench/fleet_sim.py``, its own process): N nodes, each a
  trainmon target and a dcgm-exporter target, derived from a real
  ``trainmon serve --demo``;
* ``--shards`` vmagents from the shipped ``deploy/scale/vmagent-dcgm.yml``
  (``TRAINMON_SHARD_COUNT``/``TRAINMON_SHARD`` in their environment) writing to
  one VictoriaMetrics, and vmalert evaluating ``alerts/dcgm/*.rules.yml`` on it;
* one Prometheus (the full server) from ``deploy/prometheus/prometheus-dcgm.yml``
  with the same rules.

Both engines scrape the same targets at ``--scrape-interval`` and evaluate every
``--evaluation-interval``; only the intervals, the target lists (the
simulator's) and the rule path are changed from the shipped files, and
Prometheus' Alertmanager section is dropped (vmalert notifies a dead loopback
port). After every target is up and ``--warmup`` seconds more, a window of
``--duration`` seconds is measured:

* active series: Prometheus ``prometheus_tsdb_head_series``; VictoriaMetrics the
  series with a sample in the last 5 minutes, counted by queries (its index of
  the day, ``/api/v1/status/tsdb``, is reported too: it can hold a series twice
  when two inserts create it at once); exact counts per metric name on both
  (trainmon, DCGM, the scrape's ``up``/``scrape_*``, recording rules, ``ALERTS``);
* samples/s: ``prometheus_tsdb_head_samples_appended_total``,
  ``vm_rows_added_to_storage_total`` deltas over the window;
* CPU (user + system seconds per second) and peak RSS of every process, by pid;
* scrapes: per target, how many each engine made in the window (the
  simulator counts them by ``User-Agent``; expected window / interval), the
  longest ``scrape_duration_seconds`` and the targets not up;
* rule groups: every evaluation's duration seen in the window (Prometheus'
  group ``evaluationTime``; vmalert's rules' ``evaluationTime`` summed, its
  groups evaluate their rules one after another), p50 and max;

then the fleet dashboard (``dashboards/dcgm/fleet.json``) is refreshed
``--refreshes`` times on each engine: its variable resolved as Grafana does
(``testkit/grafana_templating.py``), every panel query sent as a range
query over the time the engines have run (step = scrape interval) or as an
instant query; p50/p95 of the queries and the median refresh total.

The machine's cores are shared by everything, the simulator included: its own
CPU is reported so that it can be subtracted.

    .venv/bin/python -m bench.fleet_scale                       # 100 and 1000 nodes, ~15 min
    .venv/bin/python -m bench.fleet_scale --nodes 100 --duration 60

Prints markdown tables for docs/benchmarks.md (``--output`` writes them too).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench import benchlib, fleet_sim
from deploy import bundle
from testkit.dashboard_files import (
    Dashboard,
    annotation_queries,
    load_dashboards,
    panel_queries,
)
from testkit.grafana_templating import Window, interpolate, selections
from testkit.prometheus import Prometheus, QueryAPI, QueryError
from testkit.victoriametrics import VictoriaMetrics, VMAgent, VMAlert

logger = logging.getLogger(__name__)

VARIANT = "dcgm"
ROOT = benchlib.ROOT
VMAGENT_CONFIG = ROOT / "deploy" / "scale" / f"vmagent-{VARIANT}.yml"
PROMETHEUS_CONFIG = ROOT / "deploy" / "prometheus" / f"prometheus-{VARIANT}.yml"
RULE_FILES = tuple(sorted((ROOT / "alerts" / VARIANT).glob("*.rules.yml")))
#: Nothing listens there: vmalert's notifications go nowhere (no Alertmanager in the run).
DEAD_NOTIFIER = "http://127.0.0.1:9"
ENGINES = ("victoriametrics", "prometheus")
ENGINE_TITLES = {"victoriametrics": "vmagent → VictoriaMetrics", "prometheus": "Prometheus"}
#: User-Agent products of the two scrapers.
SCRAPER_CLIENTS = {"victoriametrics": "vm_promscrape", "prometheus": "Prometheus"}
SIMULATOR_READY_SECONDS = 300.0
#: Beyond this many intervals without every target up on both engines, the run fails.
UP_DEADLINE_INTERVALS = 8
UP_DEADLINE_SECONDS = 120.0
DASHBOARD_RANGE_CAP_SECONDS = 3600.0
#: Series per counting query on VictoriaMetrics (its limit per query is 300 000).
VM_COUNT_CHUNK_SERIES = 25_000
#: What the reads after the window (series by name, rule errors, dashboard refreshes)
#: may take in all: an engine past its machine answers slowly or not at all, and the run
#: reports what it could not read instead of waiting for it.
READ_BUDGET_SECONDS = 600.0


class ReadBudget:
    """Seconds left for the reads after the measurement window."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def spent(self) -> bool:
        return time.monotonic() >= self.deadline


@dataclass
class DashboardTiming:
    """One engine's fleet-dashboard refreshes."""

    queries_per_refresh: int
    latencies: list[float] = field(default_factory=list)
    refresh_totals: list[float] = field(default_factory=list)
    slowest: tuple[float, str] = (0.0, "")
    #: Panel → its expanded query, for the queries that returned nothing.
    empty: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


@dataclass
class ScrapeHealth:
    targets: int
    #: Scrapes per target in the window, as the simulator counted them (min, mean).
    scrapes_min: int
    scrapes_max: int
    scrapes_mean: float
    expected_scrapes: float
    max_scrape_seconds: float
    mean_scrape_seconds: float
    down: float


@dataclass
class SizeResult:
    nodes: int
    shards: int
    scrape_interval: float
    evaluation_interval: float
    window_seconds: float
    simulated_series: int
    trainmon_series_per_node: dict[str, int]
    dcgm_series_per_node: dict[str, int]
    #: Engine → active series (its own gauge).
    active_series: dict[str, int]
    #: Engine → metric name → series (all names; exact).
    series_by_name: dict[str, dict[str, int]]
    samples_per_second: dict[str, float]
    #: Process (simulator, vmagent-0, …, victoria-metrics, vmalert, prometheus) → cores.
    cpu_cores: dict[str, float]
    rss_mib: dict[str, float]
    #: Engine → group → evaluation durations seen in the window, seconds.
    rule_groups: dict[str, dict[str, list[float]]]
    #: Engine → ``group/rule`` → its last error.
    rule_errors: dict[str, dict[str, str]]
    #: Engine → rule groups it loaded.
    groups_loaded: dict[str, list[str]]
    scrapes: dict[str, ScrapeHealth]
    dashboard: dict[str, DashboardTiming]
    #: vmagent shard → nodes of its active targets, per scrape job.
    shard_targets: list[dict[str, list[str]]]
    #: Seconds from start-up until every target was up on both engines (None: never).
    targets_up_seconds: float | None = None
    #: Wall time of the whole size: start-up, warm-up, window, queries, stop.
    run_seconds: float = 0.0
    #: engine → rule group iterations in the window: "due" (groups × window / interval),
    #: "run" and "missed" (Prometheus' prometheus_rule_group_iterations*_total, vmalert's
    #: vmalert_iteration*_total deltas): a group slower than its interval misses some.
    rule_iterations: dict[str, dict[str, float]] = field(default_factory=dict)


def _get(url: str, timeout: float = 60.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        return bytes(answer.read())


def own_metrics(url: str) -> dict[str, float]:
    """A server's ``/metrics``: ``name{k="v",…}`` → value (labels sorted)."""
    values: dict[str, float] = {}
    text = _get(url + "/metrics").decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            values[f"{sample.name}{{{labels}}}"] = float(sample.value)
    return values


#: What the report says of a reading the engine was too busy to answer.
UNREAD = "not read: the engine did not answer in time"


def _or_unread(read: Callable[[], Any], unread: Any) -> Any:
    """``read()`` (retried), or ``unread`` when the engine stays too busy to answer."""
    try:
        return _retrying(read)
    except TRANSIENT as error:
        logger.warning("not read: %s", error)
        return unread


def _metrics_or_none(url: str) -> dict[str, float] | None:
    """``own_metrics``, or None when the server stays too busy to answer (vmalert's
    handlers wait while its groups evaluate on an overloaded engine)."""
    try:
        return dict(_retrying(lambda: own_metrics(url)))
    except TRANSIENT as error:
        logger.warning("%s/metrics not read: %s", url, error)
        return None


def metric_sum(values: Mapping[str, float], name: str, contains: str = "") -> float:
    return sum(v for k, v in values.items() if k.startswith(name + "{") and contains in k)


def vmagent_config(interval: float, timeout: float) -> str:
    """The shipped vmagent file with the global scrape interval and timeout replaced
    (text: it is YAML only after vmagent expands its placeholders)."""
    text = VMAGENT_CONFIG.read_text()
    for key, value in (("scrape_interval", interval), ("scrape_timeout", timeout)):
        text, count = re.subn(rf"(?m)^  {key}: \S+$", f"  {key}: {value:g}s", text)
        if count != 1:
            raise RuntimeError(f"{VMAGENT_CONFIG}: expected one global {key}, found {count}")
    return text


def prometheus_config(interval: float, timeout: float, evaluation: float, targets: Path,
                      rules: Path) -> dict[str, Any]:
    """The shipped Prometheus config, aimed at ``targets`` and the rules in ``rules``."""
    config: dict[str, Any] = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    config["global"].update(scrape_interval=f"{interval:g}s", scrape_timeout=f"{timeout:g}s",
                            evaluation_interval=f"{evaluation:g}s")
    config.pop("alerting", None)
    config["rule_files"] = [str(rules / "*.yml")]
    for job in config["scrape_configs"]:
        job.pop("scrape_interval", None)
        job.pop("scrape_timeout", None)
        for sd in job["file_sd_configs"]:
            sd["files"] = [str(targets / Path(path).name) for path in sd["files"]]
    return config


class Simulator:
    """``python -m bench.fleet_sim`` as a child process (its CPU is its own)."""

    def __init__(self, workdir: Path, templates: Path, nodes: int, interval: float,
                 targets: Path, max_seconds: float) -> None:
        ready = workdir / "simulator.ready"
        self.log_path = workdir / "simulator.log"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.fleet_sim", "--templates", str(templates),
             "--nodes", str(nodes), "--interval", f"{interval:g}", "--targets", str(targets),
             "--ready-file", str(ready), "--max-seconds", f"{max_seconds:.0f}"],
            cwd=ROOT, stdout=self.log_path.open("wb"), stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        deadline = time.monotonic() + SIMULATOR_READY_SECONDS
        while not ready.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the fleet simulator did not start:\n"
                                   f"{self.log_path.read_text(errors='replace')}")
            time.sleep(0.2)
        self.url = f"http://{ready.read_text().strip()}"

    def scrapes(self) -> dict[tuple[str, str, str], int]:
        """(node, source, client) → scrapes so far."""
        rows = json.loads(_get(self.url + "/stats"))["scrapes"]
        return {(node, source, client): count for node, source, client, count in rows}

    def stop(self) -> None:
        benchlib.stop(self.process)


@dataclass
class Stack:
    simulator: Simulator
    victoria_metrics: VictoriaMetrics
    vmagents: list[VMAgent]
    vmalert: VMAlert
    prometheus: Prometheus
    started: float

    def engine(self, name: str) -> QueryAPI:
        return self.victoria_metrics if name == "victoriametrics" else self.prometheus

    def pids(self) -> dict[str, int]:
        pids = {"simulator": self.simulator.process.pid}
        for shard, agent in enumerate(self.vmagents):
            pids[f"vmagent-{shard}"] = _pid(agent)
        pids["victoria-metrics"] = _pid(self.victoria_metrics)
        pids["vmalert"] = _pid(self.vmalert)
        pids["prometheus"] = _pid(self.prometheus)
        return pids


def _pid(server: Any) -> int:
    assert server.process is not None
    return int(server.process.pid)


@contextlib.contextmanager
def fleet_stack(workdir: Path, templates: Path, nodes: int, *, interval: float,
                evaluation: float, shards: int, max_seconds: float) -> Iterator[Stack]:
    """The simulator, the VictoriaMetrics stack and Prometheus, stopped on exit."""
    timeout = min(10.0, interval)
    scrape = workdir / "scrape"
    targets = scrape / "targets"
    rules = workdir / "rules"
    rules.mkdir(parents=True)
    for path in RULE_FILES:
        shutil.copy(path, rules / path.name)
    vmagent_path = scrape / VMAGENT_CONFIG.name
    with contextlib.ExitStack() as stack:
        simulator = Simulator(workdir, templates, nodes, interval, targets, max_seconds)
        stack.callback(simulator.stop)
        vmagent_path.write_text(vmagent_config(interval, timeout))

        def started(server: Any, folder: str) -> Any:
            (workdir / folder).mkdir()
            stack.callback(server.stop)
            return server

        vm = started(VictoriaMetrics(workdir / "victoria-metrics"), "victoria-metrics").start()
        agents = []
        for shard in range(shards):
            agent = started(VMAgent(workdir / f"vmagent-{shard}"), f"vmagent-{shard}")
            agents.append(agent.start(vmagent_path, remote_write=vm.write_url, env={
                "TRAINMON_SHARD_COUNT": str(shards), "TRAINMON_SHARD": str(shard)}))
        vmalert = started(VMAlert(workdir / "vmalert"), "vmalert").start(
            sorted(rules.glob("*.yml")), engine=vm.url, notifier=DEAD_NOTIFIER,
            evaluation_interval=f"{evaluation:g}s")
        prometheus = started(Prometheus(workdir / "prometheus"), "prometheus").start(
            prometheus_config(interval, timeout, evaluation, targets, rules))
        yield Stack(simulator, vm, agents, vmalert, prometheus, time.time())


#: What a busy engine answers with: a refusal, a timeout, or a plain-text error page
#: (VictoriaMetrics' 503 "couldn't start executing the request", which is not JSON).
TRANSIENT = (QueryError, OSError, ValueError)
RETRIES = 3
RETRY_PAUSE_SECONDS = 5.0


def _query(engine: QueryAPI, expr: str) -> list[dict[str, Any]]:
    """An instant query, retried ``RETRIES`` times while the engine is busy."""
    for attempt in range(RETRIES):
        try:
            return engine.query(expr)
        except TRANSIENT as error:
            if attempt == RETRIES - 1:
                raise
            logger.info("%s: %s; retrying", expr, error)
            time.sleep(RETRY_PAUSE_SECONDS)
    raise AssertionError("unreachable")


def _count(engine: QueryAPI, expr: str) -> float:
    result = _query(engine, expr)
    return float(result[0]["value"][1]) if result else 0.0


def _count_or_nan(engine: QueryAPI, expr: str) -> float:
    """``_count``, or NaN (printed "n/a") when the engine stays too busy to answer."""
    try:
        return _count(engine, expr)
    except TRANSIENT as error:
        logger.warning("%s: not answered: %s", expr, error)
        return math.nan


def _retrying(read: Callable[[], Any]) -> Any:
    for attempt in range(RETRIES):
        try:
            return read()
        except TRANSIENT as error:
            if attempt == RETRIES - 1:
                raise
            logger.info("%s; retrying", error)
            time.sleep(RETRY_PAUSE_SECONDS)
    raise AssertionError("unreachable")


def wait_for_targets(stack: Stack, targets: int, interval: float) -> float | None:
    """Seconds until both engines hold ``up == 1`` for every target; None (and a
    warning naming Prometheus' scrape errors) if that did not happen by a deadline:
    the run then goes on, and its report shows the scrapes that failed."""
    began = time.monotonic()
    deadline = began + UP_DEADLINE_SECONDS + UP_DEADLINE_INTERVALS * interval
    seen: dict[str, float] = {}
    while time.monotonic() < deadline:
        try:
            seen = {name: float(len(stack.engine(name).query("up == 1"))) for name in ENGINES}
        except TRANSIENT as error:
            logger.info("engines not answering yet: %s", error)
        if seen and all(value == targets for value in seen.values()):
            return time.monotonic() - began
        time.sleep(min(interval, 2.0))
    errors = Counter(
        target.get("lastError", "")
        for target in stack.prometheus.api("targets", [("state", "active")])["activeTargets"])
    logger.warning("not every one of %d targets came up (up == 1: %s); Prometheus' scrape "
                   "errors: %s", targets, seen, dict(errors.most_common(3)))
    return None


def _evaluated_at(text: str) -> str:
    return text[:26]  # RFC 3339 to the microsecond: one evaluation, however it is printed


def rule_evaluations(stack: Stack) -> dict[str, dict[str, tuple[str, float]]]:
    """Engine → group → (last evaluation time, its duration in seconds); an engine
    too busy to answer in time is left out of this reading."""
    readings: dict[str, dict[str, tuple[str, float]]] = {}
    try:
        readings["prometheus"] = {
            group["name"]: (_evaluated_at(group["lastEvaluation"]),
                            float(group["evaluationTime"]))
            for group in stack.prometheus.api("rules", [])["groups"]
        }
    except TRANSIENT as error:
        logger.warning("Prometheus' rule groups not read: %s", error)
    try:
        readings["victoriametrics"] = {
            group["name"]: (_evaluated_at(group["lastEvaluation"]),
                            sum(float(rule["evaluationTime"]) for rule in group["rules"]))
            for group in stack.vmalert.groups()
        }
    except TRANSIENT as error:
        logger.warning("vmalert's rule groups not read: %s", error)
    return readings


def rule_errors(stack: Stack) -> dict[str, dict[str, str]]:
    prometheus = {
        f"{group['name']}/{rule['name']}": rule["lastError"]
        for group in stack.prometheus.api("rules", [])["groups"]
        for rule in group["rules"] if rule.get("lastError")
    }
    return {"victoriametrics": stack.vmalert.rule_errors(), "prometheus": prometheus}


def _never_evaluated(evaluation: str) -> bool:
    return evaluation.startswith(("0001-01-01", "1970-01-01"))


def series_by_name(stack: Stack, budget: ReadBudget) -> dict[str, dict[str, int]]:
    """Engine → metric name → series with a sample in the last 5 minutes.

    The names come from VictoriaMetrics' index of the day (whose counts may include
    duplicate entries made under concurrent inserts, so they only size the chunks)
    and Prometheus' label values; each engine counts them with ``count by
    (__name__)`` queries of at most ``VM_COUNT_CHUNK_SERIES`` series, under
    VictoriaMetrics' limit per query (``-search.maxUniqueTimeseries``, 300 000) and
    far from either engine's query timeout."""
    tsdb = stack.victoria_metrics.api("status/tsdb", [("topN", "100000")])
    sizes = {row["name"]: int(row["value"]) for row in tsdb["seriesCountByMetricName"]}
    now = time.time()
    for name in stack.prometheus.label_values("__name__", None, now - 300, now):
        sizes.setdefault(name, 1)
    chunks: list[list[str]] = [[]]
    total = 0
    for name, count in sorted(sizes.items()):
        if total + count > VM_COUNT_CHUNK_SERIES and chunks[-1]:
            chunks.append([])
            total = 0
        chunks[-1].append(name)
        total += count
    counts: dict[str, dict[str, int]] = {}
    for engine in ENGINES:
        found = counts.setdefault(engine, {})
        for chunk in chunks:
            if budget.spent():
                logger.warning("%s: %d metric names not counted: read budget spent",
                               engine, len(chunk))
                continue
            names = "|".join(chunk)  # metric names hold no regex metacharacters
            try:
                rows = _query(stack.engine(engine),
                              f'count by (__name__) ({{__name__=~"{names}"}})')
            except TRANSIENT as error:  # too busy: these names stay uncounted (the report says)
                logger.warning("%s: %d metric names not counted: %s", engine, len(chunk), error)
                continue
            for row in rows:
                found[row["metric"]["__name__"]] = int(float(row["value"][1]))
    return counts


def shard_targets(stack: Stack) -> list[dict[str, list[str]]]:
    shards = []
    for agent in stack.vmagents:
        jobs: dict[str, list[str]] = {}
        for target in agent.api("targets", [("state", "active")])["activeTargets"]:
            jobs.setdefault(target["labels"]["job"], []).append(target["labels"]["node"])
        shards.append({job: sorted(nodes) for job, nodes in jobs.items()})
    return shards


def scrape_health(stack: Stack, engine: str, before: Mapping[tuple[str, str, str], int],
                  after: Mapping[tuple[str, str, str], int], window: float,
                  interval: float) -> ScrapeHealth:
    client = SCRAPER_CLIENTS[engine]
    keys = {(node, source) for node, source, _ in after}
    counts = [after.get((node, source, client), 0) - before.get((node, source, client), 0)
              for node, source in sorted(keys)]
    query = stack.engine(engine)
    span = f"{window:.0f}s"
    return ScrapeHealth(
        targets=len(keys), scrapes_min=min(counts, default=0),
        scrapes_max=max(counts, default=0),
        scrapes_mean=statistics.fmean(counts) if counts else 0.0,
        expected_scrapes=window / interval,
        max_scrape_seconds=_count_or_nan(
            query, f"max(max_over_time(scrape_duration_seconds[{span}]))"),
        mean_scrape_seconds=_count_or_nan(
            query, f"avg(avg_over_time(scrape_duration_seconds[{span}]))"),
        down=_count_or_nan(query, "count(up == 0) or vector(0)"),
    )


def fleet_dashboard() -> Dashboard:
    return next(d for d in load_dashboards() if d.variant == VARIANT and d.kind == "fleet")


def time_dashboard(engine: QueryAPI, dashboard: Dashboard, window: Window,
                   refreshes: int, budget: ReadBudget) -> DashboardTiming:
    """Refresh ``dashboard`` ``refreshes`` times: its variables, then every query; the
    queries not sent once ``budget`` is spent are listed as errors of the first refresh."""
    queries = [*panel_queries(dashboard), *annotation_queries(dashboard)]
    timing = DashboardTiming(queries_per_refresh=0)
    for refresh in range(refreshes):
        if budget.spent():
            if refresh == 0:
                timing.errors.append(f"{dashboard.name}: not refreshed: read budget spent")
            break
        began = time.perf_counter()
        chosen = list(selections(dashboard.variables(), engine, window))
        total = time.perf_counter() - began
        count = sum(len(s.variable_queries) for s in chosen)
        for selection in chosen:
            for query in queries:
                if budget.spent():
                    if refresh == 0:
                        timing.errors.append(f"{query.where}: not sent: read budget spent")
                    continue
                expr = interpolate(query.expr, selection.values)
                started = time.perf_counter()
                try:
                    result = (engine.query(expr, window.end) if query.instant else
                              engine.query_range(expr, window.start, window.end, window.step))
                except TRANSIENT as error:
                    result = None
                    if refresh == 0:
                        timing.errors.append(f"{query.where}: {error}")
                elapsed = time.perf_counter() - started
                total += elapsed
                count += 1
                timing.latencies.append(elapsed)
                timing.slowest = max(timing.slowest, (elapsed, query.where))
                if refresh == 0 and result == []:
                    timing.empty[query.where] = expr
        timing.refresh_totals.append(total)
        timing.queries_per_refresh = count
    return timing


def run_size(workdir: Path, templates: Path, nodes: int, *, duration: float, warmup: float,
             interval: float, evaluation: float, shards: int, refreshes: int,
             ) -> SizeResult:
    """One fleet size: start everything, measure, stop everything."""
    lifetime = SIMULATOR_READY_SECONDS + UP_DEADLINE_SECONDS + warmup + duration + 1800
    fleet_sizes = fleet_sim.Fleet(fleet_sim.load_templates(templates), nodes)
    with fleet_stack(workdir, templates, nodes, interval=interval, evaluation=evaluation,
                     shards=shards, max_seconds=lifetime) as stack:
        targets = nodes * len(fleet_sizes.sources)
        up_after = wait_for_targets(stack, targets, interval)
        time.sleep(warmup)
        pids = stack.pids()
        vm_before = own_metrics(stack.victoria_metrics.url)
        prom_before = own_metrics(stack.prometheus.url)
        vmalert_before = _metrics_or_none(stack.vmalert.url)
        # the window starts here: after the reads above, which take time on a busy engine
        cpu_before = {name: benchlib.cpu_seconds(pid) for name, pid in pids.items()}
        peak = {name: benchlib.memory_kib(pid) for name, pid in pids.items()}
        scrapes_before = stack.simulator.scrapes()
        began = time.monotonic()
        evaluations: dict[str, dict[str, dict[str, float]]] = {e: {} for e in ENGINES}
        while time.monotonic() - began < duration:
            for engine, groups in rule_evaluations(stack).items():
                for group, (at, seconds) in groups.items():
                    if not _never_evaluated(at):
                        evaluations[engine].setdefault(group, {})[at] = seconds
            for name, pid in pids.items():
                peak[name] = max(peak[name], benchlib.memory_kib(pid))
            time.sleep(max(0.0, min(interval, duration - (time.monotonic() - began))))
        window = time.monotonic() - began
        cpu = {name: (benchlib.cpu_seconds(pid) - cpu_before[name]) / window
               for name, pid in pids.items()}
        scrapes_after = stack.simulator.scrapes()  # first: the reads below take time
        vm_after = own_metrics(stack.victoria_metrics.url)
        prom_after = own_metrics(stack.prometheus.url)
        vmalert_after = _metrics_or_none(stack.vmalert.url)
        group_count = len(bundle.rule_groups(VARIANT))

        def iterations(before: Mapping[str, float] | None, after: Mapping[str, float] | None,
                       run: str, missed: str) -> dict[str, float]:
            due = group_count * window / evaluation
            if before is None or after is None:  # too busy to answer: the report says n/a
                return {"due": due, "run": math.nan, "missed": math.nan}
            return {"due": due, "run": metric_sum(after, run) - metric_sum(before, run),
                    "missed": metric_sum(after, missed) - metric_sum(before, missed)}

        rule_iterations = {
            "victoriametrics": iterations(vmalert_before, vmalert_after,
                                          "vmalert_iteration_total",
                                          "vmalert_iteration_missed_total"),
            "prometheus": iterations(prom_before, prom_after,
                                     "prometheus_rule_group_iterations_total",
                                     "prometheus_rule_group_iterations_missed_total"),
        }
        budget = ReadBudget(READ_BUDGET_SECONDS)
        samples = {
            "victoriametrics": (metric_sum(vm_after, "vm_rows_added_to_storage_total")
                                - metric_sum(vm_before, "vm_rows_added_to_storage_total")) / window,
            "prometheus": (metric_sum(prom_after, "prometheus_tsdb_head_samples_appended_total")
                           - metric_sum(prom_before, "prometheus_tsdb_head_samples_appended_total")
                           ) / window,
        }
        scrapes = {engine: scrape_health(stack, engine, scrapes_before, scrapes_after,
                                         window, interval) for engine in ENGINES}
        names = series_by_name(stack, budget)
        active = {
            "victoriametrics": sum(names["victoriametrics"].values()),
            "prometheus": int(metric_sum(prom_after, "prometheus_tsdb_head_series")),
            "victoriametrics-day-index": stack.victoria_metrics.total_series(),
            "victoriametrics-hour": int(metric_sum(vm_after, "vm_cache_entries",
                                                   'type="storage/hour_metric_ids"')),
        }
        errors = _or_unread(lambda: rule_errors(stack),
                            {e: {"(rules)": UNREAD} for e in ENGINES})
        loaded = {
            "victoriametrics": _or_unread(
                lambda: sorted(g["name"] for g in _retrying(stack.vmalert.groups)), [UNREAD]),
            "prometheus": _or_unread(lambda: sorted(
                g["name"] for g in _retrying(lambda: stack.prometheus.api("rules", []))["groups"]),
                [UNREAD]),
        }
        shards_seen = shard_targets(stack)
        end = time.time()
        span = min(end - stack.started, DASHBOARD_RANGE_CAP_SECONDS)
        dashboard_window = Window(start=end - span, end=end, step=interval,
                                  scrape_interval=interval)
        dashboard = fleet_dashboard()
        timings = {engine: time_dashboard(stack.engine(engine), dashboard, dashboard_window,
                                          refreshes, budget) for engine in ENGINES}
    return SizeResult(
        nodes=nodes, shards=shards, scrape_interval=interval, evaluation_interval=evaluation,
        window_seconds=window, simulated_series=fleet_sizes.total_series,
        trainmon_series_per_node=fleet_sizes.series_per_node("trainmon"),
        dcgm_series_per_node=fleet_sizes.series_per_node("dcgm-exporter"),
        active_series=active, series_by_name=names, samples_per_second=samples,
        cpu_cores=cpu, rss_mib={name: kib / 1024 for name, kib in peak.items()},
        rule_groups={engine: {group: list(seen.values()) for group, seen in groups.items()}
                     for engine, groups in evaluations.items()},
        rule_errors=errors, groups_loaded=loaded, scrapes=scrapes, dashboard=timings,
        shard_targets=shards_seen, targets_up_seconds=up_after,
        rule_iterations=rule_iterations,
    )


def capture(folder: Path) -> Path:
    """Templates from a real demo node, saved for the simulator process."""
    path = folder / "templates.json"
    capture_folder = folder / "template-capture"
    capture_folder.mkdir()
    fleet_sim.save_templates(fleet_sim.capture_templates(capture_folder), path)
    return path


def run(nodes: Sequence[int], *, duration: float, warmup: float, interval: float,
        evaluation: float, shards: int, refreshes: int, workdir: Path,
        progress: Callable[[str], None] = logger.info,
        finished: Callable[[list[SizeResult]], None] = lambda results: None,
        ) -> list[SizeResult]:
    """Every fleet size in turn, in ``workdir`` (one folder per size); ``finished`` is
    called with the results so far after each size."""
    templates = capture(workdir)
    results = []
    for size in nodes:
        began = time.monotonic()
        progress(f"{size} nodes: starting")
        folder = workdir / f"nodes-{size}"
        folder.mkdir()
        result = run_size(folder, templates, size, duration=duration, warmup=warmup,
                          interval=interval, evaluation=evaluation, shards=shards,
                          refreshes=refreshes)
        result.run_seconds = time.monotonic() - began
        progress(f"{size} nodes: done in {result.run_seconds:.0f} s")
        results.append(result)
        finished(results)
    return results


# ---- report -----------------------------------------------------------------------------


def _growth(first: float, last: float) -> str:
    return f"× {last / first:.1f}" if first else "—"


def _count_text(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.0f}"


def _ms(seconds: float) -> str:
    if math.isnan(seconds):
        return "n/a"
    return f"{seconds * 1000:.0f}" if seconds >= 0.01 else f"{seconds * 1000:.1f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |",
             "| " + " | ".join(["---"] + ["---:"] * (len(header) - 1)) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _size_columns(results: Sequence[SizeResult]) -> list[str]:
    return [f"{r.nodes} nodes: {ENGINE_TITLES[e]}" for r in results for e in ENGINES]


def _growth_columns(results: Sequence[SizeResult]) -> list[str]:
    if len(results) < 2:
        return []
    span = f"{results[0].nodes} → {results[-1].nodes}"
    return [f"growth {span}: {ENGINE_TITLES[e]}" for e in ENGINES]


def _engine_row(label: str, results: Sequence[SizeResult],
                value: Callable[[SizeResult, str], float],
                text: Callable[[float], str]) -> list[str]:
    row = [label] + [text(value(r, e)) for r in results for e in ENGINES]
    if len(results) >= 2:
        row += [_growth(value(results[0], e), value(results[-1], e)) for e in ENGINES]
    return row


def prefix_series(names: Mapping[str, int], prefix: str) -> int:
    return sum(count for name, count in names.items() if name.startswith(prefix))


def scrape_series(names: Mapping[str, int]) -> int:
    return sum(count for name, count in names.items()
               if name == "up" or name.startswith("scrape_"))


def ingestion_table(results: Sequence[SizeResult]) -> str:
    rows = [
        _engine_row("series served per scrape round (simulator)", results,
                    lambda r, e: r.simulated_series, lambda v: f"{v:,.0f}"),
        _engine_row("active series (Prometheus: head; VM: series queried)", results,
                    lambda r, e: r.active_series[e], lambda v: f"{v:,.0f}"),
        _engine_row("VM: series in the index of the day (Prometheus: head)", results,
                    lambda r, e: r.active_series[
                        "victoriametrics-day-index" if e == "victoriametrics" else e],
                    lambda v: f"{v:,.0f}"),
        _engine_row("… of them trainmon_*", results,
                    lambda r, e: prefix_series(r.series_by_name[e], "trainmon_"),
                    lambda v: f"{v:,.0f}"),
        _engine_row("… DCGM_*", results,
                    lambda r, e: prefix_series(r.series_by_name[e], "DCGM_"),
                    lambda v: f"{v:,.0f}"),
        _engine_row("… up, scrape_*", results,
                    lambda r, e: scrape_series(r.series_by_name[e]), lambda v: f"{v:,.0f}"),
        _engine_row("… recording rules (name with `:`)", results,
                    lambda r, e: sum(c for n, c in r.series_by_name[e].items() if ":" in n),
                    lambda v: f"{v:,.0f}"),
        _engine_row("samples ingested per second", results,
                    lambda r, e: r.samples_per_second[e], lambda v: f"{v:,.0f}"),
        _engine_row("scrapes per target in the window (min)", results,
                    lambda r, e: r.scrapes[e].scrapes_min, lambda v: f"{v:.0f}"),
        _engine_row("scrapes per target in the window (expected)", results,
                    lambda r, e: r.scrapes[e].expected_scrapes, lambda v: f"{v:.1f}"),
        _engine_row("scrape duration, mean (ms)", results,
                    lambda r, e: r.scrapes[e].mean_scrape_seconds, _ms),
        _engine_row("scrape duration, max (ms)", results,
                    lambda r, e: r.scrapes[e].max_scrape_seconds, _ms),
        _engine_row("targets down at the end", results, lambda r, e: r.scrapes[e].down,
                    lambda v: "n/a" if math.isnan(v) else f"{v:.0f}"),
    ]
    return _table(["", *_size_columns(results), *_growth_columns(results)], rows)


def resources_table(results: Sequence[SizeResult]) -> str:
    processes = list(results[0].cpu_cores)
    header = [""] + [f"{r.nodes} nodes: {what}" for r in results for what in ("CPU cores",
                                                                               "peak RSS MiB")]
    if len(results) >= 2:
        header += [f"growth {results[0].nodes} → {results[-1].nodes}: {what}"
                   for what in ("CPU", "RSS")]
    rows = []
    groups = {name: [name] for name in processes}
    groups["VictoriaMetrics stack (vmagents + VM + vmalert)"] = [
        name for name in processes if name.startswith(("vmagent", "victoria", "vmalert"))]
    for label, members in groups.items():
        cpu = [sum(r.cpu_cores[m] for m in members) for r in results]
        rss = [sum(r.rss_mib[m] for m in members) for r in results]
        row = [label] + [cell for c, m in zip(cpu, rss, strict=True)
                         for cell in (f"{c:.2f}", f"{m:,.0f}")]
        if len(results) >= 2:
            row += [_growth(cpu[0], cpu[-1]), _growth(rss[0], rss[-1])]
        rows.append(row)
    return _table(header, rows)


def rules_table(results: Sequence[SizeResult]) -> str:
    groups = sorted({g for r in results for e in ENGINES for g in r.rule_groups[e]})
    header = [""] + [f"{r.nodes} nodes: {'vmalert' if e == 'victoriametrics' else 'Prometheus'}"
                     f" p50 / max ms" for r in results for e in ENGINES]
    rows = []
    for group in groups:
        row = [group]
        for r in results:
            for e in ENGINES:
                seen = r.rule_groups[e].get(group, [])
                row.append(f"{_ms(statistics.median(seen))} / {_ms(max(seen))} ({len(seen)})"
                           if seen else "not evaluated")
        rows.append(row)
    totals = ["all groups, sum of p50"]
    for r in results:
        for e in ENGINES:
            totals.append(_ms(sum(statistics.median(v) for v in r.rule_groups[e].values() if v)))
    rows.append(totals)
    for key, label in (("due", "group iterations due in the window"),
                       ("run", "… run"), ("missed", "… missed (the group was still running)")):
        rows.append([label] + [_count_text(r.rule_iterations[e][key]) if r.rule_iterations
                               else "–" for r in results for e in ENGINES])
    return _table(header, rows)


def dashboard_table(results: Sequence[SizeResult]) -> str:
    def p(fraction: float) -> Callable[[SizeResult, str], float]:
        return lambda r, e: benchlib.percentile(r.dashboard[e].latencies, fraction)

    rows = [
        _engine_row("queries per refresh (variable + panels)", results,
                    lambda r, e: r.dashboard[e].queries_per_refresh, lambda v: f"{v:.0f}"),
        _engine_row("query latency p50 (ms)", results, p(0.5), _ms),
        _engine_row("query latency p95 (ms)", results, p(0.95), _ms),
        _engine_row("one refresh, all queries in turn (median, ms)", results,
                    lambda r, e: statistics.median(r.dashboard[e].refresh_totals), _ms),
        _engine_row("slowest query (ms)", results,
                    lambda r, e: r.dashboard[e].slowest[0], _ms),
        _engine_row("queries without data", results,
                    lambda r, e: len(r.dashboard[e].empty), lambda v: f"{v:.0f}"),
    ]
    return _table(["", *_size_columns(results), *_growth_columns(results)], rows)


def _up_line(result: SizeResult) -> str:
    if result.targets_up_seconds is not None and result.targets_up_seconds < 0:
        return f"{result.nodes} nodes: every target up on both engines"
    if result.targets_up_seconds is None:
        return f"{result.nodes} nodes: NOT every target was up on both engines by the deadline"
    return (f"{result.nodes} nodes: every target up on both engines "
            f"{result.targets_up_seconds:.0f} s after start-up")


def per_node_line(result: SizeResult) -> str:
    trainmon = list(result.trainmon_series_per_node.values())
    dcgm = list(result.dcgm_series_per_node.values())
    return (f"Series per node: trainmon {min(trainmon)}–{max(trainmon)} "
            f"(mean {statistics.fmean(trainmon):.0f}; 1–4 jobs over 8 GPUs), "
            f"dcgm-exporter {min(dcgm, default=0)}–{max(dcgm, default=0)}.")


def report(results: Sequence[SizeResult]) -> str:
    first = results[0]
    lines = [
        f"Fleet scale: {', '.join(str(r.nodes) for r in results)} nodes, scraped every "
        f"{first.scrape_interval:g} s by {first.shards} vmagent shards → VictoriaMetrics "
        f"(rules on vmalert) and by one Prometheus (same rules), evaluation every "
        f"{first.evaluation_interval:g} s; measured over {first.window_seconds:.0f} s per size; "
        f"{os.cpu_count()} cores shared by every process, the simulator included. "
        f"Run time per size: {', '.join(f'{r.run_seconds:.0f} s' for r in results)}.",
        "",
        per_node_line(first),
        "; ".join(_up_line(r) for r in results) + ".",
        "",
        "### Series, ingestion and scrapes",
        "",
        ingestion_table(results),
        "",
        "### CPU and memory per process",
        "",
        resources_table(results),
        "",
        "### Rule group evaluation (evaluations seen in the window)",
        "",
        rules_table(results),
        "",
        "### Fleet dashboard (dashboards/dcgm/fleet.json), node = All",
        "",
        dashboard_table(results),
    ]
    problems = []
    for r in results:
        for e in ENGINES:
            for where, error in r.rule_errors[e].items():
                problems.append(f"- {r.nodes} nodes, {ENGINE_TITLES[e]}: rule {where}: {error}")
            for where in r.dashboard[e].errors:
                problems.append(f"- {r.nodes} nodes, {ENGINE_TITLES[e]}: query {where}")
            for where in r.dashboard[e].empty:
                problems.append(f"- {r.nodes} nodes, {ENGINE_TITLES[e]}: no data: {where}")
    if problems:
        lines += ["", "Errors and empty queries:", "", *problems]
    return "\n".join(lines) + "\n"


def load_results(path: Path) -> list[SizeResult]:
    """The results a ``--json`` run saved."""
    results = []
    for data in json.loads(path.read_text()):
        # files from before the field: their runs stopped unless every target came up
        data.setdefault("targets_up_seconds", -1.0)
        data["scrapes"] = {e: ScrapeHealth(**v) for e, v in data["scrapes"].items()}
        data["dashboard"] = {e: DashboardTiming(**{**v, "slowest": tuple(v["slowest"])})
                             for e, v in data["dashboard"].items()}
        results.append(SizeResult(**data))
    return results


def _seconds(text: str) -> float:
    return float(text.removesuffix("s"))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="100,1000", help="fleet sizes, comma-separated")
    parser.add_argument("--duration", type=_seconds, default=180.0,
                        help="measurement window per size, seconds")
    parser.add_argument("--warmup", type=_seconds, default=60.0,
                        help="seconds after every target is up before measuring")
    parser.add_argument("--scrape-interval", type=_seconds, default=15.0)
    parser.add_argument("--evaluation-interval", type=_seconds, default=15.0)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--refreshes", type=int, default=5,
                        help="fleet dashboard refreshes per engine")
    parser.add_argument("--output", type=Path, help="also write the tables here")
    parser.add_argument("--json", type=Path, help="write every measurement as JSON")
    parser.add_argument("--report-from", type=Path, nargs="+", metavar="JSON",
                        help="print the tables of earlier --json files, in order; run nothing")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.report_from:
        saved = [r for path in args.report_from for r in load_results(path)]
        if args.output:
            args.output.write_text(report(saved))
        print(report(saved))
        return
    sizes = [int(n) for n in args.nodes.split(",")]

    def write(results: list[SizeResult]) -> None:
        if args.output:
            args.output.write_text(report(results))
        if args.json:
            args.json.write_text(json.dumps([r.__dict__ for r in results], indent=1,
                                            default=lambda o: o.__dict__))

    with tempfile.TemporaryDirectory(prefix="trainmon-fleet-scale-") as tmp:
        results = run(sizes, duration=args.duration, warmup=args.warmup,
                      interval=args.scrape_interval, evaluation=args.evaluation_interval,
                      shards=args.shards, refreshes=args.refreshes, workdir=Path(tmp),
                      finished=write)
    print(report(results))


if __name__ == "__main__":
    main()

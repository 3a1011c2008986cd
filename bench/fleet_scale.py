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

``--engines`` picks the engines of a run (both by default): on a machine too small
for both at once, run one engine per run and combine the saved runs with
``--report-from`` (runs of one fleet size whose engines differ become one column
set, each run's simulator listed apart). Both engines scrape the same targets at
``--scrape-interval`` and evaluate every ``--evaluation-interval`` (a group's own
``interval:`` in the rule file wins); only the intervals, the target lists (the
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
  groups evaluate their rules one after another), p50 and max, as a share of the
  group's interval; iterations due per group (window / its interval), run and
  missed (the engines' counters per group);
* rules: every rule's own ``evaluationTime`` per evaluation seen, keyed
  ``group/rule`` (``#n`` appended where a group holds a name twice); the 25
  costliest side by side, with the vmalert/Prometheus ratio;

then the fleet dashboard (``dashboards/dcgm/fleet.json``) is refreshed
``--refreshes`` times on each engine: its variable resolved as Grafana does
(``testkit/grafana_templating.py``), every panel query sent as a range
query over the time the engines have run (step = scrape interval) or as an
instant query; p50/p95 of the queries and the median refresh total.

The machine's cores are shared by everything, the simulator included: its own
CPU is reported so that it can be subtracted.

    .venv/bin/python -m bench.fleet_scale                       # 100 and 1000 nodes, ~15 min
    .venv/bin/python -m bench.fleet_scale --nodes 100 --duration 60
    .venv/bin/python -m bench.fleet_scale --nodes 1000 --engines prometheus --json p.json
    .venv/bin/python -m bench.fleet_scale --nodes 1000 --engines victoriametrics --json v.json
    .venv/bin/python -m bench.fleet_scale --report-from p.json v.json   # one table set

Prints markdown tables for docs/benchmarks.md (``--output`` writes them too).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench import benchlib, fleet_sim, headline
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
COMPOSE_FILE = ROOT / "deploy" / "scale" / "docker-compose.yml"
#: vmalert flags of the shipped deployment that the run takes over: how recording rules'
#: results are written back (the rest, URLs and paths, are the run's own).
SHIPPED_VMALERT_FLAGS = ("-remoteWrite.concurrency=", "-remoteWrite.maxBatchSize=",
                         "-remoteWrite.maxQueueSize=", "-remoteWrite.flushInterval=")
#: Nothing listens there: vmalert's notifications go nowhere (no Alertmanager in the run).
DEAD_NOTIFIER = "http://127.0.0.1:9"
ENGINES = ("victoriametrics", "prometheus")
ENGINE_TITLES = {"victoriametrics": "vmagent → VictoriaMetrics", "prometheus": "Prometheus"}
#: What evaluates the rules on each engine.
RULE_EVALUATORS = {"victoriametrics": "vmalert", "prometheus": "Prometheus"}
#: User-Agent products of the two scrapers.
SCRAPER_CLIENTS = {"victoriametrics": "vm_promscrape", "prometheus": "Prometheus"}
SIMULATOR_READY_SECONDS = 300.0
#: Beyond this many intervals without every target up on every engine, the run fails.
UP_DEADLINE_INTERVALS = 8
UP_DEADLINE_SECONDS = 120.0
DASHBOARD_RANGE_CAP_SECONDS = 3600.0
#: Series per counting query on VictoriaMetrics (its limit per query is 300 000).
VM_COUNT_CHUNK_SERIES = 25_000
#: Rules in the per-rule table: the costliest by p50 on any engine.
TOP_RULES = 25
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
    #: Panel query (its place in the dashboard) → its latency in each refresh, seconds.
    per_query: dict[str, list[float]] = field(default_factory=dict)
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
    #: Process (simulator, vmagent-0, …, victoria-metrics, vmalert, prometheus) → cores;
    #: in runs combined by ``--report-from``, "simulator (prometheus run)" and so on.
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
    #: Seconds from start-up until every target was up on every engine (None: never).
    targets_up_seconds: float | None = None
    #: Wall time of the whole size: start-up, warm-up, window, queries, stop.
    run_seconds: float = 0.0
    #: engine → rule group iterations in the window: "due" (window / interval, summed
    #: over the groups), "run" and "missed" (Prometheus'
    #: prometheus_rule_group_iterations*_total, vmalert's vmalert_iteration*_total
    #: deltas): a group slower than its interval misses some.
    rule_iterations: dict[str, dict[str, float]] = field(default_factory=dict)
    #: The engines this run started (files from before the field: both).
    engines: list[str] = field(default_factory=lambda: list(ENGINES))
    #: Engine → ``group/rule`` (``#n`` where a group holds a name twice) → that rule's
    #: evaluation durations seen in the window, seconds.
    rule_durations: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    #: Engine → group → its evaluation interval, seconds.
    group_intervals: dict[str, dict[str, float]] = field(default_factory=dict)
    #: Engine → group → "due", "run", "missed" in the window (NaN: not read).
    group_iterations: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)


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
                 targets: Path, max_seconds: float, bad: int = 0) -> None:
        ready = workdir / "simulator.ready"
        self.log_path = workdir / "simulator.log"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.fleet_sim", "--templates", str(templates),
             "--nodes", str(nodes), "--interval", f"{interval:g}", "--targets", str(targets),
             "--ready-file", str(ready), "--max-seconds", f"{max_seconds:.0f}",
             "--bad-nodes", str(bad)],
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
    """The processes of one run: the simulator and the engines in ``engines``."""

    simulator: Simulator
    engines: tuple[str, ...]
    started: float
    victoria_metrics: VictoriaMetrics | None = None
    vmagents: list[VMAgent] = field(default_factory=list)
    vmalert: VMAlert | None = None
    prometheus: Prometheus | None = None

    def engine(self, name: str) -> QueryAPI:
        """The query API of engine ``name`` (ValueError if this run did not start it)."""
        server = self.victoria_metrics if name == "victoriametrics" else self.prometheus
        if server is None:
            raise ValueError(f"{name} is not running in this run")
        return server

    def rules_url(self, name: str) -> str:
        """The server that evaluates engine ``name``'s rules (its ``/metrics`` counts them)."""
        if name == "victoriametrics":
            assert self.vmalert is not None, "vmalert runs beside VictoriaMetrics"
            return self.vmalert.url
        return self.engine(name).url

    def rule_groups(self, name: str) -> list[dict[str, Any]]:
        """``/api/v1/rules``' groups of the evaluator of engine ``name``."""
        if name == "victoriametrics":
            assert self.vmalert is not None, "vmalert runs beside VictoriaMetrics"
            return self.vmalert.groups()
        return list(self.engine(name).api("rules", [])["groups"])

    def pids(self) -> dict[str, int]:
        pids = {"simulator": self.simulator.process.pid}
        for shard, agent in enumerate(self.vmagents):
            pids[f"vmagent-{shard}"] = _pid(agent)
        for name, server in (("victoria-metrics", self.victoria_metrics),
                             ("vmalert", self.vmalert), ("prometheus", self.prometheus)):
            if server is not None:
                pids[name] = _pid(server)
        return pids


def _pid(server: Any) -> int:
    assert server.process is not None
    return int(server.process.pid)


def shipped_vmalert_flags(compose: Path = COMPOSE_FILE) -> list[str]:
    """The ``SHIPPED_VMALERT_FLAGS`` of the deployment's vmalert command, so that the run
    evaluates the rules as deployed whatever the installed vmalert's defaults."""
    command = yaml.safe_load(compose.read_text())["services"]["vmalert"]["command"]
    return [str(flag) for flag in command if str(flag).startswith(SHIPPED_VMALERT_FLAGS)]


@contextlib.contextmanager
def fleet_stack(workdir: Path, templates: Path, nodes: int, *, interval: float,
                evaluation: float, shards: int, max_seconds: float,
                engines: Sequence[str] = ENGINES, rule_files: Sequence[Path] = RULE_FILES,
                bad: int = 0) -> Iterator[Stack]:
    """The simulator (``bad`` planted bad nodes) and ``engines`` (the VictoriaMetrics
    stack, Prometheus) evaluating ``rule_files``, stopped on exit."""
    timeout = min(10.0, interval)
    scrape = workdir / "scrape"
    targets = scrape / "targets"
    rules = workdir / "rules"
    rules.mkdir(parents=True)
    for path in rule_files:
        shutil.copy(path, rules / path.name)
    vmagent_path = scrape / VMAGENT_CONFIG.name
    with contextlib.ExitStack() as stack:
        simulator = Simulator(workdir, templates, nodes, interval, targets, max_seconds, bad)
        stack.callback(simulator.stop)
        vmagent_path.write_text(vmagent_config(interval, timeout))

        def started(server: Any, folder: str) -> Any:
            (workdir / folder).mkdir()
            stack.callback(server.stop)
            return server

        run = Stack(simulator, tuple(e for e in ENGINES if e in engines), time.time())
        if "victoriametrics" in engines:
            vm = started(VictoriaMetrics(workdir / "victoria-metrics"),
                         "victoria-metrics").start()
            for shard in range(shards):
                agent = started(VMAgent(workdir / f"vmagent-{shard}"), f"vmagent-{shard}")
                run.vmagents.append(agent.start(vmagent_path, remote_write=vm.write_url, env={
                    "TRAINMON_SHARD_COUNT": str(shards), "TRAINMON_SHARD": str(shard)}))
            run.vmalert = started(VMAlert(workdir / "vmalert"), "vmalert").start(
                sorted(rules.glob("*.yml")), engine=vm.url, notifier=DEAD_NOTIFIER,
                evaluation_interval=f"{evaluation:g}s", flags=shipped_vmalert_flags())
            run.victoria_metrics = vm
        if "prometheus" in engines:
            run.prometheus = started(Prometheus(workdir / "prometheus"), "prometheus").start(
                prometheus_config(interval, timeout, evaluation, targets, rules))
        run.started = time.time()
        yield run


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
    """Seconds until every engine of the run holds ``up == 1`` for every target; None
    (and a warning naming the scrape errors) if that did not happen by a deadline:
    the run then goes on, and its report shows the scrapes that failed."""
    began = time.monotonic()
    deadline = began + UP_DEADLINE_SECONDS + UP_DEADLINE_INTERVALS * interval
    seen: dict[str, float] = {}
    while time.monotonic() < deadline:
        try:
            seen = {name: float(len(stack.engine(name).query("up == 1")))
                    for name in stack.engines}
        except TRANSIENT as error:
            logger.info("engines not answering yet: %s", error)
        if seen and all(value == targets for value in seen.values()):
            return time.monotonic() - began
        time.sleep(min(interval, 2.0))
    scrapers: list[QueryAPI] = [*stack.vmagents]
    if stack.prometheus is not None:
        scrapers.append(stack.prometheus)

    def active_targets(scraper: QueryAPI) -> list[dict[str, Any]]:
        return list(_or_unread(lambda: scraper.api("targets", [("state", "active")]),
                               {"activeTargets": []})["activeTargets"])

    errors = Counter(target.get("lastError", "")
                     for scraper in scrapers for target in active_targets(scraper))
    logger.warning("not every one of %d targets came up (up == 1: %s); scrape errors: %s",
                   targets, seen, dict(errors.most_common(3)))
    return None


def _evaluated_at(text: str) -> str:
    return text[:26]  # RFC 3339 to the microsecond: one evaluation, however it is printed


@dataclass
class RuleReading:
    """One reading of an engine's ``/api/v1/rules``."""

    #: Group → (its last evaluation, that evaluation's duration in seconds).
    groups: dict[str, tuple[str, float]] = field(default_factory=dict)
    #: ``group/rule`` → (its last evaluation, that evaluation's duration in seconds).
    rules: dict[str, tuple[str, float]] = field(default_factory=dict)
    #: Group → its interval, seconds (where the API gives it).
    intervals: dict[str, float] = field(default_factory=dict)


def rule_keys(group: str, rules: Sequence[Mapping[str, Any]]) -> list[str]:
    """``group/name`` of each rule, in order; ``#1``, ``#2``, … appended to a name the
    group holds more than once (two alerts of one name, say)."""
    names = Counter(str(rule["name"]) for rule in rules)
    seen: Counter[str] = Counter()
    keys = []
    for rule in rules:
        name = str(rule["name"])
        seen[name] += 1
        keys.append(f"{group}/{name}" + (f" #{seen[name]}" if names[name] > 1 else ""))
    return keys


#: Seconds per unit of a Prometheus duration.
DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0,
                  "w": 7 * 86400.0, "y": 365 * 86400.0}


def duration_seconds(value: Any) -> float:
    """A Prometheus duration (``"1m30s"``, ``"500ms"``) or a number of seconds."""
    if isinstance(value, int | float):
        return float(value)
    text = str(value).strip()
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration: {value!r}")
    return sum(float(number) * DURATION_UNITS[unit] for number, unit in parts)


#: How far apart vmalert's timestamps of one moment may be (microsecond rounding).
CLOCK_SLACK_SECONDS = 0.001


def _instant(text: str) -> float:
    """Seconds since the epoch of an RFC 3339 timestamp (nanoseconds cut to microseconds)."""
    return datetime.fromisoformat(_evaluated_at(text).rstrip("Z")).replace(
        tzinfo=UTC).timestamp()


def vmalert_rule_seconds(group: Mapping[str, Any]) -> list[float] | None:
    """Each rule's own evaluation seconds in vmalert's ``/api/v1/rules`` ``group``, in
    order; None where this reading cannot tell (the group is between iterations).

    vmalert before 1.83 (Debian 12 ships 1.79) reports a *recording* rule's
    ``evaluationTime`` as the time since its group's evaluation timestamp, its
    ``lastEvaluation`` — a timestamp that lags the iteration's real start (the group's
    ``lastEvaluation``) by up to one interval, for the whole life of the group — so it
    holds that lag and every rule before it. An alerting rule's (and, from 1.83, every
    rule's) is its own, from its own start. A recording rule stamped before its
    group's start is read the old way: its own time is what it added to the rule
    before it. Only one iteration's rules, in a group evaluated one rule at a time,
    can be read so.
    """
    rules = group.get("rules") or []
    if not rules or int(group.get("concurrency") or 1) != 1:
        return None
    start = _instant(group["lastEvaluation"])
    interval = duration_seconds(group.get("interval") or 0)
    recorded = {rule["lastEvaluation"] for rule in rules if rule.get("type") == "recording"}
    stamps = {at for at in recorded if _instant(at) < start}
    if stamps and len(recorded) > 1:  # two iterations' rules: the group is half-way
        return None
    lagging = _instant(next(iter(stamps))) if stamps else start
    if interval and start - lagging >= interval:
        return None
    seconds, end = [], start
    for rule in rules:
        took = float(rule["evaluationTime"])
        at = _instant(rule["lastEvaluation"])
        if rule["lastEvaluation"] in stamps:  # cumulative since the lagging timestamp
            took, at = max(0.0, at + took - end), end
        elif not end - CLOCK_SLACK_SECONDS <= at < start + (interval or math.inf):
            return None  # another iteration's rule
        seconds.append(took)
        end = at + took
    return seconds


def read_rules(groups: Sequence[Mapping[str, Any]], *, evaluator: str) -> RuleReading:
    """A ``RuleReading`` of ``/api/v1/rules``' ``groups`` from ``evaluator`` (one of
    ``RULE_EVALUATORS``' values). Prometheus gives each group's and rule's
    ``evaluationTime``; vmalert only its rules', read by ``vmalert_rule_seconds``, whose
    sum is the group's (it evaluates them one after another). A rule without its own
    ``lastEvaluation`` is keyed by its group's; a vmalert group read half-way through
    an iteration is left out of this reading."""
    reading = RuleReading()
    for group in groups:
        name = str(group["name"])
        at = _evaluated_at(group["lastEvaluation"])
        rules = group.get("rules") or []
        if group.get("interval") not in (None, "", 0):
            reading.intervals[name] = duration_seconds(group["interval"])
        if evaluator == "vmalert":
            own = None if _never_evaluated(at) else vmalert_rule_seconds(group)
            if own is None:
                continue
            reading.groups[name] = (at, sum(own))
        else:
            own = [float(rule["evaluationTime"]) for rule in rules]
            reading.groups[name] = (at, float(group["evaluationTime"]))
        for key, rule, seconds in zip(rule_keys(name, rules), rules, own, strict=True):
            reading.rules[key] = (_evaluated_at(rule.get("lastEvaluation", at)), seconds)
    return reading


def rule_evaluations(stack: Stack) -> dict[str, RuleReading]:
    """Engine → its rules' last evaluations; an engine too busy to answer in time is
    left out of this reading."""
    readings: dict[str, RuleReading] = {}
    for engine in stack.engines:
        try:
            readings[engine] = read_rules(stack.rule_groups(engine),
                                          evaluator=RULE_EVALUATORS[engine])
        except TRANSIENT as error:
            logger.warning("%s: rule groups not read: %s", RULE_EVALUATORS[engine], error)
    return readings


def rule_errors(stack: Stack) -> dict[str, dict[str, str]]:
    """Engine → ``group/rule`` → its last error, for every rule that has one."""
    return {
        engine: {key: rule["lastError"]
                 for group in stack.rule_groups(engine)
                 for key, rule in zip(rule_keys(group["name"], group["rules"]), group["rules"],
                                      strict=True)
                 if rule.get("lastError")}
        for engine in stack.engines
    }


def rule_file_intervals(paths: Sequence[Path], default: float) -> dict[str, float]:
    """Group → its ``interval:`` in the rule files at ``paths`` (``default`` without one)."""
    intervals = {}
    for path in paths:
        for group in (yaml.safe_load(path.read_text()) or {}).get("groups", []):
            interval = group.get("interval")
            intervals[group["name"]] = default if interval is None else duration_seconds(interval)
    return intervals


def iterations_due(intervals: Mapping[str, float], window: float) -> dict[str, float]:
    """Group → evaluations due in ``window`` seconds at its own interval."""
    return {group: window / interval for group, interval in intervals.items()}


def group_counters(values: Mapping[str, float], name: str, label: str) -> dict[str, float]:
    """Group → the sum of ``name``'s samples in ``own_metrics`` ``values`` whose ``label``
    names it (Prometheus' ``rule_group`` is ``<file>;<group>``: the group is kept)."""
    sums: dict[str, float] = {}
    pattern = re.compile(rf'(?:^|[{{,]){label}="([^"]*)"')
    for key, value in values.items():
        if not key.startswith(name + "{"):
            continue
        match = pattern.search(key[len(name):])
        if match:
            group = match.group(1).rsplit(";", 1)[-1]
            sums[group] = sums.get(group, 0.0) + value
    return sums


#: Engine → (counter of runs, counter of misses, label naming the group).
ITERATION_COUNTERS = {
    "victoriametrics": ("vmalert_iteration_total", "vmalert_iteration_missed_total", "group"),
    "prometheus": ("prometheus_rule_group_iterations_total",
                   "prometheus_rule_group_iterations_missed_total", "rule_group"),
}


#: Engine → its counter of samples written to storage.
SAMPLES_COUNTERS = {"victoriametrics": "vm_rows_added_to_storage_total",
                    "prometheus": "prometheus_tsdb_head_samples_appended_total"}


def iteration_totals(per_group: Mapping[str, Mapping[str, float]],
                     before: Mapping[str, float] | None, after: Mapping[str, float] | None,
                     engine: str) -> dict[str, float]:
    """"due" (summed over the groups), "run" and "missed" (the evaluator's counters, all
    series: NaN when not read) in the window."""
    due = sum(counts["due"] for counts in per_group.values())
    if before is None or after is None:  # too busy to answer: the report says n/a
        return {"due": due, "run": math.nan, "missed": math.nan}
    run, missed, _ = ITERATION_COUNTERS[engine]
    return {"due": due, "run": metric_sum(after, run) - metric_sum(before, run),
            "missed": metric_sum(after, missed) - metric_sum(before, missed)}


def group_iterations(due: Mapping[str, float], before: Mapping[str, float] | None,
                     after: Mapping[str, float] | None, engine: str,
                     ) -> dict[str, dict[str, float]]:
    """Group → "due", "run", "missed" in the window, from the evaluator's ``/metrics``
    before and after it (None: not read, the counts are NaN)."""
    run, missed, label = ITERATION_COUNTERS[engine]
    counts: dict[str, dict[str, float]] = {g: {"due": d, "run": math.nan, "missed": math.nan}
                                           for g, d in due.items()}
    if before is None or after is None:
        return counts
    for key, name in (("run", run), ("missed", missed)):
        then = group_counters(before, name, label)
        for group, now in group_counters(after, name, label).items():
            if group in counts:
                counts[group][key] = now - then.get(group, 0.0)
    return counts


def _never_evaluated(evaluation: str) -> bool:
    return evaluation.startswith(("0001-01-01", "1970-01-01"))


def series_by_name(stack: Stack, budget: ReadBudget, served: Mapping[str, int],
                   ) -> dict[str, dict[str, int]]:
    """Engine → metric name → series with a sample in the last 5 minutes.

    The names come from VictoriaMetrics' index of the day (whose counts may include
    duplicate entries made under concurrent inserts, so they only size the chunks),
    the series the simulator ``served`` per name and each engine's label values;
    each engine counts them with ``count by (__name__)`` queries of at most
    ``VM_COUNT_CHUNK_SERIES`` series, under VictoriaMetrics' limit per query
    (``-search.maxUniqueTimeseries``, 300 000) and far from either engine's query
    timeout."""
    sizes = dict(served)
    if stack.victoria_metrics is not None:
        vm = stack.victoria_metrics
        # retried while the engine is busy; unread, the simulator's counts size the chunks
        tsdb = _or_unread(lambda: vm.api("status/tsdb", [("topN", "100000")]),
                          {"seriesCountByMetricName": []})
        sizes.update({row["name"]: int(row["value"]) for row in tsdb["seriesCountByMetricName"]})
    now = time.time()
    for engine in stack.engines:
        for name in stack.engine(engine).label_values("__name__", None, now - 300, now):
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
    for engine in stack.engines:
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
                timing.per_query.setdefault(query.where, []).append(elapsed)
                if refresh == 0 and result == []:
                    timing.empty[query.where] = expr
        timing.refresh_totals.append(total)
        timing.queries_per_refresh = count
    return timing


def run_size(workdir: Path, templates: Path, nodes: int, *, duration: float, warmup: float,
             interval: float, evaluation: float, shards: int, refreshes: int,
             engines: Sequence[str] = ENGINES) -> SizeResult:
    """One fleet size on ``engines``: start everything, measure, stop everything."""
    lifetime = SIMULATOR_READY_SECONDS + UP_DEADLINE_SECONDS + warmup + duration + 1800
    fleet_sizes = fleet_sim.Fleet(fleet_sim.load_templates(templates), nodes)
    with fleet_stack(workdir, templates, nodes, interval=interval, evaluation=evaluation,
                     shards=shards, max_seconds=lifetime, engines=engines) as stack:
        running = stack.engines
        targets = nodes * len(fleet_sizes.sources)
        up_after = wait_for_targets(stack, targets, interval)
        time.sleep(warmup)
        pids = stack.pids()
        storage_before = {e: own_metrics(stack.engine(e).url) for e in running}
        rules_before = {e: _metrics_or_none(stack.rules_url(e)) for e in running}
        # the window starts here: after the reads above, which take time on a busy engine
        cpu_before = {name: benchlib.cpu_seconds(pid) for name, pid in pids.items()}
        peak = {name: benchlib.memory_kib(pid) for name, pid in pids.items()}
        scrapes_before = stack.simulator.scrapes()
        began = time.monotonic()
        evaluations: dict[str, dict[str, dict[str, float]]] = {e: {} for e in running}
        rule_seen: dict[str, dict[str, dict[str, float]]] = {e: {} for e in running}
        api_intervals: dict[str, dict[str, float]] = {e: {} for e in running}
        while time.monotonic() - began < duration:
            for engine, reading in rule_evaluations(stack).items():
                for group, (at, seconds) in reading.groups.items():
                    if not _never_evaluated(at):
                        evaluations[engine].setdefault(group, {})[at] = seconds
                for rule, (at, seconds) in reading.rules.items():
                    if not _never_evaluated(at):
                        rule_seen[engine].setdefault(rule, {})[at] = seconds
                api_intervals[engine].update(reading.intervals)
            for name, pid in pids.items():
                peak[name] = max(peak[name], benchlib.memory_kib(pid))
            time.sleep(max(0.0, min(interval, duration - (time.monotonic() - began))))
        window = time.monotonic() - began
        cpu = {name: (benchlib.cpu_seconds(pid) - cpu_before[name]) / window
               for name, pid in pids.items()}
        scrapes_after = stack.simulator.scrapes()  # first: the reads below take time
        storage_after = {e: own_metrics(stack.engine(e).url) for e in running}
        rules_after = {e: _metrics_or_none(stack.rules_url(e)) for e in running}
        # the copies the engines loaded: the shipped files may change during a run
        shipped = rule_file_intervals(sorted((workdir / "rules").glob("*.yml")), evaluation)
        intervals = {e: {**shipped, **api_intervals[e]} for e in running}
        per_group = {e: group_iterations(iterations_due(intervals[e], window), rules_before[e],
                                         rules_after[e], e) for e in running}
        rule_iterations = {e: iteration_totals(per_group[e], rules_before[e], rules_after[e], e)
                           for e in running}
        budget = ReadBudget(READ_BUDGET_SECONDS)
        samples = {e: (metric_sum(storage_after[e], SAMPLES_COUNTERS[e])
                       - metric_sum(storage_before[e], SAMPLES_COUNTERS[e])) / window
                   for e in running}
        scrapes = {engine: scrape_health(stack, engine, scrapes_before, scrapes_after,
                                         window, interval) for engine in running}
        names = series_by_name(stack, budget, fleet_sizes.series_by_name())
        active: dict[str, int] = {}
        if stack.victoria_metrics is not None:
            active["victoriametrics"] = sum(names["victoriametrics"].values())
            active["victoriametrics-day-index"] = stack.victoria_metrics.total_series()
            active["victoriametrics-hour"] = int(metric_sum(
                storage_after["victoriametrics"], "vm_cache_entries",
                'type="storage/hour_metric_ids"'))
        if stack.prometheus is not None:
            active["prometheus"] = int(metric_sum(storage_after["prometheus"],
                                                  "prometheus_tsdb_head_series"))
        errors = _or_unread(lambda: rule_errors(stack), {e: {"(rules)": UNREAD} for e in running})
        loaded = {e: _or_unread(lambda e=e: sorted(g["name"] for g in stack.rule_groups(e)),
                                [UNREAD]) for e in running}
        shards_seen = shard_targets(stack)
        end = time.time()
        span = min(end - stack.started, DASHBOARD_RANGE_CAP_SECONDS)
        dashboard_window = Window(start=end - span, end=end, step=interval,
                                  scrape_interval=interval)
        dashboard = fleet_dashboard()
        timings = {engine: time_dashboard(stack.engine(engine), dashboard, dashboard_window,
                                          refreshes, budget) for engine in running}
    return SizeResult(
        nodes=nodes, shards=shards if "victoriametrics" in running else 0,
        scrape_interval=interval, evaluation_interval=evaluation,
        window_seconds=window, simulated_series=fleet_sizes.total_series,
        trainmon_series_per_node=fleet_sizes.series_per_node("trainmon"),
        dcgm_series_per_node=fleet_sizes.series_per_node("dcgm-exporter"),
        active_series=active, series_by_name=names, samples_per_second=samples,
        cpu_cores=cpu, rss_mib={name: kib / 1024 for name, kib in peak.items()},
        rule_groups={engine: {group: list(seen.values()) for group, seen in groups.items()}
                     for engine, groups in evaluations.items()},
        rule_errors=errors, groups_loaded=loaded, scrapes=scrapes, dashboard=timings,
        shard_targets=shards_seen, targets_up_seconds=up_after,
        rule_iterations=rule_iterations, engines=list(running),
        rule_durations={engine: {rule: list(seen.values()) for rule, seen in rules.items()}
                        for engine, rules in rule_seen.items()},
        group_intervals=intervals, group_iterations=per_group,
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
        engines: Sequence[str] = ENGINES, templates: Path | None = None,
        ) -> list[SizeResult]:
    """Every fleet size in turn on ``engines``, in ``workdir`` (one folder per size);
    ``finished`` is called with the results so far after each size. ``templates``: a
    file ``capture`` wrote (captured here without one)."""
    if templates is None:
        templates = capture(workdir)
    results = []
    for size in nodes:
        began = time.monotonic()
        progress(f"{size} nodes: starting")
        folder = workdir / f"nodes-{size}"
        folder.mkdir()
        result = run_size(folder, templates, size, duration=duration, warmup=warmup,
                          interval=interval, evaluation=evaluation, shards=shards,
                          refreshes=refreshes, engines=engines)
        result.run_seconds = time.monotonic() - began
        progress(f"{size} nodes: done in {result.run_seconds:.0f} s")
        results.append(result)
        finished(results)
    return results


# ---- report -----------------------------------------------------------------------------


def _growth(first: float, last: float) -> str:
    return f"× {last / first:.1f}" if first else "—"


def _ratio(numerator: float, denominator: float) -> str:
    """``numerator / denominator`` to two significant digits at least ("× 0.036",
    "× 6.5", "× 142")."""
    if math.isnan(numerator) or math.isnan(denominator) or not denominator:
        return "n/a"
    ratio = numerator / denominator
    return f"× {ratio:.2g}" if ratio < 1 else f"× {ratio:.1f}" if ratio < 10 else f"× {ratio:.0f}"


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


def _engines_of(results: Sequence[SizeResult]) -> list[str]:
    """The engines of any of ``results``, in ``ENGINES`` order."""
    return [e for e in ENGINES if any(e in r.engines for r in results)]


def _size_columns(results: Sequence[SizeResult]) -> list[str]:
    return [f"{r.nodes} nodes: {ENGINE_TITLES[e]}" for r in results for e in r.engines]


def _growth_engines(results: Sequence[SizeResult]) -> list[str]:
    """The engines of both the first and the last size, when there are two sizes or more."""
    if len(results) < 2:
        return []
    return [e for e in results[0].engines if e in results[-1].engines]


def _growth_columns(results: Sequence[SizeResult]) -> list[str]:
    span = f"{results[0].nodes} → {results[-1].nodes}"
    return [f"growth {span}: {ENGINE_TITLES[e]}" for e in _growth_engines(results)]


def _reading(value: Callable[[SizeResult, str], float], result: SizeResult,
             engine: str) -> float:
    """``value(result, engine)``, NaN where the result has no such reading (a file from
    before it was measured)."""
    try:
        return float(value(result, engine))
    except (KeyError, ValueError, statistics.StatisticsError):
        return math.nan


def _engine_row(label: str, results: Sequence[SizeResult],
                value: Callable[[SizeResult, str], float],
                text: Callable[[float], str]) -> list[str]:
    def cell(reading: float) -> str:
        return "n/a" if math.isnan(reading) else text(reading)

    row = [label] + [cell(_reading(value, r, e)) for r in results for e in r.engines]
    row += [_growth(_reading(value, results[0], e), _reading(value, results[-1], e))
            for e in _growth_engines(results)]
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
                    lambda v: f"{v:.0f}"),
    ]
    return _table(["", *_size_columns(results), *_growth_columns(results)], rows)


def resources_table(results: Sequence[SizeResult]) -> str:
    processes = list(dict.fromkeys(name for r in results for name in r.cpu_cores))
    header = [""] + [f"{r.nodes} nodes: {what}" for r in results for what in ("CPU cores",
                                                                               "peak RSS MiB")]
    if len(results) >= 2:
        header += [f"growth {results[0].nodes} → {results[-1].nodes}: {what}"
                   for what in ("CPU", "RSS")]
    rows = []
    groups = {name: [name] for name in processes}
    stack = [name for name in processes if name.startswith(("vmagent", "victoria", "vmalert"))]
    if stack:
        groups["VictoriaMetrics stack (vmagents + VM + vmalert)"] = stack

    def total(values: Mapping[str, float], members: Sequence[str]) -> float:
        present = [values[m] for m in members if m in values]
        return sum(present) if present else math.nan

    for label, members in groups.items():
        cpu = [total(r.cpu_cores, members) for r in results]
        rss = [total(r.rss_mib, members) for r in results]
        row = [label] + [cell for c, m in zip(cpu, rss, strict=True)
                         for cell in (("–", "–") if math.isnan(c) else (f"{c:.2f}", f"{m:,.0f}"))]
        if len(results) >= 2:
            row += [_growth(cpu[0], cpu[-1]), _growth(rss[0], rss[-1])]
        rows.append(row)
    return _table(header, rows)


def _p50_max(seen: Sequence[float], ran: float = 0.0) -> str:
    """p50 / max of the durations ``seen``; without one, whether the evaluator's own
    counter says it ran (``ran`` iterations: every reading found it half-way, as on a
    machine so busy that iterations run back to back) or it never did."""
    if seen:
        return f"{_ms(statistics.median(seen))} / {_ms(max(seen))} ({len(seen)})"
    return f"ran {ran:.0f}, not read" if ran > 0 else "not evaluated"


def group_interval(result: SizeResult, engine: str, group: str) -> float:
    """``group``'s interval on ``engine``, seconds: as measured, else the run's
    evaluation interval (files from before intervals were recorded)."""
    return result.group_intervals.get(engine, {}).get(group, result.evaluation_interval)


def rules_table(results: Sequence[SizeResult]) -> str:
    groups = sorted({g for r in results for e in r.engines
                     for g in [*r.rule_groups[e], *r.groups_loaded.get(e, [])] if g != UNREAD})
    header = ["", "interval (s)"]
    for r in results:
        for e in r.engines:
            who = f"{r.nodes} nodes: {RULE_EVALUATORS[e]}"
            header += [f"{who} p50 / max ms (evaluations)", f"{who} p50 % of interval",
                       f"{who} missed / due"]
    rows = []
    for group in groups:
        intervals = {group_interval(r, e, group) for r in results for e in r.engines}
        row = [group, " / ".join(f"{i:g}" for i in sorted(intervals))]
        for r in results:
            for e in r.engines:
                seen = r.rule_groups[e].get(group, [])
                share = (f"{100 * statistics.median(seen) / group_interval(r, e, group):.1f} %"
                         if seen else "–")
                counts = r.group_iterations.get(e, {}).get(group)
                missed = (f"{_count_text(counts['missed'])} / {counts['due']:.1f}" if counts
                          else "–")
                ran = counts["run"] if counts and not math.isnan(counts["run"]) else 0.0
                row += [_p50_max(seen, ran), share, missed]
        rows.append(row)

    def totals(label: str, cell: Callable[[SizeResult, str], str]) -> list[str]:
        return [label, ""] + [c for r in results for e in r.engines
                              for c in (cell(r, e), "", "")]

    rows.append(totals("all groups, sum of p50", lambda r, e: _ms(
        sum(statistics.median(v) for v in r.rule_groups[e].values() if v))))
    for key, label in (("due", "group iterations due in the window"),
                       ("run", "… run"), ("missed", "… missed (the group was still running)")):
        rows.append(totals(label, lambda r, e, key=key: _count_text(
            r.rule_iterations[e][key]) if e in r.rule_iterations else "–"))
    return _table(header, rows)


def costliest_rules(results: Sequence[SizeResult], count: int = TOP_RULES) -> list[str]:
    """The ``count`` rules of the highest p50 on any engine of any size, costliest first."""
    worst: dict[str, float] = {}
    for r in results:
        for e in r.engines:
            for rule, seen in r.rule_durations.get(e, {}).items():
                if seen:
                    worst[rule] = max(worst.get(rule, 0.0), statistics.median(seen))
    return sorted(worst, key=lambda rule: (-worst[rule], rule))[:count]


def rule_cost_table(results: Sequence[SizeResult]) -> str:
    header = ["rule"]
    for r in results:
        header += [f"{r.nodes} nodes: {RULE_EVALUATORS[e]} p50 / max ms" for e in r.engines]
        if set(ENGINES) <= set(r.engines):
            header.append(f"{r.nodes} nodes: vmalert / Prometheus (p50)")
    rows = []
    for rule in costliest_rules(results):
        row = [rule]
        for r in results:
            p50 = {}
            for e in r.engines:
                seen = r.rule_durations.get(e, {}).get(rule, [])
                counts = r.group_iterations.get(e, {}).get(rule.split("/", 1)[0])
                ran = counts["run"] if counts and not math.isnan(counts["run"]) else 0.0
                row.append(_p50_max(seen, ran))
                p50[e] = statistics.median(seen) if seen else math.nan
            if set(ENGINES) <= set(r.engines):
                row.append(_ratio(p50["victoriametrics"], p50["prometheus"]))
        rows.append(row)
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


#: Panel queries listed per size in the report, slowest (median over refreshes) first.
TOP_PANEL_QUERIES = 10


def panel_table(results: Sequence[SizeResult]) -> str:
    """The slowest panel queries of the largest size, by their median over refreshes."""
    result = results[-1]

    def median_ms(engine: str, where: str) -> float:
        seen = result.dashboard[engine].per_query.get(where)
        return statistics.median(seen) * 1000 if seen else math.nan

    places = {where for e in result.engines for where in result.dashboard[e].per_query}
    ranked = sorted(places, key=lambda w: -max(
        (v for v in (median_ms(e, w) for e in result.engines) if not math.isnan(v)),
        default=0.0))[:TOP_PANEL_QUERIES]
    rows = [[where.replace("|", "\\|"),
             *(f"{median_ms(e, where):.0f}" for e in result.engines)] for where in ranked]
    header = [f"{result.nodes} nodes: panel query",
              *(f"{ENGINE_TITLES[e]} ms (median)" for e in result.engines)]
    return _table(header, rows)


def record_headlines(results: Sequence[SizeResult]) -> None:
    """Issue 25's fleet figures, per size and engine, for ``make bench``'s summary."""
    for r in results:
        for e in r.engines:
            where = f"{r.nodes} nodes, {RULE_EVALUATORS[e]}"
            shares = [statistics.median(seen) / group_interval(r, e, group)
                      for group, seen in r.rule_groups[e].items() if seen]
            source = f"bench.fleet_scale --nodes {r.nodes} --engines {e}"
            if shares:
                headline.record(headline.Figure(
                    f"slowest rule group, p50 % of its interval ({where})", 100 * max(shares),
                    spec=".1f", at_most=20.0, source=source))
            missed = r.rule_iterations.get(e, {}).get("missed", math.nan)
            headline.record(headline.Figure(
                f"rule group iterations missed ({where})", missed, spec=".0f", at_most=0.0,
                source=source))
            timing = r.dashboard[e]
            if timing.refresh_totals:
                dashboard = f"{r.nodes} nodes, {ENGINE_TITLES[e]}"
                headline.record(headline.Figure(
                    f"fleet dashboard refresh, node = All, s ({dashboard})",
                    statistics.median(timing.refresh_totals), at_most=5.0, source=source))
                headline.record(headline.Figure(
                    f"slowest fleet panel query, s ({dashboard})", timing.slowest[0],
                    at_most=2.0, source=source))


def _up_line(result: SizeResult) -> str:
    where = "both engines" if len(result.engines) > 1 else ENGINE_TITLES[result.engines[0]]
    if result.targets_up_seconds is not None and result.targets_up_seconds < 0:
        return f"{result.nodes} nodes: every target up on {where}"
    if result.targets_up_seconds is None:
        return f"{result.nodes} nodes: NOT every target was up on {where} by the deadline"
    return (f"{result.nodes} nodes: every target up on {where} "
            f"{result.targets_up_seconds:.0f} s after start-up")


def per_node_line(result: SizeResult) -> str:
    trainmon = list(result.trainmon_series_per_node.values())
    dcgm = list(result.dcgm_series_per_node.values())
    return (f"Series per node: trainmon {min(trainmon)}–{max(trainmon)} "
            f"(mean {statistics.fmean(trainmon):.0f}; 1–4 jobs over 8 GPUs), "
            f"dcgm-exporter {min(dcgm, default=0)}–{max(dcgm, default=0)}.")


def _scrapers_text(results: Sequence[SizeResult]) -> str:
    engines = _engines_of(results)
    scrapers = []
    if "victoriametrics" in engines:
        shards = max(r.shards for r in results if "victoriametrics" in r.engines)
        scrapers.append(f"by {shards} vmagent shards → VictoriaMetrics (rules on vmalert)")
    if "prometheus" in engines:
        scrapers.append("by one Prometheus" + (" (same rules)" if len(scrapers) else ""))
    return " and ".join(scrapers)


def _runs_text(result: SizeResult) -> str:
    simulators = [name for name in result.cpu_cores if name.startswith("simulator (")]
    if not simulators:
        return ""
    return f"{result.nodes} nodes combined from {len(simulators)} runs, one per engine. "


def report(results: Sequence[SizeResult]) -> str:
    first = results[0]
    lines = [
        f"Fleet scale: {', '.join(str(r.nodes) for r in results)} nodes, scraped every "
        f"{first.scrape_interval:g} s {_scrapers_text(results)}, evaluation every "
        f"{first.evaluation_interval:g} s; measured over {first.window_seconds:.0f} s per size; "
        f"{os.cpu_count()} cores shared by every process, the simulator included. "
        + "".join(_runs_text(r) for r in results) +
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
        f"### Rule evaluation (p50 / max ms per rule; the {TOP_RULES} costliest by p50)",
        "",
        rule_cost_table(results),
        "",
        "### Fleet dashboard (dashboards/dcgm/fleet.json), node = All",
        "",
        dashboard_table(results),
    ]
    if any(results[-1].dashboard[e].per_query for e in results[-1].engines):
        lines += ["", f"Slowest panel queries ({TOP_PANEL_QUERIES}):", "", panel_table(results)]
    problems = []
    for r in results:
        for e in r.engines:
            for where, error in r.rule_errors[e].items():
                problems.append(f"- {r.nodes} nodes, {ENGINE_TITLES[e]}: rule {where}: {error}")
            for where in r.dashboard[e].errors:
                problems.append(f"- {r.nodes} nodes, {ENGINE_TITLES[e]}: query {where}")
            for where in r.dashboard[e].empty:
                problems.append(f"- {r.nodes} nodes, {ENGINE_TITLES[e]}: no data: {where}")
    if problems:
        lines += ["", "Errors and empty queries:", "", *problems]
    return "\n".join(lines) + "\n"


def _simulator_label(result: SizeResult) -> str:
    return f"simulator ({' + '.join(result.engines)} run)"


def _own_simulator(values: Mapping[str, float], result: SizeResult) -> dict[str, float]:
    """Per-process ``values`` with the simulator named after ``result``'s run."""
    return {(_simulator_label(result) if name == "simulator" else name): value
            for name, value in values.items()}


def merge_runs(first: SizeResult, other: SizeResult) -> SizeResult:
    """One result from two runs of a fleet size whose engines differ: the engines'
    readings side by side, every process of both runs (each run's simulator named after
    it), the fleet's figures and the window of ``first``, the run times added up."""
    engines = [e for e in ENGINES if e in first.engines or e in other.engines]
    if not math.isclose(first.window_seconds, other.window_seconds, rel_tol=0.1):
        logger.warning("%d nodes: the runs combined measured over %.0f s (%s) and %.0f s (%s); "
                       "the report gives the first", first.nodes, first.window_seconds,
                       " + ".join(first.engines), other.window_seconds, " + ".join(other.engines))
    vm_run = other if "victoriametrics" in other.engines else first
    ups = [first.targets_up_seconds, other.targets_up_seconds]

    def merged(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
        return {**a, **b}

    return dataclasses.replace(
        first, engines=engines, shards=vm_run.shards, shard_targets=vm_run.shard_targets,
        active_series=merged(first.active_series, other.active_series),
        series_by_name=merged(first.series_by_name, other.series_by_name),
        samples_per_second=merged(first.samples_per_second, other.samples_per_second),
        cpu_cores=merged(_own_simulator(first.cpu_cores, first),
                         _own_simulator(other.cpu_cores, other)),
        rss_mib=merged(_own_simulator(first.rss_mib, first), _own_simulator(other.rss_mib, other)),
        rule_groups=merged(first.rule_groups, other.rule_groups),
        rule_errors=merged(first.rule_errors, other.rule_errors),
        groups_loaded=merged(first.groups_loaded, other.groups_loaded),
        scrapes=merged(first.scrapes, other.scrapes),
        dashboard=merged(first.dashboard, other.dashboard),
        targets_up_seconds=None if None in ups else max(u for u in ups if u is not None),
        run_seconds=first.run_seconds + other.run_seconds,
        rule_iterations=merged(first.rule_iterations, other.rule_iterations),
        rule_durations=merged(first.rule_durations, other.rule_durations),
        group_intervals=merged(first.group_intervals, other.group_intervals),
        group_iterations=merged(first.group_iterations, other.group_iterations),
    )


def combine_runs(results: Sequence[SizeResult]) -> list[SizeResult]:
    """``results`` in order, each merged (``merge_runs``) into the first earlier one of
    the same fleet size and intervals whose engines are disjoint from its own."""
    combined: list[SizeResult] = []
    for result in results:
        for index, earlier in enumerate(combined):
            if (earlier.nodes, earlier.scrape_interval, earlier.evaluation_interval) == (
                    result.nodes, result.scrape_interval, result.evaluation_interval) and (
                    not set(earlier.engines) & set(result.engines)):
                combined[index] = merge_runs(earlier, result)
                break
        else:
            combined.append(result)
    return combined


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


def _engines(text: str) -> list[str]:
    chosen = {name.strip() for name in text.split(",") if name.strip()}
    unknown = chosen - set(ENGINES)
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(
            f"engines are {', '.join(ENGINES)}: not {', '.join(sorted(unknown)) or text!r}")
    return [e for e in ENGINES if e in chosen]


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
    parser.add_argument("--engines", type=_engines, default=list(ENGINES),
                        help="engines to start, comma-separated (default: "
                             f"{','.join(ENGINES)}); combine one-engine runs with --report-from")
    parser.add_argument("--refreshes", type=int, default=5,
                        help="fleet dashboard refreshes per engine")
    parser.add_argument("--output", type=Path, help="also write the tables here")
    parser.add_argument("--json", type=Path, help="write every measurement as JSON")
    parser.add_argument("--report-from", type=Path, nargs="+", metavar="JSON",
                        help="print the tables of earlier --json files, in order, runs of "
                             "one size on different engines side by side; run nothing")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.report_from:
        saved = combine_runs([r for path in args.report_from for r in load_results(path)])
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
                      finished=write, engines=args.engines)
    record_headlines(results)
    print(report(results))


if __name__ == "__main__":
    main()

"""A short fleet run through the benchmark's own code path (``bench/fleet_scale.py``).

30 simulated nodes (``bench/fleet_sim.py``, derived from a real
``trainmon serve --demo``), each a trainmon and a dcgm-exporter target, scraped
every second by two vmagent shards from the shipped
``deploy/scale/vmagent-dcgm.yml`` into VictoriaMetrics (rules on vmalert) and by
one Prometheus from ``deploy/prometheus/prometheus-dcgm.yml``, both with the
shipped ``alerts/dcgm`` rules evaluated every second. Checked: both engines hold
exactly the series the simulator serves; the shards split the nodes with none
twice and none missed; every rule group evaluates without errors on both; every
query of the fleet dashboard returns data on both (except the metrics nothing
simulates, listed by the dashboard query test); the report has every column.

Without engines (not ``integration``): one-engine runs of a size combine into one
report (``--report-from``), a group's due iterations follow its own interval, and
files saved before the per-engine fields load.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import yaml

from bench import fleet_scale, fleet_sim, headline
from testkit.metric_contract import metric_names
from tests.dashboards.dashboards_support import EXPECTED_EMPTY

NODES = 30
SHARDS = 2
INTERVAL_SECONDS = 1.0
WINDOW_SECONDS = 10.0
WARMUP_SECONDS = 3.0


@pytest.fixture(scope="module")
def fleet_run(tmp_path_factory: pytest.TempPathFactory, fleet_templates: Path,
              ) -> tuple[fleet_scale.SizeResult, fleet_sim.Fleet]:
    workdir = tmp_path_factory.mktemp("fleet")
    [result] = fleet_scale.run(
        [NODES], duration=WINDOW_SECONDS, warmup=WARMUP_SECONDS, interval=INTERVAL_SECONDS,
        evaluation=INTERVAL_SECONDS, shards=SHARDS, refreshes=1, workdir=workdir,
        templates=fleet_templates)
    fleet = fleet_sim.Fleet(fleet_sim.load_templates(fleet_templates), NODES)
    return result, fleet


@pytest.mark.integration
def test_the_fleet_has_multi_node_jobs_and_every_node_its_own_series(
    fleet_run: tuple[fleet_scale.SizeResult, fleet_sim.Fleet],
) -> None:
    result, fleet = fleet_run
    assert sorted(result.trainmon_series_per_node) == fleet.nodes
    assert result.trainmon_series_per_node == fleet.series_per_node("trainmon")
    assert set(fleet.series_per_node("dcgm-exporter").values()) == {200}
    spans = [len(nodes) for nodes in fleet.jobs().values()]
    assert max(spans) > 1 and min(spans) == 1, spans
    uuids = [p for n in fleet.nodes for p in fleet.expositions[n]["trainmon"].prefixes
             if p.rsplit("\n", 1)[-1].startswith("trainmon_gpu_info{")]
    assert len(uuids) == len(set(uuids)) == NODES * fleet_sim.GPUS_PER_NODE


@pytest.mark.integration
def test_both_engines_hold_exactly_the_simulated_series(
    fleet_run: tuple[fleet_scale.SizeResult, fleet_sim.Fleet],
) -> None:
    result, fleet = fleet_run
    served = fleet.series_by_name()
    assert sum(served.values()) == result.simulated_series == fleet.total_series
    targets = NODES * len(fleet.sources)
    for engine in fleet_scale.ENGINES:
        held = result.series_by_name[engine]
        assert {name: held.get(name, 0) for name in served} == dict(served), engine
        scrape = {name: count for name, count in held.items()
                  if name == "up" or name.startswith("scrape_")}
        assert scrape and set(scrape.values()) == {targets}, (engine, scrape)
        simulated = {n for n in held if n.startswith(("trainmon_", "DCGM_", "process_"))}
        assert simulated == set(served), engine


@pytest.mark.integration
def test_every_node_is_scraped_by_exactly_one_vmagent_shard(
    fleet_run: tuple[fleet_scale.SizeResult, fleet_sim.Fleet],
) -> None:
    result, fleet = fleet_run
    assert result.targets_up_seconds is not None, "not every target came up on both engines"
    assert len(result.shard_targets) == SHARDS
    for job in ("trainmon", "dcgm-exporter"):
        shards = [set(shard.get(job, [])) for shard in result.shard_targets]
        assert all(shards), f"{job}: a shard scrapes nothing: {[len(s) for s in shards]}"
        for one, other in itertools.combinations(shards, 2):
            assert not one & other, f"{job}: nodes scraped by two shards: {one & other}"
        assert set().union(*shards) == set(fleet.nodes), job
    expected = result.scrapes["victoriametrics"].expected_scrapes
    for engine in fleet_scale.ENGINES:
        health = result.scrapes[engine]
        assert health.targets == NODES * len(fleet.sources)
        assert health.scrapes_min >= 1, (engine, health)
        assert health.scrapes_max <= expected + 2, (engine, health)  # never twice per interval
        assert health.down == 0, (engine, health)


@pytest.mark.integration
def test_every_rule_group_evaluates_without_errors_on_both_engines(
    fleet_run: tuple[fleet_scale.SizeResult, fleet_sim.Fleet],
) -> None:
    result, _ = fleet_run
    shipped = sorted(
        line.split(":", 1)[1].strip()
        for path in fleet_scale.RULE_FILES
        for line in path.read_text().splitlines() if line.startswith("- name:"))
    intervals = fleet_scale.rule_file_intervals(fleet_scale.RULE_FILES, INTERVAL_SECONDS)
    for engine in fleet_scale.ENGINES:
        assert result.groups_loaded[engine] == shipped, engine
        assert result.rule_errors[engine] == {}, engine
        assert result.group_intervals[engine] == intervals, engine  # as the engines report
        # a group with its own, longer interval may not come round in the window
        due = [g for g in shipped if result.group_iterations[engine][g]["due"] >= 1]
        # Durations are read from /api/v1/rules between iterations; on a machine so busy
        # that a group's iterations run back to back, every reading may find it half-way
        # (vmalert: 5 of 11 groups read in one CI run): that each ran is the engine's own
        # counter (below); that durations can be read at all, here.
        read = [g for g in due if result.rule_groups[engine].get(g)]
        assert read, (engine, sorted(due))
        iterations = result.rule_iterations[engine]
        # counted from the engines' own counters, read a moment after the window ends
        assert iterations["run"] > 0 and iterations["missed"] >= 0, (engine, iterations)
        per_group = result.group_iterations[engine]
        assert sorted(per_group) == shipped, engine
        for group, counts in per_group.items():
            # due over the window as measured (a loaded machine stretches it past WINDOW_SECONDS)
            assert counts["due"] == pytest.approx(result.window_seconds / intervals[group])
            assert result.window_seconds >= WINDOW_SECONDS
        assert all(per_group[g]["run"] > 0 for g in due), (engine, per_group)
        assert sum(c["missed"] for c in per_group.values()) == iterations["missed"], engine
        assert iterations["due"] == pytest.approx(sum(c["due"] for c in per_group.values()))
        evaluated = {rule.split("/", 1)[0] for rule, seen in result.rule_durations[engine].items()
                     if seen}
        assert set(read) <= evaluated <= set(shipped), engine


@pytest.mark.integration
def test_every_fleet_dashboard_query_returns_data_on_both_engines(
    fleet_run: tuple[fleet_scale.SizeResult, fleet_sim.Fleet],
) -> None:
    result, _ = fleet_run
    for engine in fleet_scale.ENGINES:
        timing = result.dashboard[engine]
        assert timing.errors == [], engine
        unexplained = {where: expr for where, expr in timing.empty.items()
                       if not metric_names(expr) & (EXPECTED_EMPTY.keys()
                                                    | _records_not_due(result, engine))}
        assert unexplained == {}, engine
        assert len(timing.latencies) == timing.queries_per_refresh - 1  # the variable's query
        assert timing.queries_per_refresh > 20


def _records_not_due(result: fleet_scale.SizeResult, engine: str) -> set[str]:
    """The recording rules of the groups that were not due in the window (their own
    interval is longer): the run may end before they first come round."""
    late = {group for group, counts in result.group_iterations[engine].items()
            if counts["due"] < 1}
    return {str(rule["record"]) for path in fleet_scale.RULE_FILES
            for group in yaml.safe_load(path.read_text())["groups"] if group["name"] in late
            for rule in group["rules"] if "record" in rule}


@pytest.mark.integration
def test_the_report_has_every_column(
    fleet_run: tuple[fleet_scale.SizeResult, fleet_sim.Fleet],
) -> None:
    result, _ = fleet_run
    text = fleet_scale.report([result])
    for title in fleet_scale.ENGINE_TITLES.values():
        assert f" {NODES} nodes: {title} |" in text, title
    for process in ("simulator", "vmagent-0", "vmagent-1", "victoria-metrics", "vmalert",
                    "prometheus"):
        assert f"| {process} |" in text, process
    for group in result.groups_loaded["prometheus"]:
        assert f"| {group} |" in text, group
    for row in ("active series", "samples ingested per second", "query latency p50",
                "query latency p95", "one refresh", "scrape duration, max", "peak RSS MiB",
                "CPU cores"):
        assert row in text, row
    assert "nan" not in text.lower()
    for line in text.splitlines():  # only a group that is not due in the window
        if "not evaluated" in line:
            group = line.split("|")[1].strip().split("/")[0]  # a group's row or a rule's
            assert all(result.group_iterations[e][group]["due"] < 1
                       for e in fleet_scale.ENGINES), line
    tables: list[list[str]] = []
    previous = ""
    for line in text.splitlines():
        if line.startswith("|"):
            if not previous.startswith("|"):
                tables.append([])
            tables[-1].append(line)
        previous = line
    assert len(tables) == 6  # the last: the slowest panel queries
    for table in tables:
        columns = {line.count("|") for line in table}
        assert len(columns) == 1 and min(columns) >= 3, table[0]
        assert len(table) > 3, table[0]


# ---- without engines ------------------------------------------------------------------------


def _one_engine_run(engine: str, nodes: int = 1000) -> fleet_scale.SizeResult:
    """What a ``--engines <engine>`` run of ``nodes`` nodes saves (made-up figures)."""
    processes = {"victoriametrics": ["vmagent-0", "vmagent-1", "victoria-metrics", "vmalert"],
                 "prometheus": ["prometheus"]}[engine]
    slow = 0.2 if engine == "victoriametrics" else 0.05
    return fleet_scale.SizeResult(
        nodes=nodes, shards=2 if engine == "victoriametrics" else 0, scrape_interval=15.0,
        evaluation_interval=15.0, window_seconds=180.0, simulated_series=1_000_000,
        trainmon_series_per_node={"node-0": 800}, dcgm_series_per_node={"node-0": 200},
        active_series={engine: 1_100_000}, series_by_name={engine: {"trainmon_up": 8000}},
        samples_per_second={engine: 70_000.0},
        cpu_cores={"simulator": 0.5, **{name: 0.25 for name in processes}},
        rss_mib={"simulator": 900.0, **{name: 400.0 for name in processes}},
        rule_groups={engine: {"trainmon-gpu": [slow, slow * 2], "trainmon-slow": [20.0]}},
        rule_errors={engine: {}}, groups_loaded={engine: ["trainmon-gpu", "trainmon-slow"]},
        scrapes={engine: fleet_scale.ScrapeHealth(
            targets=2000, scrapes_min=12, scrapes_max=12, scrapes_mean=12.0,
            expected_scrapes=12.0, max_scrape_seconds=0.1, mean_scrape_seconds=0.01, down=0)},
        dashboard={engine: fleet_scale.DashboardTiming(
            queries_per_refresh=30, latencies=[0.01, 0.02], refresh_totals=[0.5],
            slowest=(0.02, "panel"))},
        shard_targets=[{"trainmon": ["node-0"]}, {"trainmon": ["node-1"]}]
        if engine == "victoriametrics" else [],
        targets_up_seconds=30.0 if engine == "prometheus" else 40.0, run_seconds=600.0,
        rule_iterations={engine: {"due": 21.0, "run": 20.0, "missed": 1.0}},
        engines=[engine],
        rule_durations={engine: {"trainmon-gpu/TrainmonGPUSawtooth": [slow],
                                 "trainmon-slow/TrainmonCheckpointOverdue #1": [slow * 3],
                                 "trainmon-slow/TrainmonCheckpointOverdue #2": [slow * 4]}},
        group_intervals={engine: {"trainmon-gpu": 15.0, "trainmon-slow": 60.0}},
        group_iterations={engine: {"trainmon-gpu": {"due": 12.0, "run": 12.0, "missed": 0.0},
                                   "trainmon-slow": {"due": 3.0, "run": 2.0, "missed": 1.0}}},
    )


def _tables(text: str) -> dict[str, list[str]]:
    """Section title → the lines of its table."""
    tables: dict[str, list[str]] = {}
    title = ""
    for line in text.splitlines():
        if line.startswith("### "):
            title = line[4:]
        elif line.startswith("|"):
            tables.setdefault(title, []).append(line)
    return tables


def test_one_engine_runs_of_a_size_combine_into_one_column_set() -> None:
    prometheus, victoria = _one_engine_run("prometheus"), _one_engine_run("victoriametrics")
    [combined] = fleet_scale.combine_runs([prometheus, victoria])
    assert combined.engines == ["victoriametrics", "prometheus"]
    assert combined.shards == 2 and combined.shard_targets == victoria.shard_targets
    assert combined.cpu_cores == {
        "simulator (prometheus run)": 0.5, "prometheus": 0.25,
        "simulator (victoriametrics run)": 0.5, "vmagent-0": 0.25, "vmagent-1": 0.25,
        "victoria-metrics": 0.25, "vmalert": 0.25}
    assert combined.targets_up_seconds == 40.0 and combined.run_seconds == 1200.0
    for field in ("active_series", "samples_per_second", "rule_groups", "scrapes", "dashboard",
                  "rule_durations", "group_intervals", "group_iterations", "rule_iterations"):
        assert sorted(getattr(combined, field)) == ["prometheus", "victoriametrics"], field

    text = fleet_scale.report([combined])
    tables = _tables(text)
    assert len(tables) == 5
    header = tables["Series, ingestion and scrapes"][0]
    assert header == ("|  | 1000 nodes: vmagent → VictoriaMetrics | 1000 nodes: Prometheus |")
    assert "| simulator (prometheus run) | 0.50 | 900 |" in text
    assert "| simulator (victoriametrics run) | 0.50 | 900 |" in text
    assert "| VictoriaMetrics stack (vmagents + VM + vmalert) | 1.00 | 1,600 |" in text
    [rules] = [t for title, t in tables.items() if title.startswith("Rule evaluation")]
    assert rules[0].endswith("| 1000 nodes: vmalert / Prometheus (p50) |")
    assert "| trainmon-gpu/TrainmonGPUSawtooth | 200 / 200 (1) | 50 / 50 (1) | × 4.0 |" in rules
    assert rules[2].startswith("| trainmon-slow/TrainmonCheckpointOverdue #2 |")  # costliest
    groups = tables["Rule group evaluation (evaluations seen in the window)"]
    assert ("| trainmon-slow | 60 | 20000 / 20000 (1) | 33.3 % | 1 / 3.0 "
            "| 20000 / 20000 (1) | 33.3 % | 1 / 3.0 |") in groups
    assert "nan" not in text.lower()


def test_runs_are_combined_only_across_engines_of_one_size() -> None:
    runs = [_one_engine_run("prometheus", 100), _one_engine_run("prometheus", 1000),
            _one_engine_run("prometheus", 1000), _one_engine_run("victoriametrics", 100)]
    combined = fleet_scale.combine_runs(runs)
    assert [(r.nodes, r.engines) for r in combined] == [
        (100, ["victoriametrics", "prometheus"]), (1000, ["prometheus"]),
        (1000, ["prometheus"])]
    text = fleet_scale.report(combined[:2])
    header = _tables(text)["Series, ingestion and scrapes"][0]
    # the growth column only for the engine both sizes ran
    assert header.count("growth") == 1 and header.endswith("growth 100 → 1000: Prometheus |")
    resources = _tables(text)["CPU and memory per process"]
    assert any(line.startswith("| vmalert | 0.25 | 400 | – | – |") for line in resources)


def test_a_groups_due_iterations_follow_its_own_interval(tmp_path: Path) -> None:
    rules = tmp_path / "trainmon.rules.yml"
    rules.write_text("groups:\n- name: fast\n  rules: []\n"
                     "- name: slow\n  interval: 1m30s\n  rules: []\n")
    intervals = fleet_scale.rule_file_intervals([rules], default=15.0)
    assert intervals == {"fast": 15.0, "slow": 90.0}
    due = fleet_scale.iterations_due(intervals, window=180.0)
    assert due == {"fast": 12.0, "slow": 2.0}
    name = "prometheus_rule_group_iterations_missed_total"
    before = {f'{name}{{rule_group="/rules/trainmon.rules.yml;slow"}}': 4.0,
              f'{name}{{rule_group="/rules/trainmon.rules.yml;fast"}}': 0.0}
    after = {f'{name}{{rule_group="/rules/trainmon.rules.yml;slow"}}': 5.0,
             f'{name}{{rule_group="/rules/trainmon.rules.yml;fast"}}': 0.0}
    counts = fleet_scale.group_iterations(due, before, after, "prometheus")
    assert counts["slow"]["missed"] == 1.0 and counts["fast"]["missed"] == 0.0
    assert math.isnan(counts["slow"]["run"])  # its counter is not in the reading
    unread = fleet_scale.group_iterations(due, None, after, "prometheus")
    assert unread["slow"]["due"] == 2.0 and math.isnan(unread["slow"]["missed"])
    vmalert = {'vmalert_iteration_missed_total{file="/rules/a.yml",group="slow",id="7"}': 2.0}
    assert fleet_scale.group_iterations(due, {}, vmalert, "victoriametrics")["slow"][
        "missed"] == 2.0


def test_a_rule_name_a_group_holds_twice_is_numbered() -> None:
    rules = [{"name": "TrainmonCheckpointOverdue"}, {"name": "TrainmonNCCLOverSockets"},
             {"name": "TrainmonCheckpointOverdue"}]
    assert fleet_scale.rule_keys("trainmon-platform", rules) == [
        "trainmon-platform/TrainmonCheckpointOverdue #1",
        "trainmon-platform/TrainmonNCCLOverSockets",
        "trainmon-platform/TrainmonCheckpointOverdue #2"]


def test_files_saved_before_the_per_engine_fields_load_as_both_engines(tmp_path: Path) -> None:
    both = fleet_scale.merge_runs(_one_engine_run("victoriametrics"),
                                  _one_engine_run("prometheus"))
    saved = json.loads(json.dumps(both.__dict__, default=lambda o: o.__dict__))
    for field in ("engines", "rule_durations", "group_intervals", "group_iterations"):
        del saved[field]
    path = tmp_path / "old.json"
    path.write_text(json.dumps([saved]))
    [loaded] = fleet_scale.load_results(path)
    assert loaded.engines == list(fleet_scale.ENGINES)
    text = fleet_scale.report([loaded])
    assert "| trainmon-slow | 15 | 20000 / 20000 (1) | 133.3 % | – |" in text


def test_the_headline_figures_stand_beside_their_goals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    results = tmp_path / "headline.jsonl"
    monkeypatch.setenv(headline.RESULTS_ENV, str(results))
    fleet_scale.record_headlines([_one_engine_run("prometheus")])
    figures = {f.name: f for f in headline.load(results)}
    slowest = figures["slowest rule group, p50 % of its interval (1000 nodes, Prometheus)"]
    assert slowest.at_most == 20.0 and slowest.source.endswith("--engines prometheus")
    assert headline.Figure("over", 25.0, at_most=20.0).met() == "**no**"
    assert headline.Figure("under", 20.0, at_most=20.0).met() == "yes"
    assert headline.Figure("no goal", 3.0).met() == "–"
    table = headline.table(list(figures.values()))
    assert table.count("\n") == len(figures) + 1
    assert "| rule group iterations missed (1000 nodes, Prometheus) |" in table
    monkeypatch.delenv(headline.RESULTS_ENV)
    headline.record(headline.Figure("outside make bench", 1.0))  # no file: nothing written
    assert "outside make bench" not in results.read_text()


def test_the_bench_runs_vmalert_with_the_deployments_remote_write_settings(
    tmp_path: Path,
) -> None:
    """vmalert's remote-write defaults differ by release (Debian's 1.79: one writer, 1 000-row
    batches, a 100 000-row queue); the bench takes the shipped deployment's, and only those."""
    shipped = fleet_scale.shipped_vmalert_flags()
    assert {flag.split("=")[0] for flag in shipped} == {
        "-remoteWrite.concurrency", "-remoteWrite.maxBatchSize", "-remoteWrite.maxQueueSize"}
    compose = tmp_path / "docker-compose.yml"
    compose.write_text(yaml.safe_dump({"services": {"vmalert": {"command": [
        "-rule=/x/*.yml", "-remoteWrite.url=http://vm:8428", "-remoteWrite.flushInterval=2s"]}}}))
    assert fleet_scale.shipped_vmalert_flags(compose) == ["-remoteWrite.flushInterval=2s"]


def _vmalert_group(start: str, rules: list[tuple[str, str, float]]) -> dict[str, object]:
    return {"name": "g", "interval": 15, "concurrency": 1, "lastEvaluation": start,
            "rules": [{"name": f"r{i}", "type": kind, "lastEvaluation": at,
                       "evaluationTime": seconds}
                      for i, (kind, at, seconds) in enumerate(rules)]}


def test_vmalert_179s_cumulative_recording_times_are_read_as_each_rules_own() -> None:
    """Debian's vmalert 1.79 times a recording rule from its group's evaluation
    timestamp, 14 s before the iteration began here, and counts every rule before it;
    an alerting rule times itself. The rules' own seconds are what each added."""
    lagging, began = "2026-12-02T16:40:19.500000Z", "2026-12-02T16:40:33.500000Z"
    group = _vmalert_group(began, [
        ("recording", lagging, 14.8),                      # 0.8 s after the start
        ("recording", lagging, 15.7),                      # 0.9 s more
        ("alerting", "2026-12-02T16:40:35.200000Z", 0.3),  # its own, from its own start
        ("recording", lagging, 16.4),                      # 0.4 s after the alert ended
    ])
    assert fleet_scale.vmalert_rule_seconds(group) == pytest.approx([0.8, 0.9, 0.3, 0.4])
    reading = fleet_scale.read_rules([group], evaluator="vmalert")
    assert reading.groups["g"] == ("2026-12-02T16:40:33.500000", pytest.approx(2.4))
    assert reading.rules["g/r1"] == ("2026-12-02T16:40:19.500000", pytest.approx(0.9))


def test_a_vmalert_group_read_half_way_through_an_iteration_is_left_out() -> None:
    """The first rule is already the next iteration's (stamped 15 s later): which
    start its time counts from is not in this reading."""
    began = "2026-12-02T16:40:33.500000Z"
    group = _vmalert_group(began, [("recording", "2026-12-02T16:40:34.500000Z", 15.6),
                                   ("recording", "2026-12-02T16:40:19.500000Z", 15.7)])
    assert fleet_scale.vmalert_rule_seconds(group) is None
    assert "g" not in fleet_scale.read_rules([group], evaluator="vmalert").groups
    alerts = _vmalert_group(began, [("alerting", "2026-12-02T16:40:33.600000Z", 0.2),
                                    ("alerting", "2026-12-02T16:40:48.700000Z", 0.2)])
    assert fleet_scale.vmalert_rule_seconds(alerts) is None


def test_a_vmalert_that_times_each_rule_from_its_own_start_is_read_as_is() -> None:
    """vmalert from 1.83 stamps every rule with its own start: nothing to take apart."""
    group = _vmalert_group("2026-12-02T16:40:33.500000Z", [
        ("recording", "2026-12-02T16:40:33.500100Z", 0.8),
        ("recording", "2026-12-02T16:40:34.300200Z", 0.9)])
    assert fleet_scale.vmalert_rule_seconds(group) == pytest.approx([0.8, 0.9])

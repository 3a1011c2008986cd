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
"""

from __future__ import annotations

import itertools

import pytest

from bench import fleet_scale, fleet_sim
from testkit.metric_contract import metric_names
from tests.dashboards.dashboards_support import EXPECTED_EMPTY

pytestmark = pytest.mark.integration

NODES = 30
SHARDS = 2
INTERVAL_SECONDS = 1.0
WINDOW_SECONDS = 10.0
WARMUP_SECONDS = 3.0


@pytest.fixture(scope="module")
def fleet_run(tmp_path_factory: pytest.TempPathFactory,
              ) -> tuple[fleet_scale.SizeResult, fleet_sim.Fleet]:
    workdir = tmp_path_factory.mktemp("fleet")
    [result] = fleet_scale.run(
        [NODES], duration=WINDOW_SECONDS, warmup=WARMUP_SECONDS, interval=INTERVAL_SECONDS,
        evaluation=INTERVAL_SECONDS, shards=SHARDS, refreshes=1, workdir=workdir)
    fleet = fleet_sim.Fleet(fleet_sim.load_templates(workdir / "templates.json"), NODES)
    return result, fleet


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


def test_every_rule_group_evaluates_without_errors_on_both_engines(
    fleet_run: tuple[fleet_scale.SizeResult, fleet_sim.Fleet],
) -> None:
    result, _ = fleet_run
    shipped = sorted(
        line.split(":", 1)[1].strip()
        for path in fleet_scale.RULE_FILES
        for line in path.read_text().splitlines() if line.startswith("- name:"))
    for engine in fleet_scale.ENGINES:
        assert result.groups_loaded[engine] == shipped, engine
        assert result.rule_errors[engine] == {}, engine
        unevaluated = [g for g in shipped if not result.rule_groups[engine].get(g)]
        assert not unevaluated, (engine, unevaluated)
        iterations = result.rule_iterations[engine]
        # counted from the engines' own counters, read a moment after the window ends
        assert iterations["run"] > 0 and iterations["missed"] >= 0, (engine, iterations)


def test_every_fleet_dashboard_query_returns_data_on_both_engines(
    fleet_run: tuple[fleet_scale.SizeResult, fleet_sim.Fleet],
) -> None:
    result, _ = fleet_run
    for engine in fleet_scale.ENGINES:
        timing = result.dashboard[engine]
        assert timing.errors == [], engine
        unexplained = {where: expr for where, expr in timing.empty.items()
                       if not metric_names(expr) & EXPECTED_EMPTY.keys()}
        assert unexplained == {}, engine
        assert len(timing.latencies) == timing.queries_per_refresh - 1  # the variable's query
        assert timing.queries_per_refresh > 20


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
    assert "nan" not in text.lower() and "not evaluated" not in text
    tables: list[list[str]] = []
    previous = ""
    for line in text.splitlines():
        if line.startswith("|"):
            if not previous.startswith("|"):
                tables.append([])
            tables[-1].append(line)
        previous = line
    assert len(tables) == 4
    for table in tables:
        columns = {line.count("|") for line in table}
        assert len(columns) == 1 and min(columns) >= 3, table[0]
        assert len(table) > 3, table[0]

"""Static checks of the committed dashboards: conventions, metric contract, links."""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

import pytest

from testkit.dashboard_files import (
    DATASOURCE_REF,
    KINDS,
    VARIANTS,
    Dashboard,
    annotation_queries,
    panel_queries,
)
from testkit.metric_contract import (
    Contract,
    dcgm_fields,
    metric_names,
    recording_rules,
    trainmon_metrics,
)

UID_PREFIX = {"dcgm": "trainmon-dcgm", "tencent-cloud": "trainmon-tencent"}
REQUIRED_VARIABLES = {"training": {"job", "owner", "node"}, "node": {"node", "gpu"}, "fleet": {"node"},
                      "goodput": {"job", "team"}}
OPT_IN_NOTE = "not in dcgm-exporter's default counters"
#: Grafana 11.x/12.x write schemaVersion 39–41; older numbers get migrated on import.
CURRENT_SCHEMA = 39


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (node, rank) (rate(trainmon_training_steps_total{job="$job"}[$__rate_interval]))',
         {"trainmon_training_steps_total"}),
        ("histogram_quantile(0.95, sum by (le) (rate(x_bucket{a=~\"b|c\"}[5m])))", {"x_bucket"}),
        ("DCGM_FI_DEV_SM_CLOCK{gpu=~\"$gpu\"} * 1e6 / 1048576", {"DCGM_FI_DEV_SM_CLOCK"}),
        ("a and on(node, gpu) b{c=\"d\"} or vector(0) unless ignoring(e) f offset 5m",
         {"a", "b", "f"}),
        ("time() - max(last_ts)", {"last_ts"}),
        ("label_values(trainmon_build_info{node=\"x\"}, node)", {"trainmon_build_info"}),
        ("label_values(node)", set()),
        ('count(ALERTS{alertname=~"Trainmon.*", alertstate="firing"}) or vector(0)', {"ALERTS"}),
    ],
)
def test_metric_names_are_found_in_promql(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_the_contract_sources_are_read() -> None:
    documented = trainmon_metrics()
    assert {"trainmon_build_info", "trainmon_network_receive_bytes_total",
            "trainmon_disk_io_time_seconds_total"} <= documented
    default, opt_in = dcgm_fields()
    assert {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"} <= default
    assert "DCGM_FI_PROF_SM_ACTIVE" in opt_in
    assert not default & opt_in
    assert "job_rank:trainmon_training_straggler:ratio_rate10m" in recording_rules()


def test_every_dashboard_exists_with_a_stable_uid_and_current_schema(
    dashboards: list[Dashboard],
) -> None:
    assert {(d.variant, d.kind) for d in dashboards} == {(v, k) for v in VARIANTS for k in KINDS}
    for dashboard in dashboards:
        model = dashboard.model
        assert model["uid"] == f"{UID_PREFIX[dashboard.variant]}-{dashboard.kind}", dashboard.name
        assert len(model["uid"]) <= 40
        assert model["schemaVersion"] >= CURRENT_SCHEMA, dashboard.name
        assert model.get("title") and model.get("description"), dashboard.name
        assert "id" not in model or model["id"] is None, "an instance-specific id is set"
    assert len({d.model["uid"] for d in dashboards}) == len(dashboards)


def _datasource_refs(node: Any, path: str = "") -> list[tuple[str, Any]]:
    """Every value stored under a "datasource" key anywhere in the model."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource":
                found.append((f"{path}.{key}", value))
            found.extend(_datasource_refs(value, f"{path}.{key}"))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found.extend(_datasource_refs(value, f"{path}[{index}]"))
    return found


def test_only_the_datasource_variable_is_referenced(dashboards: list[Dashboard]) -> None:
    for dashboard in dashboards:
        first = dashboard.variables()[0]
        assert (first["type"], first["name"], first["query"]) == (
            "datasource", "datasource", "prometheus"), dashboard.name
        refs = _datasource_refs(dashboard.model)
        assert refs, dashboard.name
        wrong = [(path, ref) for path, ref in refs if ref != DATASOURCE_REF]
        assert not wrong, f"{dashboard.name}: hard-coded datasources {wrong}"


def test_template_variables(dashboards: list[Dashboard]) -> None:
    for dashboard in dashboards:
        variables = {v["name"]: v for v in dashboard.variables()}
        assert REQUIRED_VARIABLES[dashboard.kind] <= variables.keys(), dashboard.name
        for variable in variables.values():
            if variable["type"] != "query":
                continue
            assert variable["datasource"] == DATASOURCE_REF, (dashboard.name, variable["name"])
            assert variable["query"].startswith("label_values("), variable["name"]
            assert variable["refresh"] == 2, "refresh on time range change"
            if variable.get("includeAll"):
                assert variable["allValue"] == ".+", variable["name"]


def test_every_panel_has_title_unit_description_and_the_datasource(
    dashboards: list[Dashboard],
) -> None:
    problems = []
    for dashboard in dashboards:
        for panel in dashboard.data_panels():
            title = panel.get("title", "")
            where = f"{dashboard.name} · {title or panel.get('id')!r}"
            if not title:
                problems.append(f"{where}: no title")
            if not panel.get("description", "").strip():
                problems.append(f"{where}: no description")
            if not panel.get("fieldConfig", {}).get("defaults", {}).get("unit"):
                problems.append(f"{where}: no unit")
            if panel.get("datasource") != DATASOURCE_REF:
                problems.append(f"{where}: datasource {panel.get('datasource')}")
            targets = panel.get("targets", [])
            if not targets:
                problems.append(f"{where}: no query")
            ref_ids = [t.get("refId") for t in targets]
            if len(set(ref_ids)) != len(ref_ids) or not all(ref_ids):
                problems.append(f"{where}: refIds {ref_ids}")
            if not all(t.get("expr", "").strip() for t in targets):
                problems.append(f"{where}: an empty query")
    assert not problems, "\n".join(problems)


def test_panel_ids_and_titles_are_unique_and_the_grid_has_no_overlap(
    dashboards: list[Dashboard],
) -> None:
    for dashboard in dashboards:
        titles = Counter(panel["title"] for panel in dashboard.data_panels())
        assert [t for t, n in titles.items() if n > 1] == [], dashboard.name
        ids = Counter(panel.get("id") for panel in dashboard.panels())
        assert all(isinstance(i, int) and i > 0 for i in ids), (dashboard.name, ids)
        assert [i for i, n in ids.items() if n > 1] == [], dashboard.name
        cells: dict[tuple[int, int], str] = {}
        for panel in dashboard.panels():
            grid = panel["gridPos"]
            assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, (dashboard.name, panel["title"])
            for x in range(grid["x"], grid["x"] + grid["w"]):
                for y in range(grid["y"], grid["y"] + grid["h"]):
                    other = cells.setdefault((x, y), panel["title"])
                    assert other == panel["title"], (
                        f"{dashboard.name}: {panel['title']!r} overlaps {other!r}")


def test_every_metric_a_query_uses_is_in_the_contract(
    dashboards: list[Dashboard], contract: Contract,
) -> None:
    unknown = []
    for dashboard in dashboards:
        exprs = [(q.where, q.expr)
                 for q in [*panel_queries(dashboard), *annotation_queries(dashboard)]]
        exprs += [(f"{dashboard.name} · ${v['name']}", v["query"])
                  for v in dashboard.variables() if v["type"] == "query"]
        for where, expr in exprs:
            names = metric_names(expr)
            assert names, f"{where}: no metric in {expr!r}"
            unknown += [f"{where}: {name}" for name in sorted(names) if not contract.allows(name)]
    assert not unknown, "not in docs/metrics.md nor dcgm-exporter's counters:\n" + "\n".join(
        unknown)


def test_opt_in_dcgm_fields_are_explained_where_used(
    dashboards: list[Dashboard], contract: Contract,
) -> None:
    used = set()
    for dashboard in dashboards:
        for panel in dashboard.data_panels():
            names = set().union(*(metric_names(t["expr"]) for t in panel["targets"]))
            opt_in = names & contract.dcgm_opt_in
            used |= opt_in
            if opt_in:
                assert OPT_IN_NOTE in panel["description"], (dashboard.name, panel["title"])
    assert used == {"DCGM_FI_PROF_SM_ACTIVE"}


def test_each_variant_uses_only_its_own_sources(dashboards: list[Dashboard]) -> None:
    foreign = {"dcgm": re.compile(r"\btrainmon_tencent_"), "tencent-cloud": re.compile(r"\bDCGM_")}
    for dashboard in dashboards:
        text = " ".join(q.expr for q in panel_queries(dashboard))
        assert not foreign[dashboard.variant].search(text), dashboard.name
    dcgm_uses = " ".join(q.expr for d in dashboards if d.variant == "dcgm"
                         for q in panel_queries(d))
    tencent_uses = " ".join(q.expr for d in dashboards if d.variant == "tencent-cloud"
                            for q in panel_queries(d))
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" in dcgm_uses
    assert "trainmon_tencent_cbs_await_seconds" in tencent_uses


def _data_link_urls(dashboard: Dashboard) -> list[str]:
    return [link["url"] for panel in dashboard.data_panels()
            for link in panel.get("fieldConfig", {}).get("defaults", {}).get("links", [])]


def test_the_dashboards_link_to_each_other(dashboards: list[Dashboard]) -> None:
    by_uid = {d.model["uid"]: d for d in dashboards}
    for variant in VARIANTS:
        tag = f"trainmon-{variant}"
        own = [d for d in dashboards if d.variant == variant]
        edges = set()
        for dashboard in own:
            assert tag in dashboard.model["tags"], dashboard.name
            menu = [link for link in dashboard.model["links"] if link["type"] == "dashboards"]
            assert menu and menu[0]["tags"] == [tag], dashboard.name
            assert menu[0]["keepTime"] and menu[0]["includeVars"]
            for url in _data_link_urls(dashboard):
                uid = re.match(r"/d/([^?/]+)", url)
                assert uid and uid.group(1) in by_uid, (dashboard.name, url)
                target = by_uid[uid.group(1)]
                assert target.variant == variant, (dashboard.name, url)
                query = url.split("?", 1)[1].split("&")
                assert {"${datasource:queryparam}", "${__url_time_range}"} <= set(query), url
                edges.add((dashboard.kind, target.kind))
        assert {("fleet", "node"), ("fleet", "training"), ("training", "node"),
                ("node", "training"), ("goodput", "training")} <= edges, (variant, edges)


#: A label list of an aggregation or a join: ``by (…)``, ``on (…)``, ``group_left (…)``.
LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")


def test_a_query_that_takes_a_job_takes_its_owner(dashboards: list[Dashboard]) -> None:
    """A job across nodes is (job, owner) (docs/security.md, "Owners across nodes"): a
    query that aggregates or joins by ``job`` keeps ``owner``, one that selects the
    Training overview's ``$job`` selects ``$owner`` too (the owner variable's own query
    aside), and a link to a job's Training overview passes its owner."""
    for dashboard in dashboards:
        for query in [*panel_queries(dashboard), *annotation_queries(dashboard)]:
            for labels in LABEL_LIST.findall(query.expr):
                names = {name.strip() for name in labels.split(",")}
                assert "job" not in names or "owner" in names, (dashboard.name, query.expr)
            if 'job="$job"' in query.expr:
                assert 'owner="$owner"' in query.expr, (dashboard.name, query.expr)
        for variable in dashboard.variables():
            query = str(variable.get("query", ""))
            if 'job="$job"' in query and variable["name"] != "owner":
                assert 'owner="$owner"' in query, (dashboard.name, variable["name"])
        for url in _data_link_urls(dashboard):
            if "var-job=" in url:
                assert "var-owner=" in url, (dashboard.name, url)


#: Options of a Prometheus annotation query that Grafana's schema model (the SDK's
#: AnnotationQuery) has no field for; dashboards.builder.PromAnnotation writes them.
PROMETHEUS_ANNOTATION_OPTIONS = ("step", "titleFormat", "textFormat", "tagKeys",
                                 "useValueForTime")


def _without_prometheus_annotation_options(model: dict[str, Any]) -> dict[str, Any]:
    copy: dict[str, Any] = json.loads(json.dumps(model))
    for item in copy.get("annotations", {}).get("list", []):
        for key in PROMETHEUS_ANNOTATION_OPTIONS:
            item.pop(key, None)
    return copy


def test_the_json_round_trips_through_grafanas_schema_model(dashboards: list[Dashboard]) -> None:
    """Decoded into grafana-foundation-sdk's Dashboard model (Grafana's schema) and back,
    unchanged but for the Prometheus annotation options the schema does not model."""
    sdk = pytest.importorskip("grafana_foundation_sdk.models.dashboard")
    encoder = pytest.importorskip("grafana_foundation_sdk.cog.encoder")
    for dashboard in dashboards:
        decoded = sdk.Dashboard.from_json(dashboard.model)
        assert json.loads(json.dumps(decoded, cls=encoder.JSONEncoder)) == (
            _without_prometheus_annotation_options(dashboard.model)), dashboard.name


def test_the_training_dashboards_mark_each_run_start_with_what_changed(
    dashboards: list[Dashboard],
) -> None:
    """Prometheus annotations on each Training overview only: the start of each run of
    the job (milliseconds, used as the marker's time) with the ledger's `changed` keys as
    text, and each run's end with the ledger's reason (clean ends apart from the rest);
    the other dashboards have none."""
    for dashboard in dashboards:
        annotations = dashboard.model.get("annotations", {}).get("list", [])
        if dashboard.kind != "training":
            assert not annotations, dashboard.name
            continue
        assert [a["name"] for a in annotations] == ["Run starts", "Run ends", "Run failures"], \
            dashboard.name
        runs, finishes, failures = annotations
        for end, matcher in ((finishes, 'reason="finished"'), (failures, 'reason!="finished"')):
            assert "trainmon_training_run_end_timestamp_seconds" in end["expr"], dashboard.name
            assert matcher in end["expr"] and "* 1000" in end["expr"], dashboard.name
            assert end["useValueForTime"] is True and end["enable"], dashboard.name
            assert "{{reason}}" in end["titleFormat"] and "{{run}}" in end["titleFormat"]
            assert set(end["tagKeys"].split(",")) == {"job", "run", "reason"}
        assert (finishes["iconColor"], failures["iconColor"]) == ("green", "red")
        assert runs["datasource"] == DATASOURCE_REF and runs["enable"], dashboard.name
        assert runs["useValueForTime"] is True, dashboard.name
        assert "trainmon_training_run_start_timestamp_seconds" in runs["expr"]
        assert "* 1000" in runs["expr"], "Grafana reads the value as milliseconds"
        assert "group_left (changed)" in runs["expr"] and "trainmon_training_run_changes_info" \
            in runs["expr"]
        assert "{{changed}}" in runs["textFormat"] and "{{run}}" in runs["titleFormat"]
        assert set(runs["tagKeys"].split(",")) == {"job", "run"}

"""The standing evaluation budget of the shipped rules (docs/alerts.md, "Evaluation cost").

At 1 000 nodes every group must evaluate within 20 % of its interval on one engine
(`python -m bench.fleet_scale --nodes 1000 --engines …`, docs/benchmarks.md). The fleet
benchmark measures that; these checks keep the shapes it found costly out of every later
rule, on both variants, without an engine:

* a subquery re-evaluates its inner expression at every step: it reads recorded series
  only (names with ``:``), apart from the few listed with their reason;
* a range of an hour or more over scraped series reads every sample in it at every
  evaluation: only in groups evaluated every 5 min or less often;
* a group evaluated less often than every 15 s delays its alerts by up to its interval:
  its alerts hold (``for``) at least 5 intervals, or fire without a hold within a minute;
* a series recorded every 5 min or less often is read over a range of at least two of its
  intervals (an instant selection would find it stale between two records);
* an annotation's ``query`` template runs once per alert instance, pending ones included,
  at every evaluation, and on vmalert each is a request to the engine: 3 228 pending
  sawtooth GPUs at 1 000 simulated nodes made 215 of the 250–320 queries a second the
  engine received, and every rule queued behind them. Not in alerts evaluated every 15 s, apart from those whose instances
  are few by construction, listed with their reason.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from alerts.generate import duration_ms
from testkit.metric_contract import metric_names
from tests.alerts.alerts_support.bundle import VARIANTS, rules_path

DEFAULT_INTERVAL_SECONDS = 15.0
LONG_RANGE_SECONDS = 3600.0
SLOW_GROUP_SECONDS = 300.0
HOLD_INTERVALS = 5
#: Subqueries over scraped series that stay, with why they are cheap enough (measured
#: in docs/benchmarks.md, "Rule evaluation").
SCRAPED_SUBQUERIES = {
    "UUID:dcgm_gpu_util_crossings:changes10m":
        "a comparison of one gauge per GPU, 40 steps; dcgm-exporter has no transition counter",
    "instance_id:trainmon_tencent_cvm_gpu_util_crossings:changes30m":
        "one Cloud Monitor series per CVM at 60 s resolution, 30 steps",
}

#: Alerts evaluated every 15 s whose annotations may run ``query``: each instance is rare.
ANNOTATION_QUERIES = {
    "TrainmonSpotReclaimScheduled":
        "one instance per node with a reclaim notice, minutes before the node goes away",
    "TrainmonThroughputRegression":
        "one instance per run more than 20 % below its config's best, not per rank or GPU",
    "TrainmonJobHung":
        "one instance per hung job, while it is hung (a page: it must name the rank at once)",
}
_ANNOTATION_QUERY = re.compile(r"\|\s*query\b")

_SUBQUERY = re.compile(r"\)\s*\[\s*([0-9a-z]+)\s*:\s*([0-9a-z]*)\s*\]")
_RANGE_SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*(?:\{[^}]*\})?\s*\[\s*([0-9a-z]+)\s*\]")


def seconds(text: str) -> float:
    return duration_ms(text) / 1000


def groups(variant: str) -> list[dict[str, Any]]:
    return list(yaml.safe_load(rules_path(variant).read_text())["groups"])


def interval(group: dict[str, Any]) -> float:
    return seconds(group["interval"]) if "interval" in group else DEFAULT_INTERVAL_SECONDS


def name(rule: dict[str, Any]) -> str:
    return str(rule.get("record") or rule["alert"])


def subqueries(expr: str) -> list[str]:
    """The inner expression of every subquery ``( … )[range:step]`` of ``expr``."""
    inner = []
    for match in _SUBQUERY.finditer(expr):
        depth, start = 0, match.start()
        for position in range(match.start(), -1, -1):
            depth += {")": 1, "(": -1}.get(expr[position], 0)
            if depth == 0:
                start = position
                break
        inner.append(expr[start + 1:match.start()])
    return inner


@pytest.mark.parametrize("variant", VARIANTS)
def test_subqueries_read_recorded_series(variant: str) -> None:
    for group in groups(variant):
        for rule in group["rules"]:
            for inner in subqueries(rule["expr"]):
                scraped = {m for m in metric_names(inner) if ":" not in m}
                assert not scraped or name(rule) in SCRAPED_SUBQUERIES, (
                    f"{group['name']}/{name(rule)}: a subquery over {sorted(scraped)}; record "
                    "the inner expression, or list it in SCRAPED_SUBQUERIES with its cost")


@pytest.mark.parametrize("variant", VARIANTS)
def test_long_ranges_over_scraped_series_only_in_slow_groups(variant: str) -> None:
    for group in groups(variant):
        for rule in group["rules"]:
            for metric, window in _RANGE_SELECTOR.findall(rule["expr"]):
                if ":" in metric or seconds(window) < LONG_RANGE_SECONDS:
                    continue
                assert interval(group) >= SLOW_GROUP_SECONDS, (
                    f"{group['name']}/{name(rule)}: {metric}[{window}] every "
                    f"{interval(group):g} s; record it in a group evaluated every "
                    f"{SLOW_GROUP_SECONDS:g} s or less often")


@pytest.mark.parametrize("variant", VARIANTS)
def test_slow_groups_delay_no_alert_much(variant: str) -> None:
    for group in groups(variant):
        every = interval(group)
        if every <= DEFAULT_INTERVAL_SECONDS:
            continue
        for rule in group["rules"]:
            if "alert" not in rule:
                continue
            hold = seconds(rule.get("for", "0s"))
            assert hold >= HOLD_INTERVALS * every or (hold == 0 and every <= 60), (
                f"{group['name']}/{name(rule)}: for {rule.get('for', '0s')} in a group "
                f"evaluated every {every:g} s")


@pytest.mark.parametrize("variant", VARIANTS)
def test_series_recorded_seldom_are_read_over_two_of_their_intervals(variant: str) -> None:
    seldom = {rule["record"]: interval(group) for group in groups(variant)
              if interval(group) >= SLOW_GROUP_SECONDS
              for rule in group["rules"] if "record" in rule}
    assert seldom, "no slow recording group left: drop this check"
    for group in groups(variant):
        for rule in group["rules"]:
            ranged = {m: seconds(w) for m, w in _RANGE_SELECTOR.findall(rule["expr"])}
            for metric in metric_names(rule["expr"]) & seldom.keys():
                assert ranged.get(metric, 0) >= 2 * seldom[metric], (
                    f"{group['name']}/{name(rule)} reads {metric}, recorded every "
                    f"{seldom[metric]:g} s, without a range of twice that")


@pytest.mark.parametrize("variant", VARIANTS)
def test_alerts_evaluated_often_run_no_query_per_instance(variant: str) -> None:
    for group in groups(variant):
        if interval(group) > DEFAULT_INTERVAL_SECONDS:
            continue
        for rule in group["rules"]:
            templates = " ".join(str(v) for v in (rule.get("annotations") or {}).values())
            if "alert" in rule and _ANNOTATION_QUERY.search(templates):
                assert name(rule) in ANNOTATION_QUERIES, (
                    f"{group['name']}/{name(rule)}: an annotation runs a query per alert "
                    "instance every 15 s; put what it reads in the expression, move the alert "
                    "to a group of a minute or more, or list it in ANNOTATION_QUERIES")


def test_the_checks_see_what_they_check() -> None:
    expr = "max_over_time((min_over_time(a[5m]) and b:c offset 5m)[10m:15s]) + d[1d]"
    assert subqueries(expr) == ["min_over_time(a[5m]) and b:c offset 5m"]
    assert _RANGE_SELECTOR.findall(expr) == [("a", "5m"), ("d", "1d")]
    assert seconds("1h30m") == 5400
    assert _ANNOTATION_QUERY.search('{{ with printf "up{x=\'%s\'}" $labels.x | query }}')
    assert not _ANNOTATION_QUERY.search("{{ $value | humanize }} queries")

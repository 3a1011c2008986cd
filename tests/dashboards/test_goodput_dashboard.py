"""The goodput panels of the committed dashboards: each bucket's links, the goodput line.

A panel that draws the goodput ledger's buckets as series (legend ``{{bucket}}``)
gives every bucket it draws — all ten of ``trainmon.ledger.goodput.BUCKETS``, or
the nine losses where it leaves ``productive`` out — a link to its runbook (the
address the alert rules' ``runbook_url`` use, a page of docs/runbooks/ and, where
the link names one, a section of it) and, on the GPU-hours dashboard, a link that
opens the panel of the same variant's Training overview or Fleet that shows the
bucket's cause. Goodput is drawn red below ``contract.GOODPUT_LOW_RATIO``, the
level of TrainmonLowGoodput.
"""

from __future__ import annotations

import itertools
import re
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

from testkit.dashboard_files import REPO, VARIANTS, Dashboard
from trainmon import contract
from trainmon.ledger.goodput import BUCKETS

RUNBOOKS = REPO / "docs" / "runbooks"
#: A query that draws only the losses.
BADPUT_ONLY = 'bucket!="productive"'
#: What the panel a bucket links to must read to show that bucket's cause.
CAUSE_SERIES = {
    "productive": "trainmon_training_samples_total",
    "data_wait": "trainmon_training_data_wait_seconds_total",
    "comm_exposed": "trainmon_training_comm_exposed_seconds_total",
    "checkpoint": "trainmon_training_last_checkpoint_duration_seconds",
    "straggler_wait": contract.STRAGGLER_RATIO_SERIES,
    "stalled": "trainmon_training_last_step_timestamp_seconds",
    "startup": "job_bucket:trainmon_job_gpu_seconds:rate10m",
    "idle_allocated": "trainmon_gpu_util_idle_samples_total",
    "lost_progress": "trainmon_training_last_checkpoint_timestamp_seconds",
    "other": "job_bucket:trainmon_job_gpu_seconds:rate10m",
}


def _runbook_base(variant: str) -> str:
    """Where the variant's alert rules point runbook_url, up to the page name."""
    rules = yaml.safe_load((REPO / "alerts" / variant / "trainmon.rules.yml").read_text())
    [url] = [rule["annotations"]["runbook_url"] for group in rules["groups"]
             for rule in group["rules"] if rule.get("alert") == "TrainmonLowGoodput"]
    assert url.endswith("/TrainmonLowGoodput.md"), url
    return url.removesuffix("TrainmonLowGoodput.md")


def _anchors(page: str) -> set[str]:
    """GitHub's anchors of the headings of a Markdown page."""
    headings = re.findall(r"^#+\s+(.+?)\s*$", page, re.M)
    return {re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", heading.lower())) for heading in headings}


def _bucket_panels(dashboard: Dashboard) -> list[dict[str, Any]]:
    return [panel for panel in dashboard.data_panels()
            if any(t.get("legendFormat") == "{{bucket}}" for t in panel.get("targets", []))]


def _series_links(panel: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Series name → the data links an override gives that series."""
    found = {}
    for override in panel.get("fieldConfig", {}).get("overrides", []):
        links = [p["value"] for p in override["properties"] if p["id"] == "links"]
        if links and override["matcher"]["id"] == "byName":
            found[override["matcher"]["options"]] = links[0]
    return found


def _panel_opened(url: str, dashboards: list[Dashboard], variant: str) -> tuple[str, dict[str, Any]]:
    """(dashboard kind, panel) that a ``/d/<uid>?…&viewPanel=<id>`` link opens."""
    parts = urlsplit(url)
    uid = parts.path.removeprefix("/d/")
    [target] = [d for d in dashboards if d.model["uid"] == uid]
    assert target.variant == variant, url
    assert {"${datasource:queryparam}", "${__url_time_range}"} <= set(parts.query.split("&"))
    [panel_id] = parse_qs(parts.query)["viewPanel"]
    [panel] = [p for p in target.data_panels() if p["id"] == int(panel_id)]
    return target.kind, panel


def test_every_bucket_a_panel_draws_links_its_runbook(dashboards: list[Dashboard]) -> None:
    checked = set()
    for dashboard in dashboards:
        base = _runbook_base(dashboard.variant)
        for panel in _bucket_panels(dashboard):
            where = f"{dashboard.name} · {panel['title']!r}"
            links = _series_links(panel)
            badput_only = all(BADPUT_ONLY in t["expr"] for t in panel["targets"])
            expected = [b for b in BUCKETS if not (badput_only and b == "productive")]
            assert sorted(links) == sorted(expected), where
            for bucket, bucket_links in links.items():
                runbooks = [link["url"] for link in bucket_links if link["url"].startswith(base)]
                assert len(runbooks) == 1, (where, bucket, bucket_links)
                page, _, anchor = runbooks[0].removeprefix(base).partition("#")
                assert (RUNBOOKS / page).is_file(), (where, bucket, page)
                if anchor:
                    assert anchor in _anchors((RUNBOOKS / page).read_text(encoding="utf-8")), (
                        where, bucket, runbooks[0])
                assert all(link["targetBlank"] for link in bucket_links
                           if link["url"].startswith("http")), (where, bucket)
            checked.add((dashboard.variant, dashboard.kind))
    assert checked == set(itertools.product(VARIANTS, ("training", "goodput"))), checked


def test_the_gpu_hours_buckets_open_the_panel_that_shows_their_cause(
    dashboards: list[Dashboard],
) -> None:
    """On the GPU-hours dashboard each bucket also links a panel of the same variant's
    Training overview or Fleet, which reads what that bucket's cause shows in."""
    opened = {}
    for dashboard in dashboards:
        if dashboard.kind != "goodput":
            continue
        panels = _bucket_panels(dashboard)
        assert len(panels) >= 3, dashboard.name
        for panel in panels:
            for bucket, bucket_links in _series_links(panel).items():
                [url] = [link["url"] for link in bucket_links if link["url"].startswith("/d/")]
                kind, target = _panel_opened(url, dashboards, dashboard.variant)
                title = next(link["title"] for link in bucket_links if link["url"] == url)
                assert title.endswith(f": {target['title']}"), (dashboard.name, bucket, title)
                exprs = " ".join(t["expr"] for t in target["targets"])
                assert CAUSE_SERIES[bucket] in exprs, (dashboard.name, bucket, target["title"])
                opened[(dashboard.variant, bucket)] = (kind, target["title"])
    assert {bucket for _, bucket in opened} == set(BUCKETS)
    assert opened[("dcgm", "data_wait")] == ("training", "Data-wait ratio per rank")
    assert opened[("dcgm", "idle_allocated")] == ("fleet", "Most idle GPUs")
    for bucket in BUCKETS:  # both variants link the same panels
        assert opened[("dcgm", bucket)] == opened[("tencent-cloud", bucket)], bucket


def test_goodput_is_red_below_the_contracts_ratio(dashboards: list[Dashboard]) -> None:
    """Every panel that shows a goodput ratio (its title says goodput, its unit is a
    ratio) has a red base and turns green at contract.GOODPUT_LOW_RATIO."""
    checked = []
    for dashboard in dashboards:
        for panel in dashboard.data_panels():
            defaults = panel.get("fieldConfig", {}).get("defaults", {})
            if "goodput" not in panel["title"].lower() or defaults.get("unit") != "percentunit":
                continue
            steps = defaults["thresholds"]["steps"]
            assert [(s["color"], s["value"]) for s in steps] == [
                ("red", None), ("green", contract.GOODPUT_LOW_RATIO)], (
                dashboard.name, panel["title"], steps)
            checked.append((dashboard.variant, dashboard.kind, panel["title"]))
    assert {(variant, kind) for variant, kind, _ in checked} == set(
        itertools.product(VARIANTS, ("training", "goodput"))), checked

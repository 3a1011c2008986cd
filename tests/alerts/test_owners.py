"""The shipped rules take a training job over nodes as (job, owner).

A job name may belong to different users on different nodes; every series of a
training job carries its owner (docs/security.md, "Owners across nodes"). So
every rule that reads such series and aggregates or joins by ``job`` keeps
``owner``, every query an alert's template runs for its job selects the owner
too, and Alertmanager groups by it. The promtool cases of alerts/tests/ show
the consequence (another user's stall on another node pages only for itself);
this checks every rule, including the ones those cases do not reach.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from tests.alerts.alerts_support.bundle import ALERTMANAGER_CONFIG, VARIANTS, rules_path

#: Series that carry a training job's ``job`` and ``owner`` as the daemons export them.
JOB_SERIES = re.compile(r"\b(?:trainmon_training_\w+|trainmon_job_\w+|trainmon_bottleneck"
                        r"|trainmon_diagnosis_(?!window_seconds)\w+)")
#: A label list of an aggregation or a join.
LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
#: A selector an alert's template fills in with the alert's job.
TEMPLATE_JOB = re.compile(r"job='%s'")


def rules(variant: str) -> list[dict[str, Any]]:
    document = yaml.safe_load(rules_path(variant).read_text(encoding="utf-8"))
    return [rule for group in document["groups"] for rule in group["rules"]]


def reads_a_job(expr: str, recorded: set[str]) -> bool:
    """Whether ``expr`` reads a training job's series, raw or recorded from them."""
    return bool(JOB_SERIES.search(expr)) or any(
        re.search(rf"(?<![\w:]){re.escape(name)}(?![\w:])", expr) for name in recorded)


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_rule_that_takes_a_job_keeps_its_owner(variant: str) -> None:
    recorded: set[str] = set()  # recording rules of job series, in evaluation order
    checked = 0
    for rule in rules(variant):
        expr = str(rule["expr"])
        name = rule.get("record") or rule["alert"]
        if not reads_a_job(expr, recorded):
            continue
        if "record" in rule:
            recorded.add(rule["record"])
        for labels in LABEL_LIST.findall(expr):
            names = {label.strip() for label in labels.split(",")}
            assert "job" not in names or "owner" in names, (name, labels)
            checked += 1
        for text in rule.get("annotations", {}).values():
            for selector in re.findall(r'printf "([^"]*)"', str(text)):
                if TEMPLATE_JOB.search(selector):
                    assert "owner='%s'" in selector, (name, selector)
    # the check reached the rules it is about
    assert {"job_rank:trainmon_training_collective_lag:max",
            "team_bucket:trainmon_job_gpu_seconds:rate1h",
            "job:trainmon_placement_zones:count"} <= recorded
    assert checked > 50, checked


def test_a_job_of_another_owner_is_another_notification_group() -> None:
    route = yaml.safe_load(ALERTMANAGER_CONFIG.read_text(encoding="utf-8"))["route"]
    assert {"job", "owner"} <= set(route["group_by"]), route["group_by"]

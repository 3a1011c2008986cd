"""One page per training job: the shipped Alertmanager routing groups the sawtooth
alerts of a job's GPUs, over all its nodes, into one notification that lists them.

The alerts posted are those ``alerts/tests/common.test.yml`` ("one sawtooth page per
training job") has the shipped rule fire: job ``llm`` of ``uid:1000`` on four GPUs of
two nodes, another owner's ``llm`` on a third node, and a GPU no training rank reports
from. A real Alertmanager with ``deploy/alertmanager/alertmanager.yml`` (receivers
pointed at a loopback sink) must page once for the job, with its four GPUs, and keep
the other owner's job and the unattributed GPU in pages of their own; the chat copies
follow the same groups, and the WeCom copy names the GPUs on one line.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from testkit.prometheus import wait_until
from tests.alerts.alerts_support.bundle import (
    ALERTMANAGER_CONFIG,
    REPO,
    VARIANTS,
    shipped_alerts,
)
from tests.alerts.alerts_support.stack import Alertmanager, WebhookSink, http_json

#: The pager route's group_wait is 10 s; a group's first notification comes within this.
NOTIFIED_WITHIN_SECONDS = 45.0
#: (instance, node, gpu, job, owner, rank) of each firing TrainmonGPUSawtooth.
FIRING = [
    ("node-a:19400", "node-a", "0", "llm", "uid:1000", "0"),
    ("node-a:19400", "node-a", "1", "llm", "uid:1000", "1"),
    ("node-b:19400", "node-b", "0", "llm", "uid:1000", "2"),
    ("node-b:19400", "node-b", "1", "llm", "uid:1000", "3"),
    ("node-c:19400", "node-c", "0", "llm", "uid:2000", "0"),
    ("node-b:19400", "node-b", "3", "trainmon", "", ""),
]


def sawtooth(instance: str, node: str, gpu: str, job: str, owner: str,
             rank: str) -> dict[str, Any]:
    labels = {"alertname": "TrainmonGPUSawtooth", "severity": "critical",
              "instance": instance, "node": node, "job": job, "gpu": gpu}
    if owner:
        labels.update(owner=owner, rank=rank)
    return {"labels": labels, "annotations": {
        "summary": f"GPU {gpu} on {instance} alternates between busy and idle."}}


def pages(sink: WebhookSink, path: str) -> list[list[tuple[str, ...]]]:
    """Each notification to ``path``: its alerts' (job, owner, instance, gpu, rank)."""
    return [
        [tuple(alert["labels"].get(key, "") for key in ("job", "owner", "instance", "gpu",
                                                         "rank"))
         for alert in notification.body["alerts"]]
        for notification in sink.received(path)
    ]


@pytest.mark.integration
def test_a_starved_jobs_gpus_on_two_nodes_page_once_listing_them(
    alertmanager: Alertmanager, sink: WebhookSink,
) -> None:
    alertmanager.post_alerts([sawtooth(*fields) for fields in FIRING])
    wait_until(lambda: len(sink.received("/pager/")) >= 3
               and len(sink.received("/chat/webhook")) >= 3
               and len(sink.received("/chat/wechat/message/send")) >= 3,
               NOTIFIED_WITHIN_SECONDS, "the pages and their chat copies")
    # Alertmanager re-notifies a group only when its alerts change or after
    # repeat_interval: each group below holds all of its alerts, so these are all.
    groups = {
        tuple(group["labels"].get(key, "") for key in ("alertname", "job", "owner", "node")):
            len(group["alerts"])
        for group in http_json("GET", f"{alertmanager.url}/api/v2/alerts/groups")
        if group["receiver"]["name"] == "pager"
    }
    paged = pages(sink, "/pager/")
    job_page = next(page for page in paged if page[0][:2] == ("llm", "uid:1000"))
    assert sorted(job_page) == sorted(
        (job, owner, instance, gpu, rank) for instance, _, gpu, job, owner, rank in FIRING
        if owner == "uid:1000")
    assert sorted(map(sorted, paged)) == sorted([
        sorted(job_page),
        [("llm", "uid:2000", "node-c:19400", "0", "0")],
        [("trainmon", "", "node-b:19400", "3", "")],
    ])
    assert groups == {
        ("TrainmonGPUSawtooth", "llm", "uid:1000", ""): 4,
        ("TrainmonGPUSawtooth", "llm", "uid:2000", ""): 1,
        ("", "trainmon", "", "node-b"): 1,
    }
    # the chat copies: the same three groups, the WeCom one listing the job's GPUs
    assert sorted(map(sorted, pages(sink, "/chat/webhook"))) == sorted(map(sorted, paged))
    messages = [notification.body["text"]["content"]
                for notification in sink.received("/chat/wechat/message/send")]
    assert len(messages) == 3
    job_message = next(text for text in messages if "[FIRING:4]" in text)
    assert job_message.startswith("[FIRING:4] TrainmonGPUSawtooth · job llm\n")
    gpus = next(line for line in job_message.splitlines() if line.startswith("GPUs: "))
    assert sorted(gpus.removeprefix("GPUs: ").split(", ")) == [
        "0 (rank 0) on node-a", "0 (rank 2) on node-b", "1 (rank 1) on node-a",
        "1 (rank 3) on node-b"]
    assert len(job_message.encode()) <= 2048  # WeCom's limit for one message


def seconds(duration: str) -> int:
    """A Prometheus/Alertmanager duration such as ``5m`` or ``1m30s`` in seconds."""
    units = {"h": 3600, "m": 60, "s": 1}
    parts = re.findall(r"(\d+)([hms])", duration)
    assert "".join(number + unit for number, unit in parts) == duration, duration
    return sum(int(number) * units[unit] for number, unit in parts)


def test_the_docs_say_when_the_first_page_comes_as_the_files_set_it() -> None:
    """The README, docs/alerts.md and docs/deploy.md give the sawtooth rule's ``for``
    plus the pager route's ``group_wait``, in words and as their sum."""
    [held] = {rule["for"] for variant in VARIANTS for rule in shipped_alerts(variant)
              if rule["alert"] == "TrainmonGPUSawtooth"}
    route = yaml.safe_load(ALERTMANAGER_CONFIG.read_text(encoding="utf-8"))["route"]
    [pager] = [child for child in route["routes"] if child.get("receiver") == "pager"]
    group_wait = seconds(pager["group_wait"])
    assert all("group_wait" not in child for child in pager.get("routes", []))
    total = seconds(held) + group_wait
    minutes, rest = divmod(total, 60)
    said = f"{minutes} min {rest} s" if rest else f"{minutes} min"
    for path in ("README.md", "docs/alerts.md", "docs/deploy.md"):
        text = " ".join((REPO / path).read_text(encoding="utf-8").split())
        assert f"{said} after the daemon" in text, path
        assert f"`for: {held}`" in text and f"`group_wait: {pager['group_wait']}`" in text, path

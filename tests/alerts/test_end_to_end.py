"""A saw-toothing GPU pages someone: the demo daemon → Prometheus → Alertmanager → webhook.

Everything is real and shipped: ``trainmon serve --demo`` (GPUs 0–3 saw-tooth,
4–7 run steady), Prometheus loading ``alerts/dcgm/trainmon.rules.yml`` with
every duration × 0.05 (``alerts/generate.py scale``, so ``for: 5m`` becomes
15 s), and Alertmanager with ``deploy/alertmanager/alertmanager.yml`` whose
receivers ``alerts/retarget_receivers.py`` pointed at a loopback sink. The
sink plays the on-call webhook and 企业微信 (WeCom)'s API.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.daemon import Daemon
from testkit.prometheus import Prometheus, wait_until
from tests.alerts.alerts_support.bundle import rules_path, run_script
from tests.alerts.alerts_support.stack import ALERTING_PROMETHEUS_FLAGS, Alertmanager, WebhookSink

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TIME_SCALE = "0.05"
SAWTOOTH_GPUS = {"0", "1", "2", "3"}
STEADY_GPUS = {"4", "5", "6", "7"}
#: The whole chain must deliver within this (rule `for` 15 s + group_wait 10 s + scrapes).
PAGE_DEADLINE_SECONDS = 120.0


def test_sawtooth_gpus_page_and_steady_gpus_never_do(
    tmp_path: Path,
    start_daemon: Callable[..., Daemon],
    sink: WebhookSink,
    alertmanager: Alertmanager,
    prometheus: Prometheus,
) -> None:
    started = time.monotonic()
    daemon = start_daemon(args=["--demo"])
    instance = f"127.0.0.1:{daemon.port}"

    scaled_rules = tmp_path / "trainmon.rules.yml"
    scaled = run_script(
        "alerts/generate.py", "scale", "--factor", TIME_SCALE, str(rules_path("dcgm")),
        str(scaled_rules),
    )
    assert scaled.returncode == 0, scaled.stderr
    prometheus.start({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(scaled_rules)],
        "alerting": {"alertmanagers": [
            {"static_configs": [{"targets": [f"127.0.0.1:{alertmanager.port}"]}]},
        ]},
        # honor_labels: the training series keep their own job (docs/alerts.md)
        "scrape_configs": [{
            "job_name": "trainmon",
            "honor_labels": True,
            "static_configs": [{"targets": [instance], "labels": {"node": "demo-node"}}],
        }],
    }, flags=ALERTING_PROMETHEUS_FLAGS)

    def paged_gpus() -> set[str]:
        return {
            alert["labels"].get("gpu", "")
            for _, alert in sink.paged()
            if alert["labels"]["alertname"] == "TrainmonGPUSawtooth"
        }

    remaining = PAGE_DEADLINE_SECONDS - (time.monotonic() - started)
    wait_until(
        lambda: paged_gpus() >= SAWTOOTH_GPUS, remaining,
        f"pages for GPUs 0-3 (paged so far: {sorted(paged_gpus())}); "
        f"prometheus log:\n{prometheus.log()}\nalertmanager log:\n{alertmanager.log()}",
    )

    # One page for the starved job, listing its four GPUs (Alertmanager groups a
    # training job's alerts by alertname, job and owner), not one page per GPU.
    sawtooth_pages = [
        notification.body["alerts"] for notification in sink.received("/pager/")
        if any(alert["labels"]["alertname"] == "TrainmonGPUSawtooth"
               for alert in notification.body["alerts"])
    ]
    assert len(sawtooth_pages) == 1, sawtooth_pages
    assert {alert["labels"]["gpu"] for alert in sawtooth_pages[0]} == SAWTOOTH_GPUS

    # Which training rank holds each GPU, as Prometheus sees it (empty if no
    # client reports): the page must name that job and rank.
    ranks = {
        sample["metric"]["gpu"]: sample["metric"]
        for sample in prometheus.query('trainmon_training_rank_info{gpu!=""}')
    }
    for payload, alert in sink.paged():
        labels, annotations = alert["labels"], alert["annotations"]
        assert payload["receiver"] == "pager"
        assert labels["alertname"] == "TrainmonGPUSawtooth", labels
        gpu = labels["gpu"]
        assert gpu in SAWTOOTH_GPUS, f"a steady GPU paged: {labels}"
        assert labels["severity"] == "critical"
        assert labels["instance"] == instance and labels["node"] == "demo-node"
        if gpu in ranks:
            assert (labels["job"], labels["rank"]) == (ranks[gpu]["job"], ranks[gpu]["rank"])
        else:
            assert labels["job"] == "trainmon" and "rank" not in labels
        assert annotations["summary"] == (
            f"GPU {gpu} on {instance} alternates between busy and idle."
        )
        assert f"The utilization of GPU {gpu} on {instance} saw-tooths" in annotations["description"]
        assert "sawtooth ratio " in annotations["description"]
        assert annotations["runbook_url"].endswith("/docs/runbooks/TrainmonGPUSawtooth.md")
        assert alert["status"] == "firing"

    # The chat channel gets the page too, through the native WeCom integration
    # rendered with the shipped template.
    def wecom_messages() -> list[str]:
        return [
            notification.body["text"]["content"]
            for notification in sink.received("/chat/wechat/message/send")
        ]

    wait_until(
        lambda: any("TrainmonGPUSawtooth" in text for text in wecom_messages()),
        max(5.0, PAGE_DEADLINE_SECONDS + 30 - (time.monotonic() - started)),
        "the WeCom copy of the page",
    )
    message = next(text for text in wecom_messages() if "TrainmonGPUSawtooth" in text)
    assert "[FIRING:" in message and "Runbook: https://" in message
    if ranks.keys() >= SAWTOOTH_GPUS:  # the job's page: its GPUs on one line
        assert message.startswith("[FIRING:4] TrainmonGPUSawtooth · job demo-starved"), message
        gpus = next(line for line in message.splitlines() if line.startswith("GPUs: "))
        assert sorted(gpus.removeprefix("GPUs: ").split(", ")) == sorted(
            f"{gpu} (rank {ranks[gpu]['rank']})" for gpu in SAWTOOTH_GPUS)

    # Steady GPUs never even went pending, although their series were there.
    steady = prometheus.query('trainmon_gpu_sawtooth_ratio{gpu=~"4|5|6|7"}')
    assert {sample["metric"]["gpu"] for sample in steady} == STEADY_GPUS
    assert prometheus.query(
        'max_over_time(ALERTS{alertname="TrainmonGPUSawtooth",gpu=~"4|5|6|7"}[10m])'
    ) == []
    assert all(
        alert["labels"].get("gpu") not in STEADY_GPUS
        for notification in sink.notifications
        if isinstance(notification.body, dict) and "alerts" in notification.body
        for alert in notification.body["alerts"]
        if alert["labels"]["alertname"].startswith("TrainmonGPUSawtooth")
    )

"""A scheduled spot reclaim pages: metadata service → daemon → Prometheus → Alertmanager → pager.

Everything below the rules is real: the loopback fake of the CVM metadata
service (``testkit/fake_tencent_metadata.py``, a ``SPOTPAID`` instance)
that ``collectors.platform.metadata_url`` points at, ``trainmon serve`` polling
it every second, two ranks of a training job reporting through the real
client, Prometheus loading ``alerts/dcgm/trainmon.rules.yml`` (time-scaled as
in ``test_end_to_end.py``; ``TrainmonSpotReclaimScheduled`` has no ``for``),
and Alertmanager with the shipped ``deploy/alertmanager/alertmanager.yml``
whose receivers point at a loopback sink. The page must name the job on the
node; a cancelled reclaim must clear the alert.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.daemon import Daemon
from testkit.fake_tencent_metadata import FakeMetadata
from testkit.prometheus import Prometheus, wait_until
from testkit.workloads import Workload, ranks
from tests.alerts.alerts_support.bundle import rules_path, run_script
from tests.alerts.alerts_support.stack import ALERTING_PROMETHEUS_FLAGS, Alertmanager, WebhookSink

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ALERT = "TrainmonSpotReclaimScheduled"
JOB = "llm-spot"
NODE = "spot-node-1"
#: Tencent Cloud announces a reclaim about two minutes ahead.
NOTICE_SECONDS = 120
#: Spot poll 1 s + scrape 1 s + evaluation 1 s + the pager route's group_wait 10 s.
PAGE_DEADLINE_SECONDS = 60.0


def test_a_scheduled_spot_reclaim_pages_with_the_jobs_on_the_node(
    tmp_path: Path,
    start_daemon: Callable[..., Daemon],
    workload: Callable[[str], Workload],
    sink: WebhookSink,
    alertmanager: Alertmanager,
    prometheus: Prometheus,
) -> None:
    with FakeMetadata(instance_id="ins-spot0001", zone="ap-shanghai-5",
                      charge_type="SPOTPAID") as metadata:
        daemon = start_daemon(config={"collectors": {
            "gpu": {"enabled": False},
            "platform": {"metadata_url": metadata.url, "spot_interval_seconds": 1,
                         "timeout_seconds": 0.5},
        }})
        instance = f"127.0.0.1:{daemon.port}"
        workload(daemon.url).job(ranks(JOB, [0, 1], wait=0.01, compute=0.02, comm=0.01))

        scaled_rules = tmp_path / "trainmon.rules.yml"
        scaled = run_script("alerts/generate.py", "scale", "--factor", "0.05",
                            str(rules_path("dcgm")), str(scaled_rules))
        assert scaled.returncode == 0, scaled.stderr
        prometheus.start({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s",
                       "evaluation_interval": "1s"},
            "rule_files": [str(scaled_rules)],
            "alerting": {"alertmanagers": [
                {"static_configs": [{"targets": [f"127.0.0.1:{alertmanager.port}"]}]},
            ]},
            "scrape_configs": [{
                "job_name": "trainmon",
                "honor_labels": True,
                "static_configs": [{"targets": [instance], "labels": {"node": NODE}}],
            }],
        }, flags=ALERTING_PROMETHEUS_FLAGS)

        # The node is a spot instance with its job running, and nothing is scheduled.
        wait_until(
            lambda: bool(prometheus.query(f'trainmon_training_steps_total{{job="{JOB}"}}'))
            and bool(prometheus.query("trainmon_node_spot_instance == 1")),
            30.0, f"the job and the spot instance in Prometheus; daemon log:\n{daemon.log()}",
        )
        assert prometheus.query(f'ALERTS{{alertname="{ALERT}"}}') == []

        at = int(time.time()) + NOTICE_SECONDS
        metadata.schedule_reclaim(at)
        scheduled = time.monotonic()
        wait_until(
            lambda: bool(sink.paged(ALERT)), PAGE_DEADLINE_SECONDS,
            f"a page for {ALERT}; prometheus log:\n{prometheus.log()}\n"
            f"alertmanager log:\n{alertmanager.log()}",
        )
        assert time.monotonic() - scheduled < NOTICE_SECONDS / 2, "paged too late to act on"

        payload, alert = sink.paged(ALERT)[0]
        labels, annotations = alert["labels"], alert["annotations"]
        assert payload["receiver"] == "pager"
        assert alert["status"] == "firing"
        assert labels["severity"] == "critical"
        assert (labels["node"], labels["instance"], labels["job"]) == (NODE, instance, "trainmon")
        assert annotations["summary"] == (
            f"Spot instance {NODE} will be reclaimed — checkpoint now."
        )
        description = annotations["description"]
        assert description.startswith(
            f"The cloud reclaims spot instance {NODE} ({instance}) in 1m "), description
        assert f"Training jobs on the node: {JOB}; checkpoint them now" in description
        assert annotations["runbook_url"].endswith(f"/docs/runbooks/{ALERT}.md")
        # Prometheus sees the exact time the metadata service announced.
        (reclaim,) = prometheus.query("trainmon_node_spot_termination_timestamp_seconds")
        assert float(reclaim["value"][1]) == at

        # The cloud cancels the reclaim: the series goes, and the alert with it.
        metadata.cancel_reclaim()
        wait_until(
            lambda: prometheus.query(f'ALERTS{{alertname="{ALERT}"}}') == [], 30.0,
            f"{ALERT} to resolve after the cancellation",
        )
        assert prometheus.query("trainmon_node_spot_termination_timestamp_seconds") == []
    assert "Traceback" not in daemon.log()

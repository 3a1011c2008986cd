"""The shipped Alertmanager configuration: valid, routed and inhibited as documented.

amtool checks the file and its routing offline; a real Alertmanager (with the
receivers pointed at a loopback sink) shows which alerts the inhibit rules
silence.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml

from testkit.prometheus import require, wait_until
from tests.alerts.alerts_support.bundle import ALERTMANAGER_CONFIG, VARIANTS, shipped_alerts
from tests.alerts.alerts_support.stack import AMTOOL, Alertmanager, WebhookSink

pytestmark = pytest.mark.integration


def amtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require(AMTOOL), *args], capture_output=True, text=True, timeout=60
    )


def routes_test(labels: Mapping[str, str], expected: str | None = None) -> subprocess.CompletedProcess[str]:
    args = ["config", "routes", "test", f"--config.file={ALERTMANAGER_CONFIG}"]
    if expected is not None:
        args.append(f"--verify.receivers={expected}")
    return amtool(*args, *(f"{name}={value}" for name, value in labels.items()))


def test_amtool_check_config_accepts_the_shipped_file_and_its_templates() -> None:
    result = amtool("check-config", str(ALERTMANAGER_CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    assert "1 templates" in result.stdout and "5 inhibit rules" in result.stdout


def test_the_sawtooth_page_reaches_the_pager_and_a_copy_the_chat() -> None:
    labels = {"alertname": "TrainmonGPUSawtooth", "severity": "critical", "gpu": "0",
              "job": "resnet", "instance": "node-a:19400"}
    result = routes_test(labels, expected="pager,chat")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "pager,chat"


def test_a_warning_does_not_reach_the_pager() -> None:
    labels = {"alertname": "TrainmonDataLoaderBottleneck", "severity": "warning",
              "job": "resnet", "instance": "node-a:19400"}
    assert routes_test(labels).stdout.strip() == "chat"
    refused = routes_test(labels, expected="pager")
    assert refused.returncode != 0
    assert "did not match" in refused.stdout + refused.stderr


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_shipped_alert_is_routed_by_its_severity(variant: str) -> None:
    for rule in shipped_alerts(variant):
        severity = rule["labels"]["severity"]
        expected = "pager,chat" if severity == "critical" else "chat"
        result = routes_test({"alertname": rule["alert"], "severity": severity}, expected)
        assert result.returncode == 0, f"{rule['alert']}: {result.stdout}{result.stderr}"


def test_retargeted_copy_points_every_receiver_at_the_sink(
    retargeted_alertmanager_config: Path, sink: WebhookSink
) -> None:
    config = yaml.safe_load(retargeted_alertmanager_config.read_text())
    receivers = {receiver["name"]: receiver for receiver in config["receivers"]}
    assert receivers["pager"]["webhook_configs"][0]["url"] == f"{sink.url}/pager/webhook"
    assert receivers["chat"]["webhook_configs"][0]["url"] == f"{sink.url}/chat/webhook"
    assert receivers["chat"]["wechat_configs"][0]["api_url"] == f"{sink.url}/chat/wechat/"
    assert config["global"]["wechat_api_url"].startswith(sink.url)
    shipped = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    assert config["route"] == shipped["route"]
    assert config["inhibit_rules"] == shipped["inhibit_rules"]
    result = amtool("check-config", str(retargeted_alertmanager_config))
    assert result.returncode == 0, result.stdout + result.stderr


def _alert(**labels: str) -> dict[str, object]:
    return {"labels": labels, "annotations": {"summary": labels["alertname"]}}


def test_inhibitions_silence_the_consequences_and_nothing_else(alertmanager: Alertmanager) -> None:
    node_a, node_b = "node-a:19400", "node-b:19400"
    alerts = {
        # node-a's daemon is down: its GPU and training alerts are consequences
        "exporter-down": _alert(alertname="TrainmonExporterDown", severity="warning",
                                job="trainmon", instance=node_a),
        "a-sawtooth": _alert(alertname="TrainmonGPUSawtooth", severity="critical",
                             job="trainmon", instance=node_a, gpu="0"),
        "a-stalled": _alert(alertname="TrainmonTrainingStalled", severity="critical",
                            job="bert", instance=node_a),
        # node-b: GPU 0 of job resnet saw-tooths, which explains resnet's data wait there
        "b-sawtooth": _alert(alertname="TrainmonGPUSawtooth", severity="critical",
                             job="resnet", rank="0", instance=node_b, gpu="0"),
        "b-resnet-loader": _alert(alertname="TrainmonDataLoaderBottleneck", severity="warning",
                                  job="resnet", instance=node_b),
        "b-bert-loader": _alert(alertname="TrainmonDataLoaderBottleneck", severity="warning",
                                job="bert", instance=node_b),
        "c-resnet-loader": _alert(alertname="TrainmonDataLoaderBottleneck", severity="warning",
                                  job="resnet", instance="node-c:19400"),
        # node-b's GPU 1 is lost: its throttling alert is a consequence, GPU 2's is not
        "b-lost": _alert(alertname="TrainmonGPULost", severity="critical",
                         job="trainmon", instance=node_b, gpu="1"),
        "b1-throttled": _alert(alertname="TrainmonGPUThrottled", severity="warning",
                               job="trainmon", instance=node_b, gpu="1", reason="thermal"),
        "b2-throttled": _alert(alertname="TrainmonGPUThrottled", severity="warning",
                               job="trainmon", instance=node_b, gpu="2", reason="thermal"),
    }
    expected_silenced = {"a-sawtooth", "a-stalled", "b-resnet-loader", "b1-throttled"}
    alertmanager.post_alerts(list(alerts.values()))

    def silenced() -> set[str]:
        states = {}
        for alert in alertmanager.alerts():
            for key, posted in alerts.items():
                if alert["labels"] == posted["labels"]:
                    states[key] = alert["status"]["state"]
        if len(states) < len(alerts):
            return set()
        return {key for key, state in states.items() if state == "suppressed"}

    try:
        wait_until(lambda: silenced() == expected_silenced, 15,
                   f"inhibited = {sorted(expected_silenced)}")
    except AssertionError as error:  # name the state the wait ended on, read after it
        raise AssertionError(f"{error} (last: {sorted(silenced())})") from None

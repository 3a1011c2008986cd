"""``trainmon serve`` with the tencent collector, against the fake API, end to end."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from testkit.fake_tencent_api import FakeTencentCloud
from tests.tencent.tencent_support import SECRET_ID, SECRET_KEY
from trainmon.tencent.catalogue import CATALOGUE, TargetKind

pytestmark = pytest.mark.integration


def trainmon_command() -> list[str]:
    return [sys.executable, "-m", "trainmon"]


@pytest.fixture
def live_cloud() -> Iterator[FakeTencentCloud]:
    """The fake on the real clock, as a separate process will sign with it."""
    with FakeTencentCloud(time.time) as fake:
        fake.add_account(SECRET_ID, SECRET_KEY)
        yield fake


def test_serve_exposes_the_fakes_values(
    live_cloud: FakeTencentCloud, start_daemon: Callable[..., Any]
) -> None:
    fleet = live_cloud.add_fleet("ap-shanghai", 12, disks_per_instance=1)
    daemon = start_daemon(
        config={"collectors": {"tencent": {
            "enabled": True,
            "endpoint": live_cloud.url,
            "region": "ap-shanghai",
            "secret_id": SECRET_ID,
            "secret_key": "${TRAINMON_TEST_TENCENT_KEY}",
            "metadata_url": "http://127.0.0.1:9",
        }}},
        env={"TRAINMON_TEST_TENCENT_KEY": SECRET_KEY},
    )
    expected_calls = 12 * 2 + 6 * 2  # 12 CVM metrics × 2 batches, 6 CBS metrics × 2 batches
    deadline = time.monotonic() + 30
    while live_cloud.count("GetMonitorData") < expected_calls and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.3)  # the last answers are being stored
    assert live_cloud.count("GetMonitorData") == expected_calls
    assert live_cloud.count(code="RequestLimitExceeded") == 0

    text = daemon.metrics()
    exposed = {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    requests = {r.params["MetricName"].lower(): r.params for r in live_cloud.records
                if r.action == "GetMonitorData"}
    for spec in CATALOGUE:
        request = requests[spec.tencent_name.lower()]
        latest = datetime.fromisoformat(request["EndTime"]).timestamp() - request["Period"]
        for instance in fleet:
            if spec.kind is TargetKind.INSTANCE:
                dims = {"InstanceId": instance.instance_id}
                labels = {"instance_id": instance.instance_id, "region": "ap-shanghai"}
            else:
                disk = f"disk-{instance.instance_id}-0"
                dims = {"diskId": disk}
                labels = {"disk_id": disk, "instance_id": instance.instance_id,
                          "region": "ap-shanghai"}
            value = spec.convert(live_cloud.value(request["MetricName"], dims, latest))
            assert exposed[(spec.name, frozenset(labels.items()))] == pytest.approx(value)
    assert exposed[("trainmon_collector_success", frozenset({("collector", "tencent")}))] == 1

    status, body = daemon.get("/healthz")
    assert status == 200
    tencent = json.loads(body)["collectors"]["tencent"]
    assert tencent["puller_state"] == "ok" and tencent["instances"] == 12
    assert SECRET_KEY not in body and SECRET_KEY not in text
    assert daemon.stop() == 0
    assert SECRET_KEY not in daemon.log()


def test_check_config_validates_the_tencent_section(tmp_path: Path) -> None:
    good = tmp_path / "good.yml"
    good.write_text(yaml.safe_dump({"collectors": {"tencent": {
        "enabled": True, "region": "ap-shanghai", "discovery_tags": {"team": "training"},
    }}}))
    result = subprocess.run([*trainmon_command(), "check-config", str(good)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "tencent" in result.stdout

    pasted = tmp_path / "pasted.yml"
    pasted.write_text(yaml.safe_dump({"collectors": {"tencent": {
        "enabled": True, "secret_id": "AKIDx", "secret_key": "pasted-secret-value",
    }}}))
    result = subprocess.run([*trainmon_command(), "check-config", str(pasted)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "collectors.tencent.secret_key: must be a ${VAR} reference" in result.stderr
    assert "pasted-secret-value" not in result.stderr + result.stdout

"""A real ``trainmon serve`` whose ``collectors.platform.metadata_url`` points at the fake."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from testkit.daemon import Daemon
from testkit.exposition import Scrape, parse
from testkit.fake_tencent_metadata import FakeMetadata

RECLAIM = "trainmon_node_spot_termination_timestamp_seconds"


def wait_for(daemon: Daemon, ready: Callable[[Scrape], bool], timeout: float = 15.0) -> Scrape:
    deadline = time.monotonic() + timeout
    while True:
        result = parse(daemon.metrics())
        if ready(result) or time.monotonic() > deadline:
            return result
        time.sleep(0.2)


def test_daemon_exports_identity_reclaim_and_metadata_faults(
    start_daemon: Callable[..., Daemon],
) -> None:
    with FakeMetadata(instance_id="ins-7k2m9q1x", zone="ap-shanghai-8") as fake:
        fake.slow_seconds = 1.5
        daemon = start_daemon(config={"collectors": {
            "gpu": {"enabled": False},
            "platform": {"metadata_url": fake.url, "spot_interval_seconds": 1,
                         "timeout_seconds": 0.4, "labels": {"leaf": "leaf-07", "rack": "r12"}},
        }})
        result = wait_for(daemon, lambda r: "trainmon_node_info" in r.samples)
        assert result.labelsets("trainmon_node_info") == [{
            "provider": "tencent", "instance_id": "ins-7k2m9q1x",
            "instance_type": "GT4.41XLARGE948", "region": "ap-shanghai", "zone": "ap-shanghai-8",
            "leaf": "leaf-07", "rack": "r12",
        }]
        assert result.value("trainmon_node_spot_instance") == 1
        assert result.value("trainmon_collector_success", collector="platform") == 1
        assert RECLAIM not in result.samples

        at = float(int(time.time()) + 120)
        fake.schedule_reclaim(at)
        result = wait_for(daemon, lambda r: RECLAIM in r.samples)
        assert result.value(RECLAIM) == at

        fake.fault = "slow"
        result = wait_for(daemon, lambda r: r.value("trainmon_platform_metadata_up") == 0)
        assert result.value("trainmon_platform_metadata_up") == 0
        assert (result.value("trainmon_platform_metadata_errors_total", reason="timeout") or 0) >= 1
        assert result.value(RECLAIM) == at  # announced, not yet passed: kept
        status, body = daemon.get("/healthz")
        assert status == 200
        platform = json.loads(body)["collectors"]["platform"]
        assert platform["provider"] == "tencent" and platform["instance_id"] == "ins-7k2m9q1x"
        assert platform["metadata_up"] is False
        assert platform["last_error"].startswith("timeout")

        fake.fault = None
        fake.cancel_reclaim()
        result = wait_for(daemon, lambda r: RECLAIM not in r.samples)
        assert RECLAIM not in result.samples
        assert result.value("trainmon_platform_metadata_up") == 1
        assert daemon.stop() == 0
    assert "Traceback" not in daemon.log()


def test_daemon_on_a_self_hosted_node(start_daemon: Callable[..., Daemon]) -> None:
    daemon = start_daemon(config={"collectors": {
        "gpu": {"enabled": False},
        "platform": {"provider": "self-hosted", "labels": {"zone": "dc1", "leaf": "leaf-03"}},
    }})
    result = wait_for(daemon, lambda r: "trainmon_node_info" in r.samples)
    assert result.labelsets("trainmon_node_info") == [{
        "provider": "self-hosted", "instance_id": "", "instance_type": "", "region": "",
        "zone": "dc1", "leaf": "leaf-03",
    }]
    assert result.value("trainmon_node_spot_instance") == 0
    assert "trainmon_platform_metadata_up" not in result.samples

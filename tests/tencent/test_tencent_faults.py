"""Faults of the API, each surfacing in the self-metrics, the logs and /healthz."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable

import pytest

from testkit.fake_tencent_api import FakeClock, FakeTencentCloud
from tests.tencent.tencent_support import SECRET_KEY, exposition, named, samples
from trainmon.collectors.tencent import TencentCollector
from trainmon.core.collector import CollectorUnavailable
from trainmon.tencent.planning import window

MakeCollector = Callable[..., TencentCollector]
METRIC = "trainmon_tencent_cvm_gpu_power_watts"


def errors(collector: TencentCollector) -> dict[tuple[str, str], float]:
    found = named(samples(collector), "trainmon_tencent_api_errors_total")
    return {(dict(k)["action"], dict(k)["code"]): v for k, v in found.items()}


def refresh_success(collector: TencentCollector) -> float:
    return samples(collector)[("trainmon_tencent_refresh_success", frozenset())]


def assert_values_correct(cloud: FakeTencentCloud, clock: FakeClock,
                          collector: TencentCollector) -> None:
    latest = window(clock(), 60, 120, 5)[2]
    exposed = named(samples(collector), METRIC)
    assert len(exposed) == len(cloud.instances)
    for instance in cloud.instances:
        labels = frozenset({("instance_id", instance.instance_id), ("region", "ap-shanghai")})
        assert exposed[labels] == cloud.value("GpuPowDraw", {"InstanceId": instance.instance_id},
                                              latest)


@pytest.fixture
def fleet_collector(cloud: FakeTencentCloud, make_collector: MakeCollector) -> TencentCollector:
    """25 instances, one metric: three GetMonitorData calls per refresh."""
    fleet = cloud.add_fleet("ap-shanghai", 25)
    return make_collector(instances=[i.instance_id for i in fleet], metrics=["GpuPowDraw"],
                          request_timeout_seconds=0.5)


def test_wrong_key_fails_fast_and_never_shows_the_secret(
    cloud: FakeTencentCloud, make_collector: MakeCollector, caplog: pytest.LogCaptureFixture
) -> None:
    cloud.add_fleet("ap-shanghai", 25)
    wrong = "wrong-" + SECRET_KEY
    collector = make_collector(environ={"TEST_TENCENT_SECRET_KEY": wrong},
                               instances=[i.instance_id for i in cloud.instances],
                               metrics=["GpuUtil", "CPUUsage"])
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            report = collector.refresh()
            assert report.aborted is not None
    # one failed call per refresh, no retries: DescribeBaseMetrics is the first call
    assert cloud.count() == 3
    assert cloud.count(code="AuthFailure.SignatureFailure") == 3
    assert errors(collector) == {("DescribeBaseMetrics", "AuthFailure.SignatureFailure"): 3}
    assert refresh_success(collector) == 0
    health = collector.health()
    assert health["puller_state"] == "auth_failed"
    assert "AuthFailure.SignatureFailure" in str(health["puller_error"])
    assert "AuthFailure.SignatureFailure" in caplog.text
    logged_once = [r for r in caplog.records if "SignatureFailure" in r.getMessage()]
    assert len(logged_once) == 1  # repeated errors are rate-limited
    text = exposition(collector)
    for secret in (wrong, SECRET_KEY):
        assert secret not in caplog.text
        assert secret not in text
        assert secret not in json.dumps(health)
        assert secret not in repr(collector._config)


def test_key_revoked_mid_refresh_costs_at_most_one_call_per_worker(
    cloud: FakeTencentCloud, fleet_collector: TencentCollector
) -> None:
    cloud.add_fleet("ap-shanghai", 75, prefix="more")
    collector = fleet_collector
    collector.refresh()
    calls = cloud.count("GetMonitorData")
    cloud.accounts.clear()  # the key was deleted in the console
    collector.refresh()
    failed = cloud.count("GetMonitorData") - calls
    assert 1 <= failed <= 4  # concurrency, not the 10 calls of the plan (nor their retries)
    assert errors(collector) == {("GetMonitorData", "AuthFailure.SecretIdNotFound"): failed}


def test_throttling_is_retried_and_the_values_arrive(
    cloud: FakeTencentCloud, clock: FakeClock, fleet_collector: TencentCollector
) -> None:
    cloud.fail_next("error", 2, action="GetMonitorData", code="RequestLimitExceeded")
    report = fleet_collector.refresh()
    assert report.failed == 0
    assert errors(fleet_collector) == {("GetMonitorData", "RequestLimitExceeded"): 2}
    assert cloud.count("GetMonitorData") == 3 + 2
    assert_values_correct(cloud, clock, fleet_collector)
    assert refresh_success(fleet_collector) == 1


@pytest.mark.parametrize("kind", ["http502", "http500"])
def test_http_5xx_is_retried(
    cloud: FakeTencentCloud, clock: FakeClock, fleet_collector: TencentCollector, kind: str
) -> None:
    cloud.fail_next(kind, 2, action="GetMonitorData")
    assert fleet_collector.refresh().failed == 0
    assert errors(fleet_collector) == {("GetMonitorData", kind.upper()): 2}
    assert_values_correct(cloud, clock, fleet_collector)


def test_timeouts_are_retried(
    cloud: FakeTencentCloud, clock: FakeClock, fleet_collector: TencentCollector
) -> None:
    cloud.fail_next("slow", 1, action="GetMonitorData", seconds=1.5)
    assert fleet_collector.refresh().failed == 0
    assert errors(fleet_collector) == {("GetMonitorData", "Timeout"): 1}
    assert_values_correct(cloud, clock, fleet_collector)
    histogram = named(samples(fleet_collector),
                      "trainmon_tencent_api_request_duration_seconds_count")
    assert histogram[frozenset({("action", "GetMonitorData")})] == 4


def test_malformed_json_is_retried_then_reported(
    cloud: FakeTencentCloud, clock: FakeClock, make_collector: MakeCollector
) -> None:
    fleet = cloud.add_fleet("ap-shanghai", 25)
    fleet_collector = make_collector(instances=[i.instance_id for i in fleet],
                                     metrics=["GpuPowDraw"], concurrency=1)
    cloud.fail_next("malformed", 1, action="GetMonitorData")
    assert fleet_collector.refresh().failed == 0
    assert_values_correct(cloud, clock, fleet_collector)

    # persistently broken: 1 + max_retries (2) attempts, then that batch keeps its old values
    clock.advance(60)
    cloud.fail_next("malformed", 3, action="GetMonitorData")
    report = fleet_collector.refresh()
    assert report.failed == 1
    assert errors(fleet_collector) == {("GetMonitorData", "MalformedResponse"): 4}
    assert refresh_success(fleet_collector) == 0
    assert fleet_collector.health()["puller_state"] == "degraded"
    assert len(named(samples(fleet_collector), METRIC)) == 25


def test_invalid_parameter_fails_fast(
    cloud: FakeTencentCloud, fleet_collector: TencentCollector
) -> None:
    cloud.fail_next("error", 1, action="GetMonitorData", code="InvalidParameterValue")
    report = fleet_collector.refresh()
    assert report.failed == 1 and report.aborted is None
    assert cloud.count("GetMonitorData") == 3  # not retried
    assert errors(fleet_collector) == {("GetMonitorData", "InvalidParameterValue"): 1}


def test_clock_skew_is_named_as_such(
    cloud: FakeTencentCloud, fleet_collector: TencentCollector,
    caplog: pytest.LogCaptureFixture,
) -> None:
    cloud.skew = 600.0  # Tencent's clock is ten minutes ahead of ours
    with caplog.at_level(logging.WARNING):
        report = fleet_collector.refresh()
    assert report.aborted is not None and "AuthFailure.SignatureExpire" in report.aborted
    assert cloud.count() == 1
    assert "600s behind Tencent Cloud" in caplog.text and "NTP" in caplog.text
    output = samples(fleet_collector)
    assert output[("trainmon_tencent_clock_skew_seconds", frozenset())] == 600.0
    assert errors(fleet_collector) == {("DescribeBaseMetrics", "AuthFailure.SignatureExpire"): 1}


def test_no_credentials_and_no_metadata_service(
    cloud: FakeTencentCloud, make_collector: MakeCollector
) -> None:
    collector = make_collector(secret_id=None, secret_key=None)
    report = collector.refresh()
    assert report.aborted == "unavailable" and cloud.count() == 0
    with pytest.raises(CollectorUnavailable) as raised:
        list(collector.collect())
    message = str(raised.value)
    assert "TENCENTCLOUD_SECRET_ID" in message and "metadata service" in message
    assert collector.health()["puller_state"] == "unavailable"


def test_no_region_and_no_metadata_service(
    cloud: FakeTencentCloud, make_collector: MakeCollector
) -> None:
    collector = make_collector(region=None)
    collector.refresh()
    with pytest.raises(CollectorUnavailable, match="no region configured"):
        list(collector.collect())


def test_counter_families_carry_the_total_suffix(
    cloud: FakeTencentCloud, fleet_collector: TencentCollector
) -> None:
    fleet_collector.refresh()
    text = exposition(fleet_collector)
    assert "# TYPE trainmon_tencent_api_requests_total counter" in text
    assert 'trainmon_tencent_api_requests_total{action="GetMonitorData"} 3.0' in text
    assert "# TYPE trainmon_tencent_api_request_duration_seconds histogram" in text
    last = samples(fleet_collector)[("trainmon_tencent_last_success_timestamp_seconds",
                                     frozenset())]
    assert math.isclose(last, cloud.clock())


def test_policy_without_describe_base_metrics_pulls_unvalidated(
    cloud: FakeTencentCloud, clock: FakeClock, make_collector: MakeCollector
) -> None:
    fleet = cloud.add_fleet("ap-shanghai", 3)
    collector = make_collector(instances=[i.instance_id for i in fleet],
                               metrics=["GpuPowDraw", "CPUUsage"])
    cloud.fail_next("error", 1, action="DescribeBaseMetrics", code="UnauthorizedOperation")
    report = collector.refresh()
    assert report.aborted is None
    assert_values_correct(cloud, clock, collector)
    # the reference-page spelling "CPUUsage" is refused by this API: only that metric fails
    assert report.failed == 1
    assert errors(collector)[("GetMonitorData", "InvalidParameterValue")] == 1

    clock.advance(600)  # validation is tried again after discovery_interval_seconds
    assert collector.refresh().failed == 0
    assert len(named(samples(collector), "trainmon_tencent_cvm_cpu_usage_ratio")) == 3


def test_policy_without_describe_disks_keeps_the_cvm_metrics(
    cloud: FakeTencentCloud, clock: FakeClock, make_collector: MakeCollector
) -> None:
    fleet = cloud.add_fleet("ap-shanghai", 3, disks_per_instance=1)
    collector = make_collector(instances=[i.instance_id for i in fleet],
                               metrics=["GpuPowDraw", "DiskUtil"])
    cloud.fail_next("error", 1, action="DescribeDisks", code="UnauthorizedOperation.CamNoAuth")
    assert collector.refresh().failed == 0
    assert_values_correct(cloud, clock, collector)
    assert named(samples(collector), "trainmon_tencent_cbs_utilization_ratio") == {}


def test_batches_above_the_documented_limit_are_refused_and_warned_about(
    cloud: FakeTencentCloud, make_collector: MakeCollector, caplog: pytest.LogCaptureFixture
) -> None:
    fleet = cloud.add_fleet("ap-shanghai", 25)
    collector = make_collector(instances=[i.instance_id for i in fleet], metrics=["GpuPowDraw"],
                               batch_size=20, refresh_interval=3600)
    report = collector.refresh()
    assert report.calls == 2 and report.failed == 1  # 20 refused, the remaining 5 pass
    assert errors(collector) == {("GetMonitorData", "InvalidParameterValue"): 1}
    assert len(named(samples(collector), METRIC)) == 5
    with caplog.at_level(logging.WARNING):
        collector.start()
        collector.stop()
    assert "above GetMonitorData's documented limit of 10" in caplog.text

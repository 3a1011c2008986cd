"""The puller end to end against the fake API: values, call counts, discovery, age."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import datetime

from testkit.fake_tencent_api import METRICS, FakeClock, FakeTencentCloud
from tests.tencent.tencent_support import named, samples
from trainmon.collectors.tencent import TencentCollector
from trainmon.tencent.catalogue import CATALOGUE, TargetKind, label_name
from trainmon.tencent.planning import plan_interval, window

MakeCollector = Callable[..., TencentCollector]
CVM_METRICS = [spec for spec in CATALOGUE if spec.kind is TargetKind.INSTANCE]
CBS_METRICS = [spec for spec in CATALOGUE if spec.kind is TargetKind.DISK]


def api_spelling(namespace: str, name: str) -> str:
    return next(n for n in METRICS[namespace] if n.lower() == name.lower())


def latest_period_start(now: float, period: int = 60, delay: int = 120) -> int:
    return window(now, period, delay, 5)[2]


def test_sixty_instances_two_disks_every_value_matches(
    cloud: FakeTencentCloud, clock: FakeClock, make_collector: MakeCollector
) -> None:
    stopped = {7, 23}
    fleet = cloud.add_fleet("ap-shanghai", 60, disks_per_instance=2, stopped=stopped)
    collector = make_collector()  # discovery: DescribeInstances + DescribeDisks
    report = collector.refresh()
    output = samples(collector)

    latest = latest_period_start(clock())
    for spec in CATALOGUE:
        exposed = named(output, spec.name)
        expected = {}
        for index, instance in enumerate(fleet):
            if index in stopped:
                continue
            objects = (
                [{"InstanceId": instance.instance_id}] if spec.kind is TargetKind.INSTANCE else
                [{"diskId": f"disk-{instance.instance_id}-{n}"} for n in range(2)]
            )
            for dims in objects:
                labels = {label_name(k): v for k, v in dims.items()} | {"region": "ap-shanghai"}
                if spec.kind is TargetKind.DISK:
                    labels["instance_id"] = instance.instance_id
                raw = cloud.value(api_spelling(spec.namespace, spec.tencent_name), dims, latest)
                expected[frozenset(labels.items())] = spec.convert(raw)
        assert exposed.keys() == expected.keys(), spec.name
        for key, value in expected.items():
            assert math.isclose(exposed[key], value, rel_tol=1e-12), (spec.name, key)

    # the minimum number of calls, none throttled, no batch above the documented 10
    expected_calls = len(CVM_METRICS) * math.ceil(60 / 10) + len(CBS_METRICS) * math.ceil(120 / 10)
    assert report.calls == expected_calls == cloud.count("GetMonitorData")
    assert report.failed == 0
    assert cloud.count(code="RequestLimitExceeded") == 0
    assert all(len(r.params["Instances"]) <= 10 for r in cloud.records
               if r.action == "GetMonitorData")
    # discovery pages 100 objects at a time: 60 instances, 120 disks
    assert cloud.count("DescribeInstances") == 1 and cloud.count("DescribeDisks") == 2
    assert output[("trainmon_tencent_estimated_monthly_calls", frozenset())] == (
        expected_calls * 30 * 24 * 60
    )
    assert named(output, "trainmon_tencent_targets") == {
        frozenset({("kind", "instance")}): 60, frozenset({("kind", "disk")}): 120,
    }


def test_scrapes_only_read_state(cloud: FakeTencentCloud, make_collector: MakeCollector) -> None:
    cloud.add_fleet("ap-shanghai", 3)
    collector = make_collector(instances=[i.instance_id for i in cloud.instances],
                               metrics=["GpuUtil", "CPUUsage"])
    collector.refresh()
    before = len(cloud.records)
    for _ in range(5):
        assert named(samples(collector), "trainmon_tencent_cvm_cpu_usage_ratio")
    assert len(cloud.records) == before


def test_names_follow_describe_base_metrics_and_periods_snap(
    cloud: FakeTencentCloud, make_collector: MakeCollector
) -> None:
    instance = cloud.add_fleet("ap-shanghai", 1, disks_per_instance=1)[0]
    collector = make_collector(
        instances=[instance.instance_id],
        disks={instance.instance_id: [f"disk-{instance.instance_id}-0"]},
        metrics=["CPUUsage", "GpuMemUsage", "DiskReadTraffic", "DiskReadIops"],
        period_seconds=30,
    )
    collector.refresh()
    pulled = {(r.params["MetricName"], r.params["Period"]) for r in cloud.records
              if r.action == "GetMonitorData"}
    # the API's spelling, and the smallest supported period not below 30 s
    assert pulled == {("CpuUsage", 60), ("Gpumemusage", 60), ("DiskReadTraffic", 60),
                      ("DiskReadIops", 60)}
    assert cloud.count(code=None) == len(cloud.records)
    assert collector.health()["metrics"] == ["Gpumemusage", "CpuUsage", "DiskReadIops",
                                             "DiskReadTraffic"]


def test_per_gpu_dimensions_become_labels(
    cloud: FakeTencentCloud, clock: FakeClock, make_collector: MakeCollector
) -> None:
    fleet = cloud.add_fleet("ap-shanghai", 2, gpus=4)
    collector = make_collector(instances=[i.instance_id for i in fleet],
                               metrics=["GpuUtil", "CPUUsage"])
    collector.refresh()
    output = samples(collector)
    latest = latest_period_start(clock())
    gpu = named(output, "trainmon_tencent_cvm_gpu_utilization_ratio")
    assert len(gpu) == 8
    for instance in fleet:
        for minor in range(4):
            dims = {"InstanceId": instance.instance_id, "minorNumber": str(minor)}
            key = frozenset({("instance_id", instance.instance_id),
                             ("minor_number", str(minor)), ("region", "ap-shanghai")})
            assert gpu[key] == cloud.value("GpuUtil", dims, latest) / 100
    assert len(named(output, "trainmon_tencent_cvm_cpu_usage_ratio")) == 2


def test_request_window_ends_delay_before_now(
    cloud: FakeTencentCloud, clock: FakeClock, make_collector: MakeCollector
) -> None:
    cloud.add_fleet("ap-shanghai", 1)
    collector = make_collector(instances=[cloud.instances[0].instance_id], metrics=["GpuTemp"],
                               delay_seconds=180, window_periods=4)
    collector.refresh()
    request = next(r.params for r in cloud.records if r.action == "GetMonitorData")
    start = datetime.fromisoformat(request["StartTime"]).timestamp()
    end = datetime.fromisoformat(request["EndTime"]).timestamp()
    assert end == math.floor((clock() - 180) / 60) * 60
    assert end - start == 4 * 60


def test_stopped_instances_give_no_sample_and_the_age_rises(
    cloud: FakeTencentCloud, clock: FakeClock, make_collector: MakeCollector
) -> None:
    fleet = cloud.add_fleet("ap-shanghai", 2)
    collector = make_collector(instances=[i.instance_id for i in fleet], metrics=["GpuTemp"])
    name = "trainmon_tencent_cvm_gpu_temperature_celsius"
    age_key = ("trainmon_tencent_sample_age_seconds", frozenset({("metric", name)}))
    collector.refresh()
    first = samples(collector)
    assert len(named(first, name)) == 2
    assert first[age_key] == clock() - (latest_period_start(clock()) + 60)

    fleet[1].running = False
    clock.advance(60)
    collector.refresh()
    second = samples(collector)
    assert [dict(labels)["instance_id"] for labels in named(second, name)] == [
        fleet[0].instance_id
    ]
    assert second[age_key] == first[age_key]  # instance 0 still reports

    fleet[0].running = False
    clock.advance(60)
    collector.refresh()
    third = samples(collector)
    assert named(third, name) == {}
    assert third[age_key] == first[age_key] + 60


def test_discovery_filters_by_tag_pages_and_spans_regions(
    cloud: FakeTencentCloud, clock: FakeClock, make_collector: MakeCollector
) -> None:
    training = cloud.add_fleet("ap-shanghai", 130, tags={"team": "training"})
    cloud.add_fleet("ap-shanghai", 5, prefix="web", tags={"team": "web"})
    beijing = cloud.add_fleet("ap-beijing", 3, tags={"team": "training"})
    collector = make_collector(region=None, regions=["ap-shanghai", "ap-beijing"],
                               discovery_tags={"team": "training"}, metrics=["CPUUsage"])
    collector.refresh()
    cpu = named(samples(collector), "trainmon_tencent_cvm_cpu_usage_ratio")
    exposed = {(dict(labels)["region"], dict(labels)["instance_id"]) for labels in cpu}
    assert exposed == {(i.region, i.instance_id) for i in training + beijing}
    # 130 instances page as 100 + 30 in Shanghai, one page in Beijing
    assert [r.region for r in cloud.records if r.action == "DescribeInstances"] == [
        "ap-shanghai", "ap-shanghai", "ap-beijing"
    ]
    assert cloud.count("GetMonitorData") == 13 + 1

    # re-discovered after discovery_interval_seconds (default 600), not before
    clock.advance(300)
    collector.refresh()
    assert cloud.count("DescribeInstances") == 3
    clock.advance(300)
    collector.refresh()
    assert cloud.count("DescribeInstances") == 6


def test_background_thread_refreshes_without_scrapes(
    cloud: FakeTencentCloud, make_collector: MakeCollector
) -> None:
    cloud.add_fleet("ap-shanghai", 4)
    collector = make_collector(instances=[i.instance_id for i in cloud.instances],
                               metrics=["GpuUtil"], refresh_interval=0.2)
    collector.start()
    deadline = time.monotonic() + 10
    while cloud.count("GetMonitorData") < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    collector.stop()
    assert cloud.count("GetMonitorData") >= 3
    assert len(named(samples(collector), "trainmon_tencent_cvm_gpu_utilization_ratio")) == 4


def test_refresh_interval_stretches_to_whole_periods_when_calls_do_not_fit() -> None:
    assert plan_interval(calls=100, rate=15, period=60) == 60
    assert plan_interval(calls=1400, rate=15, period=60) == 120  # 93 s of calls
    assert plan_interval(calls=1400, rate=20, period=60) == 120
    assert plan_interval(calls=280, rate=15, period=60, base=300) == 300

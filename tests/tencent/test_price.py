"""The price of each GPU instance per GPU-hour, from DescribeZoneInstanceConfigInfos."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from testkit.fake_tencent_api import FakeClock, FakeTencentCloud
from tests.tencent.tencent_support import SECRET_ID, SECRET_KEY, named, samples
from trainmon.collectors.tencent import TencentCollector
from trainmon.tencent.client import CVM, APIError, APIStats, TencentAPI
from trainmon.tencent.credentials import Credential, StaticCredentials
from trainmon.tencent.ratelimit import TokenBucket

MakeCollector = Callable[..., TencentCollector]
PRICE = "trainmon_tencent_gpu_price_per_hour"
SKIPPED = "trainmon_tencent_price_types_skipped_total"
ACTION = "DescribeZoneInstanceConfigInfos"
ZONE = "ap-shanghai-5"
GPU_TYPE = "GN10Xp.20XLARGE320"


def prices(collector: TencentCollector) -> dict[tuple[str, str, str, str], float]:
    """(instance_id, instance_type, zone, currency) → price per GPU-hour."""
    return {
        (labels["instance_id"], labels["instance_type"], labels["zone"], labels["currency"]):
            value
        for labels, value in ((dict(k), v) for k, v in named(samples(collector), PRICE).items())
    }


def skipped(collector: TencentCollector) -> float:
    return samples(collector)[(SKIPPED, frozenset())]


def errors(collector: TencentCollector) -> dict[tuple[str, str], float]:
    found = named(samples(collector), "trainmon_tencent_api_errors_total")
    return {(dict(k)["action"], dict(k)["code"]): v for k, v in found.items()}


def test_price_per_gpu_hour_divides_the_discounted_hourly_price_by_the_gpus(
    cloud: FakeTencentCloud, make_collector: MakeCollector
) -> None:
    gpu_fleet = cloud.add_fleet("ap-shanghai", 2, gpus=8, instance_type=GPU_TYPE, zone=ZONE)
    cloud.add_fleet("ap-shanghai", 1, prefix="cpu", instance_type="S5.LARGE8", zone=ZONE)
    cloud.set_price(ZONE, GPU_TYPE, 100.0, gpus=8, discount=80.0)  # 80 an hour after discount
    cloud.set_price(ZONE, "S5.LARGE8", 0.5)  # sold, but without GPUs
    collector = make_collector(metrics=["GpuUtil"])  # discovery names type and zone
    collector.refresh()

    assert prices(collector) == {
        (instance.instance_id, GPU_TYPE, ZONE, "CNY"): 10.0 for instance in gpu_fleet
    }
    # one call for the zone, asking for exactly the types in use, pay-as-you-go only
    calls = [r for r in cloud.records if r.action == ACTION]
    assert [(r.region, r.code) for r in calls] == [("ap-shanghai", None)]
    filters = {f["Name"]: sorted(f["Values"]) for f in calls[0].params["Filters"]}
    assert filters == {"zone": [ZONE], "instance-type": sorted([GPU_TYPE, "S5.LARGE8"]),
                       "instance-charge-type": ["POSTPAID_BY_HOUR"]}
    assert cloud.count("DescribeInstances") == 1  # discovery told the placements
    assert skipped(collector) == 0
    assert collector.health()["priced_instances"] == 2


def test_configured_instances_are_placed_and_priced_in_the_configured_currency(
    cloud: FakeTencentCloud, make_collector: MakeCollector
) -> None:
    fleet = cloud.add_fleet("ap-shanghai", 3, gpus=1, instance_type="GN7.5XLARGE80",
                            zone="ap-shanghai-4")
    # no UnitPriceDiscount: the list price; GpuCount 0: the Gpu count
    cloud.set_price("ap-shanghai-4", "GN7.5XLARGE80", 12.5, gpus=1, discount=None, gpu_count=0)
    collector = make_collector(instances=[i.instance_id for i in fleet], metrics=["GpuUtil"],
                               currency="USD")
    collector.refresh()

    assert prices(collector) == {
        (instance.instance_id, "GN7.5XLARGE80", "ap-shanghai-4", "USD"): 12.5
        for instance in fleet
    }
    placements = [r for r in cloud.records if r.action == "DescribeInstances"]
    assert [sorted(r.params["InstanceIds"]) for r in placements] == [
        sorted(i.instance_id for i in fleet)
    ]


def test_instance_types_without_gpus_or_not_sold_get_no_series(
    cloud: FakeTencentCloud, make_collector: MakeCollector
) -> None:
    cloud.add_fleet("ap-shanghai", 2, instance_type="S5.LARGE8", zone=ZONE)
    cloud.add_fleet("ap-shanghai", 2, prefix="gone", gpus=4, instance_type="GN8.LARGE56",
                    zone=ZONE)
    cloud.set_price(ZONE, "S5.LARGE8", 0.5, gpus=0)
    collector = make_collector(metrics=["CPUUsage"])
    collector.refresh()

    assert named(samples(collector), PRICE) == {}
    assert cloud.count(ACTION, code=None) == 1
    assert skipped(collector) == 0


def test_an_api_error_keeps_the_last_price_and_is_counted(
    cloud: FakeTencentCloud, clock: FakeClock, make_collector: MakeCollector
) -> None:
    instance = cloud.add_fleet("ap-shanghai", 1, gpus=8, instance_type=GPU_TYPE, zone=ZONE)[0]
    cloud.set_price(ZONE, GPU_TYPE, 80.0, gpus=8)
    collector = make_collector(metrics=["GpuUtil"])
    collector.refresh()
    key = (instance.instance_id, GPU_TYPE, ZONE, "CNY")
    assert prices(collector) == {key: 10.0}

    cloud.set_price(ZONE, GPU_TYPE, 96.0, gpus=8)
    cloud.fail_next("error", 1, action=ACTION, code="UnauthorizedOperation")
    clock.advance(6 * 3600)
    collector.refresh()
    assert prices(collector) == {key: 10.0}  # the last known price
    assert errors(collector) == {(ACTION, "UnauthorizedOperation"): 1}
    assert samples(collector)[("trainmon_tencent_refresh_success", frozenset())] == 1

    # tried again after discovery_interval_seconds (600 s), not every refresh
    clock.advance(300)
    collector.refresh()
    assert cloud.count(ACTION) == 2
    clock.advance(300)
    collector.refresh()
    assert cloud.count(ACTION) == 3
    assert prices(collector) == {key: 12.0}


def test_prices_are_looked_up_again_only_after_the_interval(
    cloud: FakeTencentCloud, clock: FakeClock, make_collector: MakeCollector
) -> None:
    instance = cloud.add_fleet("ap-shanghai", 1, gpus=2, instance_type="GN7.10XLARGE160",
                               zone=ZONE)[0]
    cloud.set_price(ZONE, "GN7.10XLARGE160", 20.0, gpus=2)
    collector = make_collector(metrics=["GpuUtil"], price_interval_seconds=3600)
    collector.refresh()
    assert cloud.count(ACTION) == 1

    cloud.set_price(ZONE, "GN7.10XLARGE160", 30.0, gpus=2)
    for seconds in (600, 600, 600, 600, 600, 599):  # 3599 s: refreshes, scrapes, rediscovery
        clock.advance(seconds)
        collector.refresh()
        assert prices(collector) == {(instance.instance_id, "GN7.10XLARGE160", ZONE, "CNY"): 10.0}
    assert cloud.count(ACTION) == 1

    clock.advance(1)
    collector.refresh()
    assert cloud.count(ACTION) == 2
    assert prices(collector) == {(instance.instance_id, "GN7.10XLARGE160", ZONE, "CNY"): 15.0}


def test_prices_off_means_no_lookups_and_no_series(
    cloud: FakeTencentCloud, make_collector: MakeCollector
) -> None:
    cloud.add_fleet("ap-shanghai", 1, gpus=8, instance_type=GPU_TYPE, zone=ZONE)
    cloud.set_price(ZONE, GPU_TYPE, 80.0, gpus=8)
    collector = make_collector(metrics=["GpuUtil"], prices=False)
    collector.refresh()
    output = samples(collector)
    assert cloud.count(ACTION) == 0
    assert named(output, PRICE) == {} and named(output, SKIPPED) == {}


def test_the_cap_prices_the_most_used_types_and_counts_the_rest(
    cloud: FakeTencentCloud, clock: FakeClock, make_collector: MakeCollector
) -> None:
    types = {"GN10Xp.20XLARGE320": 3, "GN7.10XLARGE160": 2, "GN7.5XLARGE80": 1}
    for index, (instance_type, count) in enumerate(types.items()):
        cloud.add_fleet("ap-shanghai", count, prefix=f"p{index}", gpus=2,
                        instance_type=instance_type, zone=ZONE)
        cloud.set_price(ZONE, instance_type, 10.0, gpus=2)
    collector = make_collector(metrics=["GpuUtil"], max_priced_types=2)
    collector.refresh()

    exposed = {instance_type for _, instance_type, _, _ in prices(collector)}
    assert exposed == {"GN10Xp.20XLARGE320", "GN7.10XLARGE160"}
    assert len(prices(collector)) == 5
    asked = [f["Values"] for r in cloud.records if r.action == ACTION
             for f in r.params["Filters"] if f["Name"] == "instance-type"]
    assert [sorted(values) for values in asked] == [["GN10Xp.20XLARGE320", "GN7.10XLARGE160"]]
    assert skipped(collector) == 1

    clock.advance(6 * 3600)  # the next round counts again
    collector.refresh()
    assert skipped(collector) == 2
    assert {instance_type for _, instance_type, _, _ in prices(collector)} == exposed


def test_the_fake_answers_as_documented(cloud: FakeTencentCloud, clock: FakeClock) -> None:
    cloud.set_price(ZONE, GPU_TYPE, 100.0, gpus=8, discount=80.0)
    cloud.set_price(ZONE, "S5.LARGE8", 0.5)
    cloud.set_price("ap-shanghai-2", "GN7.5XLARGE80", 9.0, gpus=1)

    def api(secret_key: str) -> TencentAPI:
        credentials = StaticCredentials("test", lambda: Credential(SECRET_ID, secret_key))
        return TencentAPI(cloud.url, credentials, limiter=TokenBucket(15.0), stats=APIStats(),
                          clock=clock, max_retries=0)

    def ask(*filters: tuple[str, list[str]], secret_key: str = SECRET_KEY) -> list[dict[str, object]]:
        params = {"Filters": [{"Name": name, "Values": values} for name, values in filters]}
        answer = api(secret_key).call(CVM, ACTION, params, "ap-shanghai")
        items = answer["InstanceTypeQuotaSet"]
        assert isinstance(items, list)
        return items

    hourly = ask(("zone", [ZONE]), ("instance-family", ["GN10Xp"]),
                 ("instance-charge-type", ["POSTPAID_BY_HOUR"]))
    assert [(i["InstanceType"], i["Gpu"], i["GpuCount"]) for i in hourly] == [(GPU_TYPE, 8, 8.0)]
    assert hourly[0]["Price"] == {"UnitPrice": 100.0, "ChargeUnit": "HOUR", "Discount": 80.0,
                                  "UnitPriceDiscount": 80.0}
    both = ask(("instance-type", ["GN7.5XLARGE80"]))
    assert sorted(str(i["InstanceChargeType"]) for i in both) == ["POSTPAID_BY_HOUR", "PREPAID"]
    assert ask(("zone", ["ap-beijing-1"])) == []

    with pytest.raises(APIError) as raised:
        ask(("gpu-type", ["V100"]))
    assert raised.value.code == "InvalidFilter"
    with pytest.raises(APIError) as raised:
        ask(("zone", [ZONE]), secret_key="wrong-" + SECRET_KEY)
    assert raised.value.code == "AuthFailure.SignatureFailure"

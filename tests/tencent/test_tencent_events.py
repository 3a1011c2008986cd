"""The event centre's events of the instances: read, categorised, paged, bounded, isolated."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import pytest

from testkit.fake_tencent_api import FakeClock, FakeTencentCloud
from tests.tencent.tencent_support import SECRET_ID, SECRET_KEY, named, samples, tencent_config
from trainmon.collectors.tencent import TencentCollector
from trainmon.config import ConfigError
from trainmon.tencent.client import MONITOR, APIError, APIStats, TencentAPI
from trainmon.tencent.credentials import Credential, StaticCredentials
from trainmon.tencent.events import PAGE_SIZE
from trainmon.tencent.ratelimit import TokenBucket

MakeCollector = Callable[..., TencentCollector]
ACTION = "DescribeProductEventList"
INFO = "trainmon_tencent_event_info"
START = "trainmon_tencent_event_start_timestamp_seconds"


def open_events(collector: TencentCollector) -> dict[tuple[str, str], tuple[str, str]]:
    """(instance_id, event) → (category, status) of every exported open event."""
    found = {}
    for labels, value in named(samples(collector), INFO).items():
        assert value == 1
        label = dict(labels)
        found[(label["instance_id"], label["event"])] = (label["category"], label["status"])
    return found


def starts(collector: TencentCollector) -> dict[tuple[str, str], float]:
    return {(dict(k)["instance_id"], dict(k)["event"]): v
            for k, v in named(samples(collector), START).items()}


def event_calls(cloud: FakeTencentCloud) -> list[dict[str, Any]]:
    return [dict(r.params) for r in cloud.records if r.action == ACTION]


@pytest.fixture
def fleet(cloud: FakeTencentCloud) -> list[str]:
    return [i.instance_id for i in cloud.add_fleet("ap-shanghai", 4, gpus=8)]


def test_open_events_are_exported_with_their_category(
    cloud: FakeTencentCloud, clock: FakeClock, make_collector: MakeCollector, fleet: list[str]
) -> None:
    now = clock()
    a, b, c, d = fleet
    cloud.add_event(a, "instance_restarting", start=now - 3600, event_type="status_change")
    cloud.add_event(a, "guest_oom", start=now - 600, status="-")
    cloud.add_event(b, "instance_restarted", start=now - 120)
    cloud.add_event(b, "nvme_error", start=now - 100, status="-")
    # Tencent documents no GPU or migration event name: these are matched by their words
    cloud.add_event(c, "gpu_card_lost", start=now - 300, chinese="GPU掉卡", english="GpuCardLost")
    cloud.add_event(c, "instance_live_migrate", start=now - 200, chinese="实例热迁移")
    cloud.add_event(d, "cvm:ErrorEvent:InstanceRunningRisksInquiring", start=now - 900)
    cloud.add_event(d, "some_new_event", start=now - 50, status="-")
    cloud.add_event(a, "guest_reboot", start=now - 4 * 86400, status="-")  # before the lookback
    stranger = cloud.add_fleet("ap-shanghai", 1, prefix="other")[0].instance_id
    cloud.add_event(stranger, "instance_restarted", start=now - 60)  # not a target

    collector = make_collector(instances=fleet, metrics=["GpuUtil"])
    collector.refresh()

    assert open_events(collector) == {
        (a, "instance_restarting"): ("maintenance", "alarm"),
        (a, "guest_oom"): ("other", "-"),
        (b, "instance_restarted"): ("host_fault", "alarm"),
        (b, "nvme_error"): ("host_fault", "-"),
        (c, "gpu_card_lost"): ("gpu_fault", "alarm"),
        (c, "instance_live_migrate"): ("migration", "alarm"),
        (d, "cvm:ErrorEvent:InstanceRunningRisksInquiring"): ("maintenance", "alarm"),
        (d, "some_new_event"): ("other", "-"),
    }
    assert starts(collector)[(c, "gpu_card_lost")] == int(now - 300)
    assert starts(collector)[(a, "instance_restarting")] == int(now - 3600)
    # one signed, paced request: the documented filters, the instance targets only
    (params,) = event_calls(cloud)
    assert params["Module"] == "monitor" and params["ProductName"] == ["cvm"]
    assert sorted(params["InstanceId"]) == sorted(fleet)
    assert params["EndTime"] == int(now) and params["StartTime"] == int(now - 86400)
    assert cloud.count(ACTION, code=None) == 1
    requests = named(samples(collector), "trainmon_tencent_api_requests_total")
    assert requests[frozenset({("action", ACTION)})] == 1
    assert collector.health()["open_events"] == 8


def test_events_are_read_every_interval_not_every_refresh(
    cloud: FakeTencentCloud, clock: FakeClock, make_collector: MakeCollector, fleet: list[str]
) -> None:
    collector = make_collector(instances=fleet, metrics=["GpuUtil"],
                               events_interval_seconds=120)
    collector.refresh()
    clock.advance(60)
    collector.refresh()
    assert cloud.count(ACTION) == 1
    clock.advance(60)
    collector.refresh()
    assert cloud.count(ACTION) == 2


def test_events_are_paged(
    cloud: FakeTencentCloud, clock: FakeClock, make_collector: MakeCollector, fleet: list[str]
) -> None:
    now = clock()
    names = [f"event_{n:02d}" for n in range(45)]
    for index, name in enumerate(names):
        cloud.add_event(fleet[index % 4], name, start=now - 1000 + index)
    collector = make_collector(instances=fleet, metrics=["GpuUtil"])
    collector.refresh()

    exposed = open_events(collector)
    assert len(exposed) == 45
    assert {event for _, event in exposed} == set(names)
    pages = event_calls(cloud)
    assert [p["Offset"] for p in pages] == [0, PAGE_SIZE, 2 * PAGE_SIZE]
    assert all(p["Limit"] == PAGE_SIZE for p in pages)
    assert named(samples(collector), "trainmon_tencent_events_skipped_total") == {
        frozenset(): 0}


def test_the_event_count_is_bounded_and_the_rest_counted(
    cloud: FakeTencentCloud, clock: FakeClock, make_collector: MakeCollector, fleet: list[str]
) -> None:
    now = clock()
    for index in range(50):
        cloud.add_event(fleet[index % 4], f"event_{index:02d}", start=now - 1000 + index)
    collector = make_collector(instances=fleet, metrics=["GpuUtil"], max_events=30)
    collector.refresh()
    assert len(open_events(collector)) == 30
    assert [p["Limit"] for p in event_calls(cloud)] == [PAGE_SIZE, 30 - PAGE_SIZE]
    skipped = named(samples(collector), "trainmon_tencent_events_skipped_total")
    assert skipped == {frozenset(): 20}
    clock.advance(60)
    collector.refresh()  # counted at every round
    assert named(samples(collector), "trainmon_tencent_events_skipped_total") == {
        frozenset(): 40}
    assert len(open_events(collector)) == 30


def test_recovered_and_closed_events_disappear(
    cloud: FakeTencentCloud, clock: FakeClock, make_collector: MakeCollector, fleet: list[str]
) -> None:
    now = clock()
    fault = cloud.add_event(fleet[0], "instance_restarted", start=now - 300)
    cloud.add_event(fleet[1], "cvm:ErrorEvent:InstanceRunningRisksExecuting", start=now - 200)
    collector = make_collector(instances=fleet, metrics=["GpuUtil"])
    collector.refresh()
    assert set(open_events(collector)) == {
        (fleet[0], "instance_restarted"),
        (fleet[1], "cvm:ErrorEvent:InstanceRunningRisksExecuting"),
    }

    clock.advance(60)
    cloud.recover(fault, clock())
    cloud.add_event(fleet[1], "cvm:ErrorEvent:InstanceRunningRisksExecuted", start=clock() - 10,
                    status="-")
    collector.refresh()
    assert open_events(collector) == {}
    assert starts(collector) == {}
    assert named(samples(collector), INFO) == {}


def test_an_events_error_keeps_the_monitor_data_and_is_counted(
    cloud: FakeTencentCloud, clock: FakeClock, make_collector: MakeCollector, fleet: list[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    cloud.add_event(fleet[0], "instance_restarting", start=clock() - 60)
    collector = make_collector(instances=fleet, metrics=["GpuUtil"])
    collector.refresh()
    assert set(open_events(collector)) == {(fleet[0], "instance_restarting")}

    # the CAM policy lacks the action: not retried, and GetMonitorData is untouched
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            clock.advance(60)
            cloud.fail_next("error", 1, action=ACTION, code="UnauthorizedOperation")
            collector.refresh()
    output = samples(collector)
    assert output[("trainmon_tencent_refresh_success", frozenset())] == 1
    gpu = named(output, "trainmon_tencent_cvm_gpu_utilization_ratio")
    assert len(gpu) == 4 * 8 and all(math.isfinite(v) for v in gpu.values())
    errors = named(output, "trainmon_tencent_api_errors_total")
    assert errors == {frozenset({("action", ACTION), ("code", "UnauthorizedOperation")}): 2}
    assert cloud.count(ACTION) == 3  # no retries
    # the events last known stay; the error is logged once (rate-limited)
    assert set(open_events(collector)) == {(fleet[0], "instance_restarting")}
    logged = [r for r in caplog.records if "UnauthorizedOperation" in r.getMessage()]
    assert len(logged) == 1
    assert collector.health()["puller_state"] == "ok"


def test_a_malformed_events_answer_is_an_error_not_a_crash(
    cloud: FakeTencentCloud, make_collector: MakeCollector, fleet: list[str]
) -> None:
    cloud.fail_next("malformed", 3, action=ACTION)  # retried: MalformedResponse
    collector = make_collector(instances=fleet, metrics=["GpuUtil"])
    report = collector.refresh()
    assert report.failed == 0
    errors = named(samples(collector), "trainmon_tencent_api_errors_total")
    assert errors == {frozenset({("action", ACTION), ("code", "MalformedResponse")}): 3}
    assert open_events(collector) == {}


def test_configured_categories_come_first_and_events_can_be_off(
    cloud: FakeTencentCloud, clock: FakeClock, make_collector: MakeCollector, fleet: list[str]
) -> None:
    cloud.add_event(fleet[0], "guest_core_error", start=clock() - 60, status="-")
    collector = make_collector(instances=fleet, metrics=["GpuUtil"],
                               event_categories={"guest_core_error": "host_fault"})
    collector.refresh()
    assert open_events(collector) == {(fleet[0], "guest_core_error"): ("host_fault", "-")}

    quiet = make_collector(instances=fleet, metrics=["GpuUtil"], events=False)
    quiet.refresh()
    assert cloud.count(ACTION) == 1  # only the first collector's
    assert not any(name.startswith("trainmon_tencent_event")
                   for name, _ in samples(quiet))


def test_an_unknown_category_is_a_config_error(cloud: FakeTencentCloud) -> None:
    with pytest.raises(ConfigError, match=r"event_categories.*unknown category 'gpu'"):
        tencent_config(cloud, event_categories={"guest_core_error": "gpu"})


#: The keys of one event in the API reference's example answer.
DOCUMENTED_EVENT_KEYS = {
    "AdditionMsg", "Dimensions", "EventCName", "EventEName", "EventId", "EventName",
    "InstanceId", "InstanceName", "ProductCName", "ProductEName", "ProductName", "ProjectId",
    "Region", "StartTime", "Status", "SupportAlarm", "Type", "UpdateTime",
}


def test_the_fake_answers_as_documented(
    cloud: FakeTencentCloud, clock: FakeClock, fleet: list[str]
) -> None:
    now = clock()
    cloud.add_event(fleet[0], "guest_reboot", start=now - 60, status="-")
    cloud.add_event(fleet[1], "instance_restarted", start=now - 30)
    cloud.add_event(fleet[1], "instance_restarting", start=now - 20, status="recover",
                    event_type="status_change")

    def ask(secret_key: str = SECRET_KEY, **params: Any) -> dict[str, Any]:
        credentials = StaticCredentials("test", lambda: Credential(SECRET_ID, secret_key))
        api = TencentAPI(cloud.url, credentials, limiter=TokenBucket(15.0), stats=APIStats(),
                         clock=clock, max_retries=0)
        return dict(api.call(MONITOR, ACTION, {"Module": "monitor", **params}, "ap-shanghai"))

    everything = ask()
    assert everything["Total"] == 3
    assert all(set(event) >= DOCUMENTED_EVENT_KEYS for event in everything["Events"])
    assert [e["EventName"] for e in everything["Events"]] == [  # newest update first
        "instance_restarting", "instance_restarted", "guest_reboot"]
    assert everything["Events"][2]["EventEName"] == "GuestReboot"
    assert everything["OverView"]["UnRecoverAmount"] == 1
    assert [e["EventName"] for e in ask(Status=["alarm"])["Events"]] == ["instance_restarted"]
    assert ask(InstanceId=[fleet[0]])["Total"] == 1
    assert ask(ProductName=["cdb"])["Total"] == 0
    assert ask(StartTime=int(now - 40))["Total"] == 2
    page = ask(Limit=1, Offset=1, TimeOrder="ASC")
    assert page["Total"] == 3 and [e["EventName"] for e in page["Events"]] == [
        "instance_restarted"]

    for params, code in (({"Module": "cvm"}, "InvalidParameterValue"),
                         ({"Limit": 0}, "InvalidParameterValue"),
                         ({"InstanceId": fleet[0]}, "InvalidParameter")):
        with pytest.raises(APIError) as raised:
            ask(**params)
        assert raised.value.code == code
    with pytest.raises(APIError) as raised:
        ask(secret_key="wrong-" + SECRET_KEY)
    assert raised.value.code == "AuthFailure.SignatureFailure"

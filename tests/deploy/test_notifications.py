"""``make stack``'s notification sink (``deploy.notifications``): one line per
notification Alertmanager sends, so a training job's page, which holds one alert
per GPU, reads as one page listing its GPUs."""

from __future__ import annotations

import json

from deploy.notifications import describe


def page(*alerts: dict[str, str], status: str = "firing") -> bytes:
    return json.dumps({"status": status, "alerts": [
        {"status": status, "labels": labels} for labels in alerts]}).encode()


def gpu(index: int, node: str = "node-a") -> dict[str, str]:
    return {"alertname": "TrainmonGPUSawtooth", "severity": "critical", "job": "llm",
            "owner": "uid:1000", "node": node, "instance": f"{node}:19400",
            "gpu": str(index), "rank": str(index)}


def test_a_jobs_page_is_one_line_listing_what_tells_its_alerts_apart() -> None:
    lines = describe("/pager/webhook", page(gpu(0), gpu(1), gpu(2, "node-b")))
    assert lines == [
        "pager/webhook: FIRING TrainmonGPUSawtooth (job=llm, owner=uid:1000, "
        "severity=critical): 3 alerts: node=node-a instance=node-a:19400 gpu=0 rank=0; "
        "node=node-a instance=node-a:19400 gpu=1 rank=1; "
        "node=node-b instance=node-b:19400 gpu=2 rank=2"]


def test_a_single_alert_shows_its_labels() -> None:
    assert describe("/chat/webhook", page(gpu(3), status="resolved")) == [
        "chat/webhook: RESOLVED TrainmonGPUSawtooth (job=llm, owner=uid:1000, node=node-a, "
        "instance=node-a:19400, gpu=3, rank=3, severity=critical)"]


def test_mixed_alerts_of_a_node_name_each_alert() -> None:
    down = {"alertname": "TrainmonExporterDown", "severity": "warning", "job": "trainmon",
            "instance": "node-a:19400"}
    [line] = describe("/chat/webhook", page(down, {**down, "alertname": "TrainmonGPULost",
                                                   "gpu": "1"}))
    assert line == (
        "chat/webhook: FIRING TrainmonExporterDown, TrainmonGPULost (job=trainmon, "
        "instance=node-a:19400, severity=warning): 2 alerts: alertname=TrainmonExporterDown; "
        "alertname=TrainmonGPULost gpu=1")


def test_wecom_messages_and_other_bodies() -> None:
    text = {"text": {"content": "\n[FIRING:4] TrainmonGPUSawtooth · job llm\nGPUs: 0"}}
    assert describe("/chat/wechat/message/send", json.dumps(text).encode()) == [
        "chat/wechat/message/send: [FIRING:4] TrainmonGPUSawtooth · job llm"]
    assert describe("/pager/webhook", b"not json") == [
        "pager/webhook: 8 bytes that are not JSON"]
    assert describe("/pager/webhook", json.dumps({"alerts": []}).encode()) == []

"""Hostile input against a real ``trainmon serve``: it stays up, /metrics stays valid,
memory stays bounded, every rejection is counted."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.exposition import Scrape, parse
from tests.training.training_support import line, report, send_datagram

pytestmark = pytest.mark.integration

HOSTILE_LABELS = [
    'quote"inside', "new\nline", "back\\slash", "brace}", "résumé", "训练", "tab\there",
    "", "x" * 500, "\u202eevil", "a b",
]


class Target:
    """A running daemon plus the ways to talk to it."""

    def __init__(self, daemon: Any) -> None:
        self.daemon = daemon
        config = yaml.safe_load(Path(daemon.config_path).read_text())
        self.socket_path = Path(config["collectors"]["training"]["socket"])

    def post(self, body: bytes) -> tuple[int, dict[str, Any]]:
        request = urllib.request.Request(
            self.daemon.url + "/api/v1/steps", data=body, method="POST",
            headers={"Content-Type": "application/x-ndjson"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"{}")

    def scrape(self) -> Scrape:
        assert self.daemon.process.poll() is None, self.daemon.log()
        return parse(self.daemon.metrics())  # must parse: valid exposition

    def rejected(self, reason: str) -> float:
        value = self.scrape().value("trainmon_training_rejected_reports_total", reason=reason)
        assert value is not None
        return value

    def rss_bytes(self) -> int:
        status = Path(f"/proc/{self.daemon.process.pid}/status").read_text()
        kilobytes = next(row.split()[1] for row in status.splitlines() if row.startswith("VmRSS"))
        return int(kilobytes) * 1024

    def wait_reports(self, transport: str, count: int, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            result = self.scrape()
            accepted = result.value("trainmon_training_reports_total", transport=transport) or 0
            rejected = sum(result.samples.get("trainmon_training_rejected_reports_total",
                                              {}).values())
            if accepted + rejected >= count:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"only {accepted}+{rejected} of {count} reports arrived")
            time.sleep(0.05)


@pytest.fixture
def target(start_daemon: Callable[..., Any]) -> Target:
    return Target(start_daemon())


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"not json at all", "malformed"),
        (line()[:57], "malformed"),  # truncated
        (json.dumps(report(steps="ten")).encode(), "invalid_field"),
        (json.dumps(report(rank=[0])).encode(), "invalid_field"),
        (json.dumps(report(phase_seconds="comm")).encode(), "invalid_field"),
        (line().replace(b'"step_seconds": 2.0', b'"step_seconds": NaN'), "invalid_field"),
        (line().replace(b'"data_wait_seconds": 0.5', b'"data_wait_seconds": Infinity'),
         "invalid_field"),
        (json.dumps(report(samples=-1)).encode(), "invalid_field"),
        (json.dumps(report(step_seconds=-2.0)).encode(), "invalid_field"),
        (json.dumps(report(comm_seconds=1.0, comm_exposed_seconds=1.5)).encode(),
         "invalid_field"),  # exposed communication longer than all communication
        (json.dumps(report(comm_seconds=-1.0)).encode(), "invalid_field"),
        (json.dumps(report(comm_seconds=1.0, comm_bytes="lots")).encode(), "invalid_field"),
    ],
)
def test_bad_report_over_http_and_socket(target: Target, body: bytes, reason: str) -> None:
    status, answer = target.post(body)
    assert (status, answer["error"]) == (400, reason)
    send_datagram(target.socket_path, body)
    deadline = time.monotonic() + 10
    while target.rejected(reason) < 2:
        assert time.monotonic() < deadline, target.daemon.log()
        time.sleep(0.05)
    assert target.scrape().labelsets("trainmon_training_steps_total") == []
    assert target.post(line())[0] == 200  # still serving


def test_one_mebibyte_bodies(target: Target) -> None:
    status, answer = target.post(b"x" * ((1 << 20) + 1))
    assert (status, answer["error"]) == (413, "too_large")
    one_huge_line = b'{"v": 1, "job": "' + b"a" * ((1 << 20) - 100) + b'"}'
    status, answer = target.post(one_huge_line)
    assert (status, answer["error"]) == (400, "too_large")
    assert target.rejected("too_large") == 2
    assert target.post(line())[0] == 200


def test_a_client_that_sends_its_whole_oversized_body_before_reading_gets_the_413(
    target: Target,
) -> None:
    """urllib writes all 6 MiB before it reads: the daemon reads and drops them (up to
    MAX_DISCARDED_BODY_BYTES) instead of resetting the connection under the write."""
    for _ in range(3):
        status, answer = target.post(b"x" * (6 << 20))
        assert (status, answer["error"]) == (413, "too_large")
    assert target.post(line())[0] == 200


def test_hostile_label_values_never_reach_the_exposition(target: Target) -> None:
    for value in HOSTILE_LABELS:
        body = json.dumps(report(job=value)).encode()
        assert target.post(body)[1]["error"] == "invalid_label", value
        body = json.dumps(report(phase_seconds={value: 1.0})).encode()
        assert target.post(body)[1]["error"] == "invalid_label", value
        send_datagram(target.socket_path, json.dumps(report(job=value)).encode())
    deadline = time.monotonic() + 10
    while target.rejected("invalid_label") < 3 * len(HOSTILE_LABELS):
        assert time.monotonic() < deadline, target.daemon.log()
        time.sleep(0.05)
    result = target.scrape()
    assert result.value("trainmon_training_rejected_reports_total",
                        reason="invalid_label") == 3 * len(HOSTILE_LABELS)
    assert result.labelsets("trainmon_training_steps_total") == []
    assert "quote" not in result.text and "训练" not in result.text


def test_ten_thousand_job_names_stay_capped(target: Target) -> None:
    before = target.rss_bytes()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        for index in range(10_000):
            payload = line(job=f"job-{index}", reporter_id=f"r{index}")
            while True:
                try:
                    sender.sendto(payload, str(target.socket_path))
                    break
                except BlockingIOError:
                    time.sleep(0.001)
    target.wait_reports("unix", 10_000, timeout=60)
    result = target.scrape()
    jobs = {labels["job"] for labels in result.labelsets("trainmon_training_steps_total")}
    assert len(jobs) == 64  # the default max_jobs
    assert "job-9999" in jobs and "job-0" not in jobs  # least recently updated went first
    assert result.value("trainmon_training_evicted_ranks_total", reason="max_jobs") == 10_000 - 64
    assert result.value("trainmon_training_reports_total", transport="unix") == 10_000
    assert target.rss_bytes() - before < 40 << 20


def test_datagram_flood(target: Target) -> None:
    """8 senders blast valid and invalid datagrams as fast as they can for 3 s."""
    before = target.rss_bytes()
    stop = time.monotonic() + 3.0
    sent = [0] * 8
    refused = [0] * 8

    def blast(index: int) -> None:
        payloads = [line(rank=index, reporter_id=f"flood{index}"), b"{garbage", b"\xff" * 900]
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
            sender.setblocking(False)
            while time.monotonic() < stop and sent[index] < 200_000:
                try:
                    sender.sendto(payloads[sent[index] % 3], str(target.socket_path))
                    sent[index] += 1
                except BlockingIOError:
                    refused[index] += 1  # the socket buffer is full: the sender never blocks

    threads = [threading.Thread(target=blast, args=(index,)) for index in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    target.wait_reports("unix", sum(sent), timeout=60)
    result = target.scrape()
    assert result.value("trainmon_training_reports_total", transport="unix") == sum(
        (count + 2) // 3 for count in sent
    )
    assert result.value("trainmon_training_rejected_reports_total", reason="malformed") == sum(
        count - (count + 2) // 3 for count in sent
    )
    assert len(result.labelsets("trainmon_training_steps_total")) == 8
    status, _ = target.daemon.get("/healthz")
    assert status == 200
    assert target.rss_bytes() - before < 40 << 20

"""Bounded cost per input: a rejected payload costs time and memory linear in its
bytes with a small constant, whatever it holds.

The figures (time to answer, peak memory, scrape latency during an attack) are
measured side by side with the previous release by ``python -m bench.hostile``;
these tests hold the bounds with wide margins (the code before this change
took 29 s of CPU and 1.3 GB for the 1 MiB body, 1.3 s of CPU per datagram).
"""

from __future__ import annotations

import json
import os
import socket
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from testkit.daemon import Daemon
from testkit.exposition import parse
from testkit.prometheus import wait_until
from tests.training.training_support import line
from trainmon.training.protocol import MAX_PAYLOAD_LINES
from trainmon.training.receiver import MAX_ERRORS_IN_RESPONSE

pytestmark = pytest.mark.integration

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def peak_rss_bytes(pid: int) -> int:
    for row in Path(f"/proc/{pid}/status").read_text().splitlines():
        if row.startswith("VmHWM:"):
            return int(row.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def post(daemon: Daemon, body: bytes) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(daemon.url + "/api/v1/steps", data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def rejected(daemon: Daemon, reason: str) -> float | None:
    return parse(daemon.metrics()).value("trainmon_training_rejected_reports_total",
                                         reason=reason)


@pytest.fixture
def daemon(start_daemon: Callable[..., Daemon]) -> Daemon:
    return start_daemon(config={"collectors": {"gpu": {"enabled": False}}})


def test_a_megabyte_of_junk_lines_costs_little(daemon: Daemon) -> None:
    pid = daemon.process.pid
    cpu, peak = cpu_seconds(pid), peak_rss_bytes(pid)
    status, answer = post(daemon, b"x\n" * (1 << 19))  # 1 MiB, 524 288 lines
    assert status == 400 and answer["error"] == "too_large"
    assert answer["rejected"] == 1  # refused whole, before any line is parsed
    assert cpu_seconds(pid) - cpu < 1.0
    assert peak_rss_bytes(pid) - peak < 50 << 20
    assert rejected(daemon, "too_large") == 1


def test_junk_lines_are_counted_but_only_the_first_errors_kept(daemon: Daemon) -> None:
    body = b"".join([b"{not json\n", b"[1]\n", b"x" * 900 + b"\n"] * 21)  # 63 lines
    status, answer = post(daemon, body + line())
    assert status == 400
    assert answer["accepted"] == 1 and answer["rejected"] == 63
    assert len(answer["errors"]) == MAX_ERRORS_IN_RESPONSE  # type: ignore[arg-type]
    assert rejected(daemon, "malformed") == 63


def test_a_payload_over_the_line_cap_is_refused_whole(daemon: Daemon) -> None:
    status, answer = post(daemon, line() * (MAX_PAYLOAD_LINES + 1))
    assert (status, answer["accepted"], answer["error"]) == (400, 0, "too_large")
    assert post(daemon, line() * MAX_PAYLOAD_LINES)[0] == 200


def test_junk_datagrams_cost_little(daemon: Daemon) -> None:
    config = yaml.safe_load(Path(str(daemon.config_path)).read_text())
    path = config["collectors"]["training"]["socket"]
    pid = daemon.process.pid
    cpu = cpu_seconds(pid)
    junk = [b"x\n" * 32_768, b"{" * 65_000, (b"x" * 1000 + b"\n") * 64]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        for payload in junk * 2:
            sender.sendto(payload, path)
    wait_until(lambda: (rejected(daemon, "too_large") or 0)
               + (rejected(daemon, "malformed") or 0) == 2 + 2 + 2 * 64, 10.0,
               "every datagram handled", interval=0.05)
    assert cpu_seconds(pid) - cpu < 0.6  # six datagrams plus the scrapes that waited

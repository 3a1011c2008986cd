"""Intake: HTTP access rules and the unix datagram socket's life cycle."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.exposition import scrape
from testkit.prometheus import wait_until
from tests.training.training_support import line, push, send_datagram
from trainmon.collectors.training import TrainingCollector
from trainmon.training.protocol import MAX_DATAGRAM_BYTES
from trainmon.training.receiver import SocketReceiver, ingest_payload
from trainmon.training.store import TrainingStore

Make = Callable[..., TrainingCollector]
TOKEN = "s3cret-token-value"


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return path


# -- HTTP access ---------------------------------------------------------------


def test_loopback_push_needs_no_token_while_none_is_configured(make_collector: Make) -> None:
    collector = make_collector()
    assert collector.handle_push(push(line())).status == 200


def test_a_configured_token_is_required_on_loopback_too(
    make_collector: Make, token_file: Path
) -> None:
    collector = make_collector(token_file=token_file)
    response = collector.handle_push(push(line()))
    assert (response.status, response.payload["error"]) == (401, "unauthorized")
    assert collector.handle_push(push(line(), authorization=f"Bearer {TOKEN}")).status == 200


def test_loopback_without_token_can_be_allowed_beside_a_token(
    make_collector: Make, token_file: Path
) -> None:
    collector = make_collector(token_file=token_file, loopback_without_token=True)
    assert collector.handle_push(push(line())).status == 200


def test_loopback_client_the_kernel_cannot_name_is_refused(make_collector: Make) -> None:
    collector = make_collector()
    response = collector.handle_push(push(line(), known_user=False))
    assert (response.status, response.payload["error"]) == (403, "unauthorized")
    assert scrape(collector).labelsets("trainmon_training_steps_total") == []


def test_remote_push_without_configured_token_is_forbidden(make_collector: Make) -> None:
    collector = make_collector()
    response = collector.handle_push(push(line(), loopback=False))
    assert (response.status, response.payload["error"]) == (403, "unauthorized")
    result = scrape(collector)
    assert result.value("trainmon_training_rejected_reports_total", reason="unauthorized") == 1
    assert result.labelsets("trainmon_training_steps_total") == []


@pytest.mark.parametrize(
    ("authorization", "status"),
    [
        (None, 401),
        ("Bearer wrong", 401),
        (f"Bearer {TOKEN}x", 401),
        (f"Basic {TOKEN}", 401),
        (f"Bearer {TOKEN}", 200),
    ],
)
def test_remote_push_needs_the_bearer_token(
    make_collector: Make, token_file: Path, authorization: str | None, status: int
) -> None:
    collector = make_collector(token_file=token_file)
    response = collector.handle_push(push(line(), loopback=False, authorization=authorization))
    assert response.status == status, response.payload
    steps = scrape(collector).value("trainmon_training_steps_total", job="resnet50", rank="0")
    assert steps == (10 if status == 200 else None)


def test_wrong_token_from_loopback_is_refused(make_collector: Make, token_file: Path) -> None:
    collector = make_collector(token_file=token_file)
    assert collector.handle_push(push(line(), authorization="Bearer nope")).status == 401


def test_unreadable_token_file_leaves_loopback_only(make_collector: Make, tmp_path: Path) -> None:
    collector = make_collector(token_file=tmp_path / "missing")
    assert "token_error" in collector.health()
    assert collector.handle_push(push(line())).status == 200  # loopback, named by the kernel
    remote = collector.handle_push(push(line(), loopback=False, authorization="Bearer x"))
    assert remote.status == 403


def test_oversized_body_answers_413_and_is_counted(make_collector: Make) -> None:
    collector = make_collector()
    response = collector.handle_push(push(b"", too_large=True))
    assert (response.status, response.payload["error"]) == (413, "too_large")
    assert scrape(collector).value(
        "trainmon_training_rejected_reports_total", reason="too_large"
    ) == 1


# -- unix datagram socket ------------------------------------------------------


def test_socket_receives_reports(make_collector: Make, socket_path: Path) -> None:
    collector = make_collector(socket=socket_path)
    assert socket_path.exists()
    send_datagram(socket_path, line(rank=0) + line(rank=1))
    wait_until(lambda: scrape(collector).value(
        "trainmon_training_reports_total", transport="unix") == 2, 5.0,
        "two reports over the socket", interval=0.01)
    result = scrape(collector)
    assert result.value("trainmon_training_steps_total", job="resnet50", rank="1") == 10
    assert result.value("trainmon_training_socket_up") == 1
    assert collector.socket_endpoint == f"unix://{socket_path}"


def test_measured_comm_arrives_over_socket_and_http_alike(
    make_collector: Make, socket_path: Path
) -> None:
    collector = make_collector(socket=socket_path)
    measured = {"comm_seconds": 1.2, "comm_exposed_seconds": 0.3, "comm_bytes": 5_000}
    send_datagram(socket_path, line(rank=0, **measured)
                  + line(rank=1, comm_seconds=1.0, comm_exposed_seconds=1.1))  # refused
    assert collector.handle_push(push(line(rank=2, **measured))).status == 200
    wait_until(lambda: scrape(collector).value(
        "trainmon_training_rejected_reports_total", reason="invalid_field") == 1, 5.0,
        "the datagram's two lines handled", interval=0.01)
    result = scrape(collector)
    assert result.value("trainmon_training_reports_total", transport="unix") == 1
    for rank in ("0", "2"):
        labels = {"job": "resnet50", "rank": rank}
        assert result.value("trainmon_training_comm_seconds_total", **labels) == 1.2
        assert result.value("trainmon_training_comm_exposed_seconds_total", **labels) == 0.3
        assert result.value("trainmon_training_comm_bytes_total", **labels) == 5_000
    assert sorted(labels["rank"] for labels in result.labelsets(
        "trainmon_training_steps_total")) == ["0", "2"]


def test_socket_folder_created_with_mode_and_buffer(
    make_collector: Make, socket_path: Path
) -> None:
    collector = make_collector(socket=socket_path, socket_mode=0o660,
                               receive_buffer_bytes=1 << 20)
    assert socket_path.parent.is_dir()
    mode = os.lstat(socket_path).st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o660
    health = collector.health()
    assert health["socket_listening"] is True
    assert int(health["receive_buffer_bytes"]) >= 1 << 20  # type: ignore[call-overload]


def test_stale_socket_is_replaced(make_collector: Make, socket_path: Path) -> None:
    socket_path.parent.mkdir(parents=True)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    stale.bind(str(socket_path))
    stale.close()  # the file stays, nobody listens: what a killed daemon leaves
    collector = make_collector(socket=socket_path)
    send_datagram(socket_path, line())
    wait_until(lambda: scrape(collector).value(
        "trainmon_training_steps_total", job="resnet50", rank="0") == 10, 5.0,
        "the report through the replaced socket", interval=0.01)


def test_live_socket_of_another_daemon_is_not_stolen(
    make_collector: Make, socket_path: Path
) -> None:
    first = make_collector(socket=socket_path)
    second = make_collector(socket=socket_path)
    assert first.health()["socket_listening"] is True
    assert second.health()["socket_listening"] is False
    assert "in use" in str(second.health()["socket_error"])
    assert scrape(second).value("trainmon_training_socket_up") == 0
    assert second.handle_push(push(line())).status == 200  # HTTP still works


def test_regular_file_in_the_way_is_left_alone(make_collector: Make, socket_path: Path) -> None:
    socket_path.parent.mkdir(parents=True)
    socket_path.write_text("precious")
    collector = make_collector(socket=socket_path)
    assert collector.health()["socket_listening"] is False
    assert socket_path.read_text() == "precious"


def test_stop_removes_the_socket_promptly(make_collector: Make, socket_path: Path) -> None:
    collector = make_collector(socket=socket_path)
    started = time.monotonic()
    collector.stop()
    assert time.monotonic() - started < 1.0
    assert not socket_path.exists()
    collector.stop()  # twice is fine


def test_oversized_datagram_is_rejected_whole(make_collector: Make, socket_path: Path) -> None:
    collector = make_collector(socket=socket_path)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        sender.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * MAX_DATAGRAM_BYTES)
        sender.sendto(line() * (MAX_DATAGRAM_BYTES // len(line()) + 5), str(socket_path))
    wait_until(lambda: scrape(collector).value(
        "trainmon_training_rejected_reports_total", reason="too_large") == 1, 5.0,
        "the too-large datagram to be counted", interval=0.01)
    assert scrape(collector).labelsets("trainmon_training_steps_total") == []


def test_socket_names_each_sender_as_the_kernel_sees_it(socket_path: Path) -> None:
    """SO_PASSCRED: every datagram carries its sender's pid (SCM_CREDENTIALS), which
    the checkpoint storage lookup trusts over the pid a report claims; HTTP has none."""
    store = TrainingStore()
    receiver = SocketReceiver(socket_path, store, max_label_length=128)
    receiver.start()
    try:
        send_datagram(socket_path, line(rank=0, pid=31337))  # claims a pid it is not
        sender = subprocess.run(
            [sys.executable, "-c",
             "import os, socket, sys; s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); "
             "s.sendto(sys.stdin.buffer.read(), sys.argv[1]); print(os.getpid())",
             str(socket_path)],
            input=line(rank=1), capture_output=True, check=True,
        )
        ingest_payload(store, line(rank=2), "http", 128)
        wait_until(lambda: len(store.snapshot().ranks) == 3, 5.0, "three ranks stored",
                   interval=0.01)
    finally:
        receiver.stop()
    senders = {view.rank: view.sender_pid for view in store.snapshot().ranks}
    assert senders == {0: os.getpid(), 1: int(sender.stdout), 2: None}

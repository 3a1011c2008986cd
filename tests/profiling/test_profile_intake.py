"""The ``"type": "profile"`` line and the descriptor beside it on the step socket
(``trainmon.training.protocol``, ``trainmon.training.receiver``)."""

from __future__ import annotations

import array
import json
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.training.training_support import line
from trainmon.training.protocol import ProfiledOperator, ProfileReport, ReportError, parse
from trainmon.training.receiver import SocketReceiver, ingest_payload
from trainmon.training.store import TrainingStore


def profile_line(**changes: object) -> bytes:
    base: dict[str, object] = {
        "v": 1, "type": "profile", "job": "resnet50", "rank": 0, "world_size": 8,
        "reporter_id": "a1b2c3d4e5f60718", "run": "run-1", "id": "0123456789abcdef",
        "steps": 5, "seconds": 1.5, "self_cpu_seconds": 1.2,
        "top_cpu": [{"name": "aten::mm", "self_seconds": 0.5, "share": 0.41, "calls": 20}],
    }
    base.update(changes)
    return json.dumps(base).encode() + b"\n"


def test_a_profile_line_parses_with_its_operators() -> None:
    parsed = parse(profile_line().rstrip(b"\n"))
    assert isinstance(parsed, ProfileReport)
    assert parsed.top_cpu == (ProfiledOperator("aten::mm", 0.5, 0.41, 20),)
    assert (parsed.id, parsed.steps, parsed.top_device, parsed.error) == (
        "0123456789abcdef", 5, (), None)


@pytest.mark.parametrize("changes", [
    {"id": "NOT-HEX"}, {"id": "abc"}, {"steps": -1}, {"steps": 10_000}, {"seconds": "x"},
    {"top_cpu": [{"name": "a", "self_seconds": 1, "share": 1.5, "calls": 1}]},
    {"top_cpu": [{"name": "", "self_seconds": 1, "share": 0.5, "calls": 1}]},
    {"top_cpu": [{"name": "a\x00b", "self_seconds": 1, "share": 0.5, "calls": 1}]},
    {"top_cpu": [{"name": "a", "self_seconds": 1, "share": 0.5, "calls": 1}] * 11},
    {"top_device": "aten::mm"}, {"error": "x" * 301},
])
def test_a_profile_line_out_of_bounds_is_refused(changes: dict[str, object]) -> None:
    with pytest.raises(ReportError):
        parse(profile_line(**changes).rstrip(b"\n"))


def test_an_operator_name_or_error_that_names_a_secret_is_redacted() -> None:
    parsed = parse(profile_line(
        error="cannot export to https://user:hunter2@example.com/x",
        top_cpu=[{"name": "load(https://bob:s3cret@example.com/data)", "self_seconds": 1,
                  "share": 0.5, "calls": 1}]).rstrip(b"\n"))
    assert isinstance(parsed, ProfileReport)
    assert "hunter2" not in str(parsed.error) and "s3cret" not in parsed.top_cpu[0].name


def test_without_a_profile_sink_the_line_is_refused_and_its_descriptor_closed() -> None:
    store = TrainingStore()
    read_end, write_end = os.pipe()
    os.close(write_end)
    result = ingest_payload(store, profile_line(), "unix", 128, attachment=read_end)
    assert result.rejected == 1 and result.errors[0].reason == "invalid_field"
    with pytest.raises(OSError):
        os.fstat(read_end)


class Sink:
    def __init__(self) -> None:
        self.taken: list[tuple[ProfileReport, int | None, str]] = []
        self.arrived = threading.Event()

    def __call__(self, report: ProfileReport, descriptor: int | None, identity: str) -> None:
        content = None if descriptor is None else os.pread(descriptor, 100, 0)
        if descriptor is not None:
            os.close(descriptor)
        self.taken.append((report, None if content is None else len(content), identity))
        self.arrived.set()


@pytest.fixture
def receiving(tmp_path: Path) -> Iterator[tuple[Path, TrainingStore, Sink]]:
    store, sink = TrainingStore(), Sink()
    path = tmp_path / "run" / "steps.sock"
    receiver = SocketReceiver(path, store, max_label_length=128, profiles=sink)
    receiver.start()
    yield path, store, sink
    receiver.stop()


def send_with(path: Path, payload: bytes, descriptors: list[int]) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", descriptors))]
        sock.sendmsg([payload], rights, 0, str(path))


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_the_descriptor_beside_a_profile_line_reaches_the_sink_with_the_sender(
        receiving: tuple[Path, TrainingStore, Sink], tmp_path: Path) -> None:
    path, _, sink = receiving
    trace = tmp_path / "trace"
    trace.write_bytes(b"0123456789")
    with trace.open("rb") as file:
        send_with(path, profile_line(), [file.fileno()])
    assert sink.arrived.wait(5)
    report, size, identity = sink.taken[0]
    assert (report.id, size, identity) == ("0123456789abcdef", 10, f"uid:{os.geteuid()}")


def test_descriptors_beside_anything_else_are_closed_and_two_are_refused(
        receiving: tuple[Path, TrainingStore, Sink], tmp_path: Path) -> None:
    path, store, sink = receiving
    before = open_descriptors()
    with open(os.devnull, "rb") as first, open(os.devnull, "rb") as second:
        for _ in range(20):
            send_with(path, line(), [first.fileno()])  # a step report with a descriptor
        send_with(path, profile_line(), [first.fileno(), second.fileno()])
    send_with(path, line(rank=1), [])
    deadline = threading.Event()
    for _ in range(100):
        if len(store.snapshot().ranks) == 2:
            break
        deadline.wait(0.05)
    snapshot = store.snapshot()
    assert len(snapshot.ranks) == 2 and snapshot.rejected["too_large"] == 1
    assert sink.taken == []
    assert open_descriptors() <= before  # none of the 22 received descriptors stayed open

"""Profile requests: their bounds, the request file the daemon publishes, and how a
client reads it (``trainmon.profiling.requests``, ``trainmon.client.profiling``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from trainmon.client.profiling import ProfileAsk, RequestWatch
from trainmon.profiling.requests import ProfileRequests, RequestRefused


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def requests_in(folder: Path, clock: Clock, **bounds: float) -> ProfileRequests:
    ids = iter(f"{index:032x}" for index in range(1, 100))
    return ProfileRequests(folder / "profile-requests.json", max_open=int(bounds.get(
        "max_open", 2)), timeout_seconds=bounds.get("timeout", 30.0), clock=clock,
        wall_clock=lambda: 1_700_000_000.0 + clock.now, new_id=lambda: next(ids))


def test_an_open_request_is_published_and_leaves_the_file_when_answered(tmp_path: Path) -> None:
    clock = Clock()
    requests = requests_in(tmp_path, clock)
    opened = requests.open("resnet", "uid:1000", "uid:1000", (0, 1), 5)
    document = json.loads((tmp_path / "profile-requests.json").read_text())
    assert document == {"v": 1, "requests": [{
        "id": opened.id, "job": "resnet", "ranks": [0, 1], "steps": 5,
        "expires": 1_700_000_000.0 + 130.0}]}
    assert os.stat(tmp_path / "profile-requests.json").st_mode & 0o777 == 0o644

    assert requests.expecting(opened.id, "resnet", 0) is opened
    assert requests.expecting(opened.id, "resnet", 2) is None  # not asked
    assert requests.expecting(opened.id, "other", 0) is None
    requests.finish(opened.id, 0, {"state": "stored", "trace": "/x"})
    assert requests.expecting(opened.id, "resnet", 0) is None  # answered once
    assert (tmp_path / "profile-requests.json").exists()
    requests.finish(opened.id, 1, {"state": "failed", "error": "no torch"})
    assert not (tmp_path / "profile-requests.json").exists()
    status = requests.status(opened.id)
    assert status is not None and status["open"] is False
    assert status["ranks_state"] == {"0": {"state": "stored", "trace": "/x"},
                                     "1": {"state": "failed", "error": "no torch"}}


def test_one_request_per_job_and_at_most_max_open(tmp_path: Path) -> None:
    requests = requests_in(tmp_path, Clock(), max_open=2)
    requests.open("a", "uid:1", "uid:1", (0,), 5)
    with pytest.raises(RequestRefused) as conflict:
        requests.open("a", "uid:1", "uid:1", (0,), 5)
    assert (conflict.value.reason, conflict.value.status) == ("conflict", 409)
    requests.open("b", "uid:1", "uid:1", (0,), 5)
    with pytest.raises(RequestRefused) as full:
        requests.open("c", "uid:1", "uid:1", (0,), 5)
    assert (full.value.reason, full.value.status) == ("limit", 429)


def test_a_request_nobody_answers_expires_and_frees_its_job(tmp_path: Path) -> None:
    clock = Clock()
    requests = requests_in(tmp_path, clock, timeout=30.0)
    opened = requests.open("a", "uid:1", "uid:1", (0, 3), 5)
    requests.finish(opened.id, 0, {"state": "receiving"})
    clock.now += 30.0
    assert requests.open_count() == 0 and requests.expired == 2
    assert not (tmp_path / "profile-requests.json").exists()
    status = requests.status(opened.id)
    assert status is not None
    assert status["ranks_state"] == {"0": {"state": "expired"}, "3": {"state": "expired"}}
    requests.open("a", "uid:1", "uid:1", (0,), 5)  # the job may be asked again


def test_the_client_reads_the_file_once_per_change_and_each_request_once(
        tmp_path: Path) -> None:
    socket_path = tmp_path / "steps.sock"
    socket_path.write_bytes(b"")  # stands in for the socket: its owner is the daemon's
    requests = requests_in(tmp_path, Clock())
    watch = RequestWatch(str(tmp_path / "profile-requests.json"), str(socket_path))
    assert watch.poll("resnet", 1) is None  # no file
    opened = requests.open("resnet", "uid:0", "uid:0", (1,), 7)
    assert watch.poll("resnet", 0) is None  # another rank
    watch = RequestWatch(str(tmp_path / "profile-requests.json"), str(socket_path))
    assert watch.poll("resnet", 1) == ProfileAsk(opened.id, 7)
    assert watch.poll("resnet", 1) is None  # unchanged file: one stat
    os.utime(tmp_path / "profile-requests.json", ns=(1, 1))
    assert watch.poll("resnet", 1) is None  # changed, but already answered


@pytest.mark.parametrize("document", [
    b"not json", b"[]", b'{"requests": 7}',
    b'{"requests": [{"id": "XYZ", "job": "j", "ranks": [0], "steps": 5}]}',
    b'{"requests": [{"id": "0123456789abcdef", "job": "j", "ranks": [0], "steps": 0}]}',
    b'{"requests": [{"id": "0123456789abcdef", "job": "j", "ranks": 0, "steps": 5}]}',
])
def test_a_request_file_that_does_not_parse_asks_nothing(tmp_path: Path,
                                                         document: bytes) -> None:
    (tmp_path / "steps.sock").write_bytes(b"")
    (tmp_path / "profile-requests.json").write_bytes(document)
    assert RequestWatch(str(tmp_path / "profile-requests.json"),
                        str(tmp_path / "steps.sock")).poll("j", 0) is None


def test_a_request_file_of_another_user_than_the_sockets_is_ignored(tmp_path: Path) -> None:
    (tmp_path / "steps.sock").write_bytes(b"")
    path = tmp_path / "profile-requests.json"
    path.write_text('{"requests": [{"id": "0123456789abcdef", "job": "j", "ranks": [0], '
                    '"steps": 5}]}')
    if os.geteuid() != 0:
        pytest.skip("needs root to give the file another owner")
    os.chown(path, 12345, 12345)
    assert RequestWatch(str(path), str(tmp_path / "steps.sock")).poll("j", 0) is None
    os.chown(path, 0, 0)
    assert RequestWatch(str(path), str(tmp_path / "steps.sock")).poll("j", 0) == ProfileAsk(
        "0123456789abcdef", 5)

"""The reporter's side of on-demand profiles (``trainmon.client.profiling``): armed by
the request file, ``step()`` swapped on the instance for the profiled steps only, the
line and the trace's descriptor sent, failures said once and never raised."""

from __future__ import annotations

import gzip
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from trainmon.client import Reporter
from trainmon.training.protocol import ProfileReport, parse

torch_profile = pytest.importorskip("trainmon.client.torch_profile")  # imports torch

REQUEST = "0123456789abcdef0123456789abcdef"


class FakeProfiler:
    """Stands in for ``torch.profiler.profile`` (the real one: tests/profiling)."""

    def __init__(self) -> None:
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True

    def key_averages(self) -> list[Any]:
        event = type("Event", (), {"key": "aten::mm", "self_cpu_time_total": 750.0,
                                   "self_device_time_total": 0.0, "count": 3})
        other = type("Event", (), {"key": "aten::relu", "self_cpu_time_total": 250.0,
                                   "self_device_time_total": 0.0, "count": 3})
        return [event, other]

    def export_chrome_trace(self, path: str) -> None:
        Path(path).write_text('{"traceEvents": [{"name": "aten::mm"}]}')


class Daemon:
    """A bound datagram socket standing in for the daemon, and its request file."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "steps.sock"
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.socket.bind(str(self.path))
        self.socket.settimeout(10)

    def ask(self, job: str, ranks: list[int], steps: int) -> None:
        (self.path.parent / "profile-requests.json").write_text(json.dumps({
            "v": 1, "requests": [{"id": REQUEST, "job": job, "ranks": ranks,
                                  "steps": steps, "expires": 0}]}))

    def profile_line(self) -> tuple[ProfileReport, bytes | None]:
        """The next profile line, and the trace behind its descriptor, if one came."""
        while True:
            data, ancillary, _, _ = self.socket.recvmsg(1 << 16, socket.CMSG_SPACE(8))
            for line in data.splitlines():
                if b'"type":"profile"' in line:
                    report = parse(line)
                    assert isinstance(report, ProfileReport)
                    trace = None
                    for _, _, payload in ancillary:
                        descriptor = int.from_bytes(payload[:4], "little")
                        trace = os.pread(descriptor, 1 << 20, 0)
                        os.close(descriptor)
                    return report, trace


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    made = Daemon(tmp_path)
    yield made
    made.socket.close()


@pytest.fixture
def profilers(monkeypatch: pytest.MonkeyPatch) -> list[FakeProfiler]:
    started: list[FakeProfiler] = []

    def start() -> FakeProfiler:
        started.append(FakeProfiler())
        return started[-1]

    monkeypatch.setattr(torch_profile, "start_profiler", start)
    return started


def poll(reporter: Reporter) -> None:
    """What the sender thread does after each report."""
    reporter._profiles.poll(reporter.job, reporter.rank)


def test_a_request_profiles_steps_from_the_next_boundary_and_sends_the_trace(
        daemon: Daemon, profilers: list[FakeProfiler]) -> None:
    reporter = Reporter(job="mlp", rank=0, world_size=1, endpoint=f"unix://{daemon.path}",
                        interval_seconds=3600)
    try:
        assert "step" not in vars(reporter)
        daemon.ask("mlp", [0], 2)
        poll(reporter)
        assert "step" in vars(reporter)  # armed: the next step() starts the profile
        reporter.step()
        assert len(profilers) == 1 and not profilers[0].stopped
        reporter.step()
        assert "step" in vars(reporter)
        reporter.step()  # the second profiled step: stopped, disarmed
        assert profilers[0].stopped and "step" not in vars(reporter)
        report, trace = daemon.profile_line()
        assert (report.id, report.steps, report.error) == (REQUEST, 2, None)
        assert [(op.name, op.share, op.calls) for op in report.top_cpu] == [
            ("aten::mm", 0.75, 3), ("aten::relu", 0.25, 3)]
        assert report.self_cpu_seconds == pytest.approx(0.001)
        assert trace is not None and json.loads(gzip.decompress(trace))["traceEvents"]
        assert reporter.report()["steps"] == 3  # every step counted as ever
        poll(reporter)
        assert "step" not in vars(reporter)  # the same request is not taken twice
    finally:
        reporter.close()
    assert reporter._profiles.sent == 1


def test_a_request_for_another_rank_or_job_leaves_step_alone(
        daemon: Daemon, profilers: list[FakeProfiler]) -> None:
    reporter = Reporter(job="mlp", rank=1, world_size=2, endpoint=f"unix://{daemon.path}",
                        interval_seconds=3600)
    try:
        daemon.ask("mlp", [0], 2)
        poll(reporter)
        daemon.ask("other", [1], 2)
        poll(reporter)
        assert "step" not in vars(reporter)
    finally:
        reporter.close()


def test_a_profiler_that_fails_is_said_once_and_training_goes_on(
        daemon: Daemon, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> None:
        raise RuntimeError("profiler is broken")

    monkeypatch.setattr(torch_profile, "start_profiler", broken)
    reporter = Reporter(job="mlp", rank=0, world_size=1, endpoint=f"unix://{daemon.path}",
                        interval_seconds=3600)
    try:
        daemon.ask("mlp", [0], 2)
        poll(reporter)
        reporter.step()  # must not raise
        assert "step" not in vars(reporter)
        report, trace = daemon.profile_line()
        assert report.error == "RuntimeError: profiler is broken" and trace is None
        reporter.step()
    finally:
        reporter.close()
    assert reporter._profiles.failed == 1
    assert [record.levelname for record in caplog.records
            if "profile" in record.getMessage()] == ["WARNING"]


def test_a_run_that_closes_during_a_profile_says_so(
        daemon: Daemon, profilers: list[FakeProfiler]) -> None:
    reporter = Reporter(job="mlp", rank=0, world_size=1, endpoint=f"unix://{daemon.path}",
                        interval_seconds=3600)
    daemon.ask("mlp", [0], 5)
    poll(reporter)
    reporter.step()
    reporter.step()
    reporter.close()
    assert profilers[0].stopped and "step" not in vars(reporter)
    report, _ = daemon.profile_line()
    assert report.error == "the run closed after 1 of 5 steps"


def test_a_reporter_over_http_never_looks_for_requests(tmp_path: Path) -> None:
    reporter = Reporter(job="mlp", endpoint="http://127.0.0.1:9", interval_seconds=3600)
    try:
        assert reporter._profiles.watch.path is None
    finally:
        reporter.close()

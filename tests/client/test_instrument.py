"""``Reporter.add_comm`` and ``Reporter.instrument`` on real ``torch.distributed`` jobs.

The jobs are ``testkit.ddp_job``: two processes per job on CPU/gloo,
started with the environment ``torchrun`` gives (RANK, WORLD_SIZE,
MASTER_ADDR, a free port, TORCHELASTIC_RUN_ID), reporting over a unix datagram
socket that the test binds. Every report is validated with the daemon's own
``parse_report``, which enforces ``comm_exposed_seconds ≤ comm_seconds`` and
``≤ step_seconds``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from testkit.daemon import free_port
from testkit.processes import run_all
from trainmon.client import Reporter
from trainmon.client.comm import merged_groups
from trainmon.training.protocol import StepReport, parse, parse_report

JOB_TIMEOUT_SECONDS = 150


class ReportSink:
    """A unix datagram socket collecting every report sent to it, validated."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "steps.sock"
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._socket.bind(str(self.path))
        self._socket.settimeout(0.1)
        self.reports: list[StepReport] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"unix://{self.path}"

    def _receive(self) -> None:
        while not self._stop.is_set():
            try:
                payload = self._socket.recv(65_536)
            except TimeoutError:
                continue
            for line in payload.splitlines():
                parsed = parse(line)  # raises on an invalid report or run description
                if isinstance(parsed, StepReport):
                    self.reports.append(parsed)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._socket.close()

    def final(self, job: str) -> dict[int, StepReport]:
        """The last report of each rank of ``job``."""
        return {report.rank: report for report in self.reports if report.job == job}


@pytest.fixture
def sink() -> Iterator[ReportSink]:
    # A short path: unix socket paths are limited to 107 bytes.
    with tempfile.TemporaryDirectory(prefix="tm-", dir="/tmp") as directory:
        receiver = ReportSink(Path(directory))
        yield receiver
        receiver.close()


@dataclass
class Job:
    reports: dict[int, StepReport]
    results: dict[int, dict[str, Any]]
    all_reports: list[StepReport]


def run_job(sink: ReportSink, job: str, mode: str, *args: str, world_size: int = 2) -> Job:
    """Run ``testkit.ddp_job`` as ``world_size`` ranks, the way torchrun starts them."""
    port = free_port()
    results = Path(sink.path).parent
    commands: list[tuple[list[str], dict[str, str]]] = []
    for rank in range(world_size):
        env = dict(
            os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
            LOCAL_WORLD_SIZE=str(world_size), GROUP_RANK="0", MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port), TORCHELASTIC_RUN_ID="trainmon-test",
            TRAINMON_ENDPOINT=sink.endpoint, OMP_NUM_THREADS="1",
        )
        command = [sys.executable, "-m", "testkit.ddp_job", mode, *args,
                   "--result", str(results / f"{rank}.json"), "--output", str(results / "out")]
        commands.append((command, env))
    run_all(commands, JOB_TIMEOUT_SECONDS)
    sink.close()  # every datagram sent by now has been read
    loaded = {rank: json.loads((results / f"{rank}.json").read_text())
              for rank in range(world_size)}
    final = sink.final(job)
    assert sorted(final) == list(range(world_size)), sink.reports
    return Job(final, loaded, [report for report in sink.reports if report.job == job])


def assert_monotonic_and_consistent(reports: list[StepReport]) -> None:
    """Each rank's comm totals never shrink, and bytes come with seconds."""
    last: dict[int, tuple[float, float, int]] = {}
    for report in reports:
        if report.comm_seconds is None:
            assert report.comm_bytes is None and report.comm_exposed_seconds is None
            continue
        assert report.comm_bytes is not None
        now = (report.comm_seconds, report.comm_exposed_seconds or 0.0, report.comm_bytes)
        before = last.get(report.rank, (0.0, 0.0, 0))
        assert all(a >= b for a, b in zip(now, before, strict=True)), (before, now)
        last[report.rank] = now


# -- add_comm: the protocol's constraints on the client side ------------------------------


@pytest.fixture
def reporter(tmp_path: Path) -> Iterator[Reporter]:
    instance = Reporter("unit", endpoint=f"unix://{tmp_path}/absent.sock", environ={},
                        interval_seconds=60)
    yield instance
    instance.close()


def test_comm_fields_are_absent_until_measured(reporter: Reporter) -> None:
    reporter.step()
    assert not {"comm_seconds", "comm_bytes", "comm_exposed_seconds"} & set(reporter.report())

    reporter.add_comm(0.25, nbytes=1000)

    report = reporter.report()
    assert (report["comm_seconds"], report["comm_bytes"]) == (0.25, 1000)
    assert "comm_exposed_seconds" not in report  # exposed never said: unknown


def test_communication_added_per_group_travels_in_comm_groups(reporter: Reporter) -> None:
    reporter.add_comm(0.5, exposed_seconds=0.2, nbytes=100, group="tp", collectives=4)
    reporter.add_comm(0.25, nbytes=50, group="dp")
    reporter.add_comm(0.1, group="bad name")  # not a label: counted as other
    reporter.step()
    report = reporter.report()
    groups = report["comm_groups"]
    assert isinstance(groups, dict) and set(groups) == {"tp", "dp", "other"}
    assert groups["tp"]["collectives"] == 4 and groups["tp"]["bytes"] == 100
    assert groups["tp"]["seconds"] == 0.5
    # exposed time is sent as at most the rank's step seconds (here a few microseconds)
    assert groups["tp"]["exposed_seconds"] == min(0.2, report["step_seconds"])
    assert "exposed_seconds" not in groups["dp"]  # never said: unknown
    parsed = parse_report(json.dumps(report).encode())  # the daemon takes it
    assert parsed.comm_groups is not None and parsed.comm_groups["dp"].bytes == 50


def test_groups_past_the_protocols_limit_are_counted_as_other(reporter: Reporter) -> None:
    for index in range(12):
        reporter.add_comm(0.01, nbytes=1, group=f"g{index}")
    groups = reporter.report()["comm_groups"]
    assert isinstance(groups, dict) and len(groups) == 8 and groups["other"]["bytes"] == 5
    parse_report(json.dumps(reporter.report()).encode())


def test_exposed_counts_when_the_step_ends_and_never_exceeds_it(reporter: Reporter) -> None:
    reporter.step()  # a step of a few microseconds follows
    reporter.add_comm(2.0, exposed_seconds=5.0, nbytes=8)  # exposed > seconds: clamped to 2.0

    between = reporter.report()  # sent before the step ends: nothing exposed yet
    assert between["comm_exposed_seconds"] == 0.0
    parse_report(json.dumps(between).encode())
    reporter.step()
    after = reporter.report()
    before, total = between["step_seconds"], after["step_seconds"]
    assert isinstance(before, float) and isinstance(total, float)
    # a 2 s wait cannot fit in a step of microseconds: it is that step's length
    assert after["comm_exposed_seconds"] == pytest.approx(total - before)
    parse_report(json.dumps(after).encode())


@pytest.mark.parametrize(
    ("seconds", "exposed", "nbytes", "expected"),
    [
        (-1.0, None, 10, None),                   # negative seconds: the whole call ignored
        (math.nan, 0.1, 10, None),
        (math.inf, None, 10, None),
        ("1.0", None, 10, None),
        (1.0, -0.5, 10, (1.0, 0.0, 10)),          # a bad exposed value alone is dropped
        (1.0, math.nan, -3, (1.0, 0.0, 0)),       # a bad byte count counts as none
    ],
)
def test_bad_values_are_ignored_not_raised(
    reporter: Reporter, seconds: Any, exposed: Any, nbytes: Any,
    expected: tuple[float, float, int] | None,
) -> None:
    reporter.add_comm(0.0, exposed_seconds=0.0)  # measured: fields present from here on
    reporter.add_comm(seconds, exposed, nbytes)
    reporter.step()
    report = reporter.report()
    if expected is None:
        assert (report["comm_seconds"], report["comm_bytes"]) == (0.0, 0)
    else:
        got = (report["comm_seconds"], report["comm_exposed_seconds"], report["comm_bytes"])
        assert got == expected


def test_add_comm_from_many_threads_loses_nothing(reporter: Reporter) -> None:
    def add() -> None:
        for _ in range(2000):
            reporter.add_comm(0.001, nbytes=3)

    threads = [threading.Thread(target=add) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    report = reporter.report()
    assert report["comm_bytes"] == 4 * 2000 * 3
    assert report["comm_seconds"] == pytest.approx(8.0)


# -- instrument(): unsupported models ---------------------------------------------------


def test_a_plain_model_warns_once_and_comes_back_unmeasured(
    reporter: Reporter, caplog: pytest.LogCaptureFixture
) -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(4, 2)

    with caplog.at_level(logging.WARNING, logger="trainmon"):
        returned = reporter.instrument(model)
    reporter.step()

    assert returned is model
    warnings = [record for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1 and "not measured" in warnings[0].getMessage()
    assert "comm_seconds" not in reporter.report()


def test_something_that_is_not_a_module_is_returned_as_is(reporter: Reporter) -> None:
    pytest.importorskip("torch")
    thing = object()
    assert reporter.instrument(thing) is thing


# -- instrument(): real jobs ------------------------------------------------------------


@pytest.mark.integration
def test_ddp_job_reports_comm_and_exact_gradient_bytes(sink: ReportSink) -> None:
    steps = 5
    job = run_job(sink, "ddp-job", "ddp", "--steps", str(steps))

    assert_monotonic_and_consistent(job.all_reports)
    for rank, report in job.reports.items():
        grad_bytes = job.results[rank]["gradient_bytes"]
        assert report.steps == steps
        assert report.comm_seconds is not None and report.comm_seconds > 0
        # Every parameter is in exactly one bucket, whatever the bucketing: one
        # all-reduce of all gradient bytes per backward (instrumented twice: once).
        assert report.comm_bytes == grad_bytes * steps
        assert report.comm_exposed_seconds is not None
        assert 0 < report.comm_exposed_seconds <= report.comm_seconds
        assert report.phase_seconds == {}  # measured comm has its own fields


@pytest.mark.integration
def test_the_timed_default_all_reduce_gives_the_bare_models_gradients(sink: ReportSink) -> None:
    # instrument() all-reduces the default hook's buckets itself: the gradients must be,
    # bit for bit, those of DDP's built-in all-reduce (world size 2: halving is exact).
    steps = 2
    timed = run_job(sink, "ddp-job", "ddp", "--steps", str(steps))
    with tempfile.TemporaryDirectory(prefix="tm-", dir="/tmp") as directory:
        bare_sink = ReportSink(Path(directory))
        try:
            bare = run_job(bare_sink, "ddp-job", "ddp", "--steps", str(steps), "--bare")
        finally:
            bare_sink.close()

    for rank in (0, 1):
        assert timed.results[rank]["first_grad"] == bare.results[rank]["first_grad"]
        assert timed.reports[rank].comm_bytes == timed.results[rank]["gradient_bytes"] * steps
        assert bare.reports[rank].comm_seconds is None  # not instrumented: not measured


@pytest.mark.integration
def test_the_fast_rank_waits_for_the_slow_one(sink: ReportSink) -> None:
    steps, sleep = 6, 0.15
    job = run_job(sink, "ddp-job", "ddp", "--steps", str(steps),
                  "--slow-rank", "1", "--sleep", str(sleep))

    fast, slow = job.reports[0], job.reports[1]
    assert fast.comm_exposed_seconds is not None and slow.comm_exposed_seconds is not None
    # Rank 1 computes 0.15 s longer per step; rank 0's all-reduce waits for it.
    assert fast.comm_exposed_seconds - slow.comm_exposed_seconds > 0.6 * steps * sleep
    assert fast.comm_exposed_seconds > 3 * slow.comm_exposed_seconds


@pytest.mark.integration
def test_a_user_hook_passed_to_instrument_is_applied(sink: ReportSink) -> None:
    torch = pytest.importorskip("torch")
    steps = 3
    job = run_job(sink, "ddp-job", "ddp", "--steps", str(steps), "--hook", "fp16")

    grads = [torch.tensor(job.results[rank]["first_grad"]) for rank in (0, 1)]
    assert torch.equal(grads[0], grads[1])  # all-reduced
    assert torch.equal(grads[0].half().float(), grads[0])  # through float16: the hook ran
    for rank, report in job.reports.items():
        # the float16 all-reduce moves half the bytes of the float32 gradients
        assert report.comm_bytes == job.results[rank]["gradient_bytes"] * steps // 2
        assert report.comm_seconds is not None and report.comm_seconds > 0


def fsdp_bytes_per_step(width: int, depth: int, world_size: int) -> int:
    """FSDP2 on each Linear, float32: per step each rank contributes its shard to
    an all-gather in forward and again in backward (non-root modules reshard after
    forward) and the full padded gradient to a reduce-scatter; dim 0 of every
    parameter is padded to a multiple of the world size."""
    def padded(rows: int, columns: int) -> int:
        return -(-rows // world_size) * world_size * columns

    numel = depth * (padded(width, width) + padded(width, 1)) + padded(1, width) + padded(1, 1)
    return (2 * numel // world_size + numel) * 4


@pytest.mark.integration
def test_fsdp2_job_reports_its_collectives(sink: ReportSink) -> None:
    steps, width, depth = 4, 256, 4
    job = run_job(sink, "fsdp-job", "fsdp", "--steps", str(steps),
                  "--width", str(width), "--depth", str(depth))

    assert_monotonic_and_consistent(job.all_reports)
    for report in job.reports.values():
        assert report.comm_bytes == fsdp_bytes_per_step(width, depth, 2) * steps
        assert report.comm_seconds is not None and report.comm_seconds > 0
        # on CPU the rank waits for nearly all of them: FSDP2's all-gathers are
        # prefetched (asynchronous), so a little of their time overlaps compute
        assert report.comm_exposed_seconds is not None
        assert 0.8 * report.comm_seconds <= report.comm_exposed_seconds <= report.comm_seconds
        assert report.comm_groups is not None
        assert set(report.comm_groups) == {"dp"}
        assert report.comm_groups["dp"].bytes == report.comm_bytes


@pytest.mark.integration
@pytest.mark.parametrize(("mode", "job_name"), [("lightning", "lightning-job"), ("hf", "hf-job")])
def test_framework_callbacks_instrument_the_wrapped_model(
    sink: ReportSink, mode: str, job_name: str
) -> None:
    pytest.importorskip("lightning" if mode == "lightning" else "transformers")
    steps = 4
    job = run_job(sink, job_name, mode, "--steps", str(steps))

    for rank, report in job.reports.items():
        grad_bytes = job.results[rank]["gradient_bytes"] * steps
        assert report.steps == steps
        assert report.comm_seconds is not None and report.comm_seconds > 0
        assert report.comm_exposed_seconds is not None
        # The gradient all-reduces, plus the frameworks' own small collectives on
        # the same group (Lightning's and Trainer's bookkeeping: a few bytes).
        assert report.comm_bytes is not None
        assert grad_bytes <= report.comm_bytes <= grad_bytes + 1024


# -- CUDA / NCCL (skipped without a GPU) ------------------------------------------------


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_nccl_single_gpu_job_reports_gpu_timed_comm(sink: ReportSink, mode: str) -> None:
    steps = 20
    job_name = f"{mode}-job"
    job = run_job(sink, job_name, mode, "--steps", str(steps), "--device", "cuda:0",
                  "--width", "1024", "--depth", "8", world_size=1)

    report = job.reports[0]
    assert_monotonic_and_consistent(job.all_reports)
    assert report.comm_seconds is not None and report.comm_seconds > 0
    assert report.comm_seconds < report.step_seconds
    assert report.comm_bytes is not None and report.comm_bytes > 0
    if mode == "ddp":
        # events still in flight at the last fold are dropped, never waited for
        grad_bytes = job.results[0]["gradient_bytes"]
        assert report.comm_bytes % grad_bytes == 0
        assert steps - 2 <= report.comm_bytes // grad_bytes <= steps
        assert report.comm_exposed_seconds is not None
        assert report.comm_exposed_seconds <= report.comm_seconds


def test_one_group_from_two_sources_stays_within_the_step() -> None:
    """The instrumentation's and add_comm's totals of one group merge; their exposed time,
    each within the rank's step alone, is sent within it again."""
    measured = {"dp": {"collectives": 2, "bytes": 8, "seconds": 9.0, "exposed_seconds": 1.0,
                       "seq": 2}}
    added = {"dp": {"collectives": 1, "bytes": 8, "seconds": 9.0, "exposed_seconds": 1.0,
                    "seq": 1}, "tp": {"collectives": 1, "bytes": 4, "seconds": 0.5}}
    merged = merged_groups(1.5, measured, added)
    assert merged == {"dp": {"collectives": 3, "bytes": 16, "seconds": 18.0,
                             "exposed_seconds": 1.5, "seq": 2},
                      "tp": {"collectives": 1, "bytes": 4, "seconds": 0.5}}

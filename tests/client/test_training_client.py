"""The client ``Reporter`` against a real receiver: what it measures, sends and survives."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import pytest

from testkit.exposition import scrape
from trainmon.client import Reporter
from trainmon.client.transport import FULL_QUEUE_RETRY_BUDGET_SECONDS, UnixDatagramSender
from trainmon.collectors.training import TrainingCollector
from trainmon.training.protocol import parse_report

Make = Callable[..., TrainingCollector]
RANK0 = {"job": "unit", "rank": "0"}


def slow_loader(batches: int, seconds: float) -> Iterator[list[int]]:
    for index in range(batches):
        time.sleep(seconds)
        yield [index] * 4


def delivered(collector: TrainingCollector, steps: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while scrape(collector).value("trainmon_training_steps_total", **RANK0) != steps:
        if time.monotonic() > deadline:
            raise AssertionError(f"{steps} steps not delivered:\n{scrape(collector).text}")
        time.sleep(0.02)


def test_track_phase_step_reach_the_daemon(make_collector: Make, socket_path: Path) -> None:
    collector = make_collector(socket=socket_path)
    environ = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "CUDA_VISIBLE_DEVICES": "6,7"}
    with Reporter("unit", endpoint=f"unix://{socket_path}", environ=environ,
                  interval_seconds=0.1) as reporter:
        for _batch in reporter.track(slow_loader(10, 0.02)):
            time.sleep(0.01)  # "compute"
            with reporter.phase("comm"):
                time.sleep(0.005)
            reporter.step()  # a list of 4 samples: counted by its length
    delivered(collector, 10)
    result = scrape(collector)
    assert result.value("trainmon_training_samples_total", **RANK0) == 40
    wait = result.value("trainmon_training_data_wait_seconds_total", **RANK0)
    step_sum = result.value("trainmon_training_step_seconds_sum", **RANK0)
    comm = result.value("trainmon_training_phase_seconds_total", phase="comm", **RANK0)
    assert wait is not None and step_sum is not None and comm is not None
    assert 0.2 <= wait < 0.3
    assert 0.35 <= step_sum < 0.6
    assert 0.05 <= comm < 0.1
    assert result.labelsets("trainmon_training_rank_info")[0]["gpu"] == "6"
    assert result.value("trainmon_training_world_size", job="unit") == 2
    assert reporter.dropped_reports == 0


def test_no_daemon_loop_completes_counts_drops_and_tells_later(
    make_collector: Make, socket_path: Path
) -> None:
    endpoint = f"unix://{socket_path}"
    reporter = Reporter("unit", endpoint=endpoint, interval_seconds=0.05)
    started = time.perf_counter()
    for _ in range(200):
        time.sleep(0.001)
        reporter.step(samples=1)
    elapsed = time.perf_counter() - started
    time.sleep(0.2)
    assert elapsed < 2.0  # 200 × 1 ms: nothing blocked on the missing daemon
    assert reporter.dropped_reports >= 2
    collector = make_collector(socket=socket_path)  # the daemon comes up
    reporter.close()
    delivered(collector, 200)
    dropped = scrape(collector).value("trainmon_training_dropped_reports_total", **RANK0)
    assert dropped is not None and dropped >= 2


def test_http_endpoint_with_token(start_daemon: Callable[..., object], tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("right-token-0123456789")
    daemon = start_daemon(config={"collectors": {"training": {"token_file": str(token_file)}}})
    url = daemon.url  # type: ignore[attr-defined]
    good = Reporter("unit", endpoint=url, token="right-token-0123456789", interval_seconds=60)
    bad = Reporter("unit", endpoint=url, token="wrong", rank=1, world_size=2,
                   interval_seconds=60)
    for reporter in (good, bad):
        reporter.step(samples=3)
        reporter.close()
    assert good.dropped_reports == 0
    assert bad.dropped_reports == 1
    text = daemon.metrics()  # type: ignore[attr-defined]
    # the job is the token's: a token file of one token names it "default"
    assert ('trainmon_training_samples_total{job="unit",owner="token:default",rank="0"} 3.0'
            in text)
    assert 'rank="1"' not in text
    # Refused: one POST, the final totals with the ended run description (close()).
    assert 'trainmon_training_rejected_reports_total{reason="unauthorized"} 1.0' in text


def test_a_full_queue_is_retried_for_the_budget_then_counted(tmp_path: Path) -> None:
    path = str(tmp_path / "steps.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as daemon, \
            socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as filler:
        daemon.bind(path)  # bound, never read: a daemon that stalls
        filler.setblocking(False)
        for _ in range(100_000):  # net.unix.max_dgram_qlen, or the buffer, fills first
            try:
                filler.sendto(b"{}\n", path)
            except BlockingIOError:
                break
        sender = UnixDatagramSender(path)
        started = time.monotonic()
        assert not sender.send(b"{}\n")
        seconds = time.monotonic() - started
        assert FULL_QUEUE_RETRY_BUDGET_SECONDS <= seconds <= FULL_QUEUE_RETRY_BUDGET_SECONDS + 0.5
        assert "unavailable" in sender.last_error
        started = time.monotonic()
        assert not sender.send(b"{}\n", timeout=0.1)  # close() passes the time it has left
        assert time.monotonic() - started <= 0.1 + 0.5
        # The daemon drains one datagram while the sender waits: a later retry gets in,
        # well within the budget.
        drain = threading.Timer(0.2, daemon.recv, (100,))
        started = time.monotonic()
        drain.start()
        assert sender.send(b"{}\n")
        assert 0.2 <= time.monotonic() - started < FULL_QUEUE_RETRY_BUDGET_SECONDS
        drain.join()
        sender.close()


def test_environment_gives_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    environ = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "TRAINMON_JOB": "llama",
               "TRAINMON_ENDPOINT": "unix:///nonexistent/steps.sock",
               "CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    with Reporter(environ=environ, interval_seconds=60) as reporter:
        sent = reporter.report()
    assert (sent["job"], sent["rank"], sent["local_rank"], sent["world_size"], sent["gpu"]) == (
        "llama", 5, 1, 8, "5"
    )


@pytest.mark.parametrize(
    ("environ", "gpu"),
    [
        ({}, None),  # no hint that CUDA is used at all
        ({"CUDA_VISIBLE_DEVICES": "3"}, "3"),  # Slurm --gpus-per-task=1
        ({"CUDA_VISIBLE_DEVICES": "2,3", "LOCAL_RANK": "1"}, "3"),
        ({"CUDA_VISIBLE_DEVICES": ""}, None),
        ({"CUDA_VISIBLE_DEVICES": "-1"}, None),
        ({"CUDA_VISIBLE_DEVICES": "GPU-8f2c1a,GPU-11aa"}, None),  # UUIDs need NVML
        ({"CUDA_VISIBLE_DEVICES": "0,1", "LOCAL_RANK": "4"}, None),
        ({"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NTASKS": "4",
          "CUDA_VISIBLE_DEVICES": "0,1"}, "1"),
    ],
)
def test_gpu_detection(environ: dict[str, str], gpu: str | None) -> None:
    with Reporter("unit", endpoint="unix:///nonexistent", environ=environ,
                  interval_seconds=60) as reporter:
        assert reporter.report()["gpu"] == gpu


def test_explicit_gpu_wins_and_hostile_names_are_sanitised() -> None:
    with Reporter('my "job"\n', gpu=2, endpoint="unix:///nonexistent",
                  interval_seconds=60) as reporter:
        with reporter.phase("data\nload"):
            pass
        reporter.step(samples=1)
        sent = reporter.report()
    phases = cast(dict[str, float], sent["phase_seconds"])
    assert (sent["job"], sent["gpu"], list(phases)) == ("my__job__", "2", ["data_load"])
    parse_report(json.dumps(sent).encode())


def test_step_never_raises_on_odd_samples() -> None:
    with Reporter("unit", endpoint="not-an-endpoint", interval_seconds=60) as reporter:
        for samples in ("abc", None, -3, 2.9, float("nan"), 10**30, True):
            reporter.step(samples=samples)  # type: ignore[arg-type]
        sent = reporter.report()
    assert sent["steps"] == 7
    assert sent["samples"] == 2 + 10**30 + 1
    assert reporter.dropped_reports == 1  # the final flush to the unusable endpoint


def test_concurrent_steps_are_all_counted() -> None:
    reporter = Reporter("unit", endpoint="unix:///nonexistent", interval_seconds=0.01)
    def work() -> None:
        for _ in range(20_000):
            reporter.step(samples=1)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    reporter.close()
    sent = reporter.report()
    assert sent["steps"] == sent["samples"] == 80_000
    assert sum(cast(list[int], sent["step_buckets"])) == 80_000
    parse_report(json.dumps(sent).encode())


def test_more_phases_than_the_protocol_allows_fold_into_other() -> None:
    with Reporter("unit", endpoint="unix:///nonexistent", interval_seconds=60) as reporter:
        for index in range(40):
            reporter.add_phase(f"p{index}", 0.001)
        reporter.step()
        sent = reporter.report()
    phases = sent["phase_seconds"]
    assert isinstance(phases, dict) and len(phases) == 32 and "other" in phases
    parse_report(json.dumps(sent).encode())


def test_unbounded_phase_names_stay_bounded() -> None:
    with Reporter("unit", endpoint="unix:///nonexistent", interval_seconds=60) as reporter:
        for index in range(1_000):
            reporter.add_phase(f"request-{index}", 0.001)
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for index in range(1_000, 20_000):
                reporter.add_phase(f"request-{index}", 0.001)
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        reporter.step()
        sent = reporter.report()
    phases = cast(dict[str, float], sent["phase_seconds"])
    assert len(phases) == 32 and phases["other"] == pytest.approx((20_000 - 31) * 0.001)
    # Remembering 19,000 more names would take megabytes.
    assert grown < 100_000, f"{grown} bytes kept for 19,000 phase names"
    parse_report(json.dumps(sent).encode())


def test_last_step_time_is_the_wall_time_of_the_last_step() -> None:
    with Reporter("unit", endpoint="unix:///nonexistent", interval_seconds=60) as reporter:
        assert "last_step_time" not in reporter.report()
        reporter.step()
        stepped = time.time()
        time.sleep(0.2)
        last = cast(float, reporter.report()["last_step_time"])
    assert stepped - 0.05 <= last <= stepped + 0.05


def test_client_imports_only_the_standard_library() -> None:
    code = (
        "import sys; import trainmon.client; "
        "r = trainmon.client.Reporter('x', endpoint='unix:///nonexistent', interval_seconds=60); "
        "r.step(); r.close(); "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] not in sys.stdlib_module_names "
        "and m.split('.')[0] not in ('trainmon', '__main__', '_distutils_hack') "
        "and not m.startswith('__editable__')); print(bad)"
    )
    output = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert output.strip() == "[]"

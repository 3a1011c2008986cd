"""Acceptance: a real PyTorch (CPU) training loop reports through the client to a running
``trainmon serve``; the scraped data-wait ratio matches the truth, steps and samples exactly."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.exposition import parse
from trainmon.client import Reporter

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.integration

BATCHES = 60
BATCH_SIZE = 4
ITEM_SLEEP_SECONDS = 0.005  # data loading: 20 ms a batch
COMPUTE_SLEEP_SECONDS = 0.015  # stands in for GPU kernel time


class SlowDataset(torch.utils.data.Dataset):  # type: ignore[misc, name-defined]
    """Items that take a known time to load; records how long each load really took."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.load_seconds = 0.0

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        started = time.perf_counter()
        time.sleep(ITEM_SLEEP_SECONDS)
        generator = torch.Generator().manual_seed(index)
        item = torch.randn(32, generator=generator), torch.randn(1, generator=generator)
        self.load_seconds += time.perf_counter() - started
        return item


def train(reporter: Reporter | None, dataset: SlowDataset) -> float:
    """One epoch; returns its wall time in seconds."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH_SIZE, num_workers=0)
    batches: Iterable[Any] = reporter.track(loader) if reporter is not None else loader
    started = time.perf_counter()
    for inputs, targets in batches:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        time.sleep(COMPUTE_SLEEP_SECONDS)
        if reporter is not None:
            with reporter.phase("comm"):
                optimizer.step()
            reporter.step(samples=len(inputs))
        else:
            optimizer.step()
    return time.perf_counter() - started


def test_data_wait_ratio_steps_and_samples_match_the_truth(
    start_daemon: Callable[..., Any],
) -> None:
    daemon = start_daemon()
    config = yaml.safe_load(Path(daemon.config_path).read_text())
    endpoint = "unix://" + config["collectors"]["training"]["socket"]
    dataset = SlowDataset(BATCHES * BATCH_SIZE)
    reporter = Reporter("torch-acceptance", endpoint=endpoint, environ={})
    elapsed = train(reporter, dataset)
    reporter.close()
    truth = dataset.load_seconds / elapsed
    assert 0.4 < truth < 0.7  # the loop really is data-starved as designed

    deadline = time.monotonic() + 10
    while True:
        scraped = parse(daemon.metrics())
        rank = {"job": "torch-acceptance", "rank": "0"}
        if scraped.value("trainmon_training_steps_total", **rank) == BATCHES:
            break
        assert time.monotonic() < deadline, daemon.metrics()
        time.sleep(0.1)
    assert scraped.value("trainmon_training_samples_total", **rank) == BATCHES * BATCH_SIZE
    assert scraped.value("trainmon_training_step_seconds_count", **rank) == BATCHES
    ratio = scraped.value("trainmon_training_data_wait_ratio", **rank)
    assert ratio is not None and abs(ratio - truth) <= 0.05, (ratio, truth)
    step_sum = scraped.value("trainmon_training_step_seconds_sum", **rank)
    assert step_sum == pytest.approx(elapsed, rel=0.05)
    assert reporter.dropped_reports == 0


def test_without_a_daemon_the_loop_runs_at_unchanged_speed(tmp_path: Path) -> None:
    """No socket at all, and an HTTP 'daemon' that accepts but never answers. Each loop
    with a client is compared with the bare loop run just before and just after it (the
    slower of the two: a loaded machine oversleeps the dataset's sleeps by more at times)."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        for endpoint in (f"unix://{tmp_path}/absent.sock",
                         f"http://127.0.0.1:{silent.getsockname()[1]}"):
            before = train(None, SlowDataset(30 * BATCH_SIZE))
            reporter = Reporter("no-daemon", endpoint=endpoint, interval_seconds=0.05,
                                environ={})
            with_client = train(reporter, SlowDataset(30 * BATCH_SIZE))
            sent = reporter.report()
            reporter.close()
            bare = max(before, train(None, SlowDataset(30 * BATCH_SIZE)))
            assert sent["steps"] == 30
            assert with_client <= bare * 1.15 + 0.05, (endpoint, with_client, bare)
            assert reporter.dropped_reports >= 1

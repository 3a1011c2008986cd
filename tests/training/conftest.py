"""Fixtures for the training telemetry tests; helpers live in ``training_support``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.training.training_support import FakeClock
from trainmon.collectors.training import TrainingCollector, TrainingConfig


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_collector(
    clock: FakeClock,
) -> Iterator[Callable[..., TrainingCollector]]:
    """``make_collector(**config)``: a started TrainingCollector (socket off unless given)."""
    started: list[TrainingCollector] = []

    def make(**settings: object) -> TrainingCollector:
        settings.setdefault("socket", None)
        collector = TrainingCollector(
            TrainingConfig(**settings),  # type: ignore[arg-type]
            clock=clock,
            wall_clock=lambda: 1_700_000_100.0,
        )
        collector.start()
        started.append(collector)
        return collector

    yield make
    for collector in started:
        collector.stop()


@pytest.fixture
def socket_path(tmp_path: Path) -> Path:
    return tmp_path / "run" / "trainmon" / "steps.sock"

"""Fixtures for the training telemetry tests; helpers live in ``training_support``."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # importlib mode: make training_support importable

from training_support import FakeClock

from exporter.collectors.training import TrainingCollector
from exporter.config import TrainingConfig


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

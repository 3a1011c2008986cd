"""Helpers for the run ledger tests: a clock pair, run description and step lines."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from trainmon.collectors.ledger import LedgerCollector
from trainmon.collectors.training import TrainingCollector, TrainingConfig
from trainmon.contract import STEP_BUCKET_COUNT
from trainmon.ledger import RunRecord
from trainmon.ledger.config import LedgerConfig
from trainmon.ledger.holding import GpuHoldings
from trainmon.ledger.recorder import RunRecorder
from trainmon.training.protocol import config_hash
from trainmon.training.receiver import ingest_payload
from trainmon.training.writers import LOCAL_WRITER

WALL_START = 1_700_000_000.0


class Clocks:
    """A monotonic and a wall clock that the test advances together (seconds)."""

    def __init__(self) -> None:
        self.monotonic = 1000.0
        self.wall = WALL_START

    def advance(self, seconds: float) -> None:
        self.monotonic += seconds
        self.wall += seconds


def description(**changes: object) -> dict[str, object]:
    config = changes.pop("config", {"lr": 0.1, "batch_size": 32})
    assert isinstance(config, dict)
    base: dict[str, object] = {
        "v": 1, "type": "run", "job": "resnet50", "rank": 0, "reporter_id": "a1b2c3d4e5f60718",
        "run": "run-a", "started": WALL_START, "world_size": 1,
        "config_hash": config_hash(config), "config": config,
        "environment": {"NCCL_IB_DISABLE": "0"}, "data_paths": [],
        "versions": {"python": "3.11.9", "trainmon": "0.1.0"},
        "git": None, "host": "node-1", "framework": {},
    }
    base.update(changes)
    return base


def step(steps: int, *, seconds_per_step: float = 0.1, samples_per_step: int = 32,
         **changes: object) -> dict[str, object]:
    """A cumulative step report of ``steps`` steps (bucket le=0.1)."""
    buckets = [0] * STEP_BUCKET_COUNT
    buckets[3] = steps
    base: dict[str, object] = {
        "v": 1, "job": "resnet50", "rank": 0, "world_size": 1, "pid": 4242,
        "reporter_id": "a1b2c3d4e5f60718", "run": "run-a", "steps": steps,
        "samples": steps * samples_per_step, "step_seconds": steps * seconds_per_step,
        "data_wait_seconds": steps * seconds_per_step / 4,
        "phase_seconds": {"comm": steps * seconds_per_step / 10},
        "step_buckets": buckets, "dropped_reports": 0,
    }
    base.update(changes)
    return base


def send(training: TrainingCollector, *lines: dict[str, object],
         identity: str = LOCAL_WRITER) -> None:
    """Feed ``lines`` to the store as writer ``identity`` sent them (``uid:1000``...)."""
    payload = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    result = ingest_payload(training.store, payload, "http", 128, identity=identity)
    assert not result.errors, result.errors


Recorder = tuple[TrainingCollector, LedgerCollector]


def make_recorder(clocks: Clocks, path: Path, *, holdings: GpuHoldings | None = None,
                  **settings: object) -> Callable[[], Recorder]:
    """A factory of (training, ledger) collector pairs on ``clocks``, ledger at ``path``;
    ``holdings``: the GPUs' processes, as NVML and ``/proc`` would tell them."""
    def make() -> Recorder:
        training = TrainingCollector(
            TrainingConfig(socket=None, ttl_seconds=60.0),
            clock=lambda: clocks.monotonic, wall_clock=lambda: clocks.wall)
        training.start()
        ledger = LedgerCollector(RunRecorder(
            LedgerConfig(path=path, node="node-1", **settings),  # type: ignore[arg-type]
            training.store, training.storage_of, holdings=holdings,
            clock=lambda: clocks.monotonic, wall_clock=lambda: clocks.wall))
        return training, ledger
    return make


def only(records: list[RunRecord]) -> RunRecord:
    assert len(records) == 1, records
    return records[0]

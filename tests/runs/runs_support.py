"""Hand-built ledger records for the ``trainmon runs`` / ``compare`` tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trainmon.ledger import Ledger, RecordUpdate, RunRecord

STARTED = 1_764_576_000.0  # 2025-12-01 08:00 UTC


def description(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "config": {"lr": 0.1, "batch_size": 256, "model.layers": 24},
        "environment": {"NCCL_IB_DISABLE": "0", "OMP_NUM_THREADS": "8"},
        "data_paths": [{"path": "/data/imagenet", "mountpoint": "/data", "fstype": "ext4",
                        "storage": "local_disk"}],
        "versions": {"python": "3.11.9", "torch": "2.4.0", "trainmon": "0.16.0"},
        "git": {"commit": "a" * 40, "dirty": False},
        "host": "gpu-node-1",
        "framework": {},
    }
    base.update(overrides)
    return base


def summary(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "samples_per_second_median": 1210.0,
        "samples_per_second_p10": 1150.0,
        "step_seconds_p50": 0.21,
        "step_seconds_p95": 0.25,
        "data_wait_ratio": 0.05,
        "comm_exposed_ratio": 0.10,
        "phase_ratios": {"comm": 0.10, "checkpoint": 0.01},
        "verdicts": {"compute": 3500.0, "none": 100.0},
        "steps": 17000,
        "samples": 4_352_000,
        "duration_seconds": 3600.0,
        "gpu_hours": 8.0,
        "cost": None,
    }
    base.update(overrides)
    return base


def record(run: str, *, job: str = "llama", node: str = "gpu-node-1",
           config_hash: str = "sha256:00112233aabbccdd", started: float = STARTED,
           ended: float | None = STARTED + 3600, end_reason: str | None = "finished",
           world_size: int | None = 8, ranks: int = 8,
           description_: Mapping[str, Any] | None = None,
           summary_: Mapping[str, Any] | None = None) -> RunRecord:
    return RunRecord(
        job=job, run=run, node=node, config_hash=config_hash, started=started, ended=ended,
        end_reason=end_reason, updated=ended or started, world_size=world_size, ranks=ranks,
        description=dict(description() if description_ is None else description_),
        summary=dict(summary() if summary_ is None else summary_),
    )


def write_ledger(path: Path, records: Sequence[RunRecord]) -> Path:
    """A real ledger file holding ``records`` (as the daemon's recorder writes them)."""
    ledger = Ledger.open(path, readonly=False)
    try:
        ledger.write([RecordUpdate(item, {}) for item in records])
    finally:
        ledger.close()
    return path

"""A real PyTorch CPU training job for the run-ledger acceptance test.

``python ledger_job.py ENDPOINT JOB ITEM_SECONDS SECONDS DATA_DIR OUT_JSON``:
trains a small MLP on a ``Dataset`` whose items each take ``ITEM_SECONDS`` to
"read" (the slower Dataset of run B), for ``SECONDS``, reporting through the
real client with a fixed config mapping and data path, and writes what it
measured itself (samples per second of its training loop) to ``OUT_JSON`` so
that the test can hold the ledger's numbers against the truth. The run id
comes from ``TRAINMON_RUN_ID``; the planted secrets from the config's
``api_key`` and the environment.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from trainmon.client import Reporter

BATCH_SIZE = 8


class TimedDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, item_seconds: float) -> None:
        self.item_seconds = item_seconds

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.item_seconds)
        generator = torch.Generator().manual_seed(index)
        return torch.randn(32, generator=generator), torch.randint(0, 4, (), generator=generator)


def main(endpoint: str, job: str, item_seconds: float, seconds: float, data_dir: str,
         out: Path) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(TimedDataset(item_seconds), batch_size=BATCH_SIZE, num_workers=0)
    reporter = Reporter(
        job, rank=0, world_size=1, endpoint=endpoint, interval_seconds=0.2,
        config={"lr": 0.01, "batch_size": BATCH_SIZE, "model": {"hidden": 64},
                "api_key": os.environ["LEDGER_TEST_CONFIG_SECRET"]},
        data_paths=[data_dir],
    )
    samples = 0
    started = time.perf_counter()
    deadline = started + seconds
    for features, labels in reporter.track(loader):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(features), labels).backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        reporter.step(samples=len(labels))
        samples += len(labels)
        if time.perf_counter() > deadline:
            break
    elapsed = time.perf_counter() - started
    reporter.close()
    out.write_text(json.dumps({"run": reporter.run, "samples": samples, "seconds": elapsed,
                               "samples_per_second": samples / elapsed}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5],
         Path(sys.argv[6]))

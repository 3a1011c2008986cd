"""A real PyTorch CPU training loop whose ``Dataset`` is slow (the storage scenario).

Run as a script: ``python torch_job.py ENDPOINT JOB GPU SECONDS``. Each sample
takes ``SAMPLE_SECONDS`` to "read" (as from a slow network filesystem), the
DataLoader has no worker processes, and the model is a small MLP trained with
SGD — so the loop spends most of each step waiting in ``next()``.
"""

from __future__ import annotations

import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from trainmon.client import Reporter

SAMPLE_SECONDS = 0.01
BATCH_SIZE = 4


class SlowDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(SAMPLE_SECONDS)
        generator = torch.Generator().manual_seed(index)
        return torch.randn(64, generator=generator), torch.randint(0, 10, (), generator=generator)


def main(endpoint: str, job: str, gpu: str, seconds: float) -> None:
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(SlowDataset(), batch_size=BATCH_SIZE, num_workers=0)
    reporter = Reporter(job=job, rank=0, world_size=1, gpu=gpu, endpoint=endpoint,
                        interval_seconds=0.5)
    train(reporter, model, loader, optimizer, deadline=time.monotonic() + seconds)
    reporter.close()


def train(
    reporter: Reporter,
    model: nn.Module,
    loader: DataLoader[tuple[torch.Tensor, torch.Tensor]],
    optimizer: torch.optim.Optimizer,
    deadline: float = float("inf"),
) -> None:
    """The plain classification loop the README shows, reported step by step, until
    the loader is exhausted or the ``time.monotonic()`` deadline has passed."""
    for features, labels in reporter.track(loader):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(features), labels)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        reporter.step(samples=len(labels))
        if time.monotonic() > deadline:
            break


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]))

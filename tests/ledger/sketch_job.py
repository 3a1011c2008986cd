"""One rank of the step-percentile acceptance job: a real ``torch.distributed`` job (CPU,
gloo) whose steps take two different times, and which measures each of them itself.

::

    python -m torch.distributed.run --nproc-per-node 2 --master-port 29500 \\
        -m tests.ledger.sketch_job SECONDS RESULTS

Each step: a sleep standing in for the GPU's kernels, ``FAST_SECONDS`` in seven steps
of ten and ``SLOW_SECONDS`` in the others (the ranks draw the same sequence, as a
job whose batches differ in length), then a real forward and backward of a small MLP
whose gradients DDP all-reduces over gloo, and an all-reduce of the "stop" flag, so
that every rank takes the same steps and the loop ends once rank 0's clock says
``SECONDS`` have passed. Two modes put a step-time histogram's midpoint between them,
where no step is; the median is a fast step, the 95th percentile a slow one.

Each rank writes ``RESULTS/<rank>.json``: its run id, and each step's duration on
``time.perf_counter`` (from the end of the previous step, the first from the start of
the loop: what the client times).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainmon.client import Reporter

FAST_SECONDS = 0.03
SLOW_SECONDS = 0.08
SLOW_SHARE = 0.3
BATCH = 16
WIDTH = 32


def train(seconds: float, results: Path) -> None:
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(WIDTH, 64), nn.ReLU(), nn.Linear(64, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    features, labels = torch.randn(BATCH, WIDTH), torch.randint(0, 4, (BATCH,))
    stop = torch.zeros(1)
    lengths = random.Random(36)  # the same on every rank
    durations: list[float] = []
    dist.barrier()
    reporter = Reporter(interval_seconds=1.0)
    loop_start = previous = time.perf_counter()
    while True:
        time.sleep(SLOW_SECONDS if lengths.random() < SLOW_SHARE else FAST_SECONDS)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(features), labels).backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        stop[0] = float(rank == 0 and time.perf_counter() - loop_start >= seconds)
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        reporter.step(samples=BATCH)
        now = time.perf_counter()
        durations.append(now - previous)
        previous = now
        if stop.item():
            break
    reporter.close()
    (results / f"{rank}.json").write_text(json.dumps({
        "run": reporter.run, "rank": rank, "step_seconds": durations}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("seconds", type=float)
    parser.add_argument("results", type=Path)
    options = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        train(options.seconds, options.results)
        gc.collect()  # the DDP model goes before its process group (testkit.ddp_job)
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

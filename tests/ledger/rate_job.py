"""One rank of the run ledger's acceptance jobs (rates, step percentiles): a real
``torch.distributed`` job (CPU, gloo) that measures itself.

::

    python -m torch.distributed.run --nproc-per-node 2 --master-port 29500 \\
        -m tests.ledger.rate_job SECONDS RESULTS [--bimodal]

Each step: a sleep standing in for the GPU's kernels (the host waits for them as for a
``cuda.synchronize``, without loading the test machine's few cores), a real forward and
backward of a small MLP whose gradients DDP all-reduces over gloo, and an all-reduce of
the "stop" flag, so that every rank takes the same steps and the loop ends once rank
0's clock says ``SECONDS`` have passed. The reporter (its job from ``TRAINMON_JOB``, its
reports to ``TRAINMON_ENDPOINT``) is made just before the loop and closed just after it.

The sleep is ``DEVICE_SECONDS``, or with ``--bimodal`` ``FAST_SECONDS`` in seven steps
of ten and ``SLOW_SECONDS`` in the others (the ranks draw the same sequence, as a job
whose batches differ in length): two modes put a step-time histogram's midpoint between
them, where no step is; the median is a fast step, the 95th percentile a slow one.

Each rank writes ``RESULTS/<rank>.json``: its run id, steps, samples, the loop's
elapsed time (``loop_seconds``: from the start of the loop to its last step's end, on
``time.perf_counter``), the Unix times just before its reporter was made and just
after it was closed (``started``, ``ended``), and each step's duration (from the end
of the previous step, the first from the start of the loop: what the client times).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainmon.client import Reporter

#: Seconds of "GPU" time per step.
DEVICE_SECONDS = 0.05
#: ``--bimodal``: a fast and a slow step's "GPU" time (s), and the share of slow steps.
FAST_SECONDS = 0.03
SLOW_SECONDS = 0.08
SLOW_SHARE = 0.3
#: Samples per step on each rank.
BATCH = 16
WIDTH = 32


def device_seconds(bimodal: bool) -> Callable[[], float]:
    """Each step's "GPU" time (s), drawn the same on every rank."""
    if not bimodal:
        return lambda: DEVICE_SECONDS
    lengths = random.Random(36)
    return lambda: SLOW_SECONDS if lengths.random() < SLOW_SHARE else FAST_SECONDS


def train(seconds: float, results: Path, bimodal: bool) -> None:
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(WIDTH, 64), nn.ReLU(), nn.Linear(64, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    features, labels = torch.randn(BATCH, WIDTH), torch.randint(0, 4, (BATCH,))
    stop = torch.zeros(1)
    step_device_seconds = device_seconds(bimodal)
    durations: list[float] = []
    dist.barrier()
    started = time.time()
    reporter = Reporter(interval_seconds=1.0)
    loop_start = previous = time.perf_counter()
    while True:
        time.sleep(step_device_seconds())
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
    ended = time.time()
    (results / f"{rank}.json").write_text(json.dumps({
        "run": reporter.run, "rank": rank, "world_size": dist.get_world_size(),
        "steps": len(durations), "samples": len(durations) * BATCH,
        "loop_seconds": previous - loop_start, "started": started, "ended": ended,
        "step_seconds": durations, "dropped": reporter.dropped_reports}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("seconds", type=float)
    parser.add_argument("results", type=Path)
    parser.add_argument("--bimodal", action="store_true",
                        help="fast and slow steps (FAST_SECONDS, SLOW_SECONDS)")
    options = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        train(options.seconds, options.results, options.bimodal)
        gc.collect()  # the DDP model goes before its process group (testkit.ddp_job)
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

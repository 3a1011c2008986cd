"""A real ``torch.distributed`` job (CPU, gloo) that names no run id, for
``test_agreement.py``: its ranks must agree on one through the process group.

::

    python -m torch.distributed.run --nproc-per-node 2 --master-port 29500 \\
        -m tests.client.agreement_job env RESULTS      # torchrun without --rdzv-id
    python -m tests.client.agreement_job spawn RESULTS --port 29500   # mp.spawn, 2 ranks

``env``: the rank comes from the environment (torchrun's, or the test's
``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` / ``MASTER_ADDR``); the reporter
starts before ``init_process_group`` and ``instrument(DistributedDataParallel)``
follows. ``spawn``: ``torch.multiprocessing.spawn`` starts two workers with
no such variable; each starts its reporter, then calls ``init_process_group``
with ``tcp://`` itself and all-reduces by hand (nothing but the sender thread
settles the run id). Both train until their first report is delivered (the
run id settled) and a few steps more, and write what their reporter settled
on to ``RESULTS/<rank>.json``. Reports go to ``TRAINMON_ENDPOINT``.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from testkit.ddp_job import BATCH, batches, make_model
from trainmon.client import Reporter

JOB = "agreement-job"
#: Longest a rank trains waiting for its first delivered report, seconds.
SETTLE_TIMEOUT_SECONDS = 60.0
#: Steps after the first delivered report.
STEPS_AFTER = 3
WIDTH = 32


def train(reporter: Reporter, model: nn.Module, rank: int, *, by_hand: bool) -> dict[str, object]:
    """Steps until every rank delivered a report (at most ``SETTLE_TIMEOUT_SECONDS``)
    and ``STEPS_AFTER`` more; what the reporter settled on. ``by_hand``: all-reduce
    the gradients here (no DDP)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    deadline = time.monotonic() + SETTLE_TIMEOUT_SECONDS
    delivered = False
    after = 0
    for batch in batches(2_000, WIDTH, rank):
        optimizer.zero_grad()
        model(batch).square().mean().backward()
        if by_hand:
            for parameter in model.parameters():
                assert parameter.grad is not None
                dist.all_reduce(parameter.grad)
        optimizer.step()
        reporter.step(samples=BATCH)
        # flush() sends nothing while the run id is pending: True means it settled
        delivered = delivered or reporter.flush()
        after += delivered
        # every rank takes the same steps: stop when all are done
        done = torch.tensor([int(after > STEPS_AFTER or time.monotonic() > deadline)])
        dist.all_reduce(done, op=dist.ReduceOp.MIN)
        if done.item():
            break
    reporter.close()
    return {"run": reporter.run, "rank": reporter.rank, "local_rank": reporter.local_rank,
            "world_size": reporter.world_size, "delivered_while_training": delivered,
            "dropped": reporter.dropped_reports}


def run_env(results: Path) -> None:
    from torch.nn.parallel import DistributedDataParallel

    reporter = Reporter(JOB, interval_seconds=0.1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ddp = reporter.instrument(DistributedDataParallel(make_model(WIDTH, 1)))
    result = train(reporter, ddp, rank, by_hand=False)
    # The DDP model's reducer holds the gloo group: free it (and any cycle through its
    # comm hook) before the group is destroyed, not in the interpreter's finalisation,
    # where gloo's worker threads abort the process ("terminate called without an
    # active exception", seen once in CI).
    del ddp
    gc.collect()
    dist.destroy_process_group()
    (results / f"{rank}.json").write_text(json.dumps(result))


def spawned(index: int, results: str, port: int) -> None:
    """One ``mp.spawn`` worker; ``index`` is its rank."""
    torch.set_num_threads(1)
    reporter = Reporter(JOB, interval_seconds=0.1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=index,
                            world_size=2)
    result = train(reporter, make_model(WIDTH, 1), index, by_hand=True)
    dist.destroy_process_group()
    (Path(results) / f"{index}.json").write_text(json.dumps(result))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=["env", "spawn"])
    parser.add_argument("results", type=Path)
    parser.add_argument("--port", type=int, default=29500, help="spawn: the rendezvous port")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.mode == "env":
        run_env(args.results)
    else:
        torch.multiprocessing.spawn(spawned, args=(str(args.results), args.port), nprocs=2)


if __name__ == "__main__":
    main()

"""Training processes that end in the ways ``test_run_ends.py`` checks, one per mode.

::

    TRAINMON_ENDPOINT=unix:///tmp/steps.sock TRAINMON_RUN_ID=r1 \\
    python -m tests.client.ending_job crash

Every mode reports as job ``ending`` through the real client and trains on
``(x, y)`` tensor batches of ``BATCH`` samples, counted by ``step()`` itself:

- ``crash``: an uncaught exception in the main thread (exit status 1);
- ``forget``: a clean end that never calls ``close()`` (``atexit`` closes);
- ``sigterm``: steps until killed; prints ``ready`` once the reporter runs;
- ``sigterm-stuck``: the same, then blocks in one long C call (the GIL
  released, as in a collective waiting for a dead peer);
- ``sigterm-handler``: the program's own SIGTERM handler, installed before
  the reporter, stops the loop; the ``with`` block then ends cleanly;
- ``fork-sigterm``: a forked child of the reporter's process is sent SIGTERM
  (it must neither close the parent's reporter nor wake the parent's watcher);
  the parent then trains and closes;
- ``thread-crash``: rank 1's reporter is driven by a thread that dies of an
  exception while rank 0's, in the main thread, goes on and closes;
- ``spawn-crash``: ``torch.multiprocessing.spawn`` of 2 DDP ranks (gloo,
  ``MASTER_PORT`` from the environment); rank 1 raises inside ``backward()``.
"""

from __future__ import annotations

import gc
import hashlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from trainmon.client import Reporter

BATCH = 16
#: Longest a mode that waits to be killed runs on its own (seconds).
UNKILLED_SECONDS = 120.0


def batches(count: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``(x, y)`` batches of ``BATCH`` samples; endless without ``count``."""
    made = 0
    while count is None or made < count:
        made += 1
        yield torch.randn(BATCH, 8), torch.randn(BATCH, 1)


def train_step(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> None:
    x, y = batch
    model.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()  # type: ignore[no-untyped-call]


def crash() -> None:
    model = nn.Linear(8, 1)
    reporter = Reporter("ending", rank=0, world_size=1, interval_seconds=60)
    for index, batch in enumerate(reporter.track(batches(4))):
        train_step(model, batch)
        reporter.step()
        if index == 1:
            raise RuntimeError("loss is NaN")


def forget() -> None:
    model = nn.Linear(8, 1)
    reporter = Reporter("ending", rank=0, world_size=1, interval_seconds=60)
    for batch in reporter.track(batches(3)):
        train_step(model, batch)
        reporter.step()


def until_killed(stuck: bool) -> None:
    model = nn.Linear(8, 1)
    reporter = Reporter("ending", rank=0, world_size=1, interval_seconds=0.1)
    deadline = time.monotonic() + UNKILLED_SECONDS
    for index, batch in enumerate(reporter.track(batches())):
        train_step(model, batch)
        reporter.step()
        if index == 2:
            print("ready", flush=True)
            if stuck:  # one C call of minutes that releases the GIL
                hashlib.pbkdf2_hmac("sha256", b"x", b"salt", 10**9)
        if time.monotonic() > deadline:
            sys.exit(3)
        time.sleep(0.005)


def sigterm_handler() -> None:
    stop = threading.Event()

    def on_sigterm(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_sigterm)
    model = nn.Linear(8, 1)
    deadline = time.monotonic() + UNKILLED_SECONDS
    with Reporter("ending", rank=0, world_size=1, interval_seconds=0.1) as reporter:
        for index, batch in enumerate(reporter.track(batches())):
            train_step(model, batch)
            reporter.step()
            if index == 2:
                print("ready", flush=True)
            if stop.wait(0.005) or time.monotonic() > deadline:
                break
    print("stopped by the handler" if stop.is_set() else "not signalled", flush=True)


def forked_child_terminated() -> None:
    model = nn.Linear(8, 1)
    reporter = Reporter("ending", rank=0, world_size=1, interval_seconds=60)
    child = os.fork()
    if child == 0:  # a forked DataLoader worker, say: inherits the reporter and its hooks
        time.sleep(UNKILLED_SECONDS)
        os._exit(3)
    os.kill(child, signal.SIGTERM)
    _, status = os.waitpid(child, 0)
    print(f"child ended by signal {os.WTERMSIG(status) if os.WIFSIGNALED(status) else None}",
          flush=True)
    for batch in reporter.track(batches(3)):
        train_step(model, batch)
        reporter.step()
    reporter.close()


def thread_crash() -> None:
    model = nn.Linear(8, 1)
    main = Reporter("ending", rank=0, world_size=2, interval_seconds=60)

    def rank1() -> None:
        reporter = Reporter("ending", rank=1, world_size=2, interval_seconds=60)
        for batch in reporter.track(batches(2)):
            train_step(model, batch)
            reporter.step()
        raise RuntimeError("the data thread's loader broke")

    worker = threading.Thread(target=rank1)
    worker.start()
    worker.join()
    for batch in main.track(batches(3)):
        train_step(model, batch)
        main.step()
    main.close()


class FailingBackward(torch.autograd.Function):
    """Identity forward; its backward raises (rank 1 at the chosen step)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("CUDA error: an illegal memory access (simulated) in backward")


def spawned_rank(rank: int) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(8, 1))
    reporter = Reporter("ending", rank=rank, world_size=2, interval_seconds=60)
    for index, (x, y) in enumerate(reporter.track(batches(6))):
        model.zero_grad()
        out = model(x)
        if rank == 1 and index == 2:
            out = FailingBackward.apply(out)
        nn.functional.mse_loss(out, y).backward()  # type: ignore[no-untyped-call]
        reporter.step()
    reporter.close()
    # Free the DDP model while its gloo group exists (testkit/ddp_job.py says why).
    del model
    gc.collect()
    dist.destroy_process_group()


def spawn_crash() -> None:
    import torch.multiprocessing as mp

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    try:
        mp.spawn(spawned_rank, nprocs=2)
    except mp.ProcessRaisedException as error:
        print(f"a rank failed: {str(error).strip().splitlines()[-1]}", flush=True)
        sys.exit(1)


MODES = {
    "crash": crash,
    "forget": forget,
    "sigterm": lambda: until_killed(stuck=False),
    "sigterm-stuck": lambda: until_killed(stuck=True),
    "sigterm-handler": sigterm_handler,
    "fork-sigterm": forked_child_terminated,
    "thread-crash": thread_crash,
    "spawn-crash": spawn_crash,
}


if __name__ == "__main__":
    torch.set_num_threads(1)
    MODES[sys.argv[1]]()

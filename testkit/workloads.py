"""Simulated training ranks for the scenario tests, sent through the real client.

``RankLoop`` is an ordinary ``Reporter`` loop (``track`` → compute →
``phase("comm")`` → ``step``) on its own thread, with sleeps standing in for
data loading, compute and the allreduce. Ranks of one job can meet at a
``threading.Barrier`` inside the comm phase, as synchronous data-parallel
ranks meet in an allreduce: a slow rank then makes the others wait there.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from trainmon.client import Reporter

HERE = Path(__file__).parent


@dataclass(frozen=True)
class RankPlan:
    job: str
    rank: int
    world_size: int
    gpu: str
    wait: float
    compute: float
    comm: float


class Workload:
    """Runs rank loops on threads until ``stop()``."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._processes: list[subprocess.Popen[bytes]] = []

    def job(self, plans: list[RankPlan], synchronised: bool = True) -> None:
        barrier = threading.Barrier(len(plans)) if synchronised and len(plans) > 1 else None
        for plan in plans:
            thread = threading.Thread(target=self._run, args=(plan, barrier), daemon=True)
            thread.start()
            self._threads.append(thread)

    def torch_job(self, job: str, gpu: str, seconds: float) -> None:
        """The real PyTorch loop of ``torch_job.py`` in its own process."""
        self._processes.append(subprocess.Popen(
            [sys.executable, str(HERE / "torch_job.py"), self.endpoint, job, gpu, str(seconds)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ))

    def stop(self) -> None:
        self._stopping.set()
        for thread in self._threads:
            thread.join(5)
        for process in self._processes:
            process.terminate()
            process.wait(10)

    def _loader(self, wait: float) -> Iterator[int]:
        index = 0
        while not self._stopping.is_set():
            time.sleep(wait)
            yield index
            index += 1

    def _run(self, plan: RankPlan, barrier: threading.Barrier | None) -> None:
        reporter = Reporter(job=plan.job, rank=plan.rank, world_size=plan.world_size,
                            gpu=plan.gpu, endpoint=self.endpoint, interval_seconds=0.5)
        try:
            for _ in reporter.track(self._loader(plan.wait)):
                time.sleep(plan.compute)
                with reporter.phase("comm"):
                    if barrier is not None:
                        try:
                            barrier.wait(timeout=5)
                        except threading.BrokenBarrierError:
                            return
                    time.sleep(plan.comm)
                reporter.step(samples=8)
                if self._stopping.is_set():
                    if barrier is not None:
                        barrier.abort()
                    return
        finally:
            reporter.close()


def ranks(job: str, gpus: list[int], wait: float, compute: float, comm: float,
          slow_rank: int | None = None, slow_factor: float = 1.0) -> list[RankPlan]:
    return [
        RankPlan(job, index, len(gpus), str(gpu), wait,
                 compute * (slow_factor if index == slow_rank else 1.0), comm)
        for index, gpu in enumerate(gpus)
    ]

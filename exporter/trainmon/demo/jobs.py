"""Two simulated training jobs for ``trainmon serve --demo``, sent through the real client.

Each rank is a thread running an ordinary ``Reporter`` loop (``track`` →
compute → ``phase("comm")`` → ``step``) whose loader and compute are sleeps, and
the reports travel over the daemon's real socket or HTTP route, so the demo
exercises exactly the path a training job uses. Each rank also measures its
communication as ``Reporter.instrument`` would, through ``add_comm``: the
``comm`` phase is the exposed part (the rank waits with its compute done),
``overlapped_comm_seconds`` more of collectives run hidden under compute, and
``comm_bytes`` bytes of gradient buckets move each step, all of it in the
data-parallel group (``dp`` of ``comm_groups``, ``BUCKETS_PER_STEP`` all-reduces):

- ``demo-starved`` on GPUs 0–3: 0.4 s steps of which 0.14 s wait for data
  (data-wait ratio ≈ 0.35), the input pipeline cannot keep up; the GPU demo's
  saw-toothing utilization on these GPUs is its device-side picture;
- ``demo-healthy`` on GPUs 4–7: 0.25 s steps, 0.01 s data wait (≈ 0.04); 0.16 s
  of gradient sync a step, of which 0.04 s exposed (≈ 0.16 of the step), at
  about 10 GB/s while in flight.

Every rank also saves a (sharded) checkpoint every ``CHECKPOINT_INTERVAL_SECONDS``
through the real ``Reporter.checkpoint`` (a short sleep stands for the write;
no file is written): ``demo-healthy`` to the CFS mount ``/mnt/cfs`` (nfs4,
``network_fs``), ``demo-starved`` to the instance's local NVMe ``/data``
(``local_disk``, which the checkpoint-on-local-disk alert flags on a cloud
instance, as intended). The demo node's ``proc/1/mountinfo``
(``trainmon.demo.node``) holds those mounts. A checkpoint every 30 s adds
about 0.2 % to the step time, so the ratios above hold.

Each job is one run (``<job>-<UTC start>``: ``run_id``, shared by its four
ranks, as torchrun's run id would be, new at every start of the demo)
described with a small config (``model``, ``batch_size``), so the run ledger
and the run metrics have a record per job. ``demo-healthy`` runs with
``NCCL_ALGO=Tree`` in its environment and ``demo-starved`` reads its dataset
from CFS (``/mnt/cfs/datasets/demo-starved``): what changed since the earlier,
faster run of each job that ``trainmon.demo.history`` keeps in the demo's
ledger, which ``trainmon compare`` shows.

Every bucket of the goodput ledger has something within a minute:

- ``demo-healthy``'s rank 3 computes 10 ms a step longer than the others, which
  wait for it as long in their all-reduce (``straggler_wait``);
- 6 s after the start ``demo-starved``'s CFS mount stops answering for 12 s and
  every rank of it hangs in its loader (``stalled``: the whole job at once, as a
  dead mount does, so no rank looks slower than the others);
- both jobs crash early, ``demo-healthy`` 10 s and ``demo-starved`` 22 s after
  the start (every rank), and each restarts at once from its latest checkpoint, a
  new run (``restart_run_id``) that loads for 2 or 3 s (``startup``) and redoes the
  steps since that checkpoint (``lost_progress``): the Training overview's run
  failure markers have one for each job, and the runs that go on are the
  restarts, clean of the hang (what ``trainmon compare`` and the throughput
  regression measure);
- a notebook left open on GPU 7 holds it and never reports
  (``idle_allocated``, ``trainmon.demo.gpus.NOTEBOOK_PID``).

Durations jitter by ±10 % (seeded per rank) so the series look alive.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from trainmon.client import Reporter

log = logging.getLogger(__name__)

RANKS_PER_JOB = 4
JITTER = 0.10
#: Seconds between two checkpoints of a rank (the first comes after
#: ``FIRST_CHECKPOINT_SECONDS``, so a fresh demo shows one soon).
#: Gradient buckets all-reduced per step (the dp group's collectives).
BUCKETS_PER_STEP = 4
CHECKPOINT_INTERVAL_SECONDS = 30.0
FIRST_CHECKPOINT_SECONDS = 5.0


@dataclass(frozen=True)
class SimulatedJob:
    name: str
    first_gpu: int
    data_wait_seconds: float
    compute_seconds: float
    #: Exposed communication per step (the ``comm`` phase).
    comm_seconds: float
    batch_size: int
    #: Communication per step overlapped with compute (measured, not in the step).
    overlapped_comm_seconds: float = 0.0
    #: Bytes of gradient buckets per step.
    comm_bytes: int = 0
    #: Folder the job's checkpoints go to (as the training process sees it).
    checkpoint_dir: str = "/tmp/checkpoints"
    #: Seconds one checkpoint save takes.
    checkpoint_seconds: float = 0.05
    #: The ranks' NCCL_*/TORCH_*/CUDA_* environment (their run description's).
    environment: Mapping[str, str] = field(default_factory=dict)
    #: Where the job reads its training data (its run description's data paths).
    data_paths: tuple[str, ...] = ()
    #: Its team (the ``SLURM_JOB_ACCOUNT`` of its processes in the demo tree).
    team: str = ""
    #: A rank slower than the others by ``straggler_seconds`` of compute a step; the
    #: others wait for it as long in their all-reduce (``straggler_wait``).
    straggler_rank: int | None = None
    straggler_seconds: float = 0.0
    #: Every rank hangs ``stall_seconds`` once, ``stall_after_seconds`` after the start
    #: (0: never).
    stall_after_seconds: float = 0.0
    stall_seconds: float = 0.0
    #: Every rank crashes this long after the start (None: never) and the job restarts
    #: from its latest checkpoint, ``restart_seconds`` of loading before its first step.
    crash_after_seconds: float | None = None
    restart_seconds: float = 0.0

    @property
    def gpus(self) -> range:
        """The NVML indices of its ranks' GPUs."""
        return range(self.first_gpu, self.first_gpu + RANKS_PER_JOB)

    @property
    def step_seconds(self) -> float:
        """One step's mean duration (jitter averages out; checkpoints not counted)."""
        return self.data_wait_seconds + self.compute_seconds + self.comm_seconds

    @property
    def data_wait_ratio(self) -> float:
        """The ratio the daemon should report for this job (jitter averages out)."""
        return self.data_wait_seconds / self.step_seconds

    @property
    def config(self) -> dict[str, object]:
        """The run's config (``Reporter(config=…)``): the same for every run of the job,
        so every run of it has one ``config_hash`` and compares with the others."""
        return {"model": "simulated", "batch_size": self.batch_size}


def run_id(job: SimulatedJob, started: float) -> str:
    """The run id of ``job`` in a demo started at ``started`` (Unix seconds)."""
    return f"{job.name}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(started))}"


def restart_run_id(job: SimulatedJob, started: float) -> str | None:
    """The run id of the restart of ``job`` after its crash (None: it never crashes)."""
    if job.crash_after_seconds is None:
        return None
    return run_id(job, started + job.crash_after_seconds)


DEMO_JOBS = (
    SimulatedJob("demo-starved", first_gpu=0, data_wait_seconds=0.14, compute_seconds=0.20,
                 comm_seconds=0.06, batch_size=64, overlapped_comm_seconds=0.06,
                 comm_bytes=600_000_000, checkpoint_dir="/data/checkpoints/demo-starved",
                 checkpoint_seconds=0.08, data_paths=("/mnt/cfs/datasets/demo-starved",),
                 team="vision", stall_after_seconds=6.0, stall_seconds=12.0,
                 crash_after_seconds=22.0, restart_seconds=3.0),
    SimulatedJob("demo-healthy", first_gpu=4, data_wait_seconds=0.01, compute_seconds=0.20,
                 comm_seconds=0.04, batch_size=128, overlapped_comm_seconds=0.12,
                 comm_bytes=1_600_000_000,
                 checkpoint_dir="/mnt/cfs/checkpoints/demo-healthy", checkpoint_seconds=0.05,
                 environment={"NCCL_ALGO": "Tree"}, team="nlp", straggler_rank=3,
                 straggler_seconds=0.01, crash_after_seconds=10.0, restart_seconds=2.0),
)


def runs_per_start(jobs: tuple[SimulatedJob, ...] = DEMO_JOBS) -> int:
    """Runs each start of the demo adds to its ledger: one per job, two for a job that
    crashes (its crashed run and the restart that goes on)."""
    return sum(1 if job.crash_after_seconds is None else 2 for job in jobs)


def start_note(started: float, jobs: tuple[SimulatedJob, ...] = DEMO_JOBS) -> str:
    """The start log's line on the runs this start adds: ``4 new runs in the ledger:
    demo-starved-…T225123Z crashes on purpose 22 s after the start and goes on as
    demo-starved-…T225145Z; …`` (the seeded history is added once)."""
    parts = []
    for job in jobs:
        restart = restart_run_id(job, started)
        if restart is None:
            parts.append(f"{run_id(job, started)} runs until the demo stops")
        else:
            parts.append(f"{run_id(job, started)} crashes on purpose "
                         f"{job.crash_after_seconds:g} s after the start and goes on as "
                         f"{restart}")
    return f"{runs_per_start(jobs)} new runs in the ledger: " + "; ".join(parts)


def start_demo_jobs(
    endpoint: str, jobs: tuple[SimulatedJob, ...] = DEMO_JOBS, *, started: float | None = None
) -> Callable[[], None]:
    """Start every rank of ``jobs`` reporting to ``endpoint``; returns a stop function.

    ``endpoint`` is a client endpoint (``unix:///…/steps.sock`` or
    ``http://127.0.0.1:PORT``); ``started`` (Unix seconds, default now) makes the
    run ids (``run_id``). The stop function ends the loops, sends the final
    reports and joins the threads (about a second at most).
    """
    stopping = threading.Event()
    # One run per job, shared by its ranks (as torchrun's TORCHELASTIC_RUN_ID would be).
    started = time.time() if started is None else started
    began = time.monotonic()
    threads = [
        threading.Thread(
            target=_run_rank,
            args=(job, rank, endpoint, stopping, began,
                  (run_id(job, started), restart_run_id(job, started))),
            name=f"demo-{job.name}-{rank}", daemon=True,
        )
        for job in jobs
        for rank in range(RANKS_PER_JOB)
    ]
    for thread in threads:
        thread.start()
    log.info("demo: %d simulated training ranks reporting to %s", len(threads), endpoint)

    def stop() -> None:
        stopping.set()
        for thread in threads:
            thread.join(timeout=5.0)

    return stop


def _run_rank(
    job: SimulatedJob, rank: int, endpoint: str, stopping: threading.Event, began: float,
    runs: tuple[str, str | None],
) -> None:
    """The rank's run; if the job crashes, its restart (``SimulatedJob.crash_after_seconds``)."""
    jitter = random.Random(f"{job.name}/{rank}")
    first, restart = runs
    crash = None if job.crash_after_seconds is None else began + job.crash_after_seconds
    hang = [began + job.stall_after_seconds] if job.stall_after_seconds else []
    if _train(job, rank, endpoint, stopping, jitter, first, crash_at=crash, hang=hang) \
            and restart is not None:
        _train(job, rank, endpoint, stopping, jitter, restart,
               loading_seconds=job.restart_seconds, hang=hang)


def _train(
    job: SimulatedJob, rank: int, endpoint: str, stopping: threading.Event,
    jitter: random.Random, run: str, *, crash_at: float | None = None,
    loading_seconds: float = 0.0, hang: list[float] | None = None,
) -> bool:
    """One run of the rank until the demo stops (False) or, at ``crash_at`` (monotonic),
    it crashes (True); ``hang``: the monotonic time it hangs in its loader, once (taken
    from the list when it does)."""

    def pause(seconds: float) -> None:
        stopping.wait(seconds * jitter.uniform(1 - JITTER, 1 + JITTER))

    def loader() -> Iterator[int]:
        while not stopping.is_set():
            pause(job.data_wait_seconds)
            if hang and time.monotonic() >= hang[0]:
                hang.clear()
                stopping.wait(job.stall_seconds)  # the mount stops answering
            yield job.batch_size

    reporter = Reporter(
        job.name, rank=rank, local_rank=rank, world_size=RANKS_PER_JOB,
        gpu=job.first_gpu + rank, endpoint=endpoint, environ=dict(job.environment), run=run,
        config=job.config, data_paths=job.data_paths,
    )
    # the straggler computes longer; the others wait for it in their all-reduce
    compute, comm = job.compute_seconds, job.comm_seconds
    if job.straggler_rank is not None:
        if rank == job.straggler_rank:
            compute += job.straggler_seconds
        else:
            comm += job.straggler_seconds
    stopping.wait(loading_seconds)  # loading the checkpoint it restarts from
    next_checkpoint = time.monotonic() + FIRST_CHECKPOINT_SECONDS
    steps = 0
    crashed = False
    try:
        for batch_size in reporter.track(loader()):
            pause(compute)
            started = time.perf_counter()
            with reporter.phase("comm"):
                pause(comm)
            exposed = time.perf_counter() - started
            reporter.add_comm(exposed + job.overlapped_comm_seconds, exposed_seconds=exposed,
                              nbytes=job.comm_bytes, group="dp", collectives=BUCKETS_PER_STEP)
            if stopping.is_set():
                break
            reporter.step(samples=batch_size)
            steps += 1
            if crash_at is not None and time.monotonic() >= crash_at:
                crashed = True
                break
            if time.monotonic() >= next_checkpoint:
                next_checkpoint += CHECKPOINT_INTERVAL_SECONDS
                path = f"{job.checkpoint_dir}/step-{steps}/rank-{rank}.pt"
                with reporter.checkpoint(path):
                    pause(job.checkpoint_seconds)
    finally:
        reporter.close(finished=not crashed)
    return crashed

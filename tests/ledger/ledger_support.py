"""Helpers for the run ledger tests: a clock pair, run description and step lines; a
daemon with a ledger, real ``torchrun`` jobs (``tests/ledger/rate_job.py``) and the 2-D
parallel jobs (``testkit.parallel_job``), and the truth each measured of itself."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testkit.daemon import Daemon, free_port
from trainmon.collectors.ledger import LedgerCollector
from trainmon.collectors.training import TrainingCollector, TrainingConfig
from trainmon.contract import STEP_BUCKET_COUNT
from trainmon.ledger import Ledger, LedgerError, RunRecord
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


@contextmanager
def recording(clocks: Clocks, path: Path, **settings: object) -> Iterator[Recorder]:
    """A started (training, ledger) pair of ``make_recorder``, both stopped after the
    ``with``."""
    training, ledger = make_recorder(clocks, path, **settings)()  # type: ignore[arg-type]
    ledger.start()
    try:
        yield training, ledger
    finally:
        ledger.stop()
        training.stop()


def only(records: list[RunRecord]) -> RunRecord:
    assert len(records) == 1, records
    return records[0]


def only_record(path: Path, job: str | None = None) -> RunRecord:
    """The one record (of ``job``) in the ledger at ``path``."""
    with Ledger.open(path) as reader:
        return only(reader.runs(job=job))


# -- real torchrun jobs ----------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]
WORLD_SIZE = 2
#: Variables of an outer launcher that must not reach the job's ranks.
LAUNCHER_PREFIXES = ("TORCHELASTIC_", "SLURM_", "OMPI_", "PMI_", "TRAINMON_")
LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                      "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class Truth:
    """What the job measured of itself, over its ranks."""

    run: str
    #: The job's samples: every rank's (DDP), once per data-parallel replica (2-D jobs).
    samples: int
    #: Steps of every rank.
    steps: int
    #: Rank 0's loop, from its start to its last step's end (s); over every rank for the
    #: 2-D jobs (``parallel_job_truth``).
    loop_seconds: float
    #: Unix time just before the first reporter was made, just after the last was closed.
    started: float
    ended: float
    #: Every step's duration on every rank (s).
    step_seconds: tuple[float, ...]

    @property
    def samples_per_second(self) -> float:
        """The job's own count: its samples over its loop's elapsed time."""
        return self.samples / self.loop_seconds

    def step_percentile(self, q: float) -> float:
        """The ``q`` quantile of its steps' durations (``order_statistic``)."""
        return order_statistic(self.step_seconds, q)


def order_statistic(durations: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``durations``: the order statistic of rank floor(q (n - 1)),
    what a sketch's quantile stands for."""
    ordered = sorted(durations)
    return ordered[math.floor(q * (len(ordered) - 1))]


@contextmanager
def ledger_daemon(start_daemon: Callable[..., Daemon], ledger: Path,
                  flush_seconds: float) -> Iterator[str]:
    """A daemon (``start_daemon``, no GPU) keeping its run ledger at ``ledger``, flushed
    every ``flush_seconds``: the endpoint of its training socket, in a short folder (a
    unix socket path has 107 bytes) that lasts as long as the ``with``."""
    with tempfile.TemporaryDirectory(prefix="tm-", dir="/tmp") as folder:
        socket = f"{folder}/steps.sock"
        start_daemon(config={"collectors": {
            "training": {"socket": socket},
            "ledger": {"path": str(ledger), "flush_seconds": flush_seconds},
            "gpu": {"enabled": False}}})
        yield f"unix://{socket}"


def launch(seconds: float, results: Path, endpoint: str, job: str, *,
           bimodal: bool = False) -> subprocess.Popen[bytes]:
    """``torchrun --nproc-per-node 2 -m tests.ledger.rate_job SECONDS RESULTS``, reporting
    to ``endpoint`` as job ``job``; its output in ``RESULTS/torchrun.log``. ``bimodal``:
    fast and slow steps (``rate_job.py --bimodal``)."""
    results.mkdir(parents=True, exist_ok=True)
    environ = {name: value for name, value in os.environ.items()
               if not name.startswith(LAUNCHER_PREFIXES) and name not in LAUNCHER_VARIABLES}
    environ.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", TRAINMON_ENDPOINT=endpoint,
                   TRAINMON_JOB=job, PYTHONPATH=os.pathsep.join(
                       [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    with (results / "torchrun.log").open("wb") as log:  # the child keeps its own descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
             str(WORLD_SIZE), "--master-port", str(free_port()), "-m", "tests.ledger.rate_job",
             str(seconds), str(results), *(["--bimodal"] if bimodal else [])],
            env=environ, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)


def finish(process: subprocess.Popen[bytes], results: Path, timeout: float) -> Truth:
    """Wait for the job (killed past ``timeout`` seconds); it must exit 0. Its truth."""
    try:
        returncode = process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise AssertionError(f"the job ran past {timeout} s:\n{log_tail(results)}") from None
    assert returncode == 0, log_tail(results)
    ranks = [json.loads((results / f"{rank}.json").read_text()) for rank in range(WORLD_SIZE)]
    assert len({rank["run"] for rank in ranks}) == 1, ranks
    assert len({rank["steps"] for rank in ranks}) == 1, ranks  # DDP: the same steps
    return Truth(run=ranks[0]["run"], samples=sum(rank["samples"] for rank in ranks),
                 steps=sum(rank["steps"] for rank in ranks),
                 loop_seconds=ranks[0]["loop_seconds"],
                 started=min(rank["started"] for rank in ranks),
                 ended=max(rank["ended"] for rank in ranks),
                 step_seconds=tuple(duration for rank in ranks
                                    for duration in rank["step_seconds"]))


def parallel_job_truth(ranks: Sequence[Mapping[str, Any]]) -> Truth:
    """The truth of a ``testkit.parallel_job`` job from its ranks' ``--result`` files
    (``RunningJob.truth()``): its samples counted once per data-parallel replica (the
    ranks of one tensor-parallel group or pipeline read the same rows: each replica's
    ranks must agree), its steps and step durations over every rank, and its loop from
    the first rank's loop start to the last rank's last step's end."""
    assert ranks and all(rank.get("ended") for rank in ranks), ranks
    assert len({rank["run"] for rank in ranks}) == 1, [rank["run"] for rank in ranks]
    assert all(len(rank["step_durations"]) == rank["steps"] for rank in ranks), \
        "a rank kept fewer step durations than it stepped"
    replicas: dict[int, set[int]] = {}
    for rank in ranks:
        replicas.setdefault(rank["shard"], set()).add(rank["samples"])
    assert len(replicas) == ranks[0]["shards"], replicas
    assert all(len(samples) == 1 for samples in replicas.values()), replicas
    loop_start = min(rank["loop_started"] for rank in ranks)
    loop_end = max(rank["loop_started"] + rank["loop_seconds"] for rank in ranks)
    return Truth(run=ranks[0]["run"],
                 samples=sum(samples for (samples,) in replicas.values()),
                 steps=sum(rank["steps"] for rank in ranks),
                 loop_seconds=loop_end - loop_start,
                 started=min(rank["started"] for rank in ranks),
                 ended=max(rank["ended"] for rank in ranks),
                 step_seconds=tuple(duration for rank in ranks
                                    for duration in rank["step_durations"]))


def log_tail(results: Path) -> str:
    path = results / "torchrun.log"
    return path.read_text(errors="replace")[-4000:] if path.exists() else "(no log)"


def wait_for_record(path: Path, job: str, condition: Callable[[RunRecord], bool],
                    timeout: float) -> list[RunRecord]:
    """The records of ``job`` in the ledger at ``path`` (read as ``trainmon runs`` does,
    without the writer's lock) once one meets ``condition``."""
    deadline = time.monotonic() + timeout
    records: list[RunRecord] = []
    while time.monotonic() < deadline:
        try:
            with Ledger.open(path) as ledger:
                records = ledger.runs(job=job)
        except LedgerError:
            records = []  # not made yet
        if any(condition(record) for record in records):
            return records
        time.sleep(0.5)
    raise AssertionError(f"no record of {job} as expected within {timeout} s: {records}")

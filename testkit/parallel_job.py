"""One rank of a labelled parallel training job (CPU, gloo), with an optional fault.

The jobs of ``testkit.parallel_launch``, which the diagnosis tests
(``tests/diagnosis/test_parallel_jobs.py``) and ``bench/diagnosis_score.py`` run
against a real daemon. Run from the repository root, one process per rank, in the
environment ``torchrun`` sets; reports go to ``TRAINMON_ENDPOINT`` as ``TRAINMON_JOB``::

    RANK=0 WORLD_SIZE=4 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \\
    TRAINMON_ENDPOINT=unix:///tmp/steps.sock TRAINMON_JOB=tp-hang \\
    python -m testkit.parallel_job fsdp2_tp hang_loader --fault-at 10 --release /tmp/go

Each is integrated as the README says: ``Reporter(interval_seconds=0.2)``,
``reporter.instrument(model)`` on the wrapped or parallelized model, ``for batch in
reporter.track(loader): ... reporter.step()``, ``with reporter.checkpoint(path)``
around saves, ``reporter.close()`` (Lightning: ``TrainmonCallback``). The models are
small MLPs (``testkit.ddp_job.build_model``); a GPU's kernel time is a sleep inside
forward (``DeviceTime``), about 0.1 s a healthy step, so the steps mostly wait.

===========  =====  ============================================================
KIND         ranks  what a step is
===========  =====  ============================================================
ddp          2      ``DistributedDataParallel``: gradient all-reduce
fsdp2        2      ``fully_shard`` on each linear layer and the root, 1-D mesh
                    ``("dp",)``: all-gathers and reduce-scatters
fsdp2_tp     4      2-D mesh ``("dp", "tp")`` of 2×2: ``ColwiseParallel`` /
                    ``RowwiseParallel`` on the MLP's linear pair over ``tp``
                    (ranks 0-1 and 2-3), then ``fully_shard`` over ``dp``
pipeline     2      two ``PipelineStage`` s of a manually split MLP,
                    ``ScheduleGPipe`` of ``MICROBATCHES`` microbatches, the loss on
                    the last stage; every rank reads the batch (features on the
                    first stage, labels on the last)
lightning    2      ``Trainer(strategy=DDPStrategy(gloo), accelerator="cpu")`` with
                    ``TrainmonCallback``, devices and nodes from the torchrun
                    environment
===========  =====  ============================================================

FAULT (on ``--fault-rank``, default the last rank; hangs begin ``--fault-at`` seconds
after the rank's first step, once):

- ``healthy``: device time only (``HEALTHY_DEVICE_SECONDS``).
- ``storage``: the Dataset sleeps ``STORAGE_SAMPLE_SECONDS`` per sample: about two
  thirds of a step is data wait.
- ``communication``: a 5.3 M-parameter MLP (21 MB of gradients; fsdp2_tp: 10 MB of
  parameter shards per rank and collective over ``dp``), or for ``pipeline`` a boundary
  activation ``WIDEN``-fold wider (10.5 MB forward and as much back per step), over the link the
  launcher shapes to 300 Mbit/s between two network namespaces (``GLOO_SOCKET_IFNAME``).
- ``slow_rank``: the rank's device time is ``SLOW_RANK_FACTOR`` times the others'.
- ``hang_loader``: the rank's Dataset ``__getitem__`` blocks until ``--release`` exists.
- ``hang_collective``: the rank enters ``dist.barrier`` on a side group of itself and the
  next rank, made by every rank at the start, after its optimizer step (Lightning:
  before it); the next rank never enters it: it and the others wait in the job's regular
  collective of the next step (DDP's all-reduce, FSDP's all-gather, the pipeline's recv).
  Not released: a deadlock, which ends at the group's ``--timeout`` (the barrier raises).
- ``hang_lock``: between backward and the optimizer step, the rank waits for a lock
  nobody releases (as ``testkit.ddp_job hang --lock-rank``), until ``--release``.
- ``hang_checkpoint``: the rank alone enters ``with reporter.checkpoint(path)`` after its
  optimizer step and blocks in the write, as to a dead mount, until ``--release``.
- ``sigstop``, ``kill``: healthy here; the launcher sends the signal.

Every hang polls every ``RELEASE_POLL_SECONDS`` and gives up (raises) after
``--timeout`` seconds, when the other ranks' collectives time out too. Lightning cannot
``hang_checkpoint`` (rank 0 alone writes its checkpoints).

Confounders (``--confounders eval,checkpoint,warmup,varlen``), healthy on every rank:

- ``eval``: every ``--eval-every`` steps, ``eval_batches`` forwards without gradients
  (about ``EVAL_SECONDS``), no ``step()`` between (Lightning: its validation loop);
- ``checkpoint``: every ``--checkpoint-every`` steps every rank saves within
  ``reporter.checkpoint(path)``: ``torch.save`` of its state dict (DCP for the FSDP
  kinds; Lightning: ``ModelCheckpoint``, rank 0 writing), then ``--checkpoint-seconds``
  of the storage's write time;
- ``warmup``: steps 1 to ``WARMUP_STEPS`` take ``WARMUP_FACTOR`` times the device time;
- ``varlen``: batches of ``VARLEN_ROWS`` rows, the same on every rank of a step, device
  time in proportion (0.05 to 0.15 s; the pipeline pads them to one shape).

``--markers DIR``: the rank writes the Unix time of its first step to
``DIR/rank-N.first-step`` and of its fault's start to ``DIR/rank-N.fault``.
``--result FILE``: the rank's truth as JSON, rewritten every ``TRUTH_EVERY_SECONDS``:
steps, seconds in steps and in data wait (timed by the loop itself), the first-step and
fault times; for the hand-written loop also what the run ledger's rates are held to
(``tests/ledger/test_parallel_rate_acceptance.py``, as ``tests/ledger/rate_job.py``
measures them): its run id, its samples (the rows of its batches, what ``step()``
counts of the tracked batch), its data-parallel replica (``shard`` of ``shards``: the
ranks of one tensor-parallel group or pipeline read the same rows), the Unix times just
before its reporter was made and just after it was closed (``started``, ``ended``), its
loop's start (Unix, ``loop_started``) and elapsed time from its first step's start to its
last step's end (``loop_seconds``, on ``time.perf_counter``) and each step's duration
(``step_durations``: from the end of the previous step, the first from the start of the
loop, what the client times; the first ``MAX_STEP_DURATIONS``). The loop ends after ``--steps`` steps or ``--max-seconds``; a rank whose
peer died raises within ``--timeout``. As in ``testkit.ddp_job``, the models die with
their function and the process group is destroyed after ``gc.collect()``.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import gc
import json
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from testkit.ddp_job import (
    BATCH,
    CLASSES,
    SCENARIOS,
    DeviceTime,
    Samples,
    Scenario,
    TimedLoader,
    build_model,
)
from testkit.parallel_launch import CONFOUNDERS, FAULTS, KINDS, check_job, world_size

STORAGE_SAMPLE_SECONDS = 0.025
SLOW_RANK_FACTOR = 3.0
WARMUP_STEPS = 20
WARMUP_FACTOR = 3.0
#: Rows of a ``varlen`` batch, smallest and largest (``BATCH`` is the middle).
VARLEN_ROWS = (4, 12)
#: An evaluation pause of the ``eval`` confounder, seconds: its forwards are as many as
#: the job's device time per forward fits in it (every rank the same number).
EVAL_SECONDS = 4.0
MICROBATCHES = 4
#: How much wider the pipeline's boundary activation is in the ``communication`` job:
#: 8 rows × 256 × 1280 × 4 bytes = 10.5 MB forward and as much back per step.
WIDEN = 1280
#: A healthy job's device time per step: compute-bound on a loaded 2-core machine too,
#: where FSDP2's six collectives a step take 20-30 ms and Lightning's own loop about
#: 15 ms (with the faults' 0.1 s, those alone reach the 30 % communication and 20 %
#: data-wait verdicts).
HEALTHY_DEVICE_SECONDS = 0.25
RELEASE_POLL_SECONDS = 0.1
TRUTH_EVERY_SECONDS = 1.0
#: Step durations a rank's truth keeps (the first ones): over an hour of healthy steps.
MAX_STEP_DURATIONS = 16384


def job_scenario(args: argparse.Namespace) -> Scenario:
    """The shape of this job's MLP, device time by rank and per-sample read time (the
    pipeline's ``communication`` keeps the small MLP: its bytes are activations)."""
    base = SCENARIOS["communication" if args.fault == "communication" else "healthy"]
    seconds = HEALTHY_DEVICE_SECONDS if args.fault == "healthy" else base.device_seconds[0]
    return replace(
        base,
        widths=SCENARIOS["healthy"].widths if args.kind == "pipeline" else base.widths,
        device_seconds=tuple(
            seconds * SLOW_RANK_FACTOR if args.fault == "slow_rank" and rank == args.fault_rank
            else seconds for rank in range(world_size(args.kind))),
        sample_seconds=STORAGE_SAMPLE_SECONDS if args.fault == "storage" else 0.0,
    )


def eval_batches(scenario: Scenario) -> int:
    """The forwards of one evaluation pause: about ``EVAL_SECONDS`` of device time."""
    return max(1, round(EVAL_SECONDS / max(max(scenario.device_seconds), 0.01)))


class Markers:
    """The marker files of ``--markers`` (``testkit.parallel_launch.read_marker``)."""

    def __init__(self, directory: Path | None, rank: int) -> None:
        self.directory = directory
        self.rank = rank
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)

    def write(self, name: str, when: float) -> None:
        if self.directory is not None:
            write_whole(self.directory / f"rank-{self.rank}.{name}", repr(when))


def write_whole(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader never sees half of it."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)


class Truth:
    """What the rank measured itself, written to ``--result`` by a thread every
    ``TRUTH_EVERY_SECONDS`` (so a hung rank's file is current too) and at ``close()``."""

    def __init__(self, args: argparse.Namespace, rank: int) -> None:
        self.path: Path | None = args.result
        self.values: dict[str, Any] = {
            "rank": rank, "kind": args.kind, "fault": args.fault, "steps": 0,
            "step_seconds": 0.0, "data_wait_seconds": 0.0, "first_step_time": None,
            "fault_time": None, "run": None, "samples": 0, "shard": None, "shards": None,
            "started": None, "ended": None, "loop_started": None, "loop_seconds": None,
            "step_durations": []}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._writer = threading.Thread(target=self._write_every, name="truth", daemon=True)
        if self.path is not None:
            self._writer.start()

    def update(self, **values: Any) -> None:
        with self._lock:
            self.values.update(values)

    def add_step(self, seconds: float, samples: int, loop_seconds: float) -> None:
        """One more step of ``seconds`` and ``samples``; the loop has run
        ``loop_seconds`` since its start."""
        with self._lock:
            self.values["samples"] += samples
            self.values["loop_seconds"] = loop_seconds
            durations = self.values["step_durations"]
            if len(durations) < MAX_STEP_DURATIONS:
                durations.append(seconds)

    def close(self) -> None:
        self._closed.set()
        if self._writer.is_alive():
            self._writer.join()

    def _write_every(self) -> None:
        assert self.path is not None
        while True:
            closing = self._closed.wait(TRUTH_EVERY_SECONDS)
            with self._lock:
                text = json.dumps(self.values)
            write_whole(self.path, text)
            if closing:
                return


@dataclass
class Fault:
    """When this rank's fault starts: once, ``fault_at`` s after its first step, if
    it is the fault rank; the deadline of its hang."""

    name: str
    active: bool
    fault_at: float
    timeout: float
    release: Path | None
    markers: Markers
    truth: Truth
    first_step: float | None = None
    began: float | None = None

    def stepped(self) -> None:
        if self.first_step is None:
            self.first_step = time.monotonic()
            self.markers.write("first-step", time.time())
            self.truth.update(first_step_time=time.time())

    def starts(self, name: str) -> bool:
        """Whether fault ``name`` starts now (then its start is marked)."""
        if (name != self.name or not self.active or self.began is not None
                or self.first_step is None or time.monotonic() < self.first_step + self.fault_at):
            return False
        self.began = time.monotonic()
        self.markers.write("fault", time.time())
        self.truth.update(fault_time=time.time())
        return True

    def released(self) -> bool:
        """Whether the hang that began may end; TimeoutError once it lasted ``timeout``."""
        if self.release is not None and self.release.exists():
            return True
        assert self.began is not None
        if time.monotonic() - self.began > self.timeout:
            raise TimeoutError(f"{self.name}: not released within {self.timeout:.0f} s")
        return False


class FaultySamples(Samples):
    """``Samples`` read at the fault's pace: ``hang_loader`` blocks once in
    ``__getitem__`` until released; ``read_seconds`` sums the time spent here."""

    def __init__(self, features: int, length: int, sample_seconds: float,
                 fault: Fault) -> None:
        super().__init__(features, length, sample_seconds)
        self.fault = fault
        self.read_seconds = 0.0

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        started = time.monotonic()
        if self.fault.starts("hang_loader"):
            while not self.fault.released():
                time.sleep(RELEASE_POLL_SECONDS)  # a read on a dead mount
        sample = super().__getitem__(index)
        self.read_seconds += time.monotonic() - started
        return sample


class Batches:
    """Batch sampler of data shard ``shard`` of ``shards``: step ``n``'s rows are the
    same on every rank (``BATCH``, or seeded ``VARLEN_ROWS`` with ``varlen``)."""

    def __init__(self, shard: int, shards: int, steps: int, varlen: bool) -> None:
        self.shard, self.shards, self.steps, self.varlen = shard, shards, steps, varlen

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[list[int]]:
        for step in range(self.steps):
            rows = random.Random(step).randint(*VARLEN_ROWS) if self.varlen else BATCH
            start = (step * self.shards + self.shard) * VARLEN_ROWS[1]
            yield list(range(start, start + rows))


def pace_factor(args: argparse.Namespace, step: int, rows: int) -> float:
    """Device time of ``step`` of ``rows`` rows, relative to a healthy step's."""
    factor = WARMUP_FACTOR if "warmup" in args.confounders and step <= WARMUP_STEPS else 1.0
    return factor * rows / BATCH if "varlen" in args.confounders else factor


class Pace:
    """The ``DeviceTime`` modules of a model, each with the seconds it was built with."""

    def __init__(self, model: nn.Module) -> None:
        self.built = [(module, module.seconds) for module in model.modules()
                      if isinstance(module, DeviceTime)]

    def scale(self, factor: float) -> None:
        """Device time ``factor`` times the built one, from now on."""
        for module, seconds in self.built:
            module.seconds = seconds * factor


@dataclass
class Parallel:
    """What a kind built on this rank: its training step (zero_grad, forward, backward),
    its evaluation forward, the module whose state it checkpoints (``sharded``: its
    tensors are DTensors, saved by every rank together with DCP) and the data shard it
    reads (of ``shards``)."""

    optimizer: torch.optim.Optimizer
    train_step: Callable[[torch.Tensor, torch.Tensor], None]
    evaluate: Callable[[torch.Tensor, torch.Tensor], None]
    state: nn.Module
    sharded: bool
    shard: int
    shards: int
    pace: Pace = field(init=False)

    def __post_init__(self) -> None:
        self.pace = Pace(self.state)

    def checkpoint(self, folder: Path, rank: int) -> Path:
        """Where this rank's checkpoint goes in ``folder`` (a DCP folder when sharded)."""
        return folder / ("dcp" if self.sharded else f"rank-{rank}.pt")

    def save(self, path: Path) -> None:
        """Save a checkpoint to ``path`` (every rank at once)."""
        if self.sharded:
            from torch.distributed.checkpoint.state_dict_saver import save

            save(self.state.state_dict(), checkpoint_id=path)
        else:
            torch.save(self.state.state_dict(), path)

    def local_state(self) -> dict[str, torch.Tensor]:
        """This rank's own part of the state (a DTensor's local shard)."""
        from torch.distributed.tensor import DTensor

        return {name: value.to_local() if isinstance(value, DTensor) else value
                for name, value in self.state.state_dict().items()}


def data_parallel(model: nn.Module, optimizer: torch.optim.Optimizer, state: nn.Module,
                  sharded: bool, shard: int, shards: int) -> Parallel:
    """``Parallel`` of a model that takes the whole batch on every rank (DDP, FSDP)."""

    def train_step(features: torch.Tensor, labels: torch.Tensor) -> None:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(features), labels)
        loss.backward()  # type: ignore[no-untyped-call]

    def evaluate(features: torch.Tensor, labels: torch.Tensor) -> None:
        with torch.no_grad():
            model(features)

    return Parallel(optimizer, train_step, evaluate, state, sharded, shard, shards)


def build_ddp(args: argparse.Namespace, rank: int, reporter: Any) -> Parallel:
    from torch.nn.parallel import DistributedDataParallel

    net = build_model(job_scenario(args), rank)
    model = reporter.instrument(DistributedDataParallel(net))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    return data_parallel(model, optimizer, net, False, rank, dist.get_world_size())


def linear_layers(net: nn.Module) -> list[str]:
    """Names of the linear layers of ``build_model``'s MLP, the head last."""
    return [name for name, layer in net.named_children() if isinstance(layer, nn.Linear)]


def build_fsdp2(args: argparse.Namespace, rank: int, reporter: Any) -> Parallel:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("dp",))
    net = build_model(job_scenario(args), rank)
    for name in linear_layers(net):
        fully_shard(net.get_submodule(name), mesh=mesh)
    model = reporter.instrument(fully_shard(net, mesh=mesh))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    return data_parallel(model, optimizer, net, True, rank, dist.get_world_size())


def build_fsdp2_tp(args: argparse.Namespace, rank: int, reporter: Any) -> Parallel:
    """Tensor parallel over ``tp`` on the MLP's first linear pair (column-wise then
    row-wise: the hidden activation stays sharded, one all-reduce after), the rest
    replicated over ``tp``; then FSDP over ``dp``. A ``tp`` group reads one shard."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (2, dist.get_world_size() // 2), mesh_dim_names=("dp", "tp"))
    net = build_model(job_scenario(args), rank)
    linears = linear_layers(net)[:-1]  # not the head
    plan: dict[str, Any] = {}
    for up, down in zip(linears[0::2], linears[1::2], strict=False):
        plan[up], plan[down] = ColwiseParallel(), RowwiseParallel()
    parallelize_module(net, mesh["tp"], plan)
    for name in linear_layers(net):
        fully_shard(net.get_submodule(name), mesh=mesh["dp"])
    model = reporter.instrument(fully_shard(net, mesh=mesh["dp"]))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    return data_parallel(model, optimizer, net, True, mesh["dp"].get_local_rank(),
                         mesh["dp"].size())


class Widen(nn.Module):
    """The wide boundary activation of a big model, made by a repeat: ``factor`` times
    the bytes between the stages for next to no CPU."""

    def __init__(self, factor: int) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return features.repeat(1, self.factor)


class Narrow(Widen):
    """``Widen``'s inverse on the next stage: the mean of the copies."""

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return features.view(features.shape[0], self.factor, -1).mean(1)


def build_pipeline(args: argparse.Namespace, rank: int, reporter: Any) -> Parallel:
    """Stage 0: the first linear layer and its ReLU; stage 1: the rest and the head.
    Each stage's device time per microbatch is a ``MICROBATCHES + 1``-th of the
    rank's step, the length of a GPipe forward in microbatch slots."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    scenario = job_scenario(args)
    layers = list(build_model(scenario, rank).children())[1:]  # its own DeviceTime left out
    device = DeviceTime(scenario.device_seconds[rank] / (MICROBATCHES + 1))
    widen = WIDEN if args.fault == "communication" else 1
    first = rank == 0
    net = (nn.Sequential(device, *layers[:2], Widen(widen)) if first
           else nn.Sequential(Narrow(widen), device, *layers[2:]))
    net = reporter.instrument(net)
    stage = PipelineStage(net, rank, dist.get_world_size(), torch.device("cpu"))
    schedule = ScheduleGPipe(stage, MICROBATCHES, loss_fn=nn.functional.cross_entropy)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    rows = VARLEN_ROWS[1] if "varlen" in args.confounders else BATCH

    def run(step: Callable[..., Any], features: torch.Tensor, labels: torch.Tensor) -> None:
        pad = rows - features.shape[0]  # one shape for every step: the stages' buffers
        if first:
            step(torch.cat([features, features.new_zeros(pad, features.shape[1])]))
        else:
            step(target=torch.cat([labels, labels.new_zeros(pad)]), losses=[])

    def train_step(features: torch.Tensor, labels: torch.Tensor) -> None:
        optimizer.zero_grad()
        run(schedule.step, features, labels)

    def evaluate(features: torch.Tensor, labels: torch.Tensor) -> None:
        with torch.no_grad():
            run(schedule.eval, features, labels)

    return Parallel(optimizer, train_step, evaluate, net, False, 0, 1)


BUILDERS: dict[str, Callable[[argparse.Namespace, int, Any], Parallel]] = {
    "ddp": build_ddp, "fsdp2": build_fsdp2, "fsdp2_tp": build_fsdp2_tp,
    "pipeline": build_pipeline,
}


def wait_for_the_lock(lock: threading.Lock, fault: Fault) -> None:
    """Wait for ``lock``, which nobody releases, until the fault is released."""
    while not fault.released():
        lock.acquire(timeout=RELEASE_POLL_SECONDS)


def write_to_a_dead_mount(state: dict[str, torch.Tensor], path: Path, fault: Fault) -> None:
    """``torch.save`` whose write first blocks, as on a dead mount, until released."""
    while not fault.released():
        time.sleep(RELEASE_POLL_SECONDS)
    torch.save(state, path)


def side_group(args: argparse.Namespace) -> Any:
    """``hang_collective``'s group of the fault rank and the next rank (made by all)."""
    if args.fault != "hang_collective":
        return None
    peer = (args.fault_rank + 1) % dist.get_world_size()
    return dist.new_group(sorted({args.fault_rank, peer}),
                          timeout=datetime.timedelta(seconds=args.timeout))


def run_loop(args: argparse.Namespace, rank: int, fault: Fault) -> dict[str, Any]:
    """The hand-written loop of the ``torch.distributed`` kinds."""
    from trainmon.client import Reporter

    truth = fault.truth
    truth.update(started=time.time())
    reporter = Reporter(interval_seconds=0.2)
    scenario = job_scenario(args)
    torch.manual_seed(0)
    parallel = BUILDERS[args.kind](args, rank, reporter)
    side = side_group(args)
    samples = FaultySamples(scenario.widths[0], args.steps * parallel.shards * VARLEN_ROWS[1],
                            scenario.sample_seconds, fault)
    loader = TimedLoader(DataLoader(samples, batch_sampler=Batches(
        parallel.shard, parallel.shards, args.steps, "varlen" in args.confounders)))
    generator = torch.Generator().manual_seed(7)
    evaluation = [(torch.randn(BATCH, scenario.widths[0], generator=generator),
                   torch.randint(0, CLASSES, (BATCH,), generator=generator))
                  for _ in range(eval_batches(scenario))]
    args.output.mkdir(parents=True, exist_ok=True)
    truth.update(run=reporter.run, shard=parallel.shard, shards=parallel.shards)
    held = threading.Lock()
    held.acquire()  # another thread's lock, never released (hang_lock)
    began = last = time.monotonic()
    truth.update(loop_started=time.time())
    loop_start = previous = time.perf_counter()  # the client's first step starts in track()
    for step, (features, labels) in enumerate(reporter.track(loader), start=1):
        parallel.pace.scale(pace_factor(args, step, len(labels)))
        parallel.train_step(features, labels)
        if fault.starts("hang_lock"):
            wait_for_the_lock(held, fault)
        parallel.optimizer.step()
        if fault.starts("hang_collective"):
            dist.barrier(group=side)  # the peer never enters it
        if fault.starts("hang_checkpoint"):
            path = args.output / f"hung-{rank}.pt"
            with reporter.checkpoint(path):
                write_to_a_dead_mount(parallel.local_state(), path, fault)
        if "checkpoint" in args.confounders and step % args.checkpoint_every == 0:
            path = parallel.checkpoint(args.output, rank)
            with reporter.checkpoint(path):
                parallel.save(path)
                time.sleep(args.checkpoint_seconds)  # the rest of the storage's write
        reporter.step()
        step_end = time.perf_counter()
        truth.add_step(step_end - previous, len(labels), step_end - loop_start)
        previous = step_end
        fault.stepped()
        now = time.monotonic()
        truth.update(steps=step, data_wait_seconds=loader.waited,
                     step_seconds=truth.values["step_seconds"] + now - last)
        last = now
        if "eval" in args.confounders and step % args.eval_every == 0:
            parallel.pace.scale(pace_factor(args, step, BATCH))
            for eval_features, eval_labels in evaluation:
                parallel.evaluate(eval_features, eval_labels)
        if step >= args.steps or now - began > args.max_seconds:
            break
    reporter.close()
    truth.update(ended=time.time())
    return truth.values


def run_lightning(args: argparse.Namespace, rank: int, fault: Fault) -> dict[str, Any]:
    """The Lightning kind: the same MLP, data, faults and confounders, driven by a
    ``Trainer`` (devices and nodes from the torchrun environment, as Lightning's
    ``TorchElasticEnvironment`` reads them) with ``TrainmonCallback``."""
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.plugins.io import TorchCheckpointIO
    from lightning.pytorch.strategies import DDPStrategy

    from trainmon.client.lightning import TrainmonCallback

    scenario = job_scenario(args)
    truth = fault.truth
    held = threading.Lock()
    held.acquire()

    class SlowStorage(TorchCheckpointIO):  # type: ignore[misc, unused-ignore]
        def save_checkpoint(self, checkpoint: dict[str, Any], path: Any,
                            storage_options: Any = None) -> None:
            super().save_checkpoint(checkpoint, path, storage_options)
            time.sleep(args.checkpoint_seconds)  # the rest of the storage's write

    class Classifier(pl.LightningModule):  # type: ignore[misc, unused-ignore]
        def __init__(self) -> None:
            super().__init__()
            self.net = build_model(scenario, rank)
            self.pace = Pace(self.net)
            self.side: Any = None
            self.last = 0.0

        def setup(self, stage: str) -> None:
            self.side = side_group(args)  # the process group is up by now

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            features, labels = batch
            self.pace.scale(pace_factor(args, batch_idx + 1, len(labels)))
            loss: torch.Tensor = nn.functional.cross_entropy(self.net(features), labels)
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.pace.scale(pace_factor(args, self.global_step, BATCH))
            self.net(batch[0])

        def on_before_optimizer_step(self, optimizer: Any) -> None:
            # The module's hooks that come before TrainmonCallback's step() (the module's
            # on_train_batch_end runs after the callbacks'): the hung step does not count.
            if fault.starts("hang_lock"):
                wait_for_the_lock(held, fault)
            if fault.starts("hang_collective"):
                dist.barrier(group=self.side)  # the peer never enters it

        def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
            fault.stepped()
            now = time.monotonic()
            truth.update(steps=batch_idx + 1, data_wait_seconds=samples.read_seconds,
                         step_seconds=truth.values["step_seconds"] + now - (self.last or now))
            self.last = now

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    shards = world_size(args.kind)
    samples = FaultySamples(scenario.widths[0], args.steps * shards * VARLEN_ROWS[1],
                            scenario.sample_seconds, fault)
    loader = DataLoader(samples, batch_sampler=Batches(rank, shards, args.steps,
                                                      "varlen" in args.confounders))
    generator = torch.Generator().manual_seed(7)
    evaluation = DataLoader(torch.utils.data.TensorDataset(
        torch.randn(BATCH * eval_batches(scenario), scenario.widths[0], generator=generator)),
        batch_size=BATCH)
    callbacks: list[Any] = [TrainmonCallback(interval_seconds=0.2)]
    if "checkpoint" in args.confounders:
        callbacks.append(ModelCheckpoint(dirpath=args.output,
                                         every_n_train_steps=args.checkpoint_every))
    validating = "eval" in args.confounders
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", shards))
    trainer = pl.Trainer(
        accelerator="cpu", devices=per_node, num_nodes=shards // per_node,
        strategy=DDPStrategy(process_group_backend="gloo",
                             timeout=datetime.timedelta(seconds=args.timeout)),
        plugins=[SlowStorage()], max_steps=args.steps,
        max_time=datetime.timedelta(seconds=args.max_seconds),
        val_check_interval=args.eval_every if validating else None,
        check_val_every_n_epoch=None if validating else 1,
        limit_val_batches=eval_batches(scenario) if validating else 0, num_sanity_val_steps=0,
        use_distributed_sampler=False, logger=False, callbacks=callbacks,
        enable_checkpointing="checkpoint" in args.confounders, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=args.output,
    )
    trainer.fit(Classifier(), loader, evaluation if validating else None)
    return truth.values


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("kind", choices=KINDS)
    parser.add_argument("fault", choices=FAULTS)
    parser.add_argument("--fault-rank", type=int, help="default: the last rank")
    parser.add_argument("--fault-at", type=float, default=20.0,
                        help="seconds after the rank's first step that a hang begins")
    parser.add_argument("--confounders", type=lambda text: tuple(filter(None, text.split(","))),
                        default=(), help=f"comma-separated: {','.join(CONFOUNDERS)}")
    parser.add_argument("--eval-every", type=int, default=40)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--checkpoint-seconds", type=float, default=1.0,
                        help="storage write time added to each confounder checkpoint")
    parser.add_argument("--steps", type=int, default=10**9)
    parser.add_argument("--max-seconds", type=float, default=3600.0,
                        help="the loop ends after this long, whatever --steps says")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds a collective (and a hang) waits")
    parser.add_argument("--release", type=Path, help="a hang ends when this file exists")
    parser.add_argument("--markers", type=Path, help="folder of first-step and fault markers")
    parser.add_argument("--result", type=Path, help="the rank's truth, as JSON")
    parser.add_argument("--output", type=Path, default=Path("/tmp/trainmon-parallel-job"),
                        help="folder of the checkpoints")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    check_job(args.kind, args.fault, args.confounders)
    rank, ranks = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if ranks != world_size(args.kind):
        raise SystemExit(f"a {args.kind} job has {world_size(args.kind)} ranks, "
                         f"not WORLD_SIZE={ranks}")
    if args.fault_rank is None:
        args.fault_rank = ranks - 1
    torch.set_num_threads(1)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # kill -USR1: stacks to the log
    fault = Fault(args.fault, rank == args.fault_rank, args.fault_at, args.timeout,
                  args.release, Markers(args.markers, rank), Truth(args, rank))
    try:
        if args.kind == "lightning":
            run_lightning(args, rank, fault)  # Lightning sets up its own process group
        else:
            dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
            run_loop(args, rank, fault)
    finally:
        fault.truth.close()
        gc.collect()  # the models died with their function (module docstring)
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()

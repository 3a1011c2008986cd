"""One rank of a real ``torch.distributed`` job (CPU/gloo, or one GPU on NCCL).

The rank script of the instrumentation tests (``tests/client/test_instrument.py``),
the DDP diagnosis scenarios (``tests/diagnosis/test_ddp_scenarios.py``) and
``bench/gpu_check.sh``; ``tests/client/agreement_job.py`` trains its model.

Run from the repository root, one process per rank, in the environment ``torchrun``
sets; the rank's reports go to ``TRAINMON_ENDPOINT``::

    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \\
    TRAINMON_ENDPOINT=unix:///tmp/steps.sock python -m testkit.ddp_job ddp --steps 5

    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \\
    TRAINMON_ENDPOINT=unix:///tmp/steps.sock TRAINMON_JOB=ddp-healthy \\
    GLOO_SOCKET_IFNAME=lo python -m testkit.ddp_job scenario healthy

Modes of the instrumentation tests: ``ddp`` (``reporter.instrument(DistributedDataParallel
(model))``), ``fsdp`` (FSDP2 ``fully_shard``), ``lightning`` (``Trainer(strategy="ddp")``
with ``TrainmonCallback``), ``hf`` (Hugging Face ``Trainer`` with its
``TrainmonCallback``). ``--device cuda:0`` runs ``ddp``/``fsdp`` on NCCL. ``--result
FILE`` writes what the test compares against as JSON (gradient bytes, the first
parameter's gradient).

``goodput``: the job of the goodput ledger's acceptance test
(``tests/ledger/test_goodput_ddp.py``, ``run_goodput``), which writes the truth it
measured to ``--result``; ``--crash-after`` crashes it, ``--resume`` relaunches it from
its checkpoint.

``hang``: the job of the hang triage's acceptance test (``tests/diagnosis/test_hung_rank.py``):
the ``healthy`` scenario, whose Dataset on rank ``--hang-rank`` blocks from step
``--hang-at`` on, in ``__getitem__``, as a read on a dead mount does (or whose rank
``--lock-rank`` waits at step ``--lock-at`` for a lock it never gets, between backward
and the optimizer step), until the file ``--release`` exists; the other ranks wait for
it in DDP's all-reduce.

``scenario NAME``: the jobs the diagnosis must name, integrated as the README says
(``Reporter``, ``reporter.instrument`` around the DDP model, ``track(loader)``,
``step()``). Every step is a real forward/backward of an MLP with DDP's gradient
all-reduce over gloo. A GPU's kernel time is stood in for by a sleep inside ``forward``
(``DeviceTime``): the host waits for it as it waits for a ``cuda.synchronize``, without
loading the test machine's few CPU cores.

=================  =====================================  ==========================
scenario           per step                               what holds the job back
=================  =====================================  ==========================
``healthy``        small MLP, 0.1 s device time           compute
``communication``  5.3 M-parameter MLP (21 MB of          gradient all-reduce (over a
                   gradients), 0.05 s device time         300 Mbit/s link: ~0.55 s)
``slow-rank``      device time 0.02 s on rank 0,          rank 1 (a slow GPU): rank 0
                   0.2 s on rank 1 (ten times the extra)  waits in the all-reduce
``storage``        the Dataset sleeps 20 ms per sample    data loading
=================  =====================================  ==========================

Both ranks run exactly ``--steps`` steps (a collective needs every rank), so a run
ends by itself; a scenario's process group times out after ``--timeout`` seconds if
the peer disappears.

Every mode keeps its DDP model (and the trainer holding one) local to its function, and
the process group is destroyed only after the function returned and ``gc.collect()``
ran: a DDP model freed during the interpreter's finalisation instead, after its gloo
group is gone, made a rank abort ("terminate called without an active exception")
once in CI.
"""

from __future__ import annotations

import argparse
import atexit
import datetime
import gc
import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset

from testkit.torch_job import train

WIDTH = 256
DEPTH = 4
#: Samples per step of every mode.
BATCH = 8
#: Classes of the scenarios' classification MLP.
CLASSES = 10


class DeviceTime(nn.Module):
    """Identity whose forward takes ``seconds``, as a kernel on a GPU would."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if self.seconds:
            time.sleep(self.seconds)
        return features


def make_model(width: int = WIDTH, depth: int = DEPTH) -> nn.Sequential:
    """The same small regression MLP on every rank (seeded)."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 1))


def gradient_bytes(model: nn.Module) -> int:
    """Bytes of all gradients of one backward pass (float32 parameters)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def batches(steps: int, width: int, rank: int) -> list[torch.Tensor]:
    """``steps`` random input batches of ``BATCH`` rows, different on every rank."""
    generator = torch.Generator().manual_seed(1000 + rank)
    return [torch.randn(BATCH, width, generator=generator) for _ in range(steps)]


def run_ddp(args: argparse.Namespace, rank: int) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel

    from trainmon.client import Reporter

    device = torch.device(args.device)
    model = make_model(args.width, args.depth).to(device)
    slow = args.sleep if rank == args.slow_rank else 0.0
    ddp = DistributedDataParallel(
        nn.Sequential(DeviceTime(slow), model),
        device_ids=[device.index] if device.type == "cuda" else None,
    )
    reporter = Reporter("ddp-job", interval_seconds=0.2)
    hook_options: dict[str, Any] = {}
    if args.hook == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook

        hook_options = {"comm_hook": fp16_compress_hook, "comm_state": None}
    if not args.bare:
        ddp = reporter.instrument(ddp, **hook_options)
        reporter.instrument(ddp, **hook_options)  # twice: harmless
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.0)  # lr 0: gradients stay comparable
    first_grad: list[float] = []
    for batch in reporter.track(batches(args.steps, args.width, rank)):
        optimizer.zero_grad()
        ddp(batch.to(device)).square().mean().backward()
        if not first_grad:
            grad = next(model.parameters()).grad
            assert grad is not None
            first_grad = grad.flatten()[:64].tolist()
        optimizer.step()
        reporter.step(samples=BATCH)
    reporter.close()
    return {"gradient_bytes": gradient_bytes(model), "first_grad": first_grad,
            "report": reporter.report()}


def run_fsdp(args: argparse.Namespace, rank: int) -> dict[str, Any]:
    from torch.distributed.fsdp import fully_shard

    from trainmon.client import Reporter

    device = torch.device(args.device)
    model = make_model(args.width, args.depth).to(device)
    parameter_bytes = gradient_bytes(model)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    reporter = Reporter("fsdp-job", interval_seconds=0.2)
    model = reporter.instrument(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for batch in reporter.track(batches(args.steps, args.width, rank)):
        optimizer.zero_grad()
        model(batch.to(device)).square().mean().backward()
        optimizer.step()
        reporter.step(samples=BATCH)
    reporter.close()
    return {"gradient_bytes": parameter_bytes, "report": reporter.report()}


def run_lightning(args: argparse.Namespace, rank: int) -> dict[str, Any]:
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import DDPStrategy

    from trainmon.client.lightning import TrainmonCallback

    class Regression(pl.LightningModule):  # type: ignore[misc, unused-ignore]
        def __init__(self) -> None:
            super().__init__()
            self.net = make_model(args.width, args.depth)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss: torch.Tensor = self.net(batch[0]).square().mean()
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = torch.utils.data.TensorDataset(torch.randn(BATCH * args.steps * 2, args.width))
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, num_nodes=1,
        strategy=DDPStrategy(process_group_backend="gloo"),
        max_steps=args.steps, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
        callbacks=[TrainmonCallback(job="lightning-job", interval_seconds=0.2)],
    )
    module = Regression()
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=BATCH))
    return {"gradient_bytes": gradient_bytes(module.net)}


def run_hf(args: argparse.Namespace, rank: int) -> dict[str, Any]:
    from transformers import Trainer, TrainingArguments

    from trainmon.client.transformers import TrainmonCallback

    class Regression(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = make_model(args.width, args.depth)

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            loss = (self.net(x).squeeze(-1) - labels).square().mean()
            return {"loss": loss}

    class Data(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
        def __len__(self) -> int:
            return int(BATCH * args.steps * 2)

        def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
            generator = torch.Generator().manual_seed(index)
            return {"x": torch.randn(args.width, generator=generator),
                    "labels": torch.randn((), generator=generator)}

    model = Regression()
    training_args = TrainingArguments(
        output_dir=args.output, use_cpu=True, ddp_backend="gloo", max_steps=args.steps,
        per_device_train_batch_size=BATCH, report_to=[], save_strategy="no",
        logging_strategy="no", dataloader_num_workers=0, disable_tqdm=True,
    )
    trainer = Trainer(
        model=model, args=training_args, train_dataset=Data(),
        callbacks=[TrainmonCallback(job="hf-job", interval_seconds=0.2)],
    )
    trainer.train()
    return {"gradient_bytes": gradient_bytes(model.net)}


@dataclass(frozen=True)
class Scenario:
    """The shape of one diagnosis scenario's job."""

    #: Layer widths of the MLP, input first.
    widths: tuple[int, ...]
    #: Device time per forward, by rank (the last entry for ranks past the tuple).
    device_seconds: tuple[float, ...]
    #: Time the Dataset takes per sample.
    sample_seconds: float = 0.0


SCENARIOS = {
    "healthy": Scenario(widths=(64, 256, 256), device_seconds=(0.1,)),
    # 1024·2048 + 2048·1024 + 1024·1024 + biases ≈ 5.3 M float32 parameters.
    "communication": Scenario(widths=(1024, 2048, 1024, 1024), device_seconds=(0.05,)),
    "slow-rank": Scenario(widths=(64, 256, 256), device_seconds=(0.02, 0.2)),
    "storage": Scenario(widths=(64, 256, 256), device_seconds=(0.02,), sample_seconds=0.02),
}


class Samples(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Random samples, each taking ``sample_seconds`` to "read"."""

    def __init__(self, features: int, length: int, sample_seconds: float) -> None:
        self.features = features
        self.length = length
        self.sample_seconds = sample_seconds

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.sample_seconds:
            time.sleep(self.sample_seconds)
        generator = torch.Generator().manual_seed(index)
        return (torch.randn(self.features, generator=generator),
                torch.randint(0, CLASSES, (), generator=generator))


class BlockingSamples(Samples):
    """``Samples`` whose ``blocks_from``-th sample on blocks until ``release`` exists."""

    def __init__(self, features: int, length: int, blocks_from: int | None,
                 release: Path) -> None:
        super().__init__(features, length, 0.0)
        self.blocks_from = blocks_from
        self.release = release

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.blocks_from is not None and index >= self.blocks_from:
            while not self.release.exists():
                time.sleep(0.05)  # a read that does not return
            self.blocks_from = None
        return super().__getitem__(index)


def build_model(scenario: Scenario, rank: int) -> nn.Module:
    """The scenario's classification MLP, behind the rank's ``DeviceTime``."""
    device = scenario.device_seconds[min(rank, len(scenario.device_seconds) - 1)]
    layers: list[nn.Module] = [DeviceTime(device)]
    for inputs, outputs in zip(scenario.widths, scenario.widths[1:], strict=False):
        layers += [nn.Linear(inputs, outputs), nn.ReLU()]
    layers.append(nn.Linear(scenario.widths[-1], CLASSES))
    return nn.Sequential(*layers)


def parameter_count(scenario: Scenario) -> int:
    """Parameters of the scenario's model (what DDP all-reduces every step)."""
    return sum(p.numel() for p in build_model(scenario, 0).parameters())


def run_scenario(args: argparse.Namespace, rank: int) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel

    from trainmon.client import Reporter

    scenario = SCENARIOS[args.scenario]
    torch.manual_seed(0)  # DDP broadcasts rank 0's weights anyway
    reporter = Reporter(interval_seconds=0.5)  # job, rank, endpoint from the environment
    model = reporter.instrument(DistributedDataParallel(build_model(scenario, rank)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    samples = Samples(scenario.widths[0], args.steps * BATCH, scenario.sample_seconds)
    loader = DataLoader(samples, batch_size=BATCH, num_workers=0)
    train(reporter, model, loader, optimizer)
    reporter.close()
    return {}


def run_hang(args: argparse.Namespace, rank: int) -> dict[str, Any]:
    """The hang job (module docstring): ``--steps`` steps; rank ``--hang-rank``'s loader
    blocked from step ``--hang-at``, or rank ``--lock-rank`` waiting from step
    ``--lock-at`` for a lock it never gets between backward and the optimizer step,
    until ``--release`` exists."""
    from torch.nn.parallel import DistributedDataParallel

    from trainmon.client import Reporter

    scenario = replace(SCENARIOS["healthy"], device_seconds=(args.device_seconds,))
    torch.manual_seed(0)
    reporter = Reporter(interval_seconds=0.5)
    model = reporter.instrument(DistributedDataParallel(build_model(scenario, rank)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    blocks = args.hang_at * BATCH if rank == args.hang_rank else None
    samples = BlockingSamples(scenario.widths[0], args.steps * BATCH, blocks, args.release)
    held = threading.Lock()
    held.acquire()  # another thread's lock, never released: the deadlock the test sets up
    loader = DataLoader(samples, batch_size=BATCH, num_workers=0)
    for step, (features, labels) in enumerate(reporter.track(loader), start=1):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(features), labels)
        loss.backward()  # type: ignore[no-untyped-call]
        if rank == args.lock_rank and step == args.lock_at:
            wait_for_the_lock(held, args.release)
        optimizer.step()
        reporter.step(samples=len(labels))
    reporter.close()
    return {}


def wait_for_the_lock(lock: threading.Lock, release: Path) -> None:
    """Wait for ``lock``, which nobody releases, until ``release`` exists."""
    while not release.exists():
        lock.acquire(timeout=0.05)


class TimedLoader:
    """Iterates ``loader`` and adds the time each ``next()`` blocks to ``waited``: the
    goodput job's own truth of its data wait, apart from the reporter's."""

    def __init__(self, loader: DataLoader[Any]) -> None:
        self.loader = loader
        self.waited = 0.0

    def __iter__(self) -> Any:
        iterator = iter(self.loader)
        while True:
            started = time.monotonic()
            try:
                item = next(iterator)
            except StopIteration:
                return
            finally:
                self.waited += time.monotonic() - started
            yield item


def run_goodput(args: argparse.Namespace, rank: int) -> dict[str, Any]:
    """The goodput job: a Dataset that waits about a quarter of each step, a checkpoint
    of ``--checkpoint-seconds`` every ``--checkpoint-every`` steps (saved with its step),
    and one hang of ``--stall-seconds`` in rank ``--stall-rank`` at step ``--stall-at``
    (the other rank waits for it in the all-reduce; 0: none).

    ``--crash-after N``: every rank raises after its step N, uncaught (the process exits
    1, and the client's exit hook closes the reporter ``crashed``); the result is
    written at exit, after that close. ``--resume``: the relaunch of such a run, which
    loads the rank's checkpoint (after its reporter started: a restart's load is part
    of its startup) and trains from the step after the saved one to ``--steps``.

    Returns the truth it measured on its own clock: seconds from its reporter's start
    to its first step (``startup``), in data loading, in checkpoint saves, hung, from
    its last step to its end (``other``) and from its start to its end (``held``; the
    end: its reporter closed); the step it resumed from, its last step, and
    ``step_productive``, each step's wall time less its data wait, its save and the
    exposed communication its reporter measured."""
    from torch.nn.parallel import DistributedDataParallel

    from trainmon.client import Reporter

    scenario = Scenario(widths=(64, 256, 256), device_seconds=(args.device_seconds,),
                        sample_seconds=args.sample_seconds)
    truth = {"startup": 0.0, "checkpoint": 0.0, "stalled": 0.0, "data_wait": 0.0}
    result: dict[str, Any] = {"truth": truth, "resumed_from": 0, "last_step": 0,
                              "step_productive": [], "comm_exposed": None}
    clock = {"began": time.monotonic()}
    clock["last_step"] = clock["began"]
    if args.crash_after:
        # atexit runs the last registered first: this one after the reporter's own exit
        # hook (registered with the first reporter, below) closed it.
        atexit.register(write_result_at_exit, args.result, result, clock)
    reporter = Reporter(interval_seconds=0.5)  # job, rank, endpoint from the environment
    torch.manual_seed(0)
    model = reporter.instrument(DistributedDataParallel(build_model(scenario, rank)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    checkpoint = Path(args.output) / f"checkpoint-{rank}.pt"
    if args.resume:
        saved = torch.load(checkpoint, weights_only=True)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        result["resumed_from"] = int(saved["step"])
    first = result["resumed_from"] + 1
    samples = Samples(scenario.widths[0], args.steps * BATCH, scenario.sample_seconds)
    loader = TimedLoader(DataLoader(Subset(samples, range((first - 1) * BATCH, len(samples))),
                                    batch_size=BATCH, num_workers=0))
    waited = exposed = 0.0  # at the end of the step before
    clock["last_step"] = time.monotonic()  # the first step starts with the loop
    for step, (features, labels) in enumerate(reporter.track(loader), start=first):
        if step == first:
            truth["startup"] = time.monotonic() - clock["began"] - loader.waited
        if step == args.stall_at:
            if rank == args.stall_rank:
                time.sleep(args.stall_seconds)
            truth["stalled"] = args.stall_seconds  # the other rank waits as long
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(features), labels)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        save = 0.0
        if step % args.checkpoint_every == 0:
            saving = time.monotonic()
            with reporter.checkpoint(checkpoint):
                torch.save({"step": step, "model": model.state_dict(),
                            "optimizer": optimizer.state_dict()}, checkpoint)
                time.sleep(args.checkpoint_seconds)
            save = time.monotonic() - saving
            truth["checkpoint"] += save
        reporter.step(samples=len(labels))
        ended = time.monotonic()
        measured = reporter.report().get("comm_exposed_seconds")  # none until measured
        comm = float(measured) if isinstance(measured, (int, float)) else 0.0
        result["step_productive"].append(
            ended - clock["last_step"] - (loader.waited - waited) - save - (comm - exposed))
        clock["last_step"], waited, exposed = ended, loader.waited, comm
        result["last_step"], result["comm_exposed"], truth["data_wait"] = step, comm, waited
        if step == args.crash_after:
            raise RuntimeError(f"rank {rank} crashes after step {step} (--crash-after)")
    reporter.close()
    result["comm_exposed"] = reporter.report().get("comm_exposed_seconds")
    end_truth(result, clock)
    return result


def end_truth(result: dict[str, Any], clock: dict[str, float]) -> None:
    """The goodput job ends now: ``held`` and ``other`` (after its last step) of its truth
    (its wait for a batch that never came, at the end of the data, is ``other`` too:
    no step holds it)."""
    now = time.monotonic()
    result["truth"]["held"] = now - clock["began"]
    result["truth"]["other"] = now - clock["last_step"]


def write_result_at_exit(path: Path | None, result: dict[str, Any],
                         clock: dict[str, float]) -> None:
    """The ``--result`` of a goodput run that crashed, at the interpreter's exit."""
    end_truth(result, clock)
    if path is not None:
        path.write_text(json.dumps(result))


Mode = Callable[[argparse.Namespace, int], dict[str, Any]]
class SlowingSamples(Samples):
    """``Samples`` whose reads take ``slower_seconds`` each from ``slower_at`` seconds
    after the first read on (a dataset region on slower storage, a cache that stops
    hitting)."""

    def __init__(self, features: int, length: int, sample_seconds: float,
                 slower_at: float, slower_seconds: float, marker: Path) -> None:
        super().__init__(features, length, sample_seconds)
        self.slower_at = slower_at
        self.slower_seconds = slower_seconds
        self.marker = marker
        self.began: float | None = None

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        now = time.monotonic()
        if self.began is None:
            self.began = now
        if (self.slower_at >= 0 and now - self.began >= self.slower_at
                and self.sample_seconds != self.slower_seconds):
            self.sample_seconds = self.slower_seconds
            self.marker.write_text(str(time.time()))  # when it slowed, for the test
        return super().__getitem__(index)


class CpuWork(nn.Module):
    """Identity whose forward multiplies a ``size`` x ``size`` matrix ``rounds`` times on
    the CPU: host work a CPU limit slows (``DeviceTime`` sleeps, which no limit slows)."""

    def __init__(self, size: int, rounds: int) -> None:
        super().__init__()
        self.matrix = torch.randn(size, size, generator=torch.Generator().manual_seed(5))
        self.rounds = rounds

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        product = self.matrix
        for _ in range(self.rounds):
            product = torch.tanh(product @ self.matrix)
        return features + 0.0 * product.mean()


def run_failslow(args: argparse.Namespace, rank: int) -> dict[str, Any]:
    """The fail-slow acceptance job (``tests/diagnosis/test_fail_slow_jobs.py``): DDP
    steps of ``--device-seconds`` of device time and ``--cpu-rounds`` of host matrix work,
    ``--steps`` of them; its Dataset reads ``--sample-seconds`` per sample, and
    ``--slower-seconds`` from ``--slower-at`` seconds on (writing the Unix time it did to
    ``--output``/``slower-<rank>``); an evaluation of
    ``--evaluate-seconds`` every ``--evaluate-every`` steps and a checkpoint (a real
    ``torch.save`` of ``--checkpoint-bytes``, reported) every ``--checkpoint-every``
    steps, between steps (0: none). The test slows a rank from outside (a CPU limit)."""
    from torch.nn.parallel import DistributedDataParallel

    from trainmon.client import Reporter

    torch.manual_seed(0)
    reporter = Reporter(interval_seconds=0.5)  # job, rank, endpoint from the environment
    layers: list[nn.Module] = [DeviceTime(args.device_seconds), CpuWork(256, args.cpu_rounds)]
    layers += [nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, CLASSES)]
    model = reporter.instrument(DistributedDataParallel(nn.Sequential(*layers)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    samples = SlowingSamples(64, 1_000_000, args.sample_seconds, args.slower_at,
                             args.slower_seconds, Path(args.output) / f"slower-{rank}")
    loader = DataLoader(samples, batch_size=BATCH, num_workers=0)
    ballast = torch.zeros(args.checkpoint_bytes // 4)
    # every rank pauses at the same steps (a collective needs them all); the test ends
    # the job
    for step, (features, labels) in enumerate(reporter.track(loader), start=1):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(features), labels).backward()
        optimizer.step()
        reporter.step()
        if step >= args.steps:
            break
        if args.evaluate_every and step % args.evaluate_every == 0:
            with torch.no_grad():
                stop = time.monotonic() + args.evaluate_seconds
                while time.monotonic() < stop:
                    model(features)
        if args.checkpoint_every and step % args.checkpoint_every == 0:
            path = Path(args.output) / f"checkpoint-{rank}.pt"
            with reporter.checkpoint(str(path)):
                torch.save({"model": model.state_dict(), "ballast": ballast}, path)
    reporter.close()
    return {}


MODES: dict[str, Mode] = {
    "ddp": run_ddp, "fsdp": run_fsdp, "lightning": run_lightning, "hf": run_hf,
    "scenario": run_scenario, "goodput": run_goodput, "hang": run_hang,
    "failslow": run_failslow,
}


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    modes = parser.add_subparsers(dest="mode", required=True)
    for name in ("ddp", "fsdp", "lightning", "hf"):
        mode = modes.add_parser(name)
        mode.add_argument("--steps", type=int, default=6)
        mode.add_argument("--width", type=int, default=WIDTH)
        mode.add_argument("--depth", type=int, default=DEPTH)
        mode.add_argument("--slow-rank", type=int, default=-1)
        mode.add_argument("--sleep", type=float, default=0.0, help="seconds per forward")
        mode.add_argument("--hook", choices=["default", "fp16"], default="default")
        mode.add_argument("--bare", action="store_true", help="do not instrument")
        mode.add_argument("--device", default="cpu", help="cpu, or cuda:N (backend nccl)")
        mode.add_argument("--output", default="/tmp/trainmon-hf")
        mode.add_argument("--result", type=Path)
    scenario = modes.add_parser("scenario")
    scenario.add_argument("scenario", choices=sorted(SCENARIOS))
    scenario.add_argument("--steps", type=int, default=400)
    scenario.add_argument("--timeout", type=float, default=60.0,
                          help="seconds a collective waits for the peer")
    hang = modes.add_parser("hang")
    hang.add_argument("--steps", type=int, default=60)
    hang.add_argument("--device-seconds", type=float, default=0.05)
    hang.add_argument("--hang-rank", type=int, default=1)
    hang.add_argument("--hang-at", type=int, default=30)
    hang.add_argument("--lock-rank", type=int, default=-1)
    hang.add_argument("--lock-at", type=int, default=30)
    hang.add_argument("--release", type=Path, required=True)
    hang.add_argument("--timeout", type=float, default=300.0,
                      help="seconds a collective waits for the peer")
    failslow = modes.add_parser("failslow")
    failslow.add_argument("--steps", type=int, default=100_000)
    failslow.add_argument("--device-seconds", type=float, default=0.05)
    failslow.add_argument("--cpu-rounds", type=int, default=4)
    failslow.add_argument("--sample-seconds", type=float, default=0.001)
    failslow.add_argument("--slower-at", type=float, default=-1.0)
    failslow.add_argument("--slower-seconds", type=float, default=0.0)
    failslow.add_argument("--evaluate-every", type=int, default=0)
    failslow.add_argument("--evaluate-seconds", type=float, default=1.0)
    failslow.add_argument("--checkpoint-every", type=int, default=0)
    failslow.add_argument("--checkpoint-bytes", type=int, default=16 << 20)
    failslow.add_argument("--output", default="/tmp")
    failslow.add_argument("--timeout", type=float, default=120.0,
                          help="seconds a collective waits for the peer")
    goodput = modes.add_parser("goodput")
    goodput.add_argument("--steps", type=int, default=200)
    goodput.add_argument("--device-seconds", type=float, default=0.06)
    goodput.add_argument("--sample-seconds", type=float, default=0.0025,
                         help="per sample: 8 a batch, about a quarter of the step")
    goodput.add_argument("--checkpoint-every", type=int, default=40)
    goodput.add_argument("--checkpoint-seconds", type=float, default=0.5)
    goodput.add_argument("--stall-at", type=int, default=100)
    goodput.add_argument("--stall-rank", type=int, default=1)
    goodput.add_argument("--stall-seconds", type=float, default=20.0)
    goodput.add_argument("--crash-after", type=int, default=0,
                         help="raise after this step, in every rank (0: never)")
    goodput.add_argument("--resume", action="store_true",
                         help="go on from the step of the rank's checkpoint in --output")
    goodput.add_argument("--timeout", type=float, default=120.0,
                         help="seconds a collective waits for the peer")
    goodput.add_argument("--output", default="/tmp")
    goodput.add_argument("--result", type=Path)
    return parser


def init_process_group(args: argparse.Namespace) -> None:
    """``ddp``/``fsdp``/``scenario`` set up their group here (the frameworks set up theirs)."""
    if args.mode in ("scenario", "goodput", "hang", "failslow"):
        torch.set_num_threads(1)
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    elif args.mode in ("ddp", "fsdp"):
        if args.device.startswith("cuda"):
            torch.cuda.set_device(torch.device(args.device))
        dist.init_process_group("nccl" if args.device.startswith("cuda") else "gloo")


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    rank = int(os.environ["RANK"])
    init_process_group(args)
    try:
        result = MODES[args.mode](args, rank)
    finally:
        # The DDP model died with the mode's frame; collect any cycle through its comm
        # hook now, while the group it holds still exists (module docstring).
        gc.collect()
        if dist.is_initialized():
            dist.destroy_process_group()
    result_path: Path | None = getattr(args, "result", None)
    if result_path is not None:
        result_path.write_text(json.dumps(result))


if __name__ == "__main__":
    main()

"""One rank of a real ``torch.distributed`` job (CPU, gloo), run as a process by
``test_instrument.py`` and ``bench.instrument_overhead``.

::

    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \\
    TRAINMON_ENDPOINT=unix:///tmp/steps.sock python -m tests.training.dist_job ddp --steps 5

Modes: ``ddp`` (``reporter.instrument(DistributedDataParallel(model))``),
``fsdp`` (FSDP2 ``fully_shard``), ``lightning`` (``Trainer(strategy="ddp")``
with ``TrainmonCallback``), ``hf`` (Hugging Face ``Trainer`` with its
``TrainmonCallback``). ``--device cuda:0`` runs ``ddp``/``fsdp`` on NCCL.
The environment is what ``torchrun`` sets; the rank's
reports go to ``TRAINMON_ENDPOINT``. ``--result FILE`` writes what the test
compares against as JSON (gradient bytes, the first parameter's gradient).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

WIDTH = 256
DEPTH = 4
BATCH = 8


def make_model(width: int = WIDTH, depth: int = DEPTH) -> nn.Sequential:
    """The same small MLP on every rank (seeded)."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 1))


def gradient_bytes(model: nn.Module) -> int:
    """Bytes of all gradients of one backward pass (float32 parameters)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


class SlowForward(nn.Module):
    """Sleeps ``seconds`` in every forward: a rank with more compute per step."""

    def __init__(self, inner: nn.Module, seconds: float) -> None:
        super().__init__()
        self.inner = inner
        self.seconds = seconds

    def forward(self, x: torch.Tensor) -> Any:
        if self.seconds:
            time.sleep(self.seconds)
        return self.inner(x)


def batches(steps: int, width: int, rank: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 + rank)
    return [torch.randn(BATCH, width, generator=generator) for _ in range(steps)]


def run_ddp(args: argparse.Namespace, rank: int) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel

    from trainmon.client import Reporter

    device = torch.device(args.device)
    model = make_model(args.width, args.depth).to(device)
    slow = args.sleep if rank == args.slow_rank else 0.0
    ddp = DistributedDataParallel(
        SlowForward(model, slow), device_ids=[device.index] if device.type == "cuda" else None
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

    class Regression(pl.LightningModule):  # type: ignore[misc]
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
            return BATCH * args.steps * 2

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


MODES = {"ddp": run_ddp, "fsdp": run_fsdp, "lightning": run_lightning, "hf": run_hf}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=sorted(MODES))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--width", type=int, default=WIDTH)
    parser.add_argument("--depth", type=int, default=DEPTH)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds per forward")
    parser.add_argument("--hook", choices=["default", "fp16"], default="default")
    parser.add_argument("--bare", action="store_true", help="do not instrument")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda:N (backend nccl)")
    parser.add_argument("--output", default="/tmp/trainmon-hf")
    parser.add_argument("--result", type=Path)
    args = parser.parse_args(argv)
    rank = int(os.environ["RANK"])
    if args.mode in ("ddp", "fsdp"):
        if args.device.startswith("cuda"):
            torch.cuda.set_device(torch.device(args.device))
        dist.init_process_group("nccl" if args.device.startswith("cuda") else "gloo")
    result = MODES[args.mode](args, rank)
    if dist.is_initialized():
        dist.destroy_process_group()
    if args.result is not None:
        args.result.write_text(json.dumps(result))


if __name__ == "__main__":
    main()

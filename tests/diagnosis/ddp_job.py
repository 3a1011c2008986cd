"""A real 2-rank ``DistributedDataParallel`` job (gloo, CPU) for the DDP scenarios.

Run from the repository root, one process per rank::

    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \\
    TRAINMON_ENDPOINT=unix:///tmp/steps.sock TRAINMON_JOB=ddp-healthy \\
    GLOO_SOCKET_IFNAME=lo python -m tests.diagnosis.ddp_job --scenario healthy

It is integrated as the README says: ``Reporter``, ``reporter.instrument``
around the DDP model, ``track(loader)``, ``step()``. Every step is a real
forward/backward of an MLP with DDP's gradient all-reduce over gloo. A GPU's
kernel time is stood in for by a sleep inside ``forward`` (``DeviceTime``):
the host waits for it as it waits for a ``cuda.synchronize``, without
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

Both ranks run exactly ``--steps`` steps (a collective needs every rank), so
a run ends by itself; the process group times out after ``--timeout``
seconds if the peer disappears.
"""

from __future__ import annotations

import argparse
import datetime
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

from tests.support.torch_job import train
from trainmon.client import Reporter

BATCH_SIZE = 8
CLASSES = 10


@dataclass(frozen=True)
class Scenario:
    """The shape of one scenario's job."""

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


class DeviceTime(nn.Module):
    """Identity whose forward takes ``seconds``, as a kernel on a GPU would."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        time.sleep(self.seconds)
        return features


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


def build_model(scenario: Scenario, rank: int) -> nn.Module:
    device = scenario.device_seconds[min(rank, len(scenario.device_seconds) - 1)]
    layers: list[nn.Module] = [DeviceTime(device)]
    for inputs, outputs in zip(scenario.widths, scenario.widths[1:], strict=False):
        layers += [nn.Linear(inputs, outputs), nn.ReLU()]
    layers.append(nn.Linear(scenario.widths[-1], CLASSES))
    return nn.Sequential(*layers)


def parameter_count(scenario: Scenario) -> int:
    """Parameters of the scenario's model (what DDP all-reduces every step)."""
    return sum(p.numel() for p in build_model(scenario, 0).parameters())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), required=True)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--timeout", type=float, default=60.0)
    options = parser.parse_args(argv)
    scenario = SCENARIOS[options.scenario]

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=options.timeout))
    try:
        rank = dist.get_rank()
        torch.manual_seed(0)  # DDP broadcasts rank 0's weights anyway
        reporter = Reporter(interval_seconds=0.5)  # job, rank, endpoint from the environment
        model = reporter.instrument(DistributedDataParallel(build_model(scenario, rank)))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        samples = Samples(scenario.widths[0], options.steps * BATCH_SIZE, scenario.sample_seconds)
        loader = DataLoader(samples, batch_size=BATCH_SIZE, num_workers=0)
        train(reporter, model, loader, optimizer)
        reporter.close()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

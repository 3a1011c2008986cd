"""A small real training job for the profile tests: ``python -m testkit.profiled_job``.

A two-layer MLP with a convolution in front, trained with SGD on random batches (on
the CPU, or on ``--device cuda:0``),
reporting every step to the daemon at ``--endpoint``, until ``--seconds`` pass or the
file ``--stop`` appears. ``--own-profiler`` keeps a ``torch.profiler`` of its own
running the whole time (a user's own profiling), so an on-demand profile cannot start.
On exit it prints one JSON line: steps done, profiles sent and failed in this process.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from trainmon.client import Reporter


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--job", required=True)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--stop", default=None)
    parser.add_argument("--own-profiler", action="store_true")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(
        torch.nn.Conv1d(4, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
        torch.nn.Linear(8 * 32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    own = None
    if args.own_profiler:
        own = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        own.start()
    reporter = Reporter(job=args.job, endpoint=args.endpoint, interval_seconds=0.2)
    end = time.monotonic() + args.seconds
    steps = 0
    while time.monotonic() < end and not (args.stop and os.path.exists(args.stop)):
        x = torch.randn(16, 4, 32, device=device)
        y = torch.randint(0, 10, (16,), device=device)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        reporter.step(samples=16)
        steps += 1
        time.sleep(0.005)
    reporter.close()
    if own is not None:
        own.stop()
    agent = reporter._profiles
    print(json.dumps({"steps": steps, "sent": agent.sent, "failed": agent.failed}), flush=True)


if __name__ == "__main__":
    main()

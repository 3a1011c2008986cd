"""Cost of ``Reporter.instrument()`` on a real DDP job: step time bare vs instrumented.

Two processes on CPU/gloo (loopback), one thread each. Every rank builds two
identical ``DistributedDataParallel`` models: **bare** (DDP's built-in C++
all-reduce) and **instrumented** (``reporter.instrument(...)``: the timed
Python hook around ``allreduce_hook``). Both loops call ``reporter.step()``
each step (separate reporters, delivering to a unix socket this script
drains), so the difference is the instrumentation alone. Rounds alternate
between the two so both see the same machine load; the ratio is the median
over rounds of (instrumented round / the bare round next to it).

Scenarios: **healthy** (compute-bound: a 4 × 512 MLP on 256-sample batches)
and **comm-heavy** (4 × 2048, 67 MB of gradients in three buckets, 8-sample
batches: the all-reduce is most of the step).

    .venv/bin/python -m bench.instrument_overhead              # 12 rounds of 10 steps
    .venv/bin/python -m bench.instrument_overhead --rounds 20

Prints a markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

SCENARIOS = {
    # name: (width, depth, batch)
    "healthy": (512, 4, 256),
    "comm-heavy": (2048, 4, 8),
}


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from trainmon.client import Reporter

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    results: dict[str, dict[str, object]] = {}
    def mlp(width: int, depth: int) -> torch.nn.Module:
        torch.manual_seed(0)
        layers: list[torch.nn.Module] = []
        for _ in range(depth):
            layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
        return torch.nn.Sequential(*layers)

    for name, (width, depth, batch) in SCENARIOS.items():

        reporters = {variant: Reporter(f"bench-{name}-{variant}", interval_seconds=1.0)
                     for variant in ("bare", "instrumented")}
        models = {
            "bare": DistributedDataParallel(mlp(width, depth)),
            "instrumented": reporters["instrumented"].instrument(
                DistributedDataParallel(mlp(width, depth))
            ),
        }
        inputs = torch.randn(batch, width)
        round_means: dict[str, list[float]] = {"bare": [], "instrumented": []}
        for round_index in range(args.rounds + 1):  # round 0 warms up (DDP rebuilds buckets)
            order = ("bare", "instrumented") if round_index % 2 else ("instrumented", "bare")
            for variant in order:
                ddp, reporter = models[variant], reporters[variant]
                dist.barrier()
                started = time.perf_counter()
                for _ in range(args.steps):
                    ddp.zero_grad()
                    ddp(inputs).square().mean().backward()
                    reporter.step(samples=batch)
                if round_index:
                    round_means[variant].append((time.perf_counter() - started) / args.steps)
        report = reporters["instrumented"].report()
        instrumented_steps = report["steps"]
        assert isinstance(instrumented_steps, int)
        for reporter in reporters.values():
            reporter.close()
        ratios = [i / b for i, b in zip(round_means["instrumented"], round_means["bare"],
                                         strict=True)]
        results[name] = {
            "params": sum(p.numel() for p in models["bare"].parameters()),
            "bare_ms": statistics.median(round_means["bare"]) * 1e3,
            "instrumented_ms": statistics.median(round_means["instrumented"]) * 1e3,
            "ratio": statistics.median(ratios),
            "ratio_spread": (min(ratios), max(ratios)),
            "comm_ms_per_step": float(report["comm_seconds"]) / instrumented_steps * 1e3,  # type: ignore[arg-type]
            "exposed_ms_per_step":
                float(report["comm_exposed_seconds"]) / instrumented_steps * 1e3,  # type: ignore[arg-type]
            "bytes_per_step": int(report["comm_bytes"]) // instrumented_steps,  # type: ignore[call-overload]
        }
    dist.destroy_process_group()
    if rank == 0:
        Path(args.result).write_text(json.dumps(results))


def drain(sock: socket.socket, stop: threading.Event) -> None:
    sock.settimeout(0.2)
    while not stop.is_set():
        try:
            sock.recv(65_536)
        except TimeoutError:
            continue


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=10, help="steps per round")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    with tempfile.TemporaryDirectory(prefix="tm-bench-", dir="/tmp") as directory:
        path = Path(directory) / "steps.sock"
        sink = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sink.bind(str(path))
        stop = threading.Event()
        threading.Thread(target=drain, args=(sink, stop), daemon=True).start()
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        result = Path(directory) / "result.json"
        processes = [
            subprocess.Popen(
                [sys.executable, "-m", "bench.instrument_overhead", "--worker",
                 "--rounds", str(args.rounds), "--steps", str(args.steps),
                 "--result", str(result)],
                env=dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                         MASTER_PORT=str(port), TRAINMON_ENDPOINT=f"unix://{path}",
                         OMP_NUM_THREADS="1"),
            )
            for rank in range(2)
        ]
        codes = [process.wait() for process in processes]
        stop.set()
        if codes != [0, 0]:
            raise SystemExit(f"workers failed: {codes}")
        results = json.loads(result.read_text())
    print(f"2 ranks, gloo on loopback, {os.cpu_count()} CPUs, "
          f"{args.rounds} alternating rounds of {args.steps} steps\n")
    print("| scenario | parameters | bare step | instrumented step | ratio (median, range) "
          "| measured comm / step | exposed / step | bytes / step |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, row in results.items():
        low, high = row["ratio_spread"]
        print(f"| {name} | {row['params']:,} | {row['bare_ms']:.2f} ms "
              f"| {row['instrumented_ms']:.2f} ms | {row['ratio']:.4f} ({low:.3f}–{high:.3f}) "
              f"| {row['comm_ms_per_step']:.2f} ms | {row['exposed_ms_per_step']:.2f} ms "
              f"| {row['bytes_per_step']:,} |")


if __name__ == "__main__":
    main()

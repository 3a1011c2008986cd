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

Wall time on a shared machine is too noisy to resolve a ~1 % difference, so
the same run also measures CPU time, which other load barely changes:

- **per-step CPU** of each round of the 2-rank job: ``time.process_time()``
  (all threads of the rank: training thread, gloo's, the reporter's sender)
  and ``time.thread_time()`` (the training thread alone), bare vs
  instrumented, paired by round like the wall times;
- **microbenchmark**, after the 2-rank job, in one process: a world-size-1
  gloo group (its all-reduce is a no-op) and a tiny DDP model with one
  parameter per bucket, as many buckets as each scenario's job reduced per
  step, bare vs instrumented in alternating blocks of many steps. Step cost
  is then DDP's bookkeeping plus, in the instrumented loop, the
  instrumentation's own work: the Python hook wrapper and the ``then``
  callback and record per bucket, and the fold in ``step()`` (timed
  separately, training-thread CPU around ``reporter.step()``). The added CPU
  per step is set against each scenario's bare step time of the same run,
  and, for the goal of the instrumentation (at most 1 % of a short GPU step
  with many buckets), the microbenchmark also runs with ``--buckets`` buckets
  (8) set against a ``--reference-step-ms`` step (10 ms).

    .venv/bin/python -m bench.instrument_overhead              # 12 rounds of 10 steps
    .venv/bin/python -m bench.instrument_overhead --rounds 24
    .venv/bin/python -m bench.instrument_overhead --micro-only  # the 8-bucket figure alone

Prints markdown tables for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bench import headline
from testkit.daemon import free_port

SCENARIOS = {
    # name: (width, depth, batch)
    "healthy": (512, 4, 256),
    "comm-heavy": (2048, 4, 8),
}


def paired(bare: list[float], instrumented: list[float]) -> dict[str, object]:
    """Medians of per-step seconds, and the paired instrumented - bare differences
    and ratios of adjacent rounds (or blocks): median, quartiles, range."""
    differences = [i - b for b, i in zip(bare, instrumented, strict=True)]
    ratios = [i / b for b, i in zip(bare, instrumented, strict=True)]
    return {
        "bare": statistics.median(bare),
        "instrumented": statistics.median(instrumented),
        "difference": statistics.median(differences),
        "difference_quartiles": quartiles(differences),
        "difference_range": (min(differences), max(differences)),
        "ratio": statistics.median(ratios),
        "ratio_range": (min(ratios), max(ratios)),
    }


def quartiles(values: list[float]) -> tuple[float, float]:
    low, _, high = statistics.quantiles(values, n=4, method="inclusive")
    return low, high


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
        # Per-step seconds of each round: wall, process CPU, training-thread CPU.
        round_means: dict[str, list[float]] = {"bare": [], "instrumented": []}
        round_cpu: dict[str, list[float]] = {"bare": [], "instrumented": []}
        round_thread: dict[str, list[float]] = {"bare": [], "instrumented": []}
        for round_index in range(args.rounds + 1):  # round 0 warms up (DDP rebuilds buckets)
            order = ("bare", "instrumented") if round_index % 2 else ("instrumented", "bare")
            for variant in order:
                ddp, reporter = models[variant], reporters[variant]
                dist.barrier()
                started = time.perf_counter()
                cpu_started, thread_started = time.process_time(), time.thread_time()
                for _ in range(args.steps):
                    ddp.zero_grad()
                    ddp(inputs).square().mean().backward()
                    reporter.step(samples=batch)
                if round_index:
                    round_means[variant].append((time.perf_counter() - started) / args.steps)
                    round_cpu[variant].append((time.process_time() - cpu_started) / args.steps)
                    round_thread[variant].append(
                        (time.thread_time() - thread_started) / args.steps)
        buckets = {variant: int(model._get_ddp_logging_data()["num_buckets_reduced"])  # type: ignore[no-untyped-call]
                   for variant, model in models.items()}
        assert buckets["bare"] == buckets["instrumented"], buckets
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
            "buckets": buckets["bare"],
            "cpu": paired(round_cpu["bare"], round_cpu["instrumented"]),
            "thread": paired(round_thread["bare"], round_thread["instrumented"]),
        }
    # Free the DDP models while their gloo group exists: one freed in the interpreter's
    # finalisation can abort the rank (testkit/ddp_job.py).
    del models, ddp
    gc.collect()
    dist.destroy_process_group()
    if rank == 0:
        Path(args.result).write_text(json.dumps(results))


def micro(args: argparse.Namespace) -> None:
    """The instrumentation's own CPU per step, in one process (world size 1)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from trainmon.client import Reporter

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    # Captured before instrument() wraps the torch.distributed collectives.
    all_reduce = dist.all_reduce

    def plain_hook(group, bucket):  # type: ignore[no-untyped-def]
        """DDP's allreduce_hook, untimed: the cost of a Python hook alone.

        Unannotated: DDP rejects the string annotations of ``from __future__``.
        """
        tensor = bucket.buffer()
        tensor.div_(group.size())
        return all_reduce(tensor, group=group, async_op=True).get_future().then(
            lambda done: done.value()[0])

    variants = ("bare", "hook", "instrumented")
    results: dict[str, dict[str, object]] = {}
    for count in sorted({int(b) for b in args.bucket_counts.split(",")}):
        def tiny(count: int = count) -> torch.nn.Module:
            torch.manual_seed(0)
            return torch.nn.Sequential(*(torch.nn.Linear(16, 16, bias=False)
                                         for _ in range(count)))

        reporters = {variant: Reporter(f"micro-{count}-{variant}", interval_seconds=1.0)
                     for variant in variants}
        # A 10-byte bucket cap: one 1 KiB parameter per bucket once DDP rebuilds them.
        models = {variant: DistributedDataParallel(tiny(), bucket_cap_mb=1e-5)
                  for variant in variants}
        models["hook"].register_comm_hook(dist.group.WORLD, plain_hook)
        reporters["instrumented"].instrument(models["instrumented"])
        inputs = torch.randn(4, 16)
        # Per-step seconds of each block: process CPU, training-thread CPU, wall,
        # training-thread CPU inside reporter.step().
        series: dict[str, dict[str, list[float]]] = {
            variant: {"cpu": [], "thread": [], "wall": [], "step": []} for variant in models}
        for block in range(args.micro_blocks + 1):  # block 0 warms up
            order = variants[block % 3:] + variants[:block % 3]
            for variant in order:
                ddp, reporter = models[variant], reporters[variant]
                in_step = 0.0
                wall, cpu, thread = time.perf_counter(), time.process_time(), time.thread_time()
                for _ in range(args.micro_steps):
                    ddp.zero_grad()
                    ddp(inputs).sum().backward()
                    before = time.thread_time()
                    reporter.step(samples=4)
                    in_step += time.thread_time() - before
                if block:
                    row = series[variant]
                    row["cpu"].append((time.process_time() - cpu) / args.micro_steps)
                    row["thread"].append((time.thread_time() - thread) / args.micro_steps)
                    row["wall"].append((time.perf_counter() - wall) / args.micro_steps)
                    row["step"].append(in_step / args.micro_steps)
        reduced = {variant: int(model._get_ddp_logging_data()["num_buckets_reduced"])  # type: ignore[no-untyped-call]
                   for variant, model in models.items()}
        assert set(reduced.values()) == {count}, reduced
        report = reporters["instrumented"].report()
        steps = (args.micro_blocks + 1) * args.micro_steps
        assert report["steps"] == steps and "comm_seconds" in report, report
        for reporter in reporters.values():
            reporter.close()
        # instrumented - bare: all instrument() adds; hook - bare: DDP's Python-hook
        # path alone; instrumented - hook: trainmon's own work (wrapper, fold).
        results[str(count)] = {
            f"{measure}:{low}:{high}": paired(series[low][measure], series[high][measure])
            for measure in ("cpu", "thread", "wall", "step")
            for low, high in (("bare", "instrumented"), ("bare", "hook"),
                              ("hook", "instrumented"))
        }
    del models, ddp  # as in worker()
    gc.collect()
    dist.destroy_process_group()
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
    parser.add_argument("--micro-blocks", type=int, default=40,
                        help="alternating blocks per variant of the world-size-1 microbenchmark")
    parser.add_argument("--micro-steps", type=int, default=250, help="steps per micro block")
    parser.add_argument("--buckets", type=int, default=8,
                        help="buckets of the microbenchmark's reference step")
    parser.add_argument("--reference-step-ms", type=float, default=10.0,
                        help="the reference step the --buckets figure is set against, ms")
    parser.add_argument("--micro-only", action="store_true",
                        help="skip the 2-rank job: the microbenchmark's reference step alone")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--micro", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--bucket-counts", default="", help=argparse.SUPPRESS)
    parser.add_argument("--result", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.micro:
        micro(args)
        return
    with tempfile.TemporaryDirectory(prefix="tm-bench-", dir="/tmp") as directory:
        path = Path(directory) / "steps.sock"
        sink = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sink.bind(str(path))
        stop = threading.Event()
        threading.Thread(target=drain, args=(sink, stop), daemon=True).start()
        environment = dict(os.environ, TRAINMON_ENDPOINT=f"unix://{path}", OMP_NUM_THREADS="1")
        results = {} if args.micro_only else job(args, Path(directory), environment)
        # The microbenchmark runs alone, after the job, with the job's bucket counts
        # and the reference step's.
        counts = [*(int(row["buckets"]) for row in results.values()), args.buckets]
        micro_result = Path(directory) / "micro.json"
        code = subprocess.call(
            [sys.executable, "-m", "bench.instrument_overhead", "--micro",
             "--micro-blocks", str(args.micro_blocks), "--micro-steps", str(args.micro_steps),
             "--bucket-counts", ",".join(map(str, counts)), "--result", str(micro_result)],
            env=environment,
        )
        stop.set()
        if code:
            raise SystemExit(f"microbenchmark failed: {code}")
        micro_results = json.loads(micro_result.read_text())
    print_tables(args, results, micro_results)


def job(
    args: argparse.Namespace, directory: Path, environment: dict[str, str]
) -> dict[str, dict[str, object]]:
    """Run the 2-rank job; rank 0's results per scenario."""
    port = free_port()
    result = directory / "result.json"
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.instrument_overhead", "--worker",
             "--rounds", str(args.rounds), "--steps", str(args.steps),
             "--result", str(result)],
            env=dict(environment, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=str(port)),
        )
        for rank in range(2)
    ]
    codes = [process.wait() for process in processes]
    if codes != [0, 0]:
        raise SystemExit(f"workers failed: {codes}")
    results: dict[str, dict[str, object]] = json.loads(result.read_text())
    return results


def print_tables(
    args: argparse.Namespace,
    results: dict[str, dict[str, object]],
    micro_results: dict[str, dict[str, dict[str, object]]],
) -> None:
    def us(seconds: object) -> str:
        return f"{float(seconds) * 1e6:+.1f}"  # type: ignore[arg-type]

    def spread(row: dict[str, object], key: str) -> str:
        low, high = row[key]  # type: ignore[misc]
        return f"{us(low)} … {us(high)}"

    if results:
        print_job_tables(args, results, us, spread)
    print(f"\nMicrobenchmark: world-size-1 gloo, {os.cpu_count()} CPUs, one 1 KiB parameter "
          f"per bucket, {args.micro_blocks} rotating blocks of {args.micro_steps} steps per "
          "variant (bare: built-in all-reduce; hook: DDP's allreduce_hook as a plain Python "
          "hook; instrumented: instrument()); added = per-step difference of adjacent blocks, "
          "µs: median [quartiles] (range); share = median added process CPU / the scenario's "
          f"bare wall step above, or the reference step ({args.reference_step_ms:g} ms):\n")
    print("| scenario | buckets | bare step CPU | added by | process CPU | thread CPU "
          "| in step() | wall | share of step |")
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    comparisons = (("instrument() in all", "bare:instrumented"),
                   ("Python hook path", "bare:hook"),
                   ("trainmon's own work", "hook:instrumented"))
    rows = [(name, int(row["buckets"]), float(row["bare_ms"]))  # type: ignore[call-overload,arg-type]
            for name, row in results.items()]
    rows.append((f"{args.reference_step_ms:g} ms step", args.buckets, args.reference_step_ms))
    for name, buckets, step_ms in rows:
        micro_row = micro_results[str(buckets)]
        bare_cpu = float(micro_row["cpu:bare:instrumented"]["bare"]) * 1e6  # type: ignore[arg-type]
        for label, pair in comparisons:
            measures = [micro_row[f"{measure}:{pair}"]
                        for measure in ("cpu", "thread", "step", "wall")]
            cells = [f"{us(m['difference'])} [{spread(m, 'difference_quartiles')}] "
                     f"({spread(m, 'difference_range')})" for m in measures]
            share = float(measures[0]["difference"]) / (step_ms / 1e3)  # type: ignore[arg-type]
            print(f"| {name} | {buckets} | {bare_cpu:.1f} µs | {label} "
                  f"| {' | '.join(cells)} | {share:.3%} |")
            if name == rows[-1][0] and pair == "bare:instrumented":
                headline.record(headline.Figure(
                    f"instrument() process CPU, % of a {step_ms:g} ms step with {buckets} "
                    "buckets", 100 * share, anchor="NVRx / Falcon < 1 % / < 0.1 %",
                    at_most=1.0, source="bench.instrument_overhead"))


def print_job_tables(
    args: argparse.Namespace,
    results: dict[str, dict[str, object]],
    us: Callable[[object], str],
    spread: Callable[[dict[str, object], str], str],
) -> None:
    print(f"2 ranks, gloo on loopback, {os.cpu_count()} CPUs, "
          f"{args.rounds} alternating rounds of {args.steps} steps\n")
    print("Wall time per step:\n")
    print("| scenario | parameters | buckets | bare step | instrumented step "
          "| ratio (median, range) | measured comm / step | exposed / step | bytes / step |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, row in results.items():
        low, high = row["ratio_spread"]  # type: ignore[misc]
        print(f"| {name} | {row['params']:,} | {row['buckets']} | {row['bare_ms']:.2f} ms "
              f"| {row['instrumented_ms']:.2f} ms | {row['ratio']:.4f} ({low:.3f}–{high:.3f}) "
              f"| {row['comm_ms_per_step']:.2f} ms | {row['exposed_ms_per_step']:.2f} ms "
              f"| {row['bytes_per_step']:,} |")

    print("\nCPU time per step, rank 0 (same rounds; process = all its threads, "
          "thread = the training thread); added = instrumented − bare of adjacent rounds, "
          "µs: median [quartiles] (range):\n")
    print("| scenario | CPU | bare | instrumented | ratio (median, range) | added / step |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for name, row in results.items():
        for label, key in (("process", "cpu"), ("thread", "thread")):
            cpu: dict[str, object] = row[key]  # type: ignore[assignment]
            low, high = cpu["ratio_range"]  # type: ignore[misc]
            print(f"| {name} | {label} | {float(cpu['bare']) * 1e3:.2f} ms "  # type: ignore[arg-type]
                  f"| {float(cpu['instrumented']) * 1e3:.2f} ms "  # type: ignore[arg-type]
                  f"| {cpu['ratio']:.4f} ({low:.3f}–{high:.3f}) "
                  f"| {us(cpu['difference'])} [{spread(cpu, 'difference_quartiles')}] "
                  f"({spread(cpu, 'difference_range')}) |")


if __name__ == "__main__":
    main()

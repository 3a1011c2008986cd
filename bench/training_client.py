"""Cost of instrumenting one training step: trainmon's ``Reporter.step()`` vs the alternatives.

Side by side, in one process, on loopback:

- **bare loop**: the loop with nothing in it (what the timer itself costs);
- **Reporter.step()**: trainmon's client, with its sender thread delivering to a
  real ``trainmon serve`` over the unix socket once a second;
- **Histogram.observe()**: a ``prometheus_client`` histogram, timing the step
  with ``perf_counter`` first (``Reporter.step`` measures the step itself);
- **statsd UDP send**: one ``sendto`` of a statsd timing line per step to a
  loopback UDP socket (what a statsd/DogStatsD client does per call);
- **track() next + step()**: one iteration of ``for batch in
  reporter.track(loader)`` over an ``(x, y)`` tensor batch, the step given
  ``samples=32`` or counting the batch's leading dimension itself (needs torch).

Each call is timed alone with ``perf_counter_ns``; the timer's own cost (the
bare loop's median) is subtracted. Rounds alternate between the variants so all
see the same machine load.

    .venv/bin/python -m bench.training_client            # 200 000 calls per variant
    .venv/bin/python -m bench.training_client --calls 50000

Prints a markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry, Histogram

from bench import benchlib
from trainmon.client import Reporter
from trainmon.contract import STEP_SECONDS_BOUNDS

ROUNDS = 10


def measure(call: Callable[[], None], count: int) -> list[int]:
    """Nanoseconds of each of ``count`` calls, timed one by one."""
    clock = time.perf_counter_ns
    samples = [0] * count
    for index in range(count):
        started = clock()
        call()
        samples[index] = clock() - started
    return samples


def variants(reporter: Reporter, udp_target: tuple[str, int]) -> dict[str, Callable[[], None]]:
    histogram = Histogram(
        "bench_step_seconds", "step time", buckets=STEP_SECONDS_BOUNDS,
        registry=CollectorRegistry(),
    )
    perf_counter = time.perf_counter
    last = [perf_counter()]

    def observe() -> None:
        now = perf_counter()
        histogram.observe(now - last[0])
        last[0] = now

    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.setblocking(False)
    line = b"train.step_seconds:12.5|ms|#job:resnet50,rank:0"

    def statsd() -> None:
        try:  # noqa: SIM105 - contextlib.suppress would add its own cost to the measurement
            udp.sendto(line, udp_target)
        except BlockingIOError:
            pass

    step = reporter.step

    def report_step() -> None:
        step(32)

    calls = {
        "bare loop": lambda: None,
        "Reporter.step() (trainmon)": report_step,
        "prometheus_client Histogram.observe()": observe,
        "statsd-style UDP sendto()": statsd,
    }
    try:
        import torch
    except ImportError:  # the counted rows need a real tensor batch
        return calls
    batch = (torch.zeros(32, 3, 8, 8), torch.zeros(32, dtype=torch.long))
    # One loop iteration each: next() through track(), then the step.
    explicit = reporter.track(itertools.repeat(batch))
    counted = reporter.track(itertools.repeat(batch))

    def tracked_explicit() -> None:
        next(explicit)
        step(32)

    def tracked_counted() -> None:
        next(counted)
        step()  # counts x.shape[0] of the (x, y) batch

    calls["track() next + step(samples=32)"] = tracked_explicit
    calls["track() next + step() counting (x, y)"] = tracked_counted
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=200_000, help="calls per variant")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as folder:
        config, sock = benchlib.training_only_config(Path(folder))
        daemon = benchlib.start_trainmon(config, quiet=True)
        sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sink.bind(("127.0.0.1", 0))  # a statsd "server" that never reads: the kernel drops
        try:
            reporter = Reporter("bench", endpoint=f"unix://{sock}", environ={})
            calls = variants(reporter, sink.getsockname())
            results: dict[str, list[int]] = {name: [] for name in calls}
            per_round = max(1, args.calls // ROUNDS)
            gc.disable()
            for _ in range(ROUNDS):
                for name, call in calls.items():
                    results[name].extend(measure(call, per_round))
            gc.enable()
            reporter.close()
            delivered = reporter.dropped_reports == 0
        finally:
            daemon.stop()
            sink.close()

    timer = statistics.median(results["bare loop"])
    print(f"{per_round * ROUNDS} calls per variant, Python {sys.version.split()[0]}, "
          f"{os.cpu_count()} CPUs; timer overhead {timer} ns subtracted; "
          f"Reporter delivered every report: {delivered}\n")
    print("| per step | median (µs) | p99 (µs) | median vs Reporter.step() |")
    print("| --- | ---: | ---: | ---: |")
    step_median = max(statistics.median(results["Reporter.step() (trainmon)"]) - timer, 1)
    for name, samples in results.items():
        samples.sort()
        median = max(statistics.median(samples) - timer, 0)
        p99 = max(benchlib.percentile(samples, 0.99) - timer, 0)
        ratio = "—" if name == "bare loop" else f"{median / step_median:.2f}×"
        print(f"| {name} | {median / 1000:.2f} | {p99 / 1000:.2f} | {ratio} |")


if __name__ == "__main__":
    main()

"""GPM sampling cost per GPU, beside the GPU collector's other work, on the fake NVML.

Runs in a child that has the fake ``libnvidia-ml.so.1`` of ``testkit/fakenvml``
on ``LD_LIBRARY_PATH`` (8 GPUs with GPM activity), so the real pynvml code path —
ctypes structs of ``nvmlGpmMetricsGet_t`` included — is measured; NVML's own
cost on a real driver is not (the fake answers in microseconds). One
``GPMSampler.poll()`` takes one sample of every GPU and computes the metrics of
the last pair (2 NVML calls per GPU); at the default 1 s interval its time is
also its share of one core. ``GPUCollector.collect()`` and the utilization
sampler's ``poll()`` are measured the same way for comparison
(``bench/gpu_collection.py`` has the full comparison with the baseline exporter).

    .venv/bin/python -m bench.gpm_sampling               # 2000 cycles
    .venv/bin/python -m bench.gpm_sampling --cycles 500

Prints a markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench import benchlib

GPUS = 8
SCENARIO = f"gpus {GPUS}\nsteady * 95 2\ngpm * 80 45 60 35\n"


def child(cycles: int) -> dict[str, dict[str, float]]:
    from trainmon.collectors.gpu import GPUCollector, GPUConfig
    from trainmon.gpu.nvml import NVML

    fake = ctypes.CDLL("libnvidia-ml.so.1")
    fake.fakenvml_calls.restype = ctypes.c_ulonglong
    collector = GPUCollector(NVML(), GPUConfig())
    assert collector.gpm is not None
    list(collector.collect())  # open the session
    collector.gpm.poll()  # probe GPM and allocate the buffers
    time.sleep(0.001)
    results: dict[str, dict[str, float]] = {}

    def measure(name: str, action: Callable[[], object]) -> None:
        before = fake.fakenvml_calls()
        durations = []
        for _ in range(cycles):
            started = time.perf_counter()
            action()
            durations.append(time.perf_counter() - started)
        durations.sort()
        results[name] = {
            "median": statistics.median(durations),
            "p95": benchlib.percentile(durations, 0.95),
            "calls": (fake.fakenvml_calls() - before) / cycles,
        }

    measure("GPMSampler.poll() (GPM sample + metrics)", collector.gpm.poll)
    measure("UtilizationSampler.poll()", collector.sampler.poll)
    measure("GPUCollector.collect()", lambda: list(collector.collect()))
    assert len(collector.gpm.snapshot()) == GPUS, "GPM produced no values"
    collector.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.cycles)))
        return
    with tempfile.TemporaryDirectory(prefix="trainmon-gpm-bench-") as name:
        env = benchlib.fake_nvml_env(Path(name), SCENARIO)
        done = subprocess.run(
            [sys.executable, "-m", "bench.gpm_sampling", "--child", "--cycles", str(args.cycles)],
            env=env,
            cwd=benchlib.ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
    results = json.loads(done.stdout.strip().splitlines()[-1])
    rates = {"GPUCollector.collect()": 1 / 15}  # a 15 s scrape; the samplers run every second
    print(
        f"### GPM sampling vs the rest of the GPU collector, {GPUS} fake GPUs "
        f"({args.cycles} cycles)\n"
    )
    print("| what | median | p95 | NVML calls | per GPU per second at its rate |")
    print("| --- | --- | --- | --- | --- |")
    for name, stats in results.items():
        rate = rates.get(name, 1.0)
        per_gpu_us = stats["median"] * rate / GPUS * 1e6
        print(
            f"| {name} | {stats['median'] * 1e3:.3f} ms | {stats['p95'] * 1e3:.3f} ms | "
            f"{stats['calls']:.0f} | {per_gpu_us:.1f} µs ({rate:.3g}/s) |"
        )


if __name__ == "__main__":
    main()

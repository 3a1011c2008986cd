"""GPU collection cost and daemon footprint, trainmon vs the usual Python exporter.

Everything runs on the fake ``libnvidia-ml.so.1`` of ``testkit/fakenvml``
(compiled here, loaded through ``LD_LIBRARY_PATH``) with 8 GPUs, so the real
pynvml code path is measured; NVML's own cost on a real driver is not (the fake
answers in microseconds, except ``nvmlDeviceGetPcieThroughput``, which blocks
20 ms as the real call does). Three parts, one run:

1. **cycle**: one full ``GPUCollector.collect()`` over 8 GPUs, one
   ``UtilizationSampler.poll()``, and one refresh of the baseline exporter
   (``bench/gpu_baseline_exporter.py``: timer-driven ``prometheus_client``
   gauges), with and without its ``nvmlDeviceGetPcieThroughput`` calls;
   NVML calls counted by the fake.
2. **visibility**: GPUs 0–3 saw-tooth (10 s period, 65 % busy) for 180 s of fake
   time; what a 15 s scrape of the current utilization sees vs the sampler.
3. **soak**: ``trainmon serve`` (all node collectors on: gpu, network, disk,
   infiniband, training, attribution, diagnosis) and the baseline exporter
   (1 s refresh), both scraped every 15 s for ``--duration`` seconds: CPU share
   of one core and resident memory.

    .venv/bin/python -m bench.gpu_collection                  # 2000 cycles, 300 s soak
    .venv/bin/python -m bench.gpu_collection --cycles 500 --duration 60

Prints markdown tables for docs/benchmarks.md.
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

import requests

from bench import benchlib
from trainmon.collectors.gpu import GPUConfig
from trainmon.gpu.sampler import FLAG_THRESHOLD

ROOT = benchlib.ROOT
BASELINE = ROOT / "bench" / "gpu_baseline_exporter.py"
SCENARIO = "gpus 8\nsteady * 95 2\n" + "".join(f"square {i} 10 0.65 98 1\n" for i in range(4))


# -- parts 1 and 2 run in a child that has the fake on LD_LIBRARY_PATH ---------------


def timed(action: Callable[[], object], count: int) -> list[float]:
    durations = []
    for _ in range(count):
        started = time.perf_counter()
        action()
        durations.append(time.perf_counter() - started)
    return durations


def child_cycles(cycles: int) -> dict[str, object]:
    import pynvml

    import bench.gpu_baseline_exporter as baseline
    from trainmon.collectors.gpu import GPUCollector, GPUConfig
    from trainmon.gpu.nvml import NVML

    fake = ctypes.CDLL("libnvidia-ml.so.1")
    fake.fakenvml_calls.restype = ctypes.c_ulonglong
    collector = GPUCollector(NVML(), GPUConfig())
    list(collector.collect())  # open the session
    results: dict[str, object] = {}

    def measure(name: str, action: Callable[[], object], count: int) -> None:
        before = fake.fakenvml_calls()
        durations = timed(action, count)
        calls = (fake.fakenvml_calls() - before) / count
        durations.sort()
        results[name] = {
            "median": statistics.median(durations),
            "p95": benchlib.percentile(durations, 0.95),
            "calls": calls,
        }

    measure("trainmon collect()", lambda: list(collector.collect()), cycles)
    measure("trainmon sampler poll()", collector.sampler.poll, cycles)
    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
    measure("baseline refresh", lambda: baseline.refresh(handles, False), cycles)
    measure("baseline refresh + PCIe throughput", lambda: baseline.refresh(handles, True), 5)
    collector.stop()
    return results


def child_visibility() -> dict[str, object]:
    import pynvml

    from trainmon.collectors.gpu import GPUConfig
    from trainmon.gpu.nvml import NVML
    from trainmon.gpu.sampler import UtilizationSampler

    fake = ctypes.CDLL("libnvidia-ml.so.1")
    config = GPUConfig()
    nvml = NVML()
    sampler = UtilizationSampler(nvml, window_seconds=config.window_seconds)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    scraped = []
    for second in range(1, 181):
        fake.fakenvml_set_time(ctypes.c_double(second))
        sampler.poll()
        if second % 15 == 0:  # what a 15 s scrape of the current utilization gets
            scraped.append(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100)
    snapshot = sampler.snapshot()[0]
    return {
        "scraped": scraped,
        "samples": snapshot.samples_total,
        "idle_share": snapshot.idle_samples_total / snapshot.samples_total,
        "transitions": snapshot.transitions_total,
        "sawtooth_ratio": snapshot.sawtooth_ratio,
    }


def scraped_view(values: list[float]) -> str:
    """What scraped utilization ratios (0–1) show, judged with the detector's
    default thresholds: steady unless some are idle and some busy."""
    defaults = GPUConfig()
    idle = min(values) < defaults.idle_threshold
    busy = max(values) >= defaults.busy_threshold
    return "busy and idle both seen" if idle and busy else "looks steady"


# -- part 3: the soak ------------------------------------------------------------------


def trainmon(env: dict[str, str], folder: Path, *, gpu: bool) -> benchlib.Daemon:
    """A ``trainmon serve`` with every node collector, the GPU one only with ``gpu``."""
    config = folder / f"trainmon-{'gpu' if gpu else 'nogpu'}.yml"
    config.write_text(
        f"collectors:\n  gpu: {{enabled: {'auto' if gpu else 'false'}}}\n"
        f"  training: {{socket: {folder / f'steps-{config.stem}.sock'}}}\n"
    )
    return benchlib.start_trainmon(config, env=env, wait=False)


def soak(
    env: dict[str, str], folder: Path, duration: float, interval: float
) -> list[dict[str, object]]:
    baseline_port = benchlib.free_port()
    with_gpu, without_gpu = trainmon(env, folder, gpu=True), trainmon(env, folder, gpu=False)
    processes = {
        "trainmon serve (all node collectors)": (with_gpu.process, f"{with_gpu.url}/metrics"),
        "trainmon serve without its GPU collector": (
            without_gpu.process, f"{without_gpu.url}/metrics",
        ),
        "baseline exporter (GPU only, 1 s refresh)": (
            subprocess.Popen([sys.executable, str(BASELINE), str(baseline_port)], env=env),
            f"http://127.0.0.1:{baseline_port}/metrics",
        ),
    }
    try:
        for process, url in processes.values():
            benchlib.wait_ready(url, process)
        time.sleep(5)  # warm-up: imports done, threads started, first scrapes served
        start = {name: benchlib.cpu_seconds(p.pid) for name, (p, _) in processes.items()}
        started = time.monotonic()
        scrapes = 0
        while time.monotonic() - started < duration:
            for _, url in processes.values():
                requests.get(url, timeout=10).raise_for_status()
            scrapes += 1
            time.sleep(max(0.0, min(interval, duration - (time.monotonic() - started))))
        elapsed = time.monotonic() - started
        rows = []
        for name, (process, _) in processes.items():
            rows.append(
                {
                    "name": name,
                    "cpu_share": (benchlib.cpu_seconds(process.pid) - start[name]) / elapsed,
                    "rss_mib": benchlib.memory_kib(process.pid, "VmRSS") / 1024,
                    "peak_rss_mib": benchlib.memory_kib(process.pid, "VmHWM") / 1024,
                    "scrapes": scrapes,
                    "seconds": elapsed,
                }
            )
        return rows
    finally:
        for process, _ in processes.values():
            benchlib.stop(process)


# -- report --------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--duration", type=float, default=300.0, help="soak seconds")
    parser.add_argument("--scrape-interval", type=float, default=15.0)
    parser.add_argument("--child", choices=["cycles", "visibility"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "cycles":
        print(json.dumps(child_cycles(args.cycles)))
        return
    if args.child == "visibility":
        print(json.dumps(child_visibility()))
        return

    with tempfile.TemporaryDirectory(prefix="trainmon-gpu-bench-") as name:
        folder = Path(name)
        env = benchlib.fake_nvml_env(folder, SCENARIO)

        def child(part: str) -> dict[str, object]:
            done = subprocess.run(
                [sys.executable, __file__, "--child", part, "--cycles", str(args.cycles)],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
            return result

        cycles = child("cycles")
        visibility = child("visibility")
        rows = soak(env, folder, args.duration, args.scrape_interval)

    print(f"### One collection cycle, 8 fake GPUs ({args.cycles} cycles)\n")
    print("| what | median | p95 | NVML calls | time per second at its rate |")
    print("| --- | --- | --- | --- | --- |")
    for name, stats in cycles.items():
        assert isinstance(stats, dict)
        median, p95, calls = stats["median"], stats["p95"], stats["calls"]
        rate = {"trainmon collect()": 1 / 15, "trainmon sampler poll()": 1.0}.get(name, 1.0)
        print(
            f"| {name} | {median * 1e3:.3f} ms | {p95 * 1e3:.3f} ms | {calls:.0f} | "
            f"{median * rate * 100:.3f} % ({rate:.3g}/s) |"
        )
    print(
        "\n### What a 15 s scrape sees of a saw-toothing GPU (GPU 0: 10 s period, 65 % busy, "
        "180 s)\n"
    )
    scraped, ratio = visibility["scraped"], visibility["sawtooth_ratio"]
    assert isinstance(scraped, list) and isinstance(ratio, int | float)
    flag = "flagged" if ratio >= FLAG_THRESHOLD else "not flagged"
    print("| view | samples | what it shows |")
    print("| --- | --- | --- |")
    print(
        f"| `nvmlDeviceGetUtilizationRates` every 15 s | {len(scraped)} | "
        f"min {min(scraped):.2f}, max {max(scraped):.2f}: {scraped_view(scraped)} |"
    )
    print(
        f"| trainmon sampler | {visibility['samples']} | idle share "
        f"{visibility['idle_share']:.2f}, {visibility['transitions']} transitions, "
        f"sawtooth_ratio {ratio:.2f} ({flag}) |"
    )
    print(
        f"\n### Daemon footprint, scraped every {args.scrape_interval:g} s "
        f"for {rows[0]['seconds']:.0f} s\n"
    )
    print("| process | CPU (share of one core) | RSS | peak RSS | scrapes |")
    print("| --- | --- | --- | --- | --- |")
    for row in rows:
        print(
            f"| {row['name']} | {float(row['cpu_share']) * 100:.2f} % | "  # type: ignore[arg-type]
            f"{row['rss_mib']:.1f} MiB | {row['peak_rss_mib']:.1f} MiB | {row['scrapes']} |"
        )


if __name__ == "__main__":
    main()

"""Scrape latency, CPU per scrape and resident memory: trainmon vs node_exporter.

Both exporters run on this machine, on loopback, restricted to the same data:
trainmon with only its network and disk collectors, Debian's
``prometheus-node-exporter`` with only ``netdev`` and ``diskstats``. Scrapes
alternate between the two so that both see the same machine load.

    .venv/bin/python -m bench.node_scrape                 # 2000 scrapes each, 300 s soak
    .venv/bin/python -m bench.node_scrape --scrapes 500 --soak-seconds 60

Prints a markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from bench import benchlib


@dataclass
class Exporter:
    name: str
    process: subprocess.Popen[bytes]
    url: str


def start_trainmon(folder: Path) -> Exporter:
    config = folder / "trainmon.yml"
    config.write_text(
        "collectors:\n"
        "  gpu: {enabled: false}\n"
        "  infiniband: {enabled: false}\n"
        "  training: {enabled: false}\n"
    )
    daemon = benchlib.start_trainmon(config)
    return Exporter("trainmon (network+disk)", daemon.process, f"{daemon.url}/metrics")


def start_node_exporter() -> Exporter:
    binary = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if binary is None:
        raise SystemExit("prometheus-node-exporter is not installed (apt-get install it)")
    port = benchlib.free_port()
    process = subprocess.Popen(
        [binary, "--collector.disable-defaults", "--collector.netdev", "--collector.diskstats",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stderr=subprocess.DEVNULL,
    )
    exporter = Exporter("node_exporter (netdev+diskstats)", process,
                        f"http://127.0.0.1:{port}/metrics")
    benchlib.wait_ready(exporter.url, process)
    return exporter


def measure_scrapes(exporters: list[Exporter], scrapes: int) -> dict[str, dict[str, float]]:
    sessions = {e.name: requests.Session() for e in exporters}
    latencies: dict[str, list[float]] = {e.name: [] for e in exporters}
    sizes: dict[str, int] = {}
    cpu_before = {e.name: benchlib.cpu_seconds(e.process.pid) for e in exporters}
    for _ in range(scrapes):
        for exporter in exporters:  # alternate: both see the same machine load
            started = time.perf_counter()
            response = sessions[exporter.name].get(exporter.url, timeout=10)
            latencies[exporter.name].append(time.perf_counter() - started)
            response.raise_for_status()
            sizes[exporter.name] = len(response.content)
    results = {}
    for exporter in exporters:
        values = latencies[exporter.name]
        cpu_seconds = benchlib.cpu_seconds(exporter.process.pid) - cpu_before[exporter.name]
        results[exporter.name] = {
            "p50_ms": benchlib.percentile(values, 0.5) * 1000,
            "p99_ms": benchlib.percentile(values, 0.99) * 1000,
            "mean_ms": statistics.fmean(values) * 1000,
            "cpu_ms_per_scrape": cpu_seconds / scrapes * 1000,
            "body_bytes": sizes[exporter.name],
        }
    return results


def soak(exporters: list[Exporter], seconds: float) -> dict[str, int]:
    """Scrape each exporter once a second for ``seconds``; then read resident memory."""
    deadline = time.monotonic() + seconds
    sessions = {e.name: requests.Session() for e in exporters}
    while time.monotonic() < deadline:
        tick = time.monotonic()
        for exporter in exporters:
            sessions[exporter.name].get(exporter.url, timeout=10).raise_for_status()
        time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    return {e.name: benchlib.memory_kib(e.process.pid, "VmRSS") * 1024 for e in exporters}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=2000)
    parser.add_argument("--soak-seconds", type=float, default=300.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        exporters = [start_trainmon(Path(folder)), start_node_exporter()]
        try:
            for exporter in exporters:  # warm-up
                for _ in range(20):
                    requests.get(exporter.url, timeout=10).raise_for_status()
            results = measure_scrapes(exporters, args.scrapes)
            rss = soak(exporters, args.soak_seconds)
        finally:
            for exporter in exporters:
                benchlib.stop(exporter.process)
    trainmon, node = (results[e.name] for e in exporters)
    print(f"{args.scrapes} alternating scrapes each, then {args.soak_seconds:.0f} s at 1 scrape/s; "
          f"{os.cpu_count()} CPUs\n")
    print("| exporter | p50 ms | p99 ms | CPU ms/scrape | body bytes | RSS after soak MiB |")
    print("| --- | --- | --- | --- | --- | --- |")
    for exporter in exporters:
        row = results[exporter.name]
        print(f"| {exporter.name} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} | "
              f"{row['cpu_ms_per_scrape']:.2f} | {row['body_bytes']} | "
              f"{rss[exporter.name] / 2**20:.1f} |")
    names = [e.name for e in exporters]
    print(f"\nratios trainmon/node_exporter: p50 {trainmon['p50_ms'] / node['p50_ms']:.2f}, "
          f"p99 {trainmon['p99_ms'] / node['p99_ms']:.2f}, "
          f"CPU/scrape {trainmon['cpu_ms_per_scrape'] / max(node['cpu_ms_per_scrape'], 1e-9):.2f}, "
          f"RSS {rss[names[0]] / rss[names[1]]:.2f}")


if __name__ == "__main__":
    main()

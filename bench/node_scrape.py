"""Scrape latency, CPU per scrape and resident memory: trainmon vs node_exporter.

Both exporters run on this machine, on loopback: Debian's
``prometheus-node-exporter`` with only ``netdev`` and ``diskstats``, trainmon
with only its network and disk collectors (``--collectors network+disk``, the
same data) or as a node runs it, without a configuration file
(``--collectors default``: every default collector, its ledger and socket in a
temporary ``$STATE_DIRECTORY``). Scrapes alternate between the exporters so
that all see the same machine load, each over its own kept-alive connection
(``--no-keep-alive``: a new connection per scrape). ``--compare DIR`` (a
source folder of another version, e.g. ``git archive HEAD exporter | tar -x -C
/tmp/before``, then ``/tmp/before/exporter``) adds that version's trainmon to
the alternation, for before/after figures under the same load.
``--soak-seconds 0`` skips the soak (RSS is then read after the scrapes).

    .venv/bin/python -m bench.node_scrape                 # 2000 scrapes each, 300 s soak
    .venv/bin/python -m bench.node_scrape --scrapes 500 --soak-seconds 60
    .venv/bin/python -m bench.node_scrape --collectors default --scrapes 1200 --soak-seconds 0

Prints a markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from bench import benchlib, headline


@dataclass
class Exporter:
    name: str
    process: subprocess.Popen[bytes]
    url: str


#: What ``--collectors`` chooses: the trainmon daemon's configuration (None: no file).
COLLECTOR_SETS: dict[str, str | None] = {
    "network+disk": (
        "collectors:\n"
        "  gpu: {enabled: false}\n"
        "  infiniband: {enabled: false}\n"
        "  training: {enabled: false}\n"
    ),
    "default": None,
}


def start_trainmon(folder: Path, collectors: str, source: str | None = None) -> Exporter:
    """``trainmon serve`` with the ``COLLECTOR_SETS`` entry ``collectors``, its state in
    ``folder``; ``source``: the folder holding another version's ``trainmon/``."""
    folder.mkdir(parents=True, exist_ok=True)
    label = f"trainmon ({collectors})" + (f" {source}" if source else "")
    env = {**os.environ, "STATE_DIRECTORY": str(folder), "RUNTIME_DIRECTORY": str(folder)}
    if source is not None:
        env["PYTHONPATH"] = source
    text = COLLECTOR_SETS[collectors]
    if text is not None:
        config = folder / "trainmon.yml"
        config.write_text(text)
        daemon = benchlib.start_trainmon(config, env=env)
        return Exporter(label, daemon.process, f"{daemon.url}/metrics")
    port = benchlib.free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "trainmon", "serve", "--listen", f"127.0.0.1:{port}",
         "--log-level", "error"],
        env=env, cwd=benchlib.ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    exporter = Exporter(label, process, f"http://127.0.0.1:{port}/metrics")
    try:
        benchlib.wait_ready(f"http://127.0.0.1:{port}/healthz", process)
    except RuntimeError:
        benchlib.stop(process)
        raise
    return exporter


def start_node_exporter() -> Exporter:
    started = benchlib.start_node_exporter()
    if started is None:
        raise SystemExit("prometheus-node-exporter is not installed (apt-get install it)")
    process, port = started
    return Exporter("node_exporter (netdev+diskstats)", process,
                    f"http://127.0.0.1:{port}/metrics")


def measure_scrapes(
    exporters: list[Exporter], scrapes: int, keep_alive: bool = True
) -> dict[str, dict[str, float]]:
    """Scrape each exporter ``scrapes`` times, alternating; latency, CPU and body size.

    ``keep_alive``: one connection per exporter throughout, else a new one per scrape."""
    sessions = {e.name: requests.Session() for e in exporters}
    if not keep_alive:
        for session in sessions.values():
            session.headers["Connection"] = "close"
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
    parser.add_argument("--collectors", choices=sorted(COLLECTOR_SETS), default="network+disk",
                        help="trainmon's collectors: network and disk only, or the defaults")
    parser.add_argument("--keep-alive", action=argparse.BooleanOptionalAction, default=True,
                        help="one kept-alive connection per exporter (default), or one per scrape")
    parser.add_argument("--compare", metavar="DIR",
                        help="source folder (holding trainmon/) of a version to add to the "
                             "alternation")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        exporters: list[Exporter] = []
        try:
            if args.compare:
                exporters.append(start_trainmon(Path(folder) / "compared", args.collectors,
                                                args.compare))
            exporters.append(start_trainmon(Path(folder) / "this", args.collectors))
            exporters.append(start_node_exporter())
            for exporter in exporters:  # warm-up
                for _ in range(20):
                    requests.get(exporter.url, timeout=10).raise_for_status()
            results = measure_scrapes(exporters, args.scrapes, args.keep_alive)
            rss = soak(exporters, args.soak_seconds)
        finally:
            for exporter in exporters:
                benchlib.stop(exporter.process)
    node = results[exporters[-1].name]
    connections = "kept-alive connections" if args.keep_alive else "a connection per scrape"
    print(f"{args.scrapes} alternating scrapes each ({connections}), then "
          f"{args.soak_seconds:.0f} s at 1 scrape/s; {os.cpu_count()} CPUs\n")
    print("| exporter | p50 ms | p99 ms | CPU ms/scrape | body bytes | RSS after soak MiB |")
    print("| --- | --- | --- | --- | --- | --- |")
    for exporter in exporters:
        row = results[exporter.name]
        print(f"| {exporter.name} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} | "
              f"{row['cpu_ms_per_scrape']:.2f} | {row['body_bytes']} | "
              f"{rss[exporter.name] / 2**20:.1f} |")
    print()
    this = results[exporters[-2].name]
    source = f"bench.node_scrape --collectors {args.collectors}"
    for figure, key, goal in (("scrape p99", "p99_ms", 1.0), ("scrape p50", "p50_ms", None),
                              ("CPU per scrape", "cpu_ms_per_scrape", 1.0)):
        headline.record(headline.Figure(
            f"{figure} / node_exporter's ({args.collectors} collectors)",
            this[key] / max(node[key], 1e-9), anchor=f"node_exporter {node[key]:.2f} ms",
            at_most=goal, source=source))
    for exporter in exporters[:-1]:
        row = results[exporter.name]
        print(f"ratios {exporter.name} / node_exporter: "
              f"p50 {row['p50_ms'] / node['p50_ms']:.2f}, "
              f"p99 {row['p99_ms'] / node['p99_ms']:.2f}, "
              f"CPU/scrape {row['cpu_ms_per_scrape'] / max(node['cpu_ms_per_scrape'], 1e-9):.2f}, "
              f"RSS {rss[exporter.name] / rss[exporters[-1].name]:.2f}")


if __name__ == "__main__":
    main()

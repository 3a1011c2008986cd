"""The scrape cost of the daemon's own ``process_*`` metrics (``OwnProcessCollector``).

In process, without HTTP: the exposition of a registry holding the network and
disk collectors of this machine (the set ``bench.node_scrape`` runs), built
with and without the process collector, alternately so that both see the
same machine load; and the process collector's ``collect()`` alone.

    .venv/bin/python -m bench.self_metrics                 # 3000 expositions each
    .venv/bin/python -m bench.self_metrics --rounds 500

Prints a markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os

from prometheus_client.exposition import generate_latest

from bench import benchlib
from trainmon.cli import collectors_for
from trainmon.core.collector import Collector
from trainmon.core.ownprocess import OwnProcessCollector
from trainmon.core.registry import CollectorRegistry

NODE_ONLY = {
    "collectors": {
        name: {"enabled": False}
        for name in ("gpu", "infiniband", "training", "attribution", "diagnosis")
    }
}


def registry(extra: list[Collector]) -> CollectorRegistry:
    collectors = collectors_for(NODE_ONLY)
    built = CollectorRegistry([*collectors, *extra])
    built.start()
    return built



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3000)
    args = parser.parse_args()
    without = registry([])
    with_process = registry([OwnProcessCollector()])
    process = OwnProcessCollector()
    times: dict[str, list[float]] = {"without": [], "with": [], "alone": []}
    sizes = {"without": len(generate_latest(without)), "with": len(generate_latest(with_process))}
    for _ in range(args.rounds):
        times["without"].append(benchlib.timed(lambda: generate_latest(without)))
        times["with"].append(benchlib.timed(lambda: generate_latest(with_process)))
        times["alone"].append(benchlib.timed(lambda: list(process.collect())))
    print(f"{args.rounds} alternating expositions each; {os.cpu_count()} CPUs\n")
    print("| exposition | p50 µs | p99 µs | body bytes |")
    print("| --- | --- | --- | --- |")
    rows = (("network+disk", "without"), ("network+disk+process", "with"))
    for label, key in rows:
        print(f"| {label} | {benchlib.percentile(times[key], 0.5) * 1e6:.0f} | "
              f"{benchlib.percentile(times[key], 0.99) * 1e6:.0f} | {sizes[key]} |")
    alone = benchlib.percentile(times["alone"], 0.5) * 1e6
    base = benchlib.percentile(times["without"], 0.5) * 1e6
    added = benchlib.percentile(times["with"], 0.5) * 1e6 - base
    print(f"\nprocess collector alone: p50 {alone:.0f} µs; added to the exposition: "
          f"p50 {added:+.0f} µs ({added / base:+.0%})")


if __name__ == "__main__":
    main()

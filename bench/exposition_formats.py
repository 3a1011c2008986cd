"""The cost of writing ``/metrics`` in each format: trainmon's encoders against prometheus_client's.

In process, without HTTP: the families of a ``trainmon serve --demo`` node (8
simulated GPUs, two training jobs, every default collector), read once from a
running demo daemon and parsed, are encoded alternately by
``trainmon.core.exposition`` (``TextEncoder``, which remembers what repeats
from one scrape to the next, and ``encode_openmetrics``) and by the library's
``generate_latest`` of each format, which the daemon used before it stopped
importing prometheus_client. OpenMetrics is what Prometheus asks for first.

    .venv/bin/python -m bench.exposition_formats               # 300 rounds
    .venv/bin/python -m bench.exposition_formats --rounds 100

Prints a markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.parser import text_string_to_metric_families

from bench import benchlib
from testkit.daemon import READY_TIMEOUT_SECONDS, free_port, trainmon_command
from trainmon.core.exposition import TextEncoder, encode_openmetrics


class _Families:
    """What the library's encoders take: something with ``collect()``."""

    def __init__(self, families: Iterable[Any]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Any]:
        return iter(self._families)


def demo_families() -> list[Any]:
    """The families a demo daemon exports, parsed from one scrape."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="trainmon-bench-") as state:  # its own ledger
        process = subprocess.Popen(
            [*trainmon_command(), "serve", "--demo", "--listen", f"127.0.0.1:{port}",
             "--log-level", "error"],
            env={**os.environ, "STATE_DIRECTORY": state, "RUNTIME_DIRECTORY": state})
        try:
            return _first_verdicts(f"http://127.0.0.1:{port}/metrics")
        finally:
            process.terminate()
            process.wait(15)


def _first_verdicts(url: str) -> list[Any]:
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                text = answer.read().decode()
            if "trainmon_bottleneck" in text:
                return list(text_string_to_metric_families(text))
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("the demo daemon exported no verdict in time")
        time.sleep(0.5)



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    families = demo_families()
    library = _Families(families)
    encoder = TextEncoder()
    encoders: dict[str, Callable[[], bytes]] = {
        "text 0.0.4, prometheus_client": lambda: generate_latest(library),  # type: ignore[arg-type]
        "text 0.0.4, trainmon": lambda: encoder.encode(families),
        "OpenMetrics 1.0.0, prometheus_client": lambda: openmetrics_latest(library),
        "OpenMetrics 1.0.0, trainmon": lambda: encode_openmetrics(families),
    }
    sizes = {name: len(encode()) for name, encode in encoders.items()}
    times: dict[str, list[float]] = {name: [] for name in encoders}
    for _ in range(args.rounds):
        for name, encode in encoders.items():
            times[name].append(benchlib.timed(encode))
    samples = sum(len(family.samples) for family in families)
    print(f"{len(families)} families, {samples} samples (trainmon serve --demo); "
          f"{args.rounds} alternating rounds; {os.cpu_count()} CPUs\n")
    print("| format, encoder | p50 µs | p99 µs | body bytes |")
    print("| --- | ---: | ---: | ---: |")
    for name in encoders:
        print(f"| {name} | {benchlib.percentile(times[name], 0.5) * 1e6:.0f} | "
              f"{benchlib.percentile(times[name], 0.99) * 1e6:.0f} | {sizes[name]} |")
    for label in ("text 0.0.4", "OpenMetrics 1.0.0"):
        ours = benchlib.percentile(times[f"{label}, trainmon"], 0.5)
        theirs = benchlib.percentile(times[f"{label}, prometheus_client"], 0.5)
        print(f"\n{label}: trainmon/prometheus_client {ours / theirs:.2f}×", end="")
    print()


if __name__ == "__main__":
    main()

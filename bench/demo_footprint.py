"""Footprint of ``trainmon serve --demo``: CPU share and resident memory while scraped.

The demo daemon simulates a whole node in its own process: 8 GPUs (the
simulated NVML), the ``/proc``/``/sys`` files of the node collectors, and two
4-rank training jobs whose ``Reporter`` threads push steps over HTTP. It is
scraped every ``--interval`` seconds (5 s, a short Prometheus interval) for
``--seconds`` (60 s); CPU comes from ``/proc/<pid>/stat`` (user + system,
millicores = CPU seconds per second × 1000), memory from ``/proc/<pid>/status``
(``VmRSS`` at the end, ``VmHWM`` the peak). These are the numbers the
Kubernetes requests in docs/deploy.md are sized from.

    .venv/bin/python -m bench.demo_footprint               # ~70 s
    .venv/bin/python -m bench.demo_footprint --seconds 20

Prints a markdown table for docs/deploy.md.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import urllib.request
from pathlib import Path

from bench import benchlib

#: Seconds after start-up before the measurement begins (imports, first jobs' steps).
SETTLE_SECONDS = 5.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=5.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trainmon-demo-bench-") as tmp:
        config = Path(tmp) / "trainmon.yml"
        config.write_text("collectors: {}\n")
        daemon = benchlib.start_trainmon(config, quiet=True, args=["--demo"])
        pid = daemon.process.pid
        try:
            time.sleep(SETTLE_SECONDS)
            scrapes = 0
            sizes: list[int] = []
            cpu_start = benchlib.cpu_seconds(pid)
            started = time.monotonic()
            while time.monotonic() - started < args.seconds:
                due = started + scrapes * args.interval
                time.sleep(max(0.0, due - time.monotonic()))
                with urllib.request.urlopen(f"{daemon.url}/metrics", timeout=10) as answer:
                    sizes.append(len(answer.read()))
                scrapes += 1
            elapsed = time.monotonic() - started
            cpu = benchlib.cpu_seconds(pid) - cpu_start
            rss = benchlib.memory_kib(pid, "VmRSS")
            peak = benchlib.memory_kib(pid, "VmHWM")
        finally:
            daemon.stop()
    print(f"`trainmon serve --demo`, scraped every {args.interval:g} s for {elapsed:.0f} s "
          f"({scrapes} scrapes, exposition {max(sizes) / 1024:.0f} KiB)\n")
    print("| CPU (user + system) | resident (VmRSS) at the end | peak resident (VmHWM) |")
    print("| ---: | ---: | ---: |")
    print(f"| {cpu / elapsed * 1000:.0f} millicores | {rss / 1024:.0f} MiB | "
          f"{peak / 1024:.0f} MiB |")


if __name__ == "__main__":
    main()

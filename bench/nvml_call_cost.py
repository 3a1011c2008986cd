"""The cost of every NVML call the daemon makes, one function at a time.

The real facade, sampler, XID listener and GPU collector run against a timing
proxy of ``pynvml`` (the facade takes any object with pynvml's names, see
``trainmon.gpu.types.NVMLLibrary``), for ``--seconds`` with a collection every
``--interval`` seconds. Every ``nvml*`` call is timed where it is made, on
whichever thread makes it; the table gives, per function, how often the
daemon called it, its median and p99 cost and its share of all NVML time.

On a GPU host this measures the real driver (``bench/gpu_check.sh`` runs it).
Elsewhere ``--fake`` runs it on the fake ``libnvidia-ml.so.1`` of
``testkit/fakenvml`` (8 GPUs), which checks the tool, not the driver.

Run from the repository root::

    .venv/bin/python -m bench.nvml_call_cost                 # this host's NVML
    .venv/bin/python -m bench.nvml_call_cost --fake --seconds 5
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import benchlib

FAKE_SCENARIO = "gpus 8\nsteady * 90 5\n"
#: Calls that block until an event or their timeout: waiting, not cost; listed apart.
BLOCKING_WAITS = frozenset({"nvmlEventSetWait", "nvmlEventSetWait_v2"})


class TimingLibrary:
    """``pynvml`` with every ``nvml*`` function timed (seconds per call, by name)."""

    def __init__(self, library: Any) -> None:
        self._library = library
        self._lock = threading.Lock()
        self.calls: dict[str, list[float]] = defaultdict(list)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._library, name)
        if not (name.startswith("nvml") and callable(value)):
            return value
        return self._timed(name, value)

    def _timed(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - started
                with self._lock:
                    self.calls[name].append(elapsed)

        return timed


def measure(seconds: float, interval: float) -> tuple[TimingLibrary, int]:
    """Run the GPU collector on the timing proxy; the proxy and the collections made."""
    import pynvml

    from trainmon.collectors.gpu import GPUCollector, GPUConfig
    from trainmon.gpu.nvml import NVML

    library = TimingLibrary(pynvml)
    collector = GPUCollector(NVML(library), GPUConfig())
    collector.start()
    collections = 0
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            list(collector.collect())
            collections += 1
            time.sleep(interval)
    finally:
        collector.stop()
    return library, collections


def report(library: TimingLibrary, collections: int, seconds: float) -> str:
    costs = {name: times for name, times in library.calls.items() if name not in BLOCKING_WAITS}
    total = sum(sum(times) for times in costs.values()) or 1.0
    lines = [
        f"### NVML calls of the daemon over {seconds:.0f} s ({collections} collections)\n",
        "| function | calls | calls/s | median µs | p99 µs | share of NVML time |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    rows = sorted(costs.items(), key=lambda item: -sum(item[1]))
    for name, times in rows:
        lines.append(
            f"| `{name}` | {len(times)} | {len(times) / seconds:.1f} | "
            f"{benchlib.percentile(times, 0.5) * 1e6:.1f} | "
            f"{benchlib.percentile(times, 0.99) * 1e6:.1f} | {sum(times) / total:.1%} |"
        )
    lines.append(f"\nNVML time in all: {total / seconds * 1e3:.2f} ms per second of daemon time.")
    for name in sorted(BLOCKING_WAITS & library.calls.keys()):
        waits = library.calls[name]
        lines.append(f"`{name}` (XID listener, blocks until an event or its timeout): "
                     f"{len(waits)} waits, median {benchlib.percentile(waits, 0.5) * 1e3:.0f} ms.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between collections")
    parser.add_argument("--fake", action="store_true", help="use the fake libnvidia-ml.so.1")
    args = parser.parse_args()
    if args.fake and "FAKENVML_SCENARIO" not in os.environ:
        with tempfile.TemporaryDirectory(prefix="trainmon-nvml-cost-") as name:
            env = benchlib.fake_nvml_env(Path(name), FAKE_SCENARIO)
            command = [sys.executable, "-m", "bench.nvml_call_cost", *sys.argv[1:]]
            sys.exit(subprocess.run(command, env=env, check=False).returncode)
    library, collections = measure(args.seconds, args.interval)
    if not library.calls:
        sys.exit("nvml_call_cost: no NVML call was made (no NVML on this host?)")
    print(report(library, collections, args.seconds))


if __name__ == "__main__":
    main()

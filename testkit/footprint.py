"""The resident memory of ``trainmon serve`` with its built-in defaults, no GPU.

One measurement, shared by ``tests/test_footprint.py`` (which holds the daemon
to ``SERVE_RSS_CEILING_MIB``) and ``bench/daemon_rss.py`` (the figures of
docs/benchmarks.md, "Resident memory of the node daemon"): a daemon started
without ``--config`` (every default collector; the GPU collector finds no NVML
on a node without a driver) on a free loopback port, its ledger and socket in
a temporary ``$STATE_DIRECTORY``/``$RUNTIME_DIRECTORY``; scraped
``SCRAPES`` times, then ``VmRSS`` and ``VmHWM`` from ``/proc/<pid>/status``.
The daemon runs as deployed: the ``trainmon`` console script that ``make run``,
the systemd units and the container start, not ``python -m trainmon`` (whose
``runpy`` start-up the deployed daemon does not carry), with the environment
the systemd unit sets (``Environment=`` of deploy/systemd/trainmon.service:
``PYTHONOPTIMIZE=2``) and that optimization's bytecode already compiled, as the
install leaves it (``python -m trainmon.bytecode``). Here that bytecode goes to a
``PYTHONPYCACHEPREFIX`` of its own, written by one unmeasured start, so the
measurement compiles nothing and leaves this checkout's ``__pycache__`` alone.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from testkit.daemon import READY_TIMEOUT_SECONDS, free_port, trainmon_command

#: The unit whose ``Environment=`` the measured daemon runs with.
SYSTEMD_UNIT = Path(__file__).resolve().parents[1] / "deploy" / "systemd" / "trainmon.service"

#: The most resident memory ``trainmon serve`` with default collectors may hold after
#: ``SCRAPES`` scrapes, MiB. Measured 30.5–30.7 MiB on 2026-12-02 as deployed (the
#: console script; ``python -m trainmon`` adds ``runpy``'s 1.4 MiB: 31.3–32.0 in earlier
#: runs), so 1.3 MiB of headroom for other Python builds and kernels, less than any one
#: module of the kind the lazy imports left out (tests/test_footprint.py names those).
#: Issue 25's goal is 30 MiB; lower this constant as the daemon gets there.
#: 2026-12-03: this VM measured the landed head (629e98b) at 33.1 MiB and this tree at
#: 32.9 (RssAnon 21.4 → 20.8 MiB: ``bench.daemon_rss --compare``, the same run), 1.7 MiB
#: above 2026-12-02's figures for the same code; the ceiling takes that spread (34.0)
#: until the cause of the machine's drift is known. Later that day (issue 36) the same
#: VM measured that code (b145e6e) at 33.8 MiB and the tree with the step sketch, the
#: ledger's writer lock (fcntl) and its exact boundaries at 34.4-34.6 (difflib, for
#: "did you mean", imported only for a broken file): 35.0.
#: 2026-12-04: that "drift" was this measurement's: under ``PYTHONDONTWRITEBYTECODE`` the
#: daemon compiled every module whose cached bytecode was missing or stale (all of them
#: in CI's fresh clone: 35.4 there) and kept the compiler's leftovers. Measured as
#: deployed (the unit's environment, the bytecode compiled), the same VM reads 29.7 MiB
#: for 2026-12-02's tree (30.7 without -OO, its figure then) and 31.4 for this one
#: (``bench.daemon_rss --plain --compare``). 33.5 leaves CI's machine 2 MiB. Later that
#: day the daemon stopped importing prometheus_client, ``http.server`` and, by default,
#: ``ssl``, ``hashlib`` and ``http.client`` (libssl and libcrypto): 24.3 MiB, with the
#: reload thread; 27.0 leaves CI's machine 2.7 MiB, under issue 25's 30.
SERVE_RSS_CEILING_MIB = 27.0
#: Scrapes of /metrics before the reading: every scrape-time allocation has been made.
SCRAPES = 20
#: Seconds between the last scrape and the reading (the last response written out).
SETTLE_SECONDS = 1.0


@dataclass(frozen=True)
class Footprint:
    """One daemon's memory after the scrapes, MiB, and its thread count."""

    rss_mib: float
    peak_rss_mib: float
    threads: int


def _status(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "Threads"):
            fields[key] = int(value.split()[0])
    return fields


def unit_environment(unit: Path = SYSTEMD_UNIT) -> dict[str, str]:
    """The variables a systemd unit's ``Environment=`` lines set (``KEY=value`` words,
    double quotes allowed)."""
    environment: dict[str, str] = {}
    for line in unit.read_text().splitlines():
        if line.startswith("Environment="):
            for word in re.findall(r'"[^"]*"|\S+', line.removeprefix("Environment=")):
                key, _, value = word.strip('"').partition("=")
                environment[key] = value
    return environment


def deployed_command() -> list[str]:
    """The ``trainmon`` console script beside this interpreter (what the deployment
    runs), else ``python -m trainmon``."""
    script = Path(sys.executable).with_name("trainmon")
    return [str(script)] if os.access(script, os.X_OK) else trainmon_command()


def _get(url: str) -> None:
    with urllib.request.urlopen(url, timeout=10) as answer:
        answer.read()


def measure_serve(
    scrapes: int = SCRAPES, env: Mapping[str, str] | None = None
) -> Footprint:
    """Start ``trainmon serve`` with built-in defaults as the systemd unit runs it, scrape
    it, read its memory, stop it.

    ``env`` is added to this process's environment (``PYTHONPATH`` of another tree, to
    compare two versions). RuntimeError if it exits or does not answer in time."""
    with tempfile.TemporaryDirectory(prefix="trainmon-footprint-") as folder:
        environment = {**os.environ, **unit_environment(), **(env or {}),
                       "STATE_DIRECTORY": folder, "RUNTIME_DIRECTORY": folder,
                       "PYTHONPYCACHEPREFIX": str(Path(folder) / "bytecode")}
        environment.pop("PYTHONDONTWRITEBYTECODE", None)
        _serve_and_read(environment, scrapes=1)  # writes the bytecode the next start reads
        environment["PYTHONDONTWRITEBYTECODE"] = "1"
        return _serve_and_read(environment, scrapes)


def _serve_and_read(environment: Mapping[str, str], scrapes: int) -> Footprint:
    """One daemon in ``environment``: started, scraped ``scrapes`` times, read, stopped."""
    port = free_port()
    process = subprocess.Popen(
        [*deployed_command(), "serve", "--listen", f"127.0.0.1:{port}",
         "--log-level", "error"],
        env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"trainmon serve exited with {process.returncode}")
            try:
                _get(f"{url}/healthz")
                break
            except OSError:  # refused while starting
                if time.monotonic() > deadline:
                    raise RuntimeError("trainmon serve did not answer /healthz") from None
                time.sleep(0.1)
        for _ in range(scrapes):
            _get(f"{url}/metrics")
        time.sleep(SETTLE_SECONDS)
        status = _status(process.pid)
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return Footprint(status["VmRSS"] / 1024, status["VmHWM"] / 1024, status["Threads"])

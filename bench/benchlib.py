"""What the benchmark scripts share: daemons on loopback, process readings, statistics.

``bench`` and ``tests`` are packages: run a benchmark from the repository root as
``.venv/bin/python -m bench.<name>``; it reuses the fakes of ``testkit``
(the fake NVML library, the Tencent Cloud API). Process readings come
from ``/proc/<pid>/stat`` and ``/proc/<pid>/status`` (Linux only).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from testkit.daemon import free_port

#: The repository root (bench/..).
ROOT = Path(__file__).resolve().parent.parent

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
#: How long a daemon may take to answer its readiness URL, seconds.
READY_TIMEOUT_SECONDS = 30.0
#: ``collectors:`` section of a daemon that runs only the training collector.
TRAINING_ONLY = (
    "  network: {enabled: false}\n  disk: {enabled: false}\n"
    "  infiniband: {enabled: false}\n  gpu: {enabled: false}\n"
    "  nfs: {enabled: false}\n  platform: {enabled: false}\n"
)


def wait_ready(
    url: str,
    process: subprocess.Popen[bytes] | None = None,
    timeout: float = READY_TIMEOUT_SECONDS,
) -> None:
    """Poll ``url`` until it answers 2xx; RuntimeError after ``timeout`` s or if
    ``process`` exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:  # refused while starting, or an HTTP error status
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer in {timeout:.0f} s")


@dataclass
class Daemon:
    """A ``trainmon serve`` subprocess on ``127.0.0.1:port``."""

    process: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        stop(self.process)


def start_trainmon(
    config: Path,
    *,
    env: Mapping[str, str] | None = None,
    quiet: bool = False,
    wait: bool = True,
    args: Sequence[str] = (),
    log_path: Path | None = None,
) -> Daemon:
    """``trainmon serve --config config [args]`` on a free loopback port, at log level warning.

    ``quiet`` discards its output, ``log_path`` writes it to that file; with
    ``wait`` it returns once ``/healthz`` answers. A ledger the config does not
    place goes beside the config (``$STATE_DIRECTORY``), never into the machine's
    /var/lib/trainmon.
    """
    port = free_port()
    command = [sys.executable, "-m", "trainmon", "serve", "--config", str(config),
               "--listen", f"127.0.0.1:{port}", "--log-level", "warning", *args]
    environment = dict(os.environ if env is None else env)
    environment.setdefault("STATE_DIRECTORY", str(config.parent))
    if log_path is not None:
        with log_path.open("wb") as log_file:  # the child keeps its own descriptor
            process = subprocess.Popen(command, env=environment, cwd=ROOT, stdout=log_file,
                                       stderr=subprocess.STDOUT)
    else:
        output = subprocess.DEVNULL if quiet else None
        process = subprocess.Popen(command, env=environment, cwd=ROOT, stdout=output,
                                   stderr=output)
    daemon = Daemon(process, port)
    if wait:
        try:
            wait_ready(f"{daemon.url}/healthz", process)
        except RuntimeError:
            daemon.stop()
            raise
    return daemon


def training_only_config(folder: Path) -> tuple[Path, Path]:
    """A config for a daemon with only the training collector: (config, its socket)."""
    sock = folder / "steps.sock"
    config = folder / "trainmon.yml"
    config.write_text(f"collectors:\n{TRAINING_ONLY}  training: {{socket: '{sock}'}}\n")
    return config, sock


def stop(process: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """Terminate ``process`` and wait for it (killed after ``timeout`` s)."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` so far, seconds (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


def memory_kib(pid: int, key: str = "VmRSS") -> int:
    """A ``/proc/<pid>/status`` memory line in KiB: ``VmRSS`` (resident), ``VmHWM`` (peak)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {key} in /proc/{pid}/status")


def timed(action: Callable[[], object]) -> float:
    """Seconds ``action()`` took (``perf_counter``)."""
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank ``fraction`` quantile (0.5: median, 0.99: p99) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def build_fake_nvml(folder: Path) -> Path:
    """Compile ``testkit/fakenvml`` into ``folder``; the folder for ``LD_LIBRARY_PATH``."""
    from testkit.fakenvml import build as fake_nvml_build

    return Path(fake_nvml_build.build(folder)).parent


def fake_nvml_env(folder: Path, scenario: str) -> dict[str, str]:
    """This environment plus what loads the fake NVML (built into ``folder/lib``) with
    ``scenario`` (its text format: testkit/fakenvml/README.md) in a child process."""
    scenario_path = folder / "scenario.txt"
    scenario_path.write_text(scenario)
    return {
        **os.environ,
        "LD_LIBRARY_PATH": str(build_fake_nvml(folder / "lib")),
        "FAKENVML_SCENARIO": str(scenario_path),
        "PYTHONPATH": str(ROOT),
    }


def start_node_exporter() -> tuple[subprocess.Popen[bytes], int] | None:
    """``prometheus-node-exporter`` with the collectors trainmon's node collectors match
    (netdev, diskstats) on a free loopback port, once it answers: (process, port); None
    where it is not installed (``apt-get install prometheus-node-exporter``)."""
    binary = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if binary is None:
        return None
    port = free_port()
    process = subprocess.Popen(
        [binary, "--collector.disable-defaults", "--collector.netdev", "--collector.diskstats",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_ready(f"http://127.0.0.1:{port}/metrics", process)
    return process, port

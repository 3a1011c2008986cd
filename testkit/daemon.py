"""Running a real ``trainmon serve`` subprocess on loopback."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

READY_TIMEOUT_SECONDS = 30.0
#: Longest wait for a run to show in a daemon's ledger (it writes every flush).
RUN_VISIBLE_TIMEOUT_SECONDS = 30.0


#: Where the ports ``free_port`` hands out start: far below any kernel's ephemeral range.
LOWEST_PORT = 10_000
#: The most parallel test processes (pytest-xdist workers ``gw0``...) with their own ports.
MAX_WORKERS = 16
_next_port: list[int] = []


def _ephemeral_start(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> int:
    """The first port of the kernel's ephemeral range (32768 where it cannot be read)."""
    try:
        return min(int(path.read_text().split()[0]), 32_768)
    except (OSError, ValueError, IndexError):
        return 32_768


def _worker_ports() -> range:
    """This test process's own ports: its slice of ``LOWEST_PORT`` up to the ephemeral
    range, by its xdist worker number (all of it outside xdist)."""
    ports = range(LOWEST_PORT, _ephemeral_start())
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or not worker[2:].isdigit():
        return ports
    size = len(ports) // MAX_WORKERS
    start = LOWEST_PORT + (int(worker[2:]) % MAX_WORKERS) * size
    return range(start, start + size)


def free_port() -> int:
    """A loopback TCP port that is free now and stays free until its user binds it.

    Not ``bind(0)``: that picks from the kernel's ephemeral range, where every outbound
    connection of every process also takes its local port, so under parallel test workers
    a port handed out could be taken before the daemon, engine or ``TCPStore`` it was for
    binds it (EADDRINUSE). These ports lie below that range, each xdist worker has its
    own slice, and a worker hands its ports out in turn, skipping any that is in use."""
    ports = _worker_ports()
    if not _next_port:
        _next_port.append(ports.start + os.getpid() % len(ports))
    for _ in range(len(ports)):
        port = _next_port[0]
        _next_port[0] = port + 1 if port + 1 < ports.stop else ports.start
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free loopback port in {ports}")


@dataclass
class Daemon:
    """A ``trainmon serve`` subprocess listening on loopback."""

    process: subprocess.Popen[str]
    port: int
    log_path: Path
    config_path: Path | None = None
    _stopped: bool = field(default=False, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str, headers: Mapping[str, str] | None = None) -> tuple[int, str]:
        request = urllib.request.Request(self.url + path, headers=dict(headers or {}))
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def metrics(self) -> str:
        status, body = self.get("/metrics")
        assert status == 200, body
        return body

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._stopped = True
        return int(self.process.returncode)


def trainmon_command() -> list[str]:
    return [sys.executable, "-m", "trainmon"]


def wait_ready(daemon: Daemon, timeout: float = READY_TIMEOUT_SECONDS,
               headers: Mapping[str, str] | None = None) -> None:
    """Until ``/healthz`` answers 200 (with ``headers``: basic-auth credentials)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if daemon.process.poll() is not None:
            raise AssertionError(
                f"trainmon exited with {daemon.process.returncode}:\n{daemon.log()}"
            )
        try:
            status, _ = daemon.get("/healthz", headers)
            if status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"trainmon did not become ready in {timeout}s:\n{daemon.log()}")


def serve(config_path: Path, log_path: Path, *, state_directory: Path | None = None,
          cwd: Path | None = None, host: str = "127.0.0.1",
          headers: Mapping[str, str] | None = None, args: Sequence[str] = ()) -> Daemon:
    """``trainmon serve --config config_path`` on a free loopback port, its output in
    ``log_path``, its ledger in ``state_directory`` (never the machine's own), once it
    answers ``/healthz`` (asked with ``headers``). ``host`` "0.0.0.0": that port on every
    address of the machine too (a peer that is not loopback); ``args``: more options
    (``--demo``)."""
    port = free_port()
    env = dict(os.environ)
    if state_directory is not None:
        env["STATE_DIRECTORY"] = str(state_directory)
    with log_path.open("w") as log_file:  # the child keeps its own descriptor
        process = subprocess.Popen(
            [*trainmon_command(), "serve", "--config", str(config_path),
             "--listen", f"{host}:{port}", *args],
            stdout=log_file, stderr=subprocess.STDOUT, text=True, cwd=cwd, env=env)
    return ready(Daemon(process, port, log_path, config_path), headers)


def ready(daemon: Daemon, headers: Mapping[str, str] | None = None) -> Daemon:
    """``daemon`` once it answers ``/healthz``; stopped if it never does."""
    try:
        wait_ready(daemon, headers=headers)
    except AssertionError:
        daemon.stop()
        raise
    return daemon


def wait_for_run(daemon: Daemon, job: str, timeout: float = RUN_VISIBLE_TIMEOUT_SECONDS) -> None:
    """Until the daemon's ledger (``GET /api/v1/runs?job=``, whose first page holds the
    job's newest runs) holds a run of ``job``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, body = daemon.get(f"/api/v1/runs?job={urllib.parse.quote(job, safe='')}")
        if status == 200 and any(record["job"] == job for record in json.loads(body)):
            return
        time.sleep(0.1)
    raise AssertionError(f"no run of {job} in the ledger:\n{daemon.log()}")

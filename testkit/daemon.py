"""Running a real ``trainmon serve`` subprocess on loopback."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

READY_TIMEOUT_SECONDS = 30.0
#: Longest wait for a run to show in a daemon's ledger (it writes every flush).
RUN_VISIBLE_TIMEOUT_SECONDS = 30.0


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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


def wait_ready(daemon: Daemon, timeout: float = READY_TIMEOUT_SECONDS) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if daemon.process.poll() is not None:
            raise AssertionError(
                f"trainmon exited with {daemon.process.returncode}:\n{daemon.log()}"
            )
        try:
            status, _ = daemon.get("/healthz")
            if status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"trainmon did not become ready in {timeout}s:\n{daemon.log()}")


def wait_for_run(daemon: Daemon, job: str, timeout: float = RUN_VISIBLE_TIMEOUT_SECONDS) -> None:
    """Until the daemon's ledger (``GET /api/v1/runs``) holds a run of ``job``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, body = daemon.get("/api/v1/runs")
        if status == 200 and any(record["job"] == job for record in json.loads(body)):
            return
        time.sleep(0.1)
    raise AssertionError(f"no run of {job} in the ledger:\n{daemon.log()}")

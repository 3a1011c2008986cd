"""Staging the shipped Prometheus configuration as an operator installs it, and running it."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.deploytest.common import ALERTS, PROMETHEUS, tool
from tests.support.daemon import free_port


def stage(config: Path, folder: Path, variant: str) -> Path:
    """``folder`` laid out like /etc/prometheus: the config, targets/ and rules/.

    Rules are the variant's rule files from ``alerts/`` (files with ``groups``).
    """
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(config, folder / "prometheus.yml")
    shutil.copytree(PROMETHEUS / "targets", folder / "targets")
    (folder / "rules").mkdir()
    for path in sorted((ALERTS / variant).glob("*.yml")):
        if "groups" in (yaml.safe_load(path.read_text(encoding="utf-8")) or {}):
            shutil.copy(path, folder / "rules" / path.name)
    return folder / "prometheus.yml"


class PrometheusServer:
    def __init__(self, process: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.process = process
        self.port = port
        self.log = log

    def api(self, path: str) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}"
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.load(response)["data"]


@contextmanager
def running(config: Path, storage: Path) -> Iterator[PrometheusServer]:
    """A real Prometheus on a free loopback port, stopped afterwards."""
    port = free_port()
    log = storage.with_suffix(".log")
    process = subprocess.Popen(
        [
            tool("prometheus"),
            f"--config.file={config}",
            f"--storage.tsdb.path={storage}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )
    server = PrometheusServer(process, port, log)
    try:
        wait_until(lambda: _ready(server), 30, f"Prometheus did not start: {log}")
        yield server
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _ready(server: PrometheusServer) -> bool:
    if server.process.poll() is not None:
        raise AssertionError(f"Prometheus exited:\n{server.log.read_text()}")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/-/ready", timeout=2):
            return True
    except (urllib.error.URLError, OSError):
        return False


def wait_until(condition: Any, timeout: float, message: str) -> Any:
    """Poll ``condition()`` until it returns something truthy; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(message)

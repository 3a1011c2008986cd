"""A real Prometheus (the distribution's /usr/bin/prometheus) on loopback, and its HTTP API."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from support.daemon import free_port

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


class QueryError(Exception):
    """Prometheus refused a query (``errorType`` bad_data = parse error, execution, …)."""


class Prometheus:
    """``Prometheus(workdir, config).start()``; ``stop()`` ends the process."""

    def __init__(self, workdir: Path, config: Mapping[str, Any]) -> None:
        self.workdir = workdir
        self.config = config
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "prometheus.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> Prometheus:
        config_path = self.workdir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(dict(self.config), sort_keys=False))
        self.process = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config_path}",
             f"--storage.tsdb.path={self.workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log_path.open("wb"), stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"prometheus exited: {self.log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"prometheus not ready in {timeout}s: {self.log()}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def api(self, path: str, params: Sequence[tuple[str, str]]) -> Any:
        """GET ``/api/v1/<path>``; the ``data`` field, or QueryError with Prometheus' message."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(list(params))}"
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as error:
            body = json.loads(error.read() or b"{}")
        if body.get("status") != "success":
            raise QueryError(f"{body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        data = self.api("query", [("query", expr), ("time", f"{at:.3f}")])
        return list(data["result"]) if data["resultType"] in ("vector", "matrix") else [data]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        data = self.api("query_range", [("query", expr), ("start", f"{start:.3f}"),
                                        ("end", f"{end:.3f}"), ("step", f"{step:g}")])
        return list(data["result"])

    def label_values(self, label: str, match: str | None, start: float, end: float) -> list[str]:
        params = [("start", f"{start:.3f}"), ("end", f"{end:.3f}")]
        if match:
            params.append(("match[]", match))
        return sorted(self.api(f"label/{label}/values", params))

    def target_health(self) -> dict[str, str]:
        """Scrape job → health of its (single) active target."""
        data = self.api("targets", [("state", "active")])
        return {t["labels"]["job"]: t["health"] for t in data["activeTargets"]}

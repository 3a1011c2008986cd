"""A real Prometheus (Debian's ``/usr/bin/prometheus``) on loopback, and its HTTP API.

``LoopbackProcess`` is what every server binary of the tests shares (a free
port, a log file, readiness polling, a clean stop); ``QueryAPI`` is the
Prometheus HTTP query API, which VictoriaMetrics serves too
(``testkit/victoriametrics.py``); ``Prometheus`` adds its configuration
file (a mapping, or a configuration already staged in its folder: the deployment tests
run the shipped ones) and tmp storage. The alerting tests start
Alertmanager the same way (``tests/alerts/alerts_support/stack.py``); the dashboard
tests query every panel through ``Prometheus.query``/``query_range``.
``wait_until`` is the one polling wait of the tests that watch these servers.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from testkit.daemon import free_port

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
#: Flags every test Prometheus runs with (besides config, storage and address).
PROMETHEUS_FLAGS = ("--log.level=warn",)

T = TypeVar("T")


def require(binary: str, packages: str = "prometheus and prometheus-alertmanager") -> str:
    """``binary`` if it exists; else an AssertionError that says how to install it."""
    if not Path(binary).exists():
        raise AssertionError(
            f"{binary} is missing: install Debian's {packages} packages (`make debian-packages`)"
        )
    return binary


def wait_until(
    condition: Callable[[], T], timeout: float, what: str, interval: float = 0.5
) -> T:
    """Poll ``condition`` every ``interval`` s until it returns something truthy, and return
    that; AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


class QueryError(Exception):
    """Prometheus refused a query (``errorType`` bad_data = parse error, execution, …)."""


class LoopbackProcess:
    """A server binary on a free loopback port, with a readiness URL and a log file."""

    name = "process"

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / f"{self.name}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start_process(
        self, command: Sequence[str], ready_path: str, timeout: float,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """Run ``command`` (``env`` added to the environment) and wait until ``ready_path``
        answers 200 (AssertionError if not)."""
        self.process = subprocess.Popen(
            list(command), stdout=self.log_path.open("wb"), stderr=subprocess.STDOUT,
            env={**os.environ, **env} if env else None,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"{self.name} exited:\n{self.log()}")
            try:
                with urllib.request.urlopen(self.url + ready_path, timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"{self.name} not ready in {timeout}s:\n{self.log()}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class QueryAPI(LoopbackProcess):
    """The Prometheus HTTP query API (``/api/v1/...``), which VictoriaMetrics serves too."""

    #: Prefix of the API under the server's URL.
    api_prefix = "/api/v1"

    def api(self, path: str, params: Sequence[tuple[str, str]]) -> Any:
        """GET ``<api_prefix>/<path>``; the ``data`` field, or QueryError with the server's message."""
        url = f"{self.url}{self.api_prefix}/{path}?{urllib.parse.urlencode(list(params))}"
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as error:
            text = error.read()
            try:
                body = json.loads(text or b"{}")
            except ValueError:  # a proxy's or an overloaded server's page, not the API's JSON
                raise QueryError(f"HTTP {error.code}: {text[:200]!r}") from None
        if body.get("status") != "success":
            raise QueryError(f"{body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query at ``at`` (Unix seconds; None: now); scalars come as one item."""
        params = [("query", expr)] if at is None else [("query", expr), ("time", f"{at:.3f}")]
        data = self.api("query", params)
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
        """Scrape job → health of its (single) active target (Prometheus, vmagent)."""
        data = self.api("targets", [("state", "active")])
        return {t["labels"]["job"]: t["health"] for t in data["activeTargets"]}


class Prometheus(QueryAPI):
    """``Prometheus(workdir).start(config)``; ``stop()`` ends the process."""

    name = "prometheus"

    def start(
        self, config: Mapping[str, Any] | Path, *, flags: Sequence[str] = (),
        timeout: float = 30.0,
    ) -> Prometheus:
        """Start on ``config``: a mapping, written to the workdir as prometheus.yml, or the path
        of a configuration file already in place (its relative ``rule_files`` and file-SD paths
        are read from its folder); ``flags`` are extra command-line flags."""
        if isinstance(config, Path):
            config_path = config
        else:
            config_path = self.workdir / "prometheus.yml"
            config_path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
        self.start_process(
            [
                require(PROMETHEUS),
                f"--config.file={config_path}",
                f"--storage.tsdb.path={self.workdir / 'prometheus-data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                *PROMETHEUS_FLAGS,
                *flags,
            ],
            "/-/ready",
            timeout,
        )
        return self

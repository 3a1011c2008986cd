"""Real VictoriaMetrics components (Debian's ``victoria-metrics`` package) on loopback.

* ``VictoriaMetrics``: the single-node engine; it takes remote writes at
  ``/api/v1/write`` and answers the Prometheus query API (``QueryAPI``);
* ``VMAgent``: scrapes with a Prometheus-style ``-promscrape.config`` (``%{NAME}``
  placeholders expanded from its environment) and remote-writes to an engine;
* ``VMAlert``: evaluates Prometheus rule files against an engine, writes recording
  rules and alert state back to it and notifies Alertmanager.

Each is a ``LoopbackProcess`` of ``testkit/prometheus.py``: a free port,
a log file in its working folder, readiness on ``/health``, a clean stop.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import threading
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from testkit.prometheus import LoopbackProcess, QueryAPI, require

VICTORIA_METRICS = shutil.which("victoria-metrics") or "/usr/bin/victoria-metrics"
VMAGENT = shutil.which("vmagent") or "/usr/bin/vmagent"
VMALERT = shutil.which("vmalert") or "/usr/bin/vmalert"
PACKAGE = "victoria-metrics"
LOG_FLAGS = ("-loggerLevel=WARN",)
READY_PATH = "/health"


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


class VictoriaMetrics(QueryAPI):
    """``VictoriaMetrics(workdir).start()``: single-node storage and query engine."""

    name = "victoria-metrics"

    def start(self, *, flags: Sequence[str] = (), timeout: float = 30.0) -> VictoriaMetrics:
        """Start with tmp storage; ``flags`` are extra command-line flags.

        ``-search.latencyOffset`` (30 s by default: the newest points a query may
        return) is 1 s, so that tests scraping every second see their samples.
        """
        self.start_process(
            [
                require(VICTORIA_METRICS, PACKAGE),
                f"-storageDataPath={self.workdir / 'victoria-metrics-data'}",
                f"-httpListenAddr=127.0.0.1:{self.port}",
                "-search.latencyOffset=1s",
                *LOG_FLAGS,
                *flags,
            ],
            READY_PATH,
            timeout,
        )
        return self

    @property
    def write_url(self) -> str:
        """Where Prometheus remote_write and vmagent send samples."""
        return f"{self.url}/api/v1/write"

    def force_flush(self) -> None:
        """Make what was written so far searchable now (``/internal/force_flush``).

        A new series is otherwise found only some 9 s after its first sample
        (docs/dashboards.md, "Engines"); a test that waits for a chain of recording
        rules calls this between its looks, so that each link costs seconds, not ten.
        """
        with urllib.request.urlopen(f"{self.url}/internal/force_flush", timeout=30):
            pass

    def total_series(self) -> int:
        """Series of the current day's index (``/api/v1/status/tsdb``)."""
        return int(self.api("status/tsdb", [])["totalSeries"])


@contextlib.contextmanager
def flushing(engines: Sequence[VictoriaMetrics], every_seconds: float = 1.0) -> Iterator[None]:
    """``force_flush`` each of ``engines`` every ``every_seconds`` while the block runs:
    a recording rule that reads another then finds the other's new series within a
    second, as Prometheus does in its one pass over a group."""
    stop = threading.Event()

    def flush() -> None:
        while not stop.wait(every_seconds):
            for engine in engines:
                with contextlib.suppress(OSError):  # stopping, or a slow answer
                    engine.force_flush()

    thread = threading.Thread(target=flush, name="vm-force-flush", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


class VMAgent(QueryAPI):
    """``VMAgent(workdir).start(config, remote_write=...)``: a scraper that remote-writes."""

    name = "vmagent"

    def start(
        self,
        config: Path,
        *,
        remote_write: str,
        env: Mapping[str, str] | None = None,
        flags: Sequence[str] = (),
        timeout: float = 30.0,
    ) -> VMAgent:
        """Scrape per ``config`` (placeholders from ``env``) and write to ``remote_write``."""
        self.start_process(
            [
                require(VMAGENT, PACKAGE),
                f"-promscrape.config={config}",
                f"-remoteWrite.url={remote_write}",
                f"-remoteWrite.tmpDataPath={self.workdir / 'vmagent-data'}",
                f"-httpListenAddr=127.0.0.1:{self.port}",
                *LOG_FLAGS,
                *flags,
            ],
            READY_PATH,
            timeout,
            env=env,
        )
        return self


class VMAlert(LoopbackProcess):
    """``VMAlert(workdir).start(rules, engine=..., notifier=...)``: the rule evaluator."""

    name = "vmalert"

    def start(
        self,
        rule_files: Sequence[Path],
        *,
        engine: str,
        notifier: str,
        evaluation_interval: str = "15s",
        flags: Sequence[str] = (),
        timeout: float = 30.0,
    ) -> VMAlert:
        """Evaluate ``rule_files`` against the engine at ``engine`` (its base URL), write
        recording rules and alert state back to it, and send alerts to ``notifier``
        (an Alertmanager base URL)."""
        self.start_process(
            [
                require(VMALERT, PACKAGE),
                *(f"-rule={path}" for path in rule_files),
                f"-datasource.url={engine}",
                f"-remoteWrite.url={engine}",
                f"-remoteRead.url={engine}",
                f"-notifier.url={notifier}",
                f"-evaluationInterval={evaluation_interval}",
                "-disableAlertgroupLabel",  # as deployed (docs/deploy.md): ALERTS as Prometheus makes them
                f"-httpListenAddr=127.0.0.1:{self.port}",
                *LOG_FLAGS,
                *flags,
            ],
            READY_PATH,
            timeout,
        )
        return self

    def groups(self) -> list[dict[str, Any]]:
        """The rule groups with each rule's state (``/api/v1/rules``, as Prometheus)."""
        body = _get_json(f"{self.url}/api/v1/rules")
        return list(body["data"]["groups"])

    def rule_errors(self) -> dict[str, str]:
        """``group/rule`` → the last evaluation error, for every rule that has one."""
        return {
            f"{group['name']}/{rule['name']}": rule["lastError"]
            for group in self.groups()
            for rule in group["rules"]
            if rule.get("lastError")
        }


def dry_run_rules(rule_files: Sequence[Path]) -> tuple[int, str]:
    """``vmalert -dryRun``: parse every rule, its expression and its templates.

    Returns (exit status, output).
    """
    result = subprocess.run(
        [require(VMALERT, PACKAGE), "-dryRun", "-loggerLevel=ERROR",
         *(f"-rule={path}" for path in rule_files)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    return result.returncode, result.stdout + result.stderr

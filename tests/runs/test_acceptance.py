"""Acceptance of the run ledger (issue 16): two real PyTorch CPU runs with one variable
changed, recorded by a real daemon, listed and compared from its ledger and from a real
Prometheus that scraped it, with planted secrets appearing nowhere.

Run A and run B are the same job, config mapping and data path; B sets
``NCCL_DEBUG=INFO`` instead of ``WARN`` and reads each item more slowly, so its
throughput drops by a factor the jobs measure themselves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.daemon import Daemon, trainmon_command
from testkit.prometheus import Prometheus, wait_until

pytest.importorskip("torch")

pytestmark = pytest.mark.integration

JOB = "ledger-acceptance"
RUN_SECONDS = 20.0
#: Seconds each item of the Dataset takes to load in run A and in run B.
ITEM_SECONDS = {"a": 0.002, "b": 0.005}
NCCL_DEBUG = {"a": "WARN", "b": "INFO"}
CONFIG_SECRET = "cfg-secret-5f1d2e9a7c"
ENV_SECRETS = {"TRAINMON_TEST_SECRET_TOKEN": "env-secret-0b7c4e1d93",
               "NCCL_TEST_AUTH_TOKEN": "env-secret-77aa21c0de"}
SECRETS = (CONFIG_SECRET, *ENV_SECRETS.values())
#: The largest allowed gap between the compared and the measured throughput change.
TOLERANCE = 0.05
JOB_SCRIPT = Path(__file__).with_name("ledger_job.py")
#: Variables of the test's own environment that would make the runs differ or name them.
DROPPED_ENVIRONMENT = ("TRAINMON_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID",
                       "SLURM_RESTART_COUNT", "RANK", "WORLD_SIZE", "LOCAL_RANK")


def trainmon(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*trainmon_command(), *args], capture_output=True, text=True,
                          timeout=120, check=False)


def train(endpoint: str, tmp_path: Path, label: str) -> dict[str, Any]:
    """Run the job as its own process; what it measured itself."""
    environ = {name: value for name, value in os.environ.items()
               if name not in DROPPED_ENVIRONMENT and not name.startswith("NCCL_")}
    environ.update(ENV_SECRETS)
    environ.update({"TRAINMON_RUN_ID": f"accept-{label}", "NCCL_DEBUG": NCCL_DEBUG[label],
                    "LEDGER_TEST_CONFIG_SECRET": CONFIG_SECRET})
    out = tmp_path / f"measured-{label}.json"
    data = tmp_path / "dataset"
    data.mkdir(exist_ok=True)
    subprocess.run(
        [sys.executable, str(JOB_SCRIPT), endpoint, JOB, str(ITEM_SECONDS[label]),
         str(RUN_SECONDS), str(data), str(out)],
        env=environ, cwd=tmp_path, check=True, timeout=RUN_SECONDS + 120,
    )
    return dict(json.loads(out.read_text()))


def ledger_runs(ledger: Path) -> dict[str, dict[str, Any]]:
    result = trainmon("runs", "--json", "--ledger", str(ledger))
    assert result.returncode == 0, result.stderr
    return {run["run"]: run for run in json.loads(result.stdout)["runs"]}


def compare(*source: str) -> dict[str, Any]:
    result = trainmon("compare", "accept-a", "accept-b", "--json", *source)
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


@pytest.fixture
def recorded(start_daemon: Callable[..., Daemon], prometheus: Prometheus, tmp_path: Path
             ) -> Iterator[tuple[Daemon, Prometheus, Path, dict[str, dict[str, Any]]]]:
    """A daemon with its ledger in tmp, scraped every second, after runs A and B."""
    ledger = tmp_path / "state" / "ledger.sqlite3"
    ledger.parent.mkdir()
    daemon = start_daemon(config={"collectors": {
        "ledger": {"path": str(ledger), "flush_seconds": 3, "price_per_gpu_hour": 2.5,
                   "currency": "USD"},
    }})
    prometheus.start({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [{"job_name": "trainmon", "honor_labels": True,
                            "static_configs": [{"targets": [f"127.0.0.1:{daemon.port}"]}]}],
    })
    wait_until(lambda: prometheus.target_health().get("trainmon") == "up", 30, "the scrape")
    socket = yaml.safe_load(Path(daemon.config_path or "").read_text())[
        "collectors"]["training"]["socket"]
    measured = {label: train(f"unix://{socket}", tmp_path, label) for label in ("a", "b")}

    def both_finished() -> bool:
        runs = ledger_runs(ledger)
        return all(runs.get(f"accept-{label}", {}).get("end_reason") == "finished"
                   and runs[f"accept-{label}"]["summary"].get("samples_per_second_median")
                   for label in ("a", "b"))

    wait_until(both_finished, 30, "both runs finished in the ledger")
    # the ranks of a finished run leave the exposition at once: look back for their steps
    wait_until(lambda: bool(prometheus.query(
        f'count_over_time(trainmon_training_steps_total{{job="{JOB}"}}[10m])')),
        10, "the steps in Prometheus")
    time.sleep(3)  # a few more scrapes after run B's last report
    yield daemon, prometheus, ledger, measured


def measured_change(measured: dict[str, dict[str, Any]]) -> float:
    change = measured["b"]["samples_per_second"] / measured["a"]["samples_per_second"] - 1
    assert -0.7 < change < -0.4, measured  # the slower Dataset really is slower
    return float(change)


def assert_names_only_the_variable(comparison: dict[str, Any]) -> None:
    assert comparison["changes"] == [
        {"key": "NCCL_DEBUG", "kind": "environment", "a": "WARN", "b": "INFO"}
    ], comparison["changes"]
    assert "NCCL_DEBUG WARN → INFO" in comparison["summary"]
    assert comparison["summary"].startswith("samples/s −")


def test_two_runs_one_variable_changed_local_ledger_and_prometheus(
    recorded: tuple[Daemon, Prometheus, Path, dict[str, dict[str, Any]]],
) -> None:
    daemon, prometheus, ledger, measured = recorded
    truth = measured_change(measured)

    runs = ledger_runs(ledger)
    assert list(runs)[:2] == ["accept-b", "accept-a"]  # newest first
    for label in ("a", "b"):
        summary = runs[f"accept-{label}"]["summary"]
        assert summary["samples_per_second_median"] == pytest.approx(
            measured[label]["samples_per_second"], rel=0.1)
        assert summary["cost"]["currency"] == "USD"
        assert summary["cost"]["per_million_samples"] > 0
    text = trainmon("runs", "--ledger", str(ledger))
    assert text.returncode == 0 and "COST/M SAMPLES" in text.stdout
    assert "USD" in text.stdout

    local = compare("--ledger", str(ledger))
    assert_names_only_the_variable(local)
    assert abs(local["throughput"]["change_ratio"] - truth) <= TOLERANCE, (local, measured)

    remote = compare("--prometheus", prometheus.url)
    print(f"measured {measured['a']['samples_per_second']:.1f} → "  # shown with -rP
          f"{measured['b']['samples_per_second']:.1f} samples/s ({truth:+.4f}); ledger "
          f"{local['throughput']}; prometheus {remote['throughput']}")
    assert_names_only_the_variable(remote)
    assert remote["a"]["nodes"] == [f"127.0.0.1:{daemon.port}"]
    assert abs(remote["throughput"]["change_ratio"] - truth) <= TOLERANCE, (remote, measured)
    assert remote["unavailable"] == []
    # Prometheus' exact rate: the samples over the steps' own time (their ends are the
    # sender's), within the scrape interval's precision (steps before the run's first
    # scrape and after its ranks' last are not counted) — as the ledger's, which compare
    # then reads on both sides.
    assert remote["throughput"]["key"] == local["throughput"]["key"] == "samples_per_second"
    for label in ("a", "b"):
        assert remote[label]["summary"]["samples_per_second"] == pytest.approx(
            measured[label]["samples_per_second"], rel=0.03), (remote[label], measured)
    listed = trainmon("runs", "--json", "--prometheus", prometheus.url, "--job", JOB)
    assert [run["run"] for run in json.loads(listed.stdout)["runs"]][:2] == [
        "accept-b", "accept-a"]
    # how they ended, from the ledger's end series alone (the listing asks no daemon)
    assert [(run["end_reason"], run["ranks"]) for run in json.loads(listed.stdout)["runs"]][
        :2] == [("finished", 1), ("finished", 1)]
    for run in json.loads(listed.stdout)["runs"][:2]:
        assert run["summary"]["samples_per_second"] == pytest.approx(
            measured[run["run"][-1]]["samples_per_second"], rel=0.03), (run, measured)
    assert (local["a"]["ranks"], local["a"]["world_size"]) == (1, 1)
    assert local["throughput"]["basis"] == remote["throughput"]["basis"] == "job"

    # Secrets: not in the ledger's bytes, the metrics, the daemon's log, the outputs.
    stored = b"".join(path.read_bytes() for path in ledger.parent.iterdir() if path.is_file())
    outputs = [daemon.metrics(), daemon.log(), json.dumps(runs), json.dumps(local),
               json.dumps(remote), text.stdout,
               trainmon("compare", "accept-a", "accept-b", "--ledger", str(ledger)).stdout]
    for secret in SECRETS:
        assert secret.encode() not in stored, secret
        for output in outputs:
            assert secret not in output, secret
    assert local["a"]["description"]["config"]["api_key"] == "<redacted>"

    # With the node daemon gone, Prometheus still has the numbers, and compare says
    # the description is unknown rather than "no change".
    daemon.stop()
    blind = compare("--prometheus", prometheus.url)
    assert blind["changes"] == []  # world size and nodes still come from Prometheus
    assert blind["a"]["world_size"] == blind["b"]["world_size"] == 1
    assert blind["a"]["description"] is None
    assert any(f"127.0.0.1:{daemon.port}" in reason for reason in blind["unavailable"])
    assert "unknown" in blind["summary"]
    assert abs(blind["throughput"]["change_ratio"] - truth) <= TOLERANCE

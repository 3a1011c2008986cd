"""Credentials never reach the ledger, the run API or ``trainmon runs``: URL
credentials in data paths (before and after ``abspath``), versions and every
other string field are cut out by the client and again by the daemon; so are the
shapes issue 35 found missed (a password holding ``@``, ``?access_token=``, S3
presigned parameters, a webhook path, ``--password=`` inside a value, an ``sk-`` key
under an innocuous key). ``test_secret_corpus.py`` holds the rule to every shape."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from testkit.daemon import Daemon
from testkit.prometheus import wait_until
from trainmon.client import Reporter

pytestmark = pytest.mark.integration

SECRET = "wJalrXUtnFEMIK7MDENGbPxRfiCYzz"
KEY_ID = "AKIAIOSFODNN7EXAMPLE"
#: The shapes issue 35 measured missed by the rule before it, each with SECRET in it.
MISSED_BEFORE = {
    "mirror": f"https://bob:p@{SECRET}@data.example.com/x",
    "feed": f"https://api.example.com/v1?access_token={SECRET}&page=2",
    "shard": f"https://b.s3.amazonaws.com/k?X-Amz-Credential={KEY_ID}%2F2024"
             f"&X-Amz-Signature={SECRET}",
    "notify": f"https://hooks.slack.com/services/T000/B000/{SECRET}",
    "command": f"python train.py --password={SECRET} --lr 0.1",
    "llm": f"sk-proj-{SECRET}0123456789",
}


def runs(daemon: Daemon) -> list[dict[str, object]]:
    with urllib.request.urlopen(daemon.url + "/api/v1/runs", timeout=10) as answer:
        records: list[dict[str, object]] = json.loads(answer.read())
    return records


@pytest.fixture
def daemon(start_daemon: Callable[..., Daemon]) -> Daemon:
    return start_daemon(config={"collectors": {"gpu": {"enabled": False},
                                               "ledger": {"flush_seconds": 0.2}}})


def ledger_and_socket(daemon: Daemon) -> tuple[Path, Path]:
    config = yaml.safe_load(Path(str(daemon.config_path)).read_text())
    collectors = config["collectors"]
    return Path(collectors["ledger"]["path"]), Path(collectors["training"]["socket"])


def test_the_python_client_never_sends_url_credentials(daemon: Daemon) -> None:
    _, socket_path = ledger_and_socket(daemon)
    reporter = Reporter(
        "cred-job", endpoint=f"unix://{socket_path}", interval_seconds=0.05, rank=0,
        world_size=1, data_paths=[f"s3://{KEY_ID}:{SECRET}@bucket/imagenet",
                                  f"{KEY_ID}:{SECRET}@cos.example/data"],
        config={"source": f"https://{KEY_ID}:{SECRET}@example.com/data", **MISSED_BEFORE},
    )
    reporter.step(samples=4)
    reporter.close()
    assert_no_secret_anywhere(daemon, "cred-job")


def test_the_daemon_cuts_credentials_out_of_a_foreign_clients_description(
    daemon: Daemon,
) -> None:
    _, socket_path = ledger_and_socket(daemon)
    line = {
        "v": 1, "type": "run", "job": "foreign-job", "rank": 0,
        "reporter_id": "foreign000000001", "run": "foreign-run", "started": time.time(),
        "world_size": 1, "config_hash": "sha256:0123456789abcdef",
        "config": {"mirror": f"ftp://{KEY_ID}:{SECRET}@mirror/x",
                   **{f"{key}_2": value for key, value in MISSED_BEFORE.items()}},
        "environment": {"HTTP_PROXY_URL": f"http://{KEY_ID}:{SECRET}@proxy:3128"},
        # what os.path.abspath makes of "s3://KEY:SECRET@bucket"
        "data_paths": [f"/work/s3:/{KEY_ID}:{SECRET}@bucket/train"],
        "versions": {"dataset": f"https://{KEY_ID}:{SECRET}@hub/v1"},
        "git": None, "host": "node-1", "framework": {"hub": f"{KEY_ID}:{SECRET}@hub"},
    }
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        sender.sendto(json.dumps(line).encode() + b"\n", str(socket_path))
    assert_no_secret_anywhere(daemon, "foreign-job")


def assert_no_secret_anywhere(daemon: Daemon, job: str) -> None:
    wait_until(lambda: any(run["job"] == job for run in runs(daemon)), 15.0,
               f"the run of {job} in the ledger", interval=0.05)
    ledger, _ = ledger_and_socket(daemon)
    served = json.dumps(runs(daemon))
    listed = subprocess.run(
        [sys.executable, "-m", "trainmon", "runs", "--json", "--ledger", str(ledger)],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout
    exposition = daemon.metrics()
    for text in (served, listed, exposition, daemon.log()):
        assert SECRET not in text
    assert "<redacted>" in served and job in listed

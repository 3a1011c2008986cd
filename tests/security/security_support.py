"""Helpers of the security tests (imported by the test modules and the conftest): a
real local user, the type of the ``as_user`` fixture that sends as one, and a Python
interpreter such a user may run; the shared node (``Node``) the identity tests run
on, and the victim's step line."""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from testkit.daemon import Daemon
from testkit.exposition import Scrape, parse
from testkit.prometheus import wait_until
from tests.training.training_support import report
from trainmon.contract import STEP_BUCKET_COUNT


@dataclass(frozen=True)
class LocalUser:
    name: str
    uid: int
    gid: int


AsUser = Callable[..., list[dict[str, object]]]


def python_for_everyone() -> str:
    """A Python interpreter other local users may run (the suite's own may sit in /root)."""
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        path = Path(candidate)
        if path.exists() and all(os.stat(parent).st_mode & 0o001
                                 for parent in path.resolve().parents):
            return candidate
    pytest.skip("no Python interpreter that other local users can run")


RUN = "victim-run-1"
TOKEN = "ci-token-0123456789abcdef"


def step_line(job: str = "victim", **changes: object) -> bytes:
    buckets = [0] * STEP_BUCKET_COUNT
    steps = int(changes.pop("steps", 1000))  # type: ignore[call-overload]
    buckets[4] = steps
    fields: dict[str, object] = {"job": job, "steps": steps, "step_buckets": buckets,
                                 "step_seconds": 200.0, "data_wait_seconds": 20.0,
                                 "run": RUN, "reporter_id": "victim00000000aa"}
    fields.update(changes)
    return json.dumps(report(**fields)).encode() + b"\n"


class Node:
    """The daemon of a shared node: its socket every user can reach, its scrapes."""

    def __init__(self, daemon: Daemon, socket_path: Path) -> None:
        self.daemon = daemon
        self.socket = f"unix://{socket_path}"

    def scrape(self) -> Scrape:
        return parse(self.daemon.metrics())

    def value(self, name: str, **labels: str) -> float | None:
        return self.scrape().value(name, **labels)

    def wait(self, name: str, expected: float, what: str, **labels: str) -> None:
        wait_until(lambda: self.value(name, **labels) == expected, 15.0, what, interval=0.05)

    def wait_ledger_flushes(self, count: int = 2) -> None:
        """Until the recorder has committed ``count`` more flushes: what it would
        have written from what was sent before is in the file by then."""
        written = self.value("trainmon_ledger_writes_total") or 0
        wait_until(lambda: (self.value("trainmon_ledger_writes_total") or 0) >= written + count,
                   15.0, f"{count} more ledger flushes", interval=0.05)

    def runs(self, job: str | None = None) -> list[dict[str, Any]]:
        """The newest page of runs (of ``job``: the flood's runs fill the first pages)."""
        query = f"?job={job}" if job else ""
        with urllib.request.urlopen(f"{self.daemon.url}/api/v1/runs{query}",
                                    timeout=10) as answer:
            records: list[dict[str, Any]] = json.loads(answer.read())
        return records

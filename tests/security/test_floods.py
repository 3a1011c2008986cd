"""One local user's flood costs the daemon a small constant (docs/security.md, "Caps that
hold everywhere"): a real ``trainmon serve`` (root) and a real second user sending the
issue's shape (many ranks, each with its own run id and a large run description) over
the socket. The volumes and their figures are ``bench.hostile_floods``'s; this holds the
rule at a size the suite can afford."""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.daemon import Daemon
from testkit.exposition import parse
from testkit.prometheus import wait_until
from tests.security.security_support import AsUser, LocalUser
from tests.training.training_support import report

pytestmark = pytest.mark.integration

RANKS = 300


def flood_payloads(ranks: int) -> list[bytes]:
    """Each rank of job ``flood`` with its own run id: a 6 KB description and a report,
    four ranks a datagram."""
    config = {f"key_{index:02d}": "v" * 200 for index in range(28)}
    payloads = []
    for first in range(0, ranks, 4):
        lines = []
        for rank in range(first, min(first + 4, ranks)):
            reporter, run = f"flood{rank:011d}", f"flood-run-{rank}"
            lines.append(json.dumps({
                "v": 1, "type": "run", "job": "flood", "rank": rank, "reporter_id": reporter,
                "run": run, "started": time.time() - 60, "world_size": ranks,
                "config_hash": "sha256:0123456789abcdef", "config": config,
                "environment": {}, "data_paths": [], "versions": {}, "git": None,
                "host": "node-1", "framework": {}}))
            lines.append(json.dumps(report(job="flood", rank=rank, world_size=ranks,
                                           reporter_id=reporter, run=run)))
        payloads.append("\n".join(lines).encode() + b"\n")
    return payloads


def test_one_users_flood_of_ranks_and_runs_is_held_to_its_budgets(
    start_daemon: Callable[..., Daemon], shared_dir: Path, as_user: AsUser,
    local_users: tuple[LocalUser, LocalUser],
) -> None:
    victim, attacker = local_users
    socket_path = shared_dir / "steps.sock"
    daemon = start_daemon(config={"collectors": {
        "training": {"socket": str(socket_path), "socket_mode": "0666"},
        "ledger": {"path": str(shared_dir / "ledger.sqlite3"), "flush_seconds": 0.2},
        "gpu": {"enabled": False}}})
    as_user(attacker, f"unix://{socket_path}", flood_payloads(RANKS))
    as_user(victim, f"unix://{socket_path}", [json.dumps(report(job="victim")).encode()])

    def scraped() -> dict[str, float]:
        found = parse(daemon.metrics())
        jobs = [labels["job"] for labels in found.labelsets("trainmon_training_steps_total")]
        return {"flood": jobs.count("flood"), "victim": jobs.count("victim"),
                "limit": found.value("trainmon_training_rejected_reports_total",
                                     reason="limit") or 0.0}

    wait_until(lambda: scraped()["victim"] == 1 and scraped()["limit"] > 0, 15.0,
               "the victim's rank and the flood's refusals", interval=0.05)
    # the flood's runs: 32 (the run budget), each of one rank; its descriptions also
    # stop at the budget, so it holds at most 32 ranks however many it sent
    counts = scraped()
    assert counts["flood"] == 32, counts
    wait_until(lambda: len(runs_of(daemon, "flood")) == 32, 15.0, "the flood's runs recorded",
               interval=0.05)
    with urllib.request.urlopen(daemon.url + "/healthz", timeout=5) as answer:
        assert answer.status == 200
    # its last flush done, well within the unit's TimeoutStopSec (20 s)
    assert daemon.stop(signal.SIGTERM, timeout=5.0) == 0


def runs_of(daemon: Daemon, job: str) -> list[dict[str, object]]:
    with urllib.request.urlopen(f"{daemon.url}/api/v1/runs?job={job}&limit=1000",
                                timeout=10) as answer:
        records: list[dict[str, object]] = json.loads(answer.read())
    return records

"""Writers are who they say they are: one local user cannot change another's numbers
or records, over the socket or loopback HTTP, and cannot crowd out other users.

A real ``trainmon serve`` (root, as on a node) and two real local users that the
test creates: the victim trains, the attacker sends what the issue's probes sent
(``steps`` 10**15 for the victim's job, a rewritten run description, 10 000 job
names). docs/security.md states the rules these tests hold.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.daemon import Daemon
from testkit.prometheus import wait_until
from tests.security.security_support import RUN, TOKEN, AsUser, LocalUser, Node, step_line

pytestmark = pytest.mark.integration

def description_line(job: str = "victim", **changes: object) -> bytes:
    line: dict[str, object] = {
        "v": 1, "type": "run", "job": job, "rank": 0, "reporter_id": "victim00000000aa",
        "run": RUN, "started": time.time() - 60, "world_size": 8,
        "config_hash": "sha256:0123456789abcdef", "config": {"lr": 0.1},
        "environment": {}, "data_paths": [], "versions": {"python": "3.11"},
        "git": None, "host": "node-1", "framework": {},
    }
    line.update(changes)
    return json.dumps(line).encode() + b"\n"


def forged_report() -> bytes:
    return step_line(steps=10**15, reporter_id="forged0000000000", step_seconds=1e15,
                     data_wait_seconds=0.99999e15)


def forged_description() -> bytes:
    return description_line(config={"lr": 999}, started=0, ended="finished",
                            reporter_id="forged0000000000")


def start_victim(node: Node, as_user: AsUser, victim: LocalUser) -> None:
    as_user(victim, node.socket, [description_line(), step_line()])
    node.wait("trainmon_training_steps_total", 1000, "the victim's steps",
              job="victim", rank="0")
    wait_until(lambda: [run["run"] for run in node.runs()] == [RUN], 15.0,
               "the victim's run in the ledger", interval=0.05)


def assert_victim_untouched(node: Node) -> None:
    result = node.scrape()
    assert result.value("trainmon_training_steps_total", job="victim", rank="0") == 1000
    assert result.value("trainmon_training_data_wait_ratio", job="victim", rank="0") == \
        pytest.approx(0.1)
    (record,) = [run for run in node.runs(job="victim") if run["job"] == "victim"]
    assert record["description"]["config"] == {"lr": 0.1}
    assert record["end_reason"] is None and record["started"] > 0


def test_another_user_cannot_report_for_a_job_on_the_socket(
    node: Node, as_user: AsUser, local_users: tuple[LocalUser, LocalUser]
) -> None:
    victim, attacker = local_users
    start_victim(node, as_user, victim)
    as_user(attacker, node.socket, [forged_report(), forged_description()])
    node.wait("trainmon_training_rejected_reports_total", 2, "both forgeries refused",
              reason="forbidden")
    node.wait_ledger_flushes()  # a rewrite would have landed by then
    assert_victim_untouched(node)
    log = node.daemon.log()
    assert f"uid:{attacker.uid}" in log and "belongs to another writer" in log


def test_another_user_cannot_report_for_a_job_over_loopback_http(
    node: Node, as_user: AsUser, local_users: tuple[LocalUser, LocalUser]
) -> None:
    victim, attacker = local_users
    start_victim(node, as_user, victim)
    answers = as_user(attacker, node.daemon.url, [forged_report(), forged_description()])
    assert [answer["status"] for answer in answers] == [403, 403]
    assert json.loads(str(answers[0]["body"]))["error"] == "forbidden"
    # The victim's own user may go on over HTTP: the kernel names the same uid.
    (own,) = as_user(victim, node.daemon.url, [step_line(steps=1000)])
    assert own["status"] == 200
    node.wait_ledger_flushes()
    assert_victim_untouched(node)


@pytest.mark.parametrize("node", [{"token_file": "TOKEN_FILE"}], indirect=True)
def test_a_configured_token_is_required_on_loopback(
    node: Node, as_user: AsUser, local_users: tuple[LocalUser, LocalUser]
) -> None:
    victim, attacker = local_users
    start_victim(node, as_user, victim)
    (bare,) = as_user(attacker, node.daemon.url, [forged_report()])
    assert bare["status"] == 401
    # A valid token is an identity of its own (token:ci), not the victim's uid.
    (tokened,) = as_user(attacker, node.daemon.url, [forged_report()], token=TOKEN)
    assert tokened["status"] == 403
    (fresh,) = as_user(attacker, node.daemon.url, [step_line(job="ci-job")], token=TOKEN)
    assert fresh["status"] == 200
    assert_victim_untouched(node)


@pytest.mark.parametrize("node", [{"max_jobs": 8, "max_jobs_per_writer": 4}], indirect=True)
def test_ten_thousand_job_names_cannot_crowd_out_another_user(
    node: Node, as_user: AsUser, local_users: tuple[LocalUser, LocalUser]
) -> None:
    victim, attacker = local_users
    start_victim(node, as_user, victim)
    flood = [description_line(job=f"flood-{index}", run=f"flood-{index}",
                              reporter_id=f"flood{index:011d}") for index in range(10_000)]
    as_user(attacker, node.socket, flood)
    node.wait("trainmon_training_reports_total", 2 + 10_000, "every flood line handled",
              transport="unix")
    result = node.scrape()
    jobs = {labels["job"] for labels in result.labelsets("trainmon_training_run_info")}
    assert "victim" in jobs and len(jobs) == 1 + 4  # the attacker keeps its newest 4
    assert {f"flood-{index}" for index in range(9_996, 10_000)} < jobs
    assert_victim_untouched(node)
    started = time.monotonic()
    assert node.daemon.stop(signal.SIGTERM, timeout=20.0) == 0
    assert time.monotonic() - started < 20.0  # the systemd unit's TimeoutStopSec


def test_another_users_flood_of_runs_never_deletes_a_victims_run(
    start_daemon: Callable[..., Daemon], shared_dir: Path, as_user: AsUser,
    local_users: tuple[LocalUser, LocalUser],
) -> None:
    victim, attacker = local_users
    ledger = shared_dir / "ledger.sqlite3"
    config = {"collectors": {
        "training": {"socket": str(shared_dir / "steps.sock"), "socket_mode": "0666",
                     "max_jobs_per_writer": 4},
        "ledger": {"path": str(ledger), "flush_seconds": 0.1, "max_runs": 10,
                   "max_runs_per_owner": 8},
        "gpu": {"enabled": False}}}
    node = Node(start_daemon(config=config), shared_dir / "steps.sock")
    start_victim(node, as_user, victim)
    for batch in range(5):  # 20 runs, 4 at a time: each batch is recorded, then evicted
        jobs = [f"flood-{batch}-{index}" for index in range(4)]
        as_user(attacker, node.socket, [
            description_line(job=job, run=job, reporter_id=f"flood{batch}{index:010d}")
            for index, job in enumerate(jobs)])
        wait_until(lambda jobs=jobs: set(jobs) <= {run["job"] for run in node.runs()}, 15.0,
                   f"batch {batch} recorded", interval=0.05)
    assert node.daemon.stop() == 0
    # The next start prunes: the attacker's oldest runs go, never the victim's.
    node = Node(start_daemon(config=config), shared_dir / "steps.sock")
    records = node.runs()
    assert len(records) <= 10
    (kept,) = [run for run in records if run["job"] == "victim"]
    assert kept["owner"] == f"uid:{victim.uid}"
    assert {run["owner"] for run in records} == {f"uid:{victim.uid}", f"uid:{attacker.uid}"}

"""The previous release and this one, client and daemon, work together both ways.

The previous release is ``testkit.old_release.PREVIOUS_RELEASE`` (no release is tagged
yet: the commit before issue 37's work began), checked out in a ``git worktree``. Its
client (``trainmon.client``, standard library only) reports a job to this daemon, and
this client reports to its daemon, over the unix socket and over loopback HTTP; the
steps arrive, are counted, and the run is recorded whole.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testkit.daemon import Daemon
from testkit.exposition import parse
from testkit.old_release import PREVIOUS_RELEASE, have_commit, report, serve, worktree

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not have_commit(PREVIOUS_RELEASE),
                       reason=f"a clone without {PREVIOUS_RELEASE} (shallow)"),
]

STEPS = 40
#: Longest wait for a daemon to count the steps and record the run (s).
WAIT_SECONDS = 20.0


@pytest.fixture(scope="module")
def previous_release() -> Iterator[Path]:
    with worktree(PREVIOUS_RELEASE) as tree:
        yield tree


def arrived(daemon: Daemon, job: str) -> tuple[float, object]:
    """The steps the daemon counted of ``job``'s rank 0 and its recorded run's
    (steps, samples, end reason), or None while it is not recorded as ended."""
    steps = parse(daemon.metrics()).value("trainmon_training_steps_total", job=job,
                                           rank="0", owner="uid:0")
    status, body = daemon.get(f"/api/v1/runs?job={job}")
    records = json.loads(body) if status == 200 else []
    run = next(((record["summary"]["steps"], record["summary"]["samples"],
                 record["end_reason"]) for record in records if record["ended"]), None)
    return steps, run


def assert_arrives(daemon: Daemon, job: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while (seen := arrived(daemon, job)) != (STEPS, (STEPS, STEPS * 32, "finished")):
        if time.monotonic() > deadline:
            raise AssertionError(f"{job}: {seen}\n{daemon.log()}")
        time.sleep(0.1)


def test_a_client_of_the_previous_release_reports_to_this_daemon(
        previous_release: Path, tmp_path: Path,
        start_daemon: Callable[..., Daemon]) -> None:
    socket = tmp_path / "steps.sock"
    daemon = start_daemon(config={"collectors": {"training": {"socket": str(socket)},
                                                 "ledger": {"flush_seconds": 0.2}}})
    for job, endpoint in (("over-socket", f"unix://{socket}"), ("over-http", daemon.url)):
        assert report(previous_release, endpoint, job, f"{job}-run", STEPS) == STEPS
        assert_arrives(daemon, job)


def test_this_client_reports_to_a_daemon_of_the_previous_release(
        previous_release: Path, tmp_path: Path) -> None:
    folder = tmp_path / "previous"
    folder.mkdir(mode=0o755)
    daemon = serve(previous_release, folder, ledger=folder / "ledger.sqlite3",
                   ttl_seconds=300)
    try:
        for job, endpoint in (("over-socket", f"unix://{folder}/steps.sock"),
                              ("over-http", daemon.url)):
            assert report(None, endpoint, job, f"{job}-run", STEPS) == STEPS
            assert_arrives(daemon, job)
    finally:
        assert daemon.stop() == 0, daemon.log()
